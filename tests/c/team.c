/* cypool's thread team (cypool/_kernels/_team.h) against what the kernels'
 * parallel blocks need of an OpenMP runtime: every thread number of a
 * region runs exactly once, with omp_get_num_threads() the region's size,
 * and the region returns only after all of them finished. And what it is
 * for: a team thread that cannot run does not hold the region's end, its
 * thread number runs on the calling thread, and one preempted in the
 * middle of its work moves onto the calling thread's CPU.
 *
 * Built with gcc -fopenmp -pthread, so that the `#pragma omp parallel`
 * blocks below call _team.h's GOMP_parallel as the kernels' blocks do.
 * Prints "team: ok (0 bad)" when every check passes. */
#define _GNU_SOURCE
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#define CYPOOL_TEAM_HANDOFF 0 /* the sanitizers cannot see into libgomp */
#include "_team.h"

#if !CYPOOL_OWN_TEAM
int main(void) {
    printf("team: ok (0 bad) (not built: needs gcc -fopenmp on Linux)\n");
    return 0;
}
#else
#define MAXN 16
static int bad = 0;
#define CHECK(cond, ...) do { if (!(cond)) { bad++; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

/* Each region records which thread numbers ran, on which thread, and the
 * team size each saw. */
static int ran[MAXN], sizes[MAXN];
static pthread_t who[MAXN];

static void clear(void) {
    memset(ran, 0, sizeof ran);
    memset(sizes, 0, sizeof sizes);
}

static void region(int n, int work_ns) {
    clear();
#pragma omp parallel num_threads(n)
    {
        int t = omp_get_thread_num();
        __atomic_add_fetch(&ran[t], 1, __ATOMIC_RELAXED);
        sizes[t] = omp_get_num_threads();
        who[t] = pthread_self();
        if (work_ns > 0) {
            struct timespec d = {0, work_ns};
            nanosleep(&d, NULL);
        }
    }
}

static void check_region(int n, const char* what) {
    for (int t = 0; t < MAXN; t++) {
        int want = t < n ? 1 : 0;
        CHECK(ran[t] == want, "%s: n=%d thread number %d ran %d times", what, n, t, ran[t]);
        if (t < n)
            CHECK(sizes[t] == n, "%s: n=%d thread number %d saw %d threads", what, n, t, sizes[t]);
    }
}

/* Many regions, of every size, some with work that lets the team threads
 * take part and some too short for them to. */
static void test_every_thread_number_once(void) {
    for (int i = 0; i < 20000; i++) {
        int n = 1 + i % 5;
        region(n, i % 7 == 0 ? 20000 : 0);
        check_region(n, "repeat");
        if (bad) return;
    }
    CHECK(omp_get_thread_num() == 0 && omp_get_num_threads() == 1,
          "outside a region: thread %d of %d", omp_get_thread_num(), omp_get_num_threads());
}

/* Two threads open regions at once: one gets the team, the other runs its
 * thread numbers itself; both see each one once. */
