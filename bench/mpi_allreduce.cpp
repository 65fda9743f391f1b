// mpi_allreduce: Open MPI's MPI_Allreduce (float, sum) measured the way nccl-tests'
// all_reduce_perf measures (and softrdma's build/bin/all_reduce_perf, tools/ccl_perf), so
// that their lines can be compared column for column. A benchmark, not a test.
//
//   mpirun -np 2 --mca pml ob1 --mca btl tcp,self   build/bin/mpi_allreduce -b 8 -e 64M -f 2
//   mpirun -np 2 --mca pml ob1 --mca btl vader,self ...        (shared memory)
//
// (`--mca pml ob1` matters: Debian's Open MPI also has the UCX PML, which ignores the btl
// list; bench/ccl_bench.sh passes both.)
//
// Flags (nccl-tests' names): -b minbytes -e maxbytes (K/M/G suffixes, ×1024) -f stepfactor
// | -i stepbytes, -n iters (timed, default 20), -w warmup_iters (default 5), -c check (0/1,
// default 1), -d float and -o sum (the only type and op), -a average (0 rank 0's time,
// 1 mean, 2 min, 3 max over ranks; default 1).
//
// Method, as nccl-tests (github.com/NVIDIA/nccl-tests, src/common.cu): buffers for the
// largest size; -w untimed operations at the largest then at the smallest size; then for
// every size, out-of-place (separate send and receive buffers) then in-place
// (MPI_IN_PLACE): MPI_Barrier, -n back-to-back MPI_Allreduce calls timed together with
// MPI_Wtime, time = elapsed / n (µs per operation), averaged over ranks (-a); then, with -c,
// fresh inputs, MPI_Barrier, one more MPI_Allreduce, untimed, whose result is checked.
//
// Output columns (as all_reduce_perf): size (B) = count·4, count (elements), type, redop,
// root (-1), then for out-of-place and in-place: time (µs), algbw = size/time and
// busbw = algbw·2(n−1)/n (GB/s, 1 GB = 1e9 B), #wrong = result elements, summed over ranks,
// that differ from the exact sum. busbw is nccl-tests' bus bandwidth (doc/PERFORMANCE.md
// there): an AllReduce of S bytes must move 2(n−1)/n·S bytes in and out of each rank, so
// busbw is comparable across rank counts and with the link speed.
//
// Inputs are small integers ((7i + 13r + k) mod 61 for element i of rank r, k a per-run
// counter) so every float sum is exact and checked with ==.
//
// Exit status: 0, 1 when a result was wrong, 2 for bad arguments.
#include <errno.h>
#include <getopt.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tools/ccl_perf/nccl_tests_format.h"

namespace nccl_tests = softrdma::nccl_tests;

