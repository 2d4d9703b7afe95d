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

int main(int argc, char **argv) {
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
