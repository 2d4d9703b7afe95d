/* A program with its own SIGSEGV handler, as a JVM or a garbage collector has: it reads a file
 * through a mapping while it deliberately faults on pages of its own (a guard page it opens up
 * in its handler, the way a JVM's safepoint polls and write barriers work) and recovers from a
 * NULL dereference (an implicit null check). Prints what it read and how many faults its handler
 * saw: the same with and without granary, since granary's own mappings never fault.
 *
 *   segv_handler FILE */
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static char *guard;
static long page;
static volatile int guard_faults, null_faults;
static sigjmp_buf null_jump;

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)uc;
    char *at = si->si_addr;
    if (at >= guard && at < guard + 4 * page) {
        guard_faults++;
        mprotect(guard, 4 * page, PROT_READ | PROT_WRITE);
        return; /* the faulting access is retried and succeeds */
    }
    if ((uintptr_t)at < (uintptr_t)page) {
        null_faults++;
        siglongjmp(null_jump, 1);
    }
    /* Not ours: die of it, as without a handler. */
    signal(SIGSEGV, SIG_DFL);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    page = sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    guard = mmap(NULL, 4 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return 3;
    const unsigned char *m = mmap(NULL, st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return 4;
    uint64_t h = 1469598103934665603ULL; /* FNV-1a over every byte */
    for (off_t i = 0; i < st.st_size; i++) {
        h = (h ^ m[i]) * 1099511628211ULL;
        if (i % (1 << 20) == 0) {
            /* A guard-page fault its handler resolves, then closes again. */
            guard[(i >> 20) % (4 * page)] = 1;
            mprotect(guard, 4 * page, PROT_NONE);
            if (sigsetjmp(null_jump, 1) == 0) {
                volatile int *nul = NULL;
                (void)*nul;
            }
        }
    }
    printf("{\"fnv\": \"%016llx\", \"guard_faults\": %d, \"null_faults\": %d}\n",
           (unsigned long long)h, guard_faults, null_faults);
    return 0;
}
