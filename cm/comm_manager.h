// The IB Communication Manager protocol of one device: communication IDs, the connection
// state machine, MAD retransmission and time-wait, service ID listeners, and SIDR.
//
// Source: IBTA vol. 1 rel. 1.4, ch. 12 — 12.6 (messages), 12.9 (the state diagrams: REQ
// sent/received, REP sent/received, MRA, established, DREQ sent/received, time-wait), 12.7
// (SIDR), 12.9.8 (retries: a message is resent after its response timeout, Max CM Retries
// times). Where the spec leaves a choice, Linux's drivers/infiniband/core/cm.c is followed
// (duplicate handling, what destroying an ID sends in each state, answering a DREQ for an
// unknown ID with a DREP, REJ "invalid service ID" for a REQ nobody listens to), so that
// kernel peers and captures see what they expect.
//
// Threading: not thread-safe. The owner serialises every call (cm/device.cpp holds a mutex
// around on_mad, on_timer and the API calls). Handlers run synchronously inside those calls,
// after the CM's own state is consistent, and may call back into the CommManager (a REQ
// handler may reject at once).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "cm/mad.h"
#include "cm/mad_transport.h"

namespace softrdma::cm {

// X(name, help): what the CM counts (CommManager::counters()).
#define SOFTRDMA_CM_COUNTERS(X)                                                              \
  X(mads_sent, "CM MADs sent (first transmissions and resends)")                             \
  X(mads_rcvd, "CM MADs received and decoded")                                               \
  X(mads_resent, "CM MADs resent after their response timeout")                              \
  X(mads_malformed, "MADs dropped: too short, bad version, not ComMgtSend")                  \
  X(mads_not_cm, "MADs dropped: another management class or an attribute not handled")       \
  X(mads_unmatched, "MADs dropped: no communication ID (or service) they belong to")         \
  X(mads_wrong_peer, "MADs dropped: from an address other than the connection's peer")       \
  X(mads_bad_state, "MADs dropped: the connection's state takes no such message")            \
  X(mads_duplicate, "duplicate MADs (answered again or ignored, per IBTA 12.9)")             \
  X(timeouts, "REQ/REP/DREQ/SIDR_REQ given up after Max CM Retries resends")                 \
  X(rej_sent, "REJs sent")                                                                   \
  X(rej_rcvd, "REJs received")                                                               \
  X(reqs_held, "REQs / SIDR_REQs for a service nobody listened to yet, held for a listener") \
  X(mads_other_process, "MADs left to another process sharing the address (its ID or listener)")

struct CmCounters {
#define SOFTRDMA_CM_COUNTER_FIELD(name, help) uint64_t name = 0;
  SOFTRDMA_CM_COUNTERS(SOFTRDMA_CM_COUNTER_FIELD)
#undef SOFTRDMA_CM_COUNTER_FIELD
};

/// States of a communication ID (IBTA 12.9.6 figure 170 / 12.11 for SIDR; Linux ib_cm_state).
enum class CmState : uint8_t {
  kIdle,
  kListen,
  kReqSent,
  kReqRcvd,
  kMraReqSent,
  kMraReqRcvd,
  kRepSent,
  kRepRcvd,
  kMraRepSent,
  kMraRepRcvd,
  kEstablished,
  kDreqSent,
  kDreqRcvd,
  kTimeWait,
  kSidrReqSent,
  kSidrReqRcvd,
};
const char* to_string(CmState s);
/// A connection being set up whose peer QP is known — a REQ received or a REP sent or
/// received (and their MRA variants) — and not yet established: RTR is possible, and giving
/// up is a REJ "consumer defined" (Linux cm_destroy_id). The one statement of that set.
constexpr bool connecting_with_peer_known(CmState s) {
  switch (s) {
    case CmState::kReqRcvd:
    case CmState::kMraReqSent:
    case CmState::kRepRcvd:
    case CmState::kMraRepSent:
    case CmState::kRepSent:
    case CmState::kMraRepRcvd:
      return true;
    default:
      return false;
  }
}

/// What a handler is told.
enum class CmEventType : uint8_t {
  kReqReceived,      ///< a new REQ for a listened service ID: `id` is a new ID (kReqRcvd)
  kRepReceived,      ///< REP for our REQ (kRepRcvd): send RTU (or REJ)
  kRtuReceived,      ///< RTU for our REP (kEstablished)
  kUserEstablished,  ///< establish() moved a kRepSent ID to kEstablished (COMM_EST)
  kRejReceived,      ///< the peer rejected (ID back to kIdle, or kTimeWait)
  kReqError,         ///< REQ unanswered after all retries (kIdle)
  kRepError,         ///< REP unanswered after all retries (kIdle; a REJ was sent)
  kDreqReceived,     ///< the peer disconnects (kDreqRcvd): answer with send_drep
  kDrepReceived,     ///< our DREQ was answered (kTimeWait)
  kDreqError,        ///< DREQ unanswered after all retries (kTimeWait)
  kTimeWaitExit,     ///< time-wait over (kIdle)
  kSidrReqReceived,  ///< a SIDR_REQ for a listened service ID: `id` is new (kSidrReqRcvd)
  kSidrRepReceived,  ///< the answer to our SIDR_REQ (kIdle)
  kSidrReqError,     ///< SIDR_REQ unanswered after all retries (kIdle)
};
const char* to_string(CmEventType t);

struct CmEvent {
  CmEventType type;
  uint32_t id;          ///< local communication ID the event is about
  MadAddress peer;      ///< the remote side's QP1
  const Mad* mad;       ///< the received message (nullptr for timer events)
  uint64_t service_id;  ///< kReqReceived / kSidrReqReceived: the listened service ID
};

/// Called for events of one ID (or, for kReqReceived / kSidrReqReceived, of its listener).
using CmHandler = std::function<void(const CmEvent&)>;

/// Settings of one CommManager.
struct CmConfig {
  uint64_t ca_guid = 0;  ///< node GUID written in REQ/REP (Local CA GUID)
  /// CM response timeout, 4.096 µs · 2^n (IBTA 12.6.5): how long this side takes to answer,
  /// written in REQ/REP; a MAD is resent after 2 × packet life time + the peer's timeout.
  uint8_t response_timeout = 20;
  /// Max CM Retries (4 bits): resends of a REQ/REP/DREQ/SIDR_REQ before giving up.
  uint8_t max_retries = 15;
  /// Packet life time of the path, 4.096 µs · 2^n (Linux uses 16 for RoCE,
  /// CMA_IBOE_PACKET_LIFETIME).
  uint8_t packet_life_time = 16;
  /// The CA's ACK delay (ibv_device_attr::local_ca_ack_delay), for the local ACK timeout.
  uint8_t ca_ack_delay = 15;
  /// Processes sharing one address (net/address_share.h) all receive every MAD sent to its
  /// QP1. Each CM's communication IDs carry its process's slot, 0..15, in their top 4 bits
  /// (kCommIdSlotShift), and a MAD that names a receiver ID of another slot is left to
  /// that process (counted in mads_other_process, never answered).
  uint8_t slot = 0;
  /// Whether another process at this address listens to `service_id`: a REQ / SIDR_REQ for
  /// it is then left to that process instead of held and refused here. Empty: nobody else.
  std::function<bool(uint64_t service_id)> listened_elsewhere;
};

/// Communication IDs carry the slot of their process (CmConfig::slot) from this bit on.
inline constexpr unsigned kCommIdSlotShift = 28;

/// How long a REQ or SIDR_REQ for a service ID nobody listens to is held at most before the
/// REJ "invalid service ID" (or SIDR_REP "unsupported") goes out — and never more than half
/// the requester's response timeout — and how many are held at most.
/// A server that re-listens on a port — perftest -R closes its first listener and listens
/// again for the test connection while its client is already connecting — would otherwise
/// lose a race the kernel's slower address resolution hides; a peer still gets its REJ long
/// before its own response timeout (Linux's is 4.3 s).
inline constexpr uint64_t kUnmatchedRequestHoldNs = 1'000'000'000;
inline constexpr size_t kMaxHeldRequests = 64;

/// 4.096 µs · 2^exp, in ns (IBTA's timeout encoding; exp ≥ 31 is clamped).
uint64_t ib_time_ns(uint8_t exp);
/// The QP's local ACK timeout for a path of `packet_life_time` on a CA with `ack_delay`, as
/// Linux's cm_ack_timeout (IBTA 12.7.34: ~ 2 × packet life time + ACK delay).
uint8_t ack_timeout(uint8_t ack_delay, uint8_t packet_life_time);

/// The Communication Manager of one device. Every function returning int returns 0 or a
/// positive errno: EINVAL when the ID does not exist or its state does not allow the call
/// (as Linux ib_cm), EADDRINUSE when a service ID is already listened to.
class CommManager {
 public:
  CommManager(MadTransport& transport, CmConfig config);
  ~CommManager();
  CommManager(const CommManager&) = delete;
  CommManager& operator=(const CommManager&) = delete;

