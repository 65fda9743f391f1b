// RoCEv2 wire format: Base Transport Header and the extended transport headers of the
// RC, UC, UD and XRC transport services, the opcode table, PSN arithmetic and AETH
// syndromes.
//
// Source: IBTA InfiniBand Architecture Specification vol. 1 rel. 1.4, ch. 9 (transport
// layer: 9.2 BTH and table 38 of opcodes, 9.3.x extended headers, 9.3.2 DETH; XRCETH
// (annex A14, XRC) — 9.7.5 AETH syndromes, 9.7.2 RNR timer table) and Annex A17 (RoCEv2:
// IPv4/IPv6 + UDP destination port 4791, ICRC); rel. 1.5 for RDMA ATOMIC WRITE (RC 0x1D).
// The opcode table is data, as in Linux rxe's rxe_opcode.c: building and parsing a
// packet read it instead of switching on the opcode in every function.
//
// Everything here is a pure function on bytes: no I/O, no allocation. Multi-byte fields
// are big-endian on the wire; the structs below hold host-order values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace softrdma::wire {

/// UDP destination port of every RoCEv2 packet (IBTA Annex A17.2).
inline constexpr uint16_t kRoceV2Port = 4791;

inline constexpr size_t kBthBytes = 12;
inline constexpr size_t kRethBytes = 16;
inline constexpr size_t kAethBytes = 4;
inline constexpr size_t kAtomicEthBytes = 28;
inline constexpr size_t kAtomicAckEthBytes = 8;
inline constexpr size_t kImmDtBytes = 4;
inline constexpr size_t kIethBytes = 4;
inline constexpr size_t kDethBytes = 8;
inline constexpr size_t kXrcethBytes = 4;
inline constexpr size_t kIcrcBytes = 4;
/// Largest BTH + extended headers of any supported opcode (XRC atomic request: 12 + 4 + 28).
inline constexpr size_t kMaxTransportHeaderBytes = 44;
/// IPv4 (no options) + UDP header bytes in front of the BTH.
inline constexpr size_t kIpv4UdpHeaderBytes = 28;

/// Default partition key (full member, default partition).
inline constexpr uint16_t kDefaultPkey = 0xffff;

/// The transport service an opcode belongs to: its top three bits (IBTA vol 1, table 38:
/// 000 RC, 001 UC, 010 RD, 011 UD, 100 CNP in RoCEv2 (A17.9.3), 101 XRC).
enum class Service : uint8_t { kRc = 0, kUc = 1, kRd = 2, kUd = 3, kCnp = 4, kXrc = 5 };

/// The operation of an opcode, its low five bits, named by its RC opcode (IBTA vol 1,
/// table 38: the same operation has the same low bits in every service) — plus the
/// RoCEv2 CNP (A17.9.3), whose value is a whole opcode.
enum class Opcode : uint8_t {
  kSendFirst = 0x00,
  kSendMiddle = 0x01,
  kSendLast = 0x02,
  kSendLastImm = 0x03,
  kSendOnly = 0x04,
  kSendOnlyImm = 0x05,
  kWriteFirst = 0x06,
  kWriteMiddle = 0x07,
  kWriteLast = 0x08,
  kWriteLastImm = 0x09,
  kWriteOnly = 0x0a,
  kWriteOnlyImm = 0x0b,
  kReadRequest = 0x0c,
  kReadResponseFirst = 0x0d,
  kReadResponseMiddle = 0x0e,
  kReadResponseLast = 0x0f,
  kReadResponseOnly = 0x10,
  kAcknowledge = 0x11,
  kAtomicAcknowledge = 0x12,
  kCompareSwap = 0x13,
  kFetchAdd = 0x14,
  kSendLastInv = 0x16,  ///< SEND last with invalidate (IETH; RC and XRC)
  kSendOnlyInv = 0x17,  ///< SEND only with invalidate (IETH; RC and XRC)
  /// RDMA ATOMIC WRITE (IBTA vol 1 rel. 1.5, table 38: RC 0x1D): a RETH and exactly 8 bytes
  /// of payload that the responder stores as one atomic 8-byte write, answered by an ACK.
  kAtomicWrite = 0x1d,
  kCnp = 0x81,
};