static void* opener(void* arg) {
    int* fails = (int*)arg;
    for (int i = 0; i < 5000; i++) {
        int count[4] = {0, 0, 0, 0};
#pragma omp parallel num_threads(4)
        {
            __atomic_add_fetch(&count[omp_get_thread_num()], 1, __ATOMIC_RELAXED);
            if (omp_get_num_threads() != 4) __atomic_add_fetch(fails, 1, __ATOMIC_RELAXED);
        }
        for (int t = 0; t < 4; t++)
            if (count[t] != 1) __atomic_add_fetch(fails, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void test_concurrent_regions(void) {
    int fails = 0;
    pthread_t a, b;
    pthread_create(&a, NULL, opener, &fails);
    pthread_create(&b, NULL, opener, &fails);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    CHECK(fails == 0, "concurrent regions: %d wrong thread numbers or team sizes", fails);
}

/* A team thread held in a signal handler cannot take a thread number: the
 * region still finishes, with that number run by the calling thread, long
 * before the team thread is let go. */
static sem_t hold, held;
static void stop_here(int sig) {
    (void)sig;
    sem_post(&held);
    while (sem_wait(&hold) != 0) {}
}

static void test_late_thread_does_not_hold_the_region(void) {
    pthread_t self = pthread_self(), member;
    int found = 0;
    sem_init(&hold, 0, 0);
    sem_init(&held, 0, 0);
    signal(SIGUSR1, stop_here);
    /* Find a team thread: a region long enough for it to join. */
    for (int i = 0; i < 200 && !found; i++) {
        region(2, 2000000);
        if (ran[1] == 1 && !pthread_equal(who[1], self)) {
            member = who[1];
            found = 1;
        }
    }
    CHECK(found, "no team thread ever took part in a 2 ms region");
    if (!found) return;
    pthread_kill(member, SIGUSR1);
    while (sem_wait(&held) != 0) {}
    int64_t t0 = cypool_team_now();
    for (int i = 0; i < 10; i++) {
        region(2, 100000);
        check_region(2, "team thread held");
        CHECK(pthread_equal(who[1], self), "thread number 1 ran on a held team thread");
    }
    int64_t took = cypool_team_now() - t0;
    CHECK(took < 1000000000, "10 regions took %.0f ms with a team thread held", took / 1e6);
    sem_post(&hold);
    /* Let go, the team thread takes part again. */
    found = 0;
    for (int i = 0; i < 200 && !found; i++) {
        region(2, 2000000);
        check_region(2, "after the hold");
        found = ran[1] == 1 && !pthread_equal(who[1], self);
    }
    CHECK(found, "the team thread never took part again after the hold");
}

/* A team thread preempted in the middle of its work: it shares CPU a with
 * a spinning thread (as it would with another library's spinning worker),
 * the calling thread runs on CPU b and has no work left. The calling
 * thread moves it onto CPU b, where it runs alone (its 30 ms of work take
 * about 30 ms, not the 60 ms of half a CPU; bench_mixed.py measures that):
 * the team's count of moves must grow. */
static int hog_stop;
static int hog_cpu, caller_cpu_for_test;

static void pin(pid_t tid, int cpu) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    sched_setaffinity(tid, sizeof one, &one);
}

static void* hog(void* arg) {
    (void)arg;
    pin(0, hog_cpu);
    while (!__atomic_load_n(&hog_stop, __ATOMIC_RELAXED))
        cypool_team_relax();
    return NULL;
}

static int64_t thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void test_preempted_thread_moves_to_the_calling_cpu(void) {
    pthread_t self = pthread_self(), h;
    cpu_set_t mine;
    uint64_t c0[8], c1[8];
    int64_t took = 0;
    int tries;
    if (sched_getaffinity(0, sizeof mine, &mine) != 0 || CPU_COUNT(&mine) < 2) {
        printf("team: preempted-thread check skipped (needs 2 CPUs)\n");
        return;
    }
    hog_cpu = -1;
    caller_cpu_for_test = -1;
    for (int c = 0; c < CPU_SETSIZE && caller_cpu_for_test < 0; c++)
        if (CPU_ISSET(c, &mine)) {
            if (hog_cpu < 0) hog_cpu = c;
            else caller_cpu_for_test = c;
        }
    pin(0, caller_cpu_for_test);
    __atomic_store_n(&hog_stop, 0, __ATOMIC_RELAXED);
    pthread_create(&h, NULL, hog, NULL);
    cypool_team_counts(c0);
    for (tries = 0; tries < 20; tries++) {
        int on_team = 0, pinned = 0;
        int64_t t0 = cypool_team_now();
#pragma omp parallel num_threads(2)
        {
            if (omp_get_thread_num() == 1 && !pthread_equal(pthread_self(), self)) {
                on_team = 1;
                pin(0, hog_cpu);
                __atomic_store_n(&pinned, 1, __ATOMIC_SEQ_CST);
                int64_t c = thread_cpu_ns();
                while (thread_cpu_ns() - c < 30000000) {}
            } else if (omp_get_thread_num() == 0) {
                /* Until the team thread has pinned itself (a move before
                 * that would be undone by its own pin). */
                int64_t s = cypool_team_now();
                while (!__atomic_load_n(&pinned, __ATOMIC_SEQ_CST) && cypool_team_now() - s < 100000000) {}
                t0 = cypool_team_now();
            }
        }
        took = cypool_team_now() - t0;
        if (on_team)
            break;
    }
    cypool_team_counts(c1);
    __atomic_store_n(&hog_stop, 1, __ATOMIC_RELAXED);
    pthread_join(h, NULL);
    sched_setaffinity(0, sizeof mine, &mine);
    CHECK(tries < 20, "no team thread took thread number 1 in 20 regions");
    CHECK(c1[5] > c0[5], "the preempted team thread was not moved (pulled %llu)",
          (unsigned long long)(c1[5] - c0[5]));
    /* Whether it ran alone there is a matter of time, which a loaded
     * machine stretches: the count above is the check, this a hang guard. */
    CHECK(took < 1000000000, "30 ms of work on a shared CPU took %.1f ms", took / 1e6);
    /* Its mask back to the process's for the checks that follow. */
    for (tries = 0; tries < 200; tries++) {
        int on_team = 0;
#pragma omp parallel num_threads(2)
        {
            if (omp_get_thread_num() == 1 && !pthread_equal(pthread_self(), self)) {
                sched_setaffinity(0, sizeof mine, &mine);
                on_team = 1;
            } else if (omp_get_thread_num() == 0) {
                struct timespec d = {0, 1000000};
                nanosleep(&d, NULL);
            }
        }
        if (on_team)
            break;
    }
}

/* A child process has no team threads of its parent: its regions start
 * their own. */
static void test_fork(void) {
    region(3, 100000);
    pid_t pid = fork();
    if (pid == 0) {
        int child_bad = 0;
        for (int i = 0; i < 200; i++) {
            region(3, i % 2 ? 100000 : 0);
            for (int t = 0; t < 3; t++)
                child_bad += ran[t] != 1 || sizes[t] != 3;
        }
        _exit(child_bad ? 1 : 0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "regions in a forked child went wrong");
}

int main(void) {
    /* First, while the team has one thread: it is the one held. */
    test_late_thread_does_not_hold_the_region();
    test_preempted_thread_moves_to_the_calling_cpu();
    test_every_thread_number_once();
    test_concurrent_regions();
    test_fork();
    printf("team: ok (%d bad)\n", bad);
    return bad != 0;
}
#endif
