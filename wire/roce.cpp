// RoCEv2 transport headers: opcode table, parse and encode. See roce.h.
#include "wire/roce.h"

#include <array>
#include <cstring>

namespace softrdma::wire {
namespace {

// ---- Opcode table (data, as rxe_opcode.c) ----------------------------------------------

constexpr uint8_t header_bytes_for(uint32_t mask, size_t extra = 0) {
  size_t n = kBthBytes + extra;
  if (mask & kHasDeth) n += kDethBytes;
  if (mask & kHasXrceth) n += kXrcethBytes;
  if (mask & kHasReth) n += kRethBytes;
  if (mask & kHasAtomicEth) n += kAtomicEthBytes;
  if (mask & kHasAeth) n += kAethBytes;
  if (mask & kHasAtomicAckEth) n += kAtomicAckEthBytes;
  if (mask & kHasImmDt) n += kImmDtBytes;
  if (mask & kHasIeth) n += kIethBytes;
  return static_cast<uint8_t>(n);
}

/// Reserved bytes after the BTH of a CNP (IBTA A17.9.3), counted as header bytes.
constexpr size_t kCnpReservedBytes = 16;

/// One operation (IBTA vol 1, table 38) and its name in each connected service that has
/// it: RC, UC (SEND and RDMA WRITE only) and XRC (annex A14: every RC operation, requests
/// carrying an XRCETH). The service's bits are added when the table is built.
struct Row {
  Opcode op;
  const char* rc;
  const char* uc;  // nullptr: no UC opcode
  const char* xrc;
  uint32_t mask;
};

constexpr uint32_t kReq = kIsRequest;
constexpr uint32_t kResp = kIsResponse;

constexpr Row kRows[] = {
    {Opcode::kSendFirst, "RC_SEND_FIRST", "UC_SEND_FIRST", "XRC_SEND_FIRST",
     kReq | kIsSend | kHasPayload | kIsFirst},
    {Opcode::kSendMiddle, "RC_SEND_MIDDLE", "UC_SEND_MIDDLE", "XRC_SEND_MIDDLE",
     kReq | kIsSend | kHasPayload | kIsMiddle},
    {Opcode::kSendLast, "RC_SEND_LAST", "UC_SEND_LAST", "XRC_SEND_LAST",
     kReq | kIsSend | kHasPayload | kIsLast | kConsumesRecvWqe},
    {Opcode::kSendLastImm, "RC_SEND_LAST_WITH_IMMEDIATE", "UC_SEND_LAST_WITH_IMMEDIATE",
     "XRC_SEND_LAST_WITH_IMMEDIATE",
     kReq | kIsSend | kHasPayload | kHasImmDt | kIsLast | kConsumesRecvWqe},
    {Opcode::kSendOnly, "RC_SEND_ONLY", "UC_SEND_ONLY", "XRC_SEND_ONLY",
     kReq | kIsSend | kHasPayload | kIsOnly | kConsumesRecvWqe},
    {Opcode::kSendOnlyImm, "RC_SEND_ONLY_WITH_IMMEDIATE", "UC_SEND_ONLY_WITH_IMMEDIATE",
     "XRC_SEND_ONLY_WITH_IMMEDIATE",
     kReq | kIsSend | kHasPayload | kHasImmDt | kIsOnly | kConsumesRecvWqe},
    {Opcode::kWriteFirst, "RC_RDMA_WRITE_FIRST", "UC_RDMA_WRITE_FIRST", "XRC_RDMA_WRITE_FIRST",
     kReq | kIsWrite | kHasReth | kHasPayload | kIsFirst},
    {Opcode::kWriteMiddle, "RC_RDMA_WRITE_MIDDLE", "UC_RDMA_WRITE_MIDDLE", "XRC_RDMA_WRITE_MIDDLE",
     kReq | kIsWrite | kHasPayload | kIsMiddle},
    {Opcode::kWriteLast, "RC_RDMA_WRITE_LAST", "UC_RDMA_WRITE_LAST", "XRC_RDMA_WRITE_LAST",
     kReq | kIsWrite | kHasPayload | kIsLast},
    {Opcode::kWriteLastImm, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
     "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE", "XRC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
     kReq | kIsWrite | kHasPayload | kHasImmDt | kIsLast | kConsumesRecvWqe},
    {Opcode::kWriteOnly, "RC_RDMA_WRITE_ONLY", "UC_RDMA_WRITE_ONLY", "XRC_RDMA_WRITE_ONLY",
     kReq | kIsWrite | kHasReth | kHasPayload | kIsOnly},
    {Opcode::kWriteOnlyImm, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
     "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
     kReq | kIsWrite | kHasReth | kHasPayload | kHasImmDt | kIsOnly | kConsumesRecvWqe},
    {Opcode::kReadRequest, "RC_RDMA_READ_REQUEST", nullptr, "XRC_RDMA_READ_REQUEST",
     kReq | kIsRead | kHasReth | kIsOnly},
    {Opcode::kReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST", nullptr,
     "XRC_RDMA_READ_RESPONSE_FIRST", kResp | kIsRead | kHasAeth | kHasPayload | kIsFirst},
    {Opcode::kReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE", nullptr,
     "XRC_RDMA_READ_RESPONSE_MIDDLE", kResp | kIsRead | kHasPayload | kIsMiddle},
    {Opcode::kReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST", nullptr,
     "XRC_RDMA_READ_RESPONSE_LAST", kResp | kIsRead | kHasAeth | kHasPayload | kIsLast},
    {Opcode::kReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY", nullptr,
     "XRC_RDMA_READ_RESPONSE_ONLY", kResp | kIsRead | kHasAeth | kHasPayload | kIsOnly},
    {Opcode::kAcknowledge, "RC_ACKNOWLEDGE", nullptr, "XRC_ACKNOWLEDGE",
     kResp | kHasAeth | kIsOnly},
    {Opcode::kAtomicAcknowledge, "RC_ATOMIC_ACKNOWLEDGE", nullptr, "XRC_ATOMIC_ACKNOWLEDGE",
     kResp | kIsAtomic | kHasAeth | kHasAtomicAckEth | kIsOnly},
    {Opcode::kCompareSwap, "RC_COMPARE_SWAP", nullptr, "XRC_COMPARE_SWAP",
     kReq | kIsAtomic | kHasAtomicEth | kIsOnly},
    {Opcode::kFetchAdd, "RC_FETCH_ADD", nullptr, "XRC_FETCH_ADD",
     kReq | kIsAtomic | kHasAtomicEth | kIsOnly},
    {Opcode::kSendLastInv, "RC_SEND_LAST_WITH_INVALIDATE", nullptr, "XRC_SEND_LAST_WITH_INVALIDATE",
     kReq | kIsSend | kHasPayload | kHasIeth | kIsLast | kConsumesRecvWqe},
    {Opcode::kSendOnlyInv, "RC_SEND_ONLY_WITH_INVALIDATE", nullptr, "XRC_SEND_ONLY_WITH_INVALIDATE",
     kReq | kIsSend | kHasPayload | kHasIeth | kIsOnly | kConsumesRecvWqe},
};

/// The two UD opcodes (IBTA vol 1, table 38: UD carries single-packet SENDs, each with a
/// DETH).
struct UdRow {
  Opcode op;
  const char* name;
  uint32_t mask;
};
constexpr UdRow kUdRows[] = {
    {Opcode::kSendOnly, "UD_SEND_ONLY",
     kReq | kIsSend | kHasDeth | kHasPayload | kIsOnly | kConsumesRecvWqe},
    {Opcode::kSendOnlyImm, "UD_SEND_ONLY_WITH_IMMEDIATE",
     kReq | kIsSend | kHasDeth | kHasPayload | kHasImmDt | kIsOnly | kConsumesRecvWqe},
};

constexpr std::array<OpcodeInfo, 256> make_table() {
  std::array<OpcodeInfo, 256> t{};
  auto put = [&t](Service s, Opcode op, const char* name, uint32_t mask, size_t extra = 0) {
    t[opcode_of(s, op)] = OpcodeInfo{name, mask, s, header_bytes_for(mask, extra)};
  };
  for (const Row& r : kRows) {
    put(Service::kRc, r.op, r.rc, r.mask);
    if (r.uc) put(Service::kUc, r.op, r.uc, r.mask);
    put(Service::kXrc, r.op, r.xrc, (r.mask & kIsRequest) ? r.mask | kHasXrceth : r.mask);
  }
  for (const UdRow& r : kUdRows) put(Service::kUd, r.op, r.name, r.mask);
  // RDMA ATOMIC WRITE (IBTA vol 1 rel. 1.5): RC only, as Linux rxe implements it (its
  // rxe_opcode.c row IB_OPCODE_RC_ATOMIC_WRITE: RETH, payload, start and end of a message).
  put(Service::kRc, Opcode::kAtomicWrite, "RC_ATOMIC_WRITE",
      kReq | kIsAtomicWrite | kHasReth | kHasPayload | kIsOnly);
  t[static_cast<uint8_t>(Opcode::kCnp)] =
      OpcodeInfo{"CNP", kIsCnp, Service::kCnp, header_bytes_for(kIsCnp, kCnpReservedBytes)};
  return t;
}

constexpr std::array<OpcodeInfo, 256> kTable = make_table();

static_assert(kTable[0xb3].header_bytes == kMaxTransportHeaderBytes);  // XRC_COMPARE_SWAP
static_assert(kTable[0x13].header_bytes == kBthBytes + kAtomicEthBytes);
static_assert(kTable[0x0b].header_bytes == kBthBytes + kRethBytes + kImmDtBytes);
static_assert(kTable[0x12].header_bytes == kBthBytes + kAethBytes + kAtomicAckEthBytes);
static_assert(kTable[0x81].header_bytes == kBthBytes + kCnpReservedBytes);
static_assert(kTable[0x17].header_bytes == kBthBytes + kIethBytes);
static_assert(kTable[0xb7].header_bytes == kBthBytes + kXrcethBytes + kIethBytes);
static_assert(kTable[0x65].header_bytes == kBthBytes + kDethBytes + kImmDtBytes);
static_assert(kTable[0x2b].header_bytes == kTable[0x0b].header_bytes);
static_assert(kTable[0xab].header_bytes == kBthBytes + kXrcethBytes + kRethBytes + kImmDtBytes);
static_assert(kTable[0xb1].header_bytes == kBthBytes + kAethBytes);  // XRC_ACKNOWLEDGE
static_assert(kTable[0x2c].name == nullptr && kTable[0x60].name == nullptr);
static_assert(kTable[0x1d].header_bytes == kBthBytes + kRethBytes);  // RC_ATOMIC_WRITE
static_assert(kTable[0x3d].name == nullptr && kTable[0xbd].name == nullptr);

// ---- Big-endian field access (memcpy-free byte arithmetic, no alignment assumptions) --

uint16_t load16(const uint8_t* p) {
  return static_cast<uint16_t>((p[0] << 8) | p[1]);
}
uint32_t load24(const uint8_t* p) {
  return (uint32_t{p[0]} << 16) | (uint32_t{p[1]} << 8) | uint32_t{p[2]};
}
uint32_t load32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
uint64_t load64(const uint8_t* p) {
  return (uint64_t{load32(p)} << 32) | load32(p + 4);
}

void store16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void store24(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 16);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v);
}
void store32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v >> 24);
  p[1] = static_cast<uint8_t>(v >> 16);
  p[2] = static_cast<uint8_t>(v >> 8);
  p[3] = static_cast<uint8_t>(v);
}
void store64(uint8_t* p, uint64_t v) {
  store32(p, static_cast<uint32_t>(v >> 32));
  store32(p + 4, static_cast<uint32_t>(v));
}

