// The control channel of VerbsTransport (internal to ccl/): the 128-byte descriptor every
// control SEND carries, the sizes of the per-peer control ring, and the credit scheme that
// keeps that ring from running dry (so no RNR NAK is ever needed). See verbs_transport.h for
// the protocol as a whole.
//
// Ring arithmetic, per QP (= per peer):
//  - kRing = kCredits + kReserved receive slots are posted, each holding one CtlMsg.
//  - Credited messages (adverts, eager transfers, barrier messages and the last write of a
//    send, whose immediate uses a slot too) spend one of the sender's kCredits credits. The
//    receiver returns a credit each time it reposts such a slot: piggybacked on its next
//    control message, or in a credit-only message once kCreditThreshold are owed. An eager
//    transfer that arrives before its recv is posted is copied out of the ring (the slot is
//    reposted at once) but its credit is returned only when a recv takes it, so a sender
//    can run at most kCredits unexpected eager transfers ahead of its receiver.
//  - Uncredited messages (credit, abort, goodbye) use the kReserved slots: a peer has at
//    most kCredits / kCreditThreshold unprocessed credit messages in flight (each returns at
//    least kCreditThreshold credits, and only kCredits exist), plus one abort and one goodbye
//    per lifetime, plus one spare.
//
// Channels (VerbsOptions::channels): a peer may have several RC QPs; channel 0 carries the
// control ring above and everything else, channels 1.. only the stripes of rendezvous
// writes. A stripe's WRITE WITH IMMEDIATE uses one receive WQE on its own QP, so each data
// channel posts kCredits zero-length receives and reposts each one as it completes. No
// credits of their own: a striped transfer spends one control credit, and the receiver
// returns it only once every stripe of the transfer arrived, so at most kCredits stripe
// immediates are ever unconsumed on any channel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ccl/ccl.h"