/// The BTH opcode of `op` in `service`, e.g. (kUd, kSendOnly) → 0x64.
constexpr uint8_t opcode_of(Service service, Opcode op) noexcept {
  return static_cast<uint8_t>((static_cast<uint8_t>(service) << 5) |
                              (static_cast<uint8_t>(op) & 0x1f));
}
/// The service of a BTH opcode.
constexpr Service service_of(uint8_t opcode) noexcept {
  return static_cast<Service>(opcode >> 5);
}
/// The operation of a BTH opcode (its RC name), e.g. 0xa4 (XRC_SEND_ONLY) → kSendOnly.
constexpr Opcode operation_of(uint8_t opcode) noexcept {
  return static_cast<Opcode>(opcode & 0x1f);
}

/// What an opcode's packet carries and means; bits of OpcodeInfo::mask.
enum OpcodeFlag : uint32_t {
  kHasReth = 1u << 0,
  kHasAeth = 1u << 1,
  kHasAtomicEth = 1u << 2,
  kHasAtomicAckEth = 1u << 3,
  kHasImmDt = 1u << 4,
  kHasPayload = 1u << 5,
  kIsRequest = 1u << 6,   ///< requester → responder
  kIsResponse = 1u << 7,  ///< responder → requester (ACK, read response, atomic ACK)
  kIsSend = 1u << 8,
  kIsWrite = 1u << 9,
  kIsRead = 1u << 10,
  kIsAtomic = 1u << 11,
  kIsFirst = 1u << 12,  ///< first packet of a multi-packet message
  kIsMiddle = 1u << 13,
  kIsLast = 1u << 14,           ///< last packet of a multi-packet message
  kIsOnly = 1u << 15,           ///< single-packet message (neither first nor last)
  kConsumesRecvWqe = 1u << 16,  ///< SEND, or WRITE with immediate (at its last/only packet)
  kIsCnp = 1u << 17,
  kHasDeth = 1u << 18,        ///< Datagram ETH (UD requests): Q_Key, source QP
  kHasXrceth = 1u << 19,      ///< XRC ETH (XRC requests): the target's XRC SRQ number
  kHasIeth = 1u << 20,        ///< Invalidate ETH (9.3.7): the R_Key the responder invalidates
  kIsAtomicWrite = 1u << 21,  ///< RDMA ATOMIC WRITE (rel. 1.5): RETH + 8-byte payload, ACKed
};

/// The payload of an RDMA ATOMIC WRITE, bytes (IBTA vol 1 rel. 1.5, 9.4.7).
inline constexpr size_t kAtomicWriteBytes = 8;

/// One row of the opcode table.
struct OpcodeInfo {
  const char* name;      ///< e.g. "RC_SEND_FIRST", "UD_SEND_ONLY" (rxe's spelling)
  uint32_t mask;         ///< OpcodeFlag bits
  Service service;       ///< the transport service (the opcode's top three bits)
  uint8_t header_bytes;  ///< BTH + all extended headers, bytes (payload starts here)
};

/// Table lookup. Returns nullptr for opcodes softrdma does not implement (RD, FLUSH, the
/// XRC and RD ATOMIC WRITE, …); such packets are dropped and counted by the receiver.
const OpcodeInfo* opcode_info(uint8_t opcode) noexcept;

