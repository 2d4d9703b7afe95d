// t_mpi(s) of the remote-read bar (docs/cluster.md): the one-way time of a plain MPI ping-pong of
// s bytes between two ranks, half the median round trip, buffers allocated and touched once
// (the transfer's floor: what any MPI program pays for s bytes, with this MPI and launcher).
// Arguments: repetitions, `--cold` (optional), then sizes in bytes. Prints one JSON object:
// {"<size>": seconds}. With `--cold` each round trip uses the next of a pool of buffers filling
// 1 GiB per rank, so its bytes come from memory, not the CPU's caches, as a first read's do.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int r; MPI_Comm_rank(MPI_COMM_WORLD, &r);
  int reps = atoi(argv[1]);
  int cold = argc > 2 && strcmp(argv[2], "--cold") == 0;
  double *v = malloc(sizeof(double) * reps);
  if (r == 0) printf("{");
  for (int k = 2 + cold; k < argc; k++) {
    long n = atol(argv[k]);
    long pool = cold ? (1L << 30) / n : 1;
    if (pool < 2 && cold) pool = 2;
    char *all = malloc(n * pool); memset(all, 1, n * pool);
    for (int i = -3; i < reps; i++) {  // 3 warm-up round trips
      char *buf = all + ((i + 3) % pool) * n;
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      if (r == 0) { MPI_Send(buf, n, MPI_BYTE, 1, 1, MPI_COMM_WORLD); MPI_Recv(buf, n, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE); }
      else { MPI_Recv(buf, n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE); MPI_Send(buf, n, MPI_BYTE, 0, 1, MPI_COMM_WORLD); }
      if (i >= 0) v[i] = (MPI_Wtime() - t0) / 2;
    }
    qsort(v, reps, sizeof(double), cmp);
    if (r == 0) printf("%s\"%ld\": %.9f", k > 2 + cold ? ", " : "", n, v[reps / 2]);
    free(all);
  }
  if (r == 0) printf("}\n");
  MPI_Finalize();
  return 0;
}
