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
 * the call waits with it (docs/performance.md, "Threads inside real programs"). Here
 * a late team thread's share runs on the calling thread instead, and a
 * team thread preempted in the middle of its share moves onto the calling
 * thread's CPU, idle by then (cypool_team_wait). The kernels claim their
 * work a block at a time (_common.pxi, _claim), so a late thread number
 * finds none left.
 *
 * One team per process: each module's GOMP_parallel and omp_get_* go
 * through a table of three functions (cypool_team_api_t), its own team's
 * until cypool._backend hands every module the chosen module's table at
 * import, or libgomp's own functions (CYPOOL_TEAM=libgomp), before any
 * kernel runs. One region runs at a time on the team: a call that finds it
 * busy (another Python thread's call, or a call from inside a region) runs
 * its thread numbers one after another on its own thread.
 * A region opened while libgomp's own pool threads spin (after torch's or
 * Numba's regions) goes to them instead (cypool_gomp_takes). Team threads
 * that went to sleep are woken by the lookout, a thread spinning at
 * SCHED_IDLE for a while after they slept, where it runs
 * (cypool_lookout_watch), else by the calling thread.
 * omp_get_max_threads stays libgomp's, so OMP_NUM_THREADS and
 * threadpoolctl's OpenMP limits still set the kernels' default thread
 * count. */
#ifndef CYPOOL_TEAM_H
#define CYPOOL_TEAM_H

#include <stdint.h>
#include <string.h>
#include <time.h>

#if defined(_OPENMP) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__) \
    && !defined(CYPOOL_LIBGOMP_TEAM)
#define CYPOOL_OWN_TEAM 1
#include <pthread.h>
#include <sched.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <stdlib.h>
#include <stdio.h>

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
#ifndef CYPOOL_TEAM_SPIN_NS
#define CYPOOL_TEAM_SPIN_NS 200000
#endif
#define CYPOOL_TEAM_WAIT_SPIN_NS 2000000
/* While it waits, the calling thread samples the CPU time of each team
 * thread still running a thread number, this often: one that ran for less
 * than a quarter of a sample has lost its CPU (cypool_team_wait). */
#define CYPOOL_TEAM_SAMPLE_NS 50000
/* Asleep at a region's end, the calling thread wakes this often to sample
 * them: a team thread preempted after the first CYPOOL_TEAM_WAIT_SPIN_NS
 * holds the call for a nap, not for the rest of a time slice. */
#define CYPOOL_TEAM_NAP_NS 1000000
/* Team threads watched that way: the first this many. */
#define CYPOOL_TEAM_WATCHED 64
/* Thread numbers of a region are 12-bit fields of the region word. */
#define CYPOOL_TEAM_MAX 4095

/* The lookout: one more thread, at SCHED_IDLE, that spins this long after
 * the team threads went to sleep (or after its last wake) and wakes them
 * when a region opens. On this virtual machine a futex wake
 * from another CPU starts a sleeping team thread 18-33 us later, one from
 * a thread spinning on the sleeper's own CPU 3-7 us later (a C probe,
 * 1 ms of single-threaded work between regions). At SCHED_IDLE it takes no
 * CPU from any other thread: one that wants its CPU preempts it at once.
 * 0: no lookout. */
#ifndef CYPOOL_TEAM_LOOKOUT_NS
#define CYPOOL_TEAM_LOOKOUT_NS 5000000
#endif
/* The calling thread leaves the wake to the lookout only if it looked this
 * recently: one that has lost its CPU to another thread does not look. */
#define CYPOOL_TEAM_LOOKOUT_BEAT_NS 20000

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

/* A watched team thread, as the calling thread sees it. */
typedef struct {
    pid_t tid;
    clockid_t clock;      /* its CPU-time clock */
    int ready;            /* tid and clock are set */
    int running;          /* it runs a thread number of the open region */
    int pulled;           /* the calling thread moved it onto its own CPU
                           * in this region; cleared by the team thread */
    cpu_set_t home;       /* its affinity mask, read as it started */
} cypool_member_t;

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
    int slots;            /* team threads that took their slot */
    int forked;           /* pthread_atfork handler installed */
    /* Counts for diagnostics (cypool_team_counts): regions opened on the
     * team, thread numbers team threads ran, thread numbers the calling
     * thread ran in a team thread's place, its sleeps at a region's end
     * waiting for team threads, team threads' moves off its CPU, and the
     * team threads it moved onto its CPU, found waiting for one. */
    uint64_t opened, joined, stolen, slept, moved, pulled;
    int caller_cpu;       /* the CPU the calling thread opened the region on */
    cypool_member_t member[CYPOOL_TEAM_WATCHED];
} cypool_team_t;