// BTH byte 1 / byte 4 / byte 8 bit positions.
constexpr uint8_t kSeBit = 0x80;
constexpr uint8_t kMigBit = 0x40;
constexpr unsigned kPadShift = 4;
constexpr uint8_t kTverMask = 0x0f;
constexpr uint8_t kFecnBit = 0x80;
constexpr uint8_t kBecnBit = 0x40;
constexpr uint8_t kAckReqBit = 0x80;
constexpr uint8_t kSelectiveBit = 0x40;   // first bit of resv7 (see Bth::selective)
constexpr uint8_t kResendBit = 0x20;      // second bit of resv7 (see Bth::resend)
constexpr uint8_t kSackBit = 0x10;        // third bit of resv7 (see Bth::sack)
constexpr uint8_t kPlacedBit = 0x08;      // fourth bit of resv7 (see Bth::placed)
constexpr uint8_t kSackRangesBit = 0x04;  // fifth bit of resv7 (see Bth::sack_ranges)

constexpr uint32_t kRnrTimerUsec[32] = {
    655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,    320,
    480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240,  15360,
    20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
};

}  // namespace

const OpcodeInfo* opcode_info(uint8_t opcode) noexcept {
  const OpcodeInfo& row = kTable[opcode];
  return row.name != nullptr ? &row : nullptr;
}

