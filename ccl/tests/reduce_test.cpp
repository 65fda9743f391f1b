// Reduction kernels, float16/bfloat16 conversions, type/op names and Config parsing.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "ccl/ccl.h"
#include "ccl/reduce.h"
#include "ccl/tests/test_util.h"

namespace softrdma::ccl {
namespace {

using testing::gen;
using testing::kAllOps;
using testing::kAllTypes;
using testing::load;
using testing::store;

bool half_is_nan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x03ff) != 0;
}
bool bf16_is_nan(uint16_t b) {
  return (b & 0x7f80) == 0x7f80 && (b & 0x007f) != 0;
}

TEST(Float16, RoundTripsEveryValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = half_to_float(bits);
    if (half_is_nan(bits)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      const uint16_t back = float_to_half(f);
      ASSERT_TRUE(half_is_nan(back)) << std::hex << h;
      ASSERT_EQ(back & 0x8000, bits & 0x8000) << std::hex << h;
    } else {
      ASSERT_EQ(float_to_half(f), bits) << std::hex << h << " " << f;
    }
  }
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_TRUE(std::isinf(half_to_float(0xfc00)) && half_to_float(0xfc00) < 0);
}

// Between two adjacent halves: the midpoint goes to the even one, anything off the
// midpoint to the nearer one. Covers normal and subnormal ranges and the overflow to Inf.
TEST(Float16, RoundsToNearestEven) {
  for (uint16_t h = 0; h < 0x7c00; ++h) {
    const float lo = half_to_float(h);
    const float hi = half_to_float(static_cast<uint16_t>(h + 1));  // 0x7c00 is +Inf
    const float mid = h == 0x7bff ? 65520.0f : (lo + hi) / 2;      // exact in float
    const uint16_t even = (h & 1) == 0 ? h : static_cast<uint16_t>(h + 1);
    ASSERT_EQ(float_to_half(mid), even) << std::hex << h;
    ASSERT_EQ(float_to_half(std::nextafter(mid, 0.0f)), h) << std::hex << h;
    ASSERT_EQ(float_to_half(std::nextafter(mid, INFINITY)), h + 1) << std::hex << h;
    ASSERT_EQ(float_to_half(-std::nextafter(mid, 0.0f)), h | 0x8000) << std::hex << h;
  }
  EXPECT_EQ(float_to_half(1e6f), 0x7c00);
  EXPECT_EQ(float_to_half(-1e6f), 0xfc00);
  EXPECT_EQ(float_to_half(1e-9f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_TRUE(half_is_nan(float_to_half(std::numeric_limits<float>::quiet_NaN())));
}

#ifdef __FLT16_MANT_DIG__
// GCC's _Float16 (software conversions in libgcc, IEEE round-to-nearest-even) as a second
// opinion over a sweep of float bit patterns.
TEST(Float16, AgreesWithCompilerFloat16) {
  for (uint64_t u = 0; u <= 0xffffffffu; u += 65521) {
    const auto f = std::bit_cast<float>(static_cast<uint32_t>(u));
    const auto ref = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    const uint16_t got = float_to_half(f);
    if (half_is_nan(ref))
      ASSERT_TRUE(half_is_nan(got)) << std::hex << u;
    else
      ASSERT_EQ(got, ref) << std::hex << u << " " << f;
  }
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float ref = static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h)));
    const float got = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(ref))
      ASSERT_TRUE(std::isnan(got));
    else
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(ref)) << std::hex << h;
  }
}
#endif

