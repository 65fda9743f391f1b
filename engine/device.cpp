#include "engine/device.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "base/clock.h"
#include "base/params.h"
#include "engine/counter_publisher.h"
#include "engine/cq.h"
#include "engine/log.h"
#include "engine/memory.h"
#include "engine/mw.h"
#include "engine/qp.h"
#include "net/address_share.h"
#include "net/fault_guard.h"
#include "net/peer_liveness.h"
#include "wire/icrc.h"

namespace softrdma::engine {

namespace {

constexpr size_t kTxBatch = 64;
/// A same-host mailbox held by the address's previous owner while it exits is retried every
/// kShmOwnerExitPollMs, at most kShmOwnerExitTries times (200 ms in all).
constexpr int kShmOwnerExitPollMs = 5;
constexpr int kShmOwnerExitTries = 40;
/// UDP 4791 at an address nobody shares may be held a moment longer by a process that is
/// exiting — or by the children a process forked while its device was open, which inherit
/// the socket (pyverbs' rdmacm tests terminate theirs and open the next device at once).
/// The bind is tried again every kPortHolderExitPollMs, for kPortHolderExitTries (1 s).
constexpr int kPortHolderExitPollMs = 10;
constexpr int kPortHolderExitTries = 100;
constexpr size_t kRxBatch = 64;
/// Receive buffer per datagram without GRO: one packet, and larger ones show as truncated.
constexpr size_t kRxBufferBytes = kMaxRocePacketBytes;
/// RoCEv2 headers a packet adds on top of the IB MTU, as rxe budgets them (RXE_MAX_HDR_LENGTH).
constexpr uint32_t kRoceOverhead = 80;

uint32_t interface_mtu(uint32_t ip) {
  uint32_t mtu = 1500;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return mtu;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    auto* sin = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    auto* mask = reinterpret_cast<sockaddr_in*>(i->ifa_netmask);
    uint32_t a = ntohl(sin->sin_addr.s_addr), m = mask ? ntohl(mask->sin_addr.s_addr) : ~0u;
    if ((a & m) != (ip & m)) continue;
    int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      ifreq r{};
      std::strncpy(r.ifr_name, i->ifa_name, IFNAMSIZ - 1);
      if (::ioctl(fd, SIOCGIFMTU, &r) == 0) mtu = static_cast<uint32_t>(r.ifr_mtu);
      ::close(fd);
    }
    break;
  }
  ::freeifaddrs(list);
  return mtu;
}

uint8_t ib_mtu_for(uint32_t netdev_mtu) {
  for (uint8_t e = 5; e >= 1; --e)
    if (mtu_bytes(e) + kRoceOverhead <= netdev_mtu) return e;
  return 1;
}

}  // namespace

bool DeviceConfig::from_environment(DeviceConfig& out, std::string& error) {
  // Each variable, its default and its range live in the registry (base/params.h).
  DeviceConfig c = out;
  std::string transport, cc;
  int64_t spin_us = -1;
  int64_t dm_size = static_cast<int64_t>(c.dm_size);
  // The clock's factor is read once by base/clock; a malformed one refuses the open here
  // with its reason instead of stopping the process at the first clock read.
  double tdf = 1;
  uint64_t tdf_epoch = 0;
  if (!clock::read_environment(tdf, tdf_epoch, error) ||
      !params::read_ipv4(params::kAddr, c.ip, error) ||
      !params::read_text(params::kPcap, c.pcap_path, error) ||
      !params::read_text(params::kTransport, transport, error) ||
      !params::read_integer(params::kSpinUs, spin_us, error) ||
      !params::read_flag(params::kGso, c.udp_offload, error) ||
      !params::read_flag(params::kSelectiveRetx, c.selective_retx, error) ||
      !params::read_flag(params::kFaultGuard, c.fault_guard, error) ||
      !params::read_flag(params::kShmPlace, c.shm_place, error) ||
      !params::read_integer(params::kDmSize, dm_size, error) ||
      !params::read_text(params::kCc, cc, error))
    return false;
  if (cc == "dcqcn")
    c.cc = CongestionControl::kDcqcn;
  else if (cc == "none")
    c.cc = CongestionControl::kNone;
  else if (cc == "auto")
    c.cc = CongestionControl::kAuto;
  if (transport == "auto")
    c.path = PacketPath::kAuto;
  else if (transport == "udp")
    c.path = PacketPath::kUdp;
  else if (transport == "shm")
    c.path = PacketPath::kShm;
  if (spin_us >= 0) c.spin_ns = static_cast<uint64_t>(spin_us) * 1000;
  c.dm_size = static_cast<uint64_t>(dm_size);
  if (const char* w = params::raw(params::kWan)) {
    std::string e;
    if (!net::read_wan_spec(w, c.wan, c.wan_text, e)) {
      error = params::malformed(params::kWan, w) + ": " + e;
      return false;
    }
  }
  if (const char* n = params::raw(params::kNetem)) {
    std::string e;
    if (!net::parse_netem(n, c.netem, e)) {
      error = params::malformed(params::kNetem, n) + ": " + e;
      return false;
    }
  }
  out = c;
  return true;
}

