// Requester: SQ WQEs → request packets (IBTA vol 1, 9.4 and 9.7.3; rxe_req.c).
#include <endian.h>

#include <algorithm>
#include <cstdint>

#include "engine/cq.h"
#include "engine/log.h"
#include "engine/memory.h"
#include "engine/mw.h"
#include "engine/qp.h"

namespace softrdma::engine::requester {

namespace {

using wire::Opcode;

uint32_t psns_for(uint64_t bytes, uint32_t mtu) {
  return bytes == 0 ? 1u : static_cast<uint32_t>((bytes + mtu - 1) / mtu);
}

// Resolves the WQE's local SGEs to host memory, checking lkey, PD, bounds and, for READ
// and atomic results (written locally), LOCAL_WRITE. IBTA 10.6.3: a failure is a local
// protection error of that WQE.
bool resolve_local(QueuePair& qp, SendWqe& w, Transport& t) {
  w.local.clear();
  if (!w.inline_data.empty()) {
    w.local.push_back({w.inline_data.data(), w.inline_data.size()});
    return true;
  }
  const bool writes_local = w.info().read_or_atomic;
  for (const Sge& s : w.sges) {
    if (s.length == 0) continue;
    MemoryRegion* mr = t.find_mr(s.lkey);
    if (!mr || &mr->pd() != &qp.pd()) return false;
    if (writes_local && !(mr->access() & kLocalWrite)) return false;
    uint8_t* p = mr->translate(s.addr, s.length);
    if (!p) return false;
    w.local.push_back({p, s.length});
  }
  return true;
}

// Executes a local operation (IBTA 10.6.7.2): BIND_MW binds the window its WR names to the
// MR range; LOCAL_INV invalidates a type 2 window. Returns the completion status: success,
// IBV_WC_MW_BIND_ERR for a refused bind, IBV_WC_LOC_QP_OP_ERR for a refused invalidate (as
// rxe's do_local_ops). A refused operation changes nothing.
WcStatus execute_local(QueuePair& qp, const SendWqe& w, Transport& t) {
  if (w.wr.opcode == WrOpcode::kBindMw) {
    const MwBind& b = w.wr.bind;
    MemoryWindow* mw = t.find_mw(b.mw_rkey);
    if (!mw) {
      log().debug("qp {:#x}: bind refused: no window with R_Key {:#x}", qp.qpn(), b.mw_rkey);
      return WcStatus::kMwBindErr;
    }
    MemoryRegion* mr = b.length ? t.find_mr(b.mr_lkey) : nullptr;
    return mw->bind(qp, b, mr) == kOk ? WcStatus::kSuccess : WcStatus::kMwBindErr;
  }
  MemoryWindow* mw = t.find_mw(w.wr.invalidate_rkey);
  if (!mw || mw->invalidate() != kOk) {
    log().debug("qp {:#x}: local invalidate of R_Key {:#x} refused", qp.qpn(),
                w.wr.invalidate_rkey);
    return WcStatus::kLocQpOpErr;
  }
  return WcStatus::kSuccess;
}

// Appends to `out` the iovecs covering [offset, offset+len) of `local`.
void gather(const std::vector<iovec>& local, uint64_t offset, uint64_t len,
            std::vector<iovec>& out) {
  out.clear();
  for (const iovec& v : local) {
    if (len == 0) break;
    if (offset >= v.iov_len) {
      offset -= v.iov_len;
      continue;
    }
    size_t take = std::min<uint64_t>(v.iov_len - offset, len);
    out.push_back({static_cast<uint8_t*>(v.iov_base) + offset, take});
    len -= take;
    offset = 0;
  }
}

// Bytes a request packet carries besides its payload, as the pacer counts them: BTH 12 +
// ICRC 4 + 4 (a RETH's 16 bytes spread over a message's first packets, pad) — the UDP
// payload, which is what an emulated link's `rate` serialises (net/link_emulator.h), so a
// QP paced at the link's rate fills it without queueing. (An upper bound of 60, with the
// IPv4 and UDP headers, left ~1.4 % of the link unused.)
constexpr uint64_t kPacketOverheadBytes = 20;

// Whether the window paces the QP (pacing_rate): no DCQCN, a long path with a measured round
// trip, in congestion avoidance or once an ACK train has measured the path. Checked before
// the clock is read, so that the same-host path's per-packet work stays what it was.
bool window_paces(const QueuePair& qp) {
  const CongestionWindow& w = qp.req.window;
  return !qp.req.cc_on && w.long_path() && w.srtt_ns() &&
         (w.psns() >= w.threshold() || w.train_measured());
}

// The rate the requester paces at, B/ns (0: unpaced). With DCQCN (SOFTRDMA_CC=dcqcn) its
// rate. Without (none), on a long path (CongestionWindow::long_path) in congestion
// avoidance: 1.2 × the window per smoothed round trip — Linux TCP's own pacing in congestion
// avoidance (tcp_update_pacing_rate, net.ipv4.tcp_pacing_ca_ratio 120). The window still
// bounds what is in flight; the pacer spreads it over the round trip, so a window that opens
// at once (a repaired gap, placed READ responses passed) leaves at about the path's pace
// instead of as one burst into the bottleneck's queue (bench/wan_bench.sh, 1 Gbit/s × 20 ms,
// 0.1 % loss, selective: WRITE 41 -> 78 %, READ 77 -> 86 % of the link). Slow start stays
// unpaced: its window-limited flights leave as bursts on purpose, for the ACK trains that
// measure the path (CongestionWindow; paced at Linux's 2 × window / SRTT from the start, the
// trains measured the pacer and a 10 Gbit/s × 10 ms KV hand-off took 186 ms instead of ~80)
// — until the first train has measured it: slow start then goes on paced at
// CongestionWindow::kTrainPacingGain × the rate the trains measured, so that the raised
// window's packets leave at about the path's rate instead of as bursts into the
// bottleneck's queue (its overshoot dropped 1,500–1,900 packets per 256 MiB at 1 Gbit/s ×
// 20 ms), and the next train still sees the path's rate.
double window_pacing_rate(const QueuePair& qp) {
  const CongestionWindow& w = qp.req.window;
  if (!window_paces(qp)) return 0;
  const double bytes = double(qp.mtu + kPacketOverheadBytes);
  if (w.psns() < w.threshold()) return CongestionWindow::kTrainPacingGain * w.train_rate() * bytes;
  return 1.2 * double(w.flight_psns()) * bytes / double(w.srtt_ns());
}

double pacing_rate(QueuePair& qp, uint64_t now) {
  if (!qp.req.cc_on) return window_pacing_rate(qp);
  qp.req.rate.advance(now);
  return qp.req.rate.rate();
}

// Pacing: whether the pacer holds the next packet now. If it does, the QP's timer is armed
// for when it may go (completer::on_timer runs the requester again then).
bool paced_out(QueuePair& qp, Transport& t) {
  if (!qp.req.cc_on && !window_paces(qp)) return false;
  const uint64_t now = t.now_ns();
  const double rate = pacing_rate(qp, now);
  if (qp.req.pacer.may_send(rate, now)) return false;
  const uint64_t at = qp.req.pacer.next_send_ns(rate);
  if (qp.comp.pace_ns != at) {
    qp.comp.pace_ns = at;
    t.timer_armed(qp, at);
  }
  bump(t.counters().paced_waits);
  return true;
}

// Whether the path to the peer is paused (packets to it wait in the device's same-host
// backlog): then nothing new is queued and the device runs the QP again once they left.
bool held_back(QueuePair& qp, Transport& t) {
  if (!t.path_busy(qp.remote_ip)) return false;
  t.wait_for_path(qp);
  return true;
}

// A packet of `payload` bytes left: the pacer's bucket and DCQCN's byte counter. `drawn`:
// the bytes of READ responses it asks for, which cross the path the other way — counted by
// the window's pacer (pacing_rate without DCQCN), not by DCQCN, which paces what this side
// sends.
void note_paced(QueuePair& qp, Transport& t, uint64_t payload, uint64_t drawn = 0) {
  if (!qp.req.cc_on && !window_paces(qp)) return;
  const uint64_t now = t.now_ns();
  const uint64_t bytes = payload + kPacketOverheadBytes;
  if (qp.req.cc_on) {
    qp.req.pacer.on_sent(bytes, qp.req.rate.rate(), now);
    qp.req.rate.on_sent(bytes, now);
    return;
  }
  qp.req.pacer.on_sent(bytes + drawn, pacing_rate(qp, now), now);
}

// The headers every request packet of WQE `w` carries: the opcode in the QP's service, the
// destination QP, and the service's own ETH — UD's DETH (the WR's Q_Key, or the QP's when
// the WR's has its most significant bit set, IBTA vol 1 10.2.5; our QPN as the source),
// XRC's XRCETH (the target SRQ of the WR).
wire::Headers base_headers(const QueuePair& qp, const SendWqe& w, Transport& t, Opcode op,
                           uint32_t psn) {
  const QpTypeInfo& type = qp.type_info();
  wire::Headers h;
  h.bth.opcode = type.opcode(op);
  h.bth.dest_qpn = type.connected ? qp.attr.dest_qp_num : w.wr.remote_qpn;
  h.bth.psn = psn;
  h.bth.selective = type.reliable && t.selective_retransmit();
  // Sent before (max_psn is one past the highest PSN ever sent; note_sent moves it after).
  h.bth.resend = h.bth.selective && wire::psn_diff(psn, qp.req.max_psn) < 0;
  h.bth.sack = h.bth.selective;
  h.bth.sack_ranges = h.bth.selective;
  if (type.service == wire::Service::kUd) {
    const uint32_t own = qp.qpn() == 1 ? ud::kGsiQkey : qp.attr.qkey;  // QP1: the GSI's
    h.deth.qkey = (w.wr.remote_qkey & 0x80000000u) ? own : w.wr.remote_qkey;
    h.deth.src_qpn = qp.qpn();
  } else if (type.service == wire::Service::kXrc) {
    h.xrceth.srqn = w.wr.remote_srqn;
  }
  return h;
}

// Where WQE `w`'s packets go: the QP's peer, or the UD WR's address handle.
uint32_t destination(const QueuePair& qp, const SendWqe& w) {
  return qp.type_info().connected ? qp.remote_ip : w.wr.ud_dst_ip;
}

void note_sent(QueuePair& qp, Transport& t, uint32_t psn_count) {
  if (wire::psn_diff(qp.req.psn, qp.req.max_psn) < 0) {
    bump(t.counters().retransmitted_pkts);  // this PSN was sent before: go-back-N resend
  } else if (qp.req.timed_psn == kNoPsn) {
    qp.req.timed_psn = qp.req.psn;  // a first transmission: time its round trip
    qp.req.timed_ns = t.now_ns();
    qp.req.timed_behind_gap = false;
  }
  qp.req.psn = wire::psn_add(qp.req.psn, psn_count);
  if (wire::psn_diff(qp.req.psn, qp.req.max_psn) > 0) qp.req.max_psn = qp.req.psn;
}

// PSNs in flight: the span from the oldest unacknowledged PSN less what the responder holds
// beyond a gap and the READ responses placed beyond it (window_room).
int64_t in_flight_psns(const QueuePair& qp) {
  return int64_t{wire::psn_diff(qp.req.psn, qp.comp.psn)} - held_psns(qp) - qp.comp.read_ahead;
}

// PSNs the window lets out (≤ 0: none). The window bounds what is in flight: the PSNs from
// the oldest unacknowledged one on, less those the responder's latest selective ACK said it
// holds beyond its expected PSN (held_psns) and the READ responses placed beyond it
// (CompleterState::read_ahead) — TCP's pipe (RFC 6675 4) with IRN's SACK (Mittal et al.
// 2018, 3.2). So a gap at the head, which takes one or two round trips to repair, no longer
// holds the whole window: the span from the oldest unacknowledged PSN may reach
// kSpanPerWindow windows (at most kWindowPsns, what the responder can track), and the
// responder's memory for out-of-order PSNs stays proportional to the window (ReceivedPsns:
// 4.5 bytes per PSN of span). Without selective ACKs (a go-back-N peer, or no gap) nothing
// is held and the window is the span, as before. Counted in flight, placed READ responses
// kept the window shut while the gap before them was repaired, then let a burst of requests
// out at once whose responses overflowed the path's queue (bench/wan_bench.sh WAN_OP=read,
// 0 % loss: 46 -> 72-80 % of the link; the responder's queue drops 11,000 -> 900-1,400).
// While QPs towards the same peer share one window (CongestionWindow::flight_psns,
// PathShare::flight_cap), what is in flight is bounded by this QP's part of it; the span's
// cap stays kSpanPerWindow of the QP's own window.
int32_t window_room(const QueuePair& qp) {
  const uint32_t window = std::min(qp.req.window.psns(), kWindowPsns);
  const uint32_t flight = std::min(qp.req.window.flight_psns(), kWindowPsns);
  const int32_t span = wire::psn_diff(qp.req.psn, qp.comp.psn);
  const int64_t cap = std::min<int64_t>(kWindowPsns, int64_t{kSpanPerWindow} * window);
  const int64_t room = std::min<int64_t>(int64_t{flight} - in_flight_psns(qp), cap - span);
  return static_cast<int32_t>(std::clamp<int64_t>(room, INT32_MIN, INT32_MAX));
}

// Whether WQE `w`'s packets may have their payloads placed by the device
// (Transport::place_write): an RC RDMA WRITE without immediate data. One with it is announced
// by its CQE, which only the receiver's progress thread makes: placing it gains no latency,
// and it was measured slower (rstream 64 KiB 14.5 -> 7.0 Gbit/s; docs/performance.md, "One
// copy on the same-host path"). Each packet is placed only on its first
// transmission and once every request sent before it with its payload is acknowledged
// (emit_data_packet).
bool placeable(const QueuePair& qp, const SendWqe& w) {
  return w.info().cls == WrClass::kWrite && w.wr.opcode == WrOpcode::kRdmaWrite && w.length != 0 &&
         qp.type_info().service == wire::Service::kRc;
}

// Whether WQE `w` goes as one WRITE Only per packet (SendWqe::reth_each): a plain RC RDMA
// WRITE of more than one packet, in selective mode, on a long path whose responder has
// reported a gap (a selective NAK or ACK: it is a softrdma responder and this path loses
// packets) — where a lost WRITE First cost the rest of the message a round trip later. Not
// a WRITE with immediate data (its completion reports the message's length), nor on paths
// that have lost nothing: there 16 bytes per packet buy nothing, and the wire keeps the
// First … Last that captures show (a veth between namespaces measures ≥ 1 ms under ASan on
// a loaded host: `topo.capture` saw its WRITE Firsts turn into Onlys mid-run).
bool reth_each(const QueuePair& qp, const SendWqe& w, Transport& t) {
  return w.info().cls == WrClass::kWrite && w.wr.opcode == WrOpcode::kRdmaWrite &&
         w.length > qp.mtu && qp.type_info().service == wire::Service::kRc &&
         t.selective_retransmit() && qp.comp.peer_selective && qp.req.window.long_path();
}

// Whether every request sent with its payload (or none) is acknowledged: the condition for
// placing a WRITE packet (RequesterState::inband_end). Forgets an acknowledged end, so that
// a long placed stream never compares against a PSN half the space behind.
bool inband_acked(QueuePair& qp) {
  if (qp.req.inband_end != kNoPsn && wire::psn_diff(qp.comp.psn, qp.req.inband_end) >= 0)
    qp.req.inband_end = kNoPsn;
  return qp.req.inband_end == kNoPsn;
}

// Records that the request packets before PSN `end` went with their payloads (or had none).
// Only ever forward: a resend of an older PSN (a go-back, a READ asked for again) leaves the
// in-band packets sent after it unacknowledged.
void note_inband(QueuePair& qp, uint32_t end) {
  if (inband_acked(qp) || wire::psn_diff(end, qp.req.inband_end) > 0) qp.req.inband_end = end;
}

// Queues packet `h` with the placed mark and its payload's length, `pay` bytes, in place of
// the payload (wire::Bth::placed).
void transmit_placed(Transport& t, wire::Headers& h, uint32_t dst, uint32_t pay) {
  h.bth.placed = true;
  const uint32_t le = htole32(pay);
  const iovec len_iov{const_cast<uint32_t*>(&le), sizeof le};
  t.transmit(h, dst, {&len_iov, 1}, sizeof le);
}

// Whether the packet of `pay` bytes at byte `off` of placeable WQE `w` (a first transmission)
// has its payload in the responder's memory: inside the run the device placed last
// (SendWqe::placed_from/placed_end), or at the start of a new run placed now — the packets
// the window lets out from here, at most kPlaceRunBytes, in one system call — when every
// request sent before it with its payload is acknowledged (RequesterState::inband_end).
bool placed_run(QueuePair& qp, SendWqe& w, Transport& t, uint64_t off, uint32_t pay) {
  if (off >= w.placed_from && off + pay <= w.placed_end) return true;
  if (!inband_acked(qp)) return false;
  // Up to the message's last packet, which place_last() places on its own.
  const uint64_t last_off = uint64_t(w.npsn - 1) * qp.mtu;
  const uint64_t room = uint64_t(std::clamp(window_room(qp), 1, 1 << 16)) * qp.mtu;
  const uint64_t bytes = std::min({last_off - off, room, std::max<uint64_t>(pay, kPlaceRunBytes)});
  std::vector<iovec>& iov = qp.req.place_iov;
  iov.clear();
  gather(w.local, off, bytes, iov);
  if (!t.place_write(destination(qp, w), qp.attr.dest_qp_num, w.wr.rkey, w.wr.remote_addr + off,
                     iov, bytes))
    return false;
  w.placed_from = off;
  w.placed_end = off + bytes;
  return true;
}

// The last packet of placeable WQE `w` (a first transmission, headers `h`, payload `iov` of
// `pay` bytes), when the rule of placed_run() allows: its bytes are written, then — while the
// responder's QP is still pinned — its header goes out marked placed, pushed to the ring with
// everything queued before it. An application polling the message's last byte may see it at
// once; a responder that then tears its QP down waits for the pin and finds every header of
// the message on its rings (ObjectRegistry::drain_inbound), so the requester gets its ACK.
// False: not placed, send the payload.
bool place_last(QueuePair& qp, SendWqe& w, Transport& t, wire::Headers& h,
                const std::vector<iovec>& iov, uint64_t off, uint32_t pay) {
  if (!inband_acked(qp)) return false;
  const uint32_t dst = destination(qp, w);
  return t.place_write(dst, qp.attr.dest_qp_num, w.wr.rkey, w.wr.remote_addr + off, iov, pay, [&] {
    transmit_placed(t, h, dst, pay);
    t.send_queued();
  });
}

// The SEND/WRITE packet at byte `off` of the WQE, with PSN `psn`. `ack_req` asks for an
// ACK besides the last packet's. Returns the payload bytes.
uint32_t emit_data_packet(QueuePair& qp, SendWqe& w, Transport& t, std::vector<iovec>& iov,
                          uint32_t psn, uint64_t off, bool ack_req) {
  const uint32_t pay = static_cast<uint32_t>(std::min<uint64_t>(qp.mtu, w.length - off));
  const bool first = off == 0;
  const bool last = off + pay == w.length;
  const WrOpcodeInfo& info = w.info();
  wire::Headers h =
      base_headers(qp, w, t, info.wire_opcode(first || w.reth_each, last || w.reth_each), psn);
  if (w.reth_each) {
    h.reth.va = w.wr.remote_addr + off;
    h.reth.rkey = w.wr.rkey;
    h.reth.dma_length = pay;
  } else if (first && (info.cls == WrClass::kWrite || info.cls == WrClass::kAtomicWrite)) {
    h.reth.va = w.wr.remote_addr;
    h.reth.rkey = w.wr.rkey;
    h.reth.dma_length = static_cast<uint32_t>(w.length);
  }
  if (last) {
    h.imm_be = w.wr.imm_be;
    h.ieth_rkey = w.wr.invalidate_rkey;  // written only by SEND with invalidate's opcodes
    h.bth.solicited = (w.wr.flags & kSolicited) != 0;
  }
  // Only a reliable service asks for ACKs (IBTA 9.2: AckReq is 0 on UC and UD).
  h.bth.ack_req = qp.type_info().reliable && (last || ack_req);
  // A WRITE's first transmission may go with the placed mark and its length in place of its
  // payload (Bth::placed), the bytes already in the responder's memory (placed_run()). A
  // resend carries the payload, as the responder may not have seen the first.
  const bool placeable_now = w.placeable && wire::psn_diff(psn, qp.req.max_psn) >= 0;
  if (placeable_now && !last && placed_run(qp, w, t, off, pay)) {
    transmit_placed(t, h, destination(qp, w), pay);
    qp.req.inband_starved = 0;
    return pay;
  }
  gather(w.local, off, pay, iov);
  if (placeable_now && last && place_last(qp, w, t, h, iov, off, pay)) {
    qp.req.inband_starved = 0;
    return pay;
  }
  if (placeable_now && !inband_acked(qp) && t.can_place(destination(qp, w))) {
    qp.req.inband_starved += pay;
    if (qp.req.inband_starved >= kPlaceRunBytes) {
      h.bth.ack_req = qp.type_info().reliable;  // the ACK that ends the hold
      qp.req.place_hold = true;
    }
  }
  t.transmit(h, destination(qp, w), iov, pay);
  note_inband(qp, wire::psn_add(psn, 1));
  return pay;
}

// One SEND/WRITE packet at the current offset. Returns true when the WQE is fully sent.
bool send_data_packet(QueuePair& qp, SendWqe& w, Transport& t, std::vector<iovec>& iov) {
  const uint64_t off = qp.req.offset;
  // AckReq on the last packet, every kAckEvery packets, and on the packet that fills the
  // window (the ACK for it is what opens the window again).
  const bool fills = window_room(qp) <= 1;
  const bool ack_req = fills || ++qp.req.noack_pkts >= kAckEvery;
  const uint32_t pay = emit_data_packet(qp, w, t, iov, qp.req.psn, off, ack_req);
  note_paced(qp, t, pay);
  if (ack_req || off + pay == w.length) qp.req.noack_pkts = 0;
  note_sent(qp, t, 1);
  qp.req.offset = off + pay;
  return qp.req.offset == w.length;
}

// The end of the READ chunk of `w` that holds byte `off`, bytes: chunks are kReadChunkPsns
// packets from the start of the message, the last one ends with it.
uint64_t read_chunk_end(const QueuePair& qp, const SendWqe& w, uint64_t off) {
  const uint64_t chunk_bytes = uint64_t{kReadChunkPsns} * qp.mtu;
  return std::min<uint64_t>(w.length, (off / chunk_bytes + 1) * chunk_bytes);
}

// The READ request for the chunk that holds byte `off`, from `off` to the chunk's end (at
// most `max_bytes`), at PSN `psn`. Chunks keep fixed boundaries (multiples of
// kReadChunkPsns packets from the start of the message), so a READ re-requested from the
// middle of a chunk never asks for PSNs beyond what the original request covered (the
// responder's expected PSN stays right); a shorter one is a duplicate READ for the start
// of that rest (IBTA 9.7.5.1.3.1). `may_be_new`: the responder may not have executed these
// PSNs' original request, so where this one stops short becomes a cut (read_cuts). Returns
// the request's bytes.
uint64_t emit_read_request(QueuePair& qp, SendWqe& w, Transport& t, uint32_t psn, uint64_t off,
                           uint64_t max_bytes = UINT64_MAX, bool may_be_new = true) {
  uint64_t end = read_chunk_end(qp, w, off);
  // Nor past where an earlier request of this chunk ended short: the responder may have
  // executed that one as new (its first request was lost), and a duplicate reaching past it
  // matches no executed READ — dropped at every retry until retry_cnt ran out (a READ in
  // WanLink's 2 %-loss run under load, 1 in ~30).
  for (const uint64_t cut : w.read_cuts)
    if (cut > off && cut < end) end = cut;
  const uint64_t chunk = std::min<uint64_t>(max_bytes, end - off);
  if (off + chunk < end && may_be_new) w.read_cuts.push_back(off + chunk);
  wire::Headers h = base_headers(qp, w, t, w.info().only, psn);
  h.reth.va = w.wr.remote_addr + off;
  h.reth.rkey = w.wr.rkey;
  h.reth.dma_length = static_cast<uint32_t>(chunk);
  h.bth.ack_req = true;
  t.transmit(h, qp.remote_ip, {}, 0);
  note_inband(qp, wire::psn_add(psn, psns_for(chunk, qp.mtu)));
  return chunk;
}

// One READ request for the next chunk. Returns true when the whole WQE is requested.
// Asked for again after a loss (going back N over PSNs requested before), it asks for no
// more response packets than the window has room for (a request draws its responses whole,
// whatever the window). Under a periodic loss (SOFTRDMA_NETEM every=7) a 7-packet READ lost its
// first response on every re-request — the responder's drop counter came back to the same place —
// until retry_cnt ran out; re-requests that follow the window shift it.
bool send_read_request(QueuePair& qp, SendWqe& w, Transport& t) {
  const uint64_t off = qp.req.offset;
  uint64_t max_bytes = UINT64_MAX;
  if (wire::psn_diff(qp.req.psn, qp.req.max_psn) < 0)
    max_bytes = uint64_t(std::max(1, window_room(qp))) * qp.mtu;
  const uint64_t chunk = emit_read_request(qp, w, t, qp.req.psn, off, max_bytes);
  note_paced(qp, t, 0, chunk);
  const uint32_t n = psns_for(chunk, qp.mtu);
  qp.comp.rd_atomic_inflight.push_back(wire::psn_add(qp.req.psn, n - 1));
  note_sent(qp, t, n);
  qp.req.offset = off + chunk;
  return qp.req.offset >= w.length;
}

void emit_atomic(QueuePair& qp, SendWqe& w, Transport& t, uint32_t psn) {
  const bool cas = w.wr.opcode == WrOpcode::kCompareSwap;
  wire::Headers h = base_headers(qp, w, t, w.info().only, psn);
  h.atomic.va = w.wr.remote_addr;
  h.atomic.rkey = w.wr.rkey;
  h.atomic.swap_add = cas ? w.wr.swap : w.wr.compare_add;
  h.atomic.compare = cas ? w.wr.compare_add : 0;
  h.bth.ack_req = true;
  t.transmit(h, qp.remote_ip, {}, 0);
  note_inband(qp, wire::psn_add(psn, 1));
}

void send_atomic(QueuePair& qp, SendWqe& w, Transport& t) {
  emit_atomic(qp, w, t, qp.req.psn);
  note_paced(qp, t, 0);
  qp.comp.rd_atomic_inflight.push_back(qp.req.psn);
  note_sent(qp, t, 1);
}

}  // namespace

double pacing_rate_now(const QueuePair& qp) {
  return qp.req.cc_on ? qp.req.rate.rate() : window_pacing_rate(qp);
}

uint64_t find_wqe(QueuePair& qp, uint32_t psn) {
  // Started WQEs are a prefix of the SQ (WQEs start in order; a rewind keeps their PSNs).
  uint64_t lo = qp.sq_base, hi = qp.sq_end();
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (qp.wqe(mid).started)
      lo = mid + 1;
    else
      hi = mid;
  }
  hi = lo;
  lo = qp.sq_base;
  const uint32_t base = qp.comp.psn;  // every started WQE's PSNs lie at or after it, or end
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (wire::psn_diff(qp.wqe(mid).last_psn(), base) < wire::psn_diff(psn, base))
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == qp.sq_end() || !qp.wqe(lo).started) return qp.sq_end();
  const SendWqe& w = qp.wqe(lo);
  if (wire::psn_diff(psn, w.first_psn) < 0 || wire::psn_diff(psn, w.last_psn()) > 0)
    return qp.sq_end();
  return lo;
}

