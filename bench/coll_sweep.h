// The measuring loop the reference benchmarks share (bench/mpi_coll.cpp, built as
// mpi_allreduce, mpi_allgather and mpi_reduce_scatter; bench/gloo_allreduce): float
// AllReduce (sum), AllGather and ReduceScatter (sum) measured the way nccl-tests'
// all_reduce_perf, all_gather_perf and reduce_scatter_perf measure (and softrdma's
// tools/ccl_perf/*_perf), so that their lines compare column for column.
//
// Sizes, as nccl-tests (src/all_gather.cu, src/reduce_scatter.cu: *GetCollByteCount): a size S
// (-b … -e) is the larger buffer in bytes. AllReduce runs on S/4 floats; AllGather and
// ReduceScatter on count = S/4/n floats per rank (the contribution, resp. the result), so the
// gathered vector and the ReduceScatter input are count·n floats and the printed size is
// count·n·4 bytes (below S when n does not divide S/4; 0 when S/4 < n).
//
// Method, as nccl-tests (src/common.cu): buffers for the largest size; -w untimed operations
// at the largest then at the smallest size; then for every size, out-of-place then in-place:
// a barrier, -n back-to-back operations timed together, time = elapsed / n (µs per
// operation), combined over ranks (-a); then, with -c, fresh inputs, a barrier and one more
// untimed operation whose result is checked (#wrong: wrong result floats, summed over ranks).
// algbw = S/time and busbw = algbw × factor (GB/s, 1 GB = 1e9 B), factor 2(n−1)/n for
// AllReduce and (n−1)/n for AllGather and ReduceScatter: the bytes each rank must move in
// and out, per byte of S (nccl-tests doc/PERFORMANCE.md).
//
// Inputs are small integers: element i of the global vector (AllReduce's vector, the gathered
// vector, the ReduceScatter input) on rank r is (7i + 13r + k) mod 61, k a per-run counter,
// so every float sum is exact and checked with ==.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tools/ccl_perf/nccl_tests_args.h"

namespace softrdma::bench {

/// The measured collectives, numbered as tools/ccl_perf's CCL_PERF_OP.
enum class Coll { kAllReduce = 1, kAllGather = 2, kReduceScatter = 3 };

/// One library's float collective and the collectives the loop needs around it.
///
/// Buffer layout (as NCCL's): out of place, `send` holds the input (count floats for
/// AllReduce and AllGather, count·n for ReduceScatter) and `recv` receives the result (count,
/// count·n, count). In place, `recv` holds the input where NCCL's in-place form has it — the
/// whole input from float 0, except AllGather: this rank's contribution at float rank·count —
/// and the result is read from float in_place_result_offset() of `recv`.
class FloatCollective {
 public:
  virtual ~FloatCollective() = default;
  /// Makes the next run() calls work on `count` floats per call (per rank for AllGather and
  /// ReduceScatter), out of place or in place.
  virtual void prepare(size_t count, bool in_place) = 0;
  /// One collective as prepared.
  virtual void run() = 0;
  virtual void barrier() = 0;
  /// A time over ranks: `average` 0 rank 0's, 1 mean, 2 min, 3 max.
  virtual double combine_time(double seconds, int average) = 0;
  /// The sum of `v` over ranks.
  virtual int64_t sum_over_ranks(int64_t v) = 0;
  /// Where an in-place ReduceScatter leaves this rank's `count` result floats in `recv`:
  /// NCCL's place, float rank·count, unless the library says otherwise (MPI: float 0).
  virtual size_t in_place_result_offset(size_t count, int rank) const {
    return static_cast<size_t>(rank) * count;
  }

  /// The buffers, max_bytes / 4 floats each (at least one); sized by run_sweep.
  std::vector<float> send, recv;
};

/// nccl-tests' name of `c` ("AllReduce", "AllGather", "ReduceScatter").
const char* coll_name(Coll c);

/// Runs the sweep of `o` (sizes min_bytes..max_bytes) of collective `c` on `lib`; rank 0
/// prints one result line per size (nccl_tests_format.h) and the summary. Returns the number
/// of placements with wrong results (0: all correct).
int run_sweep(Coll c, FloatCollective& lib, const nccl_tests::Options& o, int rank, int nranks);

}  // namespace softrdma::bench
