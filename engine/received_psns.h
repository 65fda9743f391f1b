// What a responder doing selective retransmission knows beyond its expected PSN: which
// PSNs it has placed out of order, which it has reported missing, where the WRITE messages
// they belong to go. IRN (Mittal et al., SIGCOMM 2018, section 3.2): "the receiver keeps a
// bitmap of the packets it received out of order and places them directly". A type of its
// own so the responder reads as steps, and so it can be tested alone.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "engine/congestion_window.h"
#include "engine/types.h"
#include "wire/roce.h"

namespace softrdma::engine {

/// A closed range of PSNs [first, last], 24-bit serial numbers (first ≤ last in PSN order).
struct PsnRange {
  uint32_t first = 0;
  uint32_t last = 0;
};

/// Where a WRITE message's packets go: its first PSN, first byte and length (from the RETH
/// of its first packet); middle and last packets carry no RETH (IBTA 9.3.3), so they are
/// placed from this.
struct WritePlacement {
  uint32_t first_psn = 0;
  uint8_t* base = nullptr;  ///< host address of the message's first byte
  uint64_t length = 0;      ///< RETH DMA length, bytes
  uint32_t npsn = 1;        ///< PSNs of the message
  uint32_t rkey = 0;        ///< RETH R_Key: each later packet is checked again (dereg)
  uint64_t va = 0;          ///< RETH virtual address of the first byte
};

/// A request kept beyond a gap whose effects need the in-order state: a SEND packet (its
/// receive WQE is taken in order, and the offset of a MIDDLE or LAST in it is known only from
/// the packets before) or the last packet of a WRITE with immediate data (it consumes a
/// receive WQE). Its parsed headers and a copy of its payload, executed as if it had just
/// arrived when the expected PSN reaches it (responder.cpp stage_early).
struct StagedRequest {
  wire::Headers hdr;
  const wire::OpcodeInfo* info = nullptr;
  std::vector<uint8_t> payload;  ///< data bytes, pad excluded
  /// The packet to execute (its payload points into this object).
  wire::Packet packet() const { return {hdr, info, payload}; }
};

/// PSN states beyond the expected PSN, as ring bitmaps (placed, ends-a-message, reported,
/// contested: 1 bit each) and a digest (4 bytes) per PSN, indexed by PSN mod span(). The
/// span is a power of two (so it divides 2^24 and the ring stays consistent across the PSN
/// wrap) that grows on demand with the distance actually seen beyond the expected PSN
/// (reach()): kMinSpanPsns at first, doubled until it covers the farthest packet kept, never
/// beyond max_span() (kMaxSpanPsns = the requester's largest window, 2^22, unless the
/// transport sets less); it goes back to kMinSpanPsns when nothing is beyond the expected
/// PSN and the span has not been needed for a second (shrink_when_idle()). Memory: 4.5 bytes per
/// PSN of span (memory_bytes()) — 4.5 KiB at first, 288 KiB at 2^16 PSNs, 18 MiB at 2^22 — plus at
/// most kMaxWrites WRITE records and the staged requests' copies (at most max_staged_bytes); a QP
/// pays for the distance its losses opened, not for the largest window. Every operation is O(1) or
/// O(log messages) — no scan over the window per packet; first_marked() scans words of 64 PSNs,
/// bounded by the gap it reports; ranges are marked and cleared a word at a time; growing copies
/// the set bits, O(span / 64 + set bits), amortised over the doubling.
class ReceivedPsns {
 public:
  /// The first span, PSNs (4.5 KiB of ring).
  static constexpr uint32_t kMinSpanPsns = 1u << 10;
  /// The largest span, PSNs: the requester's largest window (CongestionWindow::kMaxPsns).
  static constexpr uint32_t kMaxSpanPsns = CongestionWindow::kMaxPsns;
  /// Ring bytes per PSN of span: four bitmaps (4 bits) and a 32-bit digest.
  static constexpr double kBytesPerPsn = 4.0 / 8 + 4;
  /// WRITE messages remembered at most by default (a FIRST packet beyond them is not placed
  /// out of order: it is refused and resent in order): the device's max_qp_wr, so a softrdma
  /// requester's whole SQ of WRITEs stays placeable whatever their size (kv keeps up to
  /// 32,768 WRITEs of 32 KiB outstanding on a long path). ~100 bytes each in the map, held
  /// only while a gap keeps them.
  static constexpr size_t kMaxWrites = DeviceLimits::kMaxQpWr;
  /// Payload bytes of staged requests held at most by default (StagedRequest; beyond, a SEND
  /// is refused and resent as a go-back-N responder's would be): 1 GiB. What waits is what
  /// arrives while the oldest gap is repaired, 1-2 round trips of the link's rate: ~60-125 MB
  /// of SENDs at 10 Gbit/s × 50 ms, ~0.6-1.2 GB at 100 Gbit/s (a cap of 64 MiB refused 92 %
  /// of a 10 Gbit/s × 50 ms SEND stream's packets at 1 % loss). Allocated only
  /// while SENDs wait behind a gap.
  static constexpr size_t kMaxStagedBytes = size_t{1} << 30;

