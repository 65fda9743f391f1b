#include "base/link_rate.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>

namespace softrdma::link_rate {
namespace {

using namespace std::chrono_literals;

TEST(LinkRate, PortRateFromTheVerbsSpeedAndWidthCodes) {
  EXPECT_EQ(100'000'000'000u, port_rate_bits(32, 2));   // 4X EDR (softrdma's port)
  EXPECT_EQ(200'000'000'000u, port_rate_bits(64, 2));   // 4X HDR
  EXPECT_EQ(400'000'000'000u, port_rate_bits(128, 2));  // 4X NDR
  EXPECT_EQ(2'500'000'000u, port_rate_bits(1, 1));      // 1X SDR
  EXPECT_EQ(40'000'000'000u, port_rate_bits(4, 2));     // 4X QDR
  EXPECT_EQ(300'000'000'000u, port_rate_bits(32, 8));   // 12X EDR
  EXPECT_EQ(50'000'000'000u, port_rate_bits(32, 16));   // 2X EDR
  EXPECT_EQ(0u, port_rate_bits(3, 2));                  // not a speed code
  EXPECT_EQ(0u, port_rate_bits(32, 3));                 // not a width code
}

TEST(LinkRate, BandwidthDelayProduct) {
  EXPECT_EQ(625'000'000u, bandwidth_delay_bytes(100'000'000'000u, 50ms));
  EXPECT_EQ(5'000'000'000u, bandwidth_delay_bytes(400'000'000'000u, 100ms));  // issue 23's 5 GB
  EXPECT_EQ(1'250u, bandwidth_delay_bytes(100'000'000'000u, 100ns));
  EXPECT_EQ(0u, bandwidth_delay_bytes(0, 50ms));
  EXPECT_EQ(0u, bandwidth_delay_bytes(100'000'000'000u, 0ms));
  EXPECT_EQ(UINT64_MAX, bandwidth_delay_bytes(UINT64_MAX, std::chrono::hours(1000)));
}

}  // namespace
}  // namespace softrdma::link_rate