static cypool_team_t cypool_team;

typedef struct {
    int64_t beat;         /* when it last looked at the team's wake word */
    uint32_t call;        /* futex: bumped to start its watch */
    int on;               /* it is watching */
    int state;            /* 0: not started, 1: started, -1: none */
    uint64_t woke;        /* regions whose sleeping team threads it woke */
} __attribute__((aligned(64))) cypool_lookout_t;

static cypool_lookout_t cypool_lookout;
static __thread unsigned cypool_thread_num = 0;
static __thread unsigned cypool_num_threads = 1;

static int cypool_team_thread_num(void) { return (int)cypool_thread_num; }
static int cypool_team_num_threads(void) { return (int)cypool_num_threads; }

/* Whether team threads move off the calling thread's CPU, and the calling
 * thread moves a preempted one onto its own (CYPOOL_TEAM_AFFINITY=0: never). */
static int cypool_team_affinity = 1;
/* Whether the lookout starts (CYPOOL_TEAM_LOOKOUT=0: never). */
static int cypool_team_lookout = 1;

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

/* A spin-wait's state; all 0 at its start. */
typedef struct {
    int64_t until;        /* when it is over */
    int64_t looked;       /* the last read of the clock */
    unsigned spins;
    int lost;             /* two reads were over CYPOOL_TEAM_LOOKOUT_BEAT_NS
                           * apart: the thread was off its CPU meanwhile */
} cypool_spin_t;

/* One turn of a spin-wait that may last limit_ns: whether it has lasted
 * that long (the clock is read every 64th turn). */
static int cypool_spin_over(cypool_spin_t* w, int64_t limit_ns) {
    int64_t now;
    cypool_team_relax();
    if (++w->spins % 64)
        return 0;
    now = cypool_team_now();
    w->lost |= w->looked && now - w->looked > CYPOOL_TEAM_LOOKOUT_BEAT_NS;
    w->looked = now;
    if (w->until == 0) {
        w->until = now + limit_ns;
        return 0;
    }
    return now > w->until;
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
    if (!__atomic_load_n(&cypool_team_affinity, __ATOMIC_RELAXED) || cpu < 0 || cpu >= CPU_SETSIZE || sched_getcpu() != cpu)
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

/* The same, for at most ns. */
static void cypool_futex_wait_for(uint32_t* word, uint32_t seen, long ns) {
    struct timespec d = {0, ns};
    syscall(SYS_futex, word, FUTEX_WAIT_PRIVATE, seen, &d, NULL, 0);
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
 * the calling thread cannot end the region in between. me: its slot among
 * the watched ones, or NULL. */
static void cypool_team_join(cypool_member_t* me) {
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
        if (me)
            __atomic_store_n(&me->running, 1, __ATOMIC_SEQ_CST);
        cypool_team_run(next, n);
        if (me)
            __atomic_store_n(&me->running, 0, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&T->joined, 1, __ATOMIC_RELAXED);
        w = __atomic_sub_fetch(&T->region, CYPOOL_RUN_ONE, __ATOMIC_SEQ_CST);
        if (__atomic_load_n(&T->caller_waits, __ATOMIC_SEQ_CST)) {
            __atomic_add_fetch(&T->done, 1, __ATOMIC_SEQ_CST);
            cypool_futex_wake(&T->done, 1);
        }
    }
}

/* Wake the team threads asleep for the region just opened, if any. */
static int cypool_lookout_wake_team(void) {
    cypool_team_t* T = &cypool_team;
    unsigned n = CYPOOL_FIELD(__atomic_load_n(&T->region, __ATOMIC_SEQ_CST), 24);
    if (n < 2 || __atomic_load_n(&T->sleepers, __ATOMIC_SEQ_CST) == 0)
        return 0;
    cypool_futex_wake(&T->wake, (int)n - 1);
    return 1;
}

/* The lookout's watch: spin at SCHED_IDLE until CYPOOL_TEAM_LOOKOUT_NS
 * after it began or after its last wake, waking the sleeping team threads
 * of each region it sees open (regions that find them awake, back to
 * back, do not keep it watching). The calling thread leaves the wake to it
 * while it looks (cypool_lookout_sees); after it stops, it looks once
 * more, so a region opened as it stopped is not left asleep. */
static void cypool_lookout_watch(void) {
    cypool_team_t* T = &cypool_team;
    cypool_lookout_t* L = &cypool_lookout;
    uint32_t seen = __atomic_load_n(&T->wake, __ATOMIC_SEQ_CST);
    int64_t now = cypool_team_now(), until = now + CYPOOL_TEAM_LOOKOUT_NS, last = now, woke_at = 0;
    unsigned spins = 0;
    __atomic_store_n(&L->beat, now, __ATOMIC_RELAXED);
    __atomic_store_n(&L->on, 1, __ATOMIC_SEQ_CST);
    for (;;) {
        uint32_t w = __atomic_load_n(&T->wake, __ATOMIC_SEQ_CST);
        if (w != seen) {
            seen = w;
            if (cypool_lookout_wake_team()) {
                __atomic_add_fetch(&L->woke, 1, __ATOMIC_RELAXED);
                woke_at = cypool_team_now();
                until = woke_at + CYPOOL_TEAM_LOOKOUT_NS;
            }
        }
        cypool_team_relax();
        if (++spins % 64)
            continue;
        now = cypool_team_now();
        __atomic_store_n(&L->beat, now, __ATOMIC_RELAXED);
        /* Off its CPU for a while, not for a team thread it woke: another
         * library's thread wants the CPUs, and the team is woken as before. */
        if (now > until || (now - last > CYPOOL_TEAM_LOOKOUT_BEAT_NS && woke_at < last))
            break;
        last = now;
    }
    __atomic_store_n(&L->on, 0, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&T->wake, __ATOMIC_SEQ_CST) != seen)
        cypool_lookout_wake_team();
}