  /// `max_span`: the largest span, PSNs (rounded down to a power of two within
  /// kMinSpanPsns … kMaxSpanPsns).
  /// `max_staged_bytes`: payload bytes stage() keeps at most.
  /// `max_writes`: WRITE records add_write() keeps at most.
  explicit ReceivedPsns(uint32_t max_span = kMaxSpanPsns, size_t max_staged_bytes = kMaxStagedBytes,
                        size_t max_writes = kMaxWrites)
      : max_span_(std::bit_floor(std::clamp(max_span, kMinSpanPsns, kMaxSpanPsns))),
        max_staged_bytes_(max_staged_bytes),
        max_writes_(max_writes) {
    allocate(kMinSpanPsns);
  }

  /// PSNs the ring covers now, from the expected PSN on.
  uint32_t span() const { return span_; }
  /// PSNs the ring may grow to cover.
  uint32_t max_span() const { return max_span_; }
  /// Bytes the ring holds now (span() × kBytesPerPsn; the WRITE records apart).
  size_t memory_bytes() const {
    return (placed_.size() + ends_.size() + reported_.size() + contested_.size()) * 8 +
           digest_.size() * 4;
  }
  /// Makes the ring cover the PSN `distance` beyond the expected PSN `epsn` (after sync(epsn)
  /// and before any state is set there), keeping every state: doubles the span until it
  /// does. False when `distance` ≥ max_span(): that PSN cannot be kept. `now_ns`: when (a
  /// distance over half the span keeps it from shrinking for kKeepSpanNs).
  bool reach(uint32_t epsn, uint32_t distance, uint64_t now_ns) {
    if (distance >= max_span_) return false;
    if (distance >= span_ / 2) wide_ns_ = now_ns;
    if (distance < span_) return true;
    resize(epsn, std::bit_ceil(distance + 1));
    return true;
  }
  /// A span over kMinSpanPsns is kept this long after a packet last needed over half of it,
  /// ns: a responder whose losses recur keeps its ring, and forged packets far ahead, each
  /// followed by the genuine stream, cost no 18 MiB allocation apiece (~2.6 ms measured).
  static constexpr uint64_t kKeepSpanNs = 1'000'000'000;
  /// Nothing beyond the expected PSN (next == epsn, every state clear): the ring goes back
  /// to kMinSpanPsns once its span has not been needed for kKeepSpanNs, so a QP holds a
  /// large span only while its losses keep opening one.
  void shrink_when_idle(uint64_t now_ns) {
    if (span_ > kMinSpanPsns && now_ns - wide_ns_ >= kKeepSpanNs) allocate(kMinSpanPsns);
  }

  /// Placed out of order (its data is in memory; its in-order effects are pending).
  bool placed(uint32_t psn) const { return get(placed_, psn); }
  /// Fingerprint of the copy placed at `psn` (valid while placed(psn)): wire::crc32 of its
  /// opcode, RETH and payload (responder.cpp fingerprint()).
  uint32_t digest(uint32_t psn) const { return digest_[psn & mask_]; }
  /// Two different copies of this PSN arrived out of order — at least one forged: it is
  /// accepted in order only (its placement is forgotten, its data will be written again).
  bool contested(uint32_t psn) const { return get(contested_, psn); }
  /// The placed packet ends a message (last/only): the MSN advances when it is consumed.
  bool ends_message(uint32_t psn) const { return get(ends_, psn); }
  /// Reported missing by a selective NAK and not yet arrived.
  bool reported(uint32_t psn) const { return get(reported_, psn); }

