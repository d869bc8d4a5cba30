/* Lets the kernels call the few OpenMP runtime functions they need whether or
 * not the build found OpenMP: without it they are serial and say so. */
#ifndef CYPOOL_OMP_SHIM_H
#define CYPOOL_OMP_SHIM_H
#ifdef _OPENMP
#include <omp.h>
#define CYPOOL_HAVE_OPENMP 1
#define CYPOOL_OPENMP_VERSION _OPENMP
#else
#define CYPOOL_HAVE_OPENMP 0
#define CYPOOL_OPENMP_VERSION 0
static inline int omp_get_max_threads(void) { return 1; }
static inline int omp_get_thread_num(void) { return 0; }
static inline int omp_get_num_threads(void) { return 1; }
#endif
#include "_team.h"

/* The kernels' thread teams (_common.pxi, _claim). */
#include <stdint.h>
#include <time.h>

#ifdef _MSC_VER
#define CYPOOL_THREAD_LOCAL __declspec(thread)
#else
#define CYPOOL_THREAD_LOCAL __thread
#endif

/* The team size of the calling thread's last kernel call, for tests
 * (last_team_size). A team's thread 0 is the thread that called, so one
 * variable per thread keeps each Python thread's own answer when several
 * call kernels at once. */
static CYPOOL_THREAD_LOCAL int cypool_last_team = 1;
static inline void cypool_set_last_team(int n) { cypool_last_team = n; }
static inline int cypool_get_last_team(void) { return cypool_last_team; }

/* The algorithm the calling thread's last pass through conv2d_forward
 * ran, for tests: a cypool._select.ConvAlgo value (_conv.pxi). */
static CYPOOL_THREAD_LOCAL int cypool_conv_last_path = 0;
static inline void cypool_conv_set_path(int p) { cypool_conv_last_path = p; }
static inline int cypool_conv_get_path(void) { return cypool_conv_last_path; }

/* Claim n work items from a call's shared counter; returns the first. */
static inline Py_ssize_t cypool_claim(Py_ssize_t* next, Py_ssize_t n) {
    return __atomic_fetch_add(next, n, __ATOMIC_RELAXED);
}

static inline int64_t cypool_now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Where the parallel blocks run on libgomp's team (builds other than gcc
 * on Linux: _team.h): a team thread that starts this late after its
 * region opened found its core taken: by another library's threads still
 * spinning (OpenBLAS's for about 0.1 s after a product), by another
 * program, or (on a virtual machine) by a sleeping virtual CPU's wake-up.
 * libgomp's region end waits for it, however little work it takes, so for
 * a spell after such a start the kernels run on the calling thread alone
 * (cypool_crowded; _backend.threads_for). A thread preempted in the middle of its work
 * holds the region's end the same way, and the calling thread's wait there
 * starts a spell too (cypool_note_end). The spell starts at 10 ms and doubles, up to
 * 160 ms, each time a team thread is late again within a spell's length
 * of the last one ending: a one-off late wake-up costs 10 ms of serial
 * calls, a library spinning for 0.1 s costs two or three late starts.
 * Woken from sleep, a team thread starts within about 0.1 ms on a quiet
 * machine; the stalls measured were 4-8 ms, a scheduler time slice
 * (docs/performance.md, "Threads inside real programs"). */
#define CYPOOL_LATE_NS 1000000
#define CYPOOL_SPELL_MIN_NS 10000000
#define CYPOOL_SPELL_MAX_NS 160000000
static int64_t cypool_crowded_until_ns;
static int64_t cypool_spell_ns = CYPOOL_SPELL_MIN_NS;

static inline void cypool_note_late(int64_t now) {
    int64_t until, spell;
    /* cypool's own team runs a late thread's share on the calling thread,
     * and a spell measured no faster there (docs/performance.md). */
    if (cypool_team_is_own())
        return;
    until = __atomic_load_n(&cypool_crowded_until_ns, __ATOMIC_RELAXED);
    spell = __atomic_load_n(&cypool_spell_ns, __ATOMIC_RELAXED);
    if (now - until < spell)
        spell = 2 * spell < CYPOOL_SPELL_MAX_NS ? 2 * spell : CYPOOL_SPELL_MAX_NS;
    else
        spell = CYPOOL_SPELL_MIN_NS;
    __atomic_store_n(&cypool_spell_ns, spell, __ATOMIC_RELAXED);
    __atomic_store_n(&cypool_crowded_until_ns, now + spell, __ATOMIC_RELAXED);
}

/* A team thread's first claim, opened_ns after its region opened. */
static inline void cypool_note_start(int64_t opened_ns) {
    int64_t now = cypool_now_ns();
    if (now - opened_ns > CYPOOL_LATE_NS)
        cypool_note_late(now);
}

/* The region's end: the calling thread found no work left at done_ns and
 * has waited since for the others. A thread preempted in the middle of its
 * block (it started on time) shows here: a wait longer than
 * CYPOOL_LATE_NS and than a quarter of the calling thread's working time
 * (with about eight blocks a thread, more than a block's time). */
static inline void cypool_note_end(int64_t opened_ns, int64_t done_ns) {
    int64_t now = cypool_now_ns();
    if (done_ns > 0 && now - done_ns > CYPOOL_LATE_NS && 4 * (now - done_ns) > done_ns - opened_ns)
        cypool_note_late(now);
}

static inline int cypool_crowded(void) {
    return cypool_now_ns() < __atomic_load_n(&cypool_crowded_until_ns, __ATOMIC_RELAXED);
}

static inline void cypool_set_crowded(int on) {
    __atomic_store_n(&cypool_spell_ns, (int64_t)CYPOOL_SPELL_MIN_NS, __ATOMIC_RELAXED);
    __atomic_store_n(&cypool_crowded_until_ns, on ? cypool_now_ns() + CYPOOL_SPELL_MAX_NS : 0,
                     __ATOMIC_RELAXED);
}
#endif
