// kv's slice-length calculator (slicing.h): whole slices, a short tail joined to the slice
// before it, the port's largest message as the cap.
#include <gtest/gtest.h>

#include <vector>

#include "kv/slicing.h"

namespace softrdma::kv {
namespace {

std::vector<uint64_t> cut(uint64_t length, uint64_t slice, uint64_t max_msg) {
  std::vector<uint64_t> out;
  for (uint64_t off = 0; off < length;) {
    const uint64_t len = next_slice_length(length - off, slice, max_msg);
    out.push_back(len);
    off += len;
  }
  return out;
}

TEST(Slicing, WholeSlicesThenTheRest) {
  EXPECT_EQ(cut(1000, 4096, 1u << 30), (std::vector<uint64_t>{1000}));
  EXPECT_EQ(cut(8192, 4096, 1u << 30), (std::vector<uint64_t>{4096, 4096}));
  EXPECT_EQ(cut(4096 + 2048, 4096, 1u << 30), (std::vector<uint64_t>{4096, 2048}));
}

TEST(Slicing, ATailOfAtMostAQuarterSliceJoinsThePreviousSlice) {
  EXPECT_EQ(cut(4096 + 1024, 4096, 1u << 30), (std::vector<uint64_t>{5120}));
  EXPECT_EQ(cut(4096 + 1025, 4096, 1u << 30), (std::vector<uint64_t>{4096, 1025}));
  EXPECT_EQ(cut(3 * 4096 + 1, 4096, 1u << 30), (std::vector<uint64_t>{4096, 4096, 4097}));
}

TEST(Slicing, ThePortsLargestMessageCapsSlicesAndTails) {
  EXPECT_EQ(cut(10000, 1u << 20, 4096), (std::vector<uint64_t>{4096, 4096, 1808}));
  // The tail would fit the quarter rule but not the largest message: it stays apart.
  EXPECT_EQ(cut(4096 + 100, 1u << 20, 4096), (std::vector<uint64_t>{4096, 100}));
}

}  // namespace
}  // namespace softrdma::kv
