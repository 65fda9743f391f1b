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

#include "base/params.h"
#include "engine/counter_publisher.h"
#include "engine/cq.h"
#include "engine/log.h"
#include "engine/memory.h"
#include "engine/qp.h"
#include "wire/icrc.h"

namespace softrdma::engine {

namespace {

constexpr size_t kTxBatch = 64;
constexpr size_t kRxBatch = 64;
/// Largest RoCEv2 UDP payload accepted (4096 B MTU + 40 B of headers + pad + ICRC, with
/// room to spare); anything larger is dropped as malformed.
constexpr size_t kMaxRocePacketBytes = 4096 + 256;
/// Receive buffer per datagram without GRO: one packet, and larger ones show as truncated.
constexpr size_t kRxBufferBytes = kMaxRocePacketBytes;
/// Packets processed per progress round before timers and other work get a turn.
constexpr size_t kRxBudget = 1024;
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

uint8_t ib_mtu_for(uint32_t netdev_mtu) {
  for (uint8_t e = 5; e >= 1; --e)
    if (mtu_bytes(e) + kRoceOverhead <= netdev_mtu) return e;
  return 1;
}

}  // namespace

bool DeviceConfig::from_environment(DeviceConfig& out, std::string& error) {
  // Each variable, its default and its range live in the registry (base/params.h).
  DeviceConfig c = out;
  std::string transport;
  int64_t spin_us = -1;
  if (!params::read_ipv4(params::kAddr, c.ip, error) ||
      !params::read_text(params::kPcap, c.pcap_path, error) ||
      !params::read_text(params::kTransport, transport, error) ||
      !params::read_integer(params::kSpinUs, spin_us, error) ||
      !params::read_flag(params::kGso, c.udp_offload, error))
    return false;
  if (transport == "auto")
    c.path = PacketPath::kAuto;
  else if (transport == "udp")
    c.path = PacketPath::kUdp;
  else if (transport == "shm")
    c.path = PacketPath::kShm;
  if (spin_us >= 0) c.spin_ns = static_cast<uint64_t>(spin_us) * 1000;
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
  std::unique_ptr<Device> d(new Device());
  err = 0;
  if (cfg.ip) {
    err = d->port_.bind(cfg.ip, wire::kRoceV2Port, cfg.socket_buffer_bytes);
  } else {
    // First free loopback address: several processes on one host each get their own.
    err = EADDRINUSE;
    for (uint32_t x = 1; x < 255 && err == EADDRINUSE; ++x)
      err = d->port_.bind((127u << 24) | x, wire::kRoceV2Port, cfg.socket_buffer_bytes);
  }
  if (err) return nullptr;

  d->path_ = cfg.path;
  d->spin_ns_ = cfg.spin_ns;
  if (cfg.path != PacketPath::kUdp) {
    // The UDP bind above made this process the address's owner; the mailbox only joins it.
    if (int e = d->shm_.open(d->ip(), cfg.shm); e != 0) {
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
  d->next_qpn_ = 0x100 + (rd() % 0x100000);

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
  log().info(
      "device srdma0 bound to {}:{} (netdev MTU {}, active MTU {}, UDP GSO {}, GRO {}, "
      "same-host shared memory {})",
      net::ipv4_to_string(d->ip()), wire::kRoceV2Port, d->netdev_mtu_, mtu_bytes(d->active_mtu_),
      d->port_.gso() ? "on" : "off", d->port_.gro() ? "on" : "off",
      d->shm_.is_open() ? (cfg.path == PacketPath::kShm ? "only" : "auto") : "off");
  d->thread_ = std::thread([dev = d.get()] { dev->progress_thread(); });
  return d;
}

Device::~Device() {
  stop_ = true;
  wake();
  if (thread_.joinable()) thread_.join();
  if (epoll_fd_ >= 0) ::close(epoll_fd_);
  if (event_fd_ >= 0) ::close(event_fd_);
}

uint64_t Device::now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
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
  static constexpr uint32_t kLimit[] = {DeviceLimits::kMaxPd, DeviceLimits::kMaxCq,
                                        DeviceLimits::kMaxQp, DeviceLimits::kMaxMr};
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
  uint32_t qpn;
  do {
    qpn = next_qpn_;
    next_qpn_ = (next_qpn_ + 1) & wire::kQpnMask;
    if (next_qpn_ < 0x100) next_qpn_ = 0x100;  // QPN 0 and 1 are special (SMI/GSI)
  } while (qps_.count(qpn));
  qps_[qpn] = qp;
  return qpn;
}

void Device::unregister_qp(uint32_t qpn) {
  qps_.erase(qpn);
}

uint32_t Device::register_mr(MemoryRegion* mr) {
  // key = index << 8 | 8 random bits, so a stale key is unlikely to match a new MR.
  static thread_local std::minstd_rand rng{std::random_device{}()};
  uint32_t key;
  do {
    key = (next_mr_index_++ << 8) | (rng() & 0xff);
    if (next_mr_index_ >= (1u << 24)) next_mr_index_ = 1;
  } while (mrs_.count(key));
  mrs_[key] = mr;
  return key;
}

void Device::unregister_mr(uint32_t key) {
  mrs_.erase(key);
}

MemoryRegion* Device::find_mr(uint32_t key) {
  auto it = mrs_.find(key);
  return it == mrs_.end() ? nullptr : it->second;
}

void Device::transmit(wire::Headers h, uint32_t dst_ip, std::span<const iovec> payload,
                      uint32_t payload_len) {
  if (netem_ && netem_->drop()) {
    bump(counters_->emulated_drops);
    return;
  }
  if (tx_count_ == tx_.size()) send_queued();
  TxSlot& s = tx_[tx_count_];
  const uint8_t pad = wire::pad_for(payload_len);
  h.bth.pad_count = pad;
  const size_t hlen = wire::encode_headers(h, s.hdr);
  if (hlen == 0) return;  // unknown opcode: a bug in the caller, never sent
  const size_t udp_len = hlen + payload_len + pad + wire::kIcrcBytes;

  // The ICRC is computed in send_queued(), once the path is known: the same-host path
  // carries none (see compute_icrc()).
  std::memset(s.trailer, 0, sizeof s.trailer);
  s.icrc_done = false;
  s.pad = pad;
  s.iov.clear();
  s.iov.push_back({s.hdr, hlen});
  for (const iovec& v : payload)
    if (v.iov_len) s.iov.push_back(v);
  s.iov.push_back({s.trailer, size_t{pad} + wire::kIcrcBytes});
  s.dst_ip = dst_ip;
  s.udp_len = static_cast<uint32_t>(udp_len);
  ++tx_count_;
  bump(counters_->sent_pkts);
  bump(counters_->sent_bytes, udp_len);
}

void Device::compute_icrc(TxSlot& s) {
  if (s.icrc_done) return;
  // The ICRC for IPv4 id 0, what the kernel sends from this unconnected DF socket; a
  // packet that leaves as segment k of a GSO batch gets its ICRC moved to id k.
  wire::Ipv4UdpTuple tuple;
  tuple.src_ip = ip();
  tuple.dst_ip = s.dst_ip;
  tuple.src_port = wire::kRoceV2Port;
  tuple.dst_port = wire::kRoceV2Port;
  const iovec& h = s.iov.front();
  const auto* hdr = static_cast<const uint8_t*>(h.iov_base);
  wire::IcrcAccumulator crc(tuple, s.udp_len, std::span<const uint8_t>(hdr, wire::kBthBytes));
  crc.update(std::span<const uint8_t>(hdr + wire::kBthBytes, h.iov_len - wire::kBthBytes));
  for (size_t i = 1; i + 1 < s.iov.size(); ++i)
    crc.update(
        std::span<const uint8_t>(static_cast<const uint8_t*>(s.iov[i].iov_base), s.iov[i].iov_len));
  if (s.pad) crc.update(std::span<const uint8_t>(s.trailer, s.pad));
  s.icrc = crc.finish();
  s.icrc_done = true;
}

void Device::flush() {
  // Coalesced ACKs go last: whatever else is queued (READ responses, requests the
  // completer released) reaches the peer first, in the same system call.
  for (uint32_t qpn : ack_dirty_) {
    auto it = qps_.find(qpn);
    if (it != qps_.end()) responder::flush_ack(*it->second, *this);
  }
  ack_dirty_.clear();
  send_queued();
  // The ACKs are out: the completions of the messages they acknowledge may be seen now.
  for (const HeldCompletion& h : held_completions_) h.cq->push(h.cqe, h.solicited);
  held_completions_.clear();
}

void Device::deliver_recv_completion(CompletionQueue& cq, const Cqe& cqe, bool solicited) {
  if (holding_completions_)
    held_completions_.push_back({&cq, cqe, solicited});
  else
    cq.push(cqe, solicited);
}

void Device::send_queued() {
  if (tx_count_ == 0) {
    if (pcap_dirty_) {
      pcap_->flush();
      pcap_dirty_ = false;
    }
    return;
  }
  // Peers on this host with a mailbox get their packets through shared memory; the rest
  // (and everything under SOFTRDMA_TRANSPORT=udp) by UDP.
  udp_slots_.clear();
  bool shm_sent = false;
  for (size_t k = 0; k < tx_count_; ++k) {
    TxSlot& s = tx_[k];
    if (!shm_.is_open()) {
      udp_slots_.push_back(k);
      continue;
    }
    // No ICRC on the same-host path: shared memory has no bit errors, and a peer that could
    // forge a record could compute an ICRC as well; the engine's other checks all apply. It
    // is computed only for the capture file, which must decode as on the wire.
    if (pcap_) compute_icrc(s);
    const uint32_t icrc = pcap_ ? s.icrc : 0;
    for (int b = 0; b < 4; ++b) s.trailer[s.pad + b] = static_cast<uint8_t>(icrc >> (8 * b));
    const net::ShmSendResult r = shm_.send(s.dst_ip, s.iov.data(), s.iov.size());
    if (r == net::ShmSendResult::kNoPeer && path_ != PacketPath::kShm) {
      udp_slots_.push_back(k);
      continue;
    }
    if (r == net::ShmSendResult::kSent) {
      shm_sent = true;
      bump(counters_->sent_shm_pkts);
      if (pcap_) {
        // As if it had crossed the wire unsegmented: id 0, DF, the socket's TTL and TOS.
        pcap_->record(
            {ip(), s.dst_ip, wire::kRoceV2Port, wire::kRoceV2Port, 0, true, tx_ttl_, tx_tos_},
            s.iov);
        pcap_dirty_ = true;
      }
    } else {
      // A full ring, or (SOFTRDMA_TRANSPORT=shm) no mailbox: lost, as a full socket buffer
      // loses a datagram; RC retransmission recovers it or errors the QP.
      bump(counters_->shm_drops);
    }
  }
  if (shm_sent || !udp_slots_.empty()) {
    const uint64_t now = now_ns();
    if (shm_sent) shm_.ring_doorbells(now);
    if (!udp_slots_.empty()) last_udp_traffic_ns_.store(now, std::memory_order_relaxed);
  }
  tx_iov_.clear();
  tx_batch_.clear();
  std::vector<std::pair<size_t, size_t>>& ranges = tx_ranges_;  // (first iov, count)
  ranges.clear();
  const size_t nudp = udp_slots_.size();
  for (size_t i = 0; i < nudp;) {
    // A GSO run: consecutive packets to one peer, all of the first one's size except a
    // shorter last one (UDP_SEGMENT cuts at a fixed size), within the kernel's limits.
    const TxSlot& head = tx_[udp_slots_[i]];
    const uint32_t seg = head.udp_len;
    size_t j = i + 1, total = seg;
    if (port_.gso()) {
      while (j < nudp && j - i < net::kMaxGsoSegments && tx_[udp_slots_[j]].dst_ip == head.dst_ip &&
             tx_[udp_slots_[j - 1]].udp_len == seg && tx_[udp_slots_[j]].udp_len <= seg &&
             total + tx_[udp_slots_[j]].udp_len <= net::kMaxGsoBytes) {
        total += tx_[udp_slots_[j]].udp_len;
        ++j;
      }
    }
    const size_t first_iov = tx_iov_.size();
    for (size_t k = i; k < j; ++k) {
      TxSlot& s = tx_[udp_slots_[k]];
      compute_icrc(s);
      const uint16_t id = static_cast<uint16_t>(k - i);
      const uint32_t icrc = id ? wire::icrc_with_ip_id(s.icrc, 0, id, s.udp_len) : s.icrc;
      for (int b = 0; b < 4; ++b) s.trailer[s.pad + b] = static_cast<uint8_t>(icrc >> (8 * b));
      if (pcap_) {
        // What crosses the wire: id 0 from this unconnected DF socket, k for GSO segment
        // k; DF, the socket's TTL and TOS.
        pcap_->record(
            {ip(), s.dst_ip, wire::kRoceV2Port, wire::kRoceV2Port, id, true, tx_ttl_, tx_tos_},
            s.iov);
        pcap_dirty_ = true;
      }
      tx_iov_.insert(tx_iov_.end(), s.iov.begin(), s.iov.end());
    }
    ranges.emplace_back(first_iov, tx_iov_.size() - first_iov);
    tx_batch_.push_back(
        {nullptr, 0, head.dst_ip, wire::kRoceV2Port, static_cast<uint16_t>(j - i > 1 ? seg : 0)});
    if (j - i > 1) bump(counters_->sent_gso_batches);
    i = j;
  }
  for (size_t b = 0; b < tx_batch_.size(); ++b) {
    tx_batch_[b].iov = tx_iov_.data() + ranges[b].first;
    tx_batch_[b].iov_count = ranges[b].second;
  }
  if (pcap_dirty_) {
    pcap_->flush();
    pcap_dirty_ = false;
  }
  if (!tx_batch_.empty()) {
    size_t errors = 0;
    port_.send_batch(tx_batch_, errors);
    if (errors) bump(counters_->send_err, errors);
  }
  tx_count_ = 0;
}

void Device::handle_datagram(const net::RxDatagram& d) {
  if (d.segment_size == 0) return handle_packet(d, d.data, d.length, 0, false);
  // UDP GRO: back-to-back packets of segment_size bytes, the last possibly shorter. A
  // softrdma sender's GSO batch arrives whole on loopback, so segment k carries IPv4 id k:
  // check that first (exact), else icrc_verify solves for the id.
  bump(counters_->rcvd_gro_batches);
  uint16_t k = 0;
  for (size_t off = 0; off < d.length; off += d.segment_size, ++k)
    handle_packet(d, d.data + off, std::min<size_t>(d.segment_size, d.length - off), k, false);
}

// ---- receive path: named checks (rxe's hdr_check → check_type_state / check_addr / keys) --

namespace {

/// The counter an outcome of the receive checks bumps (nullptr: not counted).
constexpr std::atomic<uint64_t> Counters::*kRxCheckCounter[] = {
    nullptr,                      // kAccept (counted as rcvd_pkts once delivered)
    &Counters::rcvd_malformed,    // kMalformed
    &Counters::rcvd_icrc_err,     // kIcrcMismatch
    nullptr,                      // kCongestionNotification
    &Counters::rcvd_malformed,    // kBadPkey
    &Counters::rcvd_unknown_qpn,  // kUnknownQpn
    &Counters::rcvd_bad_state,    // kBadState
    &Counters::rcvd_addr_err,     // kWrongSource
};
static_assert(std::size(kRxCheckCounter) == size_t(RxCheck::kWrongSource) + 1);

}  // namespace

const char* to_string(RxCheck c) {
  static constexpr const char* kNames[] = {
      "accepted",  "malformed",   "ICRC mismatch",       "congestion notification",
      "bad P_Key", "unknown QPN", "QP state refuses it", "not from the QP's peer"};
  static_assert(std::size(kNames) == size_t(RxCheck::kWrongSource) + 1);
  return kNames[static_cast<size_t>(c)];
}

RxCheck Device::check_parse(const net::RxDatagram& d, std::span<const uint8_t> bytes,
                            wire::Packet& pkt) {
  const bool too_long = d.truncated || bytes.size() > kMaxRocePacketBytes;
  wire::ParseError perr = wire::ParseError::kTruncated;
  if (!too_long && bytes.size() >= wire::kBthBytes + wire::kIcrcBytes)
    perr = wire::parse(bytes, pkt);
  if (perr == wire::ParseError::kOk) return RxCheck::kAccept;
  log().debug("drop from {}: {}", net::ipv4_to_string(d.src_ip),
              too_long ? "larger than any RoCEv2 packet" : wire::to_string(perr));
  return RxCheck::kMalformed;
}

wire::Ipv4UdpTuple Device::rx_tuple(const net::RxDatagram& d, uint16_t ip_id_hint) const {
  wire::Ipv4UdpTuple tuple;
  tuple.src_ip = d.src_ip;
  tuple.dst_ip = ip();
  tuple.src_port = d.src_port;
  tuple.dst_port = wire::kRoceV2Port;
  tuple.ip_id = ip_id_hint;
  return tuple;
}

RxCheck Device::check_icrc(const net::RxDatagram& d, std::span<const uint8_t> bytes,
                           uint16_t ip_id_hint, bool from_shm, const wire::Packet& pkt,
                           wire::IcrcVerdict& v) {
  if (from_shm) {
    v.ok = v.exact = true;  // records carry no ICRC (see send_queued())
    return RxCheck::kAccept;
  }
  v = wire::icrc_verify(rx_tuple(d, ip_id_hint), bytes);
  if (!v.ok) {
    log().debug("drop from {}: ICRC mismatch (opcode {:#x} psn {})", net::ipv4_to_string(d.src_ip),
                pkt.hdr.bth.opcode, pkt.hdr.bth.psn);
    return RxCheck::kIcrcMismatch;
  }
  // Ids of our own GSO segments are expected (hint), not "recovered".
  if (!v.exact && v.ip_id != ip_id_hint) bump(counters_->rcvd_icrc_id_recovered);
  return RxCheck::kAccept;
}

void Device::capture_received(const net::RxDatagram& d, const uint8_t* data, size_t length,
                              uint16_t ip_id_hint, bool from_shm, const wire::IcrcVerdict& v) {
  // The IPv4 id and DF a UDP socket never sees come from the ICRC (see wire/icrc.h); TTL
  // and TOS from IP_RECVTTL / IP_RECVTOS. A same-host record gets the ICRC it would have
  // carried on the wire.
  if (from_shm && length >= wire::kBthBytes + wire::kIcrcBytes) {
    shm_capture_.assign(data, data + length);
    const uint32_t icrc =
        wire::icrc_compute(rx_tuple(d, ip_id_hint),
                           std::span<const uint8_t>(shm_capture_).first(length - wire::kIcrcBytes));
    for (int b = 0; b < 4; ++b)
      shm_capture_[length - wire::kIcrcBytes + b] = static_cast<uint8_t>(icrc >> (8 * b));
    data = shm_capture_.data();
  }
  const iovec whole{const_cast<uint8_t*>(data), length};
  pcap_->record({d.src_ip, ip(), d.src_port, wire::kRoceV2Port, v.ok ? v.ip_id : uint16_t{0},
                 v.ok ? v.dont_fragment : true, d.ttl, d.tos},
                std::span<const iovec>(&whole, 1));
  pcap_dirty_ = true;
}

RxCheck Device::check_header(const wire::Packet& pkt) const {
  if (pkt.info->mask & wire::kIsCnp)
    return RxCheck::kCongestionNotification;  // no rate control yet
  if ((pkt.hdr.bth.pkey & 0x7fff) != (wire::kDefaultPkey & 0x7fff)) return RxCheck::kBadPkey;
  return RxCheck::kAccept;
}

RxCheck Device::check_qp_state(const wire::Packet& pkt, QueuePair*& qp) const {
  auto it = qps_.find(pkt.hdr.bth.dest_qpn);
  if (it == qps_.end()) return RxCheck::kUnknownQpn;
  qp = it->second;
  const bool request = pkt.info->mask & wire::kIsRequest;
  if (request ? !qp->accepts_requests() : !qp->accepts_responses()) return RxCheck::kBadState;
  return RxCheck::kAccept;
}

RxCheck Device::check_addr(const QueuePair& qp, const net::RxDatagram& d) const {
  return d.src_ip == qp.remote_ip ? RxCheck::kAccept : RxCheck::kWrongSource;
}

void Device::handle_packet(const net::RxDatagram& d, const uint8_t* data, size_t length,
                           uint16_t ip_id_hint, bool from_shm) {
  const std::span<const uint8_t> bytes(data, length);
  wire::Packet pkt;
  wire::IcrcVerdict icrc;
  RxCheck check = check_parse(d, bytes, pkt);
  if (check == RxCheck::kAccept) check = check_icrc(d, bytes, ip_id_hint, from_shm, pkt, icrc);
  // Every packet is captured, the ones dropped below too.
  if (pcap_) capture_received(d, data, length, ip_id_hint, from_shm, icrc);
  QueuePair* qp = nullptr;
  if (check == RxCheck::kAccept) check = check_header(pkt);
  if (check == RxCheck::kAccept) check = check_qp_state(pkt, qp);
  if (check == RxCheck::kAccept) check = check_addr(*qp, d);
  if (check != RxCheck::kAccept) {
    if (auto counter = kRxCheckCounter[static_cast<size_t>(check)]) bump((*counters_).*counter);
    // check_parse and check_icrc log their own details.
    if (check > RxCheck::kIcrcMismatch && log().should_log(spdlog::level::debug))
      log().debug("drop from {}: {} (opcode {:#x} qpn {:#x} psn {:#x})",
                  net::ipv4_to_string(d.src_ip), to_string(check), pkt.hdr.bth.opcode,
                  pkt.hdr.bth.dest_qpn, pkt.hdr.bth.psn);
    return;
  }
  bump(counters_->rcvd_pkts);
  bump(counters_->rcvd_bytes, length);
  if (pkt.info->mask & wire::kIsRequest) {
    holding_completions_ = true;
    responder::on_request(*qp, pkt, *this);
    holding_completions_ = false;
    if (qp->resp.ack_pending) ack_dirty_.push_back(qp->qpn());
  } else {
    completer::on_response(*qp, pkt, *this);
  }
}

size_t Device::receive_shm_locked() {
  if (!shm_.is_open()) return 0;
  net::RxDatagram d;  // what a UDP receive would have said about a local sender
  d.src_port = wire::kRoceV2Port;
  d.ttl = tx_ttl_;
  d.tos = tx_tos_;
  const size_t n = shm_.poll(
      [&](uint32_t src_ip, std::span<const uint8_t> bytes) {
        d.src_ip = src_ip;
        d.data = const_cast<uint8_t*>(bytes.data());
        d.length = bytes.size();
        bump(counters_->rcvd_shm_pkts);
        handle_packet(d, bytes.data(), bytes.size(), 0, /*from_shm=*/true);
      },
      kRxBudget);
  if (n) {
    last_rx_ns_.store(now_ns(), std::memory_order_relaxed);
    flush();
  }
  return n;
}

size_t Device::receive_locked(bool check_udp) {
  size_t total = receive_shm_locked();
  while (check_udp && total < kRxBudget) {
    const size_t n = port_.recv_batch(rx_slots_);
    if (n == 0) break;
    const uint64_t t = now_ns();
    last_udp_traffic_ns_.store(t, std::memory_order_relaxed);
    last_rx_ns_.store(t, std::memory_order_relaxed);
    for (size_t i = 0; i < n; ++i) handle_datagram(rx_slots_[i]);
    total += n;
    // Responses (READ data, atomic ACKs) and requests the completer released go out now.
    // Coalesced ACKs too while more may be waiting (they open the peer's window); after
    // the batch that emptied the socket they wait for the end of the round (flush()).
    if (n == rx_slots_.size())
      flush();
    else
      send_queued();
  }
  return total;
}

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
}

void Device::progress_locked(uint64_t now, bool check_udp) {
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
  // Ranks outnumber cores: a poller that has found nothing for kYieldAfterNs offers its
  // core to the threads that have work (often the peer's progress thread), as Open MPI's
  // yield_when_idle does; an application that waits on a completion channel sleeps instead.
  constexpr uint64_t kYieldAfterNs = 50'000;
  if (now - last_rx_ns_.load(std::memory_order_relaxed) > kYieldAfterNs && crowded(now))
    sched_yield();
  std::unique_lock lk(mu_, std::try_to_lock);
  if (!lk) return;
  if (shm_.is_open()) shm_.note_polling(now);
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
  progress_locked(now, check_udp);
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
  // socket watched again within ~kPollerActiveNs. 50 µs, not the 200 µs first used:
  // ib_write_lat (whose target polls its CQ for its own send, then spins on memory) waited
  // the whole window for every WRITE; waking every 50 µs while an app polls costs a few
  // percent of a core, as the thread takes no lock then.
  constexpr uint64_t kPollerActiveNs = 50'000;
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
    const bool app_polling = now - last_poll < kPollerActiveNs;
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
    const uint64_t window = shm_only ? kShmOnlyWindowNs : kPollerActiveNs;
    if (app_polling && (until == 0 || until > last_poll + window)) until = last_poll + window;
    if (shm_.is_open() && !app_polling) {
      std::lock_guard lk(mu_);
      shm_.note_sleeping();
      if (receive_shm_locked()) {  // written before the sender could see us asleep
        spin_from(now);
        continue;
      }
    }
    timespec ts{};
    timespec* timeout = nullptr;  // sleep until an event
    if (until) {
      const uint64_t left = until > now ? until - now : 0;
      ts.tv_sec = static_cast<time_t>(left / 1'000'000'000);
      ts.tv_nsec = static_cast<long>(left % 1'000'000'000);
      timeout = &ts;
    }
    const int n = ::epoll_pwait2(epoll_fd_, events, 4, timeout, nullptr);
    bool bell = false;
    for (int i = 0; i < n; ++i) {
      if (events[i].data.fd == port_.fd()) {
        // UDP traffic: from now on the poller's window applies (see shm_only above).
        last_udp_traffic_ns_.store(now_ns(), std::memory_order_relaxed);
      } else if (events[i].data.fd == event_fd_) {
        uint64_t v;
        ssize_t r = ::read(event_fd_, &v, sizeof v);
        (void)r;
      } else if (shm_.is_open() && events[i].data.fd == shm_.doorbell_fd()) {
        bell = true;
      }
    }
    if (stop_.load()) break;
    const uint64_t woke = now_ns();
    const uint64_t timer = sleep_until_ns_.load(std::memory_order_relaxed);
    // A doorbell means a sender saw nobody polling: serve it even inside the poller
    // window (ib_write_lat's target polls once, then spins on memory).
    if (!bell && woke - last_inline_poll_ns_.load(std::memory_order_relaxed) < kPollerActiveNs &&
        (timer == 0 || timer > woke))
      continue;  // the poller is still at it and no timer is due: leave it the lock
    std::lock_guard lk(mu_);
    if (bell) shm_.drain_doorbell();
    if (shm_.is_open()) shm_.note_polling(woke);
    last_udp_check_ns_ = woke;
    progress_locked(woke);
    if (shm_.is_open()) spin_from(woke);
    sleep_until_ns_.store(next_deadline_ns_, std::memory_order_relaxed);
  }
}

}  // namespace softrdma::engine