TEST(Bfloat16, RoundTripsAndRoundsToNearestEven) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float f = bfloat16_to_float(bits);
    if (bf16_is_nan(bits)) {
      ASSERT_TRUE(bf16_is_nan(float_to_bfloat16(f))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(float_to_bfloat16(f), bits) << std::hex << b;
    if ((b & 0x7fff) >= 0x7f80) continue;  // Inf: no upper neighbour
    const uint32_t u = b << 16;
    const uint16_t even = (b & 1) == 0 ? bits : static_cast<uint16_t>(b + 1);
    ASSERT_EQ(float_to_bfloat16(std::bit_cast<float>(u + 0x8000)), even) << std::hex << b;
    ASSERT_EQ(float_to_bfloat16(std::bit_cast<float>(u + 0x7fff)), bits) << std::hex << b;
    ASSERT_EQ(float_to_bfloat16(std::bit_cast<float>(u + 0x8001)), b + 1) << std::hex << b;
  }
  // A NaN whose payload sits only in the dropped bits must not round to Inf.
  EXPECT_TRUE(bf16_is_nan(float_to_bfloat16(std::bit_cast<float>(0x7f800001u))));
  EXPECT_EQ(float_to_bfloat16(FLT_MAX), 0x7f80);  // rounds up to +Inf
}

double apply(RedOp op, double a, double b) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kAvg:
      return a + b;
    case RedOp::kProd:
      return a * b;
    case RedOp::kMax:
      return std::max(a, b);
    case RedOp::kMin:
      return std::min(a, b);
  }
  return 0;
}

// Every type × op, odd lengths (vector loop plus scalar tail), both kernels and every
// permitted aliasing of reduce_to, on the portable loops and (where the CPU has them) the
// AVX2/F16C ones. Two-operand results are exact in double, so the expected value is that
// result rounded once into the type.
class ReduceKernels : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { detail::use_simd_dispatch(GetParam()); }
  void TearDown() override { detail::use_simd_dispatch(true); }
};

