/* cypool's own thread team: the runtime behind the kernels' parallel blocks
 * in GCC builds on Linux.
 *
 * GCC compiles each `with nogil, parallel(num_threads=n)` block of the
 * kernels into a function fn(data) and a call GOMP_parallel(fn, data, n, 0)
 * that runs fn on n threads, each with its own omp_get_thread_num(). The
 * kernels' blocks have no barrier, no critical section and no worksharing
 * loop (the kernel modules import nothing else from libgomp): each thread
 * number's run of fn is independent of the others'. So each kernel module
 * defines GOMP_parallel, omp_get_thread_num and omp_get_num_threads itself,
 * hidden from every other module, and runs the thread numbers as tasks:
 *
 *   - the calling thread runs thread number 0, then every thread number no
 *     team thread has taken yet, then waits for the ones team threads took;
 *   - a team thread takes the next thread number when it wakes.
 *
 * With libgomp, the region's end waits for every team thread to arrive,
 * however little work is left for it. After another library's threads have
 * run, a team thread can wait a scheduler time slice (4-8 ms) for a CPU, and
 * the call waits with it (docs/performance.md, "Inside real programs"). Here
 * a late team thread's share runs on the calling thread instead; only a
 * team thread preempted in the middle of its share still holds the call.
 * The kernels claim their work a block at a time (_common.pxi, _claim), so
 * a late thread number finds none left.
 *
 * One region runs at a time per module: a call that finds the team busy
 * (another Python thread's call, or a call from inside a region) runs its
 * thread numbers one after another on its own thread. omp_get_max_threads
 * stays libgomp's, so OMP_NUM_THREADS and threadpoolctl's OpenMP limits
 * still set the kernels' default thread count. */
#ifndef CYPOOL_TEAM_H
#define CYPOOL_TEAM_H

#include <stdint.h>
#include <time.h>

#if defined(_OPENMP) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) \
    && !defined(CYPOOL_LIBGOMP_TEAM)
#define CYPOOL_OWN_TEAM 1
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>

#define CYPOOL_HIDDEN __attribute__((visibility("hidden")))

/* How long a team thread spins for the next region before it sleeps: a
 * kernel called again within it finds its team awake, and a team thread
 * sleeps soon enough not to take a CPU from another library's threads for
 * long. And how long the calling thread spins for team threads still
 * working before it sleeps: a team thread's last block of a memory-bound
 * pass can take 0.1-0.2 ms after the calling thread's, and waking the
 * calling thread from a sleep costs about as much again on a virtual
 * machine whose idle CPUs halt (with 50 us, bench_mixed's steady states
 * of the memory-bound kernels read 16-24% slower than with libgomp's
 * team; with 2 ms, the same; docs/performance.md). */
#define CYPOOL_TEAM_SPIN_NS 200000
#define CYPOOL_TEAM_WAIT_SPIN_NS 2000000
/* Thread numbers of a region are 12-bit fields of the region word. */
#define CYPOOL_TEAM_MAX 4095

/* The region word, written by the calling thread as it opens a region (no
 * team thread runs one then), else changed only by compare-and-swap or an
 * atomic subtract:
 *   bits  0-11  the next thread number not yet taken
 *   bits 12-23  team threads running a thread number of this region
 *   bits 24-35  the region's thread count n
 *   bits 36-63  the region's serial number (a team thread's stale view of
 *               a finished region never matches the word again) */
#define CYPOOL_NEXT_ONE ((uint64_t)1)
#define CYPOOL_RUN_ONE ((uint64_t)1 << 12)
#define CYPOOL_FIELD(w, shift) ((unsigned)(((w) >> (shift)) & 0xfff))

typedef struct {
    void (*fn)(void*);
    void* data;
    uint64_t region;      /* the region word */
    uint32_t wake;        /* futex: bumped when a region opens */
    uint32_t done;        /* futex: bumped when a team thread finishes, if
                           * the calling thread sleeps */
    int sleepers;         /* team threads asleep on wake */
    int caller_waits;     /* the calling thread sleeps on done */
    int busy;             /* a region is open */
    int threads;          /* team threads started */
    int forked;           /* pthread_atfork handler installed */
    /* Counts for diagnostics (cypool_team_counts): regions opened on the
     * team, thread numbers team threads ran, thread numbers the calling
     * thread ran in a team thread's place, its sleeps at a region's end
     * waiting for team threads, and team threads' moves off its CPU. */
    uint64_t opened, joined, stolen, slept, moved;
    int caller_cpu;       /* the CPU the calling thread opened the region on */
} cypool_team_t;

static cypool_team_t cypool_team;
static __thread unsigned cypool_thread_num = 0;
static __thread unsigned cypool_num_threads = 1;

CYPOOL_HIDDEN int omp_get_thread_num(void) { return (int)cypool_thread_num; }
CYPOOL_HIDDEN int omp_get_num_threads(void) { return (int)cypool_num_threads; }

static int64_t cypool_team_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static inline void cypool_team_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One turn of a spin-wait that may last limit_ns: whether it has lasted
 * that long (the clock is read every 64th turn; *until starts at 0). */
