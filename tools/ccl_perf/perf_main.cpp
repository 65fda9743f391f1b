// nccl-tests–style benchmarks of softrdma's collectives: one source compiled once per
// collective (CCL_PERF_OP selects it) into all_reduce_perf, all_gather_perf,
// reduce_scatter_perf, broadcast_perf, reduce_perf, alltoall_perf and sendrecv_perf.
//
// One process per rank, launched by `mpirun -np N`, srun, or with the torchrun variables
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); without any of them a single rank runs.
// The ranks find each other through ccl::init_from_environment() (ccl/bootstrap.h).
//
// Flags and output follow nccl-tests (github.com/NVIDIA/nccl-tests, src/common.cu), parsed
// and printed by the library the baselines in bench/ share (nccl_tests_args.h,
// nccl_tests_format.h). What differs per collective is one row of kCollectives below.
// For every size it prints the out-of-place then the in-place time (µs per operation),
// algbw = S/t and busbw = algbw × factor (GB/s = 1e9 B/s), and #wrong, the number of result
// elements (summed over ranks) that differ from the expected values. S and factor:
//   AllReduce          S = count·size            factor 2(n−1)/n
//   AllGather, ReduceScatter, AllToAll  S = count·size·n (count per rank)  factor (n−1)/n
//   Broadcast, Reduce, SendRecv          S = count·size            factor 1
// Input element i of rank r is a small integer (so sums are exact in every type, half and
// bfloat16 included); avg results are compared with a tolerance of the type's precision.
// SendRecv sends to rank+1 and receives from rank−1 concurrently: one communicator group
// {send to next, recv from prev}, as nccl-tests' sendrecv; its in-place run (same buffer)
// is timed but not checked (N/A), as in nccl-tests.
//
// -m n (agg_iters) issues n operations in one group per timed iteration and reports the
// time per operation (nccl-tests' common.cu); the group runs them one after the other
// (ccl.h), so on CPU buffers it measures the call overhead saved, not overlap. -z is
// accepted (collectives on CPU buffers always block); -G is accepted and ignored with a
// note on stderr (no CUDA graphs).
//
// Exit status: 0 success, 1 wrong results, 2 bad arguments, 3 runtime failure (a peer died,
// bootstrap failed); errors go to stderr, prefixed with the rank.
#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "base/clock.h"
#include "ccl/bootstrap.h"
#include "ccl/ccl.h"
#include "ccl/reduce.h"
#include "ccl/verbs_transport.h"
#include "tools/ccl_perf/nccl_tests_args.h"
#include "tools/ccl_perf/nccl_tests_format.h"

#define CCL_PERF_ALL_REDUCE 1
#define CCL_PERF_ALL_GATHER 2
#define CCL_PERF_REDUCE_SCATTER 3
#define CCL_PERF_BROADCAST 4
#define CCL_PERF_REDUCE 5
#define CCL_PERF_ALLTOALL 6
#define CCL_PERF_SENDRECV 7
#ifndef CCL_PERF_OP
#error "compile with -DCCL_PERF_OP=CCL_PERF_<COLLECTIVE>"
#endif

namespace nccl_tests = softrdma::nccl_tests;

namespace {

using namespace softrdma::ccl;
using Clock = softrdma::clock::Steady;  // virtual under time dilation (base/clock.h)

// Rank 0 is in the middle of a result line (an error message then starts on a new line).
bool g_mid_line = false;

constexpr int kOp = CCL_PERF_OP;

// ---- arguments ----------------------------------------------------------------------------

struct Args {
  nccl_tests::Options o;
  std::vector<DataType> types;
  std::vector<RedOp> ops;
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "%s: %s (see -h)\n", program_invocation_short_name, msg.c_str());
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  const nccl_tests::UsageText text{
      .program = program_invocation_short_name,
      .datatypes = "int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16/all",
      .ops = "sum/prod/min/max/avg/all",
      .extra =
          "\t[-m,--agg_iters <n> operations in one group per timed iteration]\n"
          "\t[-z,--blocking <0/1>] (accepted: collectives on CPU buffers always block)\n"
          "\t[-G,--cudagraph <n>] (accepted and ignored: no CUDA graphs on CPU buffers)\n",
      .notes =
          "Launch with mpirun -np N, srun, or the torchrun variables\n"
          "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; see docs/collectives.md.\n"};
  if (const auto status = nccl_tests::parse_command_line(argc, argv, a.o, text)) std::exit(*status);
  if (a.o.op == "all") {
    a.ops = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
  } else {
    RedOp op;
    if (!parse_op(a.o.op, op)) usage_error("unknown op: " + a.o.op);
    a.ops.push_back(op);
  }
  if (a.o.datatype == "all") {
    a.types = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
               DataType::kInt64,   DataType::kUint64,  DataType::kFloat16, DataType::kFloat32,
               DataType::kFloat64, DataType::kBfloat16};
  } else {
    DataType t;
    if (!parse_type(a.o.datatype, t)) usage_error("unknown datatype: " + a.o.datatype);
    a.types.push_back(t);
  }
  return a;
}

