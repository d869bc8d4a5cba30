# Uses: _common.pxi; _simd.h.
# Feature-map argmax: the first maximum (or first NaN) of each contiguous map.
#
# A map is scanned in chunks. For each chunk a vectorised pass keeps running
# maxima in SIMD lanes (for floats: MAXPS, SSE2 or AVX2 by build, which is
# exactly v > m ? v : m, in _simd.h) and ORs together "is NaN" flags. Only when a
# chunk's maximum beats the best so far is the chunk searched again for the
# first element equal to it; on random data that happens O(log n) times per
# map. A chunk holding a NaN is searched for its first NaN, and the scan
# stops there: nothing later can win.
#
# Large maps are split into segments so that every thread has work even for
# one map; the partial results are merged in segment order, which keeps the
# first-maximum rule.

DEF LANES = 16
DEF CHUNK = 512

cdef extern from "_simd.h" nogil:
    bint cypool_chunk_max_f32(const float* x, Py_ssize_t n, float* out)
    bint cypool_chunk_max_f64(const double* x, Py_ssize_t n, double* out)
    Py_ssize_t cypool_first_f32(const float* x, Py_ssize_t n, float t, bint want_nan)
    Py_ssize_t cypool_first_f64(const double* x, Py_ssize_t n, double t, bint want_nan)


cdef inline bint _chunk_max(const value_t* x, Py_ssize_t n, value_t low,
                            value_t* cmax) noexcept nogil:
    """Maximum of x[:n] into cmax (NaN ignored); returns True if any is NaN."""
    if value_t is float:
        return cypool_chunk_max_f32(x, n, cmax)
    elif value_t is double:
        return cypool_chunk_max_f64(x, n, cmax)
    else:
        return _chunk_max_lanes(x, n, low, cmax)


cdef inline bint _chunk_max_lanes(const value_t* x, Py_ssize_t n, value_t low,
                                  value_t* cmax) noexcept nogil:
    """_chunk_max in LANES running maxima that gcc vectorises (the integer
    types; the floats have intrinsics in _simd.h)."""
    cdef value_t lm[LANES]
    cdef bint nan[LANES]
    cdef Py_ssize_t i, l, nv = n - n % LANES
    cdef value_t v, m
    cdef bint anynan = False
    for l in range(LANES):
        lm[l] = low
        nan[l] = False
    for i in range(0, nv, LANES):
        for l in range(LANES):
            v = x[i + l]
            lm[l] = v if v > lm[l] else lm[l]
            nan[l] = nan[l] | (v != v)
    m = low
    for l in range(LANES):
        m = lm[l] if lm[l] > m else m
        anynan = anynan | nan[l]
    for i in range(nv, n):
        v = x[i]
        m = v if v > m else m
        anynan = anynan | (v != v)
    cmax[0] = m
    return anynan


cdef inline Py_ssize_t _first_equal(const value_t* x, Py_ssize_t n, value_t target) noexcept nogil:
    """First i with x[i] == target (target is not NaN)."""
    cdef Py_ssize_t i
    if value_t is float:
        return cypool_first_f32(x, n, target, False)
    elif value_t is double:
        return cypool_first_f64(x, n, target, False)
    else:
        for i in range(n):
            if x[i] == target:
                return i
        return 0


cdef inline Py_ssize_t _first_nan(const value_t* x, Py_ssize_t n) noexcept nogil:
    """First i with x[i] NaN (the caller knows there is one)."""
    cdef Py_ssize_t i
    if value_t is float:
        return cypool_first_f32(x, n, 0, True)
    elif value_t is double:
        return cypool_first_f64(x, n, 0, True)
    else:
        for i in range(n):
            if x[i] != x[i]:
                return i
        return 0


cdef inline Py_ssize_t _argmax_range(const value_t* x, Py_ssize_t n, value_t* best) noexcept nogil:
    """Position of the first maximum of x[:n], n >= 1, which goes to best
    (NaN counts as maximum, first NaN wins). The position is returned, not
    written through a pointer, so that prange makes its target private."""
    cdef value_t low = _lowest(<value_t*>NULL)
    cdef value_t b = x[0], cm
    cdef Py_ssize_t bi = 0, c0, ln
    for c0 in range(0, n, CHUNK):
        ln = min(CHUNK, n - c0)
        if _chunk_max(x + c0, ln, low, &cm):
            bi = c0 + _first_nan(x + c0, ln)
            best[0] = x[bi]
            return bi
        if cm > b:
            b = cm
            bi = c0 + _first_equal(x + c0, ln, cm)
    best[0] = b
    return bi


def argmax2d(const value_t[:, ::1] x,      # IN  (P, H*W) maps
             value_t[::1] values,          # OUT (P,)
             index_t[:, ::1] coords,       # OUT (P, 2) as (row, col)
             Py_ssize_t W, Py_ssize_t segments, int num_threads):
    """Per-map first maximum. segments > 1 splits each map into that many
    parts scanned in parallel and merged in order."""
    cdef Py_ssize_t P = x.shape[0], n = x.shape[1], p, s, t, lo, hi, seg_len, where
    cdef Py_ssize_t T = P * segments
    cdef value_t* sval
    cdef Py_ssize_t* swhere
    cdef value_t b, v
    cdef Py_ssize_t start, end, B
    cdef Team team
    if P == 0:
        return
    if segments <= 1:
        B = _claim_block(P, num_threads)
        _team_begin(&team)
        with nogil, parallel(num_threads=num_threads):
            _note_team()
            end = -1
            start = _claim(&team, P, B, &end)
            while start < P:
                for p in range(start, end):
                    where = _argmax_range(&x[p, 0], n, &values[p])
                    coords[p, 0] = <index_t>(where // W)
                    coords[p, 1] = <index_t>(where % W)
                start = _claim(&team, P, B, &end)
        _team_end(&team)
        return
    seg_len = (n + segments - 1) // segments
    sval = <value_t*>malloc(T * sizeof(value_t))
    swhere = <Py_ssize_t*>malloc(T * sizeof(Py_ssize_t))
    if sval == NULL or swhere == NULL:
        free(sval)
        free(swhere)
        raise MemoryError("cypool.argmax2d: out of memory")
    B = _claim_block(T, num_threads)
    _team_begin(&team)
    with nogil, parallel(num_threads=num_threads):
        _note_team()
        end = -1
        start = _claim(&team, T, B, &end)
        while start < T:
            for t in range(start, end):
                lo = (t % segments) * seg_len
                hi = min(lo + seg_len, n)
                if lo < hi:
                    swhere[t] = lo + _argmax_range(&x[t // segments, lo], hi - lo, &sval[t])
                else:
                    swhere[t] = -1
            start = _claim(&team, T, B, &end)
    _team_end(&team)
    with nogil:
        for p in range(P):
            b = sval[p * segments]
            where = swhere[p * segments]
            for s in range(1, segments):
                t = p * segments + s
                if b != b or swhere[t] < 0:
                    break
                v = sval[t]
                if takes_over(v, b):
                    b = v
                    where = swhere[t]
            values[p] = b
            coords[p, 0] = <index_t>(where // W)
            coords[p, 1] = <index_t>(where % W)
    free(sval)
    free(swhere)
