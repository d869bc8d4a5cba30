/* The calling thread's wait for its team (cypool_await_team in
 * cypool/_kernels/_omp_shim.h) against threads that arrive late: it returns
 * only once every one has arrived, at once when none is expected, and it
 * sleeps rather than spins while it waits, so that a late thread queued on
 * the caller's own CPU can run. The process is pinned to one CPU for the
 * last check, where a spinning wait would hold the CPU the late thread
 * needs. Built by tests/test_kernel_headers.py. Exits 1 on a failed check. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stddef.h>
typedef ptrdiff_t Py_ssize_t;
#include "_omp_shim.h"

struct late { int *arrived; int64_t delay_ns; int64_t arrived_ns; };

static void *arrive_late(void *arg) {
    struct late *l = arg;
    struct timespec nap = {l->delay_ns / 1000000000, l->delay_ns % 1000000000};
    nanosleep(&nap, NULL);
    l->arrived_ns = cypool_now_ns();
    cypool_team_arrive(l->arrived);
    return NULL;
}

static int64_t thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* n threads arrive after delay_ns each; the wait must end after the last
 * and spend less than half its time on the CPU. */
static int check(int n, int64_t delay_ns, const char *what) {
    int arrived = 0, bad = 0;
    pthread_t th[4];
    struct late l[4];
    int64_t opened = cypool_now_ns(), cpu0 = thread_cpu_ns();
    for (int i = 0; i < n; i++) {
        l[i] = (struct late){&arrived, delay_ns * (i + 1), 0};
        pthread_create(&th[i], NULL, arrive_late, &l[i]);
    }
    int slept = cypool_await_team(&arrived, n, opened);
    int64_t done = cypool_now_ns(), cpu = thread_cpu_ns() - cpu0;
    int seen = __atomic_load_n(&arrived, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        if (l[i].arrived_ns > done) bad = 1;  /* returned before thread i arrived */
    }
    if (seen != n) bad = 1;
    if (n > 0 && (slept == 0 || 2 * cpu > done - opened)) bad = 1;  /* spun */
    printf("%s: %d threads, waited %.2f ms, %.2f ms of it on the CPU, slept %d times%s\n",
           what, n, (done - opened) / 1e6, cpu / 1e6, slept, bad ? "  BAD" : "");
    return bad;
}

int main(void) {
    int bad = 0, none = 0;
    /* Nobody to wait for: returns at once without sleeping. */
    if (cypool_await_team(&none, 0, cypool_now_ns()) != 0) bad++;
    bad += check(1, 5000000, "one late thread");
    bad += check(3, 2000000, "three late threads");
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0)  /* new threads inherit it */
        bad += check(1, 1000000, "one late thread on the caller's CPU");
    printf("team_await: %s (%d bad)\n", bad ? "FAILED" : "ok", bad);
    return bad != 0;
}
