// UC receive unit: SEND and RDMA WRITE packets of an unreliable connection (see qp.h).
// IBTA vol 1 ch. 9 (UC: no acknowledgements; a missing packet invalidates its message and
// the responder resumes at the next first or only packet), rxe_resp.c check_psn /
// check_op_seq / do_class_d1e_error for UC.
#include "engine/log.h"
#include "engine/placement.h"
#include "engine/qp.h"

namespace softrdma::engine::uc {

namespace {

// The message in progress is lost: drop this packet and the rest of it. Its receive WQE
// (if one was taken) stays held, rewound, for the next message.
void drop_message(QueuePair& qp, const wire::Packet& pkt, Transport& t, const char* why) {
  bump(t.counters().uc_dropped_pkts);
  if (!qp.resp.uc_drop)
    log().debug("qp {:#x}: {} psn {:#x} (expected {:#x}): {}; message dropped", qp.qpn(),
                pkt.info->name, pkt.hdr.bth.psn, qp.resp.epsn, why);
  qp.resp.uc_drop = true;
  qp.resp.in_send = qp.resp.in_write = false;
  qp.resp.recv_offset = 0;
}

}  // namespace

void on_request(QueuePair& qp, const wire::Packet& pkt, const RxMeta&, Transport& t) {
  const uint32_t m = pkt.info->mask;
  const bool starts = m & (wire::kIsFirst | wire::kIsOnly);
  if (starts) {
    // A new message: one still in progress lost its end and is abandoned (its WQE, if it
    // took one, serves this message).
    qp.resp.uc_drop = false;
    qp.resp.in_send = qp.resp.in_write = false;
  } else {
    const bool in_own = (m & wire::kIsSend) ? qp.resp.in_send : qp.resp.in_write;
    if (qp.resp.uc_drop) return drop_message(qp, pkt, t, "rest of a lost message");
    if (pkt.hdr.bth.psn != qp.resp.epsn) return drop_message(qp, pkt, t, "PSN gap");
    if (!in_own) return drop_message(qp, pkt, t, "no message of its kind in progress");
  }
  // Length against the path MTU (first/middle exactly one MTU, last/only at most one).
  const size_t n = pkt.payload.size();
  if (n > qp.mtu || ((m & (wire::kIsFirst | wire::kIsMiddle)) && n != qp.mtu))
    return drop_message(qp, pkt, t, "payload length against the MTU");
  const placement::Outcome o =
      (m & wire::kIsSend) ? placement::send(qp, pkt, t) : placement::write(qp, pkt, t);
  if (o != placement::Outcome::kDone) {
    static constexpr const char* kWhy[] = {"",
                                           "no receive WQE posted",
                                           "message longer than the WQE",
                                           "receive WQE not writable",
                                           "R_Key refused",
                                           "payload against the DMA length"};
    return drop_message(qp, pkt, t, kWhy[static_cast<size_t>(o)]);
  }
  qp.resp.epsn = wire::psn_add(pkt.hdr.bth.psn, 1);
}

}  // namespace softrdma::engine::uc