  /// PSNs placed now (placed() true): what a selective ACK reports held beyond the
  /// expected PSN. O(1): kept as bits change.
  uint32_t placed_count() const { return placed_count_; }

  void mark_placed(uint32_t psn, bool ends, uint32_t digest) {
    set_placed(psn, true);
    set(ends_, psn, ends);
    set(reported_, psn, false);
    digest_[psn & mask_] = digest;
  }
  /// Forgets the placement of `psn` (its memory stays as written) and makes it in-order
  /// only; the WRITE message it began, if any, is forgotten too.
  void mark_contested(uint32_t psn) {
    set_placed(psn, false);
    set(ends_, psn, false);
    set(contested_, psn, true);
    erase_write(psn);
    unstage(psn);
  }
  /// Forgets the placement of `psn` alone (it is missing again).
  void unplace(uint32_t psn) {
    set_placed(psn, false);
    set(ends_, psn, false);
    unstage(psn);
  }
  void mark_reported(uint32_t psn, bool on) { set(reported_, psn, on); }
  /// Marks the PSNs [first, last] reported (at most span() of them), a word at a time.
  void mark_reported_range(uint32_t first, uint32_t last) {
    for_words(first, wire::psn_add(last, 1), [&](uint32_t w, uint64_t m) { reported_[w] |= m; });
  }
  /// Forgets every state of `psn` (consumed in order, or behind the expected PSN).
  void clear(uint32_t psn) {
    set_placed(psn, false);
    set(ends_, psn, false);
    set(reported_, psn, false);
    set(contested_, psn, false);
    unstage(psn);
  }
  /// Forgets every state of the PSNs in [from, to) (at most span() of them) and the WRITE
  /// messages that begin there (after sync()). Returns how many of them were placed.
  /// O(words + messages).
  uint32_t clear_range(uint32_t from, uint32_t to) {
    uint32_t placed = 0;
    for_words(from, to, [&](uint32_t w, uint64_t m) {
      placed += static_cast<uint32_t>(__builtin_popcountll(placed_[w] & m));
      for (auto* v : {&placed_, &ends_, &reported_, &contested_}) (*v)[w] &= ~m;
    });
    const uint64_t lo = unwrap(from), hi = unwrap(to);
    writes_.erase(writes_.lower_bound(lo), writes_.lower_bound(hi));
    for (auto it = staged_.lower_bound(lo); it != staged_.end() && it->first < hi;) {
      staged_bytes_ -= it->second.payload.size();
      it = staged_.erase(it);
    }
    placed_count_ -= placed;
    return placed;
  }
  /// The first PSN in [from, to) that is placed or reported, or `to` if none.
  uint32_t first_marked(uint32_t from, uint32_t to) const {
    return first_where(from, to, [this](uint32_t w) { return placed_[w] | reported_[w]; });
  }
  /// The first PSN in [from, to) that is placed, or `to` if none.
  uint32_t first_placed(uint32_t from, uint32_t to) const {
    return first_where(from, to, [this](uint32_t w) { return placed_[w]; });
  }
  /// The first PSN in [from, to) that is not placed, or `to` if none.
  uint32_t first_unplaced(uint32_t from, uint32_t to) const {
    return first_where(from, to, [this](uint32_t w) { return ~placed_[w]; });
  }
  /// The runs of PSNs not placed in [from, next), oldest first, at most `max` of them, as
  /// closed ranges: what a selective ACK lists as missing (wire::SackReport). Calls
  /// f(first, last) for each. O(words scanned): the PSNs up to the max-th run's end.
  template <typename F>
  void missing_runs(uint32_t from, uint32_t max, F&& f) const {
    uint32_t p = from;
    for (uint32_t n = 0; n < max; ++n) {
      const uint32_t first = first_unplaced(p, next);
      if (first == next) return;
      p = first_placed(first, next);
      f(first, wire::psn_add(p, wire::kPsnMask));
    }
  }

  /// One past the highest PSN seen out of order or reported (PSNs from the expected one up
  /// to here are placed, reported or pending a report); equals the expected PSN when idle.
  uint32_t next = 0;

