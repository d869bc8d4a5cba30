# Shared declarations for every kernel family.
#
# Kernels only do arithmetic: every shape, parameter and index bound they rely
# on was checked by cypool/_checks.py before they are called. The value type is
# fused so that one source serves float32, float64 and the integer types.
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memset, memcpy
from libc.math cimport INFINITY
from libc.stdint cimport INT32_MIN, INT64_MIN, INT32_MAX, INT64_MAX
from libc.stdlib cimport malloc, calloc, free
from cython.parallel cimport prange, parallel, threadid

cdef extern from "_omp_shim.h" nogil:
    int omp_get_max_threads()
    int omp_get_thread_num()
    int omp_get_num_threads()
    int CYPOOL_HAVE_OPENMP
    int CYPOOL_OPENMP_VERSION

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


cdef int _last_team = 1


cdef inline void _note_team() noexcept nogil:
    """Record the size of the running OpenMP team (called from parallel loop
    bodies), so tests can check what a kernel really ran on."""
    global _last_team
    if omp_get_thread_num() == 0:
        _last_team = omp_get_num_threads()


cdef inline void _set_serial_team() noexcept nogil:
    """Record a serial call (no parallel region) for last_team_size()."""
    global _last_team
    _last_team = 1


cdef inline Py_ssize_t _share_start(Py_ssize_t Q, int t) noexcept nogil:
    """Where thread t's contiguous share of Q work items starts (share t
    ends where share t + 1 starts), as schedule="static" would split them.

    The kernels' one threading style: the work of a share, per-thread
    buffers included, is a function over [start, end); a serial call runs
    it on [0, Q) without a parallel region, a parallel call runs it on each
    thread's share. Assign the result in the parallel block, so that Cython
    makes the variable private to the thread."""
    return Q * t // omp_get_num_threads()


def last_team_size():
    """Threads the last parallel kernel call ran on (1 for a serial call).

    Diagnostic for tests; not meaningful while several Python threads call
    kernels at once."""
    return _last_team


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
