/* Children made every way a process can be made, each using granary's answers in its own
 * process: the library caches its pid (docs/reliability.md, "Children and the pid"), and a child
 * that reads the parent's cached pid would write a stat answer into its parent's memory, or
 * rewrite its parent's fd table when it closes an inherited fd.
 *
 *   children_pid FILE     (FILE: a placed file of the dataset)
 *
 * Each child stats FILE into a buffer the parent filled with a pattern, closes an fd on FILE it
 * inherited, and reports whether its buffer holds FILE's inode; afterwards the parent checks its
 * own copy of the buffer is untouched (a fork child's memory is its own) and that its fd still
 * describes FILE. Prints one line per way; the same lines without granary. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *file;
static struct stat want;
static struct stat buf;
static int fd;
static char stack[1 << 16];

/* What a child does: 0 if its own stat answer is right. */
static int child_work(void) {
    memset(&buf, 0xA5, sizeof buf);
    if (stat(file, &buf) != 0) return 2;
    close(fd);
    return buf.st_ino == want.st_ino && buf.st_size == want.st_size ? 0 : 1;
}

static int clone_fn(void *arg) {
    (void)arg;
    return child_work();
}

static void parent_check(const char *way, pid_t pid, int shares_memory) {
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, __WALL) != pid) {
        printf("%s: could not start (%s)\n", way, pid < 0 ? "fork failed" : "wait failed");
        return;
    }
    struct stat fst, pattern;
    memset(&pattern, 0xA5, sizeof pattern);
    int untouched = shares_memory || memcmp(&buf, &pattern, sizeof buf) == 0;
    int fstat_ok = fstat(fd, &fst) == 0 && fst.st_ino == want.st_ino && fst.st_dev == want.st_dev;
    printf("%s: child's answer right %d, parent's buffer untouched %d, parent's fd is the file %d\n",
           way, WIFEXITED(st) && WEXITSTATUS(st) == 0, untouched, fstat_ok);
    close(fd);
}

static void fresh(void) {
    fd = open(file, O_RDONLY | O_CLOEXEC);
    char c;
    if (fd < 0 || read(fd, &c, 1) != 1) {
        perror(file);
        exit(3);
    }
    memset(&buf, 0xA5, sizeof buf);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    file = argv[1];
    if (stat(file, &want) != 0) return 3;
    pid_t pid;

    fresh();
    pid = fork();
    if (pid == 0) _exit(child_work());
    parent_check("fork", pid, 0);

    /* No atfork handler runs: only the kernel tells the child it is another process. */
    fresh();
    pid = syscall(SYS_fork);
    if (pid == 0) _exit(child_work());
    parent_check("fork system call", pid, 0);

    fresh();
    pid = clone(clone_fn, stack + sizeof stack, SIGCHLD, NULL);
    parent_check("clone without CLONE_VM", pid, 0);

    fresh();
    pid = vfork();
    if (pid == 0) _exit(child_work());
    parent_check("vfork", pid, 1);

    fresh();
    pid = clone(clone_fn, stack + sizeof stack, CLONE_VM | CLONE_VFORK | SIGCHLD, NULL);
    parent_check("clone with CLONE_VM", pid, 1);

    /* After a memory-sharing child, the parent's own answers. */
    fresh();
    pid = fork();
    if (pid == 0) _exit(child_work());
    parent_check("fork after them", pid, 0);
    struct stat again;
    printf("parent's stat right %d\n", stat(file, &again) == 0 && again.st_ino == want.st_ino);
    return 0;
}