  // ---- WRITE messages, keyed by their first PSN unwrapped to 64 bits --------------------
  /// Re-anchors the 64-bit unwrapping at the expected PSN (call before the lookups below,
  /// whenever the expected PSN may have moved).
  void sync(uint32_t epsn) {
    anchor64_ += static_cast<int64_t>(wire::psn_diff(epsn, anchor_));
    anchor_ = epsn;
  }
  /// Whether add_write() has room for another WRITE record.
  bool write_room() const { return writes_.size() < max_writes_; }
  /// Remembers a WRITE message (no-op when max_writes are held: then none of its packets may
  /// be placed out of order — place_early checks write_room() before it places a FIRST).
  void add_write(const WritePlacement& w) {
    if (write_room()) writes_[unwrap(w.first_psn)] = w;
  }
  /// Forgets the WRITE message that begins at `first_psn`, if one is remembered.
  void erase_write(uint32_t first_psn) { writes_.erase(unwrap(first_psn)); }
  /// The remembered WRITE message that begins at `first_psn`, or nullptr.
  const WritePlacement* write_at(uint32_t first_psn) const {
    auto it = writes_.find(unwrap(first_psn));
    return it == writes_.end() ? nullptr : &it->second;
  }
  /// The remembered WRITE message whose PSNs include `psn`, or nullptr.
  const WritePlacement* write_holding(uint32_t psn) const {
    const uint64_t u = unwrap(psn);
    auto it = writes_.upper_bound(u);
    if (it == writes_.begin()) return nullptr;
    --it;
    return u < it->first + it->second.npsn ? &it->second : nullptr;
  }
  // ---- Staged requests (StagedRequest), keyed by PSN unwrapped to 64 bits ----------------
  /// Keeps a copy of `pkt` (at `psn`, beyond the expected PSN) to execute in order; the
  /// caller marks the PSN placed. False, keeping nothing, when its payload would take the
  /// staged bytes over the constructor's max_staged_bytes.
  bool stage(uint32_t psn, const wire::Packet& pkt) {
    if (staged_bytes_ + pkt.payload.size() > max_staged_bytes_) return false;
    StagedRequest& r = staged_[unwrap(psn)];
    staged_bytes_ -= r.payload.size();
    r.hdr = pkt.hdr;
    r.info = pkt.info;
    r.payload.assign(pkt.payload.begin(), pkt.payload.end());
    staged_bytes_ += r.payload.size();
    return true;
  }
  /// Whether a request is staged at `psn`.
  bool staged(uint32_t psn) const { return !staged_.empty() && staged_.count(unwrap(psn)); }
  /// Takes the request staged at `psn` out (its PSN states stay), or nullopt.
  std::optional<StagedRequest> take_staged(uint32_t psn) {
    auto it = staged_.empty() ? staged_.end() : staged_.find(unwrap(psn));
    if (it == staged_.end()) return std::nullopt;
    StagedRequest r = std::move(it->second);
    staged_.erase(it);
    staged_bytes_ -= r.payload.size();
    return r;
  }
  /// Payload bytes staged now (at most the constructor's max_staged_bytes).
  size_t staged_bytes() const { return staged_bytes_; }

  /// Forgets WRITE messages that end before `epsn` (after sync(epsn)).
  void drop_writes_before(uint32_t epsn) {
    const uint64_t u = unwrap(epsn);
    while (!writes_.empty() && writes_.begin()->first + writes_.begin()->second.npsn <= u)
      writes_.erase(writes_.begin());
  }

