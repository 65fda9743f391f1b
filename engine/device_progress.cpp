// Device progress: retransmit timers, inline progress from polling applications, and the
// progress thread (epoll, doorbells, the poller window). See device.h and the threading
// model in docs/architecture.md.
#include "engine/device.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>

#include "base/clock.h"
#include "base/params.h"
#include "engine/counter_publisher.h"
#include "engine/cq.h"
#include "engine/log.h"
#include "engine/memory.h"
#include "engine/qp.h"
#include "wire/icrc.h"

namespace softrdma::engine {

namespace {

/// Whether more threads are runnable right now than this machine has CPUs (the kernel's
/// instantaneous count, /proc/loadavg's fourth field, which includes the caller). Spinning
/// then takes a core from a thread that has real work: on 2 cores, two concurrent perftest
/// pairs moved 0.8 GB/s in all with spinning progress threads, 3.5–6 GB/s without.
bool cpus_oversubscribed() {
  static const long cpus = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  char buf[128];
  const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  long running = 0;
  if (std::sscanf(buf, "%*s %*s %*s %ld/", &running) != 1) return false;
  return running > cpus;
}

}  // namespace

void Device::run_timers_locked(uint64_t now) {
  while (!timers_.empty() && timers_.top().deadline_ns <= now) {
    const TimerEntry e = timers_.top();
    timers_.pop();
    auto it = qps_.find(e.qpn);
    if (it == qps_.end() || it->second->timer_queued_ns != e.deadline_ns) continue;  // stale
    QueuePair& qp = *it->second;
    qp.timer_queued_ns = 0;
    uint64_t d = qp.next_deadline();
    if (d && d <= now) {
      completer::on_timer(qp, *this, now);
      d = qp.next_deadline();
    }
    // Timers are lazy (a retransmit timer moves later with progress without re-queueing):
    // queue the QP again for whatever it still has armed.
    if (d) timer_armed(qp, std::max(d, now + 1));
  }
  next_deadline_ns_ = timers_.empty() ? 0 : timers_.top().deadline_ns;
  release_wan(now);
  if (wan_.is_open() && wan_.next_due_ns() != UINT64_MAX &&
      (!next_deadline_ns_ || wan_.next_due_ns() < next_deadline_ns_))
    next_deadline_ns_ = wan_.next_due_ns();
}

void Device::progress_locked(uint64_t now, bool check_udp) {
  // Forwards that found a sharing process's socket full (net/address_share.h), oldest first.
  if (share_.backlogged()) send_share_locked();
  receive_locked(check_udp);
  run_timers_locked(now);
  flush();
}

bool Device::crowded(uint64_t now) {
  // A /proc read at most once a millisecond, shared by the progress thread and pollers.
  uint64_t checked = crowded_checked_ns_.load(std::memory_order_relaxed);
  if (now - checked > 1'000'000 && crowded_checked_ns_.compare_exchange_strong(checked, now))
    crowded_.store(cpus_oversubscribed(), std::memory_order_relaxed);
  return crowded_.load(std::memory_order_relaxed);
}

void Device::try_progress() {
  const uint64_t now = now_ns();
  last_inline_poll_ns_.store(now, std::memory_order_relaxed);
  // Ranks outnumber cores (more runnable threads than CPUs): a poller that has found nothing
  // for kCrowdedYieldAfterNs offers its core to the threads that have work (often the
  // process its peer runs in), as Open MPI's yield_when_idle does; an application that
  // waits on a completion channel sleeps instead. And same-host senders are asked to ring
  // the doorbell only once this poller's clock is kCrowdedDoorbellNs old: on a full machine
  // a poller's clock goes stale because it is descheduled, not because it stopped, and a
  // doorbell then wakes this process's progress thread — one more thread for the same
  // cores, fighting the poller for the device lock — while the poller reads the ring itself
  // when it runs again. Measured, 4 ranks on 2 cores, 8 B AllReduce: doorbells at 2 µs and
  // yields after 50 µs ≈ 300 µs; both changed ≈ 15–25 µs (docs/performance.md).
  constexpr uint64_t kCrowdedYieldAfterNs = 2'000;
  constexpr uint64_t kCrowdedDoorbellNs = 200'000;
  const bool crowd = crowded(now);
  if (crowd && now - last_rx_ns_.load(std::memory_order_relaxed) > kCrowdedYieldAfterNs)
    sched_yield();
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk) return;
  if (shm_.is_open()) {
    shm_.set_doorbell_threshold(crowd ? kCrowdedDoorbellNs : 0);
    shm_.note_polling(now);
    // note_polling() makes senders skip the doorbell for a while. If the progress thread
    // went to sleep until its next timer (it saw nobody polling), nobody would read the
    // rings when this poller stops within that while: a record written then would wait for
    // the retransmit timer (docs/performance.md, the doorbell). Wake it once, so it watches
    // this poller's window again. Under mu_, as its note_sleeping() is: one of the two sides
    // always sees the other.
    if (thread_asleep_.load(std::memory_order_relaxed) && thread_asleep_.exchange(false)) wake();
  }
  // An empty poll of the rings is a few memory loads; an empty recvmmsg is a system call.
  // While no UDP traffic has been seen for kUdpIdleNs (all peers on the same-host path), the
  // UDP socket is checked at most every kUdpCheckNs, so a busy poll costs no system call
  // (a UDP peer's first packet then waits up to kUdpCheckNs).
  const bool udp_idle = udp_quiet(now);
  const bool check_udp = !udp_idle || now - last_udp_check_ns_ >= kUdpCheckNs;
  if (check_udp) last_udp_check_ns_ = now;
  // ACKs leave before the poll returns: a completion the application sees implies its
  // ACK is on its way, as with a NIC. (Deferring them to the application's next post
  // saved 3.7 µs of ib_send_lat over UDP, but a responder that exits or is killed right
  // after its last completion then never acknowledges it; see docs/performance.md.)
  inline_round_ = true;
  progress_locked(now, check_udp);
  inline_round_ = false;
}