const char* to_string(ParseError e) noexcept {
  switch (e) {
    case ParseError::kOk:
      return "ok";
    case ParseError::kTruncated:
      return "truncated";
    case ParseError::kUnknownOpcode:
      return "unknown opcode";
    case ParseError::kBadVersion:
      return "bad transport version";
    case ParseError::kBadPadCount:
      return "bad pad count";
    case ParseError::kBadLength:
      return "bad length";
  }
  return "invalid ParseError";
}

namespace {
// The one payload a payload-less opcode may carry: a SackReport on an RC/XRC ACKNOWLEDGE whose
// AETH (its last header) has the selective-ACK syndrome, no pad, 4 + 8 × n bytes.
bool sack_report_size(const uint8_t* p, const OpcodeInfo& info, uint8_t pad,
                      size_t payload_bytes) noexcept {
  if ((p[0] & 0x1f) != static_cast<uint8_t>(Opcode::kAcknowledge) || !(info.mask & kHasAeth) ||
      pad != 0 || payload_bytes < 4 || (payload_bytes - 4) % 8 != 0 ||
      payload_bytes > sack_report_bytes(SackReport::kSackRangesMax))
    return false;
  return p[info.header_bytes - kAethBytes] == aeth_nak(NakCode::kSelectiveAck);
}
}  // namespace