std::unique_ptr<Device> Device::open(const DeviceConfig& cfg, int& err) {
  // Copies into and out of registered memory survive memory unmapped since registration.
  if (cfg.fault_guard) net::install_fault_guard();
  std::unique_ptr<Device> d(new Device());
  err = 0;
  if (cfg.ip) {
    // The share of the address first (net/address_share.h), then UDP 4791: a process that
    // finds the port taken then always finds its owner in the share already.
    if (cfg.share)
      if (int e = d->share_.join(cfg.ip, cfg.shm.dir, cfg.shm.name_prefix); e != 0)
        log().warn("{} cannot be shared with other processes: {}", net::ipv4_to_string(cfg.ip),
                   std::strerror(e));
    err = d->port_.bind(cfg.ip, wire::kRoceV2Port, cfg.socket_buffer_bytes);
    for (int tries = 0; err == EADDRINUSE && !d->share_.shared() && tries < kPortHolderExitTries;
         ++tries) {
      clock::sleep_for(std::chrono::milliseconds(kPortHolderExitPollMs));
      err = d->port_.bind(cfg.ip, wire::kRoceV2Port, cfg.socket_buffer_bytes);
    }
    if (err == EADDRINUSE && d->share_.shared()) {
      // Another process owns the address: this one joins it as a member — the owner
      // forwards the packets for this process's QPNs; this one sends from ip:ephemeral
      // (RoCEv2 receivers key on the destination port only). A UDP 4791 held by something
      // that is not a softrdma device (nobody else in the share) stays EADDRINUSE.
      err = d->port_.bind(cfg.ip, 0, cfg.socket_buffer_bytes);
      d->member_ = err == 0;
    }
  } else {
    // First free loopback address: several processes on one host each get their own.
    // 127.0.0.1 is left to programs that name it ("localhost": rping -a 127.0.0.1, and
    // pyverbs' RDMA-CM tests, whose address is lo's first): an automatic device there made
    // them share the address with an unrelated process, and lose it when that one exited.
    err = EADDRINUSE;
    for (uint32_t x = 2; x < 255 && err == EADDRINUSE; ++x)
      err = d->port_.bind((127u << 24) | x, wire::kRoceV2Port, cfg.socket_buffer_bytes);
  }
  if (err) return nullptr;
  // A dead peer's closed port answers with ICMP: peer_liveness() fails its QPs at once.
  d->port_.enable_error_queue();

  d->path_ = cfg.path;
  d->shm_dir_ = cfg.shm.dir;
  d->shm_prefix_ = cfg.shm.name_prefix;
  d->socket_buffer_bytes_ = cfg.socket_buffer_bytes;
  d->dm_pool_ = std::make_unique<DeviceMemoryPool>(cfg.dm_size);
  d->spin_ns_ = cfg.spin_ns;
  d->selective_retx_ = cfg.selective_retx;
  bool wan_marks = false;
  for (const net::WanTopology::Link& l : cfg.wan.links) wan_marks |= l.params.ecn_bytes != 0;
  d->dcqcn_ =
      cfg.cc == CongestionControl::kDcqcn || (cfg.cc == CongestionControl::kAuto && wan_marks);
  d->ecn_capable_ = wan_marks || d->dcqcn_;
  d->wan_topo_ = cfg.wan;
  if (d->ecn_capable_) {
    // ECT(0) out, and the received TOS (IP_RECVTOS) in: a CE mark draws a CNP.
    if (int e = d->port_.set_ecn_capable(); e != 0)
      log().warn("cannot send ECN-capable packets (IP_TOS): {}", std::strerror(e));
    d->port_.enable_header_info();
    d->tx_tos_ = d->port_.tx_tos();
  }
  if (!d->share_.joined() && cfg.share) {
    // A device on the first free loopback address joins its share now (its slot, normally
    // 0: the processes that come to share the address are told apart by their QPNs).
    if (int e = d->share_.join(d->ip(), cfg.shm.dir, cfg.shm.name_prefix); e != 0)
      log().warn("{} cannot be shared with other processes: {}", net::ipv4_to_string(d->ip()),
                 std::strerror(e));
  }
  if (cfg.path != PacketPath::kUdp && !d->member_) {
    // The UDP bind above made this process the address's owner; the mailbox only joins it.
    // EADDRINUSE here means the previous owner is still exiting: a process that ends
    // without closing its device has its descriptors closed in order, the UDP socket before
    // the mailbox's doorbell. Wait for it (bounded) instead of running UDP-only while peers
    // still write into the dying owner's mailbox — packets lost for up to its liveness
    // check, enough to exhaust a short retry budget (InjectedLoss in parallel ctest runs).
    int e = d->shm_.open(d->ip(), cfg.shm);
    for (int tries = 0; e == EADDRINUSE && tries < kShmOwnerExitTries; ++tries) {
      clock::sleep_for(std::chrono::milliseconds(kShmOwnerExitPollMs));
      e = d->shm_.open(d->ip(), cfg.shm);
    }
    d->place_enabled_ = e == 0 && cfg.shm_place;
    if (e != 0) {
      if (cfg.path == PacketPath::kShm) {
        log().error("SOFTRDMA_TRANSPORT=shm: cannot open the shared-memory mailbox for {}: {}",
                    net::ipv4_to_string(d->ip()), std::strerror(e));
        err = e;
        return nullptr;
      }
      log().warn("same-host shared-memory path off for {}: {} (UDP only)",
                 net::ipv4_to_string(d->ip()), std::strerror(e));
    }
  }
  d->netdev_mtu_ = interface_mtu(d->ip());
  d->active_mtu_ = ib_mtu_for(d->netdev_mtu_);
  if (cfg.netem.enabled()) d->netem_ = std::make_unique<net::Netem>(cfg.netem);
  if (!cfg.wan.links.empty()) {
    if (int e = d->wan_.open(d->ip(), cfg.wan, cfg.wan_text); e != 0) {
      log().error("SOFTRDMA_WAN: cannot map the shared link clocks: {}", std::strerror(e));
      err = e;
      return nullptr;
    }
    log().info("wide-area emulation on: {} link(s)", cfg.wan.links.size());
  }
  if (!cfg.pcap_path.empty()) {
    std::string e;
    d->pcap_ = net::PcapTap::open(cfg.pcap_path, d->ip(), e);
    if (!d->pcap_) {
      log().error("SOFTRDMA_PCAP: {}", e);
      err = EINVAL;
      return nullptr;
    }
    d->port_.enable_header_info();
    d->tx_ttl_ = d->port_.tx_ttl();
    d->tx_tos_ = d->port_.tx_tos();
    log().info("capturing to {}", d->pcap_->path());
  }
  d->publisher_ = std::make_unique<CounterPublisher>(d->ip(), cfg.publish_counters);
  d->counters_ = &d->publisher_->counters();

  // QPNs start at a random point so a restarted process is unlikely to reuse the QPN a
  // stale peer still sends to.
  std::random_device rd;
  d->next_qpn_ = 0x100 + (rd() % (kQpnsPerSlot - 0x100));

  // UDP GSO/GRO: several RoCEv2 packets per system call each way (docs/performance.md).
  if (cfg.udp_offload) {
    d->port_.enable_gso();
    d->port_.enable_gro();
  }
  const size_t rx_bytes = d->port_.gro() ? net::kMaxGsoBytes : kRxBufferBytes;
  d->tx_.resize(kTxBatch);
  d->rx_buffers_.assign(kRxBatch, std::vector<uint8_t>(rx_bytes));
  d->rx_slots_.resize(kRxBatch);
  for (size_t i = 0; i < kRxBatch; ++i) {
    d->rx_slots_[i].data = d->rx_buffers_[i].data();
    d->rx_slots_[i].capacity = rx_bytes;
  }

  d->epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  d->event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (d->epoll_fd_ < 0 || d->event_fd_ < 0) {
    err = errno;
    return nullptr;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = d->port_.fd();
  ::epoll_ctl(d->epoll_fd_, EPOLL_CTL_ADD, d->port_.fd(), &ev);
  ev.data.fd = d->event_fd_;
  ::epoll_ctl(d->epoll_fd_, EPOLL_CTL_ADD, d->event_fd_, &ev);
  if (d->shm_.is_open()) {
    ev.data.fd = d->shm_.doorbell_fd();
    ::epoll_ctl(d->epoll_fd_, EPOLL_CTL_ADD, d->shm_.doorbell_fd(), &ev);
  }
  if (d->share_.joined()) {
    ev.data.fd = d->share_.fd();
    ::epoll_ctl(d->epoll_fd_, EPOLL_CTL_ADD, d->share_.fd(), &ev);
    d->share_.set_epoll(d->epoll_fd_);
    d->share_rx_.resize(kRxBufferBytes);
  }
  if (d->share_.joined()) {
    // The owner names itself in the registry; a member connects its slot socket to the
    // owner's, past the unix datagram queue limit (net/address_share.h).
    if (d->member_)
      d->share_.follow_owner();
    else
      d->share_.become_owner();
  }
  if (d->member_)
    log().info(
        "device srdma0 shares {} with the process that owns it (slot {}, sending from "
        "UDP port {})",
        net::ipv4_to_string(d->ip()), d->share_.slot(), d->port_.port());
  else
    log().info(
        "device srdma0 bound to {}:{} (netdev MTU {}, active MTU {}, UDP GSO {}, GRO {}, "
        "same-host shared memory {})",
        net::ipv4_to_string(d->ip()), wire::kRoceV2Port, d->netdev_mtu_, mtu_bytes(d->active_mtu_),
        d->port_.gso() ? "on" : "off", d->port_.gro() ? "on" : "off",
        d->shm_.is_open() ? (cfg.path == PacketPath::kShm ? "only" : "auto") : "off");
  d->thread_ = std::thread([dev = d.get()] {
    // Named so that top -H, perf sched and gdb tell it from the application's threads.
    ::pthread_setname_np(::pthread_self(), "srdma-progress");
    dev->progress_thread();
  });
  return d;
}

Device::~Device() {
  drain_wan();
  stop_ = true;
  wake();
  if (thread_.joinable()) thread_.join();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (event_fd_ >= 0) ::close(event_fd_);
}

// The typical packet held here at close is the last ACK of a conversation: the peer's final
// SEND or WRITE arrived, the application saw it and closed. Dropping it (as a link that went
// down) left the peer retransmitting into a closed port: IBV_WC_RETRY_EXC_ERR (ICMP port
// unreachable) for a message that had arrived, in every run of a 2-rank AllReduce through
// `--wan delay=5ms`.
void Device::drain_wan() {
  const uint64_t deadline = now_ns() + kWanDrainMaxNs;
  for (;;) {
    uint64_t now = now_ns(), due;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!wan_.is_open()) return;
      release_wan(now);
      due = wan_.next_due_ns();
    }
    if (due == UINT64_MAX || now >= deadline) return;
    const uint64_t until = std::min(due, deadline);
    if (until > now) clock::sleep_until_ns(until);  // a virtual deadline
  }
}

