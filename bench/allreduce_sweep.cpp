#include "bench/allreduce_sweep.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "tools/ccl_perf/nccl_tests_format.h"

namespace softrdma::bench {

namespace {

float input(int rank, size_t i, uint64_t k) {
  return static_cast<float>((i * 7 + static_cast<uint64_t>(rank) * 13 + k) % 61);
}

}  // namespace

int run_sweep(FloatSumAllReduce& lib, const nccl_tests::Options& o, int rank, int n) {
  const size_t max_count = std::max<size_t>(o.max_bytes / sizeof(float), 1);
  lib.send.assign(max_count, 0.0f);
  lib.recv.assign(max_count, 0.0f);
  uint64_t k = 0;
  auto init = [&](size_t count, bool in_place) {
    float* in = in_place ? lib.recv.data() : lib.send.data();
    for (size_t i = 0; i < count; ++i) in[i] = input(rank, i, k);
    if (!in_place)
      std::fill(lib.recv.begin(), lib.recv.begin() + static_cast<ptrdiff_t>(count), -1.0f);
  };

  // Warm-up at the largest and the smallest size, as nccl-tests.
  for (size_t bytes : {o.max_bytes, o.min_bytes}) {
    lib.prepare(bytes / sizeof(float), false);
    for (int i = 0; i < o.warmup; ++i) lib.run();
  }

  int errors = 0;
  double bw_sum = 0;
  int bw_count = 0;
  for (size_t size = o.min_bytes;;) {
    const size_t count = size / sizeof(float);
    if (rank == 0) nccl_tests::print_row_start(count * sizeof(float), count, "float", "sum", -1);
    for (bool in_place : {false, true}) {
      ++k;
      lib.prepare(count, in_place);
      if (o.check) init(count, in_place);
      lib.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < o.iters; ++i) lib.run();
      double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / o.iters;
      sec = lib.combine_time(sec, o.average);
      const double algbw = static_cast<double>(count * sizeof(float)) / sec / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      int64_t wrong = 0;
      if (o.check) {
        init(count, in_place);
        lib.barrier();
        lib.run();
        for (size_t i = 0; i < count; ++i) {
          float expect = 0;
          for (int r = 0; r < n; ++r) expect += input(r, i, k);
          if (lib.recv[i] != expect) ++wrong;
        }
        wrong = lib.sum_over_ranks(wrong);
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