// ---- element values -----------------------------------------------------------------------

bool is_float(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBfloat16 || t == DataType::kFloat32 ||
         t == DataType::kFloat64;
}

// Input data: element gi (global index) of rank r, for one (type, op, nranks, seed). Small
// non-negative integers whose n-rank sum (or product) is exact in the type.
struct Values {
  DataType type;
  RedOp op;
  int n;
  uint64_t seed;
  uint64_t modulus;

  Values(DataType t, RedOp o, int nranks, uint64_t s) : type(t), op(o), n(nranks), seed(s) {
    double limit = 1000;  // exact sum limit of the type
    switch (t) {
      case DataType::kInt8:
        limit = 127;
        break;
      case DataType::kUint8:
        limit = 255;
        break;
      case DataType::kBfloat16:
        limit = 256;
        break;
      case DataType::kFloat16:
        limit = 2048;
        break;
      default:
        break;
    }
    modulus = static_cast<uint64_t>(std::clamp(limit / n, 1.0, 64.0));
  }
  double input(int r, uint64_t gi) const {
    if (op == RedOp::kProd)  // 1 or 2; at most one rank contributes a 2 per element
      return (gi * 3 + static_cast<uint64_t>(r) + seed) % static_cast<uint64_t>(n + 1) == 0 ? 2 : 1;
    return static_cast<double>((gi * 7 + static_cast<uint64_t>(r) * 13 + seed) % modulus);
  }
  double reduced(uint64_t gi) const {
    double acc = input(0, gi);
    for (int r = 1; r < n; ++r) {
      const double v = input(r, gi);
      switch (op) {
        case RedOp::kSum:
        case RedOp::kAvg:
          acc += v;
          break;
        case RedOp::kProd:
          acc *= v;
          break;
        case RedOp::kMax:
          acc = std::max(acc, v);
          break;
        case RedOp::kMin:
          acc = std::min(acc, v);
          break;
      }
    }
    if (op == RedOp::kAvg) acc = is_float(type) ? acc / n : std::trunc(acc / n);
    return acc;
  }
  bool matches(double got, double want) const {
    if (!is_float(type)) return got == want;
    double tol = 1e-12;
    if (type == DataType::kFloat16) tol = 1e-3;
    if (type == DataType::kBfloat16) tol = 1e-2;
    if (type == DataType::kFloat32) tol = 1e-5;
    return std::fabs(got - want) <= tol * std::max(1.0, std::fabs(want));
  }
};

// ---- the collectives, as data ---------------------------------------------------------------

// Element counts of one test size, as nccl-tests' *GetCollByteCount.
struct Counts {
  size_t param;  // the count argument of the call
  size_t send;   // elements in the send buffer
  size_t recv;   // elements in the recv buffer
};

class Bench;

/// One collective as nccl-tests measures it: how a size becomes counts, how busbw follows
/// from algbw, how to call it and which result to expect. One row per program.
struct Collective {
  const char* name;
  bool reduces;  ///< takes -o (else redop "none")
  bool rooted;   ///< takes -r (else root -1)
  /// The count is per rank and S = count·size·n (AllGather, ReduceScatter, AllToAll).
  bool per_rank;
  /// In place, the send data is this rank's slot of the receive buffer (AllGather).
  bool in_place_send_at_rank_slot;
  /// In place, the result goes to this rank's slot of the buffer (ReduceScatter).
  bool in_place_recv_at_rank_slot;
  /// The in-place run is checked (SendRecv's in-place run sends and receives one buffer).
  bool checks_in_place;
  double (*bus_factor)(double n);
  Counts (*counts)(size_t count, size_t n);
  void (*run)(Bench& b, char* sp, char* rp, size_t count, DataType t, RedOp op, int root,
              bool in_place);
  /// Result elements to check on `rank`.
  size_t (*result_count)(const Counts& c, int rank, int root);
  /// Expected value of result element i (p: the count argument).
  double (*expected)(const Values& v, size_t i, size_t p, int rank, int root, int n);
};

