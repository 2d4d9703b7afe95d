// What a thread's wake-up costs in CPU (docs/cluster.md, "MPI in one thread"): a nap that ends
// by itself (a futex wait with a timeout that expires, as a communication thread polling MPI
// naps), against a sleep another thread ends (a futex ping-pong: two sleeps, two wakes), and a
// timed sleep another thread ends first. CPU from getrusage(RUSAGE_THREAD).
//   cc -O2 -pthread -o wakeups wakeups.c && ./wakeups [nap_us]
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static _Atomic int word;
static long fx(int op, int val, const struct timespec *ts) {
    return syscall(SYS_futex, &word, op, val, ts, 0, 0);
}
static double cpu(void) {
    struct rusage r;
    getrusage(RUSAGE_THREAD, &r);
    return r.ru_utime.tv_sec + r.ru_stime.tv_sec + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6;
}

#define ROUNDS 20000
static const struct timespec LONG = {0, 1000000};
static int timed;
static double partner_cpu;

static void *partner(void *arg) {
    (void)arg;
    double c0 = cpu();
    for (int i = 0; i < ROUNDS; i++) {
        while (atomic_load(&word) != 1) fx(FUTEX_WAIT_PRIVATE, 0, timed ? &LONG : 0);
        atomic_store(&word, 0);
        fx(FUTEX_WAKE_PRIVATE, 1, 0);
    }
    partner_cpu = cpu() - c0;
    return 0;
}

static void ping_pong(int with_timeout) {
    pthread_t t;
    timed = with_timeout;
    atomic_store(&word, 0);
    pthread_create(&t, 0, partner, 0);
    for (int i = 0; i < ROUNDS; i++) {
        atomic_store(&word, 1);
        fx(FUTEX_WAKE_PRIVATE, 1, 0);
        while (atomic_load(&word) != 0) fx(FUTEX_WAIT_PRIVATE, 1, 0);
    }
    pthread_join(t, 0);
    printf("a sleep another thread ends%s: %.1f us CPU per wake-up (sleep, woken, wake the other)\n",
           with_timeout ? " (its 1 ms timeout armed)" : "", partner_cpu / ROUNDS * 1e6);
}

int main(int argc, char **argv) {
    long us = argc > 1 ? atol(argv[1]) : 100;
    struct timespec nap = {us / 1000000, (us % 1000000) * 1000};
    int n = 3000;
    atomic_store(&word, 0);
    double c0 = cpu();
    for (int i = 0; i < n; i++) fx(FUTEX_WAIT_PRIVATE, 0, &nap);
    printf("a nap of %ld us that ends by itself: %.1f us CPU per wake-up\n", us, (cpu() - c0) / n * 1e6);
    ping_pong(0);
    ping_pong(1);
    printf("load average: ");
    fflush(stdout);
    return system("cut -d' ' -f1-3 /proc/loadavg") == 0 ? 0 : 1;
}