void Device::watch_socket(bool on) {
  if (on == socket_watched_) return;
  epoll_event ev{};
  ev.events = on ? uint32_t{EPOLLIN} : 0u;
  ev.data.fd = port_.fd();
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, port_.fd(), &ev);
  socket_watched_ = on;
}

void Device::progress_thread() {
  // While an application thread busy-polls a CQ it drives progress itself (try_progress);
  // waking this thread for each packet too would only make the two fight over the lock,
  // and on a 2-core machine a preempted lock holder stalls the poller for a whole
  // scheduler slice. So the socket is watched only when nobody has polled for
  // kPollerActiveNs; meanwhile this thread sleeps until the earliest timer or the end of
  // that window, whichever comes first (epoll_pwait2: µs precision), so a process that
  // stops polling — e.g. the target of ib_write_lat, which spins on memory — gets its
  // socket watched again within ~kPollerActiveNs: such a process waits up to that window
  // for each message it receives, so the window is short (50 µs); waking that often while
  // an app polls costs a few percent of a core, as the thread takes no lock then.
  // On a crowded machine (more runnable threads than CPUs) a poller's last poll goes stale
  // because it is descheduled, not because it stopped, so the window is kCrowdedPollerNs:
  // taking the socket back then only adds a thread that competes for the cores and the lock
  // (UDP path, 4 ranks on 2 cores, 8 B AllReduce: see docs/performance.md).
  constexpr uint64_t kPollerActiveNs = 50'000;
  constexpr uint64_t kCrowdedPollerNs = 200'000;
  //
  // Same-host path: nobody polls the rings while this thread sleeps, so before an untimed
  // sleep it tells senders so (note_sleeping: they then ring the doorbell socket, which
  // epoll watches) and looks once more. While rings carry traffic and no application
  // polls, it keeps polling them for spin_ns_ after the last packet instead of sleeping:
  // a sender sees a fresh poll time and rings no doorbell (a system call on its side, a
  // wakeup on ours), and a stream of messages never waits for a wakeup.
  epoll_event events[4];
  uint64_t spin_until = 0;
  // Spin only where it costs nobody a core.
  auto spin_from = [&](uint64_t t) {
    if (spin_ns_) spin_until = crowded(t) ? 0 : t + spin_ns_;
  };
  while (!stop_.load()) {
    const uint64_t now = now_ns();
    const uint64_t last_poll = last_inline_poll_ns_.load(std::memory_order_relaxed);
    const uint64_t poller_window =
        crowded_.load(std::memory_order_relaxed) ? kCrowdedPollerNs : kPollerActiveNs;
    const bool app_polling = now - last_poll < poller_window;
    if (shm_.is_open() && !app_polling && now < spin_until) {
      // Spinning while no application polls; the core is offered to other threads between
      // empty polls (on 2 cores, the applications' own threads).
      std::unique_lock lk(mu_, std::try_to_lock);
      bool got = false;
      if (lk) {
        shm_.note_polling(now);
        got = receive_shm_locked() != 0;
        if (got) spin_from(now);
        if (now - last_udp_check_ns_ >= 20'000 || (next_deadline_ns_ && next_deadline_ns_ <= now)) {
          last_udp_check_ns_ = now;
          progress_locked(now);
        }
      }
      if (!got) sched_yield();
      continue;
    }
    // While the application polls and all traffic is on the same-host path, the socket can
    // be watched at no cost (nothing arrives on it; the first UDP packet wakes this thread,
    // which hands the socket back to the poller) and the window is re-checked only every
    // kShmOnlyWindowNs: a sender that finds the poller gone for doorbell_threshold rings the
    // doorbell. The long window only bounds one case: a record written while the
    // application had just polled, after which it stopped polling for good (it waits up to
    // that long). Periodic wakeups every kPollerActiveNs preempted polling ranks on a full
    // machine (4 ranks on 2 cores: 8 B AllReduce 230 → 190 µs, ib_write_lat 55 → 30 µs).
    constexpr uint64_t kShmOnlyWindowNs = 1'000'000;
    const bool shm_only = app_polling && udp_quiet(now);
    watch_socket(!app_polling || shm_only);
    uint64_t until = sleep_until_ns_.load(std::memory_order_relaxed);
    const uint64_t window = shm_only ? kShmOnlyWindowNs : poller_window;
    if (app_polling && (until == 0 || until > last_poll + window)) until = last_poll + window;
    // A member looks now and then whether its address's owner has exited (try_take_over).
    if (member_ && (until == 0 || until > now + kTakeOverCheckNs)) until = now + kTakeOverCheckNs;
    // Forwards wait in the backlog for a sharing process to read (no event says when).
    if (share_.backlogged() && (until == 0 || until > now + kShareBacklogRetryNs))
      until = now + kShareBacklogRetryNs;
    // Packets of a forwarded datagram that the last round's budget left unread.
    if (share_.rx_pending()) until = now;
    if (shm_.is_open() && !app_polling) {
      std::lock_guard lk(mu_);
      thread_asleep_.store(true, std::memory_order_relaxed);
      shm_.note_sleeping();
      if (receive_shm_locked()) {  // written before the sender could see us asleep
        spin_from(now);
        continue;
      }
    }
    timespec ts{};
    timespec* timeout = nullptr;  // sleep until an event
    if (until) {
      // Deadlines are virtual (clock::now_ns); the kernel waits in real time.
      ts = clock::to_real_timespec(until > now ? until - now : 0);
      timeout = &ts;
    }
    const int n = ::epoll_pwait2(epoll_fd_, events, 4, timeout, nullptr);
    thread_asleep_.store(false, std::memory_order_relaxed);
    bool bell = false, share_bell = false, icmp = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == port_.fd() && (events[i].events & EPOLLERR)) {
        bell = icmp = true;  // ICMP errors wait (UdpPort::enable_error_queue): read them now
      } else if (events[i].data.fd == port_.fd()) {
        // UDP traffic: from now on the poller's window applies (see shm_only above).
        last_udp_traffic_ns_.store(now_ns(), std::memory_order_relaxed);
      } else if (events[i].data.fd == event_fd_) {
        uint64_t v;
        ssize_t r = ::read(event_fd_, &v, sizeof v);
        (void)r;
      } else if (shm_.is_open() && events[i].data.fd == shm_.doorbell_fd()) {
        bell = true;
      } else if (share_.joined() && events[i].data.fd == share_.fd()) {
        bell = share_bell = true;  // the address's owner forwarded packets: serve them now
      } else {
        bell = true;  // a multicast group's socket (engine/multicast.cpp): progress reads it
      }
    }
    if (stop_.load()) break;
    const uint64_t woke = now_ns();
    const uint64_t timer = sleep_until_ns_.load(std::memory_order_relaxed);
    // A doorbell means a sender saw nobody polling: serve it even inside the poller
    // window (ib_write_lat's target polls once, then spins on memory).
    const bool take_over_due = member_ && woke >= next_take_over_ns_;
    if (!bell && !take_over_due &&
        woke - last_inline_poll_ns_.load(std::memory_order_relaxed) < poller_window &&
        (timer == 0 || timer > woke))
      continue;  // the poller is still at it and no timer is due: leave it the lock
    std::lock_guard lk(mu_);
    if (take_over_due) try_take_over(woke);
    if (icmp) read_icmp_errors_locked(woke);
    if (bell && shm_.is_open()) shm_.drain_doorbell();
    if (share_bell) receive_share_locked();  // level-triggered: read it even when unshared
    if (shm_.is_open()) shm_.note_polling(woke);
    last_udp_check_ns_ = woke;
    progress_locked(woke);
    if (shm_.is_open()) spin_from(woke);
    sleep_until_ns_.store(next_deadline_ns_, std::memory_order_relaxed);
  }
}

}  // namespace softrdma::engine