namespace {

// UC and UD: every WQE goes out whole, at once, each packet once — no window, no ACK, no
// timer (IBTA 9.8, 9.9: unreliable services). The QP completes the WQEs sent whole after the
// flush (QueuePair::transmit_pending_requests).
void run_unreliable(QueuePair& qp, Transport& t) {
  const QpTypeInfo& type = qp.type_info();
  std::vector<iovec> iov;
  while (qp.req.next < qp.sq_end()) {
    SendWqe& w = qp.wqe(qp.req.next);
    if (!w.started) {
      if (qp.attr.state == QpState::kSqd) break;
      if (!resolve_local(qp, w, t)) {
        if (qp.req.next == qp.sq_base) qp.enter_error(WcStatus::kLocProtErr);
        break;
      }
      w.started = true;
      w.first_psn = qp.req.psn;
      w.npsn = psns_for(w.length, qp.mtu);
      qp.req.offset = 0;
      if (type.single_packet && w.length > qp.mtu) {
        // IBTA C10-93.1.1: a UD message over the port MTU emits no packet and raises no
        // error (rxe fakes a successful send; so do we, and count it).
        bump(t.counters().ud_send_too_long);
        log().debug("qp {:#x}: UD message of {} B over the MTU of {} B: not sent", qp.qpn(),
                    w.length, qp.mtu);
        qp.req.psn = wire::psn_add(qp.req.psn, 1);
        ++qp.req.next;
        continue;
      }
    }
    while (qp.req.offset < w.length || (w.length == 0 && qp.req.offset == 0)) {
      const uint64_t off = qp.req.offset;
      const uint32_t pay = emit_data_packet(qp, w, t, iov, qp.req.psn, off, false);
      qp.req.psn = wire::psn_add(qp.req.psn, 1);
      qp.req.offset = off + pay;
      if (w.length == 0) break;
    }
    ++qp.req.next;
    qp.req.offset = 0;
  }
}

}  // namespace

