// Tests of the RoCEv2 ICRC: a real-hardware vector, IPv4 id recovery, corruption detection,
// incremental computation and the IPv4/UDP header encoder.
#include "wire/icrc.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "wire/roce.h"

namespace softrdma::wire {
namespace {

constexpr uint32_t ip(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return (uint32_t{a} << 24) | (uint32_t{b} << 16) | (uint32_t{c} << 8) | d;
}

// A CNP captured on a ConnectX-4 Lx (public scapy test data; docs/DESIGN "Facts worth
// knowing"). Ethernet frame:
//   e41d2dab2bc2 7cfe90643b32 0800
//   45c2003c 718c4000 4011 9161 0a001101 0a001201    IPv4: TOS 0xc2, id 0x718c, DF, TTL 64
//   0000 12b7 0028 0000                              UDP: sport 0, dport 4791, len 40
//   8100ffff 40000118 00000000                       BTH: CNP, BECN, QP 0x118
//   16 zero bytes                                    CNP reserved
//   82fd002a                                         ICRC
Ipv4UdpTuple cnp_tuple() {
  Ipv4UdpTuple t;
  t.src_ip = ip(10, 0, 17, 1);
  t.dst_ip = ip(10, 0, 18, 1);
  t.src_port = 0;
  t.dst_port = kRoceV2Port;
  t.ip_id = 0x718c;
  t.dont_fragment = true;
  return t;
}

std::vector<uint8_t> cnp_udp_payload() {
  static constexpr uint8_t kBth[] = {0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18};
  static constexpr uint8_t kIcrc[] = {0x82, 0xfd, 0x00, 0x2a};
  std::vector<uint8_t> p(kBthBytes + 16 + kIcrcBytes, 0);  // BTH, CNP reserved, ICRC
  std::memcpy(p.data(), kBth, sizeof kBth);
  std::memcpy(p.data() + p.size() - kIcrcBytes, kIcrc, sizeof kIcrc);
  return p;
}

void put_icrc(std::vector<uint8_t>& pkt, uint32_t icrc) {
  for (size_t i = 0; i < 4; ++i) pkt[pkt.size() - 4 + i] = static_cast<uint8_t>(icrc >> (8 * i));
}

/// A SEND_ONLY with `len` bytes of patterned payload and a correct ICRC for `t`.
std::vector<uint8_t> send_only(const Ipv4UdpTuple& t, size_t len) {
  Headers h;
  h.bth.opcode = static_cast<uint8_t>(Opcode::kSendOnly);
  h.bth.dest_qpn = 0x000123;
  h.bth.psn = 0x345678;
  h.bth.ack_req = true;
  h.bth.pad_count = pad_for(len);
  std::vector<uint8_t> pkt(kBthBytes + len + pad_for(len) + kIcrcBytes);
  EXPECT_EQ(encode_headers(h, pkt), kBthBytes);
  for (size_t i = 0; i < len; ++i) pkt[kBthBytes + i] = static_cast<uint8_t>(i * 7 + 1);
  put_icrc(pkt, icrc_compute(t, std::span<const uint8_t>(pkt).first(pkt.size() - 4)));
  return pkt;
}

Ipv4UdpTuple local_tuple() {
  Ipv4UdpTuple t;
  t.src_ip = ip(127, 0, 0, 2);
  t.dst_ip = ip(127, 0, 0, 3);
  t.src_port = 0xc123;
  return t;
}

TEST(Icrc, HardwareVectorExact) {
  const std::vector<uint8_t> pkt = cnp_udp_payload();
  const auto body = std::span<const uint8_t>(pkt).first(pkt.size() - 4);
  EXPECT_EQ(icrc_compute(cnp_tuple(), body), 0x2a00fd82u);

  Packet p;
  ASSERT_EQ(parse(pkt, p), ParseError::kOk);
  EXPECT_EQ(p.info->mask & kIsCnp, kIsCnp);
  EXPECT_TRUE(p.hdr.bth.becn);
  EXPECT_EQ(p.hdr.bth.dest_qpn, 0x118u);
  EXPECT_EQ(received_icrc(pkt), 0x2a00fd82u);

  const IcrcVerdict v = icrc_verify(cnp_tuple(), pkt);
  EXPECT_TRUE(v.ok);
  EXPECT_TRUE(v.exact);
  EXPECT_EQ(v.ip_id, 0x718c);
  EXPECT_TRUE(v.dont_fragment);
}

TEST(Icrc, HardwareVectorRecoversId) {
  const std::vector<uint8_t> pkt = cnp_udp_payload();
  Ipv4UdpTuple t = cnp_tuple();
  t.ip_id = 0;
  IcrcVerdict v = icrc_verify(t, pkt);
  EXPECT_TRUE(v.ok);
  EXPECT_FALSE(v.exact);
  EXPECT_EQ(v.ip_id, 0x718c);
  EXPECT_TRUE(v.dont_fragment);

  // DF guessed wrong as well.
  t.dont_fragment = false;
  v = icrc_verify(t, pkt);
  EXPECT_TRUE(v.ok);
  EXPECT_FALSE(v.exact);
  EXPECT_EQ(v.ip_id, 0x718c);
  EXPECT_TRUE(v.dont_fragment);

  // A different address is not explained by any id.
  t = cnp_tuple();
  t.src_ip = ip(10, 0, 17, 2);
  t.ip_id = 0;
  EXPECT_FALSE(icrc_verify(t, pkt).ok);
}

TEST(Icrc, EcnBitsAreMasked) {
  const Ipv4UdpTuple t = local_tuple();
  std::vector<uint8_t> pkt = send_only(t, 33);
  const uint32_t base = icrc_compute(t, std::span<const uint8_t>(pkt).first(pkt.size() - 4));
  pkt[4] |= 0xc0;  // FECN + BECN, as a switch may set them in flight
  EXPECT_EQ(icrc_compute(t, std::span<const uint8_t>(pkt).first(pkt.size() - 4)), base);
  EXPECT_TRUE(icrc_verify(t, pkt).exact);
}

TEST(Icrc, RecoversRandomIds) {
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 500; ++iter) {
    Ipv4UdpTuple sent = local_tuple();
    sent.ip_id = static_cast<uint16_t>(rng());
    sent.dont_fragment = rng() & 1;
    const size_t len = rng() % 2000;
    const std::vector<uint8_t> pkt = send_only(sent, len);

    Ipv4UdpTuple seen = sent;
    seen.ip_id = 0;
    seen.dont_fragment = true;
    const IcrcVerdict v = icrc_verify(seen, pkt);
    ASSERT_TRUE(v.ok) << iter;
    EXPECT_EQ(v.exact, sent.ip_id == 0 && sent.dont_fragment);
    EXPECT_EQ(v.ip_id, sent.ip_id);
    EXPECT_EQ(v.dont_fragment, sent.dont_fragment);
  }
}

TEST(Icrc, ZeroIdSenderIsExact) {
  const Ipv4UdpTuple t = local_tuple();  // id 0, DF: what softrdma senders emit
  for (size_t len : {0, 1, 2, 3, 4, 100, 1024, 4096}) {
    const std::vector<uint8_t> pkt = send_only(t, len);
    const IcrcVerdict v = icrc_verify(t, pkt);
    EXPECT_TRUE(v.ok);
    EXPECT_TRUE(v.exact);
    EXPECT_EQ(v.ip_id, 0);
    EXPECT_TRUE(v.dont_fragment);
  }
}

// A GSO sender computes each packet's ICRC for id 0 and moves it to the id the kernel gives
// segment k; the result equals computing the ICRC with that id from scratch.
TEST(Icrc, IdAdjustmentMatchesRecompute) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 300; ++iter) {
    Ipv4UdpTuple t = local_tuple();
    const size_t len = rng() % 4200;
    const std::vector<uint8_t> at0 = send_only(t, len);
    const uint32_t icrc0 = uint32_t{at0[at0.size() - 4]} | uint32_t{at0[at0.size() - 3]} << 8 |
                           uint32_t{at0[at0.size() - 2]} << 16 |
                           uint32_t{at0[at0.size() - 1]} << 24;
    t.ip_id = static_cast<uint16_t>(iter < 64 ? iter : rng());
    const std::vector<uint8_t> want = send_only(t, len);
    std::vector<uint8_t> got = at0;
    put_icrc(got, icrc_with_ip_id(icrc0, 0, t.ip_id, got.size()));
    ASSERT_EQ(got, want) << "len " << len << " id " << t.ip_id;
    const IcrcVerdict v = icrc_verify(t, got);
    EXPECT_TRUE(v.ok && v.exact);
  }
}

