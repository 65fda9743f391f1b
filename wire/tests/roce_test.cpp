// Tests of the RoCEv2 header layer: opcode table, parse/encode, PSN and AETH helpers.
#include "wire/roce.h"

#include <gtest/gtest.h>

#include <array>
#include <bit>
#include <cstring>
#include <string>
#include <vector>

namespace softrdma::wire {
namespace {

constexpr Opcode kAllOpcodes[] = {
    Opcode::kSendFirst,
    Opcode::kSendMiddle,
    Opcode::kSendLast,
    Opcode::kSendLastImm,
    Opcode::kSendOnly,
    Opcode::kSendOnlyImm,
    Opcode::kWriteFirst,
    Opcode::kWriteMiddle,
    Opcode::kWriteLast,
    Opcode::kWriteLastImm,
    Opcode::kWriteOnly,
    Opcode::kWriteOnlyImm,
    Opcode::kReadRequest,
    Opcode::kReadResponseFirst,
    Opcode::kReadResponseMiddle,
    Opcode::kReadResponseLast,
    Opcode::kReadResponseOnly,
    Opcode::kAcknowledge,
    Opcode::kAtomicAcknowledge,
    Opcode::kCompareSwap,
    Opcode::kFetchAdd,
    Opcode::kSendLastInv,
    Opcode::kSendOnlyInv,
    Opcode::kAtomicWrite,
    Opcode::kCnp,
};

uint8_t op(Opcode o) {
  return static_cast<uint8_t>(o);
}

/// Every opcode the table knows (RC, UC, UD, XRC and the CNP).
std::vector<uint8_t> known_opcodes() {
  std::vector<uint8_t> v;
  for (int i = 0; i < 256; ++i)
    if (opcode_info(static_cast<uint8_t>(i))) v.push_back(static_cast<uint8_t>(i));
  return v;
}

/// Headers with every field set to a distinctive non-default value.
Headers sample_headers(uint8_t opcode, uint8_t pad) {
  Headers h;
  h.bth.opcode = opcode;
  h.bth.solicited = true;
  h.bth.mig_req = true;
  h.bth.pad_count = pad;
  h.bth.pkey = 0x8001;
  h.bth.fecn = true;
  h.bth.becn = false;
  h.bth.dest_qpn = 0xabcdef;
  h.bth.ack_req = true;
  h.bth.psn = 0xfedcba;
  h.reth = {0x0123456789abcdefull, 0xdeadbeef, 0x00100000};
  h.aeth = {aeth_nak(NakCode::kRemoteAccessError), 0x123456};
  h.atomic = {0x1122334455667788ull, 0xcafef00d, 0xa5a5a5a55a5a5a5aull, 0x0f0f0f0ff0f0f0f0ull};
  h.atomic_ack = {0x8877665544332211ull};
  h.deth = {0x80010000, 0x000001};
  h.xrceth = {0x0a0b0c};
  const uint8_t imm[4] = {0x01, 0x02, 0x03, 0x04};
  std::memcpy(&h.imm_be, imm, 4);
  h.ieth_rkey = 0x89abcdef;
  return h;
}
Headers sample_headers(Opcode o, uint8_t pad) {
  return sample_headers(op(o), pad);
}

/// A full UDP payload: headers, `payload_len` bytes of data, pad, ICRC 0x44332211.
std::vector<uint8_t> build(const Headers& h, size_t payload_len) {
  const OpcodeInfo* info = opcode_info(h.bth.opcode);
  std::vector<uint8_t> pkt(info->header_bytes + payload_len + h.bth.pad_count + kIcrcBytes);
  EXPECT_EQ(encode_headers(h, pkt), info->header_bytes);
  for (size_t i = 0; i < payload_len; ++i) pkt[info->header_bytes + i] = static_cast<uint8_t>(i);
  const uint8_t icrc[4] = {0x11, 0x22, 0x33, 0x44};
  std::memcpy(pkt.data() + pkt.size() - 4, icrc, 4);
  return pkt;
}

TEST(OpcodeTable, KnownOpcodes) {
  for (Opcode o : kAllOpcodes) {
    const OpcodeInfo* info = opcode_info(op(o));
    ASSERT_NE(info, nullptr) << int(op(o));
    EXPECT_NE(info->name, nullptr);
    EXPECT_GE(info->header_bytes, kBthBytes);
    EXPECT_LE(info->header_bytes, kMaxTransportHeaderBytes);
    // Exactly one of first/middle/last/only for every transport opcode.
    const uint32_t pos = info->mask & (kIsFirst | kIsMiddle | kIsLast | kIsOnly);
    if (o == Opcode::kCnp) {
      EXPECT_EQ(pos, 0u);
      EXPECT_EQ(info->mask & (kIsRequest | kIsResponse), 0u);
    } else {
      EXPECT_EQ(std::popcount(pos), 1) << info->name;
      EXPECT_EQ(std::popcount(info->mask & (kIsRequest | kIsResponse)), 1) << info->name;
    }
  }
  // RC 24 (with ATOMIC WRITE) + CNP + UC 12 (SEND, WRITE) + UD 2 (SEND ONLY) + XRC 23.
  EXPECT_EQ(known_opcodes().size(), 62u);
  EXPECT_EQ(opcode_info(0x15), nullptr);
  EXPECT_EQ(opcode_info(0x36), nullptr);  // no UC SEND_LAST_WITH_INVALIDATE
  EXPECT_EQ(opcode_info(0x3d), nullptr);  // no UC ATOMIC WRITE
  EXPECT_EQ(opcode_info(0xbd), nullptr);  // XRC ATOMIC WRITE: not implemented (nor in rxe)
  EXPECT_EQ(opcode_info(0x2c), nullptr);  // no UC READ
  EXPECT_EQ(opcode_info(0x40), nullptr);  // RD: not implemented
  EXPECT_EQ(opcode_info(0x60), nullptr);  // no UD SEND_FIRST
  EXPECT_EQ(opcode_info(0xff), nullptr);
  for (uint8_t o : known_opcodes()) {
    const OpcodeInfo* info = opcode_info(o);
    EXPECT_EQ(info->service, service_of(o)) << info->name;
    // The operation's mask bits are the same in every service; only the ETHs differ.
    if (info->service == Service::kCnp) continue;
    const OpcodeInfo* rc = opcode_info(opcode_of(Service::kRc, operation_of(o)));
    ASSERT_NE(rc, nullptr) << info->name;
    EXPECT_EQ(info->mask & ~(kHasDeth | kHasXrceth), rc->mask) << info->name;
    EXPECT_EQ((info->mask & kHasXrceth) != 0,
              info->service == Service::kXrc && (info->mask & kIsRequest))
        << info->name;
    EXPECT_EQ((info->mask & kHasDeth) != 0, info->service == Service::kUd) << info->name;
  }
}

TEST(OpcodeTable, OtherServicesRows) {
  struct Expect {
    uint8_t opcode;
    const char* name;
    uint8_t bytes;
  };
  const Expect rows[] = {
      {0x20, "UC_SEND_FIRST", 12},         {0x2b, "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 32},
      {0x64, "UD_SEND_ONLY", 20},          {0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", 24},
      {0xa0, "XRC_SEND_FIRST", 16},        {0xab, "XRC_RDMA_WRITE_ONLY_WITH_IMMEDIATE", 36},
      {0xac, "XRC_RDMA_READ_REQUEST", 32}, {0xb0, "XRC_RDMA_READ_RESPONSE_ONLY", 16},
      {0xb1, "XRC_ACKNOWLEDGE", 16},       {0xb3, "XRC_COMPARE_SWAP", 44},
  };
  for (const Expect& e : rows) {
    const OpcodeInfo* info = opcode_info(e.opcode);
    ASSERT_NE(info, nullptr) << e.name;
    EXPECT_STREQ(info->name, e.name);
    EXPECT_EQ(info->header_bytes, e.bytes) << e.name;
  }
}

// UD SEND ONLY with immediate: BTH, DETH (Q_Key, reserved, source QP), ImmDt; XRC WRITE
// ONLY: BTH, XRCETH (reserved, SRQ number), RETH — byte by byte.
TEST(Encode, DethAndXrcethLayout) {
  Headers h = sample_headers(0x65, 0);
  h.deth = {0x11111111, 0xabcdef};
  std::array<uint8_t, 24> b{};
  b.fill(0xee);
  ASSERT_EQ(encode_headers(h, b), 24u);
  const std::array<uint8_t, 12> want = {0x11, 0x11, 0x11, 0x11, 0x00, 0xab,
                                        0xcd, 0xef, 0x01, 0x02, 0x03, 0x04};
  EXPECT_EQ(0, std::memcmp(b.data() + 12, want.data(), want.size()));
  h = sample_headers(0xaa, 0);
  h.xrceth.srqn = 0xff123456;  // masked to 24 bits
  std::array<uint8_t, 32> x{};
  x.fill(0xee);
  ASSERT_EQ(encode_headers(h, x), 32u);
  const std::array<uint8_t, 8> want_x = {0x00, 0x12, 0x34, 0x56, 0x01, 0x23, 0x45, 0x67};
  EXPECT_EQ(0, std::memcmp(x.data() + 12, want_x.data(), want_x.size()));
}

TEST(OpcodeTable, Rows) {
  struct Expect {
    Opcode o;
    const char* name;
    uint32_t mask;
    uint8_t bytes;
  };
  const Expect rows[] = {
      {Opcode::kSendFirst, "RC_SEND_FIRST", kIsRequest | kIsSend | kHasPayload | kIsFirst, 12},
      {Opcode::kSendMiddle, "RC_SEND_MIDDLE", kIsRequest | kIsSend | kHasPayload | kIsMiddle, 12},
      {Opcode::kSendLast, "RC_SEND_LAST",
       kIsRequest | kIsSend | kHasPayload | kIsLast | kConsumesRecvWqe, 12},
      {Opcode::kSendLastImm, "RC_SEND_LAST_WITH_IMMEDIATE",
       kIsRequest | kIsSend | kHasPayload | kHasImmDt | kIsLast | kConsumesRecvWqe, 16},
      {Opcode::kSendOnly, "RC_SEND_ONLY",
       kIsRequest | kIsSend | kHasPayload | kIsOnly | kConsumesRecvWqe, 12},
      {Opcode::kSendOnlyImm, "RC_SEND_ONLY_WITH_IMMEDIATE",
       kIsRequest | kIsSend | kHasPayload | kHasImmDt | kIsOnly | kConsumesRecvWqe, 16},
      {Opcode::kWriteFirst, "RC_RDMA_WRITE_FIRST",
       kIsRequest | kIsWrite | kHasReth | kHasPayload | kIsFirst, 28},
      {Opcode::kWriteMiddle, "RC_RDMA_WRITE_MIDDLE",
       kIsRequest | kIsWrite | kHasPayload | kIsMiddle, 12},
      {Opcode::kWriteLast, "RC_RDMA_WRITE_LAST", kIsRequest | kIsWrite | kHasPayload | kIsLast, 12},
      {Opcode::kWriteLastImm, "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
       kIsRequest | kIsWrite | kHasPayload | kHasImmDt | kIsLast | kConsumesRecvWqe, 16},
      {Opcode::kWriteOnly, "RC_RDMA_WRITE_ONLY",
       kIsRequest | kIsWrite | kHasReth | kHasPayload | kIsOnly, 28},
      {Opcode::kWriteOnlyImm, "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
       kIsRequest | kIsWrite | kHasReth | kHasPayload | kHasImmDt | kIsOnly | kConsumesRecvWqe, 32},
      {Opcode::kReadRequest, "RC_RDMA_READ_REQUEST", kIsRequest | kIsRead | kHasReth | kIsOnly, 28},
      {Opcode::kReadResponseFirst, "RC_RDMA_READ_RESPONSE_FIRST",
       kIsResponse | kIsRead | kHasAeth | kHasPayload | kIsFirst, 16},
      {Opcode::kReadResponseMiddle, "RC_RDMA_READ_RESPONSE_MIDDLE",
       kIsResponse | kIsRead | kHasPayload | kIsMiddle, 12},
      {Opcode::kReadResponseLast, "RC_RDMA_READ_RESPONSE_LAST",
       kIsResponse | kIsRead | kHasAeth | kHasPayload | kIsLast, 16},
      {Opcode::kReadResponseOnly, "RC_RDMA_READ_RESPONSE_ONLY",
       kIsResponse | kIsRead | kHasAeth | kHasPayload | kIsOnly, 16},
      {Opcode::kAcknowledge, "RC_ACKNOWLEDGE", kIsResponse | kHasAeth | kIsOnly, 16},
      {Opcode::kAtomicAcknowledge, "RC_ATOMIC_ACKNOWLEDGE",
       kIsResponse | kIsAtomic | kHasAeth | kHasAtomicAckEth | kIsOnly, 24},
      {Opcode::kCompareSwap, "RC_COMPARE_SWAP", kIsRequest | kIsAtomic | kHasAtomicEth | kIsOnly,
       40},
      {Opcode::kFetchAdd, "RC_FETCH_ADD", kIsRequest | kIsAtomic | kHasAtomicEth | kIsOnly, 40},
      {Opcode::kSendLastInv, "RC_SEND_LAST_WITH_INVALIDATE",
       kIsRequest | kIsSend | kHasPayload | kHasIeth | kIsLast | kConsumesRecvWqe, 16},
      {Opcode::kSendOnlyInv, "RC_SEND_ONLY_WITH_INVALIDATE",
       kIsRequest | kIsSend | kHasPayload | kHasIeth | kIsOnly | kConsumesRecvWqe, 16},
      {Opcode::kCnp, "CNP", kIsCnp, 28},
  };
  for (const Expect& e : rows) {
    const OpcodeInfo* info = opcode_info(op(e.o));
    ASSERT_NE(info, nullptr);
    EXPECT_STREQ(info->name, e.name);
    EXPECT_EQ(info->mask, e.mask) << e.name;
    EXPECT_EQ(info->header_bytes, e.bytes) << e.name;
  }
}

// A RoCEv2 CNP (IBTA annex A17.9.3): opcode 0x81, BECN, MigReq 0, PSN 0, the default
// P_Key, DestQP, then 16 zero bytes; it parses back as a CNP to that QP.
TEST(Cnp, EncodesAsAnnexA17AndParsesBack) {
  std::array<uint8_t, kMaxTransportHeaderBytes> out{};
  out.fill(0xee);
  const size_t n = encode_headers(cnp_headers(0x123456), out);
  ASSERT_EQ(n, kBthBytes + 16);
  EXPECT_EQ(out[0], 0x81);
  EXPECT_EQ(out[1], 0x00);  // SE 0, M 0, pad 0, TVer 0
  EXPECT_EQ(out[2] << 8 | out[3], kDefaultPkey);
  EXPECT_EQ(out[4], 0x40);  // BECN
  EXPECT_EQ(out[5] << 16 | out[6] << 8 | out[7], 0x123456);
  EXPECT_EQ(out[8], 0);
  EXPECT_EQ(out[9] | out[10] | out[11], 0);  // PSN 0
  for (size_t i = kBthBytes; i < n; ++i) EXPECT_EQ(out[i], 0) << i;
  std::vector<uint8_t> bytes(out.begin(), out.begin() + static_cast<ptrdiff_t>(n));
  bytes.resize(n + kIcrcBytes, 0);
  Packet p;
  ASSERT_EQ(parse(bytes, p), ParseError::kOk);
  EXPECT_TRUE(p.info->mask & kIsCnp);
  EXPECT_EQ(p.hdr.bth.dest_qpn, 0x123456u);
  EXPECT_TRUE(p.hdr.bth.becn);
  EXPECT_TRUE(p.payload.empty());
}

TEST(Parse, RoundTripEveryOpcode) {
  for (uint8_t o : known_opcodes()) {
    const OpcodeInfo* info = opcode_info(o);
    const bool payload = info->mask & kHasPayload;
    for (size_t len :
         payload ? std::vector<size_t>{0, 1, 2, 3, 4, 5, 1024, 4096} : std::vector<size_t>{0}) {
      const uint8_t pad = pad_for(len);
      const Headers h = sample_headers(o, pad);
      const std::vector<uint8_t> pkt = build(h, len);
      Packet p;
      ASSERT_EQ(parse(pkt, p), ParseError::kOk) << info->name << " len " << len;
      EXPECT_EQ(p.info, info);
      EXPECT_EQ(received_icrc(pkt), 0x44332211u);
      EXPECT_EQ(p.payload.size(), len);
      EXPECT_EQ(p.payload.data(), pkt.data() + info->header_bytes);
      const Bth& b = p.hdr.bth;
      EXPECT_EQ(b.opcode, o);
      EXPECT_TRUE(b.solicited);
      EXPECT_TRUE(b.mig_req);
      EXPECT_EQ(b.pad_count, pad);
      EXPECT_EQ(b.tver, 0);
      EXPECT_EQ(b.pkey, 0x8001);
      EXPECT_TRUE(b.fecn);
      EXPECT_FALSE(b.becn);
      EXPECT_EQ(b.dest_qpn, 0xabcdefu);
      EXPECT_TRUE(b.ack_req);
      EXPECT_EQ(b.psn, 0xfedcbau);
      const Headers def;
      if (info->mask & kHasReth) {
        EXPECT_EQ(p.hdr.reth.va, h.reth.va);
        EXPECT_EQ(p.hdr.reth.rkey, h.reth.rkey);
        EXPECT_EQ(p.hdr.reth.dma_length, h.reth.dma_length);
      } else {
        EXPECT_EQ(p.hdr.reth.va, def.reth.va);
      }
      if (info->mask & kHasAeth) {
        EXPECT_EQ(p.hdr.aeth.syndrome, h.aeth.syndrome);
        EXPECT_EQ(p.hdr.aeth.msn, h.aeth.msn);
      } else {
        EXPECT_EQ(p.hdr.aeth.msn, def.aeth.msn);
      }
      if (info->mask & kHasAtomicEth) {
        EXPECT_EQ(p.hdr.atomic.va, h.atomic.va);
        EXPECT_EQ(p.hdr.atomic.rkey, h.atomic.rkey);
        EXPECT_EQ(p.hdr.atomic.swap_add, h.atomic.swap_add);
        EXPECT_EQ(p.hdr.atomic.compare, h.atomic.compare);
      } else {
        EXPECT_EQ(p.hdr.atomic.va, def.atomic.va);
      }
      if (info->mask & kHasAtomicAckEth) {
        EXPECT_EQ(p.hdr.atomic_ack.orig, h.atomic_ack.orig);
      } else {
        EXPECT_EQ(p.hdr.atomic_ack.orig, def.atomic_ack.orig);
      }
      EXPECT_EQ(p.hdr.imm_be, (info->mask & kHasImmDt) ? h.imm_be : 0u);
      EXPECT_EQ(p.hdr.ieth_rkey, (info->mask & kHasIeth) ? h.ieth_rkey : 0u);
      EXPECT_EQ(p.hdr.deth.qkey, (info->mask & kHasDeth) ? h.deth.qkey : 0u);
      EXPECT_EQ(p.hdr.deth.src_qpn, (info->mask & kHasDeth) ? h.deth.src_qpn : 0u);
      EXPECT_EQ(p.hdr.xrceth.srqn, (info->mask & kHasXrceth) ? h.xrceth.srqn : 0u);
      for (size_t i = 0; i < len; ++i) ASSERT_EQ(p.payload[i], static_cast<uint8_t>(i));

      // Re-encoding the parsed headers reproduces the bytes.
      std::array<uint8_t, kMaxTransportHeaderBytes> again{};
      ASSERT_EQ(encode_headers(p.hdr, again), info->header_bytes);
      EXPECT_EQ(0, std::memcmp(again.data(), pkt.data(), info->header_bytes)) << info->name;
    }
  }
}

TEST(Encode, WireLayout) {
  // RDMA WRITE ONLY with immediate: BTH, RETH, ImmDt, byte by byte.
  Headers h = sample_headers(Opcode::kWriteOnlyImm, 2);
  h.bth.becn = true;
  h.bth.fecn = false;
  h.bth.solicited = false;
  std::array<uint8_t, 32> b{};
  ASSERT_EQ(encode_headers(h, b), 32u);
  const std::array<uint8_t, 32> want = {
      0x0b, 0x60, 0x80, 0x01, 0x40, 0xab, 0xcd, 0xef, 0x80, 0xfe, 0xdc, 0xba,  // BTH
      0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef,                          // VA
      0xde, 0xad, 0xbe, 0xef, 0x00, 0x10, 0x00, 0x00,                          // rkey, len
      0x01, 0x02, 0x03, 0x04,                                                  // ImmDt
  };
  EXPECT_EQ(b, want);

  // Atomic ACK: BTH, AETH, AtomicAckETH.
  h = sample_headers(Opcode::kAtomicAcknowledge, 0);
  h.bth.mig_req = false;
  h.bth.ack_req = false;
  h.aeth = {aeth_ack(), 0x000102};
  std::array<uint8_t, 24> a{};
  ASSERT_EQ(encode_headers(h, a), 24u);
  const std::array<uint8_t, 24> want_a = {
      0x12, 0x80, 0x80, 0x01, 0x80, 0xab, 0xcd, 0xef, 0x00, 0xfe, 0xdc, 0xba,
      0x1f, 0x00, 0x01, 0x02, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,
  };
  EXPECT_EQ(a, want_a);

  // Compare & swap: BTH, AtomicETH (VA, rkey, swap, compare).
  h = sample_headers(Opcode::kCompareSwap, 0);
  std::array<uint8_t, 40> c{};
  ASSERT_EQ(encode_headers(h, c), 40u);
  const std::array<uint8_t, 28> want_c = {
      0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xca, 0xfe, 0xf0, 0x0d, 0xa5, 0xa5,
      0xa5, 0xa5, 0x5a, 0x5a, 0x5a, 0x5a, 0x0f, 0x0f, 0x0f, 0x0f, 0xf0, 0xf0, 0xf0, 0xf0,
  };
  EXPECT_EQ(0, std::memcmp(c.data() + 12, want_c.data(), 28));

  // CNP: 16 reserved bytes written as zero.
  h = sample_headers(Opcode::kCnp, 0);
  std::array<uint8_t, 28> n;
  n.fill(0xee);
  ASSERT_EQ(encode_headers(h, n), 28u);
  for (size_t i = 12; i < 28; ++i) EXPECT_EQ(n[i], 0) << i;
}

// RDMA ATOMIC WRITE (IBTA vol 1 rel. 1.5; rxe's IB_OPCODE_RC_ATOMIC_WRITE): opcode 0x1D, BTH then
// RETH (VA, R_Key, DMA length 8), then the 8 bytes to store, no pad, the ICRC.
TEST(Encode, AtomicWriteIsRethAndEightBytes) {
  const OpcodeInfo* info = opcode_info(0x1d);
  ASSERT_NE(info, nullptr);
  EXPECT_STREQ(info->name, "RC_ATOMIC_WRITE");
  EXPECT_EQ(info->service, Service::kRc);
  EXPECT_EQ(info->header_bytes, kBthBytes + kRethBytes);
  EXPECT_EQ(info->mask & (kIsRequest | kIsAtomicWrite | kHasReth | kHasPayload | kIsOnly),
            kIsRequest | kIsAtomicWrite | kHasReth | kHasPayload | kIsOnly);
  // Neither a WRITE (it is not placed like one) nor an atomic with an AtomicETH / atomic ACK.
  EXPECT_EQ(info->mask & (kIsWrite | kIsAtomic | kHasAtomicEth | kConsumesRecvWqe), 0u);
  EXPECT_EQ(opcode_of(Service::kRc, Opcode::kAtomicWrite), 0x1d);

  Headers h = sample_headers(Opcode::kAtomicWrite, 0);
  h.bth.fecn = false;
  h.bth.solicited = false;
  h.reth = {0x00007f0012345678ull, 0x00abcdef, kAtomicWriteBytes};
  std::vector<uint8_t> pkt = build(h, kAtomicWriteBytes);
  ASSERT_EQ(pkt.size(), kBthBytes + kRethBytes + kAtomicWriteBytes + kIcrcBytes);
  const std::array<uint8_t, 28> want = {
      0x1d, 0x40, 0x80, 0x01, 0x00, 0xab, 0xcd, 0xef, 0x80, 0xfe, 0xdc, 0xba,  // BTH
      0x00, 0x00, 0x7f, 0x00, 0x12, 0x34, 0x56, 0x78,                          // VA
      0x00, 0xab, 0xcd, 0xef, 0x00, 0x00, 0x00, 0x08,                          // R_Key, length
  };
  EXPECT_EQ(0, std::memcmp(pkt.data(), want.data(), want.size()));
  for (size_t i = 0; i < kAtomicWriteBytes; ++i) EXPECT_EQ(pkt[28 + i], i);  // the value

  Packet p;
  ASSERT_EQ(parse(pkt, p), ParseError::kOk);
  EXPECT_EQ(p.info, info);
  EXPECT_EQ(p.hdr.reth.va, 0x00007f0012345678ull);
  EXPECT_EQ(p.hdr.reth.rkey, 0x00abcdefu);
  EXPECT_EQ(p.hdr.reth.dma_length, kAtomicWriteBytes);
  ASSERT_EQ(p.payload.size(), kAtomicWriteBytes);
  EXPECT_EQ(p.payload[7], 7);
  EXPECT_TRUE(p.hdr.bth.ack_req);
}

// SEND ONLY with invalidate: the IETH (IBTA vol 1, 9.3.7) is the R_Key, big-endian, right
// after the BTH (after the XRCETH in XRC); the payload follows it.
TEST(Encode, IethFollowsBth) {
  Headers h = sample_headers(Opcode::kSendOnlyInv, 0);
  const std::vector<uint8_t> pkt = build(h, 4);
  ASSERT_EQ(pkt.size(), kBthBytes + kIethBytes + 4 + kIcrcBytes);
  EXPECT_EQ(pkt[12], 0x89);
  EXPECT_EQ(pkt[13], 0xab);
  EXPECT_EQ(pkt[14], 0xcd);
  EXPECT_EQ(pkt[15], 0xef);
  EXPECT_EQ(pkt[16], 0);  // payload byte 0
  const OpcodeInfo* x = opcode_info(0xb7);
  ASSERT_NE(x, nullptr);
  EXPECT_STREQ(x->name, "XRC_SEND_ONLY_WITH_INVALIDATE");
}

TEST(Encode, RejectsUnknownOrShort) {
  Headers h = sample_headers(Opcode::kSendOnly, 0);
  std::array<uint8_t, 64> b{};
  h.bth.opcode = 0x15;
  EXPECT_EQ(encode_headers(h, b), 0u);
  h.bth.opcode = op(Opcode::kCompareSwap);
  EXPECT_EQ(encode_headers(h, std::span<uint8_t>(b).first(39)), 0u);
  EXPECT_EQ(encode_headers(h, std::span<uint8_t>(b).first(40)), 40u);
  EXPECT_EQ(encode_headers(h, std::span<uint8_t>()), 0u);
}

TEST(Encode, MasksOversizedFields) {
  Headers h = sample_headers(Opcode::kAcknowledge, 0);
  h.bth.dest_qpn = 0xff123456;
  h.bth.psn = 0x01abcdef;
  h.aeth.msn = 0xff000001;
  std::array<uint8_t, 16> b{};
  ASSERT_EQ(encode_headers(h, b), 16u);
  std::array<uint8_t, 20> pkt{};
  std::memcpy(pkt.data(), b.data(), 16);
  Packet p;
  ASSERT_EQ(parse(pkt, p), ParseError::kOk);
  EXPECT_EQ(p.hdr.bth.dest_qpn, 0x123456u);
  EXPECT_EQ(p.hdr.bth.psn, 0xabcdefu);
  EXPECT_EQ(p.hdr.aeth.msn, 1u);
}

TEST(Parse, TruncatedAtEveryLength) {
  for (uint8_t o : known_opcodes()) {
    const OpcodeInfo* info = opcode_info(o);
    const size_t len = (info->mask & kHasPayload) ? 5 : 0;
    const std::vector<uint8_t> pkt = build(sample_headers(o, pad_for(len)), len);
    // Every prefix shorter than headers + pad + ICRC is truncated; copy it so ASan sees
    // any read past its end.
    const size_t min_len = info->header_bytes + pad_for(len) + kIcrcBytes;
    for (size_t n = 0; n < min_len; ++n) {
      std::vector<uint8_t> cut(pkt.begin(), pkt.begin() + static_cast<std::ptrdiff_t>(n));
      Packet p;
      EXPECT_EQ(parse(cut, p), ParseError::kTruncated) << info->name << " n=" << n;
    }
    // Longer prefixes of payload-carrying packets parse, with a shorter payload.
    for (size_t n = min_len; n <= pkt.size(); ++n) {
      std::vector<uint8_t> cut(pkt.begin(), pkt.begin() + static_cast<std::ptrdiff_t>(n));
      Packet p;
      EXPECT_EQ(parse(cut, p), ParseError::kOk) << info->name << " n=" << n;
      EXPECT_EQ(p.payload.size(), n - min_len);
    }
  }
  Packet p;
  EXPECT_EQ(parse(std::span<const uint8_t>(), p), ParseError::kTruncated);
}

TEST(Parse, BadVersion) {
  std::vector<uint8_t> pkt = build(sample_headers(Opcode::kSendOnly, 0), 8);
  for (uint8_t tver = 1; tver < 16; ++tver) {
    pkt[1] = static_cast<uint8_t>((pkt[1] & 0xf0) | tver);
    Packet p;
    EXPECT_EQ(parse(pkt, p), ParseError::kBadVersion);
  }
  Headers h = sample_headers(Opcode::kSendOnly, 0);
  h.bth.tver = 1;
  std::array<uint8_t, 16> b{};
  ASSERT_EQ(encode_headers(h, b), 12u);
  Packet p;
  EXPECT_EQ(parse(b, p), ParseError::kBadVersion);
}

TEST(Parse, UnknownOpcode) {
  std::vector<uint8_t> pkt = build(sample_headers(Opcode::kSendOnly, 0), 8);
  for (int o = 0; o < 256; ++o) {
    pkt[0] = static_cast<uint8_t>(o);
    Packet p;
    const ParseError e = parse(pkt, p);
    if (opcode_info(static_cast<uint8_t>(o)) == nullptr) {
      EXPECT_EQ(e, ParseError::kUnknownOpcode);
    }
  }
}

TEST(Parse, PadAndLengthOnPayloadlessOpcodes) {
  for (uint8_t o : known_opcodes()) {
    const OpcodeInfo* info = opcode_info(o);
    if (info->mask & kHasPayload) continue;
    std::vector<uint8_t> pkt = build(sample_headers(o, 0), 0);
    Packet p;
    ASSERT_EQ(parse(pkt, p), ParseError::kOk) << info->name;
    EXPECT_TRUE(p.payload.empty());
    for (uint8_t pad = 1; pad < 4; ++pad) {
      std::vector<uint8_t> padded = pkt;
      padded[1] = static_cast<uint8_t>((padded[1] & 0xcf) | (pad << 4));
      padded.insert(padded.end() - 4, pad, 0);
      EXPECT_EQ(parse(padded, p), ParseError::kBadPadCount) << info->name;
    }
    for (size_t extra = 1; extra <= 8; ++extra) {
      std::vector<uint8_t> longer = pkt;
      longer.insert(longer.end() - 4, extra, 0);
      EXPECT_EQ(parse(longer, p), ParseError::kBadLength) << info->name;
    }
  }
}

TEST(Parse, PadExcludedFromPayload) {
  for (size_t len = 0; len < 12; ++len) {
    std::vector<uint8_t> pkt = build(sample_headers(Opcode::kSendOnly, pad_for(len)), len);
    EXPECT_EQ(pkt.size() % 4, 0u);
    Packet p;
    ASSERT_EQ(parse(pkt, p), ParseError::kOk);
    EXPECT_EQ(p.payload.size(), len);
    EXPECT_EQ(p.hdr.bth.pad_count, pad_for(len));
  }
}

TEST(Parse, ReservedBitsIgnored) {
  std::vector<uint8_t> pkt = build(sample_headers(Opcode::kSendOnly, 0), 4);
  pkt[4] |= 0x3f;
  pkt[8] |= 0x7f;
  Packet p;
  ASSERT_EQ(parse(pkt, p), ParseError::kOk);
  EXPECT_EQ(p.hdr.bth.dest_qpn, 0xabcdefu);
  EXPECT_EQ(p.hdr.bth.psn, 0xfedcbau);
  EXPECT_TRUE(p.hdr.bth.fecn);
  EXPECT_TRUE(p.hdr.bth.ack_req);
}

// softrdma's capability, resend and placed marks sit in resv7 (BTH byte 8, bits 6-3): each
// encodes alone and parses back, and none disturbs AckReq.
TEST(Encode, SoftrdmaReservedBitsRoundTrip) {
  struct Case {
    bool Bth::*field;
    uint8_t bit;
  };
  for (Case c : {Case{&Bth::selective, 0x40}, Case{&Bth::resend, 0x20}, Case{&Bth::sack, 0x10},
                 Case{&Bth::placed, 0x08}, Case{&Bth::sack_ranges, 0x04}}) {
    Headers h = sample_headers(Opcode::kSendOnly, 0);
    h.bth.ack_req = false;
    h.bth.*c.field = true;
    std::vector<uint8_t> pkt = build(h, 4);
    EXPECT_EQ(pkt[8], c.bit);
    Packet p;
    ASSERT_EQ(parse(pkt, p), ParseError::kOk);
    EXPECT_TRUE(p.hdr.bth.*c.field);
    EXPECT_EQ(p.hdr.bth.selective, c.bit == 0x40);
    EXPECT_EQ(p.hdr.bth.resend, c.bit == 0x20);
    EXPECT_EQ(p.hdr.bth.sack, c.bit == 0x10);
    EXPECT_EQ(p.hdr.bth.placed, c.bit == 0x08);
    EXPECT_EQ(p.hdr.bth.sack_ranges, c.bit == 0x04);
    EXPECT_FALSE(p.hdr.bth.ack_req);
  }
}

// A selective ACK's list of missing runs: 4 + 8 × n bytes, big-endian PSNs, read back as
// written (across the PSN wrap); a list that is not ordered, overlaps, reaches the highest
// PSN, has bits above 24 or a wrong size is refused.
TEST(SackReport, EncodesBigEndianAndDecodesBackAcrossThePsnWrap) {
  SackReport r;
  r.highest = 0x000010;
  r.count = 3;
  r.ranges[0] = {0xfffffe, 0xffffff};
  r.ranges[1] = {0x000002, 0x000002};
  r.ranges[2] = {0x000005, 0x00000f};
  std::array<uint8_t, sack_report_bytes(SackReport::kSackRangesMax)> b{};
  ASSERT_EQ(encode_sack_report(r, b), 28u);
  EXPECT_EQ(std::vector<uint8_t>(b.begin(), b.begin() + 12),
            (std::vector<uint8_t>{0, 0, 0, 0x10, 0, 0xff, 0xff, 0xfe, 0, 0xff, 0xff, 0xff}));
  SackReport d;
  ASSERT_TRUE(decode_sack_report(std::span(b.data(), 28), d));
  EXPECT_EQ(d.highest, r.highest);
  ASSERT_EQ(d.count, 3u);
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(d.ranges[i].first, r.ranges[i].first);
    EXPECT_EQ(d.ranges[i].last, r.ranges[i].last);
  }
  EXPECT_TRUE(decode_sack_report(std::span(b.data(), 4), d));  // no run: valid, empty
  EXPECT_EQ(d.count, 0u);
  for (size_t n : {0, 3, 5, 11, 13, 27})
    EXPECT_FALSE(decode_sack_report(std::span(b.data(), n), d)) << n << " bytes";
  const auto refused = [&](const SackReport& bad) {
    std::array<uint8_t, sack_report_bytes(SackReport::kSackRangesMax)> e{};
    const size_t n = encode_sack_report(bad, e);
    return n && !decode_sack_report(std::span(e.data(), n), d);
  };
  SackReport bad = r;
  bad.ranges[1] = {0x000003, 0x000002};  // last before first
  EXPECT_TRUE(refused(bad));
  bad = r;
  bad.ranges[2] = {0x000002, 0x000004};  // overlaps the one before
  EXPECT_TRUE(refused(bad));
  bad = r;
  bad.ranges[2] = {0x000005, 0x000011};  // beyond the highest PSN that arrived
  EXPECT_TRUE(refused(bad));
  SackReport to_highest = r;
  to_highest.ranges[2] = {0x000005, 0x000010};  // up to it: it arrived and was not kept
  ASSERT_EQ(encode_sack_report(to_highest, b), 28u);
  EXPECT_TRUE(decode_sack_report(std::span(b.data(), 28), d));
  ASSERT_EQ(encode_sack_report(r, b), 28u);
  b[4] = 0x01;  // a first PSN with a bit above 24
  EXPECT_FALSE(decode_sack_report(std::span(b.data(), 28), d));
  bad.count = SackReport::kSackRangesMax + 1;
  EXPECT_EQ(encode_sack_report(bad, b), 0u);
}

// parse() lets a SackReport ride on an ACKNOWLEDGE whose AETH is the selective ACK, and only
// there: the same bytes after any other syndrome, or of another size, are kBadLength.
TEST(Parse, OnlyASelectiveAckCarriesASackReport) {
  Headers h = sample_headers(Opcode::kAcknowledge, 0);
  h.aeth.syndrome = aeth_nak(NakCode::kSelectiveAck);
  Packet p;
  for (size_t len : {4, 12, 132}) {
    ASSERT_EQ(parse(build(h, len), p), ParseError::kOk) << len;
    EXPECT_EQ(p.payload.size(), len);
  }
  for (size_t len : {8, 140}) EXPECT_EQ(parse(build(h, len), p), ParseError::kBadLength) << len;
  for (uint8_t syn : {aeth_ack(), aeth_nak(NakCode::kSelectiveRetransmit),
                      aeth_nak(NakCode::kPsnSequenceError)}) {
    h.aeth.syndrome = syn;
    EXPECT_EQ(parse(build(h, 12), p), ParseError::kBadLength) << int(syn);
  }
}

TEST(Parse, ErrorNames) {
  EXPECT_STREQ(to_string(ParseError::kOk), "ok");
  EXPECT_STREQ(to_string(ParseError::kTruncated), "truncated");
  for (ParseError e : {ParseError::kUnknownOpcode, ParseError::kBadVersion,
                       ParseError::kBadPadCount, ParseError::kBadLength}) {
    EXPECT_GT(std::string(to_string(e)).size(), 0u);
  }
}

TEST(Pad, PadFor) {
  EXPECT_EQ(pad_for(0), 0);
  EXPECT_EQ(pad_for(1), 3);
  EXPECT_EQ(pad_for(2), 2);
  EXPECT_EQ(pad_for(3), 1);
  EXPECT_EQ(pad_for(4), 0);
  EXPECT_EQ(pad_for(4097), 3);
}

TEST(Psn, Arithmetic) {
  EXPECT_EQ(psn_add(0xfffffe, 1), 0xffffffu);
  EXPECT_EQ(psn_add(0xffffff, 1), 0u);
  EXPECT_EQ(psn_add(0xffffff, 5), 4u);
  EXPECT_EQ(psn_add(0, 0x1000000), 0u);
  EXPECT_EQ(psn_diff(0, 0xffffff), 1);
  EXPECT_EQ(psn_diff(0xffffff, 0), -1);
  EXPECT_EQ(psn_diff(3, 0xfffffd), 6);
  EXPECT_EQ(psn_diff(0xfffffd, 3), -6);
  EXPECT_EQ(psn_diff(5, 5), 0);
  EXPECT_EQ(psn_diff(0x7fffff, 0), 0x7fffff);
  EXPECT_EQ(psn_diff(0x800000, 0), -0x800000);
  EXPECT_EQ(psn_diff(0, 0x800000), -0x800000);
  for (uint32_t base : {0u, 0x7fffffu, 0xfffff0u, 0xffffffu}) {
    for (uint32_t n : {0u, 1u, 15u, 16u, 1000u, 0x7fffffu}) {
      EXPECT_EQ(psn_diff(psn_add(base, n), base), static_cast<int32_t>(n));
      EXPECT_EQ(psn_diff(base, psn_add(base, n)), -static_cast<int32_t>(n));
    }
  }
  static_assert(psn_diff(1, 0xffffff) == 2);
}

TEST(Aeth, Syndromes) {
  EXPECT_EQ(aeth_ack(), 0x1f);
  EXPECT_EQ(aeth_ack(3), 0x03);
  EXPECT_EQ(aeth_kind(aeth_ack()), AckKind::kAck);
  EXPECT_EQ(aeth_kind(aeth_ack(0)), AckKind::kAck);
  EXPECT_EQ(aeth_rnr_nak(12), 0x2c);
  EXPECT_EQ(aeth_rnr_nak(0xff), 0x3f);
  EXPECT_EQ(aeth_kind(aeth_rnr_nak(31)), AckKind::kRnrNak);
  EXPECT_EQ(aeth_nak(NakCode::kPsnSequenceError), 0x60);
  EXPECT_EQ(aeth_nak(NakCode::kInvalidRequest), 0x61);
  EXPECT_EQ(aeth_nak(NakCode::kRemoteAccessError), 0x62);
  EXPECT_EQ(aeth_nak(NakCode::kRemoteOperationalError), 0x63);
  EXPECT_EQ(aeth_nak(NakCode::kInvalidRdRequest), 0x64);
  EXPECT_EQ(aeth_kind(aeth_nak(NakCode::kInvalidRdRequest)), AckKind::kNak);
  EXPECT_EQ(aeth_kind(0x40), AckKind::kReserved);
  EXPECT_EQ(aeth_kind(0x80), AckKind::kReserved);
  EXPECT_EQ(aeth_kind(0xff), AckKind::kReserved);
}

TEST(Rnr, TimerTable) {
  EXPECT_EQ(rnr_timer_usec(0), 655360u);
  EXPECT_EQ(rnr_timer_usec(1), 10u);
  EXPECT_EQ(rnr_timer_usec(2), 20u);
  EXPECT_EQ(rnr_timer_usec(12), 640u);
  EXPECT_EQ(rnr_timer_usec(14), 1280u);
  EXPECT_EQ(rnr_timer_usec(18), 5120u);
  EXPECT_EQ(rnr_timer_usec(30), 327680u);
  EXPECT_EQ(rnr_timer_usec(31), 491520u);
  for (uint8_t c = 2; c < 32; ++c) EXPECT_GT(rnr_timer_usec(c), rnr_timer_usec(c - 1)) << int(c);
  // Only the 5-bit field is used.
  EXPECT_EQ(rnr_timer_usec(32 + 1), 10u);
}

}  // namespace
}  // namespace softrdma::wire