// Buffers and calls of one collective over one communicator.
class Bench {
 public:
  // `bytes`: the larger of the send and recv sizes of the largest test (in-place runs use
  // the recv buffer for both).
  Bench(Communicator& comm, size_t bytes);

  Communicator& comm() { return comm_; }
  void run_once(const Counts& c, DataType t, RedOp op, int root, bool in_place);
  // Fills this rank's inputs (for the next run) and clears the output.
  void init_data(const Counts& c, DataType t, const Values& v, bool in_place);
  // Wrong elements of this rank's result.
  int64_t check(const Counts& c, DataType t, const Values& v, int root, bool in_place) const;
  // rank → rank+1 while rank−1 → rank, both in flight at once (one group).
  void send_recv(size_t count, DataType t, bool in_place);

 private:
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  using Mem = std::unique_ptr<char, Free>;

  static Mem alloc(size_t bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, 4096, std::max<size_t>(bytes, 64)) != 0) throw std::bad_alloc();
    std::memset(p, 0, std::max<size_t>(bytes, 64));
    return Mem(static_cast<char*>(p));
  }

  // The buffers an in-place or out-of-place call uses.
  void pointers(const Counts& c, DataType t, bool in_place, char*& sp, char*& rp) const;

  Communicator& comm_;
  int rank_, n_;
  Mem send_, recv_;
};

double factor_one(double) {
  return 1;
}
double factor_all_reduce(double n) {
  return 2 * (n - 1) / n;
}
double factor_per_rank(double n) {
  return (n - 1) / n;
}
Counts counts_whole(size_t c, size_t) {
  return {c, c, c};
}
size_t result_param(const Counts& c, int, int) {
  return c.param;
}
size_t result_recv(const Counts& c, int, int) {
  return c.recv;
}