/// Base Transport Header (IBTA vol 1, 9.2), host-order values.
struct Bth {
  uint8_t opcode = 0;
  bool solicited = false;  ///< SE
  bool mig_req = true;     ///< M (RoCE senders set 1, as rxe does)
  uint8_t pad_count = 0;   ///< 0..3 bytes of pad after the payload
  uint8_t tver = 0;        ///< transport header version, must be 0
  uint16_t pkey = kDefaultPkey;
  bool fecn = false;  ///< ECN bits carried in byte 4 (resv8a for the ICRC)
  bool becn = false;
  uint32_t dest_qpn = 0;  ///< 24 bits
  bool ack_req = false;   ///< A
  /// softrdma's selective-retransmission capability, carried in bit 6 of BTH byte 8 (the
  /// first of the 7 reserved bits after AckReq, "resv7"; covered by the ICRC). IBTA vol 1
  /// 9.2: senders put 0 in reserved fields and receivers ignore them — rxe (rxe_hdr.h)
  /// only clears resv7 on send, Wireshark shows it as "Reserved" — so a peer that is not
  /// softrdma never sets it and never acts on it. Set by a requester on its requests when
  /// SOFTRDMA_SELECTIVE_RETX is on: "I understand selective NAKs" (docs/wide-area.md).
  bool selective = false;
  /// softrdma's resend mark, bit 5 of BTH byte 8 (the second bit of resv7, likewise covered
  /// by the ICRC and ignored by other peers): set with `selective` on a request packet whose
  /// PSN the requester has sent before (go-back-N, selective or timer resend). A responder
  /// placing packets out of order takes an unmarked packet arriving behind the highest PSN
  /// it has seen as evidence that that PSN was forged or reordered (engine/responder.cpp).
  /// It is a hint, not a credential: forging it gains nothing (docs/architecture.md).
  bool resend = false;
  /// softrdma's selective-ACK capability, bit 4 of BTH byte 8 (the third bit of resv7,
  /// likewise covered by the ICRC and ignored by other peers): set with `selective` on every
  /// request: "I understand selective ACKs" (NakCode::kSelectiveAck). A responder sends them
  /// only to a requester that set it, so a softrdma built before them never receives one.
  bool sack = false;
  /// softrdma's placed mark, bit 3 of BTH byte 8 (the fourth bit of resv7): an RC RDMA WRITE
  /// packet whose payload the sender already wrote into the responder's memory (the
  /// same-host direct placement, net/shm_placement.h); in its place the packet carries the
  /// payload's length, 4 bytes little-endian. Valid only on records of the same-host rings,
  /// which only a process of this user on this host can write: a receiver drops (and counts
  /// as malformed) any other packet that carries it.
  bool placed = false;
  /// softrdma's range-list capability, bit 2 of BTH byte 8 (the fifth bit of resv7, covered
  /// by the ICRC and ignored by other peers): set with `sack` on every request: "my selective
  /// ACKs may carry the missing ranges" (SackReport). A responder appends them only for a
  /// requester that set it, so a softrdma built before them never receives such a payload.
  bool sack_ranges = false;
  uint32_t psn = 0;  ///< 24 bits
};

/// RDMA Extended Transport Header (9.3.3): WRITE first/only, READ request, ATOMIC WRITE
/// (whose DMA length is 8).
struct Reth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_length = 0;  ///< bytes of the whole message
};

/// ACK Extended Transport Header (9.3.5).
struct Aeth {
  uint8_t syndrome = 0;  ///< see aeth_* helpers below
  uint32_t msn = 0;      ///< 24 bits
};

/// Atomic Extended Transport Header (9.3.4): COMPARE & SWAP, FETCH & ADD.
struct AtomicEth {
  uint64_t va = 0;  ///< must be 8-byte aligned
  uint32_t rkey = 0;
  uint64_t swap_add = 0;  ///< swap value (CmpSwap) or addend (FetchAdd)
  uint64_t compare = 0;   ///< compare value (CmpSwap only)
};

/// Atomic ACK Extended Transport Header (9.3.6): the original remote value.
struct AtomicAckEth {
  uint64_t orig = 0;
};

/// Datagram Extended Transport Header (9.3.2): UD requests. Byte 4 is reserved.
struct Deth {
  uint32_t qkey = 0;     ///< the Q_Key the receiving QP must hold (10.2.5)
  uint32_t src_qpn = 0;  ///< 24 bits: the sending QP (the receiver's wc.src_qp)
};

/// XRC Extended Transport Header (IBTA vol 1 annex A14.3.2): XRC requests. Byte 0 is reserved.
struct Xrceth {
  uint32_t srqn = 0;  ///< 24 bits: the XRC SRQ at the target that receives the message
};

/// The transport headers of one packet. Which of the extended headers are meaningful is
/// given by info->mask; the others are left at their defaults.
struct Headers {
  Bth bth;
  Reth reth;
  Aeth aeth;
  AtomicEth atomic;
  AtomicAckEth atomic_ack;
  Deth deth;
  Xrceth xrceth;
  uint32_t imm_be = 0;     ///< immediate data exactly as on the wire (network order), as ibv_wc
  uint32_t ieth_rkey = 0;  ///< IETH: the R_Key a SEND with invalidate names (host order)
};

/// A parsed RoCEv2 UDP payload: headers and payload (without pad). The ICRC is not read
/// (received_icrc()): it is the packet's last 4 bytes, in a cache line nothing else touches
/// before the payload copy, and on the same-host path nobody checks it.
struct Packet {
  Headers hdr;
  const OpcodeInfo* info = nullptr;
  std::span<const uint8_t> payload;  ///< data bytes, pad excluded
};

