#include "tools/ccl_perf/nccl_tests_args.h"

#include <getopt.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace softrdma::nccl_tests {

bool parse_size(const char* v, size_t& out) {
  if (!v) return false;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  if (errno || end == v || x < 0) return false;
  double unit = 1;
  if (*end) {
    switch (*end) {
      case 'G':
      case 'g':
        unit = 1024.0 * 1024 * 1024;
        break;
      case 'M':
      case 'm':
        unit = 1024.0 * 1024;
        break;
      case 'K':
      case 'k':
        unit = 1024.0;
        break;
      default:
        return false;
    }
    if (end[1]) return false;
  }
  out = static_cast<size_t>(x * unit);
  return true;
}

bool parse_long(const char* v, long lo, long hi, long& out) {
  if (!v) return false;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 0);
  if (errno || end == v || *end || x < lo || x > hi) return false;
  out = x;
  return true;
}

namespace {

/// One numeric flag: its long name, where it goes and its range.
struct IntFlag {
  int letter;
  const char* name;
  long lo, hi;
  int Options::*field;
};

// Ranges: nccl-tests checks none of these beyond strtol; the bounds keep the programs' loops
// and int arithmetic sane.
constexpr IntFlag kIntFlags[] = {
    {'n', "iters", 1, 1 << 30, &Options::iters},
    {'w', "warmup_iters", 0, 1 << 30, &Options::warmup},
    {'c', "check", 0, 1 << 30, &Options::check},
    {'r', "root", 0, 1 << 20, &Options::root},
    {'a', "average", 0, 3, &Options::average},
    {'m', "agg_iters", 1, 1 << 20, &Options::agg_iters},
    {'z', "blocking", 0, 1, &Options::blocking},
    {'G', "cudagraph", 0, 1 << 20, &Options::cudagraph},
};

struct SizeFlag {
  int letter;
  const char* name;
  size_t Options::*field;
};

constexpr SizeFlag kSizeFlags[] = {
    {'b', "minbytes", &Options::min_bytes},
    {'e', "maxbytes", &Options::max_bytes},
    {'i', "stepbytes", &Options::step_bytes},
};

// Long-only options of a program get codes above any character.
constexpr int kFirstExtra = 0x100;

}  // namespace

ParseResult parse_options(int argc, char** argv, Options& out, std::string& error,
                          std::span<const ExtraOption> extra) {
  std::vector<option> longopts = {
      {"nthreads", required_argument, nullptr, 't'},   {"ngpus", required_argument, nullptr, 'g'},
      {"stepfactor", required_argument, nullptr, 'f'}, {"op", required_argument, nullptr, 'o'},
      {"datatype", required_argument, nullptr, 'd'},   {"help", no_argument, nullptr, 'h'}};
  for (const SizeFlag& f : kSizeFlags)
    longopts.push_back({f.name, required_argument, nullptr, f.letter});
  for (const IntFlag& f : kIntFlags)
    longopts.push_back({f.name, required_argument, nullptr, f.letter});
  for (size_t i = 0; i < extra.size(); ++i)
    longopts.push_back({extra[i].name, required_argument, nullptr, kFirstExtra + int(i)});
  longopts.push_back({nullptr, 0, nullptr, 0});

  auto bad = [&](const std::string& msg) {
    error = msg;
    return ParseResult::kError;
  };
  // A fresh scan (tests parse several command lines in one process): glibc resets its state,
  // including the position inside a previous argv's option cluster, only for optind 0.
  optind = 0;
  for (;;) {
    const int c =
        getopt_long(argc, argv, "t:g:b:e:i:f:n:w:c:o:d:r:a:m:z:G:h", longopts.data(), nullptr);
    if (c == -1) break;
    long v = 0;
    switch (c) {
      case 't':
      case 'g':
        if (!parse_long(optarg, 1, 1, v))
          return bad(std::string("invalid value for ") + (c == 't' ? "nthreads" : "ngpus") + ": " +
                     optarg + " (one rank per process: only 1)");
        continue;
      case 'f':
        if (!parse_long(optarg, 1, 1 << 20, v))
          return bad(std::string("invalid value for stepfactor: ") + optarg);
        out.step_factor = static_cast<size_t>(v);
        continue;
      case 'o':
        out.op = optarg;
        continue;
      case 'd':
        out.datatype = optarg;
        continue;
      case 'h':
        return ParseResult::kHelp;
      default:
        break;
    }
    bool known = false;
    for (const SizeFlag& f : kSizeFlags) {
      if (c != f.letter) continue;
      if (!parse_size(optarg, out.*f.field))
        return bad(std::string("invalid size for ") + f.name + ": " + optarg);
      known = true;
    }
    for (const IntFlag& f : kIntFlags) {
      if (c != f.letter) continue;
      if (!parse_long(optarg, f.lo, f.hi, v))
        return bad(std::string("invalid value for ") + f.name + ": " + optarg);
      out.*f.field = static_cast<int>(v);
      known = true;
    }
    if (c >= kFirstExtra && c < kFirstExtra + int(extra.size())) {
      *extra[static_cast<size_t>(c - kFirstExtra)].value = optarg;
      known = true;
    }
    if (!known) return bad("invalid option");  // getopt has printed which
  }
  if (optind < argc) return bad(std::string("unexpected argument: ") + argv[optind]);
  if (out.min_bytes > out.max_bytes)
    return bad("invalid sizes for 'minbytes' and 'maxbytes': " + std::to_string(out.min_bytes) +
               " > " + std::to_string(out.max_bytes));
  if (out.step_factor <= 1 && out.step_bytes == 0) return bad("stepbytes must be positive");
  return ParseResult::kOk;
}

std::string usage(const char* program, const char* datatypes, const char* ops, const char* extra,
                  const char* notes) {
  return std::string("USAGE: ") + program +
         "\n"
         "\t[-b,--minbytes <min size in bytes>]\n"
         "\t[-e,--maxbytes <max size in bytes>]\n"
         "\t[-i,--stepbytes <increment size>]\n"
         "\t[-f,--stepfactor <increment factor>]\n"
         "\t[-n,--iters <iteration count>]\n"
         "\t[-w,--warmup_iters <warmup iteration count>]\n"
         "\t[-c,--check <check iteration count; 0: no check>]\n"
         "\t[-o,--op <" +
         ops + ">]\n\t[-d,--datatype <" + datatypes +
         ">]\n"
         "\t[-r,--root <root>]\n"
         "\t[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>]\n"
         "\t[-t,--nthreads 1] [-g,--ngpus 1] (accepted for compatibility: one rank per process)\n" +
         extra + "\t[-h,--help]\nSizes take K/M/G suffixes. " + notes;
}

std::optional<int> parse_command_line(int argc, char** argv, Options& out, const UsageText& text,
                                      bool print, std::span<const ExtraOption> extra) {
  std::string error;
  switch (parse_options(argc, argv, out, error, extra)) {
    case ParseResult::kOk:
      return std::nullopt;
    case ParseResult::kHelp:
      if (print)
        std::printf("%s",
                    usage(text.program, text.datatypes, text.ops, text.extra, text.notes).c_str());
      return 0;
    case ParseResult::kError:
      if (print)
        std::fprintf(stderr, "%s: %s (see -h)\n", program_invocation_short_name, error.c_str());
      return 2;
  }
  return 2;
}

}  // namespace softrdma::nccl_tests