namespace softrdma::ccl::verbs {

/// Credited receive slots per peer.
inline constexpr int kCredits = 128;
/// Owed credits that trigger a credit-only message (when nothing else carries them back).
inline constexpr int kCreditThreshold = kCredits / 4;
/// Receive slots for uncredited messages (see the file comment).
inline constexpr int kReserved = kCredits / kCreditThreshold + 3;
/// Receive slots posted per peer.
inline constexpr int kRing = kCredits + kReserved;
/// Send WRs per QP (every WR is signalled; a control send holds one send slot too).
inline constexpr int kSqDepth = 128;
/// Bytes per control descriptor.
inline constexpr size_t kCtlBytes = 128;
/// Largest eager payload (VerbsOptions::eager_bytes), bytes: every ring and send slot holds
/// a descriptor plus this much, so the bound keeps the control memory per peer at
/// (kRing + kSqDepth) · (kCtlBytes + eager_bytes) ≤ 19 MiB.
inline constexpr size_t kMaxEagerBytes = 64 * 1024;

/// Send and recv requests in flight per peer (posted, not yet complete). Each request
/// spends exactly one credit (a recv its advert, a send its write with immediate), so more
/// than kCredits of them only wait in the peer's outbound queue; four ring-fulls keep the
/// ring busy while the queue drains, and equal 2 × Config's largest depth (a ring of two
/// ranks has depth sends and depth recvs in flight to the same peer), so no collective is
/// ever throttled by it. A send() or recv() that finds the limit reached, or the peer's
/// outbound queue holding this many entries, progresses the transport until a request of
/// that peer completes or the queue drains (back-pressure, like a full send queue) instead
/// of growing them; a barrier message waits for queue room the same way. So per peer: at
/// most this many requests in flight; an outbound queue of at most twice this many entries
/// (posters stop at this many; completions add at most one write per pending send); and at
/// most this many entries in the peer's advert, waiting-send and receive tables. Transfers
/// to self are matched when posted and need no bound. Like a QP's max_send_wr this is part
/// of the contract: a program that posts more than this many recvs from a peer before the
/// peer can post its matching sends waits (and reports a stall after the timeout).
inline constexpr int kMaxRequestsPerPeer = 4 * kCredits;
static_assert(kMaxRequestsPerPeer >= 2 * Config::kMaxDepth,
              "a collective at the deepest Config must never wait for request slots");

/// Largest VerbsOptions::channels (RC QPs per peer); wr_id holds the channel in 4 bits.
inline constexpr int kMaxChannels = 16;
/// Stripe boundaries are multiples of this (bytes), so each stripe starts page-aligned in
/// page-aligned buffers and whole MTU-sized packets.
inline constexpr uint64_t kStripeAlign = 4096;

/// Stripes a rendezvous transfer of `bytes` is split into over `channels` QPs, each at
/// least `min_bytes` long: min(channels, bytes / min_bytes), at least 1. The receiver
/// decides (it puts the count in its advert); the sender follows it with stripe_range().
constexpr uint32_t stripe_count(uint64_t bytes, uint32_t channels, uint64_t min_bytes) {
  const uint64_t fit = min_bytes ? bytes / min_bytes : channels;
  return static_cast<uint32_t>(fit < 1 ? 1 : (fit < channels ? fit : channels));
}

/// Stripe `i` of `stripes` over a transfer of `bytes`: [begin, end), contiguous, each
/// ceil(bytes / stripes) rounded up to kStripeAlign long except the last (which may be
/// shorter, or empty when stripes · kStripeAlign exceeds bytes: an empty stripe is still one
/// zero-length write with immediate).
struct StripeRange {
  uint64_t begin;
  uint64_t end;
};
constexpr StripeRange stripe_range(uint64_t bytes, uint32_t stripes, uint32_t i) {
  const uint64_t per = (bytes + stripes - 1) / stripes;
  const uint64_t len = (per + kStripeAlign - 1) / kStripeAlign * kStripeAlign;
  const uint64_t b = i * len < bytes ? i * len : bytes;
  const uint64_t e = (i + 1) * len < bytes ? (i + 1) * len : bytes;
  return {b, e};
}

/// Control message types.
enum class Ctl : uint32_t {
  kAdvert = 1,
  kCredit = 2,
  kBarrier = 3,
  kAbort = 4,
  kBye = 5,
  kEager = 6,  ///< a whole small transfer: the payload follows the descriptor in the SEND
};

/// One control descriptor (SEND payload). Same-architecture peers: host byte order.
struct CtlMsg {
  uint32_t type;
  uint32_t credits;  ///< credited slots the sender reposted since its last report
  uint64_t tag;      ///< advert, eager: tag
  uint64_t addr;     ///< advert: target address
  uint64_t length;   ///< advert, eager: bytes
  uint32_t rkey;     ///< advert: target rkey
  uint32_t id;       ///< advert: transfer id (the immediate); barrier: round; abort: dead rank
  uint64_t seq;      ///< barrier: sequence number
  uint32_t stripes;  ///< advert: write the transfer as this many stripes (stripe_range)
  char text[76];     ///< abort: reason (NUL-terminated)
};
static_assert(sizeof(CtlMsg) == kCtlBytes);

/// The credit state of one peer's control channel, seen from this rank: how many credited
/// slots of the peer's ring this rank may still fill, and how many slots of its own ring it
/// reposted without telling the peer yet (UCX keeps this as a type of its own too,
/// uct_rc_fc_t).
class CreditRing {
 public:
  /// A credited message may be posted now.
  bool can_spend() const { return credits_ > 0; }
  /// A credited message was posted.
  void spend() { --credits_; }
  /// The peer reports `n` of our credited messages processed and their slots reposted.
  void returned(uint32_t n) { credits_ += static_cast<int>(n); }
  /// One credited slot of this rank's ring was consumed and reposted.
  void reposted() { ++owed_; }
  /// Enough credits are owed to send them back in a message of their own.
  bool return_due() const { return owed_ >= kCreditThreshold; }
  /// The owed credits, to piggyback on an outgoing message (owed becomes 0).
  uint32_t take_owed() {
    const auto n = static_cast<uint32_t>(owed_);
    owed_ = 0;
    return n;
  }
  /// Gives back what take_owed() returned when the message carrying it was not posted.
  void untake_owed(uint32_t n) { owed_ += static_cast<int>(n); }

 private:
  int credits_ = kCredits;
  int owed_ = 0;
};

/// Largest number of ranks (the peer field of a wr_id).
inline constexpr int kMaxRanks = 1 << 16;

/// wr_id layout: kind (4 bits) | channel (4 bits) | peer (16 bits) | index (40 bits). The
/// index is the ring slot (kRecv on channel 0; 0 on data channels), the send slot (kCtl) or
/// the RequestId (kWrite).
enum class Kind : uint64_t { kRecv = 0, kCtl = 1, kWrite = 2, kProbe = 3 };
constexpr uint64_t make_wr_id(Kind k, int peer, uint64_t index, int channel = 0) {
  return (static_cast<uint64_t>(k) << 60) | (static_cast<uint64_t>(channel & 0xf) << 56) |
         (static_cast<uint64_t>(peer & 0xffff) << 40) | (index & ((uint64_t{1} << 40) - 1));
}
constexpr Kind wr_kind(uint64_t wr_id) {
  return static_cast<Kind>(wr_id >> 60);
}
constexpr int wr_channel(uint64_t wr_id) {
  return static_cast<int>((wr_id >> 56) & 0xf);
}
constexpr int wr_peer(uint64_t wr_id) {
  return static_cast<int>((wr_id >> 40) & 0xffff);
}
constexpr uint64_t wr_index(uint64_t wr_id) {
  return wr_id & ((uint64_t{1} << 40) - 1);
}

}  // namespace softrdma::ccl::verbs