/// Why a UDP payload was rejected by parse().
enum class ParseError : uint8_t {
  kOk = 0,
  kTruncated,      ///< shorter than BTH + extended headers + pad + ICRC
  kUnknownOpcode,  ///< opcode_info() returned nullptr
  kBadVersion,     ///< BTH TVer != 0
  kBadPadCount,    ///< pad on a packet type that carries no payload
  kBadLength,      ///< payload present on a payload-less opcode (but a SackReport's size
                   ///< on a selective ACK)
};

/// Human-readable ParseError name, e.g. "truncated".
const char* to_string(ParseError e) noexcept;

/// Parses a RoCEv2 UDP payload (BTH … ICRC). Bounds-checked against every length field;
/// never reads outside `udp_payload`. Does not verify the ICRC (see icrc.h).
/// Returns kOk and fills `out` (whose payload span points into `udp_payload`), or the
/// reason the packet must be dropped.
ParseError parse(std::span<const uint8_t> udp_payload, Packet& out) noexcept;

/// The ICRC a packet carries: its trailing 4 bytes read little-endian (IBTA vol 1 annex
/// A17.3.3, as icrc.h computes it). `udp_payload` must hold at least kIcrcBytes (true of
/// every payload parse() accepted).
uint32_t received_icrc(std::span<const uint8_t> udp_payload) noexcept;

/// Writes BTH and the extended headers that `opcode_info(h.bth.opcode)` says the opcode
/// carries into `out`. Returns the number of bytes written (info->header_bytes), or 0 if
/// the opcode is unknown or `out` is too small. pad_count is written as given.
size_t encode_headers(const Headers& h, std::span<uint8_t> out) noexcept;

/// The headers of a RoCEv2 Congestion Notification Packet to `dest_qpn` (IBTA vol 1,
/// annex A17.9.3): BTH opcode 0x81, BECN set, PSN 0, MigReq 0, the default P_Key, then
/// the 16 reserved bytes (zero, written by encode_headers()) and the ICRC. What mlx5 NICs
/// send and Wireshark's InfiniBand dissector shows as "CNP".
Headers cnp_headers(uint32_t dest_qpn) noexcept;

/// Pad bytes needed after `payload_bytes` of data to reach a 4-byte boundary (9.2.3).
constexpr uint8_t pad_for(size_t payload_bytes) noexcept {
  return static_cast<uint8_t>((4 - (payload_bytes & 3)) & 3);
}

// ---- PSN arithmetic: 24-bit serial numbers (9.7.1) -----------------------------------

inline constexpr uint32_t kPsnMask = 0xffffff;
/// QP numbers are 24 bits too (BTH DestQP, 9.2): a different quantity of the same width.
inline constexpr uint32_t kQpnMask = 0xffffff;
/// The destination QPN of every multicast packet (IBTA vol 1, 10.5.2.3: the "multicast
/// QP", 0xFFFFFF); the receiver delivers a copy to each QP attached to the group that the
/// destination address (RoCEv2: the IPv4 multicast address) names.
inline constexpr uint32_t kMulticastQpn = 0xffffff;

constexpr uint32_t psn_add(uint32_t psn, uint32_t n) noexcept {
  return (psn + n) & kPsnMask;
}

/// Signed distance a − b in PSN space, in [−2^23, 2^23).
constexpr int32_t psn_diff(uint32_t a, uint32_t b) noexcept {
  return static_cast<int32_t>(((a - b) & kPsnMask) << 8) >> 8;
}

// ---- AETH syndromes (9.7.5.1, table 45) ------------------------------------------------

/// The kind of response an AETH syndrome encodes (bits 7..5 of the syndrome).
enum class AckKind : uint8_t { kAck, kRnrNak, kNak, kReserved };

