// DCQCN's reaction point and the pacer on a fake clock (engine/dcqcn.h; Zhu et al.,
// SIGCOMM 2015, fig. 7).
#include "engine/dcqcn.h"

#include <gtest/gtest.h>

#include <cmath>

namespace softrdma::engine {
namespace {

constexpr double kGbit = 1e9 / 8 / 1e9;  // 1 Gbit/s in B/ns
constexpr uint64_t kT0 = 1'000'000'000;  // any start time, ns

DcqcnParams line(double gbit) {
  DcqcnParams p;
  p.line_rate = gbit * kGbit;
  return p;
}

TEST(Dcqcn, StartsAtLineRateAndACnpCutsItByHalfAlpha) {
  DcqcnRate r(line(10));
  EXPECT_DOUBLE_EQ(r.rate(), 10 * kGbit);
  r.on_cnp(kT0, 0);
  // α starts at 1: Rc ← Rc·(1 − 1/2), Rt ← the old Rc; then α ← (1 − g)·1 + g = 1.
  EXPECT_DOUBLE_EQ(r.rate(), 5 * kGbit);
  EXPECT_DOUBLE_EQ(r.target(), 10 * kGbit);
  EXPECT_DOUBLE_EQ(r.alpha(), 1.0);
  EXPECT_EQ(r.cuts(), 1u);
}

TEST(Dcqcn, AlphaDecaysByOneMinusGEveryK) {
  DcqcnParams p = line(10);
  p.timer_ns = 1'000'000'000;  // keep the rate still
  DcqcnRate r(p);
  r.on_cnp(kT0, 0);
  r.advance(kT0 + 10 * p.alpha_period_ns + 1);
  EXPECT_NEAR(r.alpha(), std::pow(1 - p.g, 10), 1e-12);
  // A second CNP (one reduce period later) cuts by the decayed α: Rc·(1 − α/2).
  const double before = r.rate(), a = r.alpha();
  r.on_cnp(kT0 + 10 * p.alpha_period_ns + 1, 0);
  EXPECT_NEAR(r.rate(), before * (1 - a / 2), 1e-15);
  EXPECT_NEAR(r.alpha(), (1 - p.g) * a + p.g, 1e-12);
}

TEST(Dcqcn, FastRecoveryHalvesTheDistanceToTheTargetEachTimerPeriod) {
  DcqcnParams p = line(10);
  p.byte_reset = uint64_t(1) << 40;  // the timer alone
  DcqcnRate r(p);
  r.on_cnp(kT0, 0);  // Rc = 5, Rt = 10 Gbit/s
  r.advance(kT0 + p.timer_ns);
  EXPECT_NEAR(r.rate(), 7.5 * kGbit, 1e-12);
  r.advance(kT0 + 2 * p.timer_ns);
  EXPECT_NEAR(r.rate(), 8.75 * kGbit, 1e-12);
  EXPECT_NEAR(r.target(), 10 * kGbit, 1e-12);
}

TEST(Dcqcn, AdditiveIncreaseAfterFStepsRaisesTheTargetByRai) {
  DcqcnParams p = line(100);
  p.byte_reset = uint64_t(1) << 40;
  DcqcnRate r(p);
  r.on_cnp(kT0, 0);  // Rt = 100 Gbit/s
  // F = 5 fast-recovery events leave Rt alone; each one after adds R_AI (the byte counter
  // stays at 0 < F, so never hyper increase).
  r.advance(kT0 + 5 * p.timer_ns);
  EXPECT_NEAR(r.target(), 100 * kGbit, 1e-12);
  r.on_cnp(kT0 + 5 * p.timer_ns, 0);  // Rt ← Rc < 100
  const double rt = r.target();
  r.advance(kT0 + 5 * p.timer_ns + 8 * p.timer_ns);
  EXPECT_NEAR(r.target(), rt + 3 * p.ai_rate, 1e-12);  // events 6, 7, 8
}

TEST(Dcqcn, HyperIncreaseOnceBothCountersPassF) {
  DcqcnParams p = line(1000);
  DcqcnRate r(p);
  r.on_cnp(kT0, 0);
  // 6 timer periods and 6 byte-counter periods: the 6th of the second pair has both > F...
  uint64_t now = kT0;
  for (int i = 0; i < 7; ++i) {
    now += p.timer_ns;
    r.advance(now);
    r.on_sent(p.byte_reset, now);
  }
  // ...so Rt grew by R_HAI·(min − F) at least once beyond the additive steps.
  const double additive_only = 100 * kGbit + 14 * p.ai_rate;
  EXPECT_GT(r.target(), additive_only - 1e-12);
  EXPECT_GE(r.target(), r.rate());
}

TEST(Dcqcn, NeverAboveLineRateNorBelowTheFloor) {
  DcqcnParams p = line(1);
  DcqcnRate r(p);
  for (int i = 0; i < 200; ++i) r.on_cnp(kT0 + uint64_t(i) * 10'000, 0);
  EXPECT_GE(r.rate(), p.min_rate);
  r.advance(kT0 + 10'000'000'000ull);  // 10 s of timer increases
  EXPECT_LE(r.rate(), p.line_rate + 1e-15);
  EXPECT_NEAR(r.rate(), p.line_rate, p.line_rate * 1e-3);
}

TEST(Dcqcn, OnALongLinkCutsWaitOneRoundTrip) {
  DcqcnRate r(line(1));
  r.set_min_rtt(20'000'000);                                              // 20 ms
  for (int i = 0; i < 100; ++i) r.on_cnp(kT0 + uint64_t(i) * 50'000, 0);  // 5 ms of CNPs
  EXPECT_EQ(r.cuts(), 1u);
  r.on_cnp(kT0 + 21'000'000, 0);
  EXPECT_EQ(r.cuts(), 2u);
}

TEST(Dcqcn, UnpacedWithoutLineRateUntilTheFirstCnpStartsFromTheMeasuredRate) {
  DcqcnRate r;
  EXPECT_EQ(r.rate(), 0);
  r.on_cnp(kT0, 2 * kGbit);
  EXPECT_NEAR(r.rate(), 1 * kGbit, 1e-12);  // cut by α/2 = 1/2 from the measured 2 Gbit/s
}

TEST(Pacer, HoldsPacketsToTheRate) {
  Pacer pacer;
  const double rate = 1 * kGbit;
  uint64_t now = kT0, sent = 0;
  constexpr uint64_t kPacket = 4156, kTotal = 64 << 20;
  int waits = 0;
  while (sent < kTotal) {
    if (!pacer.may_send(rate, now)) {
      const uint64_t at = pacer.next_send_ns(rate);
      ASSERT_GT(at, now);
      now = at;
      ++waits;
      continue;
    }
    pacer.on_sent(kPacket, rate, now);
    sent += kPacket;
  }
  // 64 MiB at 1 Gbit/s takes 537 ms; the first burst (64 KiB) goes at once.
  const double expect_ns = double(kTotal - Pacer::kBurstBytes) / rate;
  EXPECT_NEAR(double(now - kT0), expect_ns, expect_ns * 0.01);
  EXPECT_GT(waits, 1000);
}

}  // namespace
}  // namespace softrdma::engine