size_t encode_sack_report(const SackReport& r, std::span<uint8_t> out) noexcept {
  if (r.count > SackReport::kSackRangesMax || out.size() < sack_report_bytes(r.count)) return 0;
  store32(out.data(), r.highest & kPsnMask);
  for (uint32_t i = 0; i < r.count; ++i) {
    store32(out.data() + 4 + 8 * i, r.ranges[i].first & kPsnMask);
    store32(out.data() + 8 + 8 * i, r.ranges[i].last & kPsnMask);
  }
  return sack_report_bytes(r.count);
}

bool decode_sack_report(std::span<const uint8_t> payload, SackReport& out) noexcept {
  const size_t n = payload.size();
  if (n < 4 || (n - 4) % 8 != 0 || n > sack_report_bytes(SackReport::kSackRangesMax)) return false;
  SackReport r;
  r.highest = load32(payload.data());
  r.count = static_cast<uint32_t>((n - 4) / 8);
  if (r.highest > kPsnMask) return false;
  for (uint32_t i = 0; i < r.count; ++i) {
    auto& g = r.ranges[i];
    g.first = load32(payload.data() + 4 + 8 * i);
    g.last = load32(payload.data() + 8 + 8 * i);
    if (g.first > kPsnMask || g.last > kPsnMask || psn_diff(g.last, g.first) < 0 ||
        psn_diff(r.highest, g.last) < 0 || (i > 0 && psn_diff(g.first, r.ranges[i - 1].last) <= 1))
      return false;
  }
  out = r;
  return true;
}

