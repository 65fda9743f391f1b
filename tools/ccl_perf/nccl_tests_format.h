// Argument parsing and number formatting shared by the nccl-tests–style programs: the
// tools/ccl_perf/*_perf tools and the reference benchmarks bench/mpi_allreduce and
// bench/gloo_allreduce, so all of them read the same flags and print the same columns
// (nccl-tests, src/common.cu: parsesize, the "%7.2f"-style time column).
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace softrdma::nccl_tests {

/// nccl-tests' parsesize: a non-negative number with an optional K, M or G suffix (×1024,
/// either case). Returns false for anything else.
inline bool parse_size(const char* v, size_t& out) {
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

/// An integer in [lo, hi] (strtol with base 0, as nccl-tests). Returns false for anything
/// else.
inline bool parse_long(const char* v, long lo, long hi, long& out) {
  if (!v) return false;
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 0);
  if (errno || end == v || *end || x < lo || x > hi) return false;
  out = x;
  return true;
}

/// The time column, µs: "%7.0f" from 10 ms, "%7.1f" from 100 µs, else "%7.2f".
inline std::string time_text(double us) {
  char b[32];
  if (us >= 10000.0)
    std::snprintf(b, sizeof b, "%7.0f", us);
  else if (us >= 100.0)
    std::snprintf(b, sizeof b, "%7.1f", us);
  else
    std::snprintf(b, sizeof b, "%7.2f", us);
  return b;
}

/// Prints `s` without its trailing spaces, then a newline.
inline void print_trimmed_line(const std::string& s) {
  size_t n = s.size();
  while (n > 0 && s[n - 1] == ' ') --n;
  std::printf("%.*s\n", static_cast<int>(n), s.c_str());
}

}  // namespace softrdma::nccl_tests