uint32_t held_psns(const QueuePair& qp) {
  if (qp.comp.sack_epsn == kNoPsn) return 0;
  const int64_t span = wire::psn_diff(qp.req.psn, qp.comp.psn);
  const int64_t held = int64_t{qp.comp.sack_held} - wire::psn_diff(qp.comp.psn, qp.comp.sack_epsn);
  return static_cast<uint32_t>(std::clamp<int64_t>(held, 0, std::max<int64_t>(span, 0)));
}

namespace {

// After a run of run() that sent something at `now`: new PSNs sent by a sender that had run
// out of work (RequesterState::ran_dry) and sent nothing for longer than
// CongestionWindow::idle_gap_ns() start a flight (RequesterState::flight_psn), whose ACK
// train is timed from its own first ACK, not from an ACK of what left before the pause. A
// sender held by its window is not idle: what it sends as the ACKs come back is the next
// round's flight, whose train begins a smallest RTT after the last one (note_train).
void note_flight(QueuePair& qp, uint32_t psn_before, uint64_t now) {
  const uint64_t gap = qp.req.window.idle_gap_ns();
  if (qp.req.psn != psn_before && qp.req.ran_dry && qp.req.last_send_ns && gap &&
      now - qp.req.last_send_ns > gap) {
    qp.req.flight_psn = psn_before;
  }
  qp.req.last_send_ns = now;
}

}  // namespace

