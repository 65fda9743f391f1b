// nccl-tests–style benchmarks of softrdma's collectives: one source compiled once per
// collective (CCL_PERF_OP selects it) into all_reduce_perf, all_gather_perf,
// reduce_scatter_perf, broadcast_perf, reduce_perf, alltoall_perf and sendrecv_perf.
//
// One process per rank, launched by `mpirun -np N`, srun, or with the torchrun variables
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); without any of them a single rank runs.
// The ranks find each other through ccl::init_from_environment() (ccl/bootstrap.h).
//
// Flags and output follow nccl-tests (github.com/NVIDIA/nccl-tests, src/common.cu):
//   -b minbytes -e maxbytes (K/M/G suffixes) -f stepfactor | -i stepbytes -n iters
//   -w warmup_iters -c check(0/1) -o op -d datatype -r root -a average(0..3)
// For every size it prints the out-of-place then the in-place time (µs per operation),
// algbw = S/t and busbw = algbw × factor (GB/s = 1e9 B/s), and #wrong, the number of result
// elements (summed over ranks) that differ from the expected values. S and factor:
//   AllReduce          S = count·size            factor 2(n−1)/n
//   AllGather, ReduceScatter, AllToAll  S = count·size·n (count per rank)  factor (n−1)/n
//   Broadcast, Reduce, SendRecv          S = count·size            factor 1
// Input element i of rank r is a small integer (so sums are exact in every type, half and
// bfloat16 included); avg results are compared with a tolerance of the type's precision.
// SendRecv sends to rank+1 and receives from rank−1 concurrently, through the
// communicator's transport (ccl.h's Send/Recv are blocking, so a ring of them would
// serialise); its in-place run (same buffer) is timed but not checked (N/A), as in
// nccl-tests.
//
// Exit status: 0 success, 1 wrong results, 2 bad arguments, 3 runtime failure (a peer died,
// bootstrap failed); errors go to stderr, prefixed with the rank.
#include <errno.h>
#include <getopt.h>
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

#include "ccl/bootstrap.h"
#include "ccl/ccl.h"
#include "ccl/verbs_transport.h"
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
using Clock = std::chrono::steady_clock;

// Rank 0 is in the middle of a result line (an error message then starts on a new line).
bool g_mid_line = false;

constexpr int kOp = CCL_PERF_OP;
constexpr bool kReduces =
    kOp == CCL_PERF_ALL_REDUCE || kOp == CCL_PERF_REDUCE_SCATTER || kOp == CCL_PERF_REDUCE;
constexpr bool kRooted = kOp == CCL_PERF_BROADCAST || kOp == CCL_PERF_REDUCE;

const char* collective_name() {
  switch (kOp) {
    case CCL_PERF_ALL_REDUCE:
      return "AllReduce";
    case CCL_PERF_ALL_GATHER:
      return "AllGather";
    case CCL_PERF_REDUCE_SCATTER:
      return "ReduceScatter";
    case CCL_PERF_BROADCAST:
      return "Broadcast";
    case CCL_PERF_REDUCE:
      return "Reduce";
    case CCL_PERF_ALLTOALL:
      return "AllToAll";
    default:
      return "SendRecv";
  }
}

// ---- arguments ----------------------------------------------------------------------------

struct Args {
  size_t min_bytes = 32u << 20;
  size_t max_bytes = 32u << 20;
  size_t step_bytes = 1u << 20;
  size_t step_factor = 1;
  int iters = 20;
  int warmup = 5;
  int check = 1;
  int root = 0;
  int average = 1;  // 0 rank 0, 1 mean, 2 min, 3 max
  std::vector<DataType> types{DataType::kFloat32};
  std::vector<RedOp> ops{RedOp::kSum};
};

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "%s: %s (see -h)\n", program_invocation_short_name, msg.c_str());
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

void print_usage() {
  std::printf(
      "USAGE: %s\n"
      "\t[-b,--minbytes <min size in bytes>]\n"
      "\t[-e,--maxbytes <max size in bytes>]\n"
      "\t[-i,--stepbytes <increment size>]\n"
      "\t[-f,--stepfactor <increment factor>]\n"
      "\t[-n,--iters <iteration count>]\n"
      "\t[-w,--warmup_iters <warmup iteration count>]\n"
      "\t[-c,--check <0/1>]\n"
      "\t[-o,--op <sum/prod/min/max/avg/all>]\n"
      "\t[-d,--datatype <int8/uint8/int32/uint32/int64/uint64/half/float/double/bfloat16/all>]\n"
      "\t[-r,--root <root>]\n"
      "\t[-a,--average <0/1/2/3> report average iteration time <0=RANK0/1=AVG/2=MIN/3=MAX>]\n"
      "\t[-t,--nthreads 1] [-g,--ngpus 1] (accepted for compatibility: one rank per process)\n"
      "\t[-h,--help]\n"
      "Sizes take K/M/G suffixes. Launch with mpirun -np N, srun, or the torchrun variables\n"
      "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; see docs/collectives.md.\n",
      program_invocation_short_name);
}

