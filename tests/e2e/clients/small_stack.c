/* A program whose signal handler runs on an alternate stack of 16 KiB with nothing mapped below
 * it (a guard page), as a runtime that handles SIGSEGV or SIGPROF on a small stack of its own
 * does, and calls there what granary interposes but passes through untouched: anonymous
 * mappings grown, moved and dropped (`mmap`, `mremap`, `munmap`), a message without fds on a
 * socket pair (`sendmsg`), an fd that is no file of the dataset read and closed. Prints what
 * each call returned: the same with and without granary, which must fit in the stack the
 * program gave its handler (a pass-through costs the caller a few hundred bytes, not pages).
 *
 *   small_stack FILE */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define ALT (16 * 1024)

static const char *file;
static char out[512];

static void on_usr1(int sig) {
    (void)sig;
    long page = sysconf(_SC_PAGESIZE);
    char *m = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int mapped = m != MAP_FAILED;
    if (mapped)
        m[0] = 7;
    char *g = mapped ? mremap(m, page, 64 * page, MREMAP_MAYMOVE) : MAP_FAILED;
    int grown = g != MAP_FAILED && g[0] == 7;
    int unmapped = g != MAP_FAILED && munmap(g, 64 * page) == 0;
    int sv[2], sent = -1;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0) {
        char b[5] = "hello";
        struct iovec iov = {b, sizeof b};
        struct msghdr msg = {0};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        sent = (int)sendmsg(sv[0], &msg, 0);
        close(sv[0]);
        close(sv[1]);
    }
    int fd = open("/dev/zero", O_RDONLY);
    char z[16];
    ssize_t got = fd >= 0 ? read(fd, z, sizeof z) : -1;
    int closed = fd >= 0 && close(fd) == 0;
    snprintf(out, sizeof out,
             "{\"mapped\": %d, \"grown\": %d, \"unmapped\": %d, \"sent\": %d, \"read\": %zd, "
             "\"closed\": %d}",
             mapped, grown, unmapped, sent, got, closed);
}

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    file = argv[1];
    /* The program has a dataset file open and mapped, so granary's hooks are awake. */
    int fd = open(file, O_RDONLY);
    char c;
    if (fd < 0 || read(fd, &c, 1) != 1)
        return 3;
    long page = sysconf(_SC_PAGESIZE);
    char *region = mmap(NULL, page + ALT, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED || mprotect(region, page, PROT_NONE) != 0)
        return 4;
    stack_t ss = {.ss_sp = region + page, .ss_size = ALT, .ss_flags = 0};
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    if (sigaltstack(&ss, NULL) != 0 || sigaction(SIGUSR1, &sa, NULL) != 0)
        return 5;
    raise(SIGUSR1);
    close(fd);
    puts(out);
    return 0;
}
