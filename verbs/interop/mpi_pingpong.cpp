// mpi_pingpong: a two-rank MPI_Send / MPI_Recv ping-pong that checks every byte, for
// verbs/interop/ucx_test.sh (Open MPI over UCX over softrdma). Rank 0 sends a message of
// each size 1 B, 4 B, ... 4 MiB (eager and rendezvous protocols both) `kRounds` times; rank
// 1 checks it and sends back its bytes complemented; rank 0 checks the reply. Sizes and
// round-trip times (µs, mean over the rounds, the byte checks included) are printed by rank 0, then
// "mpi_pingpong: PASS" or "mpi_pingpong: FAIL ...".
//
// Exit status: 0 when every message arrived intact, 1 otherwise, 2 with other than 2 ranks.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <vector>

namespace {

constexpr int kRounds = 20;
constexpr size_t kMaxBytes = size_t{4} << 20;

/// Byte `i` of round `round`'s message of `n` bytes.
uint8_t pattern(size_t n, int round, size_t i) {
  return static_cast<uint8_t>((i * 131u) ^ (n * 7u) ^ static_cast<size_t>(round) * 29u);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 2) {
    if (rank == 0) std::fprintf(stderr, "mpi_pingpong: needs exactly 2 ranks, got %d\n", size);
    MPI_Finalize();
    return 2;
  }
  std::vector<uint8_t> buf(kMaxBytes);
  int64_t bad = 0;
  if (rank == 0) std::printf("mpi_pingpong: %10s %12s\n", "bytes", "rtt[usec]");
  for (size_t n = 1; n <= kMaxBytes; n *= 4) {
    const int count = static_cast<int>(n);
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (int r = 0; r < kRounds; ++r) {
      if (rank == 0) {
        for (size_t i = 0; i < n; ++i) buf[i] = pattern(n, r, i);
        MPI_Send(buf.data(), count, MPI_BYTE, 1, r, MPI_COMM_WORLD);
        MPI_Recv(buf.data(), count, MPI_BYTE, 1, r, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        for (size_t i = 0; i < n; ++i) bad += buf[i] != static_cast<uint8_t>(~pattern(n, r, i));
      } else {
        MPI_Status st;
        MPI_Recv(buf.data(), count, MPI_BYTE, 0, r, MPI_COMM_WORLD, &st);
        int got = 0;
        MPI_Get_count(&st, MPI_BYTE, &got);
        bad += got != count;
        for (size_t i = 0; i < n; ++i) {
          bad += buf[i] != pattern(n, r, i);
          buf[i] = static_cast<uint8_t>(~buf[i]);
        }
        MPI_Send(buf.data(), count, MPI_BYTE, 0, r, MPI_COMM_WORLD);
      }
    }
    const double rtt_us = (MPI_Wtime() - t0) / kRounds * 1e6;
    if (rank == 0) std::printf("mpi_pingpong: %10zu %12.1f\n", n, rtt_us);
  }
  int64_t total = 0;
  MPI_Allreduce(&bad, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    if (total == 0) {
      std::printf("mpi_pingpong: PASS\n");
    } else {
      std::printf("mpi_pingpong: FAIL %lld wrong bytes or lengths\n",
                  static_cast<long long>(total));
    }
  }
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