 private:
  static_assert(std::has_single_bit(kMaxSpanPsns) && (wire::kPsnMask + 1) % kMaxSpanPsns == 0,
                "the ring must divide the PSN space");
  static_assert(kMaxSpanPsns <= (wire::kPsnMask + 1) / 4,
                "below 2^23: ahead and behind stay distinct (IBTA 9.7.1)");
  // The first PSN in [from, to) whose bit is set in word_of(w), the ring's word w of some
  // combination of the bitmaps, or `to` if none. O(words scanned).
  template <typename W>
  uint32_t first_where(uint32_t from, uint32_t to, W&& word_of) const {
    uint32_t p = from;
    while (wire::psn_diff(to, p) > 0) {
      const uint32_t i = p & mask_;
      const uint64_t word = word_of(i / 64) >> (i % 64);
      if (word) {
        const uint32_t q = wire::psn_add(p, static_cast<uint32_t>(__builtin_ctzll(word)));
        return wire::psn_diff(to, q) > 0 ? q : to;
      }
      p = wire::psn_add(p, 64 - i % 64);
    }
    return to;
  }
  bool get(const std::vector<uint64_t>& v, uint32_t psn) const {
    const uint32_t i = psn & mask_;
    return (v[i / 64] >> (i % 64)) & 1;
  }
  void set_placed(uint32_t psn, bool on) {
    if (get(placed_, psn) == on) return;
    set(placed_, psn, on);
    placed_count_ = on ? placed_count_ + 1 : placed_count_ - 1;
  }
  void set(std::vector<uint64_t>& v, uint32_t psn, bool on) const {
    const uint32_t i = psn & mask_;
    const uint64_t bit = uint64_t{1} << (i % 64);
    v[i / 64] = on ? (v[i / 64] | bit) : (v[i / 64] & ~bit);
  }
  // Calls f(word, mask) for the ring words that hold the PSNs [from, to), in order.
  template <typename F>
  void for_words(uint32_t from, uint32_t to, F&& f) const {
    uint32_t p = from;
    while (wire::psn_diff(to, p) > 0) {
      const uint32_t i = p & mask_;
      const uint32_t n = std::min<uint32_t>(64 - i % 64, uint32_t(wire::psn_diff(to, p)));
      f(i / 64, (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1)) << (i % 64));
      p = wire::psn_add(p, n);
    }
  }
  // A fresh ring of `span` PSNs, every state clear.
  void allocate(uint32_t span) {
    placed_count_ = 0;
    span_ = span;
    mask_ = span - 1;
    for (auto* v : {&placed_, &ends_, &reported_, &contested_}) v->assign(span / 64, 0);
    digest_.assign(span, 0);
    digest_.shrink_to_fit();
    for (auto* v : {&placed_, &ends_, &reported_, &contested_}) v->shrink_to_fit();
  }
  // Moves every state to a ring of `span` PSNs (larger): the PSN at old index i is the one
  // in [epsn, epsn + old span) that maps there.
  void resize(uint32_t epsn, uint32_t span) {
    ReceivedPsns to(max_span_);
    to.allocate(span);
    const auto move = [&](const std::vector<uint64_t>& from, std::vector<uint64_t>& into,
                          bool digests) {
      for (uint32_t w = 0; w < from.size(); ++w) {
        for (uint64_t bits = from[w]; bits; bits &= bits - 1) {
          const uint32_t i = w * 64 + static_cast<uint32_t>(__builtin_ctzll(bits));
          const uint32_t psn = wire::psn_add(epsn, (i - epsn) & mask_);
          to.set(into, psn, true);
          if (digests) to.digest_[psn & to.mask_] = digest_[i];
        }
      }
    };
    move(placed_, to.placed_, true);
    move(ends_, to.ends_, false);
    move(reported_, to.reported_, false);
    move(contested_, to.contested_, false);
    span_ = to.span_;
    mask_ = to.mask_;
    placed_ = std::move(to.placed_);
    ends_ = std::move(to.ends_);
    reported_ = std::move(to.reported_);
    contested_ = std::move(to.contested_);
    digest_ = std::move(to.digest_);
  }
  // Forgets the request staged at `psn`, if any.
  void unstage(uint32_t psn) { (void)take_staged(psn); }
  uint64_t unwrap(uint32_t psn) const {
    return anchor64_ + static_cast<int64_t>(wire::psn_diff(psn, anchor_));
  }

  uint32_t max_span_;
  size_t max_staged_bytes_;
  size_t max_writes_;
  uint64_t wide_ns_ = 0;  // when a packet last needed over half the span, ns
  uint32_t span_ = 0;     // PSNs, a power of two
  uint32_t mask_ = 0;     // span_ - 1
  std::vector<uint64_t> placed_, ends_, reported_, contested_;  // span_ / 64 words each
  std::vector<uint32_t> digest_;                                // per PSN mod span_
  uint32_t placed_count_ = 0;                                   // set bits of placed_
  std::map<uint64_t, WritePlacement> writes_;
  std::map<uint64_t, StagedRequest> staged_;  // by unwrapped PSN
  size_t staged_bytes_ = 0;                   // payload bytes in staged_
  uint32_t anchor_ = 0;
  uint64_t anchor64_ = uint64_t{1} << 40;  // far from 0: unwrapped PSNs never go negative
};

}  // namespace softrdma::engine
