// The measuring loop the AllReduce baselines share (bench/mpi_allreduce, bench/gloo_allreduce):
// float sum, measured the way nccl-tests' all_reduce_perf measures (and softrdma's
// build/bin/all_reduce_perf), so that their lines compare column for column.
//
// Method, as nccl-tests (src/common.cu): buffers for the largest size; -w untimed operations
// at the largest then at the smallest size; then for every size, out-of-place then in-place:
// a barrier, -n back-to-back operations timed together, time = elapsed / n (µs per
// operation), combined over ranks (-a); then, with -c, fresh inputs, a barrier and one more
// untimed operation whose result is checked. algbw = size/time, busbw = algbw·2(n−1)/n
// (GB/s, 1 GB = 1e9 B): an AllReduce of S bytes must move 2(n−1)/n·S bytes in and out of each
// rank (nccl-tests doc/PERFORMANCE.md).
//
// Inputs are small integers ((7i + 13r + k) mod 61 for element i of rank r, k a per-run
// counter), so every float sum is exact and checked with ==.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tools/ccl_perf/nccl_tests_args.h"

namespace softrdma::bench {

/// One library's float-sum AllReduce and the collectives the loop needs around it.
class FloatSumAllReduce {
 public:
  virtual ~FloatSumAllReduce() = default;
  /// Makes the next run() calls reduce `count` floats: send → recv, or recv in place.
  virtual void prepare(size_t count, bool in_place) = 0;
  /// One AllReduce as prepared.
  virtual void run() = 0;
  virtual void barrier() = 0;
  /// A time over ranks: `average` 0 rank 0's, 1 mean, 2 min, 3 max.
  virtual double combine_time(double seconds, int average) = 0;
  /// The sum of `v` over ranks.
  virtual int64_t sum_over_ranks(int64_t v) = 0;

  /// The buffers, max_bytes / 4 floats each (at least one); sized by run_sweep.
  std::vector<float> send, recv;
};

/// Runs the sweep of `o` (sizes min_bytes..max_bytes) on `lib`; rank 0 prints one result
/// line per size (nccl_tests_format.h) and the summary. Returns the number of placements
/// with wrong results (0: all correct).
int run_sweep(FloatSumAllReduce& lib, const nccl_tests::Options& o, int rank, int nranks);

}  // namespace softrdma::bench