TEST_P(ReduceKernels, EveryTypeAndOp) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1037}}) {
    for (DataType t : kAllTypes) {
      for (RedOp op : kAllOps) {
        const size_t ts = type_size(t);
        std::vector<unsigned char> a(count * ts + 1), b(count * ts + 1), out(count * ts + 1),
            expect(count * ts + 1);
        for (size_t i = 0; i < count; ++i) {
          store(t, a.data(), i, gen(t, op, 1, i));
          store(t, b.data(), i, gen(t, op, 2, i * 3));
          store(t, expect.data(), i, apply(op, load(t, a.data(), i), load(t, b.data(), i)));
        }
        const std::string what =
            std::string(type_name(t)) + " " + op_name(op) + " count " + std::to_string(count);
        reduce_to(out.data(), a.data(), b.data(), count, t, op);
        EXPECT_EQ(0, std::memcmp(out.data(), expect.data(), count * ts)) << what << " reduce_to";
        std::vector<unsigned char> acc = a;
        reduce_into(acc.data(), b.data(), count, t, op);
        EXPECT_EQ(0, std::memcmp(acc.data(), expect.data(), count * ts)) << what << " reduce_into";
        acc = a;
        reduce_to(acc.data(), acc.data(), b.data(), count, t, op);
        EXPECT_EQ(0, std::memcmp(acc.data(), expect.data(), count * ts)) << what << " out == a";
        acc = b;
        reduce_to(acc.data(), a.data(), acc.data(), count, t, op);
        EXPECT_EQ(0, std::memcmp(acc.data(), expect.data(), count * ts)) << what << " out == b";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, ReduceKernels, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Dispatched" : "Portable";
                         });

TEST(Reduce, SignedIntegersWrap) {
  int8_t a8[3] = {127, -128, 100};
  const int8_t b8[3] = {1, -1, 100};
  reduce_into(a8, b8, 3, DataType::kInt8, RedOp::kSum);
  EXPECT_EQ(a8[0], -128);
  EXPECT_EQ(a8[1], 127);
  EXPECT_EQ(a8[2], -56);
  int32_t a32[2] = {INT32_MAX, 65536};
  const int32_t b32[2] = {2, 65536};
  reduce_into(a32, b32, 2, DataType::kInt32, RedOp::kProd);
  EXPECT_EQ(a32[0], -2);
  EXPECT_EQ(a32[1], 0);
  int64_t a64[1] = {INT64_MIN};
  const int64_t b64[1] = {-1};
  reduce_into(a64, b64, 1, DataType::kInt64, RedOp::kSum);
  EXPECT_EQ(a64[0], INT64_MAX);
  uint8_t u8[1] = {255};
  const uint8_t v8[1] = {255};
  reduce_into(u8, v8, 1, DataType::kUint8, RedOp::kProd);
  EXPECT_EQ(u8[0], 1);
}

TEST(Reduce, Float16AccumulatesInFloat32) {
  // 2048 + 1 is not a half (spacing 2 there); the sum rounds to even once, in float32.
  uint16_t a[2] = {float_to_half(2048.0f), float_to_half(1.0f)};
  const uint16_t b[2] = {float_to_half(1.0f), float_to_half(1e-4f)};
  reduce_into(a, b, 2, DataType::kFloat16, RedOp::kSum);
  EXPECT_EQ(half_to_float(a[0]), 2048.0f);
  EXPECT_EQ(a[1], float_to_half(1.0f + half_to_float(float_to_half(1e-4f))));
}

TEST(Reduce, ScaleAvgTruncatesIntegersTowardZero) {
  int32_t i[4] = {7, -7, 8, -1};
  scale_avg(i, 4, DataType::kInt32, 2);
  EXPECT_EQ(i[0], 3);
  EXPECT_EQ(i[1], -3);
  EXPECT_EQ(i[2], 4);
  EXPECT_EQ(i[3], 0);
  uint8_t u[1] = {255};
  scale_avg(u, 1, DataType::kUint8, 8);
  EXPECT_EQ(u[0], 31);
  float f[1] = {1.0f};
  scale_avg(f, 1, DataType::kFloat32, 3);
  EXPECT_EQ(f[0], 1.0f / 3);
  uint16_t h[1] = {float_to_half(1.0f)};
  scale_avg(h, 1, DataType::kFloat16, 3);
  EXPECT_EQ(h[0], float_to_half(1.0f / 3));
  uint16_t bf[1] = {float_to_bfloat16(3.0f)};
  scale_avg(bf, 1, DataType::kBfloat16, 4);
  EXPECT_EQ(bfloat16_to_float(bf[0]), 0.75f);
  EXPECT_THROW(scale_avg(f, 1, DataType::kFloat32, 0), std::invalid_argument);
}

TEST(Reduce, RejectsUnknownTypeAndOp) {
  float a = 1, b = 2;
  EXPECT_THROW(reduce_into(&a, &b, 1, static_cast<DataType>(42), RedOp::kSum),
               std::invalid_argument);
  EXPECT_THROW(reduce_into(&a, &b, 1, DataType::kFloat32, static_cast<RedOp>(42)),
               std::invalid_argument);
}

TEST(Types, NamesAndSizes) {
  const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  const char* names[] = {"int8",   "uint8", "int32",    "uint32", "int64",
                         "uint64", "half",  "bfloat16", "float",  "double"};
  for (size_t i = 0; i < std::size(kAllTypes); ++i) {
    EXPECT_EQ(type_size(kAllTypes[i]), sizes[i]);
    EXPECT_STREQ(type_name(kAllTypes[i]), names[i]);
    DataType t{};
    ASSERT_TRUE(parse_type(names[i], t));
    EXPECT_EQ(t, kAllTypes[i]);
  }
  const std::pair<const char*, DataType> aliases[] = {{"float16", DataType::kFloat16},
                                                      {"bf16", DataType::kBfloat16},
                                                      {"float32", DataType::kFloat32},
                                                      {"float64", DataType::kFloat64},
                                                      {"FLOAT", DataType::kFloat32}};
  for (auto [name, type] : aliases) {
    DataType t{};
    ASSERT_TRUE(parse_type(name, t)) << name;
    EXPECT_EQ(t, type) << name;
  }
  DataType t{};
  EXPECT_FALSE(parse_type("int16", t));
  EXPECT_FALSE(parse_type("", t));
  EXPECT_THROW(type_size(static_cast<DataType>(99)), std::invalid_argument);

  const char* ops[] = {"sum", "prod", "max", "min", "avg"};
  for (size_t i = 0; i < std::size(kAllOps); ++i) {
    EXPECT_STREQ(op_name(kAllOps[i]), ops[i]);
    RedOp op{};
    ASSERT_TRUE(parse_op(ops[i], op));
    EXPECT_EQ(op, kAllOps[i]);
  }
  RedOp op{};
  EXPECT_FALSE(parse_op("mean", op));
}

// Sets environment variables for one test and restores them after.
class EnvGuard {
 public:
  EnvGuard() {
    for (const char* v : kVars) {
      const char* old = std::getenv(v);
      saved_.emplace_back(old != nullptr, old != nullptr ? old : "");
      unsetenv(v);
    }
  }
  ~EnvGuard() {
    for (size_t i = 0; i < std::size(kVars); ++i) {
      if (saved_[i].first)
        setenv(kVars[i], saved_[i].second.c_str(), 1);
      else
        unsetenv(kVars[i]);
    }
  }

 private:
  static constexpr const char* kVars[] = {"SOFTRDMA_CCL_ALGO", "SOFTRDMA_CCL_CHUNK_BYTES",
                                          "SOFTRDMA_CCL_DEPTH"};
  std::vector<std::pair<bool, std::string>> saved_;
};

TEST(Config, Defaults) {
  EnvGuard env;
  const Config c = Config::from_environment();
  EXPECT_EQ(c.algorithm, Algorithm::kAuto);
  EXPECT_EQ(c.chunk_bytes, 512u * 1024);
  EXPECT_EQ(c.depth, 4);
  EXPECT_EQ(c.small_bytes, 64u * 1024);
}

TEST(Config, ReadsEnvironment) {
  EnvGuard env;
  setenv("SOFTRDMA_CCL_ALGO", "ring", 1);
  setenv("SOFTRDMA_CCL_CHUNK_BYTES", "1m", 1);
  setenv("SOFTRDMA_CCL_DEPTH", "8", 1);
  Config c = Config::from_environment();
  EXPECT_EQ(c.algorithm, Algorithm::kRing);
  EXPECT_EQ(c.chunk_bytes, 1u << 20);
  EXPECT_EQ(c.depth, 8);
  setenv("SOFTRDMA_CCL_ALGO", "RD", 1);
  setenv("SOFTRDMA_CCL_CHUNK_BYTES", "4096", 1);
  c = Config::from_environment();
  EXPECT_EQ(c.algorithm, Algorithm::kRecursiveDoubling);
  EXPECT_EQ(c.chunk_bytes, 4096u);
  setenv("SOFTRDMA_CCL_ALGO", "auto", 1);
  setenv("SOFTRDMA_CCL_CHUNK_BYTES", "64K", 1);
  c = Config::from_environment();
  EXPECT_EQ(c.algorithm, Algorithm::kAuto);
  EXPECT_EQ(c.chunk_bytes, 64u * 1024);
}

TEST(Config, RejectsMalformedValues) {
  const std::pair<const char*, const char*> bad[] = {
      {"SOFTRDMA_CCL_ALGO", "tree"},
      {"SOFTRDMA_CCL_CHUNK_BYTES", "0"},
      {"SOFTRDMA_CCL_CHUNK_BYTES", "-5"},
      {"SOFTRDMA_CCL_CHUNK_BYTES", "12q"},
      {"SOFTRDMA_CCL_CHUNK_BYTES", "2g"},
      {"SOFTRDMA_CCL_CHUNK_BYTES", ""},
      {"SOFTRDMA_CCL_CHUNK_BYTES", "99999999999999999999999"},
      {"SOFTRDMA_CCL_DEPTH", "0"},
      {"SOFTRDMA_CCL_DEPTH", "1k"},
      {"SOFTRDMA_CCL_DEPTH", "257"},
      {"SOFTRDMA_CCL_DEPTH", "four"}};
  for (auto [var, value] : bad) {
    EnvGuard env;
    setenv(var, value, 1);
    try {
      Config::from_environment();
      ADD_FAILURE() << var << "=" << value << " accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(var), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace softrdma::ccl