static void* cypool_lookout_thread(void* arg) {
    cypool_lookout_t* L = &cypool_lookout;
    uint32_t called = (uint32_t)(uintptr_t)arg;
    struct sched_param idle;
    memset(&idle, 0, sizeof idle);
    pthread_setname_np(pthread_self(), "cypool-lookout");
    if (sched_setscheduler(0, SCHED_IDLE, &idle) != 0) {
        __atomic_store_n(&L->state, -1, __ATOMIC_RELEASE);  /* no spinning at a normal priority */
        return NULL;
    }
    for (;;) {
        uint32_t c;
        while ((c = __atomic_load_n(&L->call, __ATOMIC_ACQUIRE)) == called)
            cypool_futex_wait(&L->call, called);
        called = c;
        cypool_lookout_watch();
    }
    return NULL;
}

/* Start the lookout's watch, from a team thread about to sleep. */
static void cypool_lookout_call(void) {
    cypool_lookout_t* L = &cypool_lookout;
    if (__atomic_load_n(&L->state, __ATOMIC_ACQUIRE) != 1 || __atomic_load_n(&L->on, __ATOMIC_SEQ_CST))
        return;
    __atomic_add_fetch(&L->call, 1, __ATOMIC_SEQ_CST);
    cypool_futex_wake(&L->call, 1);
}

/* Whether the lookout is watching and looked within
 * CYPOOL_TEAM_LOOKOUT_BEAT_NS: then it wakes the team for a region opened
 * now (the region's wake word is bumped before this is asked). */
static int cypool_lookout_sees(void) {
    cypool_lookout_t* L = &cypool_lookout;
    return __atomic_load_n(&L->on, __ATOMIC_SEQ_CST)
           && cypool_team_now() - __atomic_load_n(&L->beat, __ATOMIC_RELAXED) < CYPOOL_TEAM_LOOKOUT_BEAT_NS;
}

/* Start the lookout, once (none where CYPOOL_TEAM_LOOKOUT_NS is 0 or it is
 * switched off). */
static void cypool_lookout_start(void) {
    cypool_lookout_t* L = &cypool_lookout;
    pthread_t id;
    pthread_attr_t attr;
    if (CYPOOL_TEAM_LOOKOUT_NS <= 0 || L->state != 0
        || !__atomic_load_n(&cypool_team_lookout, __ATOMIC_RELAXED))
        return;
    L->state = -1;
    if (pthread_attr_init(&attr) != 0)
        return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    __atomic_store_n(&L->state, 1, __ATOMIC_RELEASE);
    if (pthread_create(&id, &attr, cypool_lookout_thread,
                       (void*)(uintptr_t)__atomic_load_n(&L->call, __ATOMIC_ACQUIRE)) != 0)
        __atomic_store_n(&L->state, -1, __ATOMIC_RELEASE);
    pthread_attr_destroy(&attr);
}

