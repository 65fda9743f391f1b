// What a responder doing selective retransmission knows beyond its expected PSN: which
// PSNs it has placed out of order, which it has reported missing, where the WRITE messages
// they belong to go. IRN (Mittal et al., SIGCOMM 2018, section 3.2): "the receiver keeps a
// bitmap of the packets it received out of order and places them directly". A type of its
// own so the responder reads as steps, and so it can be tested alone.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

#include "engine/congestion_window.h"
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
};

/// PSN states over a span of kSpanPsns beyond the expected PSN, as ring bitmaps indexed by
/// PSN mod kSpanPsns (which divides 2^24, so the ring stays consistent across the PSN
/// wrap). Every operation is O(1) or O(log messages) — no scan over the window per packet;
/// first_marked() scans words of 64 PSNs, bounded by the gap it reports.
class ReceivedPsns {
 public:
  /// PSNs tracked beyond the expected one: the requester's largest window.
  static constexpr uint32_t kSpanPsns = CongestionWindow::kMaxPsns;
  /// WRITE messages remembered at most (more are not placed out of order).
  static constexpr size_t kMaxWrites = 8192;

  ReceivedPsns()
      : placed_(kWords), ends_(kWords), reported_(kWords), contested_(kWords), digest_(kSpanPsns) {}

  /// Placed out of order (its data is in memory; its in-order effects are pending).
  bool placed(uint32_t psn) const { return get(placed_, psn); }
  /// Fingerprint of the copy placed at `psn` (valid while placed(psn)): wire::crc32 of its
  /// opcode, RETH and payload (responder.cpp fingerprint()).
  uint32_t digest(uint32_t psn) const { return digest_[psn % kSpanPsns]; }
  /// Two different copies of this PSN arrived out of order — at least one forged: it is
  /// accepted in order only (its placement is forgotten, its data will be written again).
  bool contested(uint32_t psn) const { return get(contested_, psn); }
  /// The placed packet ends a message (last/only): the MSN advances when it is consumed.
  bool ends_message(uint32_t psn) const { return get(ends_, psn); }
  /// Reported missing by a selective NAK and not yet arrived.
  bool reported(uint32_t psn) const { return get(reported_, psn); }

  void mark_placed(uint32_t psn, bool ends, uint32_t digest) {
    set(placed_, psn, true);
    set(ends_, psn, ends);
    set(reported_, psn, false);
    digest_[psn % kSpanPsns] = digest;
  }
  /// Forgets the placement of `psn` (its memory stays as written) and makes it in-order
  /// only; the WRITE message it began, if any, is forgotten too.
  void mark_contested(uint32_t psn) {
    set(placed_, psn, false);
    set(ends_, psn, false);
    set(contested_, psn, true);
    erase_write(psn);
  }
  /// Forgets the placement of `psn` alone (it is missing again).
  void unplace(uint32_t psn) {
    set(placed_, psn, false);
    set(ends_, psn, false);
  }
  void mark_reported(uint32_t psn, bool on) { set(reported_, psn, on); }
  /// Forgets every state of `psn` (consumed in order, or behind the expected PSN).
  void clear(uint32_t psn) {
    set(placed_, psn, false);
    set(ends_, psn, false);
    set(reported_, psn, false);
    set(contested_, psn, false);
  }
  /// Forgets every state of the PSNs in [from, to) (at most kSpanPsns of them) and the WRITE
  /// messages that begin there (after sync()). Returns how many of them were placed.
  /// O(words + messages).
  uint32_t clear_range(uint32_t from, uint32_t to) {
    uint32_t placed = 0;
    uint32_t p = from;
    while (wire::psn_diff(to, p) > 0) {
      const uint32_t i = p % kSpanPsns;
      const uint32_t n = std::min<uint32_t>(64 - i % 64, uint32_t(wire::psn_diff(to, p)));
      const uint64_t mask = (n == 64 ? ~uint64_t{0} : ((uint64_t{1} << n) - 1)) << (i % 64);
      placed += static_cast<uint32_t>(__builtin_popcountll(placed_[i / 64] & mask));
      for (auto* v : {&placed_, &ends_, &reported_, &contested_}) (*v)[i / 64] &= ~mask;
      p = wire::psn_add(p, n);
    }
    const uint64_t lo = unwrap(from), hi = unwrap(to);
    writes_.erase(writes_.lower_bound(lo), writes_.lower_bound(hi));
    return placed;
  }
  /// The first PSN in [from, to) that is placed or reported, or `to` if none.
  uint32_t first_marked(uint32_t from, uint32_t to) const {
    uint32_t p = from;
    while (wire::psn_diff(to, p) > 0) {
      const uint32_t i = p % kSpanPsns;
      const uint64_t word = (placed_[i / 64] | reported_[i / 64]) >> (i % 64);
      if (word) {
        const uint32_t q = wire::psn_add(p, static_cast<uint32_t>(__builtin_ctzll(word)));
        return wire::psn_diff(to, q) > 0 ? q : to;
      }
      p = wire::psn_add(p, 64 - i % 64);
    }
    return to;
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
  /// Remembers a WRITE message (no-op when kMaxWrites are held).
  void add_write(const WritePlacement& w) {
    if (writes_.size() < kMaxWrites) writes_[unwrap(w.first_psn)] = w;
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
  /// Forgets WRITE messages that end before `epsn` (after sync(epsn)).
  void drop_writes_before(uint32_t epsn) {
    const uint64_t u = unwrap(epsn);
    while (!writes_.empty() && writes_.begin()->first + writes_.begin()->second.npsn <= u)
      writes_.erase(writes_.begin());
  }

 private:
  static constexpr uint32_t kWords = kSpanPsns / 64;
  static_assert((wire::kPsnMask + 1) % kSpanPsns == 0, "the ring must divide the PSN space");
  static bool get(const std::vector<uint64_t>& v, uint32_t psn) {
    const uint32_t i = psn % kSpanPsns;
    return (v[i / 64] >> (i % 64)) & 1;
  }
  static void set(std::vector<uint64_t>& v, uint32_t psn, bool on) {
    const uint32_t i = psn % kSpanPsns;
    const uint64_t bit = uint64_t{1} << (i % 64);
    v[i / 64] = on ? (v[i / 64] | bit) : (v[i / 64] & ~bit);
  }
  uint64_t unwrap(uint32_t psn) const {
    return anchor64_ + static_cast<int64_t>(wire::psn_diff(psn, anchor_));
  }

  std::vector<uint64_t> placed_, ends_, reported_, contested_;
  std::vector<uint32_t> digest_;  // per PSN mod kSpanPsns (256 KiB)
  std::map<uint64_t, WritePlacement> writes_;
  uint32_t anchor_ = 0;
  uint64_t anchor64_ = uint64_t{1} << 40;  // far from 0: unwrapped PSNs never go negative
};

}  // namespace softrdma::engine
