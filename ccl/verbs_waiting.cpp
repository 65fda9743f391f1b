// VerbsTransport waiting: how a rank blocks (spin, naps, channel sleeps), and the blocking
// calls wait(), test(), barrier() and close().
#include <poll.h>
#include <unistd.h>

#include <algorithm>

#include "ccl/verbs_transport_impl.h"

namespace softrdma::ccl {

using namespace verbs;  // NOLINT(google-build-using-namespace): the transport's own types
using std::chrono::microseconds;
using std::chrono::milliseconds;

void VerbsTransport::Impl::sleep_on_channel(microseconds max_wait) {
  if (ibv_req_notify_cq(cq, 0)) {
    clock::sleep_for(std::min<microseconds>(max_wait, microseconds(1000)));
    return;
  }
  if (poll_once() > 0) return;  // completions that raced with arming
  pollfd pfd{channel->fd, POLLIN, 0};
  const timespec ts =
      clock::to_real_timespec(static_cast<uint64_t>(std::max<int64_t>(max_wait.count(), 0)) * 1000);
  ::ppoll(&pfd, 1, &ts, nullptr);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  unsigned events = 0;
  while (ibv_get_cq_event(channel, &ev_cq, &ev_ctx) == 0) ++events;
  if (events) ibv_ack_cq_events(cq, events);
}

// Waiting has three phases, restarted by every completion: busy-polling for opt.spin;
// then naps of opt.nap (ppoll on the completion channel with that timeout, then polling
// the CQ, which also drives progress inline on providers that do so, like softrdma);
// after kDeepAfter without completions, sleeps on the channel in slices of up to 10 ms
// (never longer than the probe interval). Naps rather than long sleeps keep latency low
// while a message is likely to follow soon (softrdma's progress thread leaves the socket to
// a consumer that polled within the last 50 µs, so a polling rank receives inline), and
// leave the CPU to other ranks sharing it.
bool VerbsTransport::Impl::progress_until(const std::function<bool()>& done, int peer,
                                          Clock::time_point since) {
  constexpr milliseconds kDeepAfter{20};
  auto busy_since = Clock::now();
  for (;;) {
    const int n = poll_once();
    if (failed) return false;
    if (done()) return true;
    const auto now = Clock::now();
    if (n > 0) busy_since = now;
    check_stall(peer, since, now);
    maybe_probe(now);
    if (failed) return false;
    const auto idle = now - busy_since;
    if (idle < opt.spin) continue;
    if (idle < kDeepAfter)
      sleep_on_channel(opt.nap);
    else
      sleep_on_channel(std::min<microseconds>(milliseconds(10), probe_interval));
  }
}

void VerbsTransport::Impl::block(const char* op, const std::function<bool()>& done, int peer,
                                 Clock::time_point since) {
  if (!progress_until(done, peer, since)) check_failure(op);
}

bool VerbsTransport::Impl::has_room(const Peer& P, bool new_request) const {
  return P.outq.size() < static_cast<size_t>(kMaxRequestsPerPeer) &&
         (!new_request || P.pending < kMaxRequestsPerPeer);
}

void VerbsTransport::Impl::wait_for_room(Peer& P, bool new_request) {
  if (failed || has_room(P, new_request)) return;
  progress_until([&] { return has_room(P, new_request); }, P.rank, Clock::now());
}

void VerbsTransport::Impl::wait(RequestId id, const char* op) {
  Request& r = find(id, "wait");
  if (!r.done) {
    const int peer = r.peer;
    const auto since = r.posted;
    block(
        op, [&] { return r.done; }, peer, since);
  }
  reqs.erase(id);
}

bool VerbsTransport::Impl::test(RequestId id, const char* op) {
  Request& r = find(id, "test");
  if (!r.done) {
    poll_once();
    check_failure(op);
    if (!r.done) {
      const auto now = Clock::now();
      check_stall(r.peer, r.posted, now);
      maybe_probe(now);
      check_failure(op);
      return false;
    }
  }
  reqs.erase(id);
  return true;
}

void VerbsTransport::Impl::barrier(const char* op) {
  check_failure(op);
  if (size == 1) return;
  const uint64_t seq = barrier_seq++;
  uint32_t round = 0;
  for (int k = 1; k < size; k <<= 1, ++round) {
    const int to = (rank + k) % size;
    const int from = (rank - k % size + size) % size;
    CtlMsg m{};
    m.type = static_cast<uint32_t>(Ctl::kBarrier);
    m.seq = seq;
    m.id = round;
    Peer& T = peers[to];
    wait_for_room(T, false);
    check_failure(op);
    enqueue_ctl(T, m);
    const auto key = std::make_pair(seq, round);
    Peer& F = peers[from];
    block(
        op, [&] { return F.barrier_in.count(key) > 0; }, from, Clock::now());
    F.barrier_in.erase(key);
  }
}

void VerbsTransport::Impl::close() {
  if (!cq) return;
  if (!failed) {
    CtlMsg m{};
    m.type = static_cast<uint32_t>(Ctl::kBye);
    for (Peer& P : peers) {
      if (!P.connected() || P.dead || P.closed) continue;
      const int& ctl_free = P.ch[0].sq_free;
      if (ctl_free < 1) {
        const auto until = Clock::now() + milliseconds(200);
        while (ctl_free < 1 && !P.dead && Clock::now() < until)
          if (poll_once() == 0) clock::sleep_for(microseconds(100));
      }
      if (ctl_free >= 1 && !P.dead) post_ctl(P, m, false);
    }
  }
  const auto until =
      Clock::now() + std::min<milliseconds>(opt.timeout, milliseconds(failed ? 100 : 2000));
  while (!all_sends_done() && Clock::now() < until)
    if (poll_once() == 0) clock::sleep_for(microseconds(100));
}

}  // namespace softrdma::ccl