static void* cypool_team_thread(void* arg) {
    cypool_team_t* T = &cypool_team;
    uint32_t seen = (uint32_t)(uintptr_t)arg;
    int slot = __atomic_fetch_add(&T->slots, 1, __ATOMIC_SEQ_CST);
    cypool_member_t* me = slot < CYPOOL_TEAM_WATCHED ? &T->member[slot] : NULL;
    pthread_setname_np(pthread_self(), "cypool-team");
    if (me) {
        me->tid = (pid_t)syscall(SYS_gettid);
        if (pthread_getcpuclockid(pthread_self(), &me->clock) == 0
            && sched_getaffinity(0, sizeof me->home, &me->home) == 0)
            __atomic_store_n(&me->ready, 1, __ATOMIC_RELEASE);
    }
    for (;;) {
        cypool_spin_t wait = {0, 0, 0, 0};
        /* Moved onto the calling thread's CPU to finish its last region,
         * it sleeps at once rather than spin beside the calling thread. */
        int rest = me && __atomic_exchange_n(&me->pulled, 0, __ATOMIC_SEQ_CST);
        while (__atomic_load_n(&T->wake, __ATOMIC_ACQUIRE) == seen) {
            if (rest || cypool_spin_over(&wait, CYPOOL_TEAM_SPIN_NS)) {
                /* The lookout only where this spin kept its CPU: another
                 * library's spinning thread wants it otherwise. */
                if (!rest && !wait.lost)
                    cypool_lookout_call();
                rest = 0;
                __atomic_add_fetch(&T->sleepers, 1, __ATOMIC_SEQ_CST);
                if (__atomic_load_n(&T->wake, __ATOMIC_SEQ_CST) == seen)
                    cypool_futex_wait(&T->wake, seen);
                __atomic_sub_fetch(&T->sleepers, 1, __ATOMIC_SEQ_CST);
                memset(&wait, 0, sizeof wait);
            }
        }
        seen = __atomic_load_n(&T->wake, __ATOMIC_ACQUIRE);
        cypool_team_join(me);
    }
    return NULL;
}

/* A child process has none of its parent's team threads. */
static void cypool_gomp_after_fork(void);
static void cypool_team_after_fork(void) {
    cypool_gomp_after_fork();
    cypool_team.threads = 0;
    cypool_team.slots = 0;
    memset(cypool_team.member, 0, sizeof cypool_team.member);
    cypool_team.busy = 0;
    cypool_team.sleepers = 0;
    cypool_team.caller_waits = 0;
    cypool_team.region = 0;
    cypool_lookout.state = 0;
    cypool_lookout.on = 0;
}

