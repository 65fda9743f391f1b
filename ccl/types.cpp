// Names of element types and reduction operators (the spellings nccl-tests prints and
// accepts), and Config::from_environment.
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "base/params.h"
#include "ccl/ccl.h"

namespace softrdma::ccl {

namespace {

struct TypeName {
  const char* name;
  DataType type;
};

// The first spelling of each type is the one type_name() returns.
constexpr TypeName kTypeNames[] = {
    {"int8", DataType::kInt8},       {"uint8", DataType::kUint8},
    {"int32", DataType::kInt32},     {"uint32", DataType::kUint32},
    {"int64", DataType::kInt64},     {"uint64", DataType::kUint64},
    {"half", DataType::kFloat16},    {"bfloat16", DataType::kBfloat16},
    {"float", DataType::kFloat32},   {"double", DataType::kFloat64},
    {"float16", DataType::kFloat16}, {"fp16", DataType::kFloat16},
    {"bf16", DataType::kBfloat16},   {"float32", DataType::kFloat32},
    {"fp32", DataType::kFloat32},    {"float64", DataType::kFloat64},
    {"fp64", DataType::kFloat64},
};

constexpr const char* kOpNames[] = {"sum", "prod", "max", "min", "avg"};

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

size_t type_size(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64:
      return 8;
  }
  throw std::invalid_argument("unknown DataType value " + std::to_string(static_cast<int>(t)));
}

const char* type_name(DataType t) {
  for (const TypeName& n : kTypeNames)
    if (n.type == t) return n.name;
  return "unknown";
}

const char* op_name(RedOp op) {
  auto i = static_cast<size_t>(op);
  return i < std::size(kOpNames) ? kOpNames[i] : "unknown";
}

bool parse_type(const std::string& s, DataType& out) {
  const std::string l = lower(s);
  for (const TypeName& n : kTypeNames) {
    if (l == n.name) {
      out = n.type;
      return true;
    }
  }
  return false;
}

bool parse_op(const std::string& s, RedOp& out) {
  const std::string l = lower(s);
  for (size_t i = 0; i < std::size(kOpNames); ++i) {
    if (l == kOpNames[i]) {
      out = static_cast<RedOp>(i);
      return true;
    }
  }
  return false;
}

namespace {

// Each SOFTRDMA_CCL_* setting of Config is read through the parameter registry
// (base/params.h: defaults, ranges and docs in one place).

// SOFTRDMA_CCL_ALGO; `def` when unset.
Algorithm algorithm_from_environment(Algorithm def) {
  if (params::raw(params::kCclAlgo) == nullptr) return def;
  const std::string a = params::text(params::kCclAlgo);
  if (a == "ring") return Algorithm::kRing;
  if (a == "rd" || a == "recursive_doubling") return Algorithm::kRecursiveDoubling;
  if (a == "rabenseifner") return Algorithm::kRabenseifner;
  if (a == "hierarchical") return Algorithm::kHierarchical;
  return Algorithm::kAuto;
}

// SOFTRDMA_CCL_WAN_COMPRESS; `def` when unset.
WanCompression compression_from_environment(WanCompression def) {
  if (params::raw(params::kCclWanCompress) == nullptr) return def;
  const std::string a = params::text(params::kCclWanCompress);
  if (a == "fp16") return WanCompression::kFloat16;
  if (a == "bf16") return WanCompression::kBfloat16;
  return WanCompression::kNone;
}

}  // namespace

Config Config::from_environment() {
  Config c;
  c.algorithm = algorithm_from_environment(c.algorithm);
  c.chunk_bytes = static_cast<size_t>(
      params::integer(params::kCclChunkBytes, static_cast<int64_t>(c.chunk_bytes)));
  c.depth = static_cast<int>(params::integer(params::kCclDepth, c.depth));
  c.depth_from_path = params::flag(params::kCclDepthFromPath, c.depth_from_path);
  c.small_bytes = static_cast<size_t>(
      params::integer(params::kCclSmallBytes, static_cast<int64_t>(c.small_bytes)));
  c.medium_bytes = static_cast<size_t>(
      params::integer(params::kCclMediumBytes, static_cast<int64_t>(c.medium_bytes)));
  if (const char* site = params::raw(params::kCclSite)) c.site = site;
  if (c.site.size() > Config::kMaxSiteName)
    throw std::invalid_argument("SOFTRDMA_CCL_SITE: longer than 63 characters: '" + c.site + "'");
  c.wan_compress = compression_from_environment(c.wan_compress);
  // SOFTRDMA_CCL_TIMEOUT_MS is read by the transports (it sets Transport::timeout()).
  return c;
}

}  // namespace softrdma::ccl
