# Uses: nothing from a sibling but _omp_shim.h and _cpuid.h; every other file uses it.
# Shared declarations for every kernel family.
#
# Kernels only do arithmetic: every shape, parameter and index bound they rely
# on was checked by cypool/_checks.py before they are called. The value type is
# fused so that one source serves float32, float64 and the integer types.
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memset, memcpy
from libc.math cimport INFINITY, fabs
from libc.float cimport FLT_EPSILON, DBL_EPSILON, FLT_MIN, FLT_MAX, DBL_MIN
from libc.stdint cimport INT32_MIN, INT64_MIN, INT32_MAX, INT64_MAX
from libc.stdlib cimport malloc, calloc, free
from cython.parallel cimport prange, parallel, threadid
from cpython.buffer cimport (PyObject_GetBuffer, PyBuffer_Release, PyBUF_STRIDES, PyBUF_WRITABLE,
                             PyBUF_FORMAT)

cdef extern from "_omp_shim.h" nogil:
    int omp_get_max_threads()
    int omp_get_thread_num()
    int omp_get_num_threads()
    int CYPOOL_HAVE_OPENMP
    int CYPOOL_OPENMP_VERSION
    Py_ssize_t cypool_claim(Py_ssize_t* next, Py_ssize_t n)
    int64_t cypool_now_ns()
    void cypool_note_start(int64_t opened_ns)
    void cypool_note_end(int64_t opened_ns, int64_t done_ns)
    int cypool_crowded()
    void cypool_set_crowded(int on)
    void cypool_set_last_team(int n)
    int cypool_get_last_team()
    int CYPOOL_OWN_TEAM
    int cypool_team_counts(uint64_t* c)
    const void* cypool_team_own()
    const void* cypool_team_libgomp()
    void cypool_team_use(const void* api)
    int cypool_team_is_own()
    void cypool_team_configure(int affinity, int lookout)

# cypool_opaque(p) is p, hidden from the optimiser: a call through it stays
# a call, to one compiled copy. _maxpool_forward.pxi calls two functions so:
# one that gcc inlined into both the serial and the parallel path of the
# kernel, for every type pair (a sixth of the AVX2 variant's compile time),
# and one that ran slower inlined into its one remaining caller.
cdef extern from *:
    """
    #if defined(__GNUC__)
    #define cypool_opaque(p) __extension__({ void* cypool_p_ = (p); __asm__("" : "+r"(cypool_p_)); cypool_p_; })
    #else
    #define cypool_opaque(p) ((void*)(p))
    #endif
    """
    void* cypool_opaque(void* p) noexcept nogil

ctypedef fused value_t:
    float
    double
    int32_t
    int64_t

ctypedef fused index_t:
    int32_t
    int64_t

ctypedef fused floating:
    float
    double


cdef inline bint takes_over(value_t v, value_t m) noexcept nogil:
    """True when candidate v replaces the running maximum m.

    The rule shared by every max/argmax kernel: a strictly larger value wins
    (so the first of equal maxima stays), NaN counts as larger than anything,
    and once m is NaN nothing replaces it (so the first NaN stays). Written
    with two compares and no branch so loops using it vectorise; for integer
    types ``m == m`` folds to true.
    """
    return (m == m) & (not (v <= m))


cdef inline value_t _lowest(value_t* like) noexcept nogil:
    """The padding value: -inf for floats, the minimum for integers."""
    if value_t is float:
        return -INFINITY
    elif value_t is double:
        return -INFINITY
    elif value_t is int32_t:
        return INT32_MIN
    else:
        return INT64_MIN


cdef inline value_t _highest(value_t* like) noexcept nogil:
    """The value no other exceeds: +inf for floats, the maximum for integers."""
    if value_t is float:
        return INFINITY
    elif value_t is double:
        return INFINITY
    elif value_t is int32_t:
        return INT32_MAX
    else:
        return INT64_MAX


# Whether parallel kernels claim their work a block at a time (_claim);
# False splits it as schedule="static" would: for A/B runs only
# (cypool._testing.set_claiming), process-wide.
cdef bint _claiming = True


