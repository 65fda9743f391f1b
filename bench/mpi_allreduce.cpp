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
// | -i stepbytes, -n iters (timed, default 20), -w warmup_iters (default 5), -c check (0: none;
// default 1), -d float and -o sum (the only type and op), -a average (0 rank 0's time,
// 1 mean, 2 min, 3 max over ranks; default 1).
//
// Method, output columns and inputs: bench/allreduce_sweep.h (shared with gloo_allreduce);
// out-of-place uses separate send and receive buffers, in-place MPI_IN_PLACE; barriers are
// MPI_Barrier, times combine over ranks with MPI_Allreduce/MPI_Bcast.
//
// Exit status: 0, 1 when a result was wrong, 2 for bad arguments.
#include <mpi.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/allreduce_sweep.h"
#include "tools/ccl_perf/nccl_tests_args.h"
#include "tools/ccl_perf/nccl_tests_format.h"

namespace nccl_tests = softrdma::nccl_tests;

namespace {

int g_rank = 0;

[[noreturn]] void usage_error(const std::string& msg) {
  if (g_rank == 0) std::fprintf(stderr, "mpi_allreduce: %s (see -h)\n", msg.c_str());
  MPI_Finalize();
  std::exit(2);
}

nccl_tests::Options parse_args(int argc, char** argv) {
  nccl_tests::Options o;
  std::string error;
  switch (nccl_tests::parse_options(argc, argv, o, error)) {
    case nccl_tests::ParseResult::kHelp:
      if (g_rank == 0)
        std::printf("%s", nccl_tests::usage("mpirun -np N mpi_allreduce", "float", "sum", "",
                                            "Launch with mpirun.\n")
                              .c_str());
      MPI_Finalize();
      std::exit(0);
    case nccl_tests::ParseResult::kError:
      usage_error(error);
    case nccl_tests::ParseResult::kOk:
      break;
  }
  if (o.datatype != "float") usage_error("only -d float is supported");
  if (o.op != "sum") usage_error("only -o sum is supported");
  if (o.max_bytes / sizeof(float) > static_cast<size_t>(INT_MAX))
    usage_error("maxbytes too large for an int count");
  return o;
}

/// MPI_Allreduce(MPI_FLOAT, MPI_SUM) on MPI_COMM_WORLD.
class MpiAllReduce final : public softrdma::bench::FloatSumAllReduce {
 public:
  void prepare(size_t count, bool in_place) override {
    count_ = static_cast<int>(count);
    in_place_ = in_place;
  }
  void run() override {
    MPI_Allreduce(in_place_ ? MPI_IN_PLACE : send.data(), recv.data(), count_, MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
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
    std::printf("#\n# AllReduce: MPI_Allreduce of %s, pml %s, btl %s, %d ranks\n#\n", v.c_str(),
                pml ? pml : "(default)", btl ? btl : "(default)", n);
    for (int r = 0; r < n; ++r) std::printf("%s\n", &lines[static_cast<size_t>(r) * kLine]);
    std::printf("#\n");
    nccl_tests::print_column_headers();
  }

  MpiAllReduce lib;
  const int errors = softrdma::bench::run_sweep(lib, args, rank, n);
  MPI_Finalize();
  return errors ? 1 : 0;
}
