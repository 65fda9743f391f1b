#include "bench/coll_sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "tools/ccl_perf/nccl_tests_format.h"

namespace softrdma::bench {

namespace {

/// What differs between the collectives in nccl-tests' measurement (src/all_reduce.cu,
/// src/all_gather.cu, src/reduce_scatter.cu).
struct Shape {
  const char* name;
  const char* redop;  ///< the redop column
  bool per_rank;      ///< the count is per rank and S = count·n·4
  bool bus_twice;     ///< busbw factor 2(n−1)/n (AllReduce), else (n−1)/n
};

const Shape& shape(Coll c) {
  static constexpr Shape kShapes[] = {
      {"AllReduce", "sum", false, true},
      {"AllGather", "none", true, false},
      {"ReduceScatter", "sum", true, false},
  };
  return kShapes[static_cast<int>(c) - 1];
}

float input(int rank, size_t i, uint64_t k) {
  return static_cast<float>((i * 7 + static_cast<uint64_t>(rank) * 13 + k) % 61);
}

}  // namespace

const char* coll_name(Coll c) {
  return shape(c).name;
}

int run_sweep(Coll c, FloatCollective& lib, const nccl_tests::Options& o, int rank, int n) {
  const Shape& sh = shape(c);
  const size_t nn = static_cast<size_t>(n);
  const size_t max_count = std::max<size_t>(o.max_bytes / sizeof(float), 1);
  lib.send.assign(max_count, 0.0f);
  lib.recv.assign(max_count, 0.0f);
  // The count argument for a size in bytes.
  auto count_of = [&](size_t bytes) { return bytes / sizeof(float) / (sh.per_rank ? nn : 1); };
  uint64_t k = 0;
  // Floats in and out of one rank, and the global index of this rank's first input and
  // result float (the rest of the vector is other ranks').
  auto in_len = [&](size_t count) { return c == Coll::kReduceScatter ? count * nn : count; };
  auto out_len = [&](size_t count) { return c == Coll::kAllGather ? count * nn : count; };
  const auto me = static_cast<size_t>(rank);
  auto init = [&](size_t count, bool in_place) {
    const size_t base = c == Coll::kAllGather ? me * count : 0;
    if (!in_place || c == Coll::kAllGather) std::fill_n(lib.recv.begin(), out_len(count), -1.0f);
    float* in = in_place ? lib.recv.data() + base : lib.send.data();
    for (size_t i = 0; i < in_len(count); ++i) in[i] = input(rank, base + i, k);
  };
  auto wrong_floats = [&](size_t count, bool in_place) {
    const size_t base = c == Coll::kReduceScatter ? me * count : 0;
    const size_t at =
        in_place && c == Coll::kReduceScatter ? lib.in_place_result_offset(count, rank) : 0;
    const float* out = lib.recv.data() + at;
    int64_t wrong = 0;
    for (size_t i = 0; i < out_len(count); ++i) {
      float expect = 0;
      if (c == Coll::kAllGather)
        expect = input(static_cast<int>(i / count), i, k);
      else
        for (int r = 0; r < n; ++r) expect += input(r, base + i, k);
      if (out[i] != expect) ++wrong;
    }
    return wrong;
  };

  // Warm-up at the largest and the smallest size, as nccl-tests.
  for (size_t bytes : {o.max_bytes, o.min_bytes}) {
    lib.prepare(count_of(bytes), false);
    for (int i = 0; i < o.warmup; ++i) lib.run();
  }

  int errors = 0;
  double bw_sum = 0;
  int bw_count = 0;
  for (size_t size = o.min_bytes;;) {
    const size_t count = count_of(size);
    const size_t bytes = count * (sh.per_rank ? nn : 1) * sizeof(float);
    if (rank == 0) nccl_tests::print_row_start(bytes, count, "float", sh.redop, -1);
    for (bool in_place : {false, true}) {
      ++k;
      lib.prepare(count, in_place);
      if (o.check) init(count, in_place);
      lib.barrier();
      // Real time: the sweep compares with MPI and Gloo, which run undilated.
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i) lib.run();
      double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
      sec = lib.combine_time(sec, o.average);
      const double algbw = static_cast<double>(bytes) / sec / 1e9;
      const double busbw = algbw * (sh.bus_twice ? 2.0 : 1.0) * (n - 1) / n;
      int64_t wrong = 0;
      if (o.check) {
        init(count, in_place);
        lib.barrier();
        lib.run();
        wrong = lib.sum_over_ranks(wrong_floats(count, in_place));
        if (wrong) ++errors;
      }
      if (rank == 0) nccl_tests::print_placement(sec, algbw, busbw, o.check != 0, wrong);
      bw_sum += busbw;
      ++bw_count;
    }
    if (rank == 0) std::printf("\n");
    if (!nccl_tests::next_size(o, size)) break;
  }
  lib.barrier();
  if (rank == 0) nccl_tests::print_summary(errors, bw_sum, bw_count);
  return errors;
}

}  // namespace softrdma::bench