void run(QueuePair& qp, Transport& t) {
  if (qp.attr.state != QpState::kRts && qp.attr.state != QpState::kSqd) return;
  if (qp.req.rnr_wait()) return;
  const QpTypeInfo& type = qp.type_info();
  if (!type.reliable) return run_unreliable(qp, t);
  if (!qp.req.cc_checked) {
    qp.req.cc_checked = true;
    DcqcnParams p;
    qp.req.cc_on = t.congestion_control(qp.remote_ip, p);
    if (qp.req.cc_on) qp.req.rate = DcqcnRate(p);
    qp.req.window.set_host_local(t.host_local_path(qp.remote_ip, qp.peer_pid));
    qp.req.window.set_path_share(t.path_share(qp.remote_ip), qp.mtu);
    qp.req.window.set_validation(true);
  }
  // With work to send, on a long path: what the QPs towards this peer leave this one.
  if ((!qp.req.retx.empty() || qp.req.next < qp.sq_end()) && qp.req.window.long_path())
    qp.req.window.share_flight(
        qp.qpn(), static_cast<uint32_t>(std::max<int64_t>(in_flight_psns(qp), 0)), t.now_ns());
  const size_t max_rd = std::max<size_t>(1, qp.attr.max_rd_atomic);
  std::vector<iovec> iov;
  bool sent = false, paced = false;
  const uint32_t psn_before = qp.req.psn;
  // What selective NAKs reported missing goes first; it is inside the window already.
  while (!qp.req.retx.empty()) {
    PsnRange& r = qp.req.retx.front();
    if (wire::psn_diff(r.first, qp.comp.psn) < 0) r.first = qp.comp.psn;  // acknowledged since
    if (wire::psn_diff(r.last, r.first) < 0 || wire::psn_diff(r.first, qp.req.psn) >= 0) {
      qp.req.retx.pop_front();  // nothing left, or not sent since a rewind: sent anew below
      continue;
    }
    if ((paced = paced_out(qp, t) || held_back(qp, t))) break;
    const uint32_t n = resend(qp, t, r.first, /*ack_req=*/r.first == r.last);
    if (n == 0) {
      qp.req.retx.pop_front();
      continue;
    }
    sent = true;
    r.first = wire::psn_add(r.first, n);
  }
  while (!paced && qp.req.next < qp.sq_end()) {
    SendWqe& w = qp.wqe(qp.req.next);
    const bool local_op = w.info().cls == WrClass::kLocal;
    if (w.started && local_op) {
      ++qp.req.next;  // executed already (the requester went back over it)
      continue;
    }
    if (!w.started) {
      if (qp.attr.state == QpState::kSqd) break;  // draining: no new WQE starts
      // Fence: wait until every earlier READ/ATOMIC has its response (IBTA 10.8.3.3).
      if ((w.wr.flags & kFence) && !qp.comp.rd_atomic_inflight.empty()) break;
      if (local_op) {
        const WcStatus st = execute_local(qp, w, t);
        if (st != WcStatus::kSuccess) {
          // Completions are in order: the error is reported at the head.
          if (qp.req.next == qp.sq_base) qp.enter_error(st);
          break;
        }
        w.started = true;
        w.first_psn = qp.req.psn;
        w.npsn = 0;  // no packet: its PSN range is empty
        ++qp.req.next;
        qp.req.offset = 0;
        if (qp.req.next - 1 == qp.sq_base) qp.retire_send(WcStatus::kSuccess);
        continue;
      }
      if (!resolve_local(qp, w, t)) {
        // Completions are in order: report the error once all earlier WQEs are done.
        if (qp.req.next == qp.sq_base) qp.enter_error(WcStatus::kLocProtErr);
        break;
      }
      w.started = true;
      w.first_psn = qp.req.psn;
      w.npsn = w.info().cls == WrClass::kAtomic ? 1 : psns_for(w.length, qp.mtu);
      qp.req.offset = 0;
      w.placeable = placeable(qp, w);
      w.reth_each = reth_each(qp, w, t);
    } else if (qp.req.offset == 0 && qp.req.psn != w.first_psn) {
      log().error("qp {:#x}: requester at psn {:#x} but WQE {} starts at {:#x}", qp.qpn(),
                  qp.req.psn, qp.req.next, w.first_psn);
    }
    if (window_room(qp) <= 0) {
      qp.req.window.note_limited();
      break;
    }
    bool done = false;
    const WrOpcodeInfo& info = w.info();
    if (info.takes_rd_atomic_credit() && qp.comp.rd_atomic_inflight.size() >= max_rd) break;
    if (paced_out(qp, t) || held_back(qp, t)) break;
    if (qp.req.place_hold) {  // RequesterState::inband_starved
      if (inband_acked(qp)) {
        qp.req.place_hold = false;
        qp.req.inband_starved = 0;
      } else if (w.placeable && wire::psn_diff(qp.req.psn, qp.req.max_psn) >= 0) {
        break;  // the ACK of the in-band tail runs the requester again
      }
      // (a go-back-N resend is never held: it may be what that ACK waits for)
    }
    switch (info.cls) {
      case WrClass::kRead:
        done = send_read_request(qp, w, t);
        break;
      case WrClass::kAtomic:
        send_atomic(qp, w, t);
        done = true;
        break;
      case WrClass::kSend:
      case WrClass::kWrite:
        done = send_data_packet(qp, w, t, iov);
        break;
      case WrClass::kAtomicWrite:
        // One packet (RETH + the 8 bytes), answered by an ACK; it holds a credit till then.
        qp.comp.rd_atomic_inflight.push_back(qp.req.psn);
        done = send_data_packet(qp, w, t, iov);
        break;
      case WrClass::kLocal:  // executed when started, above
        done = true;
        break;
    }
    sent = true;
    if (done) {
      ++qp.req.next;
      qp.req.offset = 0;
    }
  }
  if (sent) {
    const uint64_t now = t.now_ns();
    qp.comp.last_progress_ns = now;
    note_flight(qp, psn_before, now);
    if (wire::psn_diff(qp.req.psn, qp.comp.psn) > 0 && !qp.comp.resend_check_ns &&
        qp.comp.peer_selective) {
      // Watch the oldest PSN (completer::on_timer): lost resends and lost selective NAKs.
      if (const uint64_t check = completer::resend_check_ns(qp)) {
        if (!qp.comp.head_since_ns) qp.comp.head_since_ns = now;
        qp.comp.resend_check_ns = now + check;
        t.timer_armed(qp, qp.comp.resend_check_ns);
      }
    }
    const uint64_t rto = qp.retransmit_timeout_ns();
    if (rto && !qp.comp.timer_ns) {
      qp.comp.timer_ns = now + rto;
      t.timer_armed(qp, qp.comp.timer_ns);
    }
    if (const uint64_t pto = completer::probe_timeout_ns(qp); pto && !qp.comp.probe_ns) {
      qp.comp.probe_ns = now + pto;  // lazy, as the retransmit timer
      t.timer_armed(qp, qp.comp.probe_ns);
    }
  }
  qp.req.ran_dry = qp.req.next == qp.sq_end();
}