ParseError parse(std::span<const uint8_t> udp_payload, Packet& out) noexcept {
  const size_t len = udp_payload.size();
  const uint8_t* p = udp_payload.data();
  if (len < kBthBytes) return ParseError::kTruncated;

  const OpcodeInfo* info = opcode_info(p[0]);
  if (info == nullptr) return ParseError::kUnknownOpcode;
  if ((p[1] & kTverMask) != 0) return ParseError::kBadVersion;
  const uint8_t pad = static_cast<uint8_t>((p[1] >> kPadShift) & 3);
  const bool has_payload = (info->mask & kHasPayload) != 0;
  if (!has_payload && pad != 0) return ParseError::kBadPadCount;
  // header_bytes <= 44, pad <= 3: the sum cannot overflow.
  const size_t fixed = size_t{info->header_bytes} + pad + kIcrcBytes;
  if (len < fixed) return ParseError::kTruncated;
  const size_t payload_bytes = len - fixed;
  if (!has_payload && payload_bytes != 0 && !sack_report_size(p, *info, pad, payload_bytes))
    return ParseError::kBadLength;

  // Built in place over a copy of constant defaults: a Headers built on the stack and copied
  // into `out` is read back with 16-byte loads right after narrower stores to the same
  // bytes — a store-forwarding stall per packet that perf put at a third of parse's samples
  // (docs/performance.md).
  static constexpr Headers kDefaults{};
  Headers& h = out.hdr;
  h = kDefaults;
  Bth& bth = h.bth;
  bth.opcode = p[0];
  bth.solicited = (p[1] & kSeBit) != 0;
  bth.mig_req = (p[1] & kMigBit) != 0;
  bth.pad_count = pad;
  bth.tver = 0;
  bth.pkey = load16(p + 2);
  bth.fecn = (p[4] & kFecnBit) != 0;
  bth.becn = (p[4] & kBecnBit) != 0;
  bth.dest_qpn = load24(p + 5);
  bth.ack_req = (p[8] & kAckReqBit) != 0;
  bth.selective = (p[8] & kSelectiveBit) != 0;
  bth.resend = (p[8] & kResendBit) != 0;
  bth.sack = (p[8] & kSackBit) != 0;
  bth.placed = (p[8] & kPlacedBit) != 0;
  bth.sack_ranges = (p[8] & kSackRangesBit) != 0;
  bth.psn = load24(p + 9);

  const uint8_t* q = p + kBthBytes;
  if (info->mask & kHasDeth) {
    h.deth.qkey = load32(q);
    h.deth.src_qpn = load24(q + 5);
    q += kDethBytes;
  }
  if (info->mask & kHasXrceth) {
    h.xrceth.srqn = load24(q + 1);
    q += kXrcethBytes;
  }
  if (info->mask & kHasReth) {
    h.reth.va = load64(q);
    h.reth.rkey = load32(q + 8);
    h.reth.dma_length = load32(q + 12);
    q += kRethBytes;
  }
  if (info->mask & kHasAtomicEth) {
    h.atomic.va = load64(q);
    h.atomic.rkey = load32(q + 8);
    h.atomic.swap_add = load64(q + 12);
    h.atomic.compare = load64(q + 20);
    q += kAtomicEthBytes;
  }
  if (info->mask & kHasAeth) {
    h.aeth.syndrome = q[0];
    h.aeth.msn = load24(q + 1);
    q += kAethBytes;
  }
  if (info->mask & kHasAtomicAckEth) {
    h.atomic_ack.orig = load64(q);
    q += kAtomicAckEthBytes;
  }
  if (info->mask & kHasImmDt) {
    std::memcpy(&h.imm_be, q, kImmDtBytes);  // kept in network order
    q += kImmDtBytes;
  }
  if (info->mask & kHasIeth) h.ieth_rkey = load32(q);

  out.info = info;
  out.payload = udp_payload.subspan(info->header_bytes, payload_bytes);
  return ParseError::kOk;
}

