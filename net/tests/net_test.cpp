#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <thread>

#include "net/netem.h"
#include "net/udp_port.h"

using namespace softrdma::net;

TEST(Netem, ParsesAllKeys) {
  NetemConfig c;
  std::string err;
  ASSERT_TRUE(parse_netem("loss=5%,every=13,seed=42", c, err)) << err;
  EXPECT_DOUBLE_EQ(c.loss, 0.05);
  EXPECT_EQ(c.every, 13u);
  EXPECT_EQ(c.seed, 42u);
  ASSERT_TRUE(parse_netem("loss=0.25", c, err));
  EXPECT_DOUBLE_EQ(c.loss, 0.25);
}

TEST(Netem, RejectsBadInput) {
  NetemConfig c;
  std::string err;
  EXPECT_FALSE(parse_netem("loss=150%", c, err));
  EXPECT_FALSE(parse_netem("delay=5ms", c, err));
  EXPECT_NE(err.find("unknown key"), std::string::npos);
  EXPECT_FALSE(parse_netem("every=x", c, err));
  EXPECT_FALSE(parse_netem("loss", c, err));
}

TEST(Netem, EveryNthIsExact) {
  NetemConfig c;
  c.every = 4;
  Netem n(c);
  int drops = 0;
  for (int i = 1; i <= 100; ++i) {
    bool d = n.drop();
    EXPECT_EQ(d, i % 4 == 0);
    drops += d;
  }
  EXPECT_EQ(drops, 25);
}

TEST(Netem, RandomLossNearRate) {
  NetemConfig c;
  c.loss = 0.1;
  c.seed = 7;
  Netem n(c);
  int drops = 0;
  for (int i = 0; i < 100000; ++i) drops += n.drop();
  EXPECT_NEAR(drops / 100000.0, 0.1, 0.01);
}

TEST(UdpPort, LoopbackBatchRoundTrip) {
  uint32_t a = 0, b = 0;
  ASSERT_TRUE(ipv4_from_string("127.0.0.1", a));
  b = a;
  UdpPort tx, rx;
  ASSERT_EQ(rx.bind(b, 0, 1 << 20), 0);  // ephemeral port
  ASSERT_EQ(tx.bind(a, 0, 1 << 20), 0);
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  ASSERT_EQ(getsockname(rx.fd(), reinterpret_cast<sockaddr*>(&sa), &len), 0);
  uint16_t port = ntohs(sa.sin_port);

  std::array<uint8_t, 5> p0{1, 2, 3, 4, 5};
  std::array<uint8_t, 3> p1{9, 8, 7};
  iovec v0[2] = {{p0.data(), 2}, {p0.data() + 2, 3}};
  iovec v1[1] = {{p1.data(), 3}};
  TxDatagram d[2] = {{v0, 2, b, port}, {v1, 1, b, port}};
  size_t errors = 0;
  EXPECT_EQ(tx.send_batch(d, errors), 2u);
  EXPECT_EQ(errors, 0u);

  std::array<uint8_t, 4> small{};
  std::array<uint8_t, 64> big{};
  RxDatagram slots[2] = {{small.data(), small.size()}, {big.data(), big.size()}};
  size_t got = 0;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (got == 0 && std::chrono::steady_clock::now() < deadline) {
    got = rx.recv_batch(slots);
    if (!got) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(got, 1u);
  EXPECT_TRUE(slots[0].truncated);  // 5 bytes into a 4-byte buffer
  EXPECT_EQ(slots[0].src_ip, a);
  if (got < 2) got += rx.recv_batch(std::span(slots + 1, 1));
  ASSERT_EQ(got, 2u);
  EXPECT_EQ(slots[1].length, 3u);
  EXPECT_EQ(big[0], 9);
}

TEST(UdpPort, SecondBindOnSameAddressFails) {
  uint32_t a = 0;
  ASSERT_TRUE(ipv4_from_string("127.0.0.1", a));
  UdpPort p1, p2;
  ASSERT_EQ(p1.bind(a, 0, 0), 0);
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  ASSERT_EQ(getsockname(p1.fd(), reinterpret_cast<sockaddr*>(&sa), &len), 0);
  EXPECT_EQ(p2.bind(a, ntohs(sa.sin_port), 0), EADDRINUSE);
}