void enter_recovery(QueuePair& qp, Recovery to, const char* cause) {
  const Recovery from = qp.req.recovery;
  if (to == Recovery::kNone)
    qp.req.recovery_end = kNoPsn;
  else if (to != Recovery::kRnrWait)
    qp.req.recovery_end = qp.req.max_psn;  // ends once all sent so far is acknowledged
  if (from == to) return;
  qp.req.recovery = to;
  log().debug(
      "qp {:#x}: recovery {} -> {} ({}; comp.psn {:#x} req.psn {:#x} cwnd {} srtt {} us "
      "min_rtt {} us)",
      qp.qpn(), recovery_name(from), recovery_name(to), cause, qp.comp.psn, qp.req.psn,
      qp.req.window.psns(), qp.req.window.srtt_ns() / 1000, qp.req.window.min_rtt_ns() / 1000);
}

bool on_local_drop(QueuePair& qp, uint32_t psn) {
  // Still outstanding and not already sent again (a later rewind or ACK moved past it)?
  if (wire::psn_diff(psn, qp.comp.psn) < 0 || wire::psn_diff(psn, qp.req.psn) >= 0) return false;
  const int32_t in_flight = wire::psn_diff(qp.req.psn, qp.comp.psn);
  qp.req.window.on_local_drop(static_cast<uint32_t>(std::max(in_flight, 1)));
  enter_recovery(qp, Recovery::kGoBackN, "request dropped on a full same-host ring");
  rewind(qp, psn);
  return true;
}

