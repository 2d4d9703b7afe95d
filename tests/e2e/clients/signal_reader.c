/* Reads the files ROOT/fNNNN.bin (N files, each at most 4 KiB), PASSES times over, while a
 * SIGALRM handler, run every 20 microseconds, reads the file being read too (its own read(2) of
 * the same fd, at the shared offset).
 *
 * Each file is opened close-on-exec (nobody else shares the fd), then read with a buffer larger
 * than the file until read returns 0, then closed. Every read that returns bytes, the main
 * loop's or the handler's, appends them to the file's record in the order they were made: as
 * each continues at the fd's offset, the record is the file's bytes exactly once, whenever the
 * handler ran. A handler run that falls inside the main loop's first read of a file exercises
 * what a library interposing read(2) does when re-entered on an fd it is working on: it must
 * neither wait for itself nor give bytes twice.
 *
 * Prints {"files": N, "passes": PASSES, "wrong": records that are not their file's size,
 * "digest": FNV-1a 64 of every record in order}; on stderr, how many handler reads returned
 * bytes (timing-dependent). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#define MAX_FILE 4096
#define BUF 16384

static volatile sig_atomic_t cur = -1;
/* Set while the main loop appends to the record: the handler leaves the fd alone then. */
static volatile sig_atomic_t appending;
static char record[4 * MAX_FILE];
static volatile size_t record_n;
static volatile unsigned long handler_reads, handler_bytes;

static void append(const char *b, size_t n) {
    if (record_n + n > sizeof record)
        n = sizeof record - record_n;
    memcpy(record + record_n, b, n);
    record_n += n;
}

static void on_alarm(int sig) {
    (void)sig;
    int fd = cur;
    if (fd < 0 || appending)
        return;
    int saved = errno;
    char b[BUF];
    ssize_t n = read(fd, b, sizeof b);
    handler_reads++;
    if (n > 0) {
        append(b, (size_t)n);
        handler_bytes += (unsigned long)n;
    }
    errno = saved;
}

static uint64_t fnv(uint64_t h, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s ROOT N PASSES\n", argv[0]);
        return 2;
    }
    const char *root = argv[1];
    int n = atoi(argv[2]), passes = atoi(argv[3]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval it = {{0, 20}, {0, 20}};
    setitimer(ITIMER_REAL, &it, NULL);
    uint64_t digest = 0xcbf29ce484222325ULL;
    int wrong = 0;
    static char buf[BUF];
    char path[4096];
    for (int p = 0; p < passes; p++) {
        for (int i = 0; i < n; i++) {
            snprintf(path, sizeof path, "%s/f%04d.bin", root, i);
            record_n = 0;
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                perror(path);
                return 1;
            }
            cur = fd;
            for (;;) {
                ssize_t got = read(fd, buf, sizeof buf);
                if (got < 0 && errno == EINTR)
                    continue;
                if (got < 0) {
                    perror("read");
                    return 1;
                }
                if (got == 0)
                    break;
                appending = 1;
                append(buf, (size_t)got);
                appending = 0;
            }
            cur = -1;
            /* After the reads: an fstat first would check the copy before its first read. */
            struct stat st;
            if (fstat(fd, &st) != 0) {
                perror("fstat");
                return 1;
            }
            close(fd);
            if (record_n != (size_t)st.st_size)
                wrong++;
            digest = fnv(digest, record, record_n);
        }
    }
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
    printf("{\"files\": %d, \"passes\": %d, \"wrong\": %d, \"digest\": \"%016llx\"}\n", n, passes,
           wrong, (unsigned long long)digest);
    fprintf(stderr, "handler reads: %lu, with bytes: %lu bytes\n", handler_reads, handler_bytes);
    return 0;
}