// Indexed by CCL_PERF_OP − 1.
const Collective kCollectives[] = {
    {.name = "AllReduce",
     .reduces = true,
     .rooted = false,
     .per_rank = false,
     .in_place_send_at_rank_slot = false,
     .in_place_recv_at_rank_slot = false,
     .checks_in_place = true,
     .bus_factor = factor_all_reduce,
     .counts = counts_whole,
     .run = [](Bench& b, char* sp, char* rp, size_t n, DataType t, RedOp op, int,
               bool) { b.comm().all_reduce(sp, rp, n, t, op); },
     .result_count = result_param,
     .expected = [](const Values& v, size_t i, size_t, int, int, int) { return v.reduced(i); }},
    {.name = "AllGather",
     .reduces = false,
     .rooted = false,
     .per_rank = true,
     .in_place_send_at_rank_slot = true,
     .in_place_recv_at_rank_slot = false,
     .checks_in_place = true,
     .bus_factor = factor_per_rank,
     .counts = [](size_t c, size_t n) -> Counts {
       return {c / n, c / n, (c / n) * n};
     },
     .run = [](Bench& b, char* sp, char* rp, size_t n, DataType t, RedOp, int,
               bool) { b.comm().all_gather(sp, rp, n, t); },
     .result_count = result_recv,
     .expected = [](const Values& v, size_t i, size_t p, int, int,
                    int) { return v.input(static_cast<int>(i / p), i); }},
    {.name = "ReduceScatter",
     .reduces = true,
     .rooted = false,
     .per_rank = true,
     .in_place_send_at_rank_slot = false,
     .in_place_recv_at_rank_slot = true,
     .checks_in_place = true,
     .bus_factor = factor_per_rank,
     .counts = [](size_t c, size_t n) -> Counts {
       return {c / n, (c / n) * n, c / n};
     },
     .run = [](Bench& b, char* sp, char* rp, size_t n, DataType t, RedOp op, int,
               bool) { b.comm().reduce_scatter(sp, rp, n, t, op); },
     .result_count = result_param,
     .expected = [](const Values& v, size_t i, size_t p, int rank, int,
                    int) { return v.reduced(static_cast<uint64_t>(rank) * p + i); }},
    {.name = "Broadcast",
     .reduces = false,
     .rooted = true,
     .per_rank = false,
     .in_place_send_at_rank_slot = false,
     .in_place_recv_at_rank_slot = false,
     .checks_in_place = true,
     .bus_factor = factor_one,
     .counts = counts_whole,
     .run = [](Bench& b, char* sp, char* rp, size_t n, DataType t, RedOp, int root,
               bool) { b.comm().broadcast(sp, rp, n, t, root); },
     .result_count = result_param,
     .expected = [](const Values& v, size_t i, size_t, int, int root,
                    int) { return v.input(root, i); }},
    {.name = "Reduce",
     .reduces = true,
     .rooted = true,
     .per_rank = false,
     .in_place_send_at_rank_slot = false,
     .in_place_recv_at_rank_slot = false,
     .checks_in_place = true,
     .bus_factor = factor_one,
     .counts = counts_whole,
     .run = [](Bench& b, char* sp, char* rp, size_t n, DataType t, RedOp op, int root,
               bool) { b.comm().reduce(sp, rp, n, t, op, root); },
     .result_count = [](const Counts& c, int rank, int root) { return rank == root ? c.param : 0; },
     .expected = [](const Values& v, size_t i, size_t, int, int, int) { return v.reduced(i); }},
    {.name = "AllToAll",
     .reduces = false,
     .rooted = false,
     .per_rank = true,
     .in_place_send_at_rank_slot = false,
     .in_place_recv_at_rank_slot = false,
     .checks_in_place = true,
     .bus_factor = factor_per_rank,
     .counts = [](size_t c, size_t n) -> Counts {
       return {c / n, (c / n) * n, (c / n) * n};
     },
     .run = [](Bench& b, char* sp, char* rp, size_t n, DataType t, RedOp, int,
               bool) { b.comm().all_to_all(sp, rp, n, t); },
     .result_count = result_recv,
     .expected =
         [](const Values& v, size_t i, size_t p, int rank, int, int) {
           return v.input(static_cast<int>(i / p), static_cast<uint64_t>(rank) * p + i % p);
         }},
    {.name = "SendRecv",
     .reduces = false,
     .rooted = false,
     .per_rank = false,
     .in_place_send_at_rank_slot = false,
     .in_place_recv_at_rank_slot = false,
     .checks_in_place = false,
     .bus_factor = factor_one,
     .counts = counts_whole,
     .run = [](Bench& b, char*, char*, size_t n, DataType t, RedOp, int,
               bool in_place) { b.send_recv(n, t, in_place); },
     .result_count = result_param,
     .expected = [](const Values& v, size_t i, size_t, int rank, int,
                    int n) { return v.input((rank + n - 1) % n, i); }},
};
static_assert(std::size(kCollectives) == CCL_PERF_SENDRECV);
const Collective& kColl = kCollectives[kOp - 1];

Counts counts_for(size_t bytes, DataType t, int n) {
  return kColl.counts(bytes / type_size(t), static_cast<size_t>(n));
}

void bandwidth(size_t param, DataType t, double sec, int n, double& algbw, double& busbw) {
  double bytes = static_cast<double>(param) * static_cast<double>(type_size(t));
  if (kColl.per_rank) bytes *= n;
  algbw = sec > 0 ? bytes / 1.0e9 / sec : 0;
  busbw = algbw * kColl.bus_factor(n);
}

Bench::Bench(Communicator& comm, size_t bytes) : comm_(comm), rank_(comm.rank()), n_(comm.size()) {
  send_ = alloc(bytes);
  recv_ = alloc(bytes);
}

void Bench::pointers(const Counts& c, DataType t, bool in_place, char*& sp, char*& rp) const {
  const size_t es = type_size(t);
  char* recv = recv_.get();
  if (!in_place) {
    sp = send_.get();
    rp = recv;
    return;
  }
  rp = recv;
  sp = recv;
  const size_t slot = static_cast<size_t>(rank_) * c.param * es;
  if (kColl.in_place_send_at_rank_slot) sp = recv + slot;
  if (kColl.in_place_recv_at_rank_slot) rp = recv + slot;
}

