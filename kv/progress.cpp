// kv::Engine's progress thread: posts queued slices (at most a window per QP: max_wr, raised
// by the path once its RTT is measured — apply_path_window), turns
// completions into batch progress, notifications and probe answers, and fails a peer on the
// first error completion (its QPs go to the error state so everything they hold flushes at
// once; a later use reconnects). It busy-polls every device's CQ while data slices are
// outstanding (`poll_while_busy`) and for `spin` after activity, then sleeps on the devices'
// completion channels (never a core spinning while idle). Polling while busy matters on the
// same host: a softrdma consumer that polls is fed by its own poll calls, while a sleeping
// one costs the producer a doorbell and the device thread a wake-up per completion burst.
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/link_rate.h"
#include "kv/engine_impl.h"

namespace softrdma::kv {

using detail::Batch;
using detail::DueCallbacks;
using detail::Peer;
using detail::PeerState;
using detail::Qp;
using detail::Slice;
using detail::WrKind;

namespace {

uint64_t wr_id(WrKind kind, uint64_t payload) {
  return (payload << 3) | static_cast<uint64_t>(kind);
}

std::string status_text(ibv_wc_status s) {
  std::string t = ibv_wc_status_str(s);
  if (s == IBV_WC_RETRY_EXC_ERR) t += " (the peer is dead or unreachable)";
  if (s == IBV_WC_REM_ACCESS_ERR) t += " (segment deregistered on the peer, or a stale key)";
  return t;
}

}  // namespace

void Engine::Impl::start_progress() {
  worker.thread = std::thread([this] {
    pthread_setname_np(pthread_self(), "kv-progress");  // for top -H, perf and the tests
    progress_loop();
  });
}

void Engine::Impl::progress_loop() {
  ibv_wc wc[32];
  auto last = Clock::now();
  const auto nd = static_cast<uint32_t>(context.devs.size());
  auto drain = [&](uint32_t dev, int n) {
    DueCallbacks due;
    {
      std::lock_guard lk(mu);
      handle_completions(dev, wc, n, due);
      reap_retired();
    }
    for (auto& [cb, args] : due) cb(args.first, args.second);
    last = Clock::now();
  };
  // One pass over every device's CQ; whether any had completions.
  auto poll_all = [&] {
    bool any = false;
    for (uint32_t d = 0; d < nd; ++d) {
      const int n = ibv_poll_cq(context.devs[d].cq, 32, wc);
      if (n > 0) {
        drain(d, n);
        any = true;
      }
    }
    return any;
  };
  std::vector<pollfd> fds(nd + 1);
  while (!stop) {
    if (poll_all()) continue;
    if (opt.poll_while_busy && worker.data_busy.load(std::memory_order_relaxed) > 0) continue;
    if (Clock::now() - last < opt.spin) continue;
    // Sleep: arm, poll once more (a completion between the poll and the arming raises no
    // event), then wait for a channel or the stop eventfd.
    for (uint32_t d = 0; d < nd; ++d) ibv_req_notify_cq(context.devs[d].cq, 0);
    if (poll_all()) continue;
    for (uint32_t d = 0; d < nd; ++d) fds[d] = {context.devs[d].channel->fd, POLLIN, 0};
    fds[nd] = {worker.wake_fd, POLLIN, 0};
    ::poll(fds.data(), nd + 1, clock::to_real_timeout_ms(100));
    for (uint32_t d = 0; d < nd; ++d) {
      if (!(fds[d].revents & POLLIN)) continue;
      ibv_cq* ev_cq = nullptr;
      void* ev_ctx = nullptr;
      while (ibv_get_cq_event(context.devs[d].channel, &ev_cq, &ev_ctx) == 0)
        ibv_ack_cq_events(ev_cq, 1);
      last = Clock::now();
    }
  }
}

void Engine::Impl::handle_completions(uint32_t dev, const ibv_wc* wc, int n, DueCallbacks& due) {
  for (int i = 0; i < n; ++i) {
    const ibv_wc& w = wc[i];
    auto qit = qp_by_num.find(qp_key(dev, w.qp_num));
    if (qit == qp_by_num.end()) continue;  // a QP already destroyed
    Qp& q = *qit->second;
    Peer& p = *q.peer;
    const auto kind = static_cast<WrKind>(w.wr_id & detail::kKindMask);
    const uint64_t payload = w.wr_id >> 3;
    const bool ok = w.status == IBV_WC_SUCCESS;
    // The first failure names the cause; the flushes that follow it repeat it.
    auto reason = [&](const std::string& what) {
      if (w.status == IBV_WC_WR_FLUSH_ERR && !p.broken_reason.empty()) return p.broken_reason;
      return "kv engine '" + name + "': " + what + " with peer " + p.desc +
             " failed: " + status_text(w.status);
    };
    switch (kind) {
      case WrKind::kData: {
        Slice& s = *reinterpret_cast<Slice*>(w.wr_id & ~detail::kKindMask);
        --q.outstanding;
        --q.data_outstanding;
        q.data_bytes -= s.length;
        worker.data_busy.fetch_sub(1, std::memory_order_relaxed);
        if (ok) {
          slice_done(s, true, {}, {}, due);
        } else {
          const std::string why = reason(std::string(s.opcode == Opcode::kRead ? "READ" : "WRITE") +
                                         " of " + std::to_string(s.length) + " bytes");
          if (!q.retired) fail_peer(p, why, due);
          slice_done(s, false, why, p.name, due);
        }
        if (!q.retired) pump(q, due);
        break;
      }
      case WrKind::kNotifySend:
        --q.outstanding;
        p.free_send_slots.push_back(static_cast<uint32_t>(payload));
        if (!ok && !q.retired) fail_peer(p, reason("a notification"), due);
        post_notify(p, due);
        break;
      case WrKind::kRecv: {
        --q.recvs_posted;
        if (!ok) {
          if (!q.retired && w.status != IBV_WC_WR_FLUSH_ERR)
            fail_peer(p, reason("receiving a notification"), due);
          break;
        }
        const char* slot = p.recv_buf.data() + payload * detail::kSlotBytes;
        uint32_t len = 0;
        std::memcpy(&len, slot, 4);
        if (w.byte_len >= 4 && len <= w.byte_len - 4 && len <= Engine::kMaxNotifyBytes)
          inbox.push_back(Notification{p.name, std::string(slot + 4, len)});
        if (!q.retired) post_recv(q, static_cast<uint32_t>(payload));
        cv.notify_all();
        break;
      }
      case WrKind::kProbe:
        --q.outstanding;
        if (ok)
          p.probes_done = std::max(p.probes_done, payload);
        else if (!q.retired)
          fail_peer(p, reason("a probe"), due);
        cv.notify_all();
        break;
      case WrKind::kPathProbe: {
        --q.outstanding;
        if (!ok) {
          if (!q.retired) fail_peer(p, reason("a path probe"), due);
          break;
        }
        if (q.retired) break;  // a probe of a connection since replaced
        const auto rtt =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - p.path_probe_sent);
        p.path_rtt = p.path_rtt.count() == 0 ? rtt : std::min(p.path_rtt, rtt);
        // The window is set once, from the smallest of all the samples (a first sample can
        // include a sleeping thread's wake-up), and never shrinks, so its CQ entries stay
        // reserved for the completions it allows.
        if (++p.path_probes < detail::kPathProbes)
          post_path_probe(p);
        else
          apply_path_window(p, due);
        break;
      }
    }
  }
}