/* Start team threads until there are want; how many there are. */
static int cypool_team_grow(int want) {
    cypool_team_t* T = &cypool_team;
    if (!T->forked) {
        pthread_atfork(NULL, NULL, cypool_team_after_fork);
        T->forked = 1;
    }
    cypool_lookout_start();
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

/* The calling thread's sleep until a team thread finishes a thread number
 * of its region (or none is running any more), for at most
 * CYPOOL_TEAM_NAP_NS: then it samples the team threads again. */
static void cypool_team_sleep(void) {
    cypool_team_t* T = &cypool_team;
    uint32_t done = __atomic_load_n(&T->done, __ATOMIC_SEQ_CST);
    __atomic_store_n(&T->caller_waits, 1, __ATOMIC_SEQ_CST);
    if (CYPOOL_FIELD(__atomic_load_n(&T->region, __ATOMIC_SEQ_CST), 12) != 0) {
        __atomic_add_fetch(&T->slept, 1, __ATOMIC_RELAXED);
        cypool_futex_wait_for(&T->done, done, CYPOOL_TEAM_NAP_NS);
    }
    __atomic_store_n(&T->caller_waits, 0, __ATOMIC_SEQ_CST);
}

/* One sample of the watched team threads' CPU time at now, against the
 * last one (cpu[i] < 0: none yet). A team thread still running a thread
 * number that ran for less than a quarter of the time since is waiting for
 * a CPU: preempted in the middle of its work by another library's spinning
 * thread, which shares its CPU. Then it is moved onto the calling thread's
 * own CPU, which has nothing left to do and is about to sleep: its mask
 * becomes that CPU alone (moved[i] = 1; cypool_team_wait puts the mask
 * back). Whether one was moved. */
static int cypool_team_sample(int64_t now, int64_t* last, int64_t* cpu, char* moved, int watched) {
    cypool_team_t* T = &cypool_team;
    int i, any = 0;
    for (i = 0; i < watched; i++) {
        cypool_member_t* m = &T->member[i];
        struct timespec t;
        int64_t c;
        if (!__atomic_load_n(&m->ready, __ATOMIC_ACQUIRE) || !__atomic_load_n(&m->running, __ATOMIC_SEQ_CST)
            || clock_gettime(m->clock, &t) != 0) {
            cpu[i] = -1;
            continue;
        }
        c = (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
        if (cpu[i] >= 0 && !moved[i] && !any && (c - cpu[i]) * 4 < now - *last
            && __atomic_load_n(&cypool_team_affinity, __ATOMIC_RELAXED)) {
            int here = sched_getcpu();
            cpu_set_t only;
            CPU_ZERO(&only);
            if (here >= 0 && here < CPU_SETSIZE) {
                CPU_SET(here, &only);
                if (sched_setaffinity(m->tid, sizeof only, &only) == 0) {
                    __atomic_store_n(&m->pulled, 1, __ATOMIC_SEQ_CST);
                    __atomic_add_fetch(&T->pulled, 1, __ATOMIC_RELAXED);
                    moved[i] = 1;
                    any = 1;
                }
            }
        }
        cpu[i] = c;
    }
    *last = now;
    return any;
}

/* The calling thread's wait for team threads still running thread numbers
 * of its region: spin a while, then sleep until the last one finishes. A
 * team thread that has lost its CPU meanwhile would hold the call for the
 * rest of a scheduler time slice (4-8 ms): moved onto this thread's CPU,
 * it runs as soon as this thread sleeps. */
static void cypool_team_wait(void) {
    cypool_team_t* T = &cypool_team;
    int64_t until = 0, sampled = 0, cpu[CYPOOL_TEAM_WATCHED];
    char moved[CYPOOL_TEAM_WATCHED];
    unsigned spins = 0;
    int i, watched = __atomic_load_n(&T->slots, __ATOMIC_ACQUIRE), any = 0;
    if (watched > CYPOOL_TEAM_WATCHED)
        watched = CYPOOL_TEAM_WATCHED;
    for (i = 0; i < watched; i++) {
        cpu[i] = -1;
        moved[i] = 0;
    }
    while (CYPOOL_FIELD(__atomic_load_n(&T->region, __ATOMIC_ACQUIRE), 12) != 0) {
        int64_t now;
        cypool_team_relax();
        if (++spins % 64)
            continue;
        now = cypool_team_now();
        if (until == 0)
            until = now + CYPOOL_TEAM_WAIT_SPIN_NS;
        if (now - sampled >= CYPOOL_TEAM_SAMPLE_NS && cypool_team_sample(now, &sampled, cpu, moved, watched)) {
            any = 1;
            cypool_team_sleep();
        } else if (now > until) {
            cypool_team_sleep();
            spins = 0; /* the next sample within 64 turns */
        }
    }
    for (i = 0; any && i < watched; i++)
        if (moved[i])
            sched_setaffinity(T->member[i].tid, sizeof T->member[i].home, &T->member[i].home);
}

/* The team a module's parallel blocks run on. counts is NULL for libgomp's. */
typedef struct {
    void (*parallel)(void (*)(void*), void*, unsigned, unsigned);
    int (*thread_num)(void);
    int (*num_threads)(void);
    void (*counts)(uint64_t*);
    void (*configure)(int, int);
} cypool_team_api_t;

/* Handing a region to libgomp's pool. Where cypool's modules share their
 * libgomp with torch or Numba (a build against the system's libgomp, one
 * runtime per process), that pool's threads spin for milliseconds after
 * each of its regions and want a CPU all along. A woken team thread then
 * competes with them: a short call's team share runs late, on the calling
 * thread (its one-thread time), and a long call's team thread takes turns
 * with the spinning one. So a region opened while cypool's team threads
 * sleep goes to libgomp's GOMP_parallel when the calling thread's libgomp
 * pool threads are all runnable (spinning: state R in /proc), have not
 * waited over 1 ms for a CPU since the last look, within 0.1 s, other than
 * behind cypool's own team, and no other thread on the machine is
 * runnable (/proc/loadavg): one sharing its CPU with another library's
 * spinning thread, OpenBLAS's, would hold libgomp's region end for its
 * next turn. The pool's threads are found by a region of libgomp's, at
 * most once a second; never in a forked child, whose libgomp has no
 * threads. CYPOOL_TEAM_HANDOFF=0 at build time: never (tests/c/team.c,
 * whose sanitizers cannot see into libgomp). */
#ifndef CYPOOL_TEAM_HANDOFF
#define CYPOOL_TEAM_HANDOFF 1
#endif

typedef struct {
    void (*fn)(void*);
    void* data;
} cypool_gomp_call_t;

typedef struct {
    int state;            /* 0: not probed, 1: probed, -1: never hand off */
    pthread_t master;     /* the thread whose pool was probed */
    int count;            /* its pool threads recorded */
    pid_t tid[CYPOOL_TEAM_WATCHED];
    int stat[CYPOOL_TEAM_WATCHED];          /* their /proc/self/task/TID/stat, open */
    int sched[CYPOOL_TEAM_WATCHED];         /* and schedstat */
    int64_t waited[CYPOOL_TEAM_WATCHED];    /* their run-queue wait at the last look */
    int64_t probed_at, seen_at;
    int own_since;        /* a region ran on cypool's team since the last look */
    int cpus;             /* online CPUs */
    int loadavg;          /* /proc/loadavg, open */
    void (*parallel)(void (*)(void*), void*, unsigned, unsigned);
    int (*thread_num)(void);
    int (*num_threads)(void);
    uint64_t handed;      /* regions handed to libgomp */
} cypool_gomp_t;

static cypool_gomp_t cypool_gomp = {CYPOOL_TEAM_HANDOFF ? 0 : -1};
static inline const void* cypool_team_libgomp(void);

static void cypool_gomp_run(void* p) {
    cypool_gomp_call_t* c = (cypool_gomp_call_t*)p;
    cypool_team_run_as(c->fn, c->data, (unsigned)cypool_gomp.thread_num(),
                       (unsigned)cypool_gomp.num_threads());
}

static void cypool_gomp_record(void* p) {
    int t = cypool_gomp.thread_num();
    (void)p;
    if (t == 0)
        cypool_gomp.count = cypool_gomp.num_threads() - 1;
    else if (t <= CYPOOL_TEAM_WATCHED)
        cypool_gomp.tid[t - 1] = (pid_t)syscall(SYS_gettid);
}

static void cypool_gomp_forget(void) {
    int i;
    for (i = 0; i < cypool_gomp.count && i < CYPOOL_TEAM_WATCHED; i++) {
        if (cypool_gomp.stat[i] >= 0)
            close(cypool_gomp.stat[i]);
        if (cypool_gomp.sched[i] >= 0)
            close(cypool_gomp.sched[i]);
    }
    cypool_gomp.count = 0;
    if (cypool_gomp.state > 0)
        cypool_gomp.state = 0;
}

static void cypool_gomp_after_fork(void) {
    cypool_gomp_forget();
    if (cypool_gomp.loadavg > 0)
        close(cypool_gomp.loadavg);
    cypool_gomp.state = -1;
}

/* Find the calling thread's libgomp pool of n threads, by a region of
 * libgomp's; at most once a second. */
static void cypool_gomp_probe(unsigned n, int64_t now) {
    cypool_gomp_t* G = &cypool_gomp;
    char path[64];
    int i, count;
    if (G->probed_at && now - G->probed_at < 1000000000)
        return;
    G->probed_at = now;
    if (G->parallel == NULL) {
        const cypool_team_api_t* a = (const cypool_team_api_t*)cypool_team_libgomp();
        if (a == NULL) {
            G->state = -1;
            return;
        }
        G->parallel = a->parallel;
        G->thread_num = a->thread_num;
        G->num_threads = a->num_threads;
        G->cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
        G->loadavg = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
        if (G->loadavg < 0) {
            G->state = -1;
            return;
        }
    }
    cypool_gomp_forget();
    G->master = pthread_self();
    G->parallel(cypool_gomp_record, NULL, n, 0);
    count = G->count < CYPOOL_TEAM_WATCHED ? G->count : CYPOOL_TEAM_WATCHED;
    for (i = 0; i < count; i++) {
        snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)G->tid[i]);
        G->stat[i] = open(path, O_RDONLY | O_CLOEXEC);
        snprintf(path, sizeof path, "/proc/self/task/%d/schedstat", (int)G->tid[i]);
        G->sched[i] = open(path, O_RDONLY | O_CLOEXEC);
        G->waited[i] = -1;
    }
    G->count = count;
    for (i = 0; i < count; i++)
        if (G->stat[i] < 0 || G->sched[i] < 0) {
            cypool_gomp_forget();
            return;
        }
    G->state = 1;
}

