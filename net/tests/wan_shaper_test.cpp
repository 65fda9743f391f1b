// WanShaper on a fake clock: which packets are shaped, the timed queue's order, copies
// (duplicate, corrupt), and a bottleneck shared between two shapers through /dev/shm.
#include "net/wan_shaper.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

namespace softrdma::net {
namespace {

constexpr uint32_t kA1 = 0x7f001401, kA2 = 0x7f001402, kB1 = 0x7f001501;  // 127.0.20.x/21.x
constexpr uint64_t kMs = 1'000'000;

const char* kTopo =
    "site a 127.0.20.0/24\n"
    "site b 127.0.21.0/24\n";

WanTopology topo(const std::string& text) {
  WanTopology t;
  std::string err;
  EXPECT_TRUE(parse_wan_topology(text, t, err)) << err;
  return t;
}

WanShaperConfig test_cfg() {
  WanShaperConfig c;
  c.name_prefix = "softrdma-test-" + std::to_string(::getpid()) + "-";
  return c;
}

struct Pkt {
  std::vector<uint8_t> bytes;
  iovec iov[2];
  explicit Pkt(size_t n, uint8_t fill = 0xAB) : bytes(n, fill) {
    // Two pieces, as the engine gathers headers and payload.
    iov[0] = {bytes.data(), n / 2};
    iov[1] = {bytes.data() + n / 2, n - n / 2};
  }
};

TEST(WanShaper, InsideASiteAndUnknownPeersAreNotShaped) {
  const std::string text = std::string(kTopo) + "link a <-> b delay=10ms\n";
  WanShaper s;
  ASSERT_EQ(s.open(kA1, topo(text), text, test_cfg()), 0);
  Pkt p(100);
  bool ce = true;
  EXPECT_EQ(s.submit(kA2, p.iov, 2, 100, 0, ce), WanVerdict::kSendNow);
  EXPECT_FALSE(ce);
  EXPECT_EQ(s.submit(0x7f00ff01, p.iov, 2, 100, 0, ce), WanVerdict::kSendNow);
  EXPECT_EQ(s.counters().shaped, 0u);
  EXPECT_EQ(s.submit(kB1, p.iov, 2, 100, 0, ce), WanVerdict::kHeld);
  EXPECT_EQ(s.counters().shaped, 1u);
  EXPECT_EQ(s.next_due_ns(), 10 * kMs);
}

TEST(WanShaper, TimedQueueReleasesCopiesInDepartureOrder) {
  const std::string text = std::string(kTopo) + "link a b delay=5ms\n";
  WanShaper s;
  ASSERT_EQ(s.open(kA1, topo(text), text, test_cfg()), 0);
  bool ce;
  for (uint8_t i = 0; i < 10; ++i) {
    Pkt p(64, i);
    ASSERT_EQ(s.submit(kB1, p.iov, 2, 64, i * kMs, ce), WanVerdict::kHeld);
    p.bytes.assign(64, 0xFF);  // the caller's buffer is reused at once: the copy must hold
  }
  EXPECT_EQ(s.held(), 10u);
  std::vector<uint8_t> got;
  EXPECT_EQ(s.release(4 * kMs, [&](const WanShaper::Packet&) { ADD_FAILURE(); }), 0u);
  EXPECT_EQ(s.release(7 * kMs + 1,
                      [&](const WanShaper::Packet& p) {
                        EXPECT_EQ(p.dst_ip, kB1);
                        ASSERT_EQ(p.bytes.size(), 64u);
                        got.push_back(p.bytes[0]);
                        EXPECT_EQ(p.bytes[63], p.bytes[0]);
                      }),
            3u);
  EXPECT_EQ(got, (std::vector<uint8_t>{0, 1, 2}));
  EXPECT_EQ(s.next_due_ns(), 8 * kMs);
  s.release(UINT64_MAX, [&](const WanShaper::Packet& p) { got.push_back(p.bytes[0]); });
  EXPECT_EQ(got.size(), 10u);
  EXPECT_EQ(s.counters().released, 10u);
  EXPECT_EQ(s.next_due_ns(), UINT64_MAX);
}

TEST(WanShaper, DuplicateAndCorruptAreCopies) {
  const std::string text = std::string(kTopo) + "link a b duplicate=100%\n";
  WanShaper s;
  ASSERT_EQ(s.open(kA1, topo(text), text, test_cfg()), 0);
  Pkt p(32, 0x11);
  bool ce;
  ASSERT_EQ(s.submit(kB1, p.iov, 2, 32, 100, ce), WanVerdict::kHeld);
  int n = 0;
  s.release(100, [&](const WanShaper::Packet& q) {
    ++n;
    EXPECT_EQ(q.bytes, p.bytes);
  });
  EXPECT_EQ(n, 2);
  EXPECT_EQ(s.counters().duplicated, 1u);

  const std::string t2 = std::string(kTopo) + "link a b corrupt=100%\n";
  WanShaper c;
  ASSERT_EQ(c.open(kA1, topo(t2), t2, test_cfg()), 0);
  ASSERT_EQ(c.submit(kB1, p.iov, 2, 32, 100, ce), WanVerdict::kHeld);
  c.release(100, [&](const WanShaper::Packet& q) {
    int bits = 0;
    for (size_t i = 0; i < 32; ++i) bits += __builtin_popcount(q.bytes[i] ^ p.bytes[i]);
    EXPECT_EQ(bits, 1) << "exactly one bit flipped";
  });
  EXPECT_TRUE(std::all_of(p.bytes.begin(), p.bytes.end(), [](uint8_t b) { return b == 0x11; }))
      << "the caller's bytes are never modified";
}

TEST(WanShaper, LossDropsAndEcnMarksPacketsSentNow) {
  const std::string text = std::string(kTopo) + "link a b loss=100%\n";
  WanShaper s;
  ASSERT_EQ(s.open(kA1, topo(text), text, test_cfg()), 0);
  Pkt p(100);
  bool ce;
  EXPECT_EQ(s.submit(kB1, p.iov, 2, 100, 0, ce), WanVerdict::kDropped);
  EXPECT_EQ(s.counters().dropped_loss, 1u);

  // 1 Gbit/s, ECN above 1000 B of backlog: the 2nd packet of a burst waits behind 1250 B.
  const std::string t2 = std::string(kTopo) + "link a b rate=1gbit ecn=1000\n";
  WanShaper e;
  ASSERT_EQ(e.open(kA1, topo(t2), t2, test_cfg()), 0);
  Pkt q(1250);
  EXPECT_EQ(e.submit(kB1, q.iov, 2, 1250, 0, ce), WanVerdict::kHeld);  // leaves at 10 µs
  EXPECT_FALSE(ce);
  EXPECT_EQ(e.submit(kB1, q.iov, 2, 1250, 0, ce), WanVerdict::kHeld);
  bool marked = false;
  e.release(UINT64_MAX, [&](const WanShaper::Packet& x) { marked |= x.ecn_ce; });
  EXPECT_TRUE(marked);
  EXPECT_EQ(e.counters().ecn_marked, 1u);
}

// Two devices of site a (two shapers, as two processes would have) behind one 1 Gbit/s link
// to site b share its queue through the clock file; the file goes with the last of them.
TEST(WanShaper, SitesShareTheBottleneck) {
  const std::string text = std::string(kTopo) + "link a b rate=1gbit queue=1m\n";
  const WanShaperConfig cfg = test_cfg();
  WanShaper s1, s2;
  ASSERT_EQ(s1.open(kA1, topo(text), text, cfg), 0);
  ASSERT_EQ(s2.open(kA2, topo(text), text, cfg), 0);
  Pkt p(1250);
  bool ce;
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(s1.submit(kB1, p.iov, 2, 1250, 0, ce), WanVerdict::kHeld);
    ASSERT_EQ(s2.submit(kB1, p.iov, 2, 1250, 0, ce), WanVerdict::kHeld);
  }
  uint64_t last = 0;
  auto drain = [&](WanShaper& s) {
    while (s.held()) {
      const uint64_t t = s.next_due_ns();
      last = std::max(last, t);
      s.release(t, [](const WanShaper::Packet&) {});
    }
  };
  drain(s1);
  drain(s2);
  EXPECT_EQ(last, 20u * 10'000) << "20 packets of 10 µs serialised on one link";

  // A private bottleneck per shaper (share_clock = false) would let each go at full rate.
  WanShaperConfig priv = cfg;
  priv.share_clock = false;
  WanShaper p1, p2;
  ASSERT_EQ(p1.open(kA1, topo(text), text, priv), 0);
  ASSERT_EQ(p2.open(kA2, topo(text), text, priv), 0);
  for (int i = 0; i < 10; ++i) {
    p1.submit(kB1, p.iov, 2, 1250, 0, ce);
    p2.submit(kB1, p.iov, 2, 1250, 0, ce);
  }
  last = 0;
  drain(p1);
  drain(p2);
  EXPECT_EQ(last, 10u * 10'000);

  bool found = false;
  s1.close();
  // s2 still holds the clock file: it is there; after s2 closes it is gone.
  for (const char* probe : {"present", "gone"}) {
    found = false;
    if (DIR* d = ::opendir(cfg.dir.c_str())) {
      while (dirent* e = ::readdir(d))
        if (std::string(e->d_name).rfind(cfg.name_prefix + "wan-", 0) == 0) found = true;
      ::closedir(d);
    }
    EXPECT_EQ(found, std::string(probe) == "present") << probe;
    s2.close();
  }
}

// The one-line form is a link each direction alike: two endpoints sending to each other at
// once each get its rate (full duplex), while two processes sending from one address (an
// address share) queue behind each other. One clock for both ends made the data's queue
// hold the ACKs going back too (a kv hand-off's round trip grew from 50 to 61 ms).
TEST(WanShaper, OneLineFormIsFullDuplexAndSharedPerSender) {
  const std::string text = "rate=1gbit queue=1m";
  const WanShaperConfig cfg = test_cfg();
  WanShaper a, b, a2;
  ASSERT_EQ(a.open(kA1, topo(text), text, cfg), 0);
  ASSERT_EQ(b.open(kB1, topo(text), text, cfg), 0);
  ASSERT_EQ(a2.open(kA1, topo(text), text, cfg), 0);
  Pkt p(1250);
  bool ce;
  auto last_due = [](WanShaper& s) {
    uint64_t last = 0;
    while (s.held()) {
      last = std::max(last, s.next_due_ns());
      s.release(s.next_due_ns(), [](const WanShaper::Packet&) {});
    }
    return last;
  };
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(a.submit(kB1, p.iov, 2, 1250, 0, ce), WanVerdict::kHeld);
    ASSERT_EQ(b.submit(kA1, p.iov, 2, 1250, 0, ce), WanVerdict::kHeld);
  }
  EXPECT_EQ(last_due(a), 10u * 10'000) << "A → B: 10 packets of 10 µs";
  EXPECT_EQ(last_due(b), 10u * 10'000) << "B → A does not wait behind A → B";
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(a.submit(kB1, p.iov, 2, 1250, 0, ce), WanVerdict::kHeld);
    ASSERT_EQ(a2.submit(kB1, p.iov, 2, 1250, 0, ce), WanVerdict::kHeld);
  }
  EXPECT_EQ(std::max(last_due(a), last_due(a2)), 10u * 10'000 + 20u * 10'000)
      << "two senders from one address share its link, behind the first 10 packets";
}

}  // namespace
}  // namespace softrdma::net