void Device::try_take_over(uint64_t now) {
  if (!member_ || now < next_take_over_ns_) return;
  next_take_over_ns_ = now + kTakeOverCheckNs;
  const int old_fd = port_.fd();
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, old_fd, nullptr);
  if (port_.rebind(ip(), wire::kRoceV2Port, socket_buffer_bytes_) != 0) {  // still owned
    epoll_event ev{};
    ev.events = socket_watched_ ? uint32_t{EPOLLIN} : 0u;
    ev.data.fd = old_fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, old_fd, &ev);
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = port_.fd();
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, port_.fd(), &ev);
  socket_watched_ = true;
  member_ = false;
  share_.become_owner();
  log().info(
      "device srdma0 took over {}:{} from its exited owner (slot {}; same-host shared "
      "memory off)",
      net::ipv4_to_string(ip()), wire::kRoceV2Port, share_.slot());
}

uint64_t Device::now_ns() {
  return clock::now_ns();
}

uint32_t Device::peer_pid(uint32_t ip, uint32_t qpn) {
  return net::share_slot_pid(ip, qpn / kQpnsPerSlot, shm_dir_, shm_prefix_);
}

void Device::read_icmp_errors_locked(uint64_t now) {
  unreachable_rx_.clear();
  port_.read_unreachable(unreachable_rx_);
  for (uint32_t ip : unreachable_rx_) {
    if (unreachable_.size() > 1024) unreachable_.clear();  // bounded
    unreachable_[ip] = now;
    bump(counters_->icmp_unreachable_rcvd);
    log().debug("ICMP destination unreachable from {}:{}", net::ipv4_to_string(ip),
                wire::kRoceV2Port);
  }
}