/* Pool thread i's state: 'R' running or waiting for a CPU, 'S' asleep,
 * ...; 0 if it is gone. */
static char cypool_gomp_state(int i) {
    char buf[256];
    char* s;
    ssize_t got = pread(cypool_gomp.stat[i], buf, sizeof buf - 1, 0);
    if (got <= 0)
        return 0;
    buf[got] = 0;
    s = strrchr(buf, ')');  /* after the thread's name */
    return s != NULL && s[1] == ' ' ? s[2] : 0;
}

/* Pool thread i's time waiting for a CPU so far in ns (its schedstat, up
 * to date from when it last got one); -1 if unknown. */
static int64_t cypool_gomp_waited(int i) {
    char buf[96];
    char* end;
    ssize_t got = pread(cypool_gomp.sched[i], buf, sizeof buf - 1, 0);
    if (got <= 0)
        return -1;
    buf[got] = 0;
    strtoll(buf, &end, 10);
    return strtoll(end, NULL, 10);
}

/* Threads runnable on the machine now, from /proc/loadavg; -1 if unknown. */
static int cypool_gomp_runnable(void) {
    char buf[128];
    char* s;
    ssize_t got = pread(cypool_gomp.loadavg, buf, sizeof buf - 1, 0);
    if (got <= 0)
        return -1;
    buf[got] = 0;
    s = strchr(buf, '/');
    if (s == NULL)
        return -1;
    while (s > buf && s[-1] >= '0' && s[-1] <= '9')
        s--;
    return atoi(s);
}