Args parse_args(int argc, char** argv) {
  Args a;
  static const option longopts[] = {{"nthreads", required_argument, nullptr, 't'},
                                    {"ngpus", required_argument, nullptr, 'g'},
                                    {"minbytes", required_argument, nullptr, 'b'},
                                    {"maxbytes", required_argument, nullptr, 'e'},
                                    {"stepbytes", required_argument, nullptr, 'i'},
                                    {"stepfactor", required_argument, nullptr, 'f'},
                                    {"iters", required_argument, nullptr, 'n'},
                                    {"warmup_iters", required_argument, nullptr, 'w'},
                                    {"check", required_argument, nullptr, 'c'},
                                    {"op", required_argument, nullptr, 'o'},
                                    {"datatype", required_argument, nullptr, 'd'},
                                    {"root", required_argument, nullptr, 'r'},
                                    {"average", required_argument, nullptr, 'a'},
                                    {"help", no_argument, nullptr, 'h'},
                                    {nullptr, 0, nullptr, 0}};
  for (;;) {
    int c = getopt_long(argc, argv, "t:g:b:e:i:f:n:w:c:o:d:r:a:h", longopts, nullptr);
    if (c == -1) break;
    switch (c) {
      case 't':
        parse_int("nthreads", optarg, 1, 1);
        break;
      case 'g':
        parse_int("ngpus", optarg, 1, 1);
        break;
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
        a.check = static_cast<int>(parse_int("check", optarg, 0, 1 << 30));
        break;
      case 'r':
        a.root = static_cast<int>(parse_int("root", optarg, 0, 1 << 20));
        break;
      case 'a':
        a.average = static_cast<int>(parse_int("average", optarg, 0, 3));
        break;
      case 'o':
        a.ops.clear();
        if (std::strcmp(optarg, "all") == 0) {
          a.ops = {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin, RedOp::kAvg};
        } else {
          RedOp op;
          if (!parse_op(optarg, op)) usage_error(std::string("unknown op: ") + optarg);
          a.ops.push_back(op);
        }
        break;
      case 'd':
        a.types.clear();
        if (std::strcmp(optarg, "all") == 0) {
          a.types = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,   DataType::kUint32,
                     DataType::kInt64,   DataType::kUint64,  DataType::kFloat16, DataType::kFloat32,
                     DataType::kFloat64, DataType::kBfloat16};
        } else {
          DataType t;
          if (!parse_type(optarg, t)) usage_error(std::string("unknown datatype: ") + optarg);
          a.types.push_back(t);
        }
        break;
      case 'h':
        print_usage();
        std::exit(0);
      default:
        usage_error("invalid option");
    }
  }
  if (optind < argc) usage_error(std::string("unexpected argument: ") + argv[optind]);
  if (a.min_bytes > a.max_bytes)
    usage_error("invalid sizes for 'minbytes' and 'maxbytes': " + std::to_string(a.min_bytes) +
                " > " + std::to_string(a.max_bytes));
  if (a.step_factor <= 1 && a.step_bytes == 0) usage_error("stepbytes must be positive");
  return a;
}

