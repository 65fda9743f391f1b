// VerbsTransport completions: polling the CQ and dispatching each completion by the kind in
// its wr_id, and each received control message by its type.
#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "ccl/verbs_transport_impl.h"

namespace softrdma::ccl {

using namespace verbs;  // NOLINT(google-build-using-namespace): the transport's own types

namespace {
// Completions taken per ibv_poll_cq call.
constexpr int kPollBatch = 32;
}  // namespace

int VerbsTransport::Impl::poll_once() {
  if (!cq) return 0;
  ibv_wc wc[kPollBatch];
  int n = ibv_poll_cq(cq, kPollBatch, wc);
  if (n < 0) {
    local_failure(-1, "ibv_poll_cq failed");
    return 0;
  }
  for (int i = 0; i < n; ++i) handle(wc[i]);
  if (n > 0 && !failed)
    for (Peer& P : peers)
      if (P.connected() && (!P.outq.empty() || P.credit.return_due())) flush(P);
  return n;
}

void VerbsTransport::Impl::handle(const ibv_wc& wc) {
  const Kind k = wr_kind(wc.wr_id);
  const int p = wr_peer(wc.wr_id);
  const int c = wr_channel(wc.wr_id);
  const uint64_t idx = wr_index(wc.wr_id);
  if (p < 0 || p >= size || p == rank) return;
  Peer& P = peers[p];
  // A channel beyond the pair's count: a receive flushed from a QP destroyed at connect.
  if (static_cast<size_t>(c) >= P.ch.size()) return;
  const auto now = Clock::now();
  if (k != Kind::kRecv) ++P.ch[c].sq_free;
  if (k == Kind::kCtl) P.free_slots.push_back(static_cast<uint32_t>(idx));
  if (k == Kind::kProbe && idx == kPathProbeIndex) {
    if (P.path_probe_pending && wc.status == IBV_WC_SUCCESS) {
      const auto rtt =
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - P.path_probe_sent);
      P.path_rtt = P.path_rtt.count() == 0 ? rtt : std::min(P.path_rtt, rtt);
    }
    P.path_probe_pending = false;
  } else if (k == Kind::kProbe) {
    P.probe_outstanding = false;
  }
  if (wc.status != IBV_WC_SUCCESS) {
    const bool was_dead = P.dead;
    P.dead = true;
    if (was_dead || failed) return;          // flushes after the first error
    if (P.closed && P.pending == 0) return;  // it left; nothing of ours was in flight
    std::string what;
    if (wc.status == IBV_WC_RETRY_EXC_ERR)
      // Retransmissions went unanswered, or the device found the peer's process gone (then at
      // the first retransmit timeout; docs/architecture.md, "Peers that die or stop").
      what = "unreachable (IBV_WC_RETRY_EXC_ERR: no ACK within " + std::to_string(opt.retry_cnt) +
             " retransmissions, or the peer's process is gone)";
    else
      what = std::string("transfer failed: ") + ibv_wc_status_str(wc.status) + " (status " +
             std::to_string(wc.status) + ")";
    peer_failed(p, what);
    return;
  }
  switch (k) {
    case Kind::kRecv:
      P.last_heard = now;
      if (c == 0)
        handle_recv(P, static_cast<uint32_t>(idx), wc);
      else
        handle_data_recv(P, c, wc);
      break;
    case Kind::kCtl:
      P.last_heard = now;
      break;
    case Kind::kWrite: {
      P.last_heard = now;
      auto it = reqs.find(idx);
      if (it != reqs.end() && --it->second.pieces_left == 0 && it->second.all_posted) {
        it->second.done = true;
        --P.pending;
      }
      break;
    }
    case Kind::kProbe:
      break;
  }
}

// Every received message used one slot of the ring: repost it at once, and count a credit
// owed to the peer when the message was a credited one.
void VerbsTransport::Impl::handle_recv(Peer& P, uint32_t slot, const ibv_wc& wc) {
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    // Stripe 0 of a write (or the whole write): the credit goes back with the last stripe.
    const uint32_t id = ntohl(wc.imm_data);
    post_recv(P.rank, slot);
    on_data(P, id);
    return;
  }
  CtlMsg m;
  const char* msg = ring_slot(P.rank, slot);
  std::memcpy(&m, msg, sizeof m);
  P.credit.returned(m.credits);
  if (static_cast<Ctl>(m.type) == Ctl::kEager) {
    // The payload is read from the slot before it is reposted.
    if (m.length > P.eager_max || wc.byte_len != kCtlBytes + m.length) {
      post_recv(P.rank, slot);
      peer_failed(P.rank, "protocol error: eager transfer of " + std::to_string(m.length) +
                              " bytes in a " + std::to_string(wc.byte_len) + "-byte message");
      return;
    }
    on_eager(P, m.tag, msg + kCtlBytes, m.length);
    post_recv(P.rank, slot);
    return;
  }
  post_recv(P.rank, slot);
  switch (static_cast<Ctl>(m.type)) {
    case Ctl::kAdvert:
      P.credit.reposted();
      on_advert(P, Advert{m.addr, m.length, m.rkey, m.id, m.stripes}, m.tag);
      break;
    case Ctl::kCredit:
      break;
    case Ctl::kBarrier:
      P.credit.reposted();
      P.barrier_in.insert({m.seq, m.id});
      break;
    case Ctl::kAbort:
      on_abort(P, m);
      break;
    case Ctl::kBye:
      on_bye(P);
      break;
    default:
      peer_failed(P.rank, "protocol error: unknown control message " + std::to_string(m.type));
  }
}

void VerbsTransport::Impl::handle_data_recv(Peer& P, int c, const ibv_wc& wc) {
  post_data_recv(P.rank, c);
  if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM) {
    peer_failed(P.rank, "protocol error: a message on data channel " + std::to_string(c));
    return;
  }
  on_data(P, ntohl(wc.imm_data));
}

}  // namespace softrdma::ccl