def _set_claiming(bint on):
    """Parallel kernels claim their work items a block at a time (True, the
    default) or split them in equal contiguous shares (False)."""
    global _claiming
    _claiming = on


cdef inline void _note_team() noexcept nogil:
    """Record the size of the running OpenMP team (called from parallel loop
    bodies), so tests can check what a kernel really ran on."""
    if omp_get_thread_num() == 0:
        cypool_set_last_team(omp_get_num_threads())


cdef inline void _set_serial_team() noexcept nogil:
    """Record a serial call (no parallel region) for last_team_size()."""
    cypool_set_last_team(1)


cdef inline Py_ssize_t _part_start(Py_ssize_t Q, Py_ssize_t s, Py_ssize_t S) noexcept nogil:
    """Where part s of Q work items cut into S contiguous parts starts (part
    s ends where part s + 1 starts)."""
    return Q * s // S


cdef inline Py_ssize_t _share_start(Py_ssize_t Q, int t) noexcept nogil:
    """Where thread t's contiguous share of Q work items starts, as
    schedule="static" would split them: for _claim's A/B switch. Assign the
    result in the parallel block, so that Cython makes the variable private
    to the thread."""
    return _part_start(Q, t, omp_get_num_threads())


cdef inline Py_ssize_t _claim_block(Py_ssize_t Q, int threads) noexcept nogil:
    """Items a thread claims at a time: about eight blocks a thread, so that
    a thread the OS runs late costs at most a block's time."""
    return Q // (8 * threads) if Q >= 8 * threads else 1


cdef struct Team:
    # One parallel call's shared state.
    Py_ssize_t next     # the next unclaimed work item
    int64_t opened_ns   # when the calling thread opened the region
    int64_t done_ns     # when the calling thread found no work left (0 before)


cdef inline void _team_begin(Team* team) noexcept nogil:
    """Ready team for a parallel region: call right before opening it."""
    team.next = 0
    team.opened_ns = cypool_now_ns()
    team.done_ns = 0


cdef inline void _team_end(Team* team) noexcept nogil:
    """Call right after the region: whether the calling thread waited long
    for the others at its end (cypool_note_end)."""
    cypool_note_end(team.opened_ns, team.done_ns)


cdef inline Py_ssize_t _claim(Team* team, Py_ssize_t Q, Py_ssize_t B,
                              Py_ssize_t* end) noexcept nogil:
    """The start of the next block [start, *end) of Q work items this thread
    takes from the call's team, B items at a time; Q or more when none is
    left. Set *end = -1 before the first call.

    The kernels' threading: the work of a block, per-thread buffers
    included, is a function over [start, end); a serial call runs it on
    [0, Q) without a parallel region, a parallel call runs it on the
    blocks each thread claims. Claimed, not split in equal shares: where
    another library's threads still spin (OpenBLAS for about 0.1 s after
    a product) or a neighbour takes a core, a static share waits for its
    slowest thread, while claimed blocks go to the threads that run. A
    team thread's first claim tells whether it started late
    (cypool_note_start), and _team_end whether the calling thread waited
    long for a thread preempted mid-block (cypool_note_end): on libgomp's
    team either starts a crowded spell, in which calls run serial
    (docs/performance.md, "Threads inside real programs"). On cypool's own team
    (_team.h) a late thread number runs on the calling thread once its
    blocks are done, and finds none left."""
    cdef Py_ssize_t start
    cdef int t = omp_get_thread_num()
    if end[0] < 0 and t != 0:
        cypool_note_start(team.opened_ns)
    if not _claiming:
        if end[0] >= 0:
            start = Q
        else:
            end[0] = _share_start(Q, t + 1)
            start = _share_start(Q, t)
    else:
        start = cypool_claim(&team.next, B)
        end[0] = start + B if start + B < Q else Q
    if t == 0 and start >= Q:
        team.done_ns = cypool_now_ns()
    return start


def crowded():
    """Whether a team thread of a recent parallel call started late, its
    core taken by other threads: then _backend.threads_for runs calls on
    the calling thread alone for a spell (10 ms, doubling up to 160 ms
    while team threads keep starting late; _omp_shim.h)."""
    return bool(cypool_crowded())