namespace {

int g_rank = 0;

[[noreturn]] void usage_error(const std::string& msg) {
  if (g_rank == 0) std::fprintf(stderr, "mpi_allreduce: %s\n", msg.c_str());
  MPI_Finalize();
  std::exit(2);
}

// Flag values, parsed as nccl-tests parses them (nccl_tests_format.h).
size_t parse_size(const char* name, const char* v) {
  size_t out = 0;
  if (!nccl_tests::parse_size(v, out))
    usage_error(std::string("invalid size for ") + name + ": " + (v ? v : "(unset)"));
  return out;
}

long parse_int(const char* name, const char* v, long lo, long hi) {
  long out = 0;
  if (!nccl_tests::parse_long(v, lo, hi, out))
    usage_error(std::string("invalid value for ") + name + ": " + (v ? v : "(unset)"));
  return out;
}

struct Args {
  size_t min_bytes = 32 << 20, max_bytes = 32 << 20, step_bytes = 1 << 20, step_factor = 1;
  int iters = 20, warmup = 5, check = 1, average = 1;
};

Args parse_args(int argc, char** argv) {
  static const option kLong[] = {
      {"minbytes", required_argument, nullptr, 'b'},
      {"maxbytes", required_argument, nullptr, 'e'},
      {"stepbytes", required_argument, nullptr, 'i'},
      {"stepfactor", required_argument, nullptr, 'f'},
      {"iters", required_argument, nullptr, 'n'},
      {"warmup_iters", required_argument, nullptr, 'w'},
      {"check", required_argument, nullptr, 'c'},
      {"datatype", required_argument, nullptr, 'd'},
      {"op", required_argument, nullptr, 'o'},
      {"average", required_argument, nullptr, 'a'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  Args a;
  int c;
  while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:c:d:o:a:h", kLong, nullptr)) != -1) {
    switch (c) {
      case 'b':
        a.min_bytes = parse_size("minbytes", optarg);
        break;
      case 'e':
        a.max_bytes = parse_size("maxbytes", optarg);
        break;
      case 'i':
        a.step_bytes = parse_size("stepbytes", optarg);
        break;
      case 'f':
        a.step_factor = static_cast<size_t>(parse_int("stepfactor", optarg, 1, 1 << 20));
        break;
      case 'n':
        a.iters = static_cast<int>(parse_int("iters", optarg, 1, 1 << 30));
        break;
      case 'w':
        a.warmup = static_cast<int>(parse_int("warmup_iters", optarg, 0, 1 << 30));
        break;
      case 'c':
        a.check = static_cast<int>(parse_int("check", optarg, 0, 1));
        break;
      case 'd':
        if (std::strcmp(optarg, "float") != 0) usage_error("only -d float is supported");
        break;
      case 'o':
        if (std::strcmp(optarg, "sum") != 0) usage_error("only -o sum is supported");
        break;
      case 'a':
        a.average = static_cast<int>(parse_int("average", optarg, 0, 3));
        break;
      case 'h':
        if (g_rank == 0)
          std::printf(
              "USAGE: mpirun -np N mpi_allreduce [-b minbytes] [-e maxbytes] [-f stepfactor | "
              "-i stepbytes]\n  [-n iters] [-w warmup_iters] [-c 0|1] [-d float] [-o sum] "
              "[-a 0..3]\n");
        MPI_Finalize();
        std::exit(0);
      default:
        usage_error("bad arguments (see -h)");
    }
  }
  if (optind < argc) usage_error(std::string("unexpected argument: ") + argv[optind]);
  if (a.max_bytes < a.min_bytes) usage_error("maxbytes < minbytes");
  if (a.max_bytes / sizeof(float) > static_cast<size_t>(INT_MAX))
    usage_error("maxbytes too large for an int count");
  return a;
}

float input(int rank, size_t i, uint64_t k) {
  return static_cast<float>((i * 7 + static_cast<uint64_t>(rank) * 13 + k) % 61);
}

}  // namespace

int main(int argc, char** argv) {
  setlinebuf(stdout);
  MPI_Init(&argc, &argv);
  int n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int rank = g_rank;
  const Args args = parse_args(argc, argv);

  constexpr int kLine = 256;
  char line[kLine] = {};
  {
    char host[64] = {};
    gethostname(host, sizeof host - 1);
    std::snprintf(line, kLine, "#  Rank %2d Group %2d Pid %6d on %10s", rank, 0,
                  static_cast<int>(getpid()), host);
  }
  std::vector<char> lines(static_cast<size_t>(kLine) * n);
  MPI_Gather(line, kLine, MPI_CHAR, lines.data(), kLine, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(version, &len);
    std::string v(version, static_cast<size_t>(len));
    v = v.substr(0, v.find_first_of(",\n"));
    const char* btl = std::getenv("OMPI_MCA_btl");
    const char* pml = std::getenv("OMPI_MCA_pml");
    std::printf(
        "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
        "agg iters: 1 validation: %d graph: 0\n",
        args.min_bytes, args.max_bytes, args.step_factor > 1 ? args.step_factor : args.step_bytes,
        args.step_factor > 1 ? "factor" : "bytes", args.warmup, args.iters, args.check);
    std::printf("#\n# AllReduce: MPI_Allreduce of %s, pml %s, btl %s, %d ranks\n#\n", v.c_str(),
                pml ? pml : "(default)", btl ? btl : "(default)", n);
    for (int r = 0; r < n; ++r) std::printf("%s\n", &lines[static_cast<size_t>(r) * kLine]);
    std::printf("#\n");
    char b[512];
    std::snprintf(b, sizeof b,
                  "# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
                  "in-place          ",
                  "", "", "", "", "");
    nccl_tests::print_trimmed_line(b);
    std::snprintf(b, sizeof b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s",
                  "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                  "time", "algbw", "busbw", "#wrong");
    nccl_tests::print_trimmed_line(b);
    std::snprintf(
        b, sizeof b, "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s", "(B)",
        "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    nccl_tests::print_trimmed_line(b);
  }

  const size_t max_count = std::max<size_t>(args.max_bytes / sizeof(float), 1);
  std::vector<float> send(max_count), recv(max_count);
  auto allreduce = [&](size_t count, bool in_place) {
    MPI_Allreduce(in_place ? MPI_IN_PLACE : send.data(), recv.data(), static_cast<int>(count),
                  MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  uint64_t k = 0;
  auto init = [&](size_t count, bool in_place) {
    float* in = in_place ? recv.data() : send.data();
    for (size_t i = 0; i < count; ++i) in[i] = input(rank, i, k);
    if (!in_place) std::fill(recv.begin(), recv.begin() + static_cast<ptrdiff_t>(count), -1.0f);
  };

  // Warm-up at the largest and the smallest size, as nccl-tests.
  for (size_t bytes : {args.max_bytes, args.min_bytes})
    for (int i = 0; i < args.warmup; ++i) allreduce(bytes / sizeof(float), false);

  int errors = 0;
  double bw_sum = 0;
  int bw_count = 0;
  for (size_t size = args.min_bytes; size <= args.max_bytes;) {
    const size_t count = size / sizeof(float);
    if (rank == 0)
      std::printf("%12zu  %12zu  %8s  %6s  %6i", count * sizeof(float), count, "float", "sum", -1);
    for (bool in_place : {false, true}) {
      ++k;
      if (args.check) init(count, in_place);
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      for (int i = 0; i < args.iters; ++i) allreduce(count, in_place);
      double sec = (MPI_Wtime() - t0) / args.iters;
      if (args.average == 0) {
        MPI_Bcast(&sec, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      } else {
        const MPI_Op op = args.average == 2 ? MPI_MIN : args.average == 3 ? MPI_MAX : MPI_SUM;
        MPI_Allreduce(MPI_IN_PLACE, &sec, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
        if (args.average == 1) sec /= n;
      }
      const double algbw = static_cast<double>(count * sizeof(float)) / sec / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      long long wrong = 0;
      if (args.check) {
        init(count, in_place);
        MPI_Barrier(MPI_COMM_WORLD);
        allreduce(count, in_place);
        for (size_t i = 0; i < count; ++i) {
          float expect = 0;
          for (int r = 0; r < n; ++r) expect += input(r, i, k);
          if (recv[i] != expect) ++wrong;
        }
        MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (wrong) ++errors;
      }
      if (rank == 0) {
        char wrong_text[32];
        if (args.check)
          std::snprintf(wrong_text, sizeof wrong_text, "%5lld", wrong);
        else
          std::snprintf(wrong_text, sizeof wrong_text, "%5s", "N/A");
        std::printf("  %7s  %6.2f  %6.2f  %s", nccl_tests::time_text(sec * 1e6).c_str(), algbw,
                    busbw, wrong_text);
      }
      bw_sum += busbw;
      ++bw_count;
    }
    if (rank == 0) std::printf("\n");
    const size_t next = args.step_factor > 1 ? size * args.step_factor : size + args.step_bytes;
    if (next <= size) break;  // -b 0 with a factor, or overflow
    size = next;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::printf("# Out of bounds values : %d %s\n", errors, errors ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n", bw_count ? bw_sum / bw_count : 0.0);
    std::printf("#\n");
  }
  MPI_Finalize();
  return errors ? 1 : 0;
}