static int cypool_spin_over(int64_t* until, unsigned* spins, int64_t limit_ns) {
    int64_t now;
    cypool_team_relax();
    if (++*spins % 64)
        return 0;
    now = cypool_team_now();
    if (*until == 0) {
        *until = now + limit_ns;
        return 0;
    }
    return now > *until;
}

/* A team thread's own affinity mask (the one it inherited from the thread
 * that started it), read at its first move. */
static __thread cpu_set_t cypool_home;
static __thread int cypool_home_known = 0;

/* Whether a team thread that took a thread number runs on the CPU the
 * calling thread opened the region on: then the two take turns on it, no
 * faster than the calling thread alone, while another CPU may idle. A
 * scheduler that packs threads onto busy CPUs (virtual machines do) puts
 * a woken team thread there. Then it moves to another of its CPUs: the
 * affinity mask without that CPU moves it now, and its own mask back
 * keeps it where it went until it sleeps again. */
static void cypool_team_move_off(int cpu) {
    cpu_set_t away;
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getcpu() != cpu)
        return;
    if (!cypool_home_known) {
        if (sched_getaffinity(0, sizeof cypool_home, &cypool_home) != 0)
            return;
        cypool_home_known = 1;
    }
    away = cypool_home;
    CPU_CLR(cpu, &away);
    if (CPU_COUNT(&away) == 0)
        return;
    if (sched_setaffinity(0, sizeof away, &away) == 0) {
        sched_setaffinity(0, sizeof cypool_home, &cypool_home);
        __atomic_add_fetch(&cypool_team.moved, 1, __ATOMIC_RELAXED);
    }
}

static void cypool_futex_wait(uint32_t* word, uint32_t seen) {
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
}

static void cypool_futex_wake(uint32_t* word, int n) {
    syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, n, NULL, NULL, 0);
}

/* Run thread number t of n of fn(data) on this thread. */
static void cypool_team_run_as(void (*fn)(void*), void* data, unsigned t, unsigned n) {
    unsigned was_t = cypool_thread_num, was_n = cypool_num_threads;
    cypool_thread_num = t;
    cypool_num_threads = n;
    fn(data);
    cypool_thread_num = was_t;
    cypool_num_threads = was_n;
}

/* Run thread number t of n of the open region. */
static void cypool_team_run(unsigned t, unsigned n) {
    cypool_team_run_as(cypool_team.fn, cypool_team.data, t, n);
}

/* A team thread: take thread numbers of the open region while there are
 * any; each taken one is counted running in the same compare-and-swap, so
 * the calling thread cannot end the region in between. */
