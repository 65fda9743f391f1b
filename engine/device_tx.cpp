// Device, transmit side: building packets into TX slots, ICRC, coalesced ACKs, and sending
// the queue over the same-host rings or UDP (GSO runs). See device.h.
#include "engine/device.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
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
#include "net/fault_guard.h"
#include "wire/icrc.h"

namespace softrdma::engine {

void Device::transmit(const wire::Headers& h, uint32_t dst_ip, std::span<const iovec> payload,
                      uint32_t payload_len) {
  if (netem_ && netem_->drop()) {
    bump(counters_->emulated_drops);
    return;
  }
  if (tx_count_ == tx_.size()) send_queued();
  TxSlot& s = tx_[tx_count_];
  const uint8_t pad = wire::pad_for(payload_len);
  size_t hlen = 0;
  if (h.bth.pad_count == pad) {
    hlen = wire::encode_headers(h, s.hdr);
  } else {  // rare: bulk payloads are whole MTUs
    wire::Headers padded = h;
    padded.bth.pad_count = pad;
    hlen = wire::encode_headers(padded, s.hdr);
  }
  if (hlen == 0) return;  // unknown opcode: a bug in the caller, never sent
  const size_t udp_len = hlen + payload_len + pad + wire::kIcrcBytes;

  // The ICRC is computed in send_queued(), once the path is known: the same-host path
  // carries none (see compute_icrc()).
  std::memset(s.trailer, 0, sizeof s.trailer);
  s.icrc_done = false;
  s.taken = false;
  s.ce = false;
  s.pad = pad;
  s.iov.clear();
  s.iov.push_back({s.hdr, hlen});
  // Small payloads travel in the slot (see TxSlot::copy); memory that faults stays referenced
  // and the send path's own fault guard deals with it.
  size_t copied = 0;
  bool own = payload_len <= kTxCopyBytes;
  for (const iovec& v : payload) {
    if (!own) break;
    if (copied + v.iov_len > kTxCopyBytes ||
        (v.iov_len && !net::guarded_copy(s.copy + copied, v.iov_base, v.iov_len)))
      own = false;
    copied += v.iov_len;
  }
  if (own && payload_len) {
    s.iov.push_back({s.copy, payload_len});
  } else if (!own) {
    for (const iovec& v : payload)
      if (v.iov_len) s.iov.push_back(v);
  }
  s.iov.push_back({s.trailer, size_t{pad} + wire::kIcrcBytes});
  s.dst_ip = dst_ip;
  s.udp_len = static_cast<uint32_t>(udp_len);
  s.opcode = h.bth.opcode;
  s.dest_qpn = h.bth.dest_qpn;
  s.psn = h.bth.psn;
  ++tx_count_;
  bump_locked(counters_->sent_pkts);
  bump_locked(counters_->sent_bytes, udp_len);
}

const net::PlacementTable* Device::placement_path(uint32_t dst_ip) {
  // A capture wants every payload on the record, and link emulation (SOFTRDMA_WAN,
  // SOFTRDMA_NETEM) times, queues and drops each packet by its size: a placed packet would
  // cross the emulated link as a header. This process's own address may be shared with other
  // processes (address_share.h), whose packets do not take the rings.
  if (!place_enabled_ || pcap_ || wan_.is_open() || netem_ || dst_ip == ip()) return nullptr;
  const net::PlacementTable* table = shm_.placement_to(dst_ip);
  if (!table && shm_.stats().placement_refused_peers != placement_refusals_logged_) {
    placement_refusals_logged_ = shm_.stats().placement_refused_peers;
    log().info(
        "same-host peer {}: cross-memory attach refused (ptrace rules or seccomp; "
        "process_vm_writev): its WRITEs cross the ring with their payloads",
        net::ipv4_to_string(dst_ip));
  }
  return table;  // nullptr: not mapped yet (no mailbox), refused, or closed
}

bool Device::can_place(uint32_t dst_ip) {
  return placement_path(dst_ip) != nullptr;
}

bool Device::place_write(uint32_t dst_ip, uint32_t dest_qpn, uint32_t rkey, uint64_t remote_va,
                         std::span<const iovec> local, uint64_t len,
                         const std::function<void()>& commit) {
  if (len == 0 || local.size() > IOV_MAX) return false;
  const net::PlacementTable* table = placement_path(dst_ip);
  if (!table) return false;
  net::PlacementTable::Pinned pin;
  int err = 0;
  // `commit` sends: a peer found gone there is dropped, and its mapping (the table, the pins)
  // must outlive the unpin below.
  shm_.hold_mappings();
  struct Release {
    net::ShmPort& port;
    ~Release() { port.release_mappings(); }
  } release{shm_};
  if (table->pin(dest_qpn, rkey, remote_va, len, &pin) != net::PlaceResult::kPlaced ||
      table->copy(pin, local.data(), local.size(), &err) != net::PlaceResult::kPlaced) {
    table->unpin(pin);
    bump(counters_->placement_fallbacks);
    if (err)
      log().debug("placement of {} B at {:#x} (R_Key {:#x}) to {}: {}; sent with the payload", len,
                  remote_va, rkey, net::ipv4_to_string(dst_ip), std::strerror(err));
    return false;  // sent with its payload; the responder decides
  }
  if (commit) commit();
  table->unpin(pin);
  bump_locked(counters_->sent_placed_msgs);
  bump_locked(counters_->sent_placed_bytes, len);
  return true;
}

bool Device::compute_icrc(TxSlot& s) {
  if (s.icrc_done) return true;
  // The payload is read from registered memory, which may have been unmapped since (net/
  // fault_guard.h): the packet is then not sent, and counted.
  struct Args {
    Device* dev;
    TxSlot* slot;
  } a{this, &s};
  if (!net::guarded_call(
          [](void* v) { static_cast<Args*>(v)->dev->crc_slot(*static_cast<Args*>(v)->slot); },
          &a)) {
    bump(counters_->local_access_faults);
    return false;
  }
  return true;
}

void Device::crc_slot(TxSlot& s) {
  // The ICRC for IPv4 id 0, what the kernel sends from this unconnected DF socket; a
  // packet that leaves as segment k of a GSO batch gets its ICRC moved to id k.
  wire::Ipv4UdpTuple tuple;
  tuple.src_ip = ip();
  tuple.dst_ip = s.dst_ip;
  tuple.src_port = port_.port();  // 4791, or a sharing member's own port
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
  recover_ring_full();
  if (!path_waiters_.empty() || shm_.any_backlog()) drain_backlog(now_ns());
  // The ACKs are out: the completions of the messages they acknowledge may be seen now.
  for (const HeldCompletion& h : held_completions_) h.cq->push(h.cqe, h.solicited);
  held_completions_.clear();
}

void Device::recover_ring_full() {
  if (ring_full_.empty()) return;
  std::vector<RingFullDrop> drops;
  drops.swap(ring_full_);
  std::vector<QueuePair*> rewound;
  for (const RingFullDrop& d : drops) {
    // The sending QP: the one connected to (dst ip, dest QPN). A linear scan, but only on a
    // full ring, never per packet.
    QueuePair* qp = nullptr;
    // Only a reliable service resends; a UC/UD packet lost on a full ring stays lost.
    for (auto& [qpn, q] : qps_)
      if (q->type_info().reliable && q->attr.dest_qp_num == d.dest_qpn && q->remote_ip == d.dst_ip)
        qp = q;
    if (qp == nullptr || qp->attr.state != QpState::kRts) continue;
    if (std::find(rewound.begin(), rewound.end(), qp) != rewound.end()) continue;
    if (!requester::on_local_drop(*qp, d.psn)) continue;  // acknowledged or sent again since
    bump(counters_->shm_ring_full_resends);
    rewound.push_back(qp);
  }
  // Sent again now (the ring may have room by then; if not, the next flush tries again with
  // a halved window).
  for (QueuePair* qp : rewound) requester::run(*qp, *this);
  send_queued();  // what this pass drops again is taken up by the next flush
}

bool Device::path_busy(uint32_t dst_ip) {
  return shm_.backlogged(dst_ip);
}

void Device::wait_for_path(QueuePair& qp) {
  bump(counters_->path_waits);
  if (std::find(path_waiters_.begin(), path_waiters_.end(), qp.qpn()) == path_waiters_.end())
    path_waiters_.push_back(qp.qpn());
}

void Device::drain_backlog(uint64_t now) {
  if (shm_.any_backlog()) {
    shm_.drain_backlog();
    ring_shm_doorbells(now);
  }
  if (!path_waiters_.empty()) {
    std::vector<uint32_t> waiters;
    waiters.swap(path_waiters_);
    bool ran = false;
    for (uint32_t qpn : waiters) {
      auto it = qps_.find(qpn);
      if (it == qps_.end()) continue;
      QueuePair& qp = *it->second;
      if (shm_.backlogged(qp.remote_ip)) {
        path_waiters_.push_back(qpn);  // still waiting
        continue;
      }
      requester::run(qp, *this);     // may wait again
      responder::resume(qp, *this);  // READ responses it still owes (may wait again)
      ran = true;
    }
    if (ran) send_queued();
  }
  // The receiver frees room without telling us: look again soon while anything waits.
  if (shm_.any_backlog() || !path_waiters_.empty()) {
    const uint64_t due = now + kBacklogPollNs;
    if (!next_deadline_ns_ || due < next_deadline_ns_) next_deadline_ns_ = due;
    const uint64_t s = sleep_until_ns_.load(std::memory_order_relaxed);
    if (s == 0 || due < s) wake();
  }
}

void Device::ring_shm_doorbells(uint64_t now) {
  if (const size_t refused = shm_.ring_doorbells(now); refused != 0) {
    bump(counters_->shm_doorbell_refused, refused);
    log().warn(
        "same-host doorbell refused by {} peer(s) (gone, or in another network namespace): "
        "reaching them by UDP",
        refused);
  }
}

void Device::deliver_recv_completion(CompletionQueue& cq, const Cqe& cqe, bool solicited) {
  if (holding_completions_)
    held_completions_.push_back({&cq, cqe, solicited});
  else
    cq.push(cqe, solicited);
}

Device::ShmOutcome Device::send_shm(uint32_t dst_ip, std::span<const iovec> iov, bool ce) {
  const net::ShmSendResult r = shm_.send(dst_ip, iov.data(), iov.size(), ce);
  if (r == net::ShmSendResult::kNoPeer && path_ != PacketPath::kShm) return ShmOutcome::kUseUdp;
  if (r == net::ShmSendResult::kFault) {
    bump(counters_->local_access_faults);  // payload memory unmapped since registration
    return ShmOutcome::kDropped;
  }
  if (r == net::ShmSendResult::kQueued) bump(counters_->shm_backlogged);
  if (r != net::ShmSendResult::kSent && r != net::ShmSendResult::kQueued) {
    // A full ring, or (SOFTRDMA_TRANSPORT=shm) no mailbox: lost, as a full socket buffer
    // loses a datagram; RC retransmission recovers it or errors the QP (a full ring's
    // requests at once: recover_ring_full()).
    bump(counters_->shm_drops);
    return r == net::ShmSendResult::kFull ? ShmOutcome::kRingFull : ShmOutcome::kDropped;
  }
  bump_locked(counters_->sent_shm_pkts);
  if (pcap_) {
    // As if it had crossed the wire unsegmented: id 0, DF, the socket's TTL and TOS.
    pcap_->record({ip(), dst_ip, wire::kRoceV2Port, wire::kRoceV2Port, 0, true, tx_ttl_,
                   static_cast<uint8_t>(tx_tos_ | (ce ? 0x3 : 0))},
                  iov);
    pcap_dirty_ = true;
  }
  return r == net::ShmSendResult::kQueued ? ShmOutcome::kQueued : ShmOutcome::kSent;
}

void Device::send_queued() {
  if (tx_count_ == 0) {
    if (pcap_dirty_) {
      pcap_->flush();
      pcap_dirty_ = false;
    }
    // Packets the receive path forwarded to processes sharing the address, in batches.
    if (share_.backlogged()) send_share_locked();
    return;
  }
  if (wan_.is_open() && !shape_queued(now_ns())) {
    tx_count_ = 0;
    if (share_.backlogged()) send_share_locked();
    return;
  }
  // Peers on this host with a mailbox get their packets through shared memory; the rest
  // (and everything under SOFTRDMA_TRANSPORT=udp) by UDP.
  udp_slots_.clear();
  bool shm_sent = false;
  const bool share_local = !member_ && share_.joined() && share_.shared();
  // A member's packets for the owner's QPNs go to the owner's slot socket, as the owner's
  // come to it (no ICRC, several to a datagram): by UDP they cost the ICRC on both sides and
  // the owner's UDP receive, which held ib_write_bw at one address to a third of two
  // addresses (over the rings). The rest (another member's QPNs, QP1) go by UDP to the owner,
  // which forwards them.
  const uint32_t owner_slot = member_ && share_.joined() ? share_.owner_slot() : net::kShareSlots;
  for (size_t k = 0; k < tx_count_; ++k) {
    TxSlot& s = tx_[k];
    if (s.taken) continue;
    if (share_local && s.dst_ip == ip() && forward_local(s)) continue;
    if (owner_slot < net::kShareSlots && s.dst_ip == ip() && s.dest_qpn != 1 &&
        s.dest_qpn / kQpnsPerSlot == owner_slot && forward_local(s))
      continue;
    if (!shm_.is_open()) {
      udp_slots_.push_back(k);
      continue;
    }
    // No ICRC on the same-host path: shared memory has no bit errors, and a peer that could
    // forge a record could compute an ICRC as well; the engine's other checks all apply. It
    // is computed only for the capture file, which must decode as on the wire.
    if (pcap_ && !compute_icrc(s)) continue;  // unmapped payload: not sent
    const uint32_t icrc = pcap_ ? s.icrc : 0;
    for (int b = 0; b < 4; ++b) s.trailer[s.pad + b] = static_cast<uint8_t>(icrc >> (8 * b));
    switch (send_shm(s.dst_ip, s.iov, s.ce)) {
      case ShmOutcome::kSent:
        shm_sent = true;
        break;
      case ShmOutcome::kQueued:  // written by drain_backlog() as room appears
        break;
      case ShmOutcome::kUseUdp:
        udp_slots_.push_back(k);
        break;
      case ShmOutcome::kRingFull:
        if (const wire::OpcodeInfo* info = wire::opcode_info(s.opcode);
            info && (info->mask & wire::kIsRequest))
          ring_full_.push_back({s.dest_qpn, s.dst_ip, s.psn});
        break;
      case ShmOutcome::kDropped:
        break;
    }
  }
  // The ICRC of each UDP packet, first: a packet whose payload faults is dropped here, so
  // the GSO runs below are built from packets that will be sent.
  std::erase_if(udp_slots_, [&](size_t k) { return !compute_icrc(tx_[k]); });
  if (shm_sent || !udp_slots_.empty()) {
    const uint64_t now = now_ns();
    if (shm_sent) ring_shm_doorbells(now);
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
      // (A CE-marked packet differs in its IPv4 header: it ends a run, as GRO ends one.)
      while (j < nudp && j - i < net::kMaxGsoSegments && tx_[udp_slots_[j]].dst_ip == head.dst_ip &&
             tx_[udp_slots_[j]].ce == head.ce && tx_[udp_slots_[j - 1]].udp_len == seg &&
             tx_[udp_slots_[j]].udp_len <= seg &&
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
        pcap_->record({ip(), s.dst_ip, port_.port(), wire::kRoceV2Port, id, true, tx_ttl_,
                       static_cast<uint8_t>(tx_tos_ | (s.ce ? 0x3 : 0))},
                      s.iov);
        pcap_dirty_ = true;
      }
      tx_iov_.insert(tx_iov_.end(), s.iov.begin(), s.iov.end());
    }
    ranges.emplace_back(first_iov, tx_iov_.size() - first_iov);
    tx_batch_.push_back({nullptr, 0, head.dst_ip, wire::kRoceV2Port,
                         static_cast<uint16_t>(j - i > 1 ? seg : 0), head.ce});
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
  // forward_local()'s packets and the receive path's, several to a datagram per process.
  if (share_.backlogged()) send_share_locked();
}

bool Device::forward_local(TxSlot& s) {
  // Straight to the process sharing the address, not through this process's own socket or
  // ring: a packet still queued there is lost when this process exits right after sending
  // it (a REJ, the last DREP), and the member would wait out its CM retries.
  // No ICRC, as on the same-host rings (marked from_shm: the member does not check one):
  // a unix socket has no bit errors, and a CRC over every 4 KiB of READ responses on both
  // sides held two processes at one address to a quarter of what two addresses reach.
  for (int b = 0; b < 4; ++b) s.trailer[s.pad + b] = 0;
  // The payload is registered memory, which may be unmapped meanwhile (net/fault_guard.h):
  // sized first, copied under the guard.
  size_t total = 0;
  for (const iovec& v : s.iov) total += v.iov_len;
  share_tx_.resize(total);
  struct Args {
    uint8_t* out;
    const std::vector<iovec>* iov;
  } a{share_tx_.data(), &s.iov};
  if (!net::guarded_call(
          [](void* v) {
            auto* args = static_cast<Args*>(v);
            for (const iovec& i : *args->iov) {
              std::memcpy(args->out, i.iov_base, i.iov_len);
              args->out += i.iov_len;
            }
          },
          &a)) {
    bump(counters_->local_access_faults);
    return true;  // not sent
  }
  net::RxDatagram d;  // what a datagram from this socket would have said
  d.src_ip = ip();
  d.src_port = port_.port();
  d.ttl = tx_ttl_;
  d.tos = static_cast<uint8_t>(tx_tos_ | (s.ce ? 0x3 : 0));
  const bool taken = forward_to_share(d, share_tx_.data(), share_tx_.size(), 0, /*from_shm=*/true);
  // A packet for another live slot that its socket refused (full) is lost there, counted in
  // share_forward_drops, as a full socket buffer loses a datagram: sending it to this
  // process's own socket or ring instead only brought it back here, to be dropped again as an
  // unknown QPN after a second forward. QPN 1 (every slot's GSI) is also this process's.
  return taken || (s.dest_qpn != 1 && s.dest_qpn / kQpnsPerSlot != share_.slot() &&
                   (share_.live_mask() & (1u << (s.dest_qpn / kQpnsPerSlot))));
}

bool Device::shape_queued(uint64_t now) {
  const net::WanCounters before = wan_.counters();
  size_t kept = 0;
  for (size_t k = 0; k < tx_count_; ++k) {
    TxSlot& s = tx_[k];
    // A held packet leaves later on its own, as a lone datagram (IPv4 id 0): its copy
    // carries that ICRC (the same-host path ignores it).
    if (!compute_icrc(s)) {
      s.taken = true;  // unmapped payload: dropped
      continue;
    }
    for (int b = 0; b < 4; ++b) s.trailer[s.pad + b] = static_cast<uint8_t>(s.icrc >> (8 * b));
    bool ce = false;
    const net::WanVerdict v = wan_.submit(s.dst_ip, s.iov.data(), s.iov.size(), s.udp_len, now, ce);
    s.taken = v != net::WanVerdict::kSendNow;
    s.ce = ce && ecn_capable_;  // RFC 3168: a router marks only ECN-capable packets
    kept += !s.taken;
  }
  const net::WanCounters& after = wan_.counters();
  bump(counters_->wan_shaped, after.shaped - before.shaped);
  bump(counters_->wan_held, after.held - before.held);
  bump(counters_->wan_dropped_loss, after.dropped_loss - before.dropped_loss);
  bump(counters_->wan_dropped_burst, after.dropped_burst - before.dropped_burst);
  bump(counters_->wan_dropped_queue, after.dropped_queue - before.dropped_queue);
  bump(counters_->wan_ecn_marked, after.ecn_marked - before.ecn_marked);
  bump(counters_->wan_duplicated, after.duplicated - before.duplicated);
  bump(counters_->wan_corrupted, after.corrupted - before.corrupted);
  bump(counters_->wan_reordered, after.reordered - before.reordered);
  note_wan_deadline();
  return kept > 0;
}

void Device::release_wan(uint64_t now) {
  if (!wan_.is_open() || wan_.next_due_ns() > now) return;
  bool shm_sent = false;
  wan_.release(now, [&](const net::WanShaper::Packet& p) {
    iovec iov{const_cast<uint8_t*>(p.bytes.data()), p.bytes.size()};
    const std::span<const iovec> one(&iov, 1);
    const bool ce = p.ecn_ce && ecn_capable_;
    if (shm_.is_open()) {
      const ShmOutcome o = send_shm(p.dst_ip, one, ce);
      shm_sent |= o == ShmOutcome::kSent;
      if (o != ShmOutcome::kUseUdp) return;
    }
    if (pcap_) {  // what crosses the wire: a lone datagram, id 0, DF
      pcap_->record({ip(), p.dst_ip, port_.port(), wire::kRoceV2Port, 0, true, tx_ttl_,
                     static_cast<uint8_t>(tx_tos_ | (ce ? 0x3 : 0))},
                    one);
      pcap_dirty_ = true;
    }
    const net::TxDatagram dg{&iov, 1, p.dst_ip, wire::kRoceV2Port, 0, ce};
    size_t errors = 0;
    port_.send_batch(std::span<const net::TxDatagram>(&dg, 1), errors);
    if (errors) bump(counters_->send_err, errors);
    last_udp_traffic_ns_.store(now, std::memory_order_relaxed);
  });
  if (shm_sent) ring_shm_doorbells(now);
  note_wan_deadline();
}

void Device::note_wan_deadline() {
  const uint64_t due = wan_.next_due_ns();
  if (due == UINT64_MAX) return;
  if (!next_deadline_ns_ || due < next_deadline_ns_) next_deadline_ns_ = due;
  const uint64_t s = sleep_until_ns_.load(std::memory_order_relaxed);
  if (s == 0 || due < s) wake();
}

}  // namespace softrdma::engine
