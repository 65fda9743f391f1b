// The tests' independent ICRC (rawpkt.cpp) and the engine's (wire/icrc.h) against a packet
// captured from real hardware (DESIGN.md: a CNP from a ConnectX-4 Lx, public scapy test
// data), and against each other on random packets. The raw-packet tests rely on both.
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "verbs/tests/rawpkt.h"
#include "wire/icrc.h"

namespace softrdma::verbs_test {
namespace {

std::vector<uint8_t> from_hex(const char* s) {
  std::vector<uint8_t> out;
  auto nib = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  for (; s[0] && s[1]; s += 2) out.push_back(static_cast<uint8_t>(nib(s[0]) << 4 | nib(s[1])));
  return out;
}

// UDP payload of the captured CNP: BTH (opcode 0x81, dest QP 0x000118, FECN-less) + 16-byte
// CNP pad + ICRC 82 fd 00 2a. IPv4 10.0.17.1 → 10.0.18.1, id 0x718c, DF; UDP 0 → 4791.
const std::vector<uint8_t> kCnp = from_hex(
    "8100ffff40000118"
    "00000000"
    "00000000000000000000000000000000"
    "82fd002a");

TEST(IcrcVector, IndependentImplementationMatchesHardware) {
  ASSERT_EQ(32u, kCnp.size());
  raw::Tuple t{0x0a001101, 0x0a001201, 0, 4791, 0x718c, true};
  EXPECT_EQ(0x2a00fd82u, raw::icrc(t, kCnp.data(), kCnp.size() - 4));
  uint16_t id = 0;
  EXPECT_TRUE(raw::icrc_matches(t, kCnp, 0xffff, &id));
  EXPECT_EQ(0x718c, id);
}

TEST(IcrcVector, WireImplementationMatchesHardware) {
  wire::Ipv4UdpTuple t;
  t.src_ip = 0x0a001101;
  t.dst_ip = 0x0a001201;
  t.src_port = 0;
  t.dst_port = 4791;
  t.ip_id = 0x718c;
  t.dont_fragment = true;
  EXPECT_EQ(0x2a00fd82u,
            wire::icrc_compute(t, std::span<const uint8_t>(kCnp.data(), kCnp.size() - 4)));
  // A UDP receiver does not see the id: it must recover it.
  t.ip_id = 0;
  const wire::IcrcVerdict v = wire::icrc_verify(t, kCnp);
  EXPECT_TRUE(v.ok);
  EXPECT_FALSE(v.exact);
  EXPECT_EQ(0x718c, v.ip_id);
  EXPECT_TRUE(v.dont_fragment);
}

TEST(IcrcVector, ImplementationsAgreeOnRandomPackets) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::vector<uint8_t> p(12 + rng() % 300);
    for (auto& c : p) c = static_cast<uint8_t>(rng());
    raw::Tuple rt{static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()),
                  static_cast<uint16_t>(rng()), 4791,
                  static_cast<uint16_t>(rng()), (rng() & 1) != 0};
    wire::Ipv4UdpTuple wt;
    wt.src_ip = rt.src_ip;
    wt.dst_ip = rt.dst_ip;
    wt.src_port = rt.src_port;
    wt.dst_port = rt.dst_port;
    wt.ip_id = rt.ip_id;
    wt.dont_fragment = rt.dont_fragment;
    ASSERT_EQ(raw::icrc(rt, p.data(), p.size()), wire::icrc_compute(wt, p)) << "packet " << i;
  }
}

}  // namespace
}  // namespace softrdma::verbs_test
