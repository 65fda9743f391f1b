// Helpers of the ccl tests: running one Communicator per thread over a LoopbackFabric,
// deterministic inputs per (rank, element), typed loads/stores, and the reference result
// with its tolerance.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ccl/ccl.h"
#include "ccl/loopback_transport.h"
#include "ccl/reduce.h"

namespace softrdma::ccl::testing {

/// Runs fn(comm) on `n` threads, rank r with the Communicator of LoopbackFabric rank r.
/// A rank that throws is killed on the fabric, so its peers fail fast instead of waiting
/// out the timeout. Returns "" or the first failure, "rank r: what".
inline std::string run_ranks(int n, const std::function<Config(int)>& config_of,
                             const std::function<void(Communicator&)>& fn,
                             std::chrono::milliseconds timeout = std::chrono::seconds(60),
                             LoopbackFabric* fabric = nullptr);
inline std::string run_ranks(int n, const Config& cfg, const std::function<void(Communicator&)>& fn,
                             std::chrono::milliseconds timeout = std::chrono::seconds(60),
                             LoopbackFabric* fabric = nullptr) {
  return run_ranks(
      n, [&](int) { return cfg; }, fn, timeout, fabric);
}

/// As above, rank r with the Config config_of(r) (e.g. its own Config::site).
inline std::string run_ranks(int n, const std::function<Config(int)>& config_of,
                             const std::function<void(Communicator&)>& fn,
                             std::chrono::milliseconds timeout, LoopbackFabric* fabric) {
  LoopbackFabric own(n, timeout);
  LoopbackFabric& f = fabric != nullptr ? *fabric : own;
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        Communicator comm(f.transport(r), config_of(r));
        fn(comm);
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        f.kill(r);
      }
    });
  }
  for (auto& t : threads) t.join();
  // Prefer the root cause over the peers' PeerErrors that followed from it.
  for (int pass = 0; pass < 2; ++pass) {
    for (int r = 0; r < n; ++r) {
      const std::string& e = errors[static_cast<size_t>(r)];
      if (e.empty()) continue;
      if (pass == 0 && (e.find("killed") != std::string::npos ||
                        e.find("closed its transport") != std::string::npos))
        continue;
      return "rank " + std::to_string(r) + ": " + e;
    }
  }
  return "";
}

inline constexpr DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kUint8,  DataType::kInt32,   DataType::kUint32,
    DataType::kInt64,   DataType::kUint64, DataType::kFloat16, DataType::kBfloat16,
    DataType::kFloat32, DataType::kFloat64};
inline constexpr RedOp kAllOps[] = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin,
                                    RedOp::kAvg};

inline bool is_float(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBfloat16 || t == DataType::kFloat32 ||
         t == DataType::kFloat64;
}
inline bool is_signed(DataType t) {
  return t == DataType::kInt8 || t == DataType::kInt32 || t == DataType::kInt64 || is_float(t);
}

/// Element i of a typed buffer as a double (exact for every value the tests use).
inline double load(DataType t, const void* p, size_t i) {
  return load_element(p, t, i);
}

/// Stores v (rounded to nearest for the float types, truncated for integers) at element i.
inline void store(DataType t, void* p, size_t i, double v) {
  store_element(p, t, i, v);
}

/// The input of `rank` at element i, chosen so no result overflows any type: sums of 8 are
/// within ±88 (unsigned: ≤ 176), products within ±4 for integers and [0.17, 4.3] for floats.
/// Float values are not exactly representable, so rounding is exercised.
inline double gen(DataType t, RedOp op, int rank, size_t i) {
  const auto r = static_cast<size_t>(rank);
  if (op == RedOp::kProd) {
    if (is_float(t)) return 1.0 + static_cast<double>((i + r * 3) % 9) * 0.05 - 0.2;
    double v = (i + r) % 5 == 0 ? 2 : 1;
    if (is_signed(t) && (i * 3 + r) % 7 == 0) v = -v;
    return v;
  }
  const double base = static_cast<double>((i * 7 + r * 13 + 3) % 23);
  if (is_float(t)) return (base - 11) * 0.37 + static_cast<double>(rank) * 0.01;
  return is_signed(t) ? base - 11 : base;
}

/// gen() as stored in the type (what the collective actually sees).
inline double gen_stored(DataType t, RedOp op, int rank, size_t i) {
  unsigned char tmp[8];
  store(t, tmp, 0, gen(t, op, rank, i));
  return load(t, tmp, 0);
}

/// Relative rounding error per reduction step: float16 2^-11, bfloat16 2^-8 (round to
/// nearest), float32 2^-24, float64 2^-53 — with margin.
inline double epsilon(DataType t) {
  switch (t) {
    case DataType::kFloat16:
      return 1e-3;
    case DataType::kBfloat16:
      return 8e-3;
    case DataType::kFloat32:
      return 1e-6;
    case DataType::kFloat64:
      return 1e-14;
    default:
      return 0;
  }
}

/// Reference of `op` over inputs[0..n) and the tolerance of a collective's result:
/// integers exact (avg truncates toward zero); float max/min exact; float sum/avg/prod
/// within (n+1)·epsilon(t) of the sum of magnitudes (prod: of |result|), since every hop
/// of a ring or doubling step may round once in the wire type (reduce.h).
struct Expected {
  double value;
  double tolerance;
};
inline Expected reference(DataType t, RedOp op, const double* in, int n) {
  double v = in[0];
  double magnitude = std::fabs(in[0]);
  for (int q = 1; q < n; ++q) {
    const double x = in[q];
    magnitude += std::fabs(x);
    switch (op) {
      case RedOp::kSum:
      case RedOp::kAvg:
        v += x;
        break;
      case RedOp::kProd:
        v *= x;
        break;
      case RedOp::kMax:
        v = std::max(v, x);
        break;
      case RedOp::kMin:
        v = std::min(v, x);
        break;
    }
  }
  if (op == RedOp::kAvg) {
    v = is_float(t) ? v / n : std::trunc(v / n);
    magnitude /= n;
  }
  if (op == RedOp::kProd) magnitude = std::fabs(v);
  if (op == RedOp::kMax || op == RedOp::kMin) magnitude = 0;
  return {v, (n + 1) * epsilon(t) * magnitude};
}

/// Fills n·count elements of `p` with a value no test produces (to spot unwritten output).
inline void fill_sentinel(DataType t, void* p, size_t elems) {
  for (size_t i = 0; i < elems; ++i) store(t, p, i, 111);
}

}  // namespace softrdma::ccl::testing
