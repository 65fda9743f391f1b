// gloo_allreduce: Gloo's ring AllReduce (float, sum) over its TCP transport, measured the way
// nccl-tests' all_reduce_perf measures (and softrdma's build/bin/all_reduce_perf,
// tools/ccl_perf), so that their lines can be compared column for column. A benchmark, not a
// test. Built against Debian's libgloo-dev (gloo 0.5.0, git 2022-05-18).
//
// One process per rank, started by the caller (bench/ccl_bench.sh does it); the ranks meet
// through a gloo::rendezvous::FileStore in a directory they share (use a fresh one per run:
// keys left by an earlier run would be read as this run's):
//
//   d=$(mktemp -d); for r in 0 1; do
//     build/bin/gloo_allreduce --rank $r --nranks 2 --store $d -b 8 -e 64M -f 2 & done; wait
//
// Only rank 0 prints. --rank/--nranks default to $RANK and $WORLD_SIZE; --host (default
// 127.0.0.1) is the address the TCP device binds. Other flags as nccl-tests: -b minbytes
// -e maxbytes (K/M/G suffixes, ×1024) -f stepfactor | -i stepbytes, -n iters (timed, default
// 20), -w warmup_iters (default 5), -c check (0/1, default 1), -d float and -o sum (the only
// type and op), -a average (0 rank 0's time, 1 mean, 2 min, 3 max over ranks; default 1).
//
// The operation is gloo::allreduce() (gloo/allreduce.h) with AllreduceOptions::RING — the
// entry point PyTorch's ProcessGroupGloo uses: a ring reduce-scatter then all-gather in
// segments of at most 1 MiB, two in flight, over gloo::transport::tcp (one TCP connection per
// pair of ranks, an epoll loop thread per device). Out-of-place sets an input and an output
// buffer, in-place the output only. The options (and their buffers) are made once per size
// and reused by every timed call.
//
// Method, as nccl-tests (github.com/NVIDIA/nccl-tests, src/common.cu): buffers for the
// largest size; -w untimed operations at the largest then at the smallest size; then for
// every size, out-of-place then in-place: gloo::barrier, -n back-to-back allreduce calls
// timed together (steady_clock), time = elapsed / n (µs per operation), averaged over ranks
// (-a); then, with -c, fresh inputs, a barrier and one more untimed call whose result is
// checked.
//
// Output columns (as all_reduce_perf): size (B) = count·4, count (elements), type, redop,
// root (-1), then for out-of-place and in-place: time (µs), algbw = size/time and
// busbw = algbw·2(n−1)/n (GB/s, 1 GB = 1e9 B), #wrong = result elements, summed over ranks,
// that differ from the exact sum. busbw is nccl-tests' bus bandwidth (doc/PERFORMANCE.md
// there): an AllReduce of S bytes must move 2(n−1)/n·S bytes in and out of each rank.
//
// Inputs are small integers ((7i + 13r + k) mod 61 for element i of rank r, k a per-run
// counter) so every float sum is exact and checked with ==.
//
// Exit status: 0, 1 when a result was wrong, 2 for bad arguments, 3 when Gloo failed
// (rendezvous or transport error, timeout; the message goes to stderr).
#include <errno.h>
#include <getopt.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "tools/ccl_perf/nccl_tests_format.h"

namespace nccl_tests = softrdma::nccl_tests;

namespace {

constexpr auto kTimeout = std::chrono::seconds(60);
// Tags keep the benchmark's own bookkeeping apart from the measured operations.
constexpr uint32_t kTagBench = 1, kTagStats = 2, kTagBarrier = 3, kTagInfo = 4;

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "gloo_allreduce: %s (see -h)\n", msg.c_str());
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
  int rank = -1, nranks = -1;
  std::string store, host = "127.0.0.1";
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
      {"rank", required_argument, nullptr, 'R'},
      {"nranks", required_argument, nullptr, 'N'},
      {"store", required_argument, nullptr, 's'},
      {"host", required_argument, nullptr, 'H'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  Args a;
  int c;
  while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:c:d:o:a:R:N:s:H:h", kLong, nullptr)) != -1) {
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
      case 'R':
        a.rank = static_cast<int>(parse_int("rank", optarg, 0, 1 << 20));
        break;
      case 'N':
        a.nranks = static_cast<int>(parse_int("nranks", optarg, 1, 1 << 20));
        break;
      case 's':
        a.store = optarg;
        break;
      case 'H':
        a.host = optarg;
        break;
      case 'h':
        std::printf(
            "USAGE: gloo_allreduce --rank R --nranks N --store DIR [--host ADDR] [-b minbytes] "
            "[-e maxbytes]\n  [-f stepfactor | -i stepbytes] [-n iters] [-w warmup_iters] "
            "[-c 0|1] [-d float] [-o sum] [-a 0..3]\n");
        std::exit(0);
      default:
        usage_error("bad arguments");
    }
  }
  if (optind < argc) usage_error(std::string("unexpected argument: ") + argv[optind]);
  if (a.rank < 0) a.rank = static_cast<int>(parse_int("RANK", std::getenv("RANK"), 0, 1 << 20));
  if (a.nranks < 0)
    a.nranks = static_cast<int>(parse_int("WORLD_SIZE", std::getenv("WORLD_SIZE"), 1, 1 << 20));
  if (a.rank >= a.nranks) usage_error("rank must be below nranks");
  if (a.store.empty()) usage_error("--store DIR is required");
  if (a.max_bytes < a.min_bytes) usage_error("maxbytes < minbytes");
  return a;
}

float input(int rank, size_t i, uint64_t k) {
  return static_cast<float>((i * 7 + static_cast<uint64_t>(rank) * 13 + k) % 61);
}

void barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions opts(ctx);
  opts.setTag(kTagBarrier);
  gloo::barrier(opts);
}

template <typename T>
T reduce_scalar(const std::shared_ptr<gloo::Context>& ctx, T v, gloo::AllreduceOptions::Func fn) {
  gloo::AllreduceOptions opts(ctx);
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  opts.setOutput(&v, 1);
  opts.setReduceFunction(fn);
  opts.setTag(kTagStats);
  gloo::allreduce(opts);
  return v;
}

int run(const Args& args) {
  gloo::transport::tcp::attr attr(args.host.c_str());
  attr.ai_family = AF_UNSPEC;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(args.store);
  auto rctx = std::make_shared<gloo::rendezvous::Context>(args.rank, args.nranks);
  rctx->setTimeout(kTimeout);
  rctx->connectFullMesh(store, dev);
  const std::shared_ptr<gloo::Context> ctx = rctx;
  const int rank = args.rank, n = args.nranks;

  constexpr size_t kLine = 256;
  std::vector<char> line(kLine), lines(kLine * static_cast<size_t>(n));
  {
    char host[64] = {};
    gethostname(host, sizeof host - 1);
    std::snprintf(line.data(), kLine, "#  Rank %2d Group %2d Pid %6d on %10s device %s", rank, 0,
                  static_cast<int>(getpid()), host, dev->str().c_str());
    gloo::AllgatherOptions opts(ctx);
    opts.setInput(line.data(), kLine);
    opts.setOutput(lines.data(), lines.size());
    opts.setTag(kTagInfo);
    gloo::allgather(opts);
  }
  if (rank == 0) {
    std::printf(
        "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
        "agg iters: 1 validation: %d graph: 0\n",
        args.min_bytes, args.max_bytes, args.step_factor > 1 ? args.step_factor : args.step_bytes,
        args.step_factor > 1 ? "factor" : "bytes", args.warmup, args.iters, args.check);
    std::printf("#\n# AllReduce: gloo::allreduce (RING) over gloo::transport::tcp, %d ranks\n#\n",
                n);
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
  // One set of options per (count, placement), reused for every call at that size.
  auto make_options = [&](size_t count, bool in_place) {
    auto opts = std::make_unique<gloo::AllreduceOptions>(ctx);
    opts->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    if (!in_place) opts->setInput(send.data(), count);
    opts->setOutput(recv.data(), count);
    opts->setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts->setTag(kTagBench);
    return opts;
  };
  uint64_t k = 0;
  auto init = [&](size_t count, bool in_place) {
    float* in = in_place ? recv.data() : send.data();
    for (size_t i = 0; i < count; ++i) in[i] = input(rank, i, k);
    if (!in_place) std::fill(recv.begin(), recv.begin() + static_cast<ptrdiff_t>(count), -1.0f);
  };

  // Warm-up at the largest and the smallest size, as nccl-tests.
  for (size_t bytes : {args.max_bytes, args.min_bytes}) {
    auto opts = make_options(bytes / sizeof(float), false);
    for (int i = 0; i < args.warmup; ++i) gloo::allreduce(*opts);
  }

  int errors = 0;
  double bw_sum = 0;
  int bw_count = 0;
  for (size_t size = args.min_bytes; size <= args.max_bytes;) {
    const size_t count = size / sizeof(float);
    if (rank == 0)
      std::printf("%12zu  %12zu  %8s  %6s  %6i", count * sizeof(float), count, "float", "sum", -1);
    for (bool in_place : {false, true}) {
      ++k;
      auto opts = make_options(count, in_place);
      if (args.check) init(count, in_place);
      barrier(ctx);
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < args.iters; ++i) gloo::allreduce(*opts);
      double sec =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / args.iters;
      if (args.average == 0) {
        gloo::BroadcastOptions b(ctx);
        b.setOutput(&sec, 1);
        b.setRoot(0);
        b.setTag(kTagStats);
        gloo::broadcast(b);
      } else {
        using F = void (*)(void*, const void*, const void*, size_t);
        const F fn = args.average == 2   ? static_cast<F>(&gloo::min<double>)
                     : args.average == 3 ? static_cast<F>(&gloo::max<double>)
                                         : static_cast<F>(&gloo::sum<double>);
        sec = reduce_scalar<double>(ctx, sec, fn);
        if (args.average == 1) sec /= n;
      }
      const double algbw = static_cast<double>(count * sizeof(float)) / sec / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      int64_t wrong = 0;
      if (args.check) {
        init(count, in_place);
        barrier(ctx);
        gloo::allreduce(*opts);
        for (size_t i = 0; i < count; ++i) {
          float expect = 0;
          for (int r = 0; r < n; ++r) expect += input(r, i, k);
          if (recv[i] != expect) ++wrong;
        }
        wrong = reduce_scalar<int64_t>(
            ctx, wrong,
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<int64_t>));
        if (wrong) ++errors;
      }
      if (rank == 0) {
        char wrong_text[32];
        if (args.check)
          std::snprintf(wrong_text, sizeof wrong_text, "%5lld", static_cast<long long>(wrong));
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
  barrier(ctx);
  if (rank == 0) {
    std::printf("# Out of bounds values : %d %s\n", errors, errors ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n", bw_count ? bw_sum / bw_count : 0.0);
    std::printf("#\n");
  }
  return errors ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  setlinebuf(stdout);
  const Args args = parse_args(argc, argv);
  try {
    return run(args);
  } catch (const std::exception& e) {
    if (args.rank == 0) std::printf("\n");  // end a half-printed result line
    std::fprintf(stderr, "gloo_allreduce: rank %d: error: %s\n", args.rank, e.what());
    return 3;
  }
}