/* Whether a region of n threads goes to libgomp's pool (see above). */
static int cypool_gomp_takes(unsigned n) {
    cypool_team_t* T = &cypool_team;
    cypool_gomp_t* G = &cypool_gomp;
    int64_t t0, w;
    int i, k = (int)n - 1, take = 1;
    if (G->state < 0 || k > CYPOOL_TEAM_WATCHED
        || T->threads - __atomic_load_n(&T->sleepers, __ATOMIC_SEQ_CST) >= k)
        return 0;
    t0 = cypool_team_now();
    if (G->state == 0 || G->count < k) {
        cypool_gomp_probe(n, t0);
        return 0;
    }
    if (!pthread_equal(G->master, pthread_self()))
        return 0;
    for (i = 0; i < k; i++) {
        char st = cypool_gomp_state(i);
        if (st == 0) {
            cypool_gomp_forget();  /* that thread is gone: probe again */
            return 0;
        }
        if (st != 'R')
            return 0;  /* asleep */
    }
    for (i = 0; i < k; i++) {
        w = cypool_gomp_waited(i);
        if (w < 0 || (G->waited[i] >= 0 && !G->own_since && t0 - G->seen_at < 100000000
                      && w - G->waited[i] > 1000000))
            take = 0;  /* waited over 1 ms for a CPU within 0.1 s, not for cypool's team */
        G->waited[i] = w;
    }
    G->seen_at = t0;
    G->own_since = 0;
    if (take) {
        /* the calling thread and the spinning pool threads, and no more
         * (the lookout, at SCHED_IDLE, takes no CPU from them) */
        int r = cypool_gomp_runnable() - __atomic_load_n(&cypool_lookout.on, __ATOMIC_SEQ_CST);
        take = r >= 0 && r <= G->cpus && r <= k + 1;
    }
    return take;
}

