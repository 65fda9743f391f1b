// mpi_allreduce, mpi_allgather, mpi_reduce_scatter: Open MPI's MPI_Allreduce,
// MPI_Allgather and MPI_Reduce_scatter_block (float; sum) measured the way nccl-tests'
// all_reduce_perf, all_gather_perf and reduce_scatter_perf measure (and softrdma's
// tools/ccl_perf/*_perf), so that their lines can be compared column for column. A
// benchmark, not a test. One source compiled once per collective with -DMPI_COLL=<n>
// (bench::Coll's numbers, as tools/ccl_perf's CCL_PERF_OP): like the *_perf tools, a program
// per collective whose name says what it measures, and the same flags for all three.
//
//   mpirun -np 2 --mca pml ob1 --mca btl tcp,self   build/bin/mpi_allgather -b 8 -e 64M -f 2
//   mpirun -np 2 --mca pml ob1 --mca btl vader,self ...        (shared memory)
//
// (`--mca pml ob1` matters: Debian's Open MPI also has the UCX PML, which ignores the btl
// list; bench/ccl_bench.sh passes both.)
//
// Flags (nccl-tests' names): -b minbytes -e maxbytes (K/M/G suffixes, ×1024; the larger
// buffer, as nccl-tests: AllGather's output, ReduceScatter's input) -f stepfactor |
// -i stepbytes, -n iters (timed, default 20), -w warmup_iters (default 5), -c check (0: none;
// default 1), -d float and -o sum (the only type and op), -a average (0 rank 0's time,
// 1 mean, 2 min, 3 max over ranks; default 1).
//
// Method, sizes, output columns, busbw factors and inputs: bench/coll_sweep.h (shared with
// gloo_allreduce). Out-of-place uses separate send and receive buffers; in-place passes
// MPI_IN_PLACE (MPI-3.1 §5.9.6, §5.10.2: AllGather's contribution sits at the rank's slot of
// the receive buffer, ReduceScatter's input is the whole receive buffer and its result lands
// at the start of it). Barriers are MPI_Barrier, times combine over ranks with
// MPI_Allreduce/MPI_Bcast.
//
// Exit status: 0, 1 when a result was wrong, 2 for bad arguments.
#include <mpi.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/coll_sweep.h"
#include "tools/ccl_perf/nccl_tests_args.h"
#include "tools/ccl_perf/nccl_tests_format.h"

#ifndef MPI_COLL
#error "compile with -DMPI_COLL=<softrdma::bench::Coll number>"
#endif

namespace nccl_tests = softrdma::nccl_tests;
using softrdma::bench::Coll;

namespace {

constexpr Coll kColl = static_cast<Coll>(MPI_COLL);
static_assert(kColl == Coll::kAllReduce || kColl == Coll::kAllGather ||
              kColl == Coll::kReduceScatter);

// The MPI call each program measures, for its header line.
constexpr const char* kCall = kColl == Coll::kAllReduce   ? "MPI_Allreduce"
                              : kColl == Coll::kAllGather ? "MPI_Allgather"
                                                          : "MPI_Reduce_scatter_block";

int g_rank = 0;

[[noreturn]] void finish(int status) {
  MPI_Finalize();
  std::exit(status);
}

[[noreturn]] void usage_error(const std::string& msg) {
  if (g_rank == 0)
    std::fprintf(stderr, "%s: %s (see -h)\n", program_invocation_short_name, msg.c_str());
  finish(2);
}

nccl_tests::Options parse_args(int argc, char** argv) {
  nccl_tests::Options o;
  const std::string program = std::string("mpirun -np N ") + program_invocation_short_name;
  const nccl_tests::UsageText text{.program = program.c_str(),
                                   .datatypes = "float",
                                   .ops = "sum",
                                   .notes = "Launch with mpirun.\n"};
  if (const auto status = nccl_tests::parse_command_line(argc, argv, o, text, g_rank == 0))
    finish(*status);
  if (o.datatype != "float") usage_error("only -d float is supported");
  if (o.op != "sum") usage_error("only -o sum is supported");
  if (o.agg_iters != 1) usage_error("only -m 1 is supported (no aggregation in this reference)");
  if (o.max_bytes / sizeof(float) > static_cast<size_t>(INT_MAX))
    usage_error("maxbytes too large for an int count");
  return o;
}

/// kColl's MPI call on MPI_COMM_WORLD, MPI_FLOAT (and MPI_SUM).
class MpiCollective final : public softrdma::bench::FloatCollective {
 public:
  void prepare(size_t count, bool in_place) override {
    count_ = static_cast<int>(count);
    in_place_ = in_place;
  }
  void run() override {
    const void* in = in_place_ ? MPI_IN_PLACE : send.data();
    if constexpr (kColl == Coll::kAllReduce)
      MPI_Allreduce(in, recv.data(), count_, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if constexpr (kColl == Coll::kAllGather)
      MPI_Allgather(in, count_, MPI_FLOAT, recv.data(), count_, MPI_FLOAT, MPI_COMM_WORLD);
    else
      MPI_Reduce_scatter_block(in, recv.data(), count_, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
  void barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  double combine_time(double sec, int average) override {
    if (average == 0) {
      MPI_Bcast(&sec, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      return sec;
    }
    const MPI_Op op = average == 2 ? MPI_MIN : average == 3 ? MPI_MAX : MPI_SUM;
    MPI_Allreduce(MPI_IN_PLACE, &sec, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return average == 1 ? sec / n : sec;
  }
  int64_t sum_over_ranks(int64_t v) override {
    long long x = v;
    MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
    return x;
  }
  // MPI_Reduce_scatter_block with MPI_IN_PLACE leaves the result at the start of recvbuf.
  size_t in_place_result_offset(size_t, int) const override { return 0; }

 private:
  int count_ = 0;
  bool in_place_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  setlinebuf(stdout);
  MPI_Init(&argc, &argv);
  int n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  const int rank = g_rank;
  const nccl_tests::Options args = parse_args(argc, argv);

  constexpr int kLine = 256;
  char line[kLine] = {};
  std::snprintf(line, kLine, "%s", nccl_tests::rank_line(rank, "").c_str());
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
    nccl_tests::print_parameters_line(args);
    std::printf("#\n# %s: %s of %s, pml %s, btl %s, %d ranks\n#\n",
                softrdma::bench::coll_name(kColl), kCall, v.c_str(), pml ? pml : "(default)",
                btl ? btl : "(default)", n);
    for (int r = 0; r < n; ++r) std::printf("%s\n", &lines[static_cast<size_t>(r) * kLine]);
    std::printf("#\n");
    nccl_tests::print_column_headers();
  }

  MpiCollective lib;
  const int errors = softrdma::bench::run_sweep(kColl, lib, args, rank, n);
  MPI_Finalize();
  return errors ? 1 : 0;
}
