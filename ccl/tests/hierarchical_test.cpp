// The hierarchical AllReduce (allreduce_hierarchical.cpp) over the loopback transport: every
// type and op against the reference for site layouts of 1–8 ranks (one site, one rank per
// site, unequal and interleaved sites), the error bound of the 16-bit wide-area hop, and
// when `auto` chooses it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ccl/tests/test_util.h"

namespace softrdma::ccl::testing {
namespace {

struct Layout {
  const char* name;
  std::vector<std::string> sites;  // site of rank r
};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"OneRank", {"a"}},
      {"TwoSitesOneRankEach", {"a", "b"}},
      {"UnequalSites", {"a", "a", "b"}},
      {"TwoByTwo", {"a", "a", "b", "b"}},
      {"Interleaved", {"a", "b", "a", "c", "b"}},
      {"SingleSite", {"x", "x", "x", "x", "x", "x"}},
      {"FourSitesOneRankEach", {"a", "b", "c", "d"}},
      {"FiveTwoOne", {"a", "a", "a", "a", "a", "b", "b", "c"}},
      {"UnnamedAndNamed", {"", "", "b", "b", "b"}},
  };
  return all;
}

Config site_config(const Layout& l, int r, Algorithm a, WanCompression c = WanCompression::kNone) {
  Config cfg;
  cfg.algorithm = a;
  cfg.site = l.sites[static_cast<size_t>(r)];
  cfg.wan_compress = c;
  cfg.chunk_bytes = 256;  // several chunks per step even for small counts
  return cfg;
}

class HierarchicalTest : public ::testing::TestWithParam<Layout> {};

