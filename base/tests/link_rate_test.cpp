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

TEST(LinkRate, ThePortOfALinkIsTheSlowestStandardPortAtLeastAsFast) {
  EXPECT_EQ(port_speed_for_rate(0), kDefaultPortSpeed);
  EXPECT_EQ(port_speed_for_rate(0), (PortSpeed{32, 2}));                   // 4X EDR
  EXPECT_EQ(port_speed_for_rate(1'000'000'000), (PortSpeed{1, 1}));        // 1X SDR
  EXPECT_EQ(port_speed_for_rate(10'000'000'000), (PortSpeed{4, 1}));       // 1X QDR
  EXPECT_EQ(port_speed_for_rate(10'000'000'001), (PortSpeed{16, 1}));      // 1X FDR
  EXPECT_EQ(port_speed_for_rate(25'000'000'000), (PortSpeed{32, 1}));      // 1X EDR
  EXPECT_EQ(port_speed_for_rate(40'000'000'000), (PortSpeed{4, 2}));       // 4X QDR
  EXPECT_EQ(port_speed_for_rate(100'000'000'000), (PortSpeed{32, 2}));     // 4X EDR
  EXPECT_EQ(port_speed_for_rate(150'000'000'000), (PortSpeed{64, 2}));     // 4X HDR
  EXPECT_EQ(port_speed_for_rate(400'000'000'000), (PortSpeed{128, 2}));    // 4X NDR
  EXPECT_EQ(port_speed_for_rate(800'000'000'000), (PortSpeed{128, 4}));    // 8X NDR
  EXPECT_EQ(port_speed_for_rate(5'000'000'000'000), (PortSpeed{128, 8}));  // 12X NDR, the top
  // Every rate up to the top is covered: the port is never slower than the link.
  for (uint64_t g = 1; g <= 1200; ++g) {
    const PortSpeed p = port_speed_for_rate(g * 1'000'000'000);
    EXPECT_GE(port_rate_bits(p.active_speed, p.active_width), g * 1'000'000'000) << g;
  }
}

TEST(LinkRate, PortRateTextIsIbCoreSysfsSpelling) {
  EXPECT_EQ(port_rate_text({32, 2}), "100 Gb/sec (4X EDR)");
  EXPECT_EQ(port_rate_text({1, 1}), "2.5 Gb/sec (1X SDR)");
  EXPECT_EQ(port_rate_text({4, 1}), "10 Gb/sec (1X QDR)");
  EXPECT_EQ(port_rate_text({16, 2}), "56 Gb/sec (4X FDR)");
  EXPECT_EQ(port_rate_text({128, 2}), "400 Gb/sec (4X NDR)");
  EXPECT_EQ(port_rate_text({128, 8}), "1200 Gb/sec (12X NDR)");
  EXPECT_EQ(port_rate_text({64, 16}), "100 Gb/sec (2X HDR)");
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