void Engine::Impl::pump(Qp& q, DueCallbacks& due) {
  if (q.retired || q.peer->state != PeerState::kConnected) return;
  constexpr size_t kChain = 16;
  ibv_send_wr wrs[kChain];
  ibv_sge sges[kChain];
  while (!q.queue.empty()) {
    // A full window of slices smaller than slice_bytes holds fewer bytes than the path wants
    // outstanding (a paged cache's 32 KiB blocks: an eighth): it grows instead.
    if (q.data_outstanding >= q.window &&
        (q.data_bytes >= q.byte_target || !grow_window(q, q.window + kChain)))
      break;
    const size_t k = std::min<size_t>({kChain, q.window - q.data_outstanding, q.queue.size()});
    for (size_t i = 0; i < k; ++i) {
      Slice& s = *q.queue[i];
      sges[i] = ibv_sge{s.local, s.length, s.lkey};
      wrs[i] = ibv_send_wr{};
      wrs[i].wr_id = reinterpret_cast<uint64_t>(&s) | static_cast<uint64_t>(WrKind::kData);
      wrs[i].sg_list = &sges[i];
      wrs[i].num_sge = 1;
      wrs[i].opcode = s.opcode == Opcode::kRead ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      wrs[i].send_flags = IBV_SEND_SIGNALED;
      wrs[i].wr.rdma.remote_addr = s.remote;
      wrs[i].wr.rdma.rkey = s.rkey;
      wrs[i].next = i + 1 < k ? &wrs[i + 1] : nullptr;
    }
    ibv_send_wr* bad = nullptr;
    const int e = ibv_post_send(q.qp, wrs, &bad);
    const size_t posted = e ? static_cast<size_t>(bad - wrs) : k;
    for (size_t i = 0; i < posted; ++i) q.data_bytes += q.queue[i]->length;
    q.queue.erase(q.queue.begin(), q.queue.begin() + static_cast<ptrdiff_t>(posted));
    q.outstanding += static_cast<uint32_t>(posted);
    q.data_outstanding += static_cast<uint32_t>(posted);
    worker.data_busy.fetch_add(posted, std::memory_order_relaxed);
    if (e) {
      fail_peer(*q.peer,
                "kv engine '" + name + "': ibv_post_send to peer " + q.peer->desc + ": " +
                    std::strerror(e),
                due);
      return;
    }
  }
}