uint32_t received_icrc(std::span<const uint8_t> udp_payload) noexcept {
  const uint8_t* tail = udp_payload.data() + udp_payload.size() - kIcrcBytes;
  uint32_t icrc = 0;
  for (size_t i = kIcrcBytes; i-- > 0;) icrc = (icrc << 8) | tail[i];
  return icrc;
}

size_t encode_headers(const Headers& h, std::span<uint8_t> out) noexcept {
  const OpcodeInfo* info = opcode_info(h.bth.opcode);
  if (info == nullptr || out.size() < info->header_bytes) return 0;
  uint8_t* p = out.data();
  const Bth& bth = h.bth;

  p[0] = bth.opcode;
  p[1] = static_cast<uint8_t>((bth.solicited ? kSeBit : 0) | (bth.mig_req ? kMigBit : 0) |
                              ((bth.pad_count & 3u) << kPadShift) | (bth.tver & kTverMask));
  store16(p + 2, bth.pkey);
  p[4] = static_cast<uint8_t>((bth.fecn ? kFecnBit : 0) | (bth.becn ? kBecnBit : 0));
  store24(p + 5, bth.dest_qpn & kQpnMask);
  p[8] =
      static_cast<uint8_t>((bth.ack_req ? kAckReqBit : 0) | (bth.selective ? kSelectiveBit : 0) |
                           (bth.resend ? kResendBit : 0) | (bth.sack ? kSackBit : 0) |
                           (bth.placed ? kPlacedBit : 0) | (bth.sack_ranges ? kSackRangesBit : 0));
  store24(p + 9, bth.psn & kPsnMask);

  uint8_t* q = p + kBthBytes;
  if (info->mask & kHasDeth) {
    store32(q, h.deth.qkey);
    q[4] = 0;
    store24(q + 5, h.deth.src_qpn & kQpnMask);
    q += kDethBytes;
  }
  if (info->mask & kHasXrceth) {
    q[0] = 0;
    store24(q + 1, h.xrceth.srqn & kQpnMask);
    q += kXrcethBytes;
  }
  if (info->mask & kHasReth) {
    store64(q, h.reth.va);
    store32(q + 8, h.reth.rkey);
    store32(q + 12, h.reth.dma_length);
    q += kRethBytes;
  }
  if (info->mask & kHasAtomicEth) {
    store64(q, h.atomic.va);
    store32(q + 8, h.atomic.rkey);
    store64(q + 12, h.atomic.swap_add);
    store64(q + 20, h.atomic.compare);
    q += kAtomicEthBytes;
  }
  if (info->mask & kHasAeth) {
    q[0] = h.aeth.syndrome;
    store24(q + 1, h.aeth.msn & kPsnMask);
    q += kAethBytes;
  }
  if (info->mask & kHasAtomicAckEth) {
    store64(q, h.atomic_ack.orig);
    q += kAtomicAckEthBytes;
  }
  if (info->mask & kHasImmDt) {
    std::memcpy(q, &h.imm_be, kImmDtBytes);
    q += kImmDtBytes;
  }
  if (info->mask & kHasIeth) {
    store32(q, h.ieth_rkey);
    q += kIethBytes;
  }
  // Reserved header bytes (the CNP's 16) are sent as zero.
  const size_t written = static_cast<size_t>(q - p);
  std::memset(q, 0, info->header_bytes - written);
  return info->header_bytes;
}

Headers cnp_headers(uint32_t dest_qpn) noexcept {
  Headers h;
  h.bth.opcode = static_cast<uint8_t>(Opcode::kCnp);
  h.bth.mig_req = false;
  h.bth.becn = true;
  h.bth.dest_qpn = dest_qpn & kQpnMask;
  h.bth.psn = 0;
  return h;
}

uint32_t rnr_timer_usec(uint8_t code) noexcept {
  return kRnrTimerUsec[code & 0x1f];
}

}  // namespace softrdma::wire