PeerLiveness Device::peer_liveness(const QueuePair& qp, std::string* who) {
  // The pid found at RTR: the slot may hold another process by now (a restarted peer).
  const uint32_t pid = qp.peer_pid ? qp.peer_pid : peer_pid(qp.remote_ip, qp.attr.dest_qp_num);
  const uint64_t now = now_ns();
  if (pid == 0) {
    // Not a softrdma device of this host: only the network can tell. An ICMP "destination
    // unreachable" for the address, recently, says nothing holds its UDP port 4791 (the
    // process died, or never was): the peer is gone. Otherwise retries count as IBTA says.
    auto it = unreachable_.find(qp.remote_ip);
    if (it == unreachable_.end() || now - it->second > kUnreachableFreshNs)
      return PeerLiveness::kUnknown;
    if (who)
      *who = fmt::format("{} qpn {:#x} (ICMP destination unreachable)",
                         net::ipv4_to_string(qp.remote_ip), qp.attr.dest_qp_num);
    return PeerLiveness::kDead;
  }
  if (pid == static_cast<uint32_t>(::getpid())) return PeerLiveness::kUnknown;  // ourselves
  const net::ProcessSample s = net::sample_process(pid);
  PeerLiveness v = PeerLiveness::kRunning;
  if (s.state == net::ProcessState::kGone) {
    v = PeerLiveness::kDead;
  } else if (s.state == net::ProcessState::kStopped) {
    v = PeerLiveness::kStalled;
  } else if (s.state == net::ProcessState::kRunnable) {
    // Runnable, and not one CPU tick since the last look at least kStarvedLookNs ago: it
    // waits for a CPU (a loaded machine), as a stopped one would.
    auto [it, fresh] = peer_cpu_.try_emplace(pid, PeerCpu{s.cpu_ticks, now, false});
    PeerCpu& c = it->second;
    if (!fresh && now - c.at_ns >= kStarvedLookNs) {
      c.starved = s.cpu_ticks == c.ticks;
      c.ticks = s.cpu_ticks;
      c.at_ns = now;
    }
    if (c.starved) v = PeerLiveness::kStalled;
  }
  if (peer_cpu_.size() > 256) peer_cpu_.clear();  // bounded: peers come and go
  if (who)
    *who = fmt::format("{} qpn {:#x} (pid {}, {})", net::ipv4_to_string(qp.remote_ip),
                       qp.attr.dest_qp_num, pid,
                       v == PeerLiveness::kStalled && s.state == net::ProcessState::kRunnable
                           ? "runnable, no CPU"
                           : net::to_string(s.state));
  return v;
}

