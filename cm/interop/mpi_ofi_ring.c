/* cm.mpi_ofi: a small MPI program for Open MPI over libfabric's verbs provider
 * (`--mca pml cm --mca mtl ofi`, FI_PROVIDER=verbs) on softrdma: a ring of messages of
 * 8 B .. 1 MiB (eager and rendezvous) with their contents checked, an allreduce, then
 * MPI_Finalize, which unloads libfabric and with it librdmacm.so.1 and libibverbs.so.1
 * (issue 22 item 3: the process died of SIGSEGV seconds after that). Exit status 0 when every
 * check passed. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char** argv) {
  int rank = 0, size = 0, bad = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  for (size_t n = 8; n <= (1u << 20); n *= 16) {
    unsigned char *out = malloc(n), *in = malloc(n);
    for (size_t i = 0; i < n; ++i) out[i] = (unsigned char)(rank * 31 + i * 7);
    MPI_Sendrecv(out, (int)n, MPI_BYTE, next, 1, in, (int)n, MPI_BYTE, prev, 1, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    for (size_t i = 0; i < n; ++i)
      if (in[i] != (unsigned char)(prev * 31 + i * 7)) {
        ++bad;
        break;
      }
    free(out);
    free(in);
  }
  long mine = rank + 1, sum = 0;
  MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (sum != (long)size * (size + 1) / 2) ++bad;
  if (rank == 0) printf("mpi_ofi_ring: %d ranks, %s\n", size, bad ? "MISMATCH" : "ok");
  MPI_Finalize();
  /* What MPI_Finalize unloaded must not run on: a left thread or handler crashes us here. */
  sleep(2);
  return bad ? 1 : 0;
}