void rewind(QueuePair& qp, uint32_t psn) {
  uint64_t idx = find_wqe(qp, psn);
  uint64_t offset = 0;
  if (idx != qp.sq_end()) {
    const SendWqe& w = qp.wqe(idx);
    const uint32_t into = static_cast<uint32_t>(wire::psn_diff(psn, w.first_psn));
    offset = w.info().cls == WrClass::kAtomic ? 0 : uint64_t(into) * qp.mtu;
  } else {
    // Past every started WQE: the next one to start.
    idx = qp.req.next;
    while (idx > qp.sq_base && !qp.wqe(idx - 1).started) --idx;
    while (idx < qp.sq_end() && qp.wqe(idx).started) ++idx;
    if (idx > qp.sq_base && wire::psn_diff(psn, wire::psn_add(qp.wqe(idx - 1).last_psn(), 1)) != 0)
      log().error("qp {:#x}: rewind to psn {:#x}, which no started WQE holds", qp.qpn(), psn);
  }
  qp.req.next = idx;
  qp.req.offset = offset;
  qp.req.psn = psn;
  qp.req.noack_pkts = 0;
  qp.req.retx.clear();         // go-back-N sends everything from `psn` again anyway
  qp.comp.sack_epsn = kNoPsn;  // what the responder held may be sent again: count it in flight
  // Placed READ responses stay placed (pass_answered moves over them) and were counted.
  qp.comp.sack_counted = qp.comp.read_ahead;
  qp.comp.resent.clear();
  qp.comp.again_psn = kNoPsn;
  qp.comp.head_resent_before = kNoPsn;
  qp.comp.head_probe_end = kNoPsn;
  qp.comp.read_gap_end = qp.req.max_psn;  // READ responses from `psn` on are asked for again
  qp.comp.read_asks.clear();
  qp.req.timed_psn = kNoPsn;
  // Requests at or after `psn` will be sent again; their credits return now.
  auto& inflight = qp.comp.rd_atomic_inflight;
  while (!inflight.empty() && wire::psn_diff(inflight.back(), psn) >= 0) inflight.pop_back();
}