static void cypool_team_join(void) {
    cypool_team_t* T = &cypool_team;
    uint64_t w = __atomic_load_n(&T->region, __ATOMIC_ACQUIRE);
    for (;;) {
        unsigned next = CYPOOL_FIELD(w, 0), n = CYPOOL_FIELD(w, 24);
        if (next >= n)
            return;
        if (!__atomic_compare_exchange_n(&T->region, &w, w + CYPOOL_NEXT_ONE + CYPOOL_RUN_ONE, 1,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            continue;
        cypool_team_move_off(__atomic_load_n(&T->caller_cpu, __ATOMIC_RELAXED));
        cypool_team_run(next, n);
        __atomic_add_fetch(&T->joined, 1, __ATOMIC_RELAXED);
        w = __atomic_sub_fetch(&T->region, CYPOOL_RUN_ONE, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&T->caller_waits, __ATOMIC_SEQ_CST)) {
            __atomic_add_fetch(&T->done, 1, __ATOMIC_SEQ_CST);
            cypool_futex_wake(&T->done, 1);
        }
    }
}

static void* cypool_team_thread(void* arg) {
    cypool_team_t* T = &cypool_team;
    uint32_t seen = (uint32_t)(uintptr_t)arg;
    pthread_setname_np(pthread_self(), "cypool-team");
    for (;;) {
        int64_t until = 0;
        unsigned spins = 0;
        while (__atomic_load_n(&T->wake, __ATOMIC_ACQUIRE) == seen) {
            if (cypool_spin_over(&until, &spins, CYPOOL_TEAM_SPIN_NS)) {
                __atomic_add_fetch(&T->sleepers, 1, __ATOMIC_SEQ_CST);
                if (__atomic_load_n(&T->wake, __ATOMIC_SEQ_CST) == seen)
                    cypool_futex_wait(&T->wake, seen);
                __atomic_sub_fetch(&T->sleepers, 1, __ATOMIC_SEQ_CST);
                until = 0;
            }
        }
        seen = __atomic_load_n(&T->wake, __ATOMIC_ACQUIRE);
        cypool_team_join();
    }
    return NULL;
}

/* A child process has none of its parent's team threads. */
static void cypool_team_after_fork(void) {
    cypool_team.threads = 0;
    cypool_team.busy = 0;
    cypool_team.sleepers = 0;
    cypool_team.caller_waits = 0;
    cypool_team.region = 0;
}

/* Start team threads until there are want; how many there are. */
static int cypool_team_grow(int want) {
    cypool_team_t* T = &cypool_team;
    if (!T->forked) {
        pthread_atfork(NULL, NULL, cypool_team_after_fork);
        T->forked = 1;
    }
    while (T->threads < want) {
        pthread_t id;
        pthread_attr_t attr;
        int err;
        if (pthread_attr_init(&attr) != 0)
            break;
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        err = pthread_create(&id, &attr, cypool_team_thread,
                             (void*)(uintptr_t)__atomic_load_n(&T->wake, __ATOMIC_ACQUIRE));
        pthread_attr_destroy(&attr);
        if (err != 0)
            break;
        T->threads++;
    }
    return T->threads;
}

/* The calling thread's wait for team threads still running thread numbers
 * of its region: spin a while, then sleep until the last one finishes. */
static void cypool_team_wait(void) {
    cypool_team_t* T = &cypool_team;
    int64_t until = 0;
    unsigned spins = 0;
    while (CYPOOL_FIELD(__atomic_load_n(&T->region, __ATOMIC_ACQUIRE), 12) != 0) {
        if (cypool_spin_over(&until, &spins, CYPOOL_TEAM_WAIT_SPIN_NS)) {
            uint32_t done = __atomic_load_n(&T->done, __ATOMIC_SEQ_CST);
            __atomic_store_n(&T->caller_waits, 1, __ATOMIC_SEQ_CST);
            if (CYPOOL_FIELD(__atomic_load_n(&T->region, __ATOMIC_SEQ_CST), 12) != 0) {
                __atomic_add_fetch(&T->slept, 1, __ATOMIC_RELAXED);
                cypool_futex_wait(&T->done, done);
            }
            __atomic_store_n(&T->caller_waits, 0, __ATOMIC_SEQ_CST);
        }
    }
}

CYPOOL_HIDDEN void GOMP_parallel(void (*fn)(void*), void* data, unsigned n, unsigned flags) {
    cypool_team_t* T = &cypool_team;
    unsigned t;
    int alone;
    (void)flags;
    if (n == 0)
        n = (unsigned)omp_get_max_threads();
    if (n > CYPOOL_TEAM_MAX)
        n = CYPOOL_TEAM_MAX;
    if (n < 1)
        n = 1;
    alone = n == 1 || __atomic_exchange_n(&T->busy, 1, __ATOMIC_ACQUIRE);
    if (!alone && cypool_team_grow((int)n - 1) < 1) {
        __atomic_store_n(&T->busy, 0, __ATOMIC_RELEASE);
        alone = 1;
    }
    if (alone) {
        /* One thread, a busy team, or no team thread to be had: this
         * thread runs every thread number in turn. */
        for (t = 0; t < n; t++)
            cypool_team_run_as(fn, data, t, n);
        return;
    }
    T->fn = fn;
    T->data = data;
    __atomic_store_n(&T->caller_cpu, sched_getcpu(), __ATOMIC_RELAXED);
    {
        /* Open the region: thread number 0 is the calling thread's. */
        uint64_t serial = (__atomic_load_n(&T->region, __ATOMIC_RELAXED) >> 36) + 1;
        __atomic_store_n(&T->region, (serial << 36) | ((uint64_t)n << 24) | CYPOOL_NEXT_ONE,
                         __ATOMIC_SEQ_CST);
    }
    __atomic_add_fetch(&T->wake, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&T->sleepers, __ATOMIC_SEQ_CST) > 0)
        cypool_futex_wake(&T->wake, (int)n - 1);
    cypool_team_run(0, n);
    /* Every thread number no team thread has taken yet. */
    for (;;) {
        uint64_t w = __atomic_load_n(&T->region, __ATOMIC_ACQUIRE);
        unsigned next = CYPOOL_FIELD(w, 0);
        if (next >= n)
            break;
        if (__atomic_compare_exchange_n(&T->region, &w, w + CYPOOL_NEXT_ONE, 1,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            cypool_team_run(next, n);
            __atomic_add_fetch(&T->stolen, 1, __ATOMIC_RELAXED);
        }
    }
    cypool_team_wait();
    __atomic_add_fetch(&T->opened, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&T->busy, 0, __ATOMIC_RELEASE);
}

/* The counts above, into c[5] (zeros where the team is libgomp's). */
static inline void cypool_team_counts(uint64_t* c) {
    c[0] = __atomic_load_n(&cypool_team.opened, __ATOMIC_RELAXED);
    c[1] = __atomic_load_n(&cypool_team.joined, __ATOMIC_RELAXED);
    c[2] = __atomic_load_n(&cypool_team.stolen, __ATOMIC_RELAXED);
    c[3] = __atomic_load_n(&cypool_team.slept, __ATOMIC_RELAXED);
    c[4] = __atomic_load_n(&cypool_team.moved, __ATOMIC_RELAXED);
}

#else
#define CYPOOL_OWN_TEAM 0
static inline void cypool_team_counts(uint64_t* c) { c[0] = c[1] = c[2] = c[3] = c[4] = 0; }
#endif
#endif
