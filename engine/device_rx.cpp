// Device, receive side: GRO splitting and the named checks every packet passes (parse,
// ICRC, header, QP state, source address) before the responder or completer sees it;
// polling the rings and the UDP socket. See device.h.
#include "engine/device.h"

#include <endian.h>
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
    nullptr,                        // kAccept (counted as rcvd_pkts once delivered)
    &Counters::rcvd_malformed,      // kMalformed
    &Counters::rcvd_icrc_err,       // kIcrcMismatch
    &Counters::rcvd_malformed,      // kBadPkey
    &Counters::rcvd_unknown_qpn,    // kUnknownQpn
    &Counters::rcvd_wrong_service,  // kWrongService
    &Counters::rcvd_bad_state,      // kBadState
    &Counters::rcvd_addr_err,       // kWrongSource
    &Counters::rcvd_qkey_err,       // kBadQkey
};
static_assert(std::size(kRxCheckCounter) == size_t(RxCheck::kBadQkey) + 1);

}  // namespace

const char* to_string(RxCheck c) {
  static constexpr const char* kNames[] = {"accepted",
                                           "malformed",
                                           "ICRC mismatch",
                                           "bad P_Key",
                                           "unknown QPN",
                                           "not the QP's service",
                                           "QP state refuses it",
                                           "not from the QP's peer",
                                           "Q_Key is not the QP's"};
  static_assert(std::size(kNames) == size_t(RxCheck::kBadQkey) + 1);
  return kNames[static_cast<size_t>(c)];
}