void Bench::run_once(const Counts& c, DataType t, RedOp op, int root, bool in_place) {
  char *sp, *rp;
  pointers(c, t, in_place, sp, rp);
  kColl.run(*this, sp, rp, c.param, t, op, root, in_place);
}

void Bench::init_data(const Counts& c, DataType t, const Values& v, bool in_place) {
  char *sp, *rp;
  pointers(c, t, in_place, sp, rp);
  const size_t es = type_size(t);
  if (!in_place || kColl.in_place_send_at_rank_slot || kColl.in_place_recv_at_rank_slot)
    std::memset(recv_.get(), 0, c.recv * es);
  // Global index of send element i: AllGather contributions are the rank's share of the
  // gathered vector; ReduceScatter and AllToAll inputs span the whole vector.
  const uint64_t base =
      kColl.in_place_send_at_rank_slot ? static_cast<uint64_t>(rank_) * c.param : 0;
  for (size_t i = 0; i < c.send; ++i) store_element(sp, t, i, v.input(rank_, base + i));
}

int64_t Bench::check(const Counts& c, DataType t, const Values& v, int root, bool in_place) const {
  char *sp, *rp;
  pointers(c, t, in_place, sp, rp);
  int64_t wrong = 0;
  const size_t count = kColl.result_count(c, rank_, root);
  for (size_t i = 0; i < count; ++i)
    if (!v.matches(load_element(rp, t, i), kColl.expected(v, i, c.param, rank_, root, n_))) ++wrong;
  return wrong;
}

void Bench::send_recv(size_t count, DataType t, bool in_place) {
  comm_.group_start();
  comm_.send(in_place ? recv_.get() : send_.get(), count, t, (rank_ + 1) % n_);
  comm_.recv(recv_.get(), count, t, (rank_ + n_ - 1) % n_);
  comm_.group_end();
}

// ---- reporting ----------------------------------------------------------------------------

double reduce_double(Communicator& comm, double v, int mode) {
  // mode: 0 rank 0's value, 1 mean, 2 min, 3 max
  double out = v;
  if (mode == 0) {
    comm.broadcast(&v, &out, 1, DataType::kFloat64, 0);
    return out;
  }
  const RedOp op = mode == 2 ? RedOp::kMin : mode == 3 ? RedOp::kMax : RedOp::kSum;
  comm.all_reduce(&v, &out, 1, DataType::kFloat64, op);
  return mode == 1 ? out / comm.size() : out;
}

int64_t sum_int(Communicator& comm, int64_t v) {
  int64_t out = 0;
  comm.all_reduce(&v, &out, 1, DataType::kInt64, RedOp::kSum);
  return out;
}

