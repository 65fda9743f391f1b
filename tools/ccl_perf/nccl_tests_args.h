// nccl-tests' command line (github.com/NVIDIA/nccl-tests, src/common.cu), read the same way by
// every nccl-tests–style program here: the tools/ccl_perf/*_perf tools and the reference
// benchmarks bench/mpi_{allreduce,allgather,reduce_scatter} and bench/gloo_allreduce.
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
#include <optional>
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

/// What a program's -h prints (the arguments of usage()).
struct UsageText {
  const char* program;     ///< the command line shown after "USAGE: "
  const char* datatypes;   ///< what -d accepts, "float" or "int8/…/all"
  const char* ops;         ///< what -o accepts
  const char* extra = "";  ///< the program's own flags, formatted as usage()'s `extra`
  const char* notes = "";  ///< text after the flags
};

/// parse_options() and what every program does with its outcome, in one place: kOk returns
/// std::nullopt (go on); kHelp prints usage(text) to stdout and returns 0; kError prints
/// "<program_invocation_short_name>: <error> (see -h)" to stderr and returns 2. Nothing is
/// printed when `print` is false (the ranks other than 0 of an MPI program). The caller exits
/// with the returned status after its own clean-up (MPI_Finalize), so this never exits.
std::optional<int> parse_command_line(int argc, char** argv, Options& out, const UsageText& text,
                                      bool print = true, std::span<const ExtraOption> extra = {});

/// nccl-tests' parsesize: a non-negative number with an optional K, M or G suffix (×1024,
/// either case). Returns false for anything else.
bool parse_size(const char* v, size_t& out);

/// An integer in [lo, hi] (strtol with base 0, as nccl-tests). Returns false for anything
/// else.
bool parse_long(const char* v, long lo, long hi, long& out);

}  // namespace softrdma::nccl_tests