void Engine::Impl::post_notify(Peer& p, DueCallbacks& due) {
  while (!p.pending_notify.empty() && !p.free_send_slots.empty() &&
         p.state == PeerState::kConnected) {
    const uint32_t slot = p.free_send_slots.back();
    const std::string& m = p.pending_notify.front();
    char* buf = p.send_buf.data() + size_t{slot} * detail::kSlotBytes;
    const auto len = static_cast<uint32_t>(m.size());
    std::memcpy(buf, &len, 4);
    std::memcpy(buf + 4, m.data(), m.size());
    ibv_sge sge{reinterpret_cast<uint64_t>(buf), 4 + len, p.send_mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id(WrKind::kNotifySend, slot);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    Qp& q = *p.qps[0];
    if (int e = ibv_post_send(q.qp, &wr, &bad)) {
      fail_peer(p,
                "kv engine '" + name + "': ibv_post_send(notification) to peer " + p.desc + ": " +
                    std::strerror(e),
                due);
      return;
    }
    p.free_send_slots.pop_back();
    ++q.outstanding;
    p.pending_notify.pop_front();
  }
}

void Engine::Impl::post_recv(Qp& q, uint32_t slot) {
  Peer& p = *q.peer;
  ibv_sge sge{reinterpret_cast<uint64_t>(p.recv_buf.data() + size_t{slot} * detail::kSlotBytes),
              detail::kSlotBytes, p.recv_mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = wr_id(WrKind::kRecv, slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  // A failure here leaves the slot unposted: the peer's next send to it waits for RNR
  // retries (infinite), and a probe or transfer then names the broken QP.
  if (ibv_post_recv(q.qp, &wr, &bad) == 0) ++q.recvs_posted;
}

bool Engine::Impl::post_zero_write(Peer& p, uint64_t id) {
  ibv_send_wr wr{};
  wr.wr_id = id;
  wr.num_sge = 0;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(p.qps[0]->qp, &wr, &bad) != 0) return false;
  ++p.qps[0]->outstanding;
  return true;
}

void Engine::Impl::post_path_probe(Peer& p) {
  if (p.qps.empty() || p.state != PeerState::kConnected) return;
  p.path_probe_sent = Clock::now();
  // A failed post leaves the window at max_wr; the peer's next transfer names a broken QP.
  post_zero_write(p, wr_id(WrKind::kPathProbe, 0));
}

void Engine::Impl::apply_path_window(Peer& p, DueCallbacks& due) {
  if (p.qps.empty()) return;
  const uint64_t bdp =
      link_rate::bandwidth_delay_bytes(context.devs[p.qps[0]->dev].port_bits, p.path_rtt);
  const uint64_t per_qp = detail::kRepairRounds * ((bdp + p.qps.size() - 1) / p.qps.size());
  const uint64_t want = (per_qp + opt.slice_bytes - 1) / opt.slice_bytes;
  for (Qp* q : p.qps) {
    q->byte_target = per_qp;
    grow_window(*q, static_cast<uint32_t>(std::min<uint64_t>(want, q->sq_slices)));
    pump(*q, due);
  }
}

bool Engine::Impl::grow_window(Qp& q, uint32_t target) {
  target = std::min(target, q.sq_slices);
  if (target <= q.window) return false;
  detail::Device& d = context.devs[q.dev];
  const int room = std::max(d.cq_capacity - d.cq_reserved, 0);
  const auto grant = std::min<uint32_t>(target - q.window, static_cast<uint32_t>(room));
  q.window += grant;
  q.cq_share += static_cast<int>(grant);
  d.cq_reserved += static_cast<int>(grant);
  return grant > 0;
}

void Engine::Impl::post_probe(Peer& p) {
  if (p.qps.empty() || p.probes_sent - p.probes_done >= 4) return;
  if (post_zero_write(p, wr_id(WrKind::kProbe, p.probes_sent + 1))) ++p.probes_sent;
}

void Engine::Impl::slice_done(Slice& s, bool ok, const std::string& error, const std::string& peer,
                              DueCallbacks& due) {
  Batch& b = *s.batch;
  --b.slices_left;
  --s.region->inflight;
  if (ok) {
    b.bytes_done += s.length;
  } else if (!b.failed) {
    b.failed = true;
    b.error = error;
    b.error_peer = peer;
  }
  if (b.slices_left == 0) batch_finished(b, due);
}

void Engine::Impl::batch_finished(Batch& b, DueCallbacks& due) {
  if (!b.failed && !b.notify.empty()) {
    Peer& p = *peers.find(b.notify_peer)->second;
    p.pending_notify.push_back(b.notify);
    post_notify(p, due);
    if (p.state != PeerState::kConnected) {
      b.failed = true;
      b.error = "the batch's notification was not sent: " + p.broken_reason;
      b.error_peer = p.name;
    }
  }
  b.notify.clear();
  cv.notify_all();
  if (b.callback) {
    due.emplace_back(std::move(b.callback), std::make_pair(b.id, status_of(b)));
    b.callback = nullptr;
  }
}

void Engine::Impl::fail_peer(Peer& p, const std::string& reason, DueCallbacks& due) {
  if (p.state == PeerState::kConnected) p.state = PeerState::kBroken;
  p.broken_reason = reason;
  p.lost = true;
  std::vector<Qp*> set = std::move(p.qps);
  p.qps.clear();
  for (Qp* q : set) {
    q->retired = true;
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(q->qp, &a, IBV_QP_STATE);
  }
  for (Qp* q : set)
    while (!q->queue.empty()) {
      Slice* s = q->queue.front();
      q->queue.pop_front();
      slice_done(*s, false, reason, p.name, due);
    }
  p.pending_notify.clear();
  cv.notify_all();
}

void Engine::Impl::reap_retired() {
  std::vector<Qp*> done;
  for (const auto& q : qps)
    if (q->retired && q->outstanding == 0 && q->recvs_posted == 0) done.push_back(q.get());
  for (Qp* q : done) destroy_qp(q);
}

}  // namespace softrdma::kv