void Device::wake() {
  uint64_t one = 1;
  ssize_t r = ::write(event_fd_, &one, sizeof one);
  (void)r;
}

void Device::timer_armed(QueuePair& qp, uint64_t deadline_ns) {
  // An entry at or before this deadline is queued already: its round looks at the QP's
  // timers then and re-queues the QP for whatever is still armed.
  if (qp.timer_queued_ns && qp.timer_queued_ns <= deadline_ns) return;
  qp.timer_queued_ns = deadline_ns;
  timers_.push({deadline_ns, qp.qpn()});
  if (!next_deadline_ns_ || deadline_ns < next_deadline_ns_) next_deadline_ns_ = deadline_ns;
  const uint64_t s = sleep_until_ns_.load(std::memory_order_relaxed);
  if (s == 0 || deadline_ns < s) wake();
}

bool Device::reserve(ObjectKind kind) {
  static constexpr uint32_t kLimit[] = {
      DeviceLimits::kMaxPd,  DeviceLimits::kMaxCq, DeviceLimits::kMaxQp, DeviceLimits::kMaxMr,
      DeviceLimits::kMaxSrq, DeviceLimits::kMaxAh, DeviceLimits::kMaxMw};
  static_assert(std::size(kLimit) == static_cast<size_t>(ObjectKind::kCount));
  std::atomic<uint32_t>& n = objects_[static_cast<size_t>(kind)];
  uint32_t cur = n.load(std::memory_order_relaxed);
  do {
    if (cur >= kLimit[static_cast<size_t>(kind)]) return false;
  } while (!n.compare_exchange_weak(cur, cur + 1, std::memory_order_relaxed));
  return true;
}

