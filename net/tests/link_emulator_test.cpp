// LinkEmulator on a fake clock: each impairment measured over many packets and compared with
// its configured value within a stated tolerance (binomial 5σ for probabilities unless said).
#include "net/link_emulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <thread>
#include <vector>

namespace softrdma::net {
namespace {

constexpr uint64_t kMs = 1'000'000;

// 5σ of a binomial fraction over n trials with probability p.
double five_sigma(double p, int n) {
  return 5.0 * std::sqrt(p * (1 - p) / n);
}

LinkParams parse(const std::string& s) {
  LinkParams p;
  std::string err;
  EXPECT_TRUE(parse_link_params(s, p, err)) << s << ": " << err;
  return p;
}

TEST(LinkParse, UnitsAndDefaults) {
  LinkParams p = parse("delay=10ms,jitter=250us,dist=uniform,loss=0.1%,rate=1gbit,queue=1bdp");
  EXPECT_EQ(p.delay_ns, 10 * kMs);
  EXPECT_EQ(p.jitter_ns, 250'000u);
  EXPECT_EQ(p.jitter_dist, JitterDist::kUniform);
  EXPECT_DOUBLE_EQ(p.loss, 0.001);
  EXPECT_EQ(p.rate_bps, 1'000'000'000u);
  EXPECT_EQ(p.queue_bytes, 2'500'000u);  // 1e9/8 B/s × 20 ms
  EXPECT_EQ(parse("rate=10g").rate_bps, 10'000'000'000u);
  EXPECT_EQ(parse("rate=500Mbit").rate_bps, 500'000'000u);
  EXPECT_EQ(parse("rate=100MB/s").rate_bps, 800'000'000u);
  EXPECT_EQ(parse("rate=100Mb/s").rate_bps, 100'000'000u);
  EXPECT_EQ(parse("delay=2").delay_ns, 2 * kMs);  // bare number: ms
  EXPECT_EQ(parse("delay=1.5s").delay_ns, 1'500 * kMs);
  EXPECT_EQ(parse("rate=1g,queue=256k,ecn=64k").ecn_bytes, 65536u);
  LinkParams g = parse("burst=1%:20%:90%:0.5%");
  EXPECT_DOUBLE_EQ(g.burst.p, 0.01);
  EXPECT_DOUBLE_EQ(g.burst.r, 0.2);
  EXPECT_DOUBLE_EQ(g.burst.loss_bad, 0.9);
  EXPECT_DOUBLE_EQ(g.burst.loss_good, 0.005);
  // Default queue: one BDP, at least 64 KiB.
  EXPECT_EQ(parse("rate=1g,delay=10ms").queue_limit(), 2'500'000u);
  EXPECT_EQ(parse("rate=1g").queue_limit(), 65'536u);
  EXPECT_FALSE(LinkParams{}.shaped());
  EXPECT_TRUE(parse("duplicate=1%").shaped());
}

TEST(LinkParse, BadInputNamesTheItem) {
  for (const char* bad :
       {"delay", "delay=fast", "loss=150%", "loss=-1", "rate=0", "rate=1x", "burst=1%",
        "burst=1%:0", "queue=1bdp", "ecn=10k", "color=red", "dist=cauchy", "delay=2h", "seed=x"}) {
    LinkParams p;
    std::string err;
    EXPECT_FALSE(parse_link_params(bad, p, err)) << bad;
    EXPECT_FALSE(err.empty()) << bad;
  }
  // A failed parse leaves the output as it was.
  LinkParams p;
  p.delay_ns = 7;
  std::string err;
  EXPECT_FALSE(parse_link_params("delay=1ms,loss=2", p, err));
  EXPECT_EQ(p.delay_ns, 7u);
  EXPECT_NE(err.find("loss=2"), std::string::npos) << err;
}

TEST(LinkEmulator, PerfectLinkPassesEverythingAtOnce) {
  LinkEmulator e(LinkParams{});
  for (uint64_t t = 0; t < 1000; ++t) {
    LinkDecision d = e.submit(t * 100, 1000);
    ASSERT_EQ(d.verdict, LinkVerdict::kSend);
    EXPECT_EQ(d.depart_ns, t * 100);
    EXPECT_EQ(d.copies, 1u);
    EXPECT_FALSE(d.ecn_ce);
    EXPECT_EQ(d.corrupt_bit, -1);
  }
  EXPECT_EQ(e.counters().sent, 1000u);
  EXPECT_EQ(e.counters().delayed, 0u);
}

TEST(LinkEmulator, DelayIsExact) {
  LinkEmulator e(parse("delay=10ms"));
  for (uint64_t t = 0; t < 100; ++t)
    EXPECT_EQ(e.submit(t * 1000, 64).depart_ns, t * 1000 + 10 * kMs);
}

// Jitter: the drawn values have the stated mean and spread, and never reorder packets.
TEST(LinkEmulator, JitterDistributionsWithoutReordering) {
  constexpr int kN = 20000;
  for (const char* dist : {"normal", "uniform"}) {
    // Packets 1 ms apart, jitter 100 µs ≪ spacing: the FIFO clamp almost never applies.
    LinkEmulator e(parse(std::string("delay=5ms,jitter=100us,seed=3,dist=") + dist));
    std::vector<double> extra;
    uint64_t prev = 0;
    for (int i = 0; i < kN; ++i) {
      const uint64_t now = static_cast<uint64_t>(i) * kMs;
      const LinkDecision d = e.submit(now, 100);
      ASSERT_GE(d.depart_ns, prev) << "jitter reordered packet " << i;
      prev = d.depart_ns;
      extra.push_back(static_cast<double>(d.depart_ns - now) - 5e6);
    }
    double mean = 0, var = 0, lo = 1e18, hi = -1e18;
    for (double x : extra) {
      mean += x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    mean /= kN;
    for (double x : extra) var += (x - mean) * (x - mean);
    const double sd = std::sqrt(var / kN);
    SCOPED_TRACE(dist);
    EXPECT_NEAR(mean, 0.0, 3e3);  // ±3 µs
    if (std::string(dist) == "normal") {
      EXPECT_NEAR(sd, 1e5, 3e3);  // σ = 100 µs (±3 %; truncation at 3σ removes 0.3 %)
      EXPECT_GE(lo, -3e5 - 1);
      EXPECT_LE(hi, 3e5 + 1);
    } else {
      EXPECT_NEAR(sd, 1e5 / std::sqrt(3.0), 2e3);  // uniform ±100 µs: σ = 100/√3 µs
      EXPECT_GE(lo, -1e5 - 1);
      EXPECT_LE(hi, 1e5 + 1);
    }
  }
  // Back-to-back packets with large jitter are still delivered in order.
  LinkEmulator e(parse("delay=1ms,jitter=1ms,seed=9"));
  uint64_t prev = 0;
  for (int i = 0; i < 5000; ++i) {
    const LinkDecision d = e.submit(static_cast<uint64_t>(i) * 1000, 100);
    ASSERT_GE(d.depart_ns, prev);
    prev = d.depart_ns;
  }
}

TEST(LinkEmulator, RandomLossFraction) {
  constexpr int kN = 200000;
  for (double p : {0.0001, 0.001, 0.01, 0.1}) {
    LinkParams lp;
    lp.loss = p;
    lp.seed = 11;
    LinkEmulator e(lp);
    int lost = 0;
    for (int i = 0; i < kN; ++i)
      lost += e.submit(static_cast<uint64_t>(i), 100).verdict == LinkVerdict::kDropLoss;
    EXPECT_NEAR(static_cast<double>(lost) / kN, p, five_sigma(p, kN)) << "loss " << p;
    EXPECT_EQ(e.counters().dropped_loss, static_cast<uint64_t>(lost));
  }
}

// Gilbert–Elliott: the long-run loss matches (p·h + r·k)/(p + r) and losses come in bursts
// of mean length 1/r when loss_bad = 1, loss_good = 0.
TEST(LinkEmulator, BurstLossFractionAndBurstLength) {
  constexpr int kN = 400000;
  LinkEmulator e(parse("burst=0.5%:25%,seed=5"));
  int lost = 0, bursts = 0;
  bool prev = false;
  for (int i = 0; i < kN; ++i) {
    const bool l = e.submit(static_cast<uint64_t>(i), 100).verdict == LinkVerdict::kDropBurst;
    lost += l;
    bursts += l && !prev;
    prev = l;
  }
  const double expect = 0.005 / (0.005 + 0.25);
  EXPECT_NEAR(static_cast<double>(lost) / kN, expect, 0.1 * expect);  // ±10 %: correlated
  EXPECT_NEAR(static_cast<double>(lost) / bursts, 1 / 0.25, 0.4);     // mean burst 4 packets
  EXPECT_NEAR(parse("burst=0.5%:25%").burst.mean_loss(), expect, 1e-12);
}

// Rate: back-to-back packets leave at exactly the link rate; the FIFO tail-drops beyond its
// limit and CE-marks beyond the ECN threshold.
TEST(LinkEmulator, RateQueueDropsAndEcn) {
  // 1 Gbit/s: a 1250-byte packet takes 10 µs. Queue 12500 B = 10 packets; ECN above 5.
  LinkEmulator e(parse("rate=1gbit,queue=12500,ecn=6250"));
  std::vector<LinkDecision> d;
  for (int i = 0; i < 20; ++i) d.push_back(e.submit(0, 1250));  // a burst at t = 0
  int sent = 0;
  for (int i = 0; i < 20; ++i) {
    if (d[i].verdict != LinkVerdict::kSend) {
      EXPECT_EQ(d[i].verdict, LinkVerdict::kDropQueue) << i;
      continue;
    }
    ++sent;
    EXPECT_EQ(d[i].depart_ns, static_cast<uint64_t>(i + 1) * 10'000) << i;
    EXPECT_EQ(d[i].ecn_ce, i >= 5) << i;  // 5 packets (6250 B) or more ahead of it
  }
  EXPECT_EQ(sent, 11);  // the one on the wire plus 10 queued behind it
  EXPECT_EQ(e.counters().dropped_queue, 9u);
  EXPECT_EQ(e.counters().ecn_marked, 6u);
  // Once drained, the link is free again.
  EXPECT_EQ(e.submit(1 * kMs, 1250).depart_ns, 1 * kMs + 10'000);

  // A long paced stream at 80 % load never queues beyond a packet and averages the rate.
  LinkEmulator s(parse("rate=1gbit"));
  uint64_t last = 0;
  for (int i = 0; i < 10000; ++i) {
    const LinkDecision x = s.submit(static_cast<uint64_t>(i) * 12'500, 1250);
    ASSERT_EQ(x.verdict, LinkVerdict::kSend);
    last = x.depart_ns;
  }
  EXPECT_EQ(last, 9999ull * 12'500 + 10'000);
  EXPECT_EQ(s.counters().queued, 0u);
}

TEST(LinkEmulator, RateThenDelay) {
  LinkEmulator e(parse("rate=1gbit,delay=10ms"));
  EXPECT_EQ(e.submit(0, 1250).depart_ns, 10'000 + 10 * kMs);
  EXPECT_EQ(e.submit(0, 1250).depart_ns, 20'000 + 10 * kMs);
}

TEST(LinkEmulator, ReorderDuplicateCorrupt) {
  constexpr int kN = 100000;
  LinkEmulator e(parse("delay=1ms,reorder=5%,duplicate=2%,corrupt=1%,seed=17"));
  int reordered = 0, dup = 0, corrupt = 0, overtakes = 0;
  uint64_t prev = 0;
  for (int i = 0; i < kN; ++i) {
    const uint64_t now = static_cast<uint64_t>(i) * 10'000;  // 10 µs apart, 1 ms in flight
    const LinkDecision d = e.submit(now, 200);
    ASSERT_EQ(d.verdict, LinkVerdict::kSend);
    if (d.depart_ns == now) ++reordered;
    if (d.depart_ns < prev) ++overtakes;
    prev = std::max(prev, d.depart_ns);
    dup += d.copies == 2;
    if (d.corrupt_bit >= 0) {
      ++corrupt;
      ASSERT_LT(d.corrupt_bit, 200 * 8);
    }
  }
  EXPECT_NEAR(static_cast<double>(reordered) / kN, 0.05, five_sigma(0.05, kN));
  // Every skipped delay overtakes the packets in flight (but the very first packet, which
  // has none ahead of it).
  EXPECT_GE(overtakes, reordered - 1);
  EXPECT_LE(overtakes, reordered);
  EXPECT_NEAR(static_cast<double>(dup) / kN, 0.02, five_sigma(0.02, kN));
  EXPECT_NEAR(static_cast<double>(corrupt) / kN, 0.01, five_sigma(0.01, kN));
  EXPECT_EQ(e.counters().reordered, static_cast<uint64_t>(reordered));
  EXPECT_EQ(e.counters().duplicated, static_cast<uint64_t>(dup));
  EXPECT_EQ(e.counters().corrupted, static_cast<uint64_t>(corrupt));
}

TEST(LinkEmulator, SameSeedSameDecisions) {
  const LinkParams p = parse("delay=1ms,jitter=300us,loss=3%,burst=1%:30%,duplicate=1%,seed=77");
  LinkEmulator a(p), b(p);
  for (int i = 0; i < 10000; ++i) {
    const LinkDecision x = a.submit(static_cast<uint64_t>(i) * 500, 300);
    const LinkDecision y = b.submit(static_cast<uint64_t>(i) * 500, 300);
    ASSERT_EQ(x.verdict, y.verdict);
    ASSERT_EQ(x.depart_ns, y.depart_ns);
    ASSERT_EQ(x.copies, y.copies);
  }
}

// Two senders behind one shared bottleneck: together they get the link rate, not twice it,
// and the shared FIFO limit applies to their sum.
TEST(LinkEmulator, SharedBottleneckAcrossSenders) {
  std::atomic<uint64_t> free_ns{0};
  SharedLinkClock ca(&free_ns), cb(&free_ns);
  const LinkParams p = parse("rate=1gbit,queue=125000");  // 1 ms of queue
  LinkEmulator a(p, &ca), b(p, &cb);
  uint64_t last = 0;
  int sent = 0;
  for (int i = 0; i < 50; ++i) {  // 100 packets of 10 µs at once: 1 on the wire + 100 fit
    for (LinkEmulator* e : {&a, &b}) {
      const LinkDecision d = e->submit(0, 1250);
      if (d.verdict == LinkVerdict::kSend) {
        ++sent;
        last = std::max(last, d.depart_ns);
      }
    }
  }
  EXPECT_EQ(sent, 100);
  EXPECT_EQ(last, 100u * 10'000);  // serialised one after another across both senders

  // Concurrent senders (threads standing in for processes): no reservation is lost.
  std::atomic<uint64_t> word{0};
  std::vector<std::thread> th;
  for (int t = 0; t < 4; ++t)
    th.emplace_back([&word] {
      SharedLinkClock c(&word);
      for (int i = 0; i < 10000; ++i) {
        uint64_t backlog = 0, done = 0;
        ASSERT_TRUE(c.reserve(0, 10, UINT64_MAX, backlog, done));
      }
    });
  for (auto& x : th) x.join();
  EXPECT_EQ(word.load(), 4u * 10000 * 10);
}

}  // namespace
}  // namespace softrdma::net