void Device::count_drop(RxCheck check) {
  if (auto counter = kRxCheckCounter[static_cast<size_t>(check)]) bump((*counters_).*counter);
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

namespace {
// What a placed packet's payload span points at: its bytes are in the MR already, so nothing
// reads them; zeros, so that anything that did would read memory that exists.
alignas(64) const uint8_t kPlacedPayload[4096] = {};
}  // namespace

RxCheck Device::check_placed(wire::Packet& pkt, bool from_shm) {
  using wire::Opcode;
  const auto op = static_cast<Opcode>(pkt.hdr.bth.opcode);
  const bool rc_write = op == Opcode::kWriteFirst || op == Opcode::kWriteMiddle ||
                        op == Opcode::kWriteLast || op == Opcode::kWriteLastImm ||
                        op == Opcode::kWriteOnly || op == Opcode::kWriteOnlyImm;
  uint32_t len = 0;
  if (from_shm && rc_write && pkt.payload.size() == sizeof len) {
    std::memcpy(&len, pkt.payload.data(), sizeof len);
    len = le32toh(len);
    if (len >= 1 && len <= sizeof kPlacedPayload) {
      pkt.payload = {kPlacedPayload, len};
      bump_locked(counters_->rcvd_placed_pkts);
      return RxCheck::kAccept;
    }
  }
  log().debug("drop: placed mark on {} (opcode {:#x}, {} B)",
              from_shm ? "a same-host record" : "a UDP packet", pkt.hdr.bth.opcode,
              pkt.payload.size());
  return RxCheck::kMalformed;
}

wire::Ipv4UdpTuple Device::rx_tuple(const net::RxDatagram& d, uint16_t ip_id_hint) const {
  wire::Ipv4UdpTuple tuple;
  tuple.src_ip = d.src_ip;
  tuple.dst_ip = d.dst_ip ? d.dst_ip : ip();
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
  pcap_->record({d.src_ip, d.dst_ip ? d.dst_ip : ip(), d.src_port, wire::kRoceV2Port,
                 v.ok ? v.ip_id : uint16_t{0}, v.ok ? v.dont_fragment : true, d.ttl, d.tos},
                std::span<const iovec>(&whole, 1));
  pcap_dirty_ = true;
}

RxCheck Device::check_header(const wire::Packet& pkt) const {
  if ((pkt.hdr.bth.pkey & 0x7fff) != (wire::kDefaultPkey & 0x7fff)) return RxCheck::kBadPkey;
  return RxCheck::kAccept;
}

RxCheck Device::check_qp_state(const wire::Packet& pkt, QueuePair*& qp) const {
  auto it = qps_.find(pkt.hdr.bth.dest_qpn);
  if (it == qps_.end()) return RxCheck::kUnknownQpn;
  qp = it->second;
  return check_type_state(pkt, *qp);
}

RxCheck Device::check_type_state(const wire::Packet& pkt, const QueuePair& qp) const {
  const QpTypeInfo& type = qp.type_info();
  const bool request = pkt.info->mask & wire::kIsRequest;
  // A CNP (service 4) reaches any QP that sends; every other packet must be of the QP's
  // service and of a direction its type takes (an XRC target takes no response, …).
  if (!(pkt.info->mask & wire::kIsCnp) && (pkt.info->service != type.service ||
                                           !(request ? type.takes_requests : type.takes_responses)))
    return RxCheck::kWrongService;
  if (request ? !qp.accepts_requests() : !qp.accepts_responses()) return RxCheck::kBadState;
  return RxCheck::kAccept;
}

RxCheck Device::check_addr(const QueuePair& qp, const net::RxDatagram& d) const {
  if (!qp.type_info().connected) return RxCheck::kAccept;  // UD: any sender
  return d.src_ip == qp.remote_ip ? RxCheck::kAccept : RxCheck::kWrongSource;
}

RxCheck Device::check_keys(const QueuePair& qp, const wire::Packet& pkt) const {
  if (!(pkt.info->mask & wire::kHasDeth)) return RxCheck::kAccept;
  const uint32_t qkey = qp.qpn() == 1 ? ud::kGsiQkey : qp.attr.qkey;
  return pkt.hdr.deth.qkey == qkey ? RxCheck::kAccept : RxCheck::kBadQkey;
}

bool Device::forward_to_share(const net::RxDatagram& d, const uint8_t* data, size_t length,
                              uint16_t ip_id_hint, bool from_shm) {
  const uint32_t own = share_.slot();
  const uint32_t others = share_.live_mask() & ~(1u << own);
  if (others == 0 || length < wire::kBthBytes) return false;  // alone, or check_parse drops it
  // BTH bytes 5-7: the destination QPN, whose top bits are the slot of the process that
  // allocated it (Device::register_qp). The GSI (QPN 1) of every process is reached at QPN
  // 1: each gets a copy, and each CM keeps what is its own (cm/cm_device.cpp).
  const uint32_t qpn = uint32_t{data[5]} << 16 | uint32_t{data[6]} << 8 | data[7];
  const uint32_t slot = qpn / kQpnsPerSlot;
  const bool gsi = qpn == 1;
  if (!gsi && (slot == own || !(others & (1u << slot)))) return false;  // ours, or nobody's
  net::ForwardedMeta meta;
  meta.src_ip = d.src_ip;
  meta.src_port = d.src_port;
  meta.ip_id_hint = ip_id_hint;
  meta.ttl = d.ttl;
  meta.tos = d.tos;
  meta.from_shm = from_shm;
  const std::span<const uint8_t> bytes(data, length);
  bool sent = false;
  for (uint32_t k = 0; k < net::kShareSlots; ++k) {
    if (!((gsi ? others : 1u << slot) & (1u << k))) continue;
    // Queued in the slot's batch; send_share_locked() sends it and counts the outcome.
    sent = share_.forward(k, meta, bytes) || sent;
  }
  // A packet its slot's process could not take (it died) goes through this process's
  // checks, which drop it as addressed to an unknown QPN.
  return !gsi && sent;
}

void Device::send_share_locked() {
  share_.send_batches();
  const net::ShareStats& now = share_.stats();
  bump_locked(counters_->share_forwarded, now.forwarded - share_seen_.forwarded);
  bump_locked(counters_->share_forward_drops, now.forward_drops - share_seen_.forward_drops);
  bump_locked(counters_->share_backlogged, now.backlogged - share_seen_.backlogged);
  share_seen_ = now;
}

size_t Device::receive_share_locked() {
  size_t n = 0;
  for (; n < kRxBudget; ++n) {
    net::ForwardedMeta meta;
    const std::span<uint8_t> p = share_.next(meta);  // valid until the next call
    if (p.empty()) break;
    const size_t len = p.size();
    net::RxDatagram d;
    d.data = p.data();
    d.capacity = len;
    d.length = len;
    d.src_ip = meta.src_ip;
    d.src_port = meta.src_port;
    d.ttl = meta.ttl;
    d.tos = meta.tos;
    bump_locked(counters_->share_rcvd);
    handle_packet(d, d.data, len, meta.ip_id_hint, meta.from_shm != 0, /*forwarded=*/true);
  }
  // Follows the owner the registry names (a new one after a take-over) once the queue is
  // drained: reconnecting discards what is still queued.
  if (member_ && n < kRxBudget) share_.follow_owner();
  if (n) {
    last_rx_ns_.store(now_ns(), std::memory_order_relaxed);
    flush();
  }
  return n;
}

void Device::handle_packet(const net::RxDatagram& d, const uint8_t* data, size_t length,
                           uint16_t ip_id_hint, bool from_shm, bool forwarded) {
  // (A multicast group's datagram reaches every process's own group socket: never forwarded.)
  if (!forwarded && !member_ && d.dst_ip == 0 && share_.joined() &&
      forward_to_share(d, data, length, ip_id_hint, from_shm))
    return;
  const std::span<const uint8_t> bytes(data, length);
  // The device's one Packet, overwritten by wire::parse: a fresh local was zero-filled per
  // packet (`rep stos`, 136 bytes), ~5 % of a receiving thread's samples at 4 KiB packets.
  // Packets are handled one at a time under mu_ and never recursively (receive rounds only).
  wire::Packet& pkt = rx_packet_;
  wire::IcrcVerdict icrc;
  RxCheck check = check_parse(d, bytes, pkt);
  if (check == RxCheck::kAccept) check = check_icrc(d, bytes, ip_id_hint, from_shm, pkt, icrc);
  if (check == RxCheck::kAccept && pkt.hdr.bth.placed) check = check_placed(pkt, from_shm);
  // Every packet is captured, the ones dropped below too.
  if (pcap_) capture_received(d, data, length, ip_id_hint, from_shm, icrc);
  QueuePair* qp = nullptr;
  if (check == RxCheck::kAccept) check = check_header(pkt);
  if (check == RxCheck::kAccept && d.dst_ip != 0)
    return deliver_mcast(d, pkt, icrc.ok ? icrc.ip_id : uint16_t{0}, length);
  if (check == RxCheck::kAccept) check = check_qp_state(pkt, qp);
  if (check == RxCheck::kAccept) check = check_addr(*qp, d);
  if (check == RxCheck::kAccept) check = check_keys(*qp, pkt);
  if (check != RxCheck::kAccept) {
    count_drop(check);
    // check_parse and check_icrc log their own details.
    if (check > RxCheck::kIcrcMismatch && log().should_log(spdlog::level::debug))
      log().debug("drop from {}: {} (opcode {:#x} qpn {:#x} psn {:#x})",
                  net::ipv4_to_string(d.src_ip), to_string(check), pkt.hdr.bth.opcode,
                  pkt.hdr.bth.dest_qpn, pkt.hdr.bth.psn);
    return;
  }
  bump_locked(counters_->rcvd_pkts);
  bump_locked(counters_->rcvd_bytes, length);
  if (pkt.info->mask & wire::kIsCnp) return completer::on_cnp(*qp, *this);
  // RFC 3168's Congestion Experienced (an emulated link's queue marked it): the responder
  // notifies the requester with a CNP (DCQCN's notification point).
  const bool ce = (d.tos & 0x3) == 0x3;
  if (ce) bump(counters_->ecn_ce_rcvd);
  if (pkt.info->mask & wire::kIsRequest) {
    const QpTypeInfo& type = qp->type_info();
    // DCQCN's notification point answers the reliable services' requesters (a CNP goes to
    // the connection's QP; a UD sender has no connection to slow).
    if (ce && type.reliable) responder::on_congestion_experienced(*qp, *this);
    const RxMeta meta{d.src_ip,
                      ip(),
                      d.tos,
                      d.ttl,
                      icrc.ok ? icrc.ip_id : uint16_t{0},
                      static_cast<uint16_t>(length)};
    holding_completions_ = true;
    type.on_request(*qp, pkt, meta, *this);
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
  size_t seen = 0;
  const size_t n = shm_.poll(
      [&](uint32_t src_ip, std::span<const uint8_t> bytes, bool ce) {
        // A long round (up to kRxBudget packets, hundreds of µs of copying) is polling too:
        // say so now and then, or senders find the poll clock stale and ring the doorbell,
        // and an application's round looks to the progress thread like a poller that
        // stopped — either way the progress thread wakes to fight this poller for the lock
        // (a READ initiator: its packets split between two threads handing the lock over).
        if (++seen % kRxPollNoteEvery == 0) {
          const uint64_t t = now_ns();
          shm_.note_polling(t);
          if (inline_round_) last_inline_poll_ns_.store(t, std::memory_order_relaxed);
        }
        d.src_ip = src_ip;
        d.tos = static_cast<uint8_t>(tx_tos_ | (ce ? 0x3 : 0));
        d.data = const_cast<uint8_t*>(bytes.data());
        d.length = bytes.size();
        bump_locked(counters_->rcvd_shm_pkts);
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
  // Forwarded packets: a member gets all of its own this way; an owner only after it took
  // over from an owner that left while its forwards were in flight (a system call per round
  // only while the address is shared).
  if (share_.joined() && (member_ || share_.shared())) total += receive_share_locked();
  if (check_udp && !mcast_.empty()) total += receive_mcast_locked();
  while (check_udp && total < kRxBudget) {
    const size_t n = port_.recv_batch(rx_slots_);
    if (n == 0) break;
    counters_->rcvd_socket_overflows.store(port_.receive_overflows(), std::memory_order_relaxed);
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

}  // namespace softrdma::engine
