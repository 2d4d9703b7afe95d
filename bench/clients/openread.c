/* The small-file reader: open, read to the end, close every file of a list, in passes,
 * split between forked workers (a DataLoader's fork pool, or one reader with --workers 1).
 *
 *   openread LIST PASSES WORKERS
 *
 * The workers are forked once and stay; each pass the parent tells every worker to go, and each
 * worker reads its share (file i goes to worker i % WORKERS) and reports its elapsed time. The
 * timed passes come first (so the first is a job's first look at the files) and only read; one
 * more pass, not timed, reads every file through a checksum (the digest printed must be the
 * same with and without granary). Prints one JSON object:
 *   {"files": N, "digest": "...", "passes": [per-file µs of each timed pass, ...]}
 * where a pass's per-file time is the mean over workers of (its elapsed time / its files): what
 * one open+read+close costs a worker while the others run beside it.
 * Exits 3 when a file cannot be opened or read. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char **paths;
static size_t npaths;
static char buf[1 << 18];

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void load(const char *list) {
    FILE *f = fopen(list, "r");
    if (!f) { perror(list); exit(2); }
    size_t cap = 1024;
    paths = malloc(cap * sizeof *paths);
    char *line = NULL;
    size_t n = 0;
    ssize_t len;
    while ((len = getline(&line, &n, f)) > 0) {
        if (line[len - 1] == '\n') line[--len] = 0;
        if (!len) continue;
        if (npaths == cap) paths = realloc(paths, (cap *= 2) * sizeof *paths);
        paths[npaths++] = strdup(line);
    }
    free(line);
    fclose(f);
}

/* One pass over this worker's share; the checksum (FNV-1a over 8-byte words, order-independent
 * across files by summing per-file hashes) only when asked. */
static uint64_t pass(unsigned w, unsigned workers, int check) {
    uint64_t sum = 0;
    for (size_t i = w; i < npaths; i += workers) {
        int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
        if (fd < 0) { perror(paths[i]); _exit(3); }
        uint64_t h = 1469598103934665603ull;
        ssize_t r;
        while ((r = read(fd, buf, sizeof buf)) > 0) {
            if (check)
                for (ssize_t k = 0; k < r; k++) h = (h ^ (unsigned char)buf[k]) * 1099511628211ull;
        }
        if (r < 0) { perror(paths[i]); _exit(3); }
        close(fd);
        sum += h;
    }
    return sum;
}

static int full_read(int fd, void *p, size_t n) {
    char *c = p;
    while (n) {
        ssize_t r = read(fd, c, n);
        if (r <= 0) return -1;
        c += r;
        n -= r;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: openread LIST PASSES WORKERS\n"); return 2; }
    load(argv[1]);
    int passes = atoi(argv[2]);
    unsigned workers = atoi(argv[3]);
    if (workers < 1 || workers > 64 || passes < 1) return 2;
    int go[64][2], back[64][2];
    pid_t pids[64];
    for (unsigned w = 0; w < workers; w++) {
        if (pipe(go[w]) || pipe(back[w])) { perror("pipe"); return 2; }
        pids[w] = fork();
        if (pids[w] < 0) { perror("fork"); return 2; }
        if (pids[w] == 0) {
            char c;
            size_t mine = (npaths + workers - 1 - w) / workers;
            for (int p = 0; p <= passes; p++) {
                if (full_read(go[w][0], &c, 1)) _exit(2);
                double t = now();
                uint64_t s = pass(w, workers, p == passes);
                double out[2] = {(now() - t) / (mine ? mine : 1), 0};
                memcpy(&out[1], &s, sizeof s);
                if (write(back[w][1], out, sizeof out) != sizeof out) _exit(2);
            }
            _exit(0);
        }
    }
    uint64_t digest = 0;
    printf("{\"files\": %zu, \"workers\": %u, \"passes\": [", npaths, workers);
    for (int p = 0; p <= passes; p++) {
        for (unsigned w = 0; w < workers; w++)
            if (write(go[w][1], "g", 1) != 1) return 2;
        double per = 0;
        for (unsigned w = 0; w < workers; w++) {
            double out[2];
            if (full_read(back[w][0], out, sizeof out)) {
                fprintf(stderr, "worker %u failed\n", w);
                return 3;
            }
            per += out[0] / workers;
            if (p == passes) {
                uint64_t s;
                memcpy(&s, &out[1], sizeof s);
                digest += s;
            }
        }
        if (p < passes) printf("%s%.4f", p ? ", " : "", per * 1e6);
    }
    printf("], \"digest\": \"%016llx\"}\n", (unsigned long long)digest);
    int bad = 0;
    for (unsigned w = 0; w < workers; w++) {
        int st;
        waitpid(pids[w], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st);
    }
    return bad ? 3 : 0;
}