// Every single-bit corruption fails the exact check. With the id unknown, icrc_verify()
// solves for 17 bits against 32, so a corruption is explained by some *other* (id, DF)
// with probability about 2^-15 (which flips those are depends only on the packet length):
// never the true one, and rarely.
TEST(Icrc, EverySingleBitFlipFails) {
  const Ipv4UdpTuple t = local_tuple();
  size_t flips = 0;
  size_t explained = 0;
  for (size_t len : {0, 61, 256, 1500}) {
    const std::vector<uint8_t> pkt = send_only(t, len);
    ASSERT_TRUE(icrc_verify(t, pkt).exact);
    for (size_t byte = 0; byte < pkt.size(); ++byte) {
      if (byte == 4) continue;  // BTH FECN/BECN/resv6a: masked, not covered
      for (int bit = 0; bit < 8; ++bit) {
        std::vector<uint8_t> bad = pkt;
        bad[byte] ^= static_cast<uint8_t>(1u << bit);
        const uint32_t received =
            uint32_t{bad[bad.size() - 4]} | (uint32_t{bad[bad.size() - 3]} << 8) |
            (uint32_t{bad[bad.size() - 2]} << 16) | (uint32_t{bad[bad.size() - 1]} << 24);
        EXPECT_NE(icrc_compute(t, std::span<const uint8_t>(bad).first(bad.size() - 4)), received);
        const IcrcVerdict v = icrc_verify(t, bad);
        EXPECT_FALSE(v.exact) << "len " << len << " byte " << byte << " bit " << bit;
        ++flips;
        if (v.ok) {
          ++explained;
          EXPECT_TRUE(v.ip_id != t.ip_id || v.dont_fragment != t.dont_fragment);
          Ipv4UdpTuple u = t;  // and the (id, DF) it reports really does explain it
          u.ip_id = v.ip_id;
          u.dont_fragment = v.dont_fragment;
          EXPECT_TRUE(icrc_verify(u, bad).exact);
        }
      }
    }
  }
  EXPECT_GT(flips, 15000u);
  EXPECT_LE(explained, flips / 2000) << explained << " of " << flips;
}