TEST_P(HierarchicalTest, EveryTypeAndOpMatchesTheReference) {
  const Layout& l = GetParam();
  const int n = static_cast<int>(l.sites.size());
  for (DataType t : kAllTypes) {
    for (RedOp op : kAllOps) {
      for (size_t count : {size_t{1}, size_t{5}, size_t{1000}}) {
        for (bool in_place : {false, true}) {
          std::vector<std::vector<unsigned char>> out(static_cast<size_t>(n));
          const std::string err = run_ranks(
              n, [&](int r) { return site_config(l, r, Algorithm::kHierarchical); },
              [&](Communicator& c) {
                const size_t bytes = count * type_size(t);
                std::vector<unsigned char> in(bytes);
                auto& o = out[static_cast<size_t>(c.rank())];
                o.resize(bytes);
                for (size_t i = 0; i < count; ++i) store(t, in.data(), i, gen(t, op, c.rank(), i));
                if (in_place) {
                  o = in;
                  c.all_reduce(o.data(), o.data(), count, t, op);
                } else {
                  fill_sentinel(t, o.data(), count);
                  c.all_reduce(in.data(), o.data(), count, t, op);
                }
              });
          ASSERT_EQ(err, "") << type_name(t) << " " << op_name(op);
          for (size_t i = 0; i < count; ++i) {
            std::vector<double> x(static_cast<size_t>(n));
            for (int r = 0; r < n; ++r) x[static_cast<size_t>(r)] = gen_stored(t, op, r, i);
            const Expected e = reference(t, op, x.data(), n);
            for (int r = 0; r < n; ++r)
              ASSERT_NEAR(load(t, out[static_cast<size_t>(r)].data(), i), e.value, e.tolerance)
                  << type_name(t) << " " << op_name(op) << " count " << count << " rank " << r
                  << " element " << i << (in_place ? " in place" : "");
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sites, HierarchicalTest, ::testing::ValuesIn(layouts()),
                         [](const auto& info) { return std::string(info.param.name); });

// Sums of float32 values with bits below 16-bit precision through the compressed leader
// ring: the largest error over all elements and ranks, relative to the sum of magnitudes.
double compressed_error(const Layout& l, Algorithm a, WanCompression c) {
  const int n = static_cast<int>(l.sites.size());
  const size_t count = 4096;
  auto value = [](int r, size_t i) {
    return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r) * (1.0 + 0.001 * r) *
                              (i % 3 == 0 ? 1000.0 : 0.01));
  };
  std::vector<std::vector<float>> out(static_cast<size_t>(n), std::vector<float>(count));
  const std::string err = run_ranks(
      n, [&](int r) { return site_config(l, r, a, c); },
      [&](Communicator& comm) {
        std::vector<float> in(count);
        for (size_t i = 0; i < count; ++i) in[i] = value(comm.rank(), i);
        comm.all_reduce(in.data(), out[static_cast<size_t>(comm.rank())].data(), count,
                        DataType::kFloat32, RedOp::kSum);
      });
  EXPECT_EQ(err, "");
  double worst = 0;
  for (size_t i = 0; i < count; ++i) {
    double exact = 0;
    double magnitude = 0;
    for (int r = 0; r < n; ++r) {
      exact += value(r, i);
      magnitude += std::fabs(value(r, i));
    }
    for (int r = 0; r < n; ++r) {
      const double e = std::fabs(out[static_cast<size_t>(r)][i] - exact) / magnitude;
      worst = std::max(worst, e);
    }
  }
  return worst;
}

// The bound of docs/wide-area.md: L leaders round L times in the ring (once when narrowing,
// L−1 times per reduce-scatter hop) — at most L·u of the sum of magnitudes, u = 2^-11
// (float16) or 2^-8 (bfloat16); the site sums and the widening add float32 rounding only.
TEST(HierarchicalCompression, ErrorStaysWithinLeadersTimesUnitRoundoff) {
  const Layout three_sites{"ThreeSites", {"a", "a", "b", "b", "b", "c"}};
  const double leaders = 3;
  for (auto [c, u] : {std::pair{WanCompression::kFloat16, std::ldexp(1.0, -11)},
                      std::pair{WanCompression::kBfloat16, std::ldexp(1.0, -8)}}) {
    const double err = compressed_error(three_sites, Algorithm::kHierarchical, c);
    std::printf("%s: worst error %.3g of the sum of magnitudes (bound L·u = %.3g)\n",
                c == WanCompression::kFloat16 ? "fp16" : "bf16", err, leaders * u);
    EXPECT_LE(err, leaders * u + 1e-6);
    EXPECT_GT(err, u / 64) << "no 16-bit rounding visible: the wide-area hop was not compressed";
  }
  const double plain =
      compressed_error(three_sites, Algorithm::kHierarchical, WanCompression::kNone);
  EXPECT_LE(plain, 1e-6);
}

// auto: hierarchical when the ranks span several sites with more than one rank in some
// site — observable through the compression, which only the hierarchical path applies.
TEST(HierarchicalAuto, ChosenWhenSitesHoldSeveralRanksOnly) {
  const Layout two_by_two{"TwoByTwo", {"a", "a", "b", "b"}};
  EXPECT_GT(compressed_error(two_by_two, Algorithm::kAuto, WanCompression::kBfloat16),
            std::ldexp(1.0, -8) / 64);
  const Layout one_each{"OneEach", {"a", "b", "c", "d"}};
  EXPECT_LE(compressed_error(one_each, Algorithm::kAuto, WanCompression::kBfloat16), 1e-6);
  const Layout one_site{"OneSite", {"a", "a", "a", "a"}};
  EXPECT_LE(compressed_error(one_site, Algorithm::kAuto, WanCompression::kBfloat16), 1e-6);
}

// Ranks that name no site still take part in the site exchange (it is collective): two
// ranks in "a" and two unnamed ranks form two sites, and auto runs the hierarchical path.
TEST(HierarchicalAuto, RanksWithoutASiteJoinTheExchange) {
  const Layout half_named{"HalfNamed", {"a", "a", "", ""}};
  EXPECT_GT(compressed_error(half_named, Algorithm::kAuto, WanCompression::kBfloat16),
            std::ldexp(1.0, -8) / 64);
  const Layout none_named{"NoneNamed", {"", "", "", ""}};
  EXPECT_LE(compressed_error(none_named, Algorithm::kAuto, WanCompression::kBfloat16), 1e-6);
}

TEST(HierarchicalConfig, SiteAndCompressionComeFromTheEnvironment) {
  ::setenv("SOFTRDMA_CCL_SITE", "guizhou", 1);
  ::setenv("SOFTRDMA_CCL_WAN_COMPRESS", "BF16", 1);
  ::setenv("SOFTRDMA_CCL_ALGO", "hierarchical", 1);
  const Config c = Config::from_environment();
  EXPECT_EQ(c.site, "guizhou");
  EXPECT_EQ(c.wan_compress, WanCompression::kBfloat16);
  EXPECT_EQ(c.algorithm, Algorithm::kHierarchical);
  ::setenv("SOFTRDMA_CCL_WAN_COMPRESS", "int8", 1);
  EXPECT_THROW(Config::from_environment(), std::invalid_argument);
  ::setenv("SOFTRDMA_CCL_WAN_COMPRESS", "none", 1);
  ::setenv("SOFTRDMA_CCL_SITE", std::string(64, 's').c_str(), 1);
  EXPECT_THROW(Config::from_environment(), std::invalid_argument);
  ::unsetenv("SOFTRDMA_CCL_SITE");
  ::unsetenv("SOFTRDMA_CCL_WAN_COMPRESS");
  ::unsetenv("SOFTRDMA_CCL_ALGO");
}

TEST(HierarchicalConfig, ALongSiteNameIsRefused) {
  LoopbackFabric f(1, std::chrono::seconds(5));
  Config c;
  c.site = std::string(64, 's');
  EXPECT_THROW(Communicator(f.transport(0), c), std::invalid_argument);
}

}  // namespace
}  // namespace softrdma::ccl::testing