/// NAK codes (syndrome bits 4..0 when AckKind is kNak).
enum class NakCode : uint8_t {
  kPsnSequenceError = 0,
  kInvalidRequest = 1,
  kRemoteAccessError = 2,
  kRemoteOperationalError = 3,
  kInvalidRdRequest = 4,
  /// softrdma's selective NAK, one of the codes IBTA table 45 reserves (5…31): "the PSNs
  /// from BTH.PSN to AETH.MSN (the last missing one, in the MSN's 24 bits) did not arrive;
  /// PSNs around them did and were kept". Unlike a sequence NAK it acknowledges nothing.
  /// Sent only to requesters whose requests carried Bth::selective (IRN, Mittal et al.,
  /// SIGCOMM 2018, section 3.2: the receiver reports what is missing).
  kSelectiveRetransmit = 0x1f,
  /// softrdma's selective ACK, another reserved code: "the expected PSN is BTH.PSN, and
  /// AETH.MSN (24 bits) PSNs beyond it arrived and were kept" (placed out of order). Like the
  /// selective NAK it acknowledges nothing: the requester takes the count out of what it
  /// holds in flight (IRN's SACK, Mittal et al., SIGCOMM 2018, 3.2; TCP's pipe, RFC 6675
  /// 4), so a hole at the head no longer stops the window while it is repaired. Sent only to
  /// requesters whose requests carried Bth::sack. To a requester whose requests also carried
  /// Bth::sack_ranges it carries a payload, a SackReport: the PSNs still missing below the
  /// highest one received (IRN's SACK bitmap, as ranges), so a lost selective NAK or a lost
  /// resend is known at the next selective ACK, wherever its gap lies.
  kSelectiveAck = 0x1e,
};

/// The payload of a selective ACK (NakCode::kSelectiveAck) to a requester that set
/// Bth::sack_ranges: 4 bytes, the highest PSN that has reached the responder (24 bits,
/// big-endian in 32; kept or not: a SEND beyond a gap arrives and is dropped), then `count`
/// ranges of 8 bytes, each the first and the last PSN of a run not kept (big-endian in 32 bits
/// each), oldest first, non-overlapping, none beyond `highest`.
/// At most kSackRangesMax ranges (132 bytes): the oldest gaps, which hold the window longest;
/// the rest are reported by later selective ACKs as the oldest are repaired. softrdma's own
/// extension, in a packet that only a softrdma requester that asked for it receives (IBTA vol
/// 1, 9.7.5.1: reserved NAK codes). Wireshark decodes the BTH and AETH (NAK, error code 30)
/// and leaves the list undissected, without an expert warning.
struct SackReport {
  static constexpr uint32_t kSackRangesMax = 16;
  uint32_t highest = 0;
  uint32_t count = 0;
  struct Range {
    uint32_t first = 0;
    uint32_t last = 0;
  } ranges[kSackRangesMax];
};
/// Bytes of a SackReport of `ranges` ranges on the wire.
constexpr size_t sack_report_bytes(uint32_t ranges) noexcept {
  return 4 + size_t{ranges} * 8;
}
/// Writes `r` into `out` (at least sack_report_bytes(r.count) bytes). Returns the bytes
/// written, or 0 when `out` is too small or r.count > kSackRangesMax.
size_t encode_sack_report(const SackReport& r, std::span<uint8_t> out) noexcept;
/// Reads a SackReport from a selective ACK's payload. False (nothing kept) when its size is
/// not 4 + 8 × n for n ≤ kSackRangesMax, or a PSN field has bits above 24, or a range is not
/// ordered (first ≤ last), not after the one before it, or beyond `highest` (PSN order,
/// IBTA 9.7.1).
bool decode_sack_report(std::span<const uint8_t> payload, SackReport& out) noexcept;

/// Credit field meaning "end-to-end flow control not used" (invalid credit count).
inline constexpr uint8_t kCreditsUnlimited = 0x1f;

constexpr uint8_t aeth_ack(uint8_t credits = kCreditsUnlimited) noexcept {
  return static_cast<uint8_t>(credits & 0x1f);
}
constexpr uint8_t aeth_rnr_nak(uint8_t rnr_timer) noexcept {
  return static_cast<uint8_t>(0x20 | (rnr_timer & 0x1f));
}
constexpr uint8_t aeth_nak(NakCode code) noexcept {
  return static_cast<uint8_t>(0x60 | static_cast<uint8_t>(code));
}
constexpr AckKind aeth_kind(uint8_t syndrome) noexcept {
  switch (syndrome >> 5) {
    case 0:
      return AckKind::kAck;
    case 1:
      return AckKind::kRnrNak;
    case 3:
      return AckKind::kNak;
    default:
      return AckKind::kReserved;
  }
}

/// RNR NAK timer field (5 bits, also ibv_qp_attr::min_rnr_timer) to µs, per IBTA
/// vol 1 table 45 (0 → 655.36 ms, 1 → 0.01 ms, …, 31 → 491.52 ms).
uint32_t rnr_timer_usec(uint8_t code) noexcept;

}  // namespace softrdma::wire
