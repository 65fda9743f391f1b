// nccl-tests' command line (github.com/NVIDIA/nccl-tests, src/common.cu), read the same way by
// every nccl-tests–style program here: the tools/ccl_perf/*_perf tools and the reference
// benchmarks bench/mpi_allreduce and bench/gloo_allreduce.
//
//   -b minbytes -e maxbytes -i stepbytes (K/M/G suffixes, ×1024) -f stepfactor -n iters
//   -w warmup_iters -c check -o op -d datatype -r root -a average(0..3)
//   -m agg_iters -z blocking(0/1) -G cudagraph
//   -t nthreads -g ngpus (only 1: one rank per process) -h
//
// -c is nccl-tests' "check iteration count": 0 turns checking off; any other count checks
// each size once here. -o and -d are returned as given: what a program supports is its own
// business (the ccl tools take every type and op, the baselines float and sum). -m is
// nccl-tests' aggregation: each timed iteration issues agg_iters operations in one group
// (ncclGroupStart/End) and the time is reported per operation. -z and -G are parsed for
// compatibility: collectives on CPU buffers always block, and there are no CUDA graphs.
// Every program parses -m, -z and -G; its usage `extra` lines say what it does with them.
#pragma once

#include <cstddef>
#include <span>
#include <string>

namespace softrdma::nccl_tests {

/// The flags every program takes, with nccl-tests' defaults.
struct Options {
  size_t min_bytes = 32u << 20;    ///< -b, bytes
  size_t max_bytes = 32u << 20;    ///< -e, bytes
  size_t step_bytes = 1u << 20;    ///< -i, bytes (used when step_factor is 1)
  size_t step_factor = 1;          ///< -f
  int iters = 20;                  ///< -n, timed operations per size
  int warmup = 5;                  ///< -w, untimed operations at the largest and smallest size
  int check = 1;                   ///< -c, 0: no result check
  int root = 0;                    ///< -r, root rank of rooted collectives
  int average = 1;                 ///< -a: time over ranks, 0 rank 0's, 1 mean, 2 min, 3 max
  int agg_iters = 1;               ///< -m, operations per timed iteration (one group)
  int blocking = 0;                ///< -z, 0/1 (CPU collectives block either way)
  int cudagraph = 0;               ///< -G, CUDA graph launches per iteration (none on CPU)
  std::string op = "sum";          ///< -o as given
  std::string datatype = "float";  ///< -d as given
};

/// A long option of one program (e.g. gloo_allreduce's --rank), taking an argument.
struct ExtraOption {
  const char* name;    ///< long name without "--"
  std::string* value;  ///< receives the argument
};

enum class ParseResult { kOk, kHelp, kError };

/// Parses argv with getopt_long. kHelp when -h/--help is given; kError with `error` naming
/// the flag and its value ("invalid size for minbytes: 12q") on a malformed value, an
/// unknown option, a stray argument, minbytes > maxbytes or a zero step.
ParseResult parse_options(int argc, char** argv, Options& out, std::string& error,
                          std::span<const ExtraOption> extra = {});

/// nccl-tests' usage text for `program`: `datatypes` and `ops` list what -d and -o accept;
/// `extra` lines (already formatted, "\t[--rank R]\n") and `notes` follow the common flags.
std::string usage(const char* program, const char* datatypes, const char* ops,
                  const char* extra = "", const char* notes = "");

/// nccl-tests' parsesize: a non-negative number with an optional K, M or G suffix (×1024,
/// either case). Returns false for anything else.
bool parse_size(const char* v, size_t& out);

/// An integer in [lo, hi] (strtol with base 0, as nccl-tests). Returns false for anything
/// else.
bool parse_long(const char* v, long lo, long hi, long& out);

}  // namespace softrdma::nccl_tests
