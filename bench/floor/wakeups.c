// What a thread's wake-up costs in CPU (docs/cluster.md, "MPI in one thread"): a nap that ends
// by itself (a futex wait with a timeout that expires, as a communication thread polling MPI
// naps), against a sleep another thread ends (a futex ping-pong: two sleeps, two wakes), a
// timed sleep another thread ends first, and what the waker pays to wake a thread whose core
// has gone idle meanwhile (as an agent wakes a program that sleeps until its copy is published:
// on a VM whose idle cores halt, the wake is an interrupt the hypervisor delivers). CPU from
// getrusage(RUSAGE_THREAD) and CLOCK_THREAD_CPUTIME_ID.
//   cc -O2 -pthread -o wakeups wakeups.c && ./wakeups [nap_us]
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
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

static _Atomic int seen;
static int pinned;
static void pin(int core) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(core, &set);
    sched_setaffinity(0, sizeof set, &set);
}

static void *sleeper(void *arg) {
    int n = *(int *)arg;
    if (pinned) pin(1);
    for (int i = 1; i <= n; i++) {
        while (atomic_load(&word) < i) fx(FUTEX_WAIT_PRIVATE, i - 1, 0);
        atomic_store(&seen, i);
    }
    return 0;
}

static double thread_cpu_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void wake_idle(int on_another_core) {
    int n = 3000;
    pinned = on_another_core;
    if (pinned) pin(0);
    pthread_t t;
    atomic_store(&word, 0);
    atomic_store(&seen, 0);
    pthread_create(&t, 0, sleeper, &n);
    double spent = 0;
    const struct timespec idle = {0, 200000};
    for (int i = 1; i <= n; i++) {
        nanosleep(&idle, 0); // the sleeper's core goes idle
        atomic_store(&word, i);
        double c0 = thread_cpu_us();
        fx(FUTEX_WAKE_PRIVATE, 1, 0);
        spent += thread_cpu_us() - c0;
        while (atomic_load(&seen) < i) {
        }
    }
    pthread_join(t, 0);
    if (pinned) {
        cpu_set_t all;
        CPU_ZERO(&all);
        for (int c = 0; c < CPU_SETSIZE; c++) CPU_SET(c, &all);
        sched_setaffinity(0, sizeof all, &all);
    }
    printf("waking a sleeping thread%s: %.1f us CPU of the waker per wake\n",
           on_another_core ? " held on another core, idle meanwhile" : " (the scheduler picks its core)",
           spent / n);
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
    wake_idle(0);
    if (sysconf(_SC_NPROCESSORS_ONLN) > 1) wake_idle(1);
    printf("load average: ");
    fflush(stdout);
    return system("cut -d' ' -f1-3 /proc/loadavg") == 0 ? 0 : 1;
}