int run(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  const nccl_tests::Options& o = args.o;
  const LaunchInfo info = launch_info();
  std::unique_ptr<Communicator> comm_owner =
      std::make_unique<Communicator>(connect_transport_from_environment(info));
  Communicator& comm = *comm_owner;
  const int rank = comm.rank(), n = comm.size();
  const bool main_rank = rank == 0;
  if (kColl.rooted && o.root >= n) {
    if (main_rank) std::fprintf(stderr, "invalid root %d for %d ranks\n", o.root, n);
    return 2;
  }
  if (main_rank && o.cudagraph > 0)
    std::fprintf(stderr, "%s: note: -G %d ignored: there are no CUDA graphs on CPU buffers\n",
                 program_invocation_short_name, o.cudagraph);

  // Rank/device lines, gathered to rank 0 in rank order.
  constexpr size_t kLine = 256;
  char line[kLine] = {};
  {
    std::string dev = "?", addr = "?";
    if (auto* vt = dynamic_cast<VerbsTransport*>(&comm.transport())) {
      dev = vt->device_name();
      addr = vt->local_address();
    }
    std::snprintf(
        line, kLine, "%s",
        nccl_tests::rank_line(rank, dev + " [" + addr + "] (" + info.launcher + ")").c_str());
  }
  std::vector<char> lines(kLine * static_cast<size_t>(n));
  comm.all_gather(line, lines.data(), kLine, DataType::kUint8);

  if (main_rank) {
    nccl_tests::print_parameters_line(o);
    std::printf("#\n# %s over softrdma collectives (ccl), %d ranks\n#\n# Using devices\n",
                kColl.name, n);
    for (int r = 0; r < n; ++r) std::printf("%s\n", &lines[static_cast<size_t>(r) * kLine]);
    std::printf("#\n");
    nccl_tests::print_column_headers();
    std::fflush(stdout);
  }

  // Buffers for the largest size of any type.
  size_t buf_bytes = 64;
  for (DataType t : args.types) {
    const Counts c = counts_for(o.max_bytes, t, n);
    buf_bytes = std::max(buf_bytes, std::max(c.send, c.recv) * type_size(t));
  }
  Bench bench(comm, buf_bytes);

  int errors = 0;
  double bw_sum = 0;
  int bw_count = 0;
  uint64_t rep = 0;
  const std::vector<RedOp> no_op{RedOp::kSum};
  for (DataType t : args.types) {
    for (RedOp op : kColl.reduces ? args.ops : no_op) {
      const int root = kColl.rooted ? o.root : -1;
      const char* op_text = kColl.reduces ? op_name(op) : "none";
      // nccl-tests' BenchTime: with -m, `ops` operations issued in one group.
      auto issue = [&](const Counts& c, int ops, bool in_place) {
        if (o.agg_iters > 1) comm.group_start();
        for (int a = 0; a < ops; ++a) bench.run_once(c, t, op, root, in_place);
        if (o.agg_iters > 1) comm.group_end();
      };
      // Warm-up at the largest and the smallest size, as nccl-tests.
      for (size_t bytes : {o.max_bytes, o.min_bytes}) {
        const Counts c = counts_for(bytes, t, n);
        for (int i = 0; i < o.warmup; ++i) bench.run_once(c, t, op, root, false);
      }
      for (size_t size = o.min_bytes;;) {
        const Counts c = counts_for(size, t, n);
        const size_t shown = std::max(c.send, c.recv) * type_size(t);
        if (main_rank) {
          nccl_tests::print_row_start(shown, c.param, type_name(t), op_text, root);
          std::fflush(stdout);
          g_mid_line = true;
        }
        for (bool in_place : {false, true}) {
          const Values v(t, op, n, ++rep);
          if (o.check) bench.init_data(c, t, v, in_place);
          comm.barrier();
          const auto t0 = Clock::now();
          for (int i = 0; i < o.iters; ++i) issue(c, o.agg_iters, in_place);
          double sec = std::chrono::duration<double>(Clock::now() - t0).count() /
                       (static_cast<double>(o.iters) * o.agg_iters);
          sec = reduce_double(comm, sec, o.average);
          double algbw = 0, busbw = 0;
          bandwidth(c.param, t, sec, n, algbw, busbw);
          const bool checked = o.check && (kColl.checks_in_place || !in_place);
          int64_t wrong = 0;
          if (checked) {
            bench.init_data(c, t, v, in_place);
            comm.barrier();
            // The checked run goes through a group too: out of place the repeats give the same
            // result; in place a repeat would reduce (or shift) the data again.
            issue(c, in_place ? 1 : o.agg_iters, in_place);
            wrong = sum_int(comm, bench.check(c, t, v, root, in_place));
            if (wrong) ++errors;
          }
          if (main_rank) nccl_tests::print_placement(sec, algbw, busbw, checked, wrong);
          bw_sum += busbw;
          ++bw_count;
        }
        if (main_rank) {
          std::printf("\n");
          std::fflush(stdout);
          g_mid_line = false;
        }
        if (!nccl_tests::next_size(o, size)) break;
      }
    }
  }
  comm.barrier();
  if (main_rank) {
    nccl_tests::print_summary(errors, bw_sum, bw_count);
    std::fflush(stdout);
  }
  return errors ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  setlinebuf(stdout);
  const char* who = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!who) who = std::getenv("RANK");
  if (!who) who = std::getenv("SLURM_PROCID");
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    if (g_mid_line) std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr, "%s: rank %s: error: %s\n", program_invocation_short_name, who ? who : "0",
                 e.what());
    return 3;
  }
}