void Device::release(ObjectKind kind) {
  objects_[static_cast<size_t>(kind)].fetch_sub(1, std::memory_order_relaxed);
}

uint32_t Device::register_qp(QueuePair* qp) {
  // The slot's range: the owner of a shared address routes packets by the QPN's top bits.
  const uint32_t base = share_slot() * kQpnsPerSlot;
  uint32_t qpn;
  do {
    qpn = base | next_qpn_;
    next_qpn_ = (next_qpn_ + 1) % kQpnsPerSlot;
    if (next_qpn_ < 0x100) next_qpn_ = 0x100;               // QPN 0 and 1 are special (SMI/GSI)
  } while (qps_.count(qpn) || qpn == wire::kMulticastQpn);  // 0xFFFFFF: multicast (slot 15)
  qps_[qpn] = qp;
  return qpn;
}

bool Device::register_qp_at(QueuePair* qp, uint32_t qpn) {
  return qps_.emplace(qpn & wire::kQpnMask, qp).second;
}

void Device::unregister_qp(uint32_t qpn) {
  qps_.erase(qpn);
  detach_all_mcast_locked(qpn);
}

uint32_t Device::register_srq(SharedReceiveQueue* srq) {
  uint32_t srqn;
  do {
    srqn = next_srqn_;
    next_srqn_ = (next_srqn_ + 1) & wire::kQpnMask;
    if (next_srqn_ == 0) next_srqn_ = 1;
  } while (srqs_.count(srqn));
  srqs_[srqn] = srq;
  return srqn;
}

void Device::unregister_srq(uint32_t srqn) {
  srqs_.erase(srqn);
}

SharedReceiveQueue* Device::find_srq(uint32_t srqn) {
  auto it = srqs_.find(srqn);
  return it == srqs_.end() ? nullptr : it->second;
}

uint32_t Device::allocate_key_index() {
  uint32_t index;
  do {
    index = next_mr_index_++;
    if (next_mr_index_ >= (1u << 24)) next_mr_index_ = 1;
  } while (keys_.count(index));
  return index;
}