// ---- element values -----------------------------------------------------------------------

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000;
  const int e8 = static_cast<int>((x >> 23) & 0xff);
  uint32_t mant = x & 0x7fffff;
  if (e8 == 0xff) return static_cast<uint16_t>(sign | 0x7c00 | (mant ? 0x200 : 0));
  const int e = e8 - 127 + 15;
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    const int shift = 14 - e;
    uint32_t h = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (static_cast<uint32_t>(e) << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (e == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  if (e == 31)
    bits = sign | 0x7f800000 | (mant << 13);
  else
    bits = sign | ((e - 15 + 127) << 23) | (mant << 13);
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

float bf16_to_f32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void store(void* p, DataType t, size_t i, double v) {
  switch (t) {
    case DataType::kInt8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kUint8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kUint32:
      static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kUint64:
      static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(v);
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
      break;
    case DataType::kBfloat16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(p)[i] = v;
      break;
  }
}

double load(const void* p, DataType t, size_t i) {
  switch (t) {
    case DataType::kInt8:
      return static_cast<const int8_t*>(p)[i];
    case DataType::kUint8:
      return static_cast<const uint8_t*>(p)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::kUint32:
      return static_cast<const uint32_t*>(p)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kUint64:
      return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DataType::kFloat16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBfloat16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(p)[i];
  }
  return 0;
}

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

// ---- one collective -----------------------------------------------------------------------

// Element counts of one test size, as nccl-tests' *GetCollByteCount.
struct Counts {
  size_t param;  // the count argument of the call
  size_t send;   // elements in the send buffer
  size_t recv;   // elements in the recv buffer
};

Counts counts_for(size_t bytes, DataType t, int n) {
  const size_t count = bytes / type_size(t);
  const size_t nn = static_cast<size_t>(n);
  switch (kOp) {
    case CCL_PERF_ALL_GATHER:
      return {count / nn, count / nn, (count / nn) * nn};
    case CCL_PERF_REDUCE_SCATTER:
      return {count / nn, (count / nn) * nn, count / nn};
    case CCL_PERF_ALLTOALL:
      return {count / nn, (count / nn) * nn, (count / nn) * nn};
    default:
      return {count, count, count};
  }
}

void bandwidth(size_t param, DataType t, double sec, int n, double& algbw, double& busbw) {
  const double elem = static_cast<double>(type_size(t));
  const double nn = n;
  double bytes = static_cast<double>(param) * elem, factor = 1;
  switch (kOp) {
    case CCL_PERF_ALL_REDUCE:
      factor = 2 * (nn - 1) / nn;
      break;
    case CCL_PERF_ALL_GATHER:
    case CCL_PERF_REDUCE_SCATTER:
    case CCL_PERF_ALLTOALL:
      bytes *= nn;
      factor = (nn - 1) / nn;
      break;
    default:
      break;
  }
  algbw = sec > 0 ? bytes / 1.0e9 / sec : 0;
  busbw = algbw * factor;
}

class Bench {
 public:
  // `bytes`: the larger of the send and recv sizes of the largest test (in-place runs use
  // the recv buffer for both).
  Bench(Communicator& comm, size_t bytes) : comm_(comm), rank_(comm.rank()), n_(comm.size()) {
    send_ = alloc(bytes);
    recv_ = alloc(bytes);
    if (kOp == CCL_PERF_SENDRECV) {
      sbuf_ = comm_.transport().register_buffer(send_.get(), bytes);
      rbuf_ = comm_.transport().register_buffer(recv_.get(), bytes);
    }
  }

  // The buffers an in-place or out-of-place call uses.
  void pointers(const Counts& c, DataType t, bool in_place, char*& sp, char*& rp) const {
    const size_t es = type_size(t);
    char* recv = recv_.get();
    if (!in_place) {
      sp = send_.get();
      rp = recv;
      return;
    }
    rp = recv;
    sp = recv;
    if (kOp == CCL_PERF_ALL_GATHER) sp = recv + static_cast<size_t>(rank_) * c.param * es;
    if (kOp == CCL_PERF_REDUCE_SCATTER) rp = recv + static_cast<size_t>(rank_) * c.param * es;
  }

  void run_once(const Counts& c, DataType t, RedOp op, int root, bool in_place) {
    char *sp, *rp;
    pointers(c, t, in_place, sp, rp);
    switch (kOp) {
      case CCL_PERF_ALL_REDUCE:
        comm_.all_reduce(sp, rp, c.param, t, op);
        break;
      case CCL_PERF_ALL_GATHER:
        comm_.all_gather(sp, rp, c.param, t);
        break;
      case CCL_PERF_REDUCE_SCATTER:
        comm_.reduce_scatter(sp, rp, c.param, t, op);
        break;
      case CCL_PERF_BROADCAST:
        comm_.broadcast(sp, rp, c.param, t, root);
        break;
      case CCL_PERF_REDUCE:
        comm_.reduce(sp, rp, c.param, t, op, root);
        break;
      case CCL_PERF_ALLTOALL:
        comm_.all_to_all(sp, rp, c.param, t);
        break;
      default:
        send_recv(c.param * type_size(t), in_place);
        break;
    }
  }

  // Fills this rank's inputs (for the next run) and clears the output.
  void init_data(const Counts& c, DataType t, const Values& v, bool in_place) {
    char *sp, *rp;
    pointers(c, t, in_place, sp, rp);
    const size_t es = type_size(t);
    if (!in_place || kOp == CCL_PERF_ALL_GATHER || kOp == CCL_PERF_REDUCE_SCATTER)
      std::memset(recv_.get(), 0, c.recv * es);
    // Global index of send element i: AllGather contributions are the rank's share of the
    // gathered vector; ReduceScatter and AllToAll inputs span the whole vector.
    const uint64_t base = kOp == CCL_PERF_ALL_GATHER ? static_cast<uint64_t>(rank_) * c.param : 0;
    for (size_t i = 0; i < c.send; ++i) store(sp, t, i, v.input(rank_, base + i));
  }

  // Wrong elements of this rank's result.
  int64_t check(const Counts& c, DataType t, const Values& v, int root, bool in_place) const {
    char *sp, *rp;
    pointers(c, t, in_place, sp, rp);
    int64_t wrong = 0;
    auto expect = [&](size_t i, double want) {
      if (!v.matches(load(rp, t, i), want)) ++wrong;
    };
    const size_t p = c.param;
    const int left = (rank_ + n_ - 1) % n_;
    switch (kOp) {
      case CCL_PERF_ALL_REDUCE:
        for (size_t i = 0; i < p; ++i) expect(i, v.reduced(i));
        break;
      case CCL_PERF_REDUCE:
        if (rank_ == root)
          for (size_t i = 0; i < p; ++i) expect(i, v.reduced(i));
        break;
      case CCL_PERF_BROADCAST:
        for (size_t i = 0; i < p; ++i) expect(i, v.input(root, i));
        break;
      case CCL_PERF_ALL_GATHER:
        for (size_t i = 0; i < c.recv; ++i) expect(i, v.input(static_cast<int>(i / p), i));
        break;
      case CCL_PERF_REDUCE_SCATTER:
        for (size_t i = 0; i < p; ++i) expect(i, v.reduced(static_cast<uint64_t>(rank_) * p + i));
        break;
      case CCL_PERF_ALLTOALL:
        for (size_t i = 0; i < c.recv; ++i)
          expect(i, v.input(static_cast<int>(i / p), static_cast<uint64_t>(rank_) * p + i % p));
        break;
      default:
        for (size_t i = 0; i < p; ++i) expect(i, v.input(left, i));
        break;
    }
    return wrong;
  }

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

  // rank → rank+1 while rank−1 → rank, both in flight at once.
  void send_recv(size_t bytes, bool in_place) {
    Transport& t = comm_.transport();
    // Point-to-point tags (bit 63) with a sequence number the communicator's own Send/Recv
    // counters never reach, so they cannot match the communicator's transfers.
    const uint64_t tag =
        (uint64_t{1} << 63) | (uint64_t{0x7fffffff} << 32) | (p2p_seq_++ & 0xffffffffu);
    Buffer& rb = *rbuf_;
    Buffer& sb = in_place ? *rbuf_ : *sbuf_;
    RequestId r = t.recv((rank_ + n_ - 1) % n_, rb, 0, bytes, tag);
    RequestId s = t.send((rank_ + 1) % n_, sb, 0, bytes, tag);
    t.wait(s, "SendRecv");
    t.wait(r, "SendRecv");
  }

  Communicator& comm_;
  int rank_, n_;
  Mem send_, recv_;
  std::unique_ptr<Buffer> sbuf_, rbuf_;
  uint64_t p2p_seq_ = 0;
};

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
  const LaunchInfo info = launch_info();
  std::unique_ptr<Communicator> comm_owner =
      std::make_unique<Communicator>(connect_transport_from_environment(info));
  Communicator& comm = *comm_owner;
  const int rank = comm.rank(), n = comm.size();
  const bool main_rank = rank == 0;
  if (kRooted && args.root >= n) {
    if (main_rank) std::fprintf(stderr, "invalid root %d for %d ranks\n", args.root, n);
    return 2;
  }

  // Rank/device lines, gathered to rank 0 in rank order.
  constexpr size_t kLine = 256;
  char line[kLine] = {};
  {
    char host[64] = {};
    gethostname(host, sizeof host - 1);
    std::string dev = "?", addr = "?";
    if (auto* vt = dynamic_cast<VerbsTransport*>(&comm.transport())) {
      dev = vt->device_name();
      addr = vt->local_address();
    }
    std::snprintf(line, kLine, "#  Rank %2d Group %2d Pid %6d on %10s device %s [%s] (%s)", rank, 0,
                  static_cast<int>(getpid()), host, dev.c_str(), addr.c_str(),
                  info.launcher.c_str());
  }
  std::vector<char> lines(kLine * static_cast<size_t>(n));
  comm.all_gather(line, lines.data(), kLine, DataType::kUint8);

  if (main_rank) {
    std::printf(
        "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
        "agg iters: 1 validation: %d graph: 0\n",
        args.min_bytes, args.max_bytes, args.step_factor > 1 ? args.step_factor : args.step_bytes,
        args.step_factor > 1 ? "factor" : "bytes", args.warmup, args.iters, args.check);
    std::printf("#\n# %s over softrdma collectives (ccl), %d ranks\n#\n# Using devices\n",
                collective_name(), n);
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
    std::fflush(stdout);
  }

  // Buffers for the largest size of any type.
  size_t buf_bytes = 64;
  for (DataType t : args.types) {
    const Counts c = counts_for(args.max_bytes, t, n);
    buf_bytes = std::max(buf_bytes, std::max(c.send, c.recv) * type_size(t));
  }
  Bench bench(comm, buf_bytes);

  int errors = 0;
  double bw_sum = 0;
  int bw_count = 0;
  uint64_t rep = 0;
  const std::vector<RedOp> no_op{RedOp::kSum};
  for (DataType t : args.types) {
    for (RedOp op : kReduces ? args.ops : no_op) {
      const int root = kRooted ? args.root : -1;
      const char* op_text = kReduces ? op_name(op) : "none";
      // Warm-up at the largest and the smallest size, as nccl-tests.
      for (size_t bytes : {args.max_bytes, args.min_bytes}) {
        const Counts c = counts_for(bytes, t, n);
        for (int i = 0; i < args.warmup; ++i) bench.run_once(c, t, op, root, false);
      }
      for (size_t size = args.min_bytes; size <= args.max_bytes;) {
        const Counts c = counts_for(size, t, n);
        const size_t shown = std::max(c.send, c.recv) * type_size(t);
        if (main_rank) {
          std::printf("%12zu  %12zu  %8s  %6s  %6i", shown, c.param, type_name(t), op_text, root);
          std::fflush(stdout);
          g_mid_line = true;
        }
        for (bool in_place : {false, true}) {
          const Values v(t, op, n, ++rep);
          if (args.check) bench.init_data(c, t, v, in_place);
          comm.barrier();
          const auto t0 = Clock::now();
          for (int i = 0; i < args.iters; ++i) bench.run_once(c, t, op, root, in_place);
          double sec = std::chrono::duration<double>(Clock::now() - t0).count() / args.iters;
          sec = reduce_double(comm, sec, args.average);
          double algbw = 0, busbw = 0;
          bandwidth(c.param, t, sec, n, algbw, busbw);
          const bool checked = args.check && !(kOp == CCL_PERF_SENDRECV && in_place);
          int64_t wrong = 0;
          if (checked) {
            bench.init_data(c, t, v, in_place);
            comm.barrier();
            bench.run_once(c, t, op, root, in_place);
            wrong = sum_int(comm, bench.check(c, t, v, root, in_place));
            if (wrong) ++errors;
          }
          if (main_rank) {
            char wrong_text[32];
            if (checked)
              std::snprintf(wrong_text, sizeof wrong_text, "%5lld", static_cast<long long>(wrong));
            else
              std::snprintf(wrong_text, sizeof wrong_text, "%5s", "N/A");
            std::printf("  %7s  %6.2f  %6.2f  %s", nccl_tests::time_text(sec * 1e6).c_str(), algbw,
                        busbw, wrong_text);
          }
          bw_sum += busbw;
          ++bw_count;
        }
        if (main_rank) {
          std::printf("\n");
          std::fflush(stdout);
          g_mid_line = false;
        }
        const size_t next = args.step_factor > 1 ? size * args.step_factor : size + args.step_bytes;
        if (next <= size) break;  // -b 0 with a factor, or overflow
        size = next;
      }
    }
  }
  comm.barrier();
  if (main_rank) {
    std::printf("# Out of bounds values : %d %s\n", errors, errors ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n", bw_count ? bw_sum / bw_count : 0.0);
    std::printf("#\n");
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