  /// A new ID in kIdle; `handler` receives its events. Returns the local communication ID.
  uint32_t create_id(CmHandler handler);
  /// Releases an ID, sending what its state calls for (Linux cm_destroy_id): REJ (timeout)
  /// for a REQ in flight, REJ (consumer defined) for an unanswered REQ or REP, DREQ for an
  /// established connection, DREP for a received DREQ; a connection then stays in time-wait
  /// (answering duplicates) with no handler. Unknown IDs are ignored.
  void destroy_id(uint32_t id);
  /// The ID's state; nullopt when it does not exist.
  std::optional<CmState> state(uint32_t id) const;

  /// Listens to `service_id` on ID `id` (kIdle → kListen): REQ and SIDR_REQ for it create new
  /// IDs whose events go to `id`'s handler until the handler of the new ID is set
  /// (set_handler); requests held for it (kUnmatchedRequestHoldNs) are delivered now.
  /// EADDRINUSE when another ID listens to it.
  int listen(uint32_t id, uint64_t service_id);
  /// Replaces the handler of `id` (e.g. a new passive ID's own handler).
  int set_handler(uint32_t id, CmHandler handler);

  /// Sends `req` to `peer` (kIdle → kReqSent) and resends it until answered. The CM fills
  /// local_comm_id, local_ca_guid, both response timeouts and max_cm_retries; the caller
  /// the rest (service ID, QPN, PSN, path, private data).
  int send_req(uint32_t id, const MadAddress& peer, Req req);
  /// Answers a received REQ (kReqRcvd/kMraReqSent → kRepSent); the CM fills the comm IDs,
  /// local_ca_guid and target_ack_delay. Resent until RTU, REJ or DREQ.
  int send_rep(uint32_t id, Rep rep);
  /// Completes the handshake after REP (kRepRcvd/kMraRepSent → kEstablished).
  int send_rtu(uint32_t id, std::span<const uint8_t> private_data);
  /// Rejects a REQ (kReqRcvd/kMraReqSent) or a REP (kRepRcvd/kMraRepSent) → kIdle.
  int send_rej(uint32_t id, RejReason reason, std::span<const uint8_t> private_data,
               std::span<const uint8_t> ari = {});
  /// kRepSent/kMraRepRcvd → kEstablished without RTU (the QP saw traffic: COMM_EST); queues
  /// kUserEstablished. EISCONN when already established.
  int establish(uint32_t id);
  /// Disconnects (kEstablished → kDreqSent), resent until DREP.
  int send_dreq(uint32_t id, std::span<const uint8_t> private_data);
  /// Answers a DREQ (kDreqRcvd → kTimeWait).
  int send_drep(uint32_t id, std::span<const uint8_t> private_data);
  /// Sends a SIDR_REQ (kIdle → kSidrReqSent), resent until SIDR_REP. request_id is filled.
  int send_sidr_req(uint32_t id, const MadAddress& peer, SidrReq req);
  /// Answers a SIDR_REQ (kSidrReqRcvd → kIdle); request_id and service_id are filled.
  int send_sidr_rep(uint32_t id, SidrRep rep);
  /// The QPN the peer named in its REQ or REP (for DREQ's Remote QPN), 0 if none yet.
  uint32_t remote_qpn(uint32_t id) const;

