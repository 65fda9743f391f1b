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
// 20), -w warmup_iters (default 5), -c check (0: none; default 1), -d float and -o sum (the only
// type and op), -a average (0 rank 0's time, 1 mean, 2 min, 3 max over ranks; default 1).
//
// The operation is gloo::allreduce() (gloo/allreduce.h) with AllreduceOptions::RING — the
// entry point PyTorch's ProcessGroupGloo uses: a ring reduce-scatter then all-gather in
// segments of at most 1 MiB, two in flight, over gloo::transport::tcp (one TCP connection per
// pair of ranks, an epoll loop thread per device). Out-of-place sets an input and an output
// buffer, in-place the output only. The options (and their buffers) are made once per size
// and reused by every timed call.
//
// Method, output columns and inputs: bench/coll_sweep.h (shared with bench/mpi_coll.cpp);
// barriers are gloo::barrier, times combine over ranks with gloo::allreduce/broadcast.
//
// Exit status: 0, 1 when a result was wrong, 2 for bad arguments, 3 when Gloo failed
// (rendezvous or transport error, timeout; the message goes to stderr).
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "bench/coll_sweep.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"
#include "tools/ccl_perf/nccl_tests_args.h"
#include "tools/ccl_perf/nccl_tests_format.h"

namespace nccl_tests = softrdma::nccl_tests;

namespace {

constexpr auto kTimeout = std::chrono::seconds(60);
// Tags keep the benchmark's own bookkeeping apart from the measured operations.
constexpr uint32_t kTagBench = 1, kTagStats = 2, kTagBarrier = 3, kTagInfo = 4;

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "gloo_allreduce: %s (see -h)\n", msg.c_str());
  std::exit(2);
}

struct Args {
  nccl_tests::Options o;
  int rank = -1, nranks = -1;
  std::string store, host = "127.0.0.1";
};

Args parse_args(int argc, char** argv) {
  Args a;
  std::string rank, nranks;
  const nccl_tests::ExtraOption extra[] = {
      {"rank", &rank}, {"nranks", &nranks}, {"store", &a.store}, {"host", &a.host}};
  const nccl_tests::UsageText text{
      .program = "gloo_allreduce",
      .datatypes = "float",
      .ops = "sum",
      .extra =
          "\t[--rank R (default $RANK)] [--nranks N (default $WORLD_SIZE)]\n"
          "\t[--store DIR] [--host ADDR (default 127.0.0.1)]\n",
      .notes = "\n"};
  if (const auto status = nccl_tests::parse_command_line(argc, argv, a.o, text, true, extra))
    std::exit(*status);
  if (a.o.datatype != "float") usage_error("only -d float is supported");
  if (a.o.op != "sum") usage_error("only -o sum is supported");
  if (a.o.agg_iters != 1) usage_error("only -m 1 is supported (no aggregation in this reference)");
  // --rank / --nranks, else $RANK / $WORLD_SIZE.
  auto rank_number = [](const char* name, const std::string& flag, const char* env, long lo) {
    const char* v = flag.empty() ? std::getenv(env) : flag.c_str();
    long out = 0;
    if (!nccl_tests::parse_long(v, lo, 1 << 20, out))
      usage_error(std::string("invalid value for ") + (flag.empty() ? env : name) + ": " +
                  (v ? v : "(unset)"));
    return static_cast<int>(out);
  };
  a.rank = rank_number("rank", rank, "RANK", 0);
  a.nranks = rank_number("nranks", nranks, "WORLD_SIZE", 1);
  if (a.rank >= a.nranks) usage_error("rank must be below nranks");
  if (a.store.empty()) usage_error("--store DIR is required");
  return a;
}

void barrier(const std::shared_ptr<gloo::Context>& ctx) {
  gloo::BarrierOptions opts(ctx);
  opts.setTag(kTagBarrier);
  gloo::barrier(opts);
}

template <typename T>
T reduce_scalar(const std::shared_ptr<gloo::Context>& ctx, T v, ReduceFn fn) {
  gloo::AllreduceOptions opts(ctx);
  opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  opts.setOutput(&v, 1);
  opts.setReduceFunction(fn);
  opts.setTag(kTagStats);
  gloo::allreduce(opts);
  return v;
}

/// gloo::allreduce with AllreduceOptions::RING; one set of options per (count, placement),
/// reused by every call at that size.
class GlooAllReduce final : public softrdma::bench::FloatCollective {
 public:
  explicit GlooAllReduce(std::shared_ptr<gloo::Context> ctx) : ctx_(std::move(ctx)) {}

  void prepare(size_t count, bool in_place) override {
    opts_ = std::make_unique<gloo::AllreduceOptions>(ctx_);
    opts_->setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    if (!in_place) opts_->setInput(send.data(), count);
    opts_->setOutput(recv.data(), count);
    opts_->setReduceFunction(static_cast<ReduceFn>(&gloo::sum<float>));
    opts_->setTag(kTagBench);
  }
  void run() override { gloo::allreduce(*opts_); }
  void barrier() override { ::barrier(ctx_); }
  double combine_time(double sec, int average) override {
    if (average == 0) {
      gloo::BroadcastOptions b(ctx_);
      b.setOutput(&sec, 1);
      b.setRoot(0);
      b.setTag(kTagStats);
      gloo::broadcast(b);
      return sec;
    }
    const ReduceFn fn = average == 2   ? static_cast<ReduceFn>(&gloo::min<double>)
                        : average == 3 ? static_cast<ReduceFn>(&gloo::max<double>)
                                       : static_cast<ReduceFn>(&gloo::sum<double>);
    sec = reduce_scalar<double>(ctx_, sec, fn);
    return average == 1 ? sec / ctx_->size : sec;
  }
  int64_t sum_over_ranks(int64_t v) override {
    return reduce_scalar<int64_t>(ctx_, v, static_cast<ReduceFn>(&gloo::sum<int64_t>));
  }

 private:
  std::shared_ptr<gloo::Context> ctx_;
  std::unique_ptr<gloo::AllreduceOptions> opts_;
};

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
    const std::string text = nccl_tests::rank_line(rank, dev->str());
    std::snprintf(line.data(), kLine, "%s", text.c_str());
    gloo::AllgatherOptions opts(ctx);
    opts.setInput(line.data(), kLine);
    opts.setOutput(lines.data(), lines.size());
    opts.setTag(kTagInfo);
    gloo::allgather(opts);
  }
  if (rank == 0) {
    nccl_tests::print_parameters_line(args.o);
    std::printf("#\n# AllReduce: gloo::allreduce (RING) over gloo::transport::tcp, %d ranks\n#\n",
                n);
    for (int r = 0; r < n; ++r) std::printf("%s\n", &lines[static_cast<size_t>(r) * kLine]);
    std::printf("#\n");
    nccl_tests::print_column_headers();
  }
  GlooAllReduce lib(ctx);
  using softrdma::bench::Coll;
  return softrdma::bench::run_sweep(Coll::kAllReduce, lib, args.o, rank, n) ? 1 : 0;
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
