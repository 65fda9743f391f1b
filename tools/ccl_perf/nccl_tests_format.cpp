#include "tools/ccl_perf/nccl_tests_format.h"

#include <unistd.h>

#include <cstdio>

namespace softrdma::nccl_tests {

std::string time_text(double us) {
  char b[32];
  if (us >= 10000.0)
    std::snprintf(b, sizeof b, "%7.0f", us);
  else if (us >= 100.0)
    std::snprintf(b, sizeof b, "%7.1f", us);
  else
    std::snprintf(b, sizeof b, "%7.2f", us);
  return b;
}

void print_trimmed_line(const std::string& s) {
  size_t n = s.size();
  while (n > 0 && s[n - 1] == ' ') --n;
  std::printf("%.*s\n", static_cast<int>(n), s.c_str());
}

void print_parameters_line(const Options& o) {
  std::printf(
      "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d\n",
      o.min_bytes, o.max_bytes, o.step_factor > 1 ? o.step_factor : o.step_bytes,
      o.step_factor > 1 ? "factor" : "bytes", o.warmup, o.iters, o.agg_iters, o.check, o.cudagraph);
}

std::string rank_line(int rank, const std::string& device) {
  char host[64] = {};
  gethostname(host, sizeof host - 1);
  char line[256];
  std::snprintf(line, sizeof line, "#  Rank %2d Group %2d Pid %6d on %10s%s%s", rank, 0,
                static_cast<int>(getpid()), host, device.empty() ? "" : " device ", device.c_str());
  return line;
}

void print_column_headers() {
  char b[512];
  std::snprintf(b, sizeof b,
                "# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
                "in-place          ",
                "", "", "", "", "");
  print_trimmed_line(b);
  std::snprintf(b, sizeof b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s",
                "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                "time", "algbw", "busbw", "#wrong");
  print_trimmed_line(b);
  std::snprintf(b, sizeof b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s",
                "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                "(GB/s)", "");
  print_trimmed_line(b);
}

void print_row_start(size_t bytes, size_t count, const char* type, const char* redop, int root) {
  std::printf("%12zu  %12zu  %8s  %6s  %6i", bytes, count, type, redop, root);
}

void print_placement(double seconds, double algbw, double busbw, bool checked, int64_t wrong) {
  char wrong_text[32];
  if (checked)
    std::snprintf(wrong_text, sizeof wrong_text, "%5lld", static_cast<long long>(wrong));
  else
    std::snprintf(wrong_text, sizeof wrong_text, "%5s", "N/A");
  std::printf("  %7s  %6.2f  %6.2f  %s", time_text(seconds * 1e6).c_str(), algbw, busbw,
              wrong_text);
}

void print_summary(int errors, double busbw_sum, int busbw_count) {
  std::printf("# Out of bounds values : %d %s\n", errors, errors ? "FAILED" : "OK");
  std::printf("# Avg bus bandwidth    : %g \n", busbw_count ? busbw_sum / busbw_count : 0.0);
  std::printf("#\n");
}

bool next_size(const Options& o, size_t& size) {
  const size_t next = o.step_factor > 1 ? size * o.step_factor : size + o.step_bytes;
  if (next <= size || next > o.max_bytes) return false;
  size = next;
  return true;
}

}  // namespace softrdma::nccl_tests