  /// One received MAD from `from` (QP1 receive). Malformed, unmatched or out-of-state MADs
  /// are dropped and counted, never an error.
  void on_mad(std::span<const uint8_t> bytes, const MadAddress& from);
  /// Runs due timers: resends, gives up (error events), ends time-waits.
  void on_timer();
  /// The earliest timer deadline (transport clock, ns), if any.
  std::optional<uint64_t> next_deadline() const;

  const CmCounters& counters() const { return counters_; }
  const CmConfig& config() const { return config_; }

 private:
  struct Conn;
  Conn* find(uint32_t id);
  const Conn* find(uint32_t id) const;
  /// The connection a message addressed to local ID `id` from `from` belongs to; counts the
  /// drop (unmatched / wrong peer) and returns nullptr otherwise.
  Conn* match(uint32_t id, const MadAddress& from);
  uint32_t new_comm_id();
  uint64_t new_tid(uint32_t comm_id) const;
  void transmit(const MadAddress& to, const std::array<uint8_t, kMadBytes>& mad);
  /// Sends `m` for `c` with transaction ID `tid` and keeps it for resends, `retries` times,
  /// each after answer_timeout_ns(packet life time, `response_timeout`) (IBTA vol 1
  /// 12.7.{31,33}: twice the packet life time plus 4.096 µs · 2^response_timeout).
  void send_with_retries(Conn& c, uint64_t tid, const CmMessage& m, uint8_t response_timeout,
                         unsigned retries);
  /// Sends `m` once for `c` with transaction ID `tid` (kept as the last message, for
  /// duplicates).
  void send_once(Conn& c, uint64_t tid, const CmMessage& m);
  void arm(Conn& c, uint64_t deadline);
  void disarm(Conn& c);
  void enter_timewait(Conn& c);
  void emit(uint32_t id, CmEventType type, const Mad* mad, uint64_t service_id = 0);
  void forget(uint32_t id);
  /// Sends a REJ / DREP / SIDR_REP for a message that has no connection (Linux cm_issue_*).
  void issue_rej(const MadAddress& to, const MadHeader& h, uint32_t remote_comm_id,
                 MessageRef message, RejReason reason);
  void issue_drep(const MadAddress& to, const MadHeader& h, const Dreq& dreq);
  /// Whether another process at this address listens to `service_id` (counted).
  bool listened_elsewhere(uint64_t service_id);
  /// Holds a request nobody listens to (true), or says there is no room (false).
  bool hold_request(const Mad& mad, const MadAddress& from);
  /// The refusal of a request nobody listened to: REJ or SIDR_REP "unsupported".
  void refuse_unmatched(const Mad& mad, const MadAddress& from);

