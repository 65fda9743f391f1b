// Names of element types and reduction operators (the spellings nccl-tests prints and
// accepts), and Config::from_environment.
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

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

// A non-negative decimal integer with an optional binary suffix (k, m, g: KiB, MiB, GiB).
uint64_t parse_size(const char* var, const std::string& value) {
  const std::string bad = std::string(var) + "=\"" + value + "\": ";
  if (value.empty() || !std::isdigit(static_cast<unsigned char>(value[0])))
    throw std::invalid_argument(bad + "expected a positive integer (optionally k/m/g suffix)");
  errno = 0;
  char* end = nullptr;
  unsigned long long n = std::strtoull(value.c_str(), &end, 10);
  if (errno == ERANGE) throw std::invalid_argument(bad + "out of range");
  std::string suffix = lower(end);
  unsigned shift = 0;
  if (suffix == "k" || suffix == "kib" || suffix == "kb") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mib" || suffix == "mb") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gib" || suffix == "gb") {
    shift = 30;
  } else if (!suffix.empty()) {
    throw std::invalid_argument(bad + "unknown suffix \"" + std::string(end) +
                                "\" (expected k, m or g)");
  }
  if (shift != 0 && n > (~0ull >> shift)) throw std::invalid_argument(bad + "out of range");
  return static_cast<uint64_t>(n) << shift;
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

// Each SOFTRDMA_CCL_* setting of Config is read by one function of its own, so that moving
// them onto a parameter registry touches one function each.

// SOFTRDMA_CCL_ALGO=ring|rd|recursive_doubling|rabenseifner|auto (empty: auto); `def` when
// unset.
Algorithm algorithm_from_environment(Algorithm def) {
  const char* v = std::getenv("SOFTRDMA_CCL_ALGO");
  if (v == nullptr) return def;
  const std::string a = lower(v);
  if (a == "ring") return Algorithm::kRing;
  if (a == "rd" || a == "recursive_doubling") return Algorithm::kRecursiveDoubling;
  if (a == "rabenseifner") return Algorithm::kRabenseifner;
  if (a == "auto" || a.empty()) return Algorithm::kAuto;
  throw std::invalid_argument(std::string("SOFTRDMA_CCL_ALGO=\"") + v +
                              "\": expected ring, rd, rabenseifner or auto");
}

// SOFTRDMA_CCL_CHUNK_BYTES: bytes with an optional k/m/g suffix, in [1, kMaxChunkBytes].
size_t chunk_bytes_from_environment(size_t def) {
  const char* v = std::getenv("SOFTRDMA_CCL_CHUNK_BYTES");
  if (v == nullptr) return def;
  uint64_t n = parse_size("SOFTRDMA_CCL_CHUNK_BYTES", v);
  if (n == 0 || n > Config::kMaxChunkBytes)
    throw std::invalid_argument(std::string("SOFTRDMA_CCL_CHUNK_BYTES=\"") + v +
                                "\": must be between 1 and 1 GiB");
  return static_cast<size_t>(n);
}

// SOFTRDMA_CCL_DEPTH: a plain integer in [1, kMaxDepth].
int depth_from_environment(int def) {
  const char* v = std::getenv("SOFTRDMA_CCL_DEPTH");
  if (v == nullptr) return def;
  uint64_t n = 0;
  try {
    n = parse_size("SOFTRDMA_CCL_DEPTH", v);
  } catch (const std::invalid_argument&) {
    n = 0;
  }
  if (n == 0 || n > static_cast<uint64_t>(Config::kMaxDepth) ||
      lower(v).find_first_not_of("0123456789") != std::string::npos)
    throw std::invalid_argument(std::string("SOFTRDMA_CCL_DEPTH=\"") + v +
                                "\": must be an integer between 1 and " +
                                std::to_string(Config::kMaxDepth));
  return static_cast<int>(n);
}

}  // namespace

Config Config::from_environment() {
  Config c;
  c.algorithm = algorithm_from_environment(c.algorithm);
  c.chunk_bytes = chunk_bytes_from_environment(c.chunk_bytes);
  c.depth = depth_from_environment(c.depth);
  // SOFTRDMA_CCL_TIMEOUT_MS is read by the transports (it sets Transport::timeout()).
  return c;
}

}  // namespace softrdma::ccl