// The false-accept rate of id recovery, measured: every truncation of 240 WRITE middles of
// random, all-zero and counting payloads (64 B … 4 KiB; ~500,000 truncated datagrams) is
// checked against the solver. With 17 unknown bits (the IPv4 id and DF) against 32 CRC bits a
// wrong packet passes with probability 2^-15 (~16 expected here); the bound below (40, 2.5x)
// fails for a solver that accepted at 2^-13 or worse (~62 expected). Seeded: deterministic.
// docs/architecture.md quotes the rate (issue 21: 2^-12 had been reported).
TEST(Icrc, TruncatedPacketsPassTheIdSolverAtAbout2ToTheMinus15) {
  const Ipv4UdpTuple t = local_tuple();
  std::mt19937_64 rng(21);
  uint64_t tried = 0, accepted = 0;
  for (int mode = 0; mode < 3; ++mode) {
    for (int n = 0; n < 80; ++n) {
      const size_t len = 64 + rng() % 4033;
      Headers h;
      h.bth.opcode = static_cast<uint8_t>(Opcode::kWriteMiddle);
      h.bth.dest_qpn = static_cast<uint32_t>(rng() & 0xffffff);
      h.bth.psn = static_cast<uint32_t>(rng() & 0xffffff);
      h.bth.pad_count = pad_for(len);
      std::vector<uint8_t> pkt(kBthBytes + len + pad_for(len) + kIcrcBytes);
      ASSERT_EQ(encode_headers(h, pkt), kBthBytes);
      for (size_t i = 0; i < len; ++i)
        pkt[kBthBytes + i] = mode == 0   ? static_cast<uint8_t>(rng())
                             : mode == 1 ? 0
                                         : static_cast<uint8_t>(i);
      put_icrc(pkt, icrc_compute(t, std::span<const uint8_t>(pkt).first(pkt.size() - 4)));
      ASSERT_TRUE(icrc_verify(t, pkt).exact);
      for (size_t cut = kBthBytes + kIcrcBytes; cut < pkt.size(); ++cut, ++tried)
        accepted += icrc_verify(t, std::span<const uint8_t>(pkt).first(cut)).ok;
    }
  }
  const double rate = static_cast<double>(accepted) / static_cast<double>(tried);
  std::printf("[ icrc     ] %llu of %llu truncated datagrams accepted: %.2e = 2^%.1f\n",
              static_cast<unsigned long long>(accepted), static_cast<unsigned long long>(tried),
              rate, accepted ? std::log2(rate) : -99.0);
  EXPECT_GT(tried, 450000u);
  EXPECT_LE(accepted, 40u) << "id recovery accepts corrupt packets far above 2^-15";
}