def _set_crowded(bint on):
    """Start a crowded spell of the longest length now (True), or end it
    (False); either way the next spell's length starts at its shortest
    (cypool._testing.set_crowded)."""
    cypool_set_crowded(on)


def last_team_size():
    """The team size the calling thread's last kernel call was split for (1
    for a serial call); with cypool's own team (_team.h) the calling thread
    runs a late team thread's share itself. Diagnostic for tests; each
    Python thread has its own."""
    return cypool_get_last_team()


def team_counts():
    """Diagnostic: this module's thread team so far, as a dict of regions
    opened on it, thread numbers its team threads ran, thread numbers the
    calling thread ran in place of a late team thread, the calling
    thread's sleeps waiting for team threads at a region's end, team
    threads' moves off the calling thread's CPU, and team threads the
    calling thread moved onto its own CPU at a region's end, found
    preempted in the middle of their work; regions handed to libgomp's
    pool while its threads were spinning; and regions whose sleeping team
    threads the lookout woke. None where the parallel blocks run on
    libgomp's team (_team.h)."""
    cdef uint64_t[8] c
    if not cypool_team_counts(&c[0]):
        return None
    return {"regions": c[0], "joined": c[1], "stolen": c[2], "slept": c[3], "moved": c[4],
            "pulled": c[5], "handed": c[6], "lookout": c[7]}


def _team_tables():
    """(this module's own team's table, libgomp's), as addresses; 0 for one
    this build lacks (_team.h)."""
    return <size_t>cypool_team_own(), <size_t>cypool_team_libgomp()


def _use_team(size_t table, bint affinity, bint lookout):
    """Run this module's parallel blocks on the team of table (an address
    from _team_tables, of any module), its affinity moves and its lookout
    on or off. Only before this module's first parallel region
    (cypool._backend, at import)."""
    if table:
        cypool_team_use(<const void*>table)
    cypool_team_configure(affinity, lookout)


def openmp_info():
    """(compiled with OpenMP, _OPENMP version macro, omp_get_max_threads())."""
    return bool(CYPOOL_HAVE_OPENMP), int(CYPOOL_OPENMP_VERSION), omp_get_max_threads()


def max_threads():
    """omp_get_max_threads(): OpenMP's default team size for this thread."""
    return omp_get_max_threads()


cdef extern from "_cpuid.h" nogil:
    uint32_t cypool_cpuid_bits()
    const char* CYPOOL_CPU_NAMES


def cpu_features():
    """The CPU features the variants need, as CPUID and XGETBV report them
    (the OS saving AVX and AVX-512 state included): {name: bool}, numpy's
    names; empty where CPUID cannot be asked (not x86-64)."""
    cdef uint32_t bits = cypool_cpuid_bits()
    if not bits >> 31:
        return {}
    names = CYPOOL_CPU_NAMES.decode().split()
    return {name: bool((bits >> i) & 1) for i, name in enumerate(names)}


# Buffers of the arrays a Python-facing kernel reads through the buffer
# protocol (their pointers and strides, without a typed memoryview's cost):
# each one taken by _hold and all of them released by _release_all, on every
# way out of the call:
#     cdef Held held
#     held.n = 0
#     try:
#         v = _hold(&held, x, False)
#         ...
#     finally:
#         _release_all(&held)
cdef enum:
    _HELD_MAX = 8

cdef struct Held:
    Py_buffer views[_HELD_MAX]
    int n               # views[:n] are held


cdef Py_buffer* _hold(Held* h, object a, bint writable) except NULL:
    """a's buffer (with its strides and format), held by h until
    _release_all(h)."""
    if h.n >= _HELD_MAX:
        raise RuntimeError("cypool: too many buffers held")
    PyObject_GetBuffer(a, &h.views[h.n], PyBUF_STRIDES | PyBUF_FORMAT
                       | (PyBUF_WRITABLE if writable else 0))
    h.n += 1
    return &h.views[h.n - 1]


cdef void _release_all(Held* h) noexcept:
    """Release every buffer h holds, newest first."""
    while h.n > 0:
        h.n -= 1
        PyBuffer_Release(&h.views[h.n])
