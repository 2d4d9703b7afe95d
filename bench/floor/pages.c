// What a fresh copy's pages cost on a tmpfs (or any) directory, against reusing them: open,
// fallocate, a mapping's first write (one fault per page), unlink; pwrite into a fresh file and
// into an existing one; MAP_POPULATE of fallocated and of present pages.
//   cc -O2 -o pages pages.c && ./pages 2097152 /dev/shm
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    size_t n = atol(argv[1]); const char *dir = argv[2]; char p[512]; int reps = 20;
    double tf = 0, tw = 0, tu = 0, tp = 0, tpp = 0;
    for (int k = 0; k < reps; k++) {
        snprintf(p, sizeof p, "%s/pages-a%d", dir, k);
        int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
        double t0 = now();
        if (fallocate(fd, 0, 0, n)) perror("fallocate");
        double t1 = now();
        char *m = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        double t2 = now(); memset(m, 1, n); double t3 = now();
        munmap(m, n); close(fd); double t4 = now(); unlink(p); double t5 = now();
        tf += t1 - t0; tw += t3 - t2; tu += t5 - t4;
        fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600); fallocate(fd, 0, 0, n);
        t0 = now(); m = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0); t1 = now();
        munmap(m, n);
        t2 = now(); m = mmap(0, n, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0); t3 = now();
        munmap(m, n); close(fd); unlink(p);
        tp += t1 - t0; tpp += t3 - t2;
    }
    char *b = malloc(n); memset(b, 2, n); double tfresh = 0, treuse = 0;
    for (int k = 0; k < reps; k++) {
        snprintf(p, sizeof p, "%s/pages-b%d", dir, k);
        int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
        double t0 = now();
        if (pwrite(fd, b, n, 0) != (ssize_t)n) perror("pwrite");
        double t1 = now();
        if (pwrite(fd, b, n, 0) != (ssize_t)n) perror("pwrite");
        double t2 = now();
        close(fd); unlink(p); tfresh += t1 - t0; treuse += t2 - t1;
    }
    double s = n * (double)reps * 1e-9;
    printf("%s, %zu B: fallocate %.2f ns/B, first write through a mapping of it (faults) %.2f ns/B, "
           "unlink %.2f ns/B; MAP_POPULATE of fallocated pages %.2f ns/B, of present pages %.2f ns/B; "
           "pwrite into a new file %.2f ns/B, into existing pages %.2f ns/B\n",
           dir, n, tf / s, tw / s, tu / s, tp / s, tpp / s, tfresh / s, treuse / s);
    return 0;
}