// key = index << 8 | 8 random bits, so a stale key is unlikely to match a new MR or MW.
namespace {
uint32_t random_key_byte() {
  static thread_local std::minstd_rand rng{std::random_device{}()};
  return rng() & 0xff;
}
}  // namespace

uint32_t Device::register_mr(MemoryRegion* mr) {
  const uint32_t index = allocate_key_index();
  keys_[index].mr = mr;
  return (index << 8) | random_key_byte();
}

void Device::unregister_mr(uint32_t key) {
  keys_.erase(key >> 8);
}

void Device::publish_mr(const MemoryRegion& mr, bool gone) {
  if (!place_enabled_) return;
  net::PlacementTable& t = shm_.placement();
  if (!gone && (mr.access() & kRemoteWrite) && mr.host() &&
      !MemoryRegion::is_implicit_odp(mr.host(), mr.length(), mr.access())) {
    if (!t.publish(net::PlaceKind::kRegion, mr.key(),
                   {mr.iova(), mr.length(), reinterpret_cast<uintptr_t>(mr.host()), mr.pd().id()}))
      log().debug("MR {:#x}: placement table full, WRITEs to it take the ring", mr.key());
    return;
  }
  if (const uint32_t pins = t.withdraw(net::PlaceKind::kRegion, mr.key()); pins != 0)
    log().error(
        "MR {:#x}: {} same-host writer(s) still pinned it after {} s (a peer that died "
        "mid-write?); deregistered anyway",
        mr.key(), pins, net::PlacementTable::kWithdrawWaitNs / 1'000'000'000);
}

void Device::drain_inbound() {
  // Only where something may have been placed: peers write this device's memory only while
  // it publishes (place_enabled_).
  if (!place_enabled_) return;
  for (int round = 0; round < 16 && receive_shm_locked() == kRxBudget; ++round) {
  }
}

void Device::publish_qp(const QueuePair& qp, bool gone) {
  if (!place_enabled_ || qp.qpn() == 0) return;
  const QpState st = qp.attr.state;
  const bool takes = st == QpState::kRtr || st == QpState::kRts || st == QpState::kSqd;
  net::PlacementTable& t = shm_.placement();
  if (!gone && takes && qp.type_info().service == wire::Service::kRc && qp.pd_ptr() &&
      (qp.attr.access_flags & kRemoteWrite)) {
    t.publish(net::PlaceKind::kQp, qp.qpn(), {0, 0, 0, qp.pd_ptr()->id()});
    return;
  }
  t.withdraw(net::PlaceKind::kQp, qp.qpn());
}

uint32_t Device::register_mw(MemoryWindow* mw) {
  const uint32_t index = allocate_key_index();
  keys_[index].mw = mw;
  return (index << 8) | random_key_byte();
}

void Device::unregister_mw(uint32_t rkey) {
  keys_.erase(rkey >> 8);
}

MemoryRegion* Device::find_mr(uint32_t key) {
  auto it = keys_.find(key >> 8);
  if (it == keys_.end() || !it->second.mr || it->second.mr->key() != key) return nullptr;
  return it->second.mr;
}

MemoryWindow* Device::find_mw(uint32_t rkey) {
  auto it = keys_.find(rkey >> 8);
  if (it == keys_.end() || !it->second.mw || it->second.mw->rkey() != rkey) return nullptr;
  return it->second.mw;
}

bool Device::host_local_path(uint32_t dst_ip, uint32_t peer_pid) const {
  return peer_pid != 0 && wan_topo_.link_for(ip(), dst_ip) == nullptr;
}

bool Device::congestion_control(uint32_t dst_ip, DcqcnParams& out) const {
  if (!dcqcn_) return false;
  out = DcqcnParams{};
  // The emulated link stands for this sender's path to the peer: its rate is the line rate
  // DCQCN starts from and recovers to (a NIC starts at its port's speed). Without one, the
  // QP is unpaced until its first CNP.
  if (const net::WanTopology::Link* l = wan_topo_.link_for(ip(), dst_ip))
    out.line_rate = double(l->params.rate_bps) / 8 / 1e9;
  return true;
}

}  // namespace softrdma::engine
