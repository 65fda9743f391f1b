// VerbsTransport liveness: the first failure a rank sees (error completion, stall, protocol
// error) is recorded and broadcast in abort messages so every rank names the same dead peer;
// goodbyes tell a clean exit from a death; zero-length probes find dead peers a rank only
// waits for.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "ccl/verbs_transport_impl.h"

namespace softrdma::ccl {

using namespace verbs;  // NOLINT(google-build-using-namespace): the transport's own types
using std::chrono::milliseconds;

bool VerbsTransport::Impl::post_zero_write(Peer& P, uint64_t index, const char* what) {
  ibv_send_wr wr{};
  wr.wr_id = make_wr_id(Kind::kProbe, P.rank, index);
  wr.num_sge = 0;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (int e = ibv_post_send(P.ch[0].qp, &wr, &bad)) {
    peer_failed(P.rank, std::string("ibv_post_send(") + what + ") failed: " + errno_text(e));
    return false;
  }
  --P.ch[0].sq_free;
  return true;
}

void VerbsTransport::Impl::post_probe(Peer& P, Clock::time_point now) {
  if (!post_zero_write(P, 0, "probe")) return;
  P.probe_outstanding = true;
  P.last_probe = now;
}

void VerbsTransport::Impl::local_failure(int peer, const std::string& reason, bool tell_peer) {
  if (failed) return;
  failed = true;
  fail_peer = peer;
  fail_reason = reason;
  CtlMsg m{};
  m.type = static_cast<uint32_t>(Ctl::kAbort);
  m.id = static_cast<uint32_t>(peer);
  std::snprintf(m.text, sizeof m.text, "%s", reason.c_str());
  for (Peer& P : peers) {
    if (!P.connected() || (P.rank == peer && !tell_peer) || P.dead || P.closed ||
        P.ch[0].sq_free < 1)
      continue;
    post_ctl(P, m, false);
    drain_pending = true;
  }
}

void VerbsTransport::Impl::peer_failed(int p, const std::string& reason) {
  Peer& P = peers[p];
  P.dead = true;
  local_failure(p, reason);
}

std::string VerbsTransport::Impl::describe_failure(const char* op) const {
  std::string s = std::string(op ? op : "ccl") + ": rank " + std::to_string(rank) + ": ";
  if (fail_peer >= 0 && fail_peer < size) s += "peer " + peers[fail_peer].desc + ": ";
  return s + fail_reason;
}

// Throws the recorded failure. The first time, lets the aborts leave before the caller
// (likely) exits: a bounded drain (never from inside the completion handlers, which may
// run in the middle of flush()).
void VerbsTransport::Impl::check_failure(const char* op) {
  if (!failed) return;
  if (drain_pending) {
    drain_pending = false;
    const auto until = Clock::now() + milliseconds(100);
    while (!all_sends_done() && Clock::now() < until)
      if (poll_once() == 0) clock::sleep_for(std::chrono::microseconds(200));
  }
  throw PeerError(describe_failure(op), fail_peer);
}

bool VerbsTransport::Impl::all_sends_done() const {
  for (const Peer& P : peers)
    if (P.connected() && !P.dead && !P.closed && !P.send_queues_idle()) return false;
  return true;
}

void VerbsTransport::Impl::maybe_probe(Clock::time_point now) {
  if (failed) return;
  for (Peer& P : peers) {
    if (!P.connected() || P.dead || P.closed || P.probe_outstanding || P.ch[0].sq_free < 1)
      continue;
    if (now - std::max(P.last_heard, P.last_probe) >= probe_interval) post_probe(P, now);
  }
}

void VerbsTransport::Impl::check_stall(int peer, Clock::time_point since, Clock::time_point now) {
  if (peer < 0) return;  // self transfers too: a recv from self never sent times out
  const Peer& P = peers[peer];
  if (now - std::max(since, P.last_heard) > opt.timeout)
    local_failure(peer, "no progress within " + std::to_string(opt.timeout.count()) + " ms", true);
}

void VerbsTransport::Impl::on_abort(Peer& P, CtlMsg& m) {
  if (failed) return;
  m.text[sizeof m.text - 1] = 0;
  int dead = static_cast<int>(m.id);
  failed = true;
  if (dead >= 0 && dead < size && dead != rank) {
    fail_peer = dead;
    fail_reason = std::string("reported by rank ") + std::to_string(P.rank) + ": " + m.text;
  } else {
    fail_peer = P.rank;
    fail_reason = std::string("aborted by it: ") + m.text;
  }
}

void VerbsTransport::Impl::on_bye(Peer& P) {
  P.closed = true;
  if (P.pending > 0 && !failed)
    local_failure(P.rank, "closed its communicator with " + std::to_string(P.pending) +
                              " transfer(s) to or from this rank pending");
}

}  // namespace softrdma::ccl
