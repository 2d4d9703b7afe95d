/* A vfork child that closes an fd it inherited and opens another dataset file, close-on-exec,
 * gets that fd's number — in its own fd table, while it runs in its parent's memory. The parent's
 * fd must still be its own file: its fstat and bytes, before and after, printed for comparison
 * with a direct run. Twice: the parent's fd used before the vfork (checked), and not (its copy's
 * check still to come).
 *
 *   vfork_open A B
 *
 *   vfork_open A B leak   ten vfork children that close every fd (close_range) and exit, the
 *                         parent opening A after each: how many more fds the parent holds after
 *                         the ten than after the first (granary's directory fds included). */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void show(const char *what, int fd) {
    struct stat st;
    char b[1 << 16];
    uint64_t h = 1469598103934665603ull;
    if (fstat(fd, &st) != 0) {
        printf("%s: fstat failed\n", what);
        return;
    }
    ssize_t n = pread(fd, b, sizeof b, 0);
    for (ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)b[i]) * 1099511628211ull;
    printf("%s: mode %o size %lld ino %llu read %zd %016llx\n", what, st.st_mode,
           (long long)st.st_size, (unsigned long long)st.st_ino, n, (unsigned long long)h);
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    while (d && readdir(d))
        n++;
    if (d)
        closedir(d);
    return n;
}

static void spawn_and_read(const char *a) {
    pid_t pid = vfork();
    if (pid == 0) {
        close_range(3, ~0U, 0);
        _exit(0);
    }
    waitpid(pid, NULL, 0);
    char b[4096];
    int fd = open(a, O_RDONLY | O_CLOEXEC);
    while (read(fd, b, sizeof b) > 0) {
    }
    close(fd);
}

static uint64_t fnv(const char *b, ssize_t n) {
    uint64_t h = 1469598103934665603ull;
    for (ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)b[i]) * 1099511628211ull;
    return h;
}

/* A complete copy of `size` bytes somewhere in TIER/<dir>/objects. */
static int placed(const char *tier, off_t size) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "find '%s' -path '*/objects/*' -type f -size %lldc | grep -q .",
             tier, (long long)size);
    return system(cmd) == 0;
}

static int child_reads(char **argv) {
    static char got[4096], rest[4096];
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    fstat(fd, &st);
    ssize_t n0 = read(fd, rest, 10);
    int ok = 0;
    for (int i = 0; i < 400 && !(ok = placed(argv[3], st.st_size)); i++)
        usleep(50000);
    fprintf(stderr, "placed while open: %s\n", ok ? "yes" : "no");
    pid_t pid = vfork();
    if (pid == 0) {
        close(fd);
        int o = open(argv[2], O_RDONLY);
        ssize_t n = read(o, got, sizeof got);
        _exit(o != fd ? 255 : n != (ssize_t)sizeof got ? 254 : (int)(fnv(got, n) & 0x7f));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child read its own file: %d\n", WEXITSTATUS(status));
    ssize_t n = read(fd, rest, sizeof rest);
    printf("parent read %zd then %zd: %016llx\n", n0, n, (unsigned long long)fnv(rest, n));
    return 0;
}

static int child_dirfd(char **argv) {
    int d = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    pid_t pid = vfork();
    if (pid == 0) {
        close(d);
        int o = open(argv[2], O_RDONLY | O_DIRECTORY);
        struct stat a, b;
        char buf[1 << 16];
        int r = 0;
        if (fstatat(o, argv[3], &a, 0) != 0)
            r |= 1;
        int f = openat(o, argv[3], O_RDONLY | O_CLOEXEC);
        if (f < 0 || fstat(f, &b) != 0)
            r |= 2;
        ssize_t n = f >= 0 ? read(f, buf, sizeof buf) : -1;
        _exit(o != d ? 255 : r ? r : (int)((fnv(buf, n) ^ (uint64_t)a.st_size ^ b.st_ino) & 0x7f));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child through its own directory: %d\n", WEXITSTATUS(status));
    return 0;
}

static int child_inherits(char **argv) {
    int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
    int d = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct stat f0, d0;
    static char want[1 << 16], got[1 << 16];
    fstat(fd, &f0);
    fstat(d, &d0);
    ssize_t n0 = pread(fd, want, sizeof want, 0);
    pid_t pid = vfork();
    if (pid == 0) {
        struct stat f1, d1;
        int r = 0;
        if (fstat(fd, &f1) != 0 || f1.st_mode != f0.st_mode || f1.st_ino != f0.st_ino ||
            f1.st_size != f0.st_size || f1.st_dev != f0.st_dev)
            r |= 1;
        if (fstat(d, &d1) != 0 || d1.st_ino != d0.st_ino || d1.st_dev != d0.st_dev)
            r |= 2;
        if (pread(fd, got, sizeof got, 0) != n0 || memcmp(got, want, (size_t)n0) != 0)
            r |= 4;
        _exit(r);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    printf("child's view of the inherited fds: %d (0: as the parent's)\n", WEXITSTATUS(status));
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[4], "inherit") == 0)
        return child_inherits(argv);
    if (argc == 5 && strcmp(argv[4], "read") == 0)
        return child_reads(argv);
    if (argc == 5 && strcmp(argv[4], "dirfd") == 0)
        return child_dirfd(argv);
    if (argc == 4) {
        spawn_and_read(argv[1]);
        int first = open_fds();
        for (int i = 0; i < 10; i++)
            spawn_and_read(argv[1]);
        printf("fds grew by %d\n", open_fds() - first);
        return 0;
    }
    if (argc != 3)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int used = 1; used >= 0; used--) {
        int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
        if (used)
            show("parent's fd before", fd);
        pid_t pid = vfork();
        if (pid == 0) {
            close(fd);
            int c = open(argv[2], O_RDONLY | O_CLOEXEC);
            _exit(c == fd ? 0 : 1);
        }
        int status = 0;
        waitpid(pid, &status, 0);
        printf("used %d: the child's open got the parent's number: %s\n", used,
               WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "yes" : "no");
        show("parent's fd after", fd);
        int other = open(argv[2], O_RDONLY | O_CLOEXEC);
        printf("parent's next open: %d\n", other - fd);
        show("parent's next open", other);
        close(other);
        close(fd);
    }
    return 0;
}