  void handle(const Mad& mad, const Req& m, const MadAddress& from);
  void handle(const Mad& mad, const Mra& m, const MadAddress& from);
  void handle(const Mad& mad, const Rej& m, const MadAddress& from);
  void handle(const Mad& mad, const Rep& m, const MadAddress& from);
  void handle(const Mad& mad, const Rtu& m, const MadAddress& from);
  void handle(const Mad& mad, const Dreq& m, const MadAddress& from);
  void handle(const Mad& mad, const Drep& m, const MadAddress& from);
  void handle(const Mad& mad, const SidrReq& m, const MadAddress& from);
  void handle(const Mad& mad, const SidrRep& m, const MadAddress& from);

  MadTransport& transport_;
  CmConfig config_;
  CmCounters counters_;
  uint32_t comm_id_operand_;  ///< random XOR mask of comm IDs (Linux cm.random_id_operand)
  uint32_t next_comm_id_ = 1;
  uint32_t hi_tid_;  ///< high 32 bits of every TID this manager starts
  std::unordered_map<uint32_t, std::unique_ptr<Conn>> conns_;
  std::map<uint64_t, uint32_t> listeners_;                    ///< service ID → listening ID
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> remote_;  ///< (peer ip, remote ID) → ID
  std::set<std::pair<uint64_t, uint32_t>> timers_;            ///< (deadline, ID)
  struct HeldRequest {
    uint64_t deadline;
    MadAddress from;
    Mad mad;
  };
  std::vector<HeldRequest> held_;  ///< requests waiting for a listener, by deadline
};

}  // namespace softrdma::cm
