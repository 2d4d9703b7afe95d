// The floor of a same-host read (docs/cluster.md, "Same-host reads"): a child process holds an
// s-byte tmpfs file mapped and populated (an owner's kept mapping); this process copies it with
// process_vm_readv (a) in one call into populated tmpfs pages (a recycled staging file), (b) by
// 512 KiB slices into the same pages (as granary does, hashing each slice after it), (c) in one
// call into fresh tmpfs pages (fallocated, not mapped yet), and (d) in one call after the pages
// of both were pushed out of the CPU's caches (a 64 MiB sweep), as a first read finds them; the
// medians of `reps`. Arguments: size in bytes, repetitions.
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static char *map_file(const char *path, size_t n, int populate) {
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || fallocate(fd, 0, 0, n)) { perror(path); exit(1); }
  char *p = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED | (populate ? MAP_POPULATE : 0), fd, 0);
  close(fd); unlink(path);
  if (p == MAP_FAILED) { perror("mmap"); exit(1); }
  return p;
}
static void readv_from(pid_t pid, char *src, char *dst, size_t n) {
  struct iovec l = {dst, n}, r = {src, n};
  if (process_vm_readv(pid, &l, 1, &r, 1, 0) != (ssize_t)n) { perror("process_vm_readv"); exit(1); }
}
int main(int argc, char **argv) {
  size_t n = argc > 1 ? (size_t)atol(argv[1]) : 8 << 20;
  int reps = argc > 2 ? atoi(argv[2]) : 20;
  char *src = map_file("/dev/shm/floor-cma-src", n, 1);
  for (size_t i = 0; i < n; i++) src[i] = (char)(i * 7 + i / 4096);
  pid_t pid = fork();
  if (pid == 0) { volatile char x = 0; for (size_t i = 0; i < n; i += 4096) x ^= src[i]; pause(); _exit(0); }
  usleep(300000);
  char *dst = map_file("/dev/shm/floor-cma-dst", n, 1);
  size_t sweep_n = 64 << 20; char *sweep = malloc(sweep_n); memset(sweep, 1, sweep_n);
  double *t[4]; for (int k = 0; k < 4; k++) t[k] = malloc(sizeof(double) * reps);
  for (int i = 0; i < reps; i++) {
    double a = now(); readv_from(pid, src, dst, n); t[0][i] = now() - a;
    a = now(); for (size_t off = 0; off < n; off += 512 << 10) { size_t c = n - off < (512 << 10) ? n - off : 512 << 10; readv_from(pid, src + off, dst + off, c); } t[1][i] = now() - a;
    char *fresh = map_file("/dev/shm/floor-cma-fresh", n, 0);
    a = now(); readv_from(pid, src, fresh, n); t[2][i] = now() - a;
    munmap(fresh, n);
    memset(sweep, i, sweep_n);
    a = now(); readv_from(pid, src, dst, n); t[3][i] = now() - a;
  }
  for (int k = 0; k < 4; k++) qsort(t[k], reps, sizeof(double), cmp);
  printf("%zu B, process_vm_readv (median of %d): into populated pages %.3f ms, by 512 KiB slices %.3f ms, into fresh tmpfs pages %.3f ms, out of cache %.3f ms\n",
         n, reps, t[0][reps / 2] * 1e3, t[1][reps / 2] * 1e3, t[2][reps / 2] * 1e3, t[3][reps / 2] * 1e3);
  kill(pid, SIGKILL);
  return 0;
}