TEST(Icrc, HeaderFieldsAreCovered) {
  const Ipv4UdpTuple t = local_tuple();
  const std::vector<uint8_t> pkt = send_only(t, 40);
  Ipv4UdpTuple u = t;
  u.dst_ip ^= 1;
  EXPECT_FALSE(icrc_verify(u, pkt).ok);
  u = t;
  u.src_port ^= 0x100;
  EXPECT_FALSE(icrc_verify(u, pkt).ok);
  u = t;
  u.dst_port = 4792;
  EXPECT_FALSE(icrc_verify(u, pkt).ok);
}

TEST(Icrc, AccumulatorMatchesOneShot) {
  std::mt19937 rng(99);
  const Ipv4UdpTuple t = local_tuple();
  for (int iter = 0; iter < 200; ++iter) {
    const size_t len = rng() % 5000;
    const std::vector<uint8_t> pkt = send_only(t, len);
    const auto body = std::span<const uint8_t>(pkt).first(pkt.size() - 4);
    const uint32_t one_shot = icrc_compute(t, body);

    IcrcAccumulator acc(t, pkt.size(), body.first(kBthBytes));
    size_t off = kBthBytes;
    while (off < body.size()) {
      const size_t n = std::min<size_t>(rng() % 300, body.size() - off);
      acc.update(body.subspan(off, n));  // n may be 0: empty pieces change nothing
      off += n;
    }
    acc.update({});
    EXPECT_EQ(acc.finish(), one_shot);
    EXPECT_EQ(acc.finish(), acc.finish());
  }
}

TEST(Icrc, ShortInputRejected) {
  const std::vector<uint8_t> pkt = cnp_udp_payload();
  for (size_t n = 0; n < kBthBytes + kIcrcBytes; ++n) {
    std::vector<uint8_t> cut(pkt.begin(), pkt.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_FALSE(icrc_verify(cnp_tuple(), cut).ok) << n;
  }
}

uint16_t ones_complement_sum(const uint8_t* p, size_t n) {
  uint32_t sum = 0;
  for (size_t i = 0; i < n; i += 2) sum += (uint32_t{p[i]} << 8) | p[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

TEST(Ipv4Udp, MatchesCapturedHeader) {
  std::array<uint8_t, kIpv4UdpHeaderBytes> h{};
  encode_ipv4_udp(cnp_tuple(), 32, /*ttl=*/64, /*tos=*/0xc2, h);
  const std::array<uint8_t, kIpv4UdpHeaderBytes> want = {
      0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00,
      0x11, 0x01, 0x0a, 0x00, 0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00,
  };
  EXPECT_EQ(h, want);
  EXPECT_EQ(ones_complement_sum(h.data(), 20), 0xffff);
}

TEST(Ipv4Udp, ChecksumVerifies) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 1000; ++iter) {
    Ipv4UdpTuple t;
    t.src_ip = static_cast<uint32_t>(rng());
    t.dst_ip = static_cast<uint32_t>(rng());
    t.src_port = static_cast<uint16_t>(rng());
    t.ip_id = static_cast<uint16_t>(rng());
    t.dont_fragment = rng() & 1;
    const size_t len = rng() % 9000;
    std::array<uint8_t, kIpv4UdpHeaderBytes> h{};
    encode_ipv4_udp(t, len, static_cast<uint8_t>(rng()), static_cast<uint8_t>(rng()), h);
    EXPECT_EQ(ones_complement_sum(h.data(), 20), 0xffff);
    EXPECT_EQ((h[2] << 8) | h[3], 28 + static_cast<int>(len));
    EXPECT_EQ((h[24] << 8) | h[25], 8 + static_cast<int>(len));
    EXPECT_EQ((h[22] << 8) | h[23], kRoceV2Port);
    EXPECT_EQ(h[26] | h[27], 0);
  }
  // Too small an output buffer is left alone.
  std::array<uint8_t, kIpv4UdpHeaderBytes - 1> small{};
  encode_ipv4_udp(cnp_tuple(), 32, 64, 0, small);
  for (uint8_t b : small) EXPECT_EQ(b, 0);
}

}  // namespace
}  // namespace softrdma::wire
