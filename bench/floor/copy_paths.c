// Where a same-host read's time goes (docs/cluster.md, "Same-host reads"): a child process holds
// `files` s-byte tmpfs files mapped and populated (an owner's kept mappings); this process copies
// each into a populated staging mapping (a staging file made ahead), the pages of both out of the
// CPU's caches as a first read finds them (a 256 MiB sweep every 8 files), by slices, each slice
// read back right after its copy (a pass of 64-bit adds over it, standing in for the checksum,
// which reads each byte once), by
//   pvr SLICE   process_vm_readv from the owner's mapping (what granary does), slices of
//               32 KiB to 1 MiB;
//   kept        memcpy from a mapping of the owner's file this process keeps (made and populated
//               before), 128 KiB slices;
//   per-file    the same, the mapping made (MAP_POPULATE) and removed for each file;
//   faulting    the same, the mapping made without MAP_POPULATE: the copy's own faults map its
//               pages, 16 per fault (the kernel's fault-around);
//   cfr         copy_file_range from the owner's file into the staging file, 128 KiB slices.
// Medians over files x 3 of the copy, of the read-back pass, and of the two. Arguments: size in
// bytes, files.
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static int mkfile(const char *path, size_t n) {
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || fallocate(fd, 0, 0, n)) { perror(path); exit(1); }
  return fd;
}
static char *map(int fd, size_t n, int prot) {
  char *p = mmap(0, n, prot, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) { perror("mmap"); exit(1); }
  return p;
}
static volatile uint64_t sink;
static void read_back(const char *p, size_t n) {
  uint64_t s = 0; const uint64_t *q = (const uint64_t *)p;
  for (size_t i = 0; i < n / 8; i++) s += q[i];
  sink += s;
}
#define METHODS 9
static const char *names[METHODS] = {"pvr 32K", "pvr 128K", "pvr 512K", "pvr 1M", "kept 128K", "per-file 128K", "cfr 128K", "pvr 128K", "faulting 128K"};
static const size_t slices[METHODS] = {32 << 10, 128 << 10, 512 << 10, 1 << 20, 128 << 10, 128 << 10, 128 << 10, 128 << 10, 128 << 10};
int main(int argc, char **argv) {
  size_t n = argc > 1 ? (size_t)atol(argv[1]) : 8 << 20;
  int files = argc > 2 ? atoi(argv[2]) : 32, reps = 3;
  char path[64];
  char **src = calloc(files, sizeof(char *));
  int p[2];
  if (pipe(p)) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 0; i < files; i++) {
      snprintf(path, sizeof path, "/dev/shm/floor-paths-o%d", i);
      int fd = mkfile(path, n);
      char *w = map(fd, n, PROT_READ | PROT_WRITE);
      for (size_t j = 0; j < n; j++) w[j] = (char)(j * 7 + j / 4096 + i);
      src[i] = w;
    }
    if (write(p[1], src, files * sizeof(char *)) < 0) _exit(1);
    pause();
    _exit(0);
  }
  if (read(p[0], src, files * sizeof(char *)) != (ssize_t)(files * sizeof(char *))) return 1;
  int *ofd = calloc(files, sizeof(int)), *dfd = calloc(files, sizeof(int));
  char **kept = calloc(files, sizeof(char *)), **dst = calloc(files, sizeof(char *));
  for (int i = 0; i < files; i++) {
    snprintf(path, sizeof path, "/dev/shm/floor-paths-o%d", i);
    ofd[i] = open(path, O_RDONLY);
    kept[i] = map(ofd[i], n, PROT_READ);
    snprintf(path, sizeof path, "/dev/shm/floor-paths-s%d", i);
    dfd[i] = mkfile(path, n);
    dst[i] = map(dfd[i], n, PROT_READ | PROT_WRITE);
    unlink(path);
  }
  size_t sweep_n = 256 << 20; char *sweep = malloc(sweep_n); memset(sweep, 1, sweep_n);
  double *tc = malloc(sizeof(double) * files * reps), *th = malloc(sizeof(double) * files * reps), *tt = malloc(sizeof(double) * files * reps);
  for (int m = 0; m < METHODS; m++) {
    int k = 0;
    for (int r = 0; r < reps; r++)
      for (int i = 0; i < files; i++, k++) {
        if (i % 8 == 0) memset(sweep, r + i, sweep_n);
        double c = 0, h = 0, a0 = now();
        char *from = kept[i];
        if (m == 5) from = map(ofd[i], n, PROT_READ);
        if (m == 8) {
          from = mmap(0, n, PROT_READ, MAP_SHARED, ofd[i], 0);
          if (from == MAP_FAILED) { perror("mmap"); return 1; }
        }
        for (size_t off = 0; off < n; off += slices[m]) {
          size_t len = n - off < slices[m] ? n - off : slices[m];
          double a = now();
          if (m < 4 || m == 7) {
            struct iovec l = {dst[i] + off, len}, rv = {src[i] + off, len};
            if (process_vm_readv(pid, &l, 1, &rv, 1, 0) != (ssize_t)len) { perror("process_vm_readv"); return 1; }
          } else if (m == 6) {
            loff_t io = off, oo = off;
            for (size_t left = len; left;) {
              ssize_t got = copy_file_range(ofd[i], &io, dfd[i], &oo, left, 0);
              if (got <= 0) { perror("copy_file_range"); return 1; }
              left -= got;
            }
          } else {
            memcpy(dst[i] + off, from + off, len);
          }
          double b = now();
          read_back(dst[i] + off, len);
          c += b - a; h += now() - b;
        }
        if (m == 5 || m == 8) munmap(from, n);
        tt[k] = now() - a0; tc[k] = c; th[k] = h;
        if (memcmp(dst[i], kept[i], n)) { fprintf(stderr, "%s: copy differs\n", names[m]); return 1; }
      }
    qsort(tc, k, sizeof(double), cmp); qsort(th, k, sizeof(double), cmp); qsort(tt, k, sizeof(double), cmp);
    printf("%zu B %-14s copy %.3f ms, read back %.3f ms (%.3f ns/B), both %.3f ms\n", n, names[m],
           tc[k / 2] * 1e3, th[k / 2] * 1e3, th[k / 2] * 1e9 / n, tt[k / 2] * 1e3);
  }
  kill(pid, SIGKILL);
  for (int i = 0; i < files; i++) { snprintf(path, sizeof path, "/dev/shm/floor-paths-o%d", i); unlink(path); }
  return 0;
}
