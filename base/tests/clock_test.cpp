// Time dilation arithmetic (base/clock.h) on the fake clock: both conversions, their
// rounding, K = 1 as the identity, the wall clock's epoch, sleeps, and the values
// SOFTRDMA_TDF accepts and refuses.
#include "base/clock.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <string>

namespace softrdma::clock {
namespace {

using namespace std::chrono_literals;

TEST(Clock, OneIsTheIdentity) {
  FakeClock fake(1.0, 123'456'789'012);
  EXPECT_FALSE(dilated());
  EXPECT_EQ(tdf(), 1.0);
  EXPECT_EQ(now_ns(), 123'456'789'012u);
  EXPECT_EQ(real_now_ns(), 123'456'789'012u);
  EXPECT_EQ(realtime_ns(), 123'456'789'012u + kFakeWallOffsetNs);
  EXPECT_EQ(to_real_ns(777), 777u);
  EXPECT_EQ(to_virtual_ns(777), 777u);
  EXPECT_EQ(to_real_timeout_ms(25), 25);
  EXPECT_EQ(to_real_deadline_ns(99), 99u);
  EXPECT_EQ(to_real(Steady::time_point(5ms)).time_since_epoch(), 5ms);
}

TEST(Clock, VirtualTimeIsMonotonicOverK) {
  FakeClock fake(10.0, 2'000'000'000);
  EXPECT_TRUE(dilated());
  EXPECT_EQ(now_ns(), 200'000'000u);  // exact quotients are not rounded down
  fake.advance_real_ns(9);
  EXPECT_EQ(now_ns(), 200'000'000u);  // 200000000.9 → rounded down
  fake.advance_real_ns(1);
  EXPECT_EQ(now_ns(), 200'000'001u);
  EXPECT_EQ(real_now_ns(), 2'000'000'010u);
  // Large real times (a host up for a year): still exact at integer quotients.
  fake.set_real_ns(31'536'000'000'000'000ull);
  EXPECT_EQ(now_ns(), 3'153'600'000'000'000ull);
  EXPECT_EQ(Steady::now().time_since_epoch().count(), 3'153'600'000'000'000ll);
}

TEST(Clock, NonIntegerFactor) {
  FakeClock fake(2.5, 1'000'000'000);
  EXPECT_EQ(now_ns(), 400'000'000u);
  EXPECT_EQ(to_real_ns(3), 8u);     // 7.5 → rounded up: a wait never ends early
  EXPECT_EQ(to_virtual_ns(8), 3u);  // 3.2 → rounded down
  EXPECT_EQ(to_real_ns(1'000'000), 2'500'000u);
}

TEST(Clock, ConversionsBothWays) {
  FakeClock fake(50.0);
  // 100 Gbit/s at K = 50: a 4096-byte packet serialises in 327.68 ns virtual = 16384 ns real.
  EXPECT_EQ(to_real_ns(328), 16'400u);
  // 25 ms one-way delay waits 1.25 s real.
  EXPECT_EQ(to_real_ns(25'000'000), 1'250'000'000u);
  EXPECT_EQ(to_virtual_ns(1'250'000'000), 25'000'000u);
  for (uint64_t v : {0ull, 1ull, 7ull, 999'999ull, 123'456'789'123ull})
    EXPECT_EQ(to_virtual_ns(to_real_ns(v)), v) << v;
  EXPECT_EQ(to_real_timeout_ms(-1), -1);
  EXPECT_EQ(to_real_timeout_ms(0), 0);
  EXPECT_EQ(to_real_timeout_ms(100), 5000);
  EXPECT_EQ(to_real_timeout_ms(INT32_MAX), INT32_MAX);  // saturates
  EXPECT_EQ(to_real_ns(UINT64_MAX / 2), UINT64_MAX);    // saturates
  const timespec ts = to_real_timespec(30'000'000);     // 30 ms → 1.5 s
  EXPECT_EQ(ts.tv_sec, 1);
  EXPECT_EQ(ts.tv_nsec, 500'000'000);
  EXPECT_EQ(to_real(10ms), 500ms);
  EXPECT_EQ(to_real(-3ms), 0ns);
  // A virtual deadline is reached at the real time ⌈t·K⌉, and now_ns() says so there.
  const uint64_t deadline = now_ns() + 1'000'001;
  fake.set_real_ns(to_real_deadline_ns(deadline));
  EXPECT_EQ(now_ns(), deadline);
  fake.advance_real_ns(static_cast<uint64_t>(-1));  // 1 ns earlier: not yet
  EXPECT_LT(now_ns(), deadline);
  EXPECT_EQ(to_real(Steady::time_point(2ms)).time_since_epoch(), 100ms);
}

TEST(Clock, SleepsAdvanceTheFakeClockByKTimesTheirLength) {
  FakeClock fake(10.0, 5'000'000'000);
  const uint64_t v0 = now_ns();
  sleep_for(20ms);
  EXPECT_EQ(fake.real_ns(), 5'200'000'000u);
  EXPECT_EQ(now_ns(), v0 + 20'000'000);
  sleep_until_ns(now_ns() + 1);
  EXPECT_EQ(now_ns(), v0 + 20'000'001);
  sleep_until_ns(0);  // in the past: no change
  EXPECT_EQ(now_ns(), v0 + 20'000'001);
}

TEST(Clock, WallClockIsDilatedFromItsEpoch) {
  const uint64_t epoch = kFakeWallOffsetNs + 1'000'000'000;  // 1 s after the fake start
  FakeClock fake(4.0, 1'000'000'000, epoch);
  EXPECT_EQ(realtime_ns(), epoch);
  fake.advance_real_ns(4'000'000'000);  // 4 s real after the epoch: 1 s virtual
  EXPECT_EQ(realtime_ns(), epoch + 1'000'000'000);
  EXPECT_EQ(real_realtime_ns(), epoch + 4'000'000'000);
  EXPECT_EQ(dilate_realtime(epoch - 4'000), epoch - 1'000);  // before the epoch too
  EXPECT_EQ(undilate_realtime(epoch + 1'000'000'000), epoch + 4'000'000'000);
  EXPECT_EQ(undilate_realtime(epoch - 1'000), epoch - 4'000);
  // Elapsed wall-clock time equals elapsed monotonic time.
  const uint64_t w0 = realtime_ns(), m0 = now_ns();
  fake.advance_real_ns(12'345'678);
  EXPECT_EQ(realtime_ns() - w0, now_ns() - m0);
}

TEST(Clock, ParsesTheFactor) {
  double k = 0;
  std::string error;
  EXPECT_TRUE(parse_tdf("1", k, error));
  EXPECT_EQ(k, 1.0);
  EXPECT_TRUE(parse_tdf("10", k, error));
  EXPECT_EQ(k, 10.0);
  EXPECT_TRUE(parse_tdf("2.5", k, error));
  EXPECT_EQ(k, 2.5);
  EXPECT_TRUE(parse_tdf("1e2", k, error));
  EXPECT_EQ(k, 100.0);
  EXPECT_TRUE(parse_tdf("1000000", k, error));
  k = 7;
  for (const char* bad : {"", "0", "0.5", "-3", "+2", " 2", "2 ", "2x", "ten", "inf", "nan", "1e7",
                          "1e999", ".", "0x10"}) {
    EXPECT_FALSE(parse_tdf(bad, k, error)) << bad;
    EXPECT_EQ(error,
              "SOFTRDMA_TDF: expected a real number in 1..1000000, got '" + std::string(bad) + "'");
  }
  EXPECT_EQ(k, 7.0);  // unchanged by failures
}

TEST(Clock, ReadsTheEnvironment) {
  double k = 0;
  uint64_t epoch = 9;
  std::string error;
  ::unsetenv("SOFTRDMA_TDF");
  ::unsetenv("SOFTRDMA_TDF_EPOCH");
  ASSERT_TRUE(read_environment(k, epoch, error));
  EXPECT_EQ(k, 1.0);
  EXPECT_EQ(epoch, 0u);
  ::setenv("SOFTRDMA_TDF", "20", 1);
  ::setenv("SOFTRDMA_TDF_EPOCH", "1700000000000000000", 1);
  ASSERT_TRUE(read_environment(k, epoch, error));
  EXPECT_EQ(k, 20.0);
  EXPECT_EQ(epoch, 1'700'000'000'000'000'000u);
  ::setenv("SOFTRDMA_TDF", "0.9", 1);
  EXPECT_FALSE(read_environment(k, epoch, error));
  EXPECT_EQ(error, "SOFTRDMA_TDF: expected a real number in 1..1000000, got '0.9'");
  ::setenv("SOFTRDMA_TDF", "3", 1);
  ::setenv("SOFTRDMA_TDF_EPOCH", "yesterday", 1);
  EXPECT_FALSE(read_environment(k, epoch, error));
  EXPECT_NE(error.find("SOFTRDMA_TDF_EPOCH"), std::string::npos) << error;
  ::unsetenv("SOFTRDMA_TDF");
  ::unsetenv("SOFTRDMA_TDF_EPOCH");
}

TEST(ClockDeathTest, AMalformedFactorStopsTheProcessWithTheReason) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the clock not yet read
  EXPECT_EXIT(
      {
        ::setenv("SOFTRDMA_TDF", "fast", 1);
        (void)now_ns();
      },
      ::testing::ExitedWithCode(2),
      "softrdma: SOFTRDMA_TDF: expected a real number in 1..1000000, got 'fast'");
}

TEST(Clock, FakeClockRefusesABadFactor) {
  EXPECT_THROW(FakeClock(0.5), std::invalid_argument);
}

}  // namespace
}  // namespace softrdma::clock