namespace {

// The packet that starts at `psn` once more (resend, probe): returns the PSNs it covers, 0
// when no started WQE holds `psn`.
uint32_t emit_again(QueuePair& qp, Transport& t, uint32_t psn, bool ack_req) {
  const uint64_t idx = find_wqe(qp, psn);
  if (idx == qp.sq_end()) return 0;
  SendWqe& w = qp.wqe(idx);
  const uint64_t off = uint64_t(wire::psn_diff(psn, w.first_psn)) * qp.mtu;
  uint32_t n = 1;
  uint64_t pay = 0;
  switch (w.info().cls) {
    case WrClass::kRead:
      n = psns_for(emit_read_request(qp, w, t, psn, off), qp.mtu);
      break;
    case WrClass::kAtomic:
      emit_atomic(qp, w, t, psn);
      break;
    case WrClass::kSend:
    case WrClass::kWrite:
    case WrClass::kAtomicWrite: {
      std::vector<iovec> iov;
      // AckReq at the end of each resent range (and on the resend check's resend of the
      // oldest PSN): the requester is waiting for its acknowledgement, and a responder that
      // already has it (its ACK was lost) re-acknowledges a duplicate only when asked (IBTA
      // 9.7.5.1.3). Without it, resends of a middle packet draw no answer and only the
      // retransmit timeout's go-back can — and a periodic loss can drop that one packet
      // every cycle until retry_cnt runs out (docs/performance.md). One per range is
      // enough: the ACK is cumulative.
      pay = emit_data_packet(qp, w, t, iov, psn, off, ack_req);
      break;
    }
    case WrClass::kLocal:  // holds no PSN: find_wqe never returns it
      return 0;
  }
  note_paced(qp, t, pay);
  bump(t.counters().retransmitted_pkts);
  // Karn's rule for the PSNs sent again only: a round trip timed on one of them would be
  // ambiguous. A timed PSN beyond them keeps its measurement, but the cumulative ACK that
  // passes it now waits for this repair too: only a selective ACK times it (timed_behind_gap).
  if (qp.req.timed_psn != kNoPsn) {
    const int32_t d = wire::psn_diff(qp.req.timed_psn, psn);
    if (d >= 0 && d < int32_t(n))
      qp.req.timed_psn = kNoPsn;
    else if (d > 0)
      qp.req.timed_behind_gap = true;
  }
  return n;
}

}  // namespace

uint32_t resend(QueuePair& qp, Transport& t, uint32_t psn, bool ack_req) {
  const uint32_t n = emit_again(qp, t, psn, ack_req);
  if (n == 0) return 0;
  bump(t.counters().selective_retransmitted_pkts);
  // Watch it: a resend lost too is sent again (completer::on_timer).
  const uint64_t now = t.now_ns();
  qp.comp.resent.push_back({psn, now, qp.req.max_psn});
  if (psn == qp.comp.psn) qp.comp.head_resent_before = qp.req.max_psn;
  if (const uint64_t check = completer::resend_check_ns(qp); check && !qp.comp.resend_check_ns) {
    qp.comp.resend_check_ns = now + check;
    t.timer_armed(qp, qp.comp.resend_check_ns);
  }
  return n;
}

