// nccl-tests' output (github.com/NVIDIA/nccl-tests, src/common.cu), printed the same way by
// every nccl-tests–style program here (tools/ccl_perf/*_perf, bench/mpi_coll.cpp (mpi_allreduce,
// …), bench/gloo_allreduce), so their lines compare column for column:
//
//   # nThread 1 nGpus 1 minBytes … graph: 0             print_parameters_line
//   #  Rank  0 Group  0 Pid …                           rank_line (one per rank)
//   #       size  count  type  redop  root  time …      print_column_headers
//        1048576  262144  float  sum  -1  …             print_row_start + print_placement ×2
//   # Out of bounds values : 0 OK / # Avg bus bandwidth   print_summary
//
// time is µs per operation; algbw = S/t and busbw = algbw × factor in GB/s (1e9 B/s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "tools/ccl_perf/nccl_tests_args.h"

namespace softrdma::nccl_tests {

/// The time column, µs: "%7.0f" from 10 ms, "%7.1f" from 100 µs, else "%7.2f".
std::string time_text(double us);

/// Prints `s` without its trailing spaces, then a newline.
void print_trimmed_line(const std::string& s);

/// "# nThread 1 nGpus 1 minBytes … agg iters: M validation: C graph: G" (nccl-tests' line).
void print_parameters_line(const Options& o);

/// "#  Rank  R Group  0 Pid  P on  HOST" followed by `device` (if not empty): one rank's line,
/// gathered to rank 0 by the program.
std::string rank_line(int rank, const std::string& device);

/// The three column-header lines (placement, names, units).
void print_column_headers();

/// The start of one size's line: size (B), count (elements), type, redop, root.
void print_row_start(size_t bytes, size_t count, const char* type, const char* redop, int root);

/// One placement's columns: time, algbw, busbw, #wrong ("N/A" when not `checked`).
void print_placement(double seconds, double algbw, double busbw, bool checked, int64_t wrong);

/// "# Out of bounds values : E OK|FAILED", "# Avg bus bandwidth    : B", "#".
void print_summary(int errors, double busbw_sum, int busbw_count);

/// The size after `size` in the sweep (× step_factor, or + step_bytes). False when the sweep
/// is over: past max_bytes, or no progress (-b 0 with a factor, overflow).
bool next_size(const Options& o, size_t& size);

}  // namespace softrdma::nccl_tests