static void cypool_team_parallel(void (*fn)(void*), void* data, unsigned n, unsigned flags) {
    cypool_team_t* T = &cypool_team;
    unsigned t;
    int alone;
    (void)flags;
    if (n == 0)
        n = (unsigned)omp_get_max_threads();  /* libgomp's */
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
    if (cypool_gomp_takes(n)) {
        cypool_gomp_call_t c = {fn, data};
        cypool_gomp.parallel(cypool_gomp_run, &c, n, 0);
        __atomic_add_fetch(&cypool_gomp.handed, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&T->busy, 0, __ATOMIC_RELEASE);
        return;
    }
    cypool_gomp.own_since = 1;
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
    if (__atomic_load_n(&T->sleepers, __ATOMIC_SEQ_CST) > 0 && !cypool_lookout_sees())
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

/* The counts above, the regions handed to libgomp's pool and those whose
 * team threads the lookout woke, into c[8]. */
static void cypool_team_own_counts(uint64_t* c) {
    c[0] = __atomic_load_n(&cypool_team.opened, __ATOMIC_RELAXED);
    c[1] = __atomic_load_n(&cypool_team.joined, __ATOMIC_RELAXED);
    c[2] = __atomic_load_n(&cypool_team.stolen, __ATOMIC_RELAXED);
    c[3] = __atomic_load_n(&cypool_team.slept, __ATOMIC_RELAXED);
    c[4] = __atomic_load_n(&cypool_team.moved, __ATOMIC_RELAXED);
    c[5] = __atomic_load_n(&cypool_team.pulled, __ATOMIC_RELAXED);
    c[6] = __atomic_load_n(&cypool_gomp.handed, __ATOMIC_RELAXED);
    c[7] = __atomic_load_n(&cypool_lookout.woke, __ATOMIC_RELAXED);
}

static void cypool_team_configure_own(int affinity, int lookout) {
    __atomic_store_n(&cypool_team_affinity, affinity, __ATOMIC_RELAXED);
    __atomic_store_n(&cypool_team_lookout, lookout, __ATOMIC_RELAXED);
}

static const cypool_team_api_t cypool_team_own_api = {
    cypool_team_parallel, cypool_team_thread_num, cypool_team_num_threads,
    cypool_team_own_counts, cypool_team_configure_own};
static cypool_team_api_t cypool_team_libgomp_api;
static const cypool_team_api_t* cypool_team_api = &cypool_team_own_api;

CYPOOL_HIDDEN void GOMP_parallel(void (*fn)(void*), void* data, unsigned n, unsigned flags) {
    __atomic_load_n(&cypool_team_api, __ATOMIC_ACQUIRE)->parallel(fn, data, n, flags);
}
CYPOOL_HIDDEN int omp_get_thread_num(void) {
    return __atomic_load_n(&cypool_team_api, __ATOMIC_RELAXED)->thread_num();
}
CYPOOL_HIDDEN int omp_get_num_threads(void) {
    return __atomic_load_n(&cypool_team_api, __ATOMIC_RELAXED)->num_threads();
}

/* This module's own team's table. */
static inline const void* cypool_team_own(void) { return &cypool_team_own_api; }

/* A table of libgomp's own functions (the runtime this module links),
 * or NULL where they cannot be found. */
static inline const void* cypool_team_libgomp(void) {
    /* The library omp_get_max_threads comes from: a wheel's vendored copy
     * has another file name. */
    Dl_info info;
    void* h = NULL;
    cypool_team_api_t* a = &cypool_team_libgomp_api;
    if (dladdr((void*)&omp_get_max_threads, &info) && info.dli_fname)
        h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL)
        h = dlopen("libgomp.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (h == NULL)
        return NULL;
    *(void**)&a->parallel = dlsym(h, "GOMP_parallel");
    *(void**)&a->thread_num = dlsym(h, "omp_get_thread_num");
    *(void**)&a->num_threads = dlsym(h, "omp_get_num_threads");
    a->counts = NULL;
    a->configure = NULL;
    return a->parallel && a->thread_num && a->num_threads ? a : NULL;
}

/* Run this module's parallel blocks on api's team (a table from
 * cypool_team_own or cypool_team_libgomp); only before any region. */
static inline void cypool_team_use(const void* api) {
    __atomic_store_n(&cypool_team_api, (const cypool_team_api_t*)api, __ATOMIC_RELEASE);
}

/* Whether the blocks run on a cypool team (this module's or another's). */
static inline int cypool_team_is_own(void) {
    return __atomic_load_n(&cypool_team_api, __ATOMIC_RELAXED)->counts != NULL;
}

/* The counts of the team the blocks run on, into c[8]; 0 for libgomp's. */
static inline int cypool_team_counts(uint64_t* c) {
    const cypool_team_api_t* a = __atomic_load_n(&cypool_team_api, __ATOMIC_RELAXED);
    if (a->counts == NULL)
        return 0;
    a->counts(c);
    return 1;
}

/* The affinity moves and the lookout on (1) or off (0), on the team the
 * blocks run on. */
static inline void cypool_team_configure(int affinity, int lookout) {
    const cypool_team_api_t* a = __atomic_load_n(&cypool_team_api, __ATOMIC_RELAXED);
    if (a->configure != NULL)
        a->configure(affinity, lookout);
}

#else
#define CYPOOL_OWN_TEAM 0
static inline const void* cypool_team_own(void) { return NULL; }
static inline const void* cypool_team_libgomp(void) { return NULL; }
static inline void cypool_team_use(const void* api) { (void)api; }
static inline int cypool_team_is_own(void) { return 0; }
static inline int cypool_team_counts(uint64_t* c) { (void)c; return 0; }
static inline void cypool_team_configure(int affinity, int lookout) { (void)affinity; (void)lookout; }
#endif
#endif
