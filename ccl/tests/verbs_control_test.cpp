// The pure parts of VerbsTransport's control channel (ccl/verbs_control.h): how a rendezvous
// transfer is split into stripes over channels, and the wr_id layout. No device needed.
#include "ccl/verbs_control.h"

#include <cstdint>
#include <string>

#include <gtest/gtest.h>

namespace softrdma::ccl::verbs {
namespace {

TEST(Stripes, CountIsBoundedByChannelsAndMinimumStripe) {
  constexpr uint64_t kMin = 64 * 1024;
  EXPECT_EQ(1u, stripe_count(0, 4, kMin));
  EXPECT_EQ(1u, stripe_count(2 * kMin - 1, 4, kMin));  // two stripes would be too short
  EXPECT_EQ(2u, stripe_count(2 * kMin, 4, kMin));
  EXPECT_EQ(3u, stripe_count(3 * kMin + 1, 4, kMin));
  EXPECT_EQ(4u, stripe_count(64 * kMin, 4, kMin));  // never more than the channels
  EXPECT_EQ(1u, stripe_count(64 * kMin, 1, kMin));
  EXPECT_EQ(16u, stripe_count(uint64_t{1} << 40, kMaxChannels, kMin));
}

// Every split covers [0, bytes) exactly once, in order, with interior boundaries on
// kStripeAlign, and — when the stripe count came from stripe_count — no stripe shorter than
// the minimum less the alignment slack of the ones before it.
TEST(Stripes, RangesTileTheTransferContiguously) {
  constexpr uint64_t kMin = 16 * 1024;
  for (uint64_t bytes : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, 2 * kMin, 3 * kMin + 1,
                         uint64_t{1000003}, uint64_t{16} << 20}) {
    for (uint32_t channels = 1; channels <= 5; ++channels) {
      const uint32_t k = stripe_count(bytes, channels, kMin);
      SCOPED_TRACE(std::to_string(bytes) + " bytes, " + std::to_string(k) + " stripes");
      uint64_t at = 0;
      for (uint32_t i = 0; i < k; ++i) {
        const StripeRange r = stripe_range(bytes, k, i);
        EXPECT_EQ(at, r.begin);
        EXPECT_LE(r.begin, r.end);
        if (i > 0) {
          EXPECT_EQ(0u, r.begin % kStripeAlign);
        }
        if (k > 1) {
          EXPECT_GE(r.end - r.begin, kMin - (k - 1) * kStripeAlign);
        }
        at = r.end;
      }
      EXPECT_EQ(bytes, at);
    }
  }
}

TEST(WrId, FieldsRoundTrip) {
  const uint64_t id =
      make_wr_id(Kind::kWrite, kMaxRanks - 1, (uint64_t{1} << 40) - 1, kMaxChannels - 1);
  EXPECT_EQ(Kind::kWrite, wr_kind(id));
  EXPECT_EQ(kMaxChannels - 1, wr_channel(id));
  EXPECT_EQ(kMaxRanks - 1, wr_peer(id));
  EXPECT_EQ((uint64_t{1} << 40) - 1, wr_index(id));
  EXPECT_EQ(0, wr_channel(make_wr_id(Kind::kRecv, 3, 7)));
}

}  // namespace
}  // namespace softrdma::ccl::verbs