uint32_t ask_read_responses(QueuePair& qp, Transport& t, uint32_t from, uint32_t to,
                            bool may_be_new) {
  const uint32_t first = from;
  uint32_t requests = 0;
  while (wire::psn_diff(to, from) > 0) {
    const uint64_t idx = find_wqe(qp, from);
    if (idx == qp.sq_end() || qp.wqe(idx).info().cls != WrClass::kRead) break;
    SendWqe& w = qp.wqe(idx);
    const uint32_t end = wire::psn_diff(to, w.last_psn()) > 0 ? wire::psn_add(w.last_psn(), 1) : to;
    if (w.read_placed_at(from)) {  // arrived already: the run starts after it
      from = wire::psn_add(from, 1);
      continue;
    }
    uint32_t run_end = wire::psn_add(from, 1);
    while (run_end != end && !w.read_placed_at(run_end)) run_end = wire::psn_add(run_end, 1);
    const uint64_t off = uint64_t(wire::psn_diff(from, w.first_psn)) * qp.mtu;
    const uint64_t bytes =
        std::min<uint64_t>(uint64_t(wire::psn_diff(run_end, from)) * qp.mtu, w.length - off);
    // Not new to the responder when a response or ACK beyond these PSNs came (no responder
    // executes a READ beyond one it has not; a softrdma responder in selective mode takes a
    // READ beyond a gap as lost): then no cut is needed where this request stops short.
    const uint64_t chunk = emit_read_request(qp, w, t, from, off, bytes, may_be_new);
    if (chunk == 0) break;
    note_paced(qp, t, 0);
    bump(t.counters().retransmitted_pkts);
    bump(t.counters().read_gap_requests);
    ++requests;
    const uint32_t asked_end = wire::psn_add(from, psns_for(chunk, qp.mtu));
    // Karn's rule for the PSNs asked for again only: a round trip timed on one of them would
    // be ambiguous.
    if (qp.req.timed_psn != kNoPsn && wire::psn_diff(qp.req.timed_psn, from) >= 0 &&
        wire::psn_diff(qp.req.timed_psn, asked_end) < 0)
      qp.req.timed_psn = kNoPsn;
    from = asked_end;
  }
  if (requests == 0) return 0;
  // Watch them: asked for once more when none came (completer::on_timer).
  const uint64_t now = t.now_ns();
  qp.comp.read_asks.push_back({first, to, now});
  if (const uint64_t check = completer::resend_check_ns(qp); check && !qp.comp.resend_check_ns) {
    qp.comp.resend_check_ns = now + check;
    t.timer_armed(qp, qp.comp.resend_check_ns);
  }
  return requests;
}

bool probe(QueuePair& qp, Transport& t) {
  if (wire::psn_diff(qp.req.psn, qp.comp.psn) <= 0 || qp.sq.empty() || !qp.sq.front().started)
    return false;
  const uint32_t last = (qp.req.psn - 1) & wire::kPsnMask;
  const uint64_t idx = find_wqe(qp, last);
  if (idx == qp.sq_end()) return false;
  bump(t.counters().tail_loss_probes);
  const uint64_t head_idx = find_wqe(qp, qp.comp.psn);
  if (t.selective_retransmit() && head_idx != qp.sq_end() &&
      qp.wqe(head_idx).info().cls == WrClass::kRead) {
    // Selective mode, a READ at the oldest unanswered PSN: nothing came for two round trips,
    // so what its chunk still misses from there was lost — its responses, or the request
    // itself (or its resend) — and is asked for alone (may_be_new: the responder may not
    // have executed it). A responder in selective mode answers it whichever was lost, where
    // the tail's request would only be deferred behind the gap, unanswered (responder.cpp
    // on_out_of_order). Going back instead re-requested every response from the gap on
    // (bench/wan_bench.sh WAN_OP=read: half the recovery episodes of a lossless 1 Gbit/s ×
    // 20 ms stream ended so, each drawing ~900 PSNs again).
    const SendWqe& head = qp.wqe(head_idx);
    const uint64_t off = uint64_t(wire::psn_diff(qp.comp.psn, head.first_psn)) * qp.mtu;
    uint32_t end = wire::psn_add(head.first_psn, psns_for(read_chunk_end(qp, head, off), qp.mtu));
    if (wire::psn_diff(end, qp.req.psn) > 0) end = qp.req.psn;
    if (ask_read_responses(qp, t, qp.comp.psn, end, /*may_be_new=*/true) != 0) {
      log().debug("qp {:#x}: tail-loss probe: READ responses {:#x}…{:#x} asked for", qp.qpn(),
                  qp.comp.psn, wire::psn_add(end, wire::kPsnMask));
      if (qp.req.recovery == Recovery::kNone)
        enter_recovery(qp, Recovery::kProbe, "no response for the probe timeout");
      return true;
    }
  }
  const SendWqe& tail = qp.wqe(idx);
  if (tail.info().read_or_atomic) {
    log().debug("qp {:#x}: tail-loss probe: back to psn {:#x} (a READ or atomic at the tail)",
                qp.qpn(), qp.comp.psn);
    enter_recovery(qp, Recovery::kGoBackN, "tail-loss probe with a READ or atomic at the tail");
    rewind(qp, qp.comp.psn);
    run(qp, t);
    return true;
  }
  // To a responder that has sent selective NAKs, the last PSN (RACK-TLP): its selective ACK
  // names every hole. No selective NAK came otherwise: the responder may be go-back-N (IBTA
  // 9.7.5.1.2, rxe, a NIC), which NAKs a gap once and then drops what follows in silence. If
  // that NAK was lost, the last PSN draws nothing (not below the highest it saw since), and
  // only the retransmit timeout would recover. The oldest unacknowledged PSN draws an answer
  // whatever was lost: a duplicate is ACKed with the responder's expected PSN - 1, the
  // expected one itself is taken and ACKed; an ACK that stops short of what was sent before
  // the probe then starts go-back-N from there (note_progress).
  const bool to_head =
      !qp.comp.peer_selective && head_idx != qp.sq_end() && !qp.wqe(head_idx).info().read_or_atomic;
  const uint32_t psn = to_head ? qp.comp.psn : last;
  log().debug(
      "qp {:#x}: tail-loss probe: psn {:#x} again (oldest unacknowledged {:#x}, last {:#x})",
      qp.qpn(), psn, qp.comp.psn, last);
  if (emit_again(qp, t, psn, /*ack_req=*/true) == 0) return false;
  if (to_head) qp.comp.head_probe_end = qp.req.max_psn;
  if (qp.req.recovery == Recovery::kNone)
    enter_recovery(qp, Recovery::kProbe, "no ACK for the probe timeout");
  return true;
}

}  // namespace softrdma::engine::requester
