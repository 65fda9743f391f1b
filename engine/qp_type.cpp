// The QP-type table (see qp_type.h). The transition masks are IBTA vol 1 table 91, column
// by column, as Linux keeps them in qp_state_table (drivers/infiniband/core/verbs.c).
#include "engine/qp_type.h"

#include "engine/responder.h"
#include "engine/uc.h"
#include "engine/ud.h"

namespace softrdma::engine {

namespace {

using S = QpState;

constexpr uint32_t kConnInit = kAttrPkeyIndex | kAttrPort | kAttrAccessFlags;
constexpr uint32_t kPathOptional =
    kAttrCurState | kAttrAltPath | kAttrAccessFlags | kAttrPathMigState;

constexpr QpTransition kRc[] = {
    {S::kReset, S::kInit, kConnInit, 0},
    {S::kInit, S::kInit, 0, kConnInit},
    {S::kInit, S::kRtr,
     kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic | kAttrMinRnrTimer,
     kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex | kAttrRateLimit},
    {S::kRtr, S::kRts,
     kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrSqPsn | kAttrMaxQpRdAtomic,
     kPathOptional | kAttrMinRnrTimer | kAttrRateLimit},
    {S::kRts, S::kRts, 0, kPathOptional | kAttrMinRnrTimer | kAttrRateLimit},
    {S::kRts, S::kSqd, 0, kAttrEnSqdAsyncNotify},
    {S::kSqd, S::kRts, 0, kPathOptional | kAttrMinRnrTimer | kAttrRateLimit},
    {S::kSqd, S::kSqd, 0,
     kAttrPort | kAttrAv | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic |
         kAttrMaxDestRdAtomic | kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex |
         kAttrMinRnrTimer | kAttrPathMigState},
    // SQE → RTS exists for UC/UD only; an RC QP never enters SQE (errors go to ERR).
};

constexpr QpTransition kUc[] = {
    {S::kReset, S::kInit, kConnInit, 0},
    {S::kInit, S::kInit, 0, kConnInit},
    {S::kInit, S::kRtr, kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn,
     kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex},
    {S::kRtr, S::kRts, kAttrSqPsn, kPathOptional},
    {S::kRts, S::kRts, 0, kPathOptional},
    {S::kRts, S::kSqd, 0, kAttrEnSqdAsyncNotify},
    {S::kSqd, S::kRts, 0, kPathOptional},
    {S::kSqd, S::kSqd, 0,
     kAttrAv | kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex | kAttrPathMigState},
    {S::kSqe, S::kRts, 0, kAttrCurState | kAttrAccessFlags},
};

constexpr QpTransition kUd[] = {
    {S::kReset, S::kInit, kAttrPkeyIndex | kAttrPort | kAttrQkey, 0},
    {S::kInit, S::kInit, 0, kAttrPkeyIndex | kAttrPort | kAttrQkey},
    {S::kInit, S::kRtr, 0, kAttrPkeyIndex | kAttrQkey},
    {S::kRtr, S::kRts, kAttrSqPsn, kAttrCurState | kAttrQkey},
    {S::kRts, S::kRts, 0, kAttrCurState | kAttrQkey},
    {S::kRts, S::kSqd, 0, kAttrEnSqdAsyncNotify},
    {S::kSqd, S::kRts, 0, kAttrCurState | kAttrQkey},
    {S::kSqd, S::kSqd, 0, kAttrPkeyIndex | kAttrQkey},
    {S::kSqe, S::kRts, 0, kAttrCurState | kAttrQkey},
};

// XRC initiator (IBV_QPT_XRC_SEND): RC's requester side.
constexpr QpTransition kXrcSend[] = {
    {S::kReset, S::kInit, kConnInit, 0},
    {S::kInit, S::kInit, 0, kConnInit},
    {S::kInit, S::kRtr, kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn,
     kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex},
    {S::kRtr, S::kRts,
     kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrSqPsn | kAttrMaxQpRdAtomic, kPathOptional},
    {S::kRts, S::kRts, 0, kPathOptional},
    {S::kRts, S::kSqd, 0, kAttrEnSqdAsyncNotify},
    {S::kSqd, S::kRts, 0, kPathOptional},
    {S::kSqd, S::kSqd, 0,
     kAttrPort | kAttrAv | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic |
         kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex | kAttrPathMigState},
};

// XRC target (IBV_QPT_XRC_RECV): RC's responder side.
constexpr QpTransition kXrcRecv[] = {
    {S::kReset, S::kInit, kConnInit, 0},
    {S::kInit, S::kInit, 0, kConnInit},
    {S::kInit, S::kRtr,
     kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn | kAttrMaxDestRdAtomic | kAttrMinRnrTimer,
     kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex},
    {S::kRtr, S::kRts, kAttrTimeout | kAttrSqPsn, kPathOptional | kAttrMinRnrTimer},
    {S::kRts, S::kRts, 0, kPathOptional | kAttrMinRnrTimer},
    {S::kRts, S::kSqd, 0, kAttrEnSqdAsyncNotify},
    {S::kSqd, S::kRts, 0, kPathOptional | kAttrMinRnrTimer},
    {S::kSqd, S::kSqd, 0,
     kAttrPort | kAttrAv | kAttrTimeout | kAttrMaxDestRdAtomic | kAttrAltPath | kAttrAccessFlags |
         kAttrPkeyIndex | kAttrMinRnrTimer | kAttrPathMigState},
};

constexpr uint32_t bit(WrClass c) {
  return 1u << unsigned(c);
}
// Memory-window operations (kLocal: BIND_MW, LOCAL_INV) exist on the connected services
// (IBTA 10.6.7: RC, UC, XRC), not on UD.
// RDMA ATOMIC WRITE (kAtomicWrite) is allowed by class on RC and XRC; only RC has its wire
// opcode (as in rxe), so an XRC post is refused by the opcode check.
constexpr uint32_t kAllClasses = bit(WrClass::kSend) | bit(WrClass::kWrite) | bit(WrClass::kRead) |
                                 bit(WrClass::kAtomic) | bit(WrClass::kAtomicWrite) |
                                 bit(WrClass::kLocal);

void rc_request(QueuePair& qp, const wire::Packet& pkt, const RxMeta&, Transport& t) {
  responder::on_request(qp, pkt, t);
}

constexpr QpTypeInfo kTypes[] = {
    {.name = "IBV_QPT_RC",
     .type = QpType::kRc,
     .service = wire::Service::kRc,
     .reliable = true,
     .connected = true,
     .has_send_queue = true,
     .has_recv_queue = true,
     .takes_requests = true,
     .takes_responses = true,
     .single_packet = false,
     .wr_classes = kAllClasses,
     .transitions = kRc,
     .on_request = rc_request},
    {.name = "IBV_QPT_UC",
     .type = QpType::kUc,
     .service = wire::Service::kUc,
     .reliable = false,
     .connected = true,
     .has_send_queue = true,
     .has_recv_queue = true,
     .takes_requests = true,
     .takes_responses = false,
     .single_packet = false,
     .wr_classes = bit(WrClass::kSend) | bit(WrClass::kWrite) | bit(WrClass::kLocal),
     .transitions = kUc,
     .on_request = uc::on_request},
    {.name = "IBV_QPT_UD",
     .type = QpType::kUd,
     .service = wire::Service::kUd,
     .reliable = false,
     .connected = false,
     .has_send_queue = true,
     .has_recv_queue = true,
     .takes_requests = true,
     .takes_responses = false,
     .single_packet = true,
     .wr_classes = bit(WrClass::kSend),
     .transitions = kUd,
     .on_request = ud::on_request},
    {.name = "IBV_QPT_XRC_SEND",
     .type = QpType::kXrcSend,
     .service = wire::Service::kXrc,
     .reliable = true,
     .connected = true,
     .has_send_queue = true,
     .has_recv_queue = false,
     .takes_requests = false,
     .takes_responses = true,
     .single_packet = false,
     .wr_classes = kAllClasses,
     .transitions = kXrcSend,
     .on_request = nullptr},
    {.name = "IBV_QPT_XRC_RECV",
     .type = QpType::kXrcRecv,
     .service = wire::Service::kXrc,
     .reliable = true,
     .connected = true,
     .has_send_queue = false,
     .has_recv_queue = false,
     .takes_requests = true,
     .takes_responses = false,
     .single_packet = false,
     .wr_classes = 0,
     .transitions = kXrcRecv,
     .on_request = rc_request},
};

}  // namespace

const QpTypeInfo* qp_type_info(QpType type) {
  for (const QpTypeInfo& i : kTypes)
    if (i.type == type) return &i;
  return nullptr;
}

}  // namespace softrdma::engine
