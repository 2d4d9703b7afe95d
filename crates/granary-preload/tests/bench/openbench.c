/* Per-call cost of open+read+close (or open+close) of one path, for comparing runs with and
 * without LD_PRELOAD=libgranary_preload.so. Usage: openbench read|open PATH ITERATIONS
 * Prints wall-clock ns per call, bytes read, and the process's CPU ns per call (which a busy
 * machine inflates far less than the wall clock). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char buf[1 << 17];

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    int do_read = strcmp(argv[1], "read") == 0;
    long n = atol(argv[3]);
    long long bytes = 0;
    struct timespec a, b, ca, cb;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ca);
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        int fd = open(argv[2], O_RDONLY | O_CLOEXEC);
        if (fd < 0) { perror("open"); return 1; }
        if (do_read) {
            ssize_t r;
            while ((r = read(fd, buf, sizeof buf)) > 0) bytes += r;
        }
        close(fd);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cb);
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    double cpu = (cb.tv_sec - ca.tv_sec) * 1e9 + (cb.tv_nsec - ca.tv_nsec);
    printf("%.1f ns/call %lld bytes %.1f cpu-ns/call\n", ns / n, bytes, cpu / n);
    return 0;
}
