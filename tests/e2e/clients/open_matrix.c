/* What a program sees of its opens: the fd number, errno (set to a sentinel before each call,
 * so a successful open that changes it shows), the status and descriptor flags, the fstat fields
 * that do not depend on where the bytes come from, and a checksum of every byte read.
 *
 *   open_matrix matrix ROOT ITEM...   chdir(ROOT); ITEM is a path opened with each flag set, or
 *                                     "cd:DIR" (chdir there), or "at:DIR:NAME" (openat from a
 *                                     directory fd of DIR).
 *   open_matrix threads ROOT N ITEM...
 *                                     four threads each open, read whole and close every ITEM
 *                                     N times (close-on-exec) while a fifth forks children that
 *                                     exit at once: each item's outcome (bytes or errno), and
 *                                     how many outcomes differed from the item's first.
 *   open_matrix emfile ROOT WARM PATH PATH2
 *                                     the fd limit lowered to 64 and filled with /dev/null but
 *                                     for one slot, then PATH opened (WARM: a first open of PATH
 *                                     before the limit is lowered), then PATH2 with no slot
 *                                     free, then PATH again after a close.
 *
 * Every line is comparable between a direct run and a run under granary on the same tree. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#define SENTINEL 4321

static uint64_t digest(int fd, long *len) {
    uint64_t h = 1469598103934665603ull;
    char b[8192];
    ssize_t n;
    *len = 0;
    while ((n = read(fd, b, sizeof b)) > 0) {
        for (ssize_t i = 0; i < n; i++)
            h = (h ^ (unsigned char)b[i]) * 1099511628211ull;
        *len += n;
    }
    if (n < 0)
        *len = -errno;
    return h;
}

/* One open's outcome; `fd` and `e` as the call left them. The fd is closed unless `keep`. */
static void report_keep(const char *what, int fd, int e, int keep) {
    printf("%s -> fd %d errno %d", what, fd, fd < 0 ? e : (e == SENTINEL ? 0 : -e));
    if (fd >= 0) {
        struct stat st;
        int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
        if (fstat(fd, &st) != 0) {
            printf(" fstat-errno %d\n", errno);
            if (!keep)
                close(fd);
            return;
        }
        long len;
        uint64_t h = digest(fd, &len);
        printf(" fl %o fd_fl %d mode %o size %lld ino %llu nlink %lu uid %u mtime %lld.%09ld"
               " read %ld %016llx",
               fl & ~0100000, fdfl, st.st_mode, (long long)st.st_size,
               (unsigned long long)st.st_ino, (unsigned long)st.st_nlink, st.st_uid,
               (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec, len, (unsigned long long)h);
        if (!keep)
            close(fd);
    }
    printf("\n");
}

static void report(const char *what, int fd, int e) { report_keep(what, fd, e, 0); }

static const struct {
    const char *name;
    int flags;
} FLAGS[] = {
    {"rc", O_RDONLY | O_CLOEXEC},
    {"r", O_RDONLY},
    {"rcn", O_RDONLY | O_CLOEXEC | O_NONBLOCK},
    {"rcf", O_RDONLY | O_CLOEXEC | O_NOFOLLOW},
};

static int matrix(int argc, char **argv) {
    for (int i = 3; i < argc; i++) {
        const char *item = argv[i];
        char what[4200];
        if (strncmp(item, "cd:", 3) == 0) {
            printf("%s -> %d\n", item, chdir(item + 3) == 0 ? 0 : errno);
            continue;
        }
        for (size_t f = 0; f < sizeof FLAGS / sizeof FLAGS[0]; f++) {
            int fd, e;
            if (strncmp(item, "at:", 3) == 0) {
                char dir[4096];
                const char *name = strchr(item + 3, ':');
                if (!name)
                    return 2;
                snprintf(dir, sizeof dir, "%.*s", (int)(name - item - 3), item + 3);
                int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
                errno = SENTINEL;
                fd = openat(d, name + 1, FLAGS[f].flags);
                e = errno;
                if (d >= 0)
                    close(d);
            } else {
                errno = SENTINEL;
                fd = open(item, FLAGS[f].flags);
                e = errno;
            }
            snprintf(what, sizeof what, "%s %s", item, FLAGS[f].name);
            report(what, fd, e);
        }
    }
    return 0;
}

static int emfile(char **argv) {
    const char *path = argv[4], *path2 = argv[5];
    if (atoi(argv[3])) {
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        report("warm", fd, fd < 0 ? errno : SENTINEL);
    }
    struct rlimit lim;
    getrlimit(RLIMIT_NOFILE, &lim);
    lim.rlim_cur = 64;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0)
        return 3;
    static int fill[64];
    int n = 0;
    for (;;) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            break;
        fill[n++] = fd;
    }
    printf("filled %d, then errno %d\n", n, errno);
    /* One slot free. */
    int freed = fill[--n];
    close(freed);
    errno = SENTINEL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    int e = errno;
    printf("one slot: fd %s ", fd == freed ? "=freed" : fd < 0 ? "-1" : "other");
    report_keep(path, fd, e, 1);
    if (fd >= 0) {
        /* None free: */
        errno = SENTINEL;
        int fd2 = open(path2, O_RDONLY | O_CLOEXEC);
        e = errno;
        report("no slot", fd2, e);
        close(fd);
    }
    errno = SENTINEL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    e = errno;
    printf("again: fd %s ", fd == freed ? "=freed" : fd < 0 ? "-1" : "other");
    report(path, fd, e);
    return 0;
}

#define MAX_ITEMS 64
static int n_items, rounds;
static char **items;
static atomic_ullong first[MAX_ITEMS];
static atomic_int differed, stop;

static unsigned long long outcome(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return (unsigned long long)errno;
    long len;
    uint64_t h = digest(fd, &len);
    close(fd);
    return (h ^ (uint64_t)len) | 1ull << 63;
}

static void *opener(void *arg) {
    long t = (long)arg;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n_items; i++) {
            int k = (i + (int)t * 7) % n_items;
            unsigned long long o = outcome(items[k]), none = 0;
            if (!atomic_compare_exchange_strong(&first[k], &none, o) && none != o)
                atomic_fetch_add(&differed, 1);
        }
    return NULL;
}

static void *forker(void *arg) {
    (void)arg;
    while (!atomic_load(&stop)) {
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        if (pid > 0)
            waitpid(pid, NULL, 0);
    }
    return NULL;
}

static int threads(int argc, char **argv) {
    rounds = atoi(argv[3]);
    items = argv + 4;
    n_items = argc - 4;
    if (n_items > MAX_ITEMS)
        return 2;
    pthread_t t[4], f;
    pthread_create(&f, NULL, forker, NULL);
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, opener, (void *)i);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(f, NULL);
    for (int i = 0; i < n_items; i++) {
        unsigned long long o = atomic_load(&first[i]);
        if (o >> 63)
            printf("%s %016llx\n", items[i], o);
        else
            printf("%s errno %llu\n", items[i], o);
    }
    printf("differed %d\n", atomic_load(&differed));
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3 || chdir(argv[2]) != 0)
        return 2;
    if (strcmp(argv[1], "matrix") == 0)
        return matrix(argc, argv);
    if (strcmp(argv[1], "threads") == 0 && argc > 4)
        return threads(argc, argv);
    if (strcmp(argv[1], "emfile") == 0 && argc == 6)
        return emfile(argv);
    return 2;
}
