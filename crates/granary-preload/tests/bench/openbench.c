/* Per-call cost of open+read+close (or open+close) of one path, for comparing runs with and
 * without LD_PRELOAD=libgranary_preload.so. Usage: openbench read|open PATH ITERATIONS */
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
    struct timespec a, b;
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
    double ns = (b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec);
    printf("%.1f ns/call %lld bytes\n", ns / n, bytes);
    return 0;
}
