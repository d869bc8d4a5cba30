# Uses: _common.pxi (floating, int64_t, memset, _share_start, _note_team,
# _set_serial_team); _zonotope.pxi (ZLANES).
# Back-substitution kernels of cypool.verify (_crown.py, _patches.py): the
# steps that move K rows of bound coefficients through a ReLU's relaxation,
# an elementwise map, and onto the input box, in place and in one pass.
# Rows are either whole, (K, n) over a layer's flat neurons, or patches,
# (K, C, h, w) windows at origins (oy[k], ox[k]) of a (C, H, W) layer; a
# patch's coefficients outside the layer (a convolution's padding) are
# set to 0. Rows are split in contiguous shares, one per thread.
# Or columns, (n, K): neuron j's coefficients of the K rows side by side,
# each step a pass over them with neuron j's scalars (the layout of the
# vector convolution's input gradient, E = K); the n neurons are cut in
# a fixed number of parts, whose sums are added in part order (the same
# bits on any number of threads), and threads take whole parts.


# The spans select by arithmetic, never by a conditional load: gcc 12.2 at
# -O3 with 256-bit vectors (the avx2 and avx512 modules) summed
# `v * (lo[j] if v > 0 else hi[j])` wrongly.
# neg is v's negative part, NaN for a NaN v: a NaN coefficient reaches
# its row's sum, as in numpy's min(A, 0) @ t.

cdef floating _relu_span(floating* p, const floating* a, const floating* s, const floating* t,
                         Py_ssize_t n) noexcept nogil:
    """p[j] *= (s[j] if p[j] < 0 else a[j]); returns the sum of min(p[j], 0)
    * t[j] (the old p), in ZLANES running sums."""
    cdef floating acc[ZLANES]
    cdef floating v, neg, tot = 0
    cdef Py_ssize_t j, l, nv = n - n % ZLANES
    for l in range(ZLANES):
        acc[l] = 0
    for j in range(0, nv, ZLANES):
        for l in range(ZLANES):
            v = p[j + l]
            neg = v if not v >= 0 else 0
            acc[l] += neg * t[j + l]
            p[j + l] = neg * s[j + l] + (v - neg) * a[j + l]
    for l in range(ZLANES):
        tot += acc[l]
    for j in range(nv, n):
        v = p[j]
        neg = v if not v >= 0 else 0
        tot += neg * t[j]
        p[j] = neg * s[j] + (v - neg) * a[j]
    return tot


cdef floating _affine_span(floating* p, const floating* scale, const floating* bias,
                           Py_ssize_t n) noexcept nogil:
    """Returns sum p[j] * bias[j], then p[j] *= scale[j] (kept where scale
    is NULL)."""
    cdef floating acc[ZLANES]
    cdef floating tot = 0
    cdef Py_ssize_t j, l, nv = n - n % ZLANES
    for l in range(ZLANES):
        acc[l] = 0
    for j in range(0, nv, ZLANES):
        for l in range(ZLANES):
            acc[l] += p[j + l] * bias[j + l]
    for l in range(ZLANES):
        tot += acc[l]
    for j in range(nv, n):
        tot += p[j] * bias[j]
    if scale != NULL:
        for j in range(n):
            p[j] *= scale[j]
    return tot


cdef floating _box_span(const floating* p, const floating* lo, const floating* hi,
                        Py_ssize_t n) noexcept nogil:
    """sum of max(p[j], 0) * lo[j] + min(p[j], 0) * hi[j]: the least of p . x
    over the box [lo, hi]."""
    cdef floating acc[ZLANES]
    cdef floating v, neg, tot = 0
    cdef Py_ssize_t j, l, nv = n - n % ZLANES
    for l in range(ZLANES):
        acc[l] = 0
    for j in range(0, nv, ZLANES):
        for l in range(ZLANES):
            v = p[j + l]
            neg = v if not v >= 0 else 0
            acc[l] += (v - neg) * lo[j + l] + neg * hi[j + l]
    for l in range(ZLANES):
        tot += acc[l]
    for j in range(nv, n):
        v = p[j]
        neg = v if not v >= 0 else 0
        tot += (v - neg) * lo[j] + neg * hi[j]
    return tot


DEF STEP_RELU = 0
DEF STEP_AFFINE = 1
DEF STEP_BOX = 2


cdef struct StepArgs:
    int step
    Py_ssize_t K, C, h, w          # rows, and each row's (C, h, w); whole rows: C = h = 1
    Py_ssize_t H, W                # the layer's rows and columns (whole rows: H = 1, W = w)
    const int64_t* oy              # the windows' origins (whole rows: NULL)
    const int64_t* ox
    const void* p0                 # RELU: a, s, t; AFFINE: scale (or NULL), bias; BOX: lo, hi
    const void* p1
    const void* p2
    void* A                        # (K, C, h, w), changed in place (not by BOX)
    void* acc                      # (K,): each row's sum is added to it


cdef floating _step_span(const StepArgs* g, floating* p, Py_ssize_t q, Py_ssize_t n) noexcept nogil:
    """The step on n coefficients p, over the layer's flat elements from q."""
    cdef const floating* x0 = <const floating*>g.p0
    cdef const floating* x1 = <const floating*>g.p1
    if g.step == STEP_RELU:
        return _relu_span(p, x0 + q, x1 + q, <const floating*>g.p2 + q, n)
    if g.step == STEP_AFFINE:
        if x0 == NULL:
            return _affine_span(p, NULL, x1 + q, n)
        return _affine_span(p, x0 + q, x1 + q, n)
    return _box_span(p, x0 + q, x1 + q, n)


cdef void _step_rows(const StepArgs* g, floating* dummy, Py_ssize_t start,
                     Py_ssize_t end) noexcept nogil:
    """Rows [start, end) of the step (dummy: the dtype only)."""
    cdef floating* A = <floating*>g.A
    cdef floating* acc = <floating*>g.acc
    cdef Py_ssize_t k, c, i, y, x0, x1, span = g.C * g.h * g.w
    cdef floating tot
    cdef floating* p
    for k in range(start, end):
        p = A + k * span
        tot = 0
        if g.oy == NULL:
            tot = _step_span(g, p, 0, g.w)
        else:
            # the window's columns inside the layer: [x0, x1)
            x0 = -g.ox[k] if g.ox[k] < 0 else 0
            x1 = g.W - g.ox[k] if g.W - g.ox[k] < g.w else g.w
            for c in range(g.C):
                for i in range(g.h):
                    y = g.oy[k] + i
                    if y < 0 or y >= g.H or x1 <= x0:
                        if g.step != STEP_BOX:
                            memset(p, 0, g.w * sizeof(floating))
                    else:
                        if g.step != STEP_BOX:
                            memset(p, 0, x0 * sizeof(floating))
                            memset(p + x1, 0, (g.w - x1) * sizeof(floating))
                        tot += _step_span(g, p + x0, (c * g.H + y) * g.W + g.ox[k] + x0,
                                          x1 - x0)
                    p += g.w
        acc[k] += tot


DEF COL_PARTS = 8


cdef void _step_cols(const StepArgs* g, floating* sums, Py_ssize_t j0,
                     Py_ssize_t j1) noexcept nogil:
    """Rows [j0, j1) of the RELU or BOX step on A (g.w, g.K), each row a pass
    over its K columns; their sums added to sums (K,)."""
    cdef const floating* x0 = <const floating*>g.p0
    cdef const floating* x1 = <const floating*>g.p1
    cdef const floating* x2 = <const floating*>g.p2
    cdef Py_ssize_t j, k, n = g.K
    cdef floating* p
    cdef floating v, neg, c0, c1, c2
    for j in range(j0, j1):
        p = <floating*>g.A + j * n
        if g.step == STEP_RELU:
            c0, c1, c2 = x0[j], x1[j], x2[j]
            for k in range(n):
                v = p[k]
                neg = v if not v >= 0 else 0
                sums[k] += neg * c2
                p[k] = neg * c1 + (v - neg) * c0
        else:
            c0, c1 = x0[j], x1[j]
            for k in range(n):
                v = p[k]
                neg = v if not v >= 0 else 0
                sums[k] += (v - neg) * c0 + neg * c1


cdef void _run_step(const StepArgs* g, floating* dummy, int num_threads,
                    bint cols=False) noexcept nogil:
    """The step on g's rows, or on its columns (cols: A is (g.w, g.K), its
    rows cut in COL_PARTS parts whose sums are added in part order; each
    part's sums a line or more apart from the next's, as threads write them
    row after row)."""
    cdef int tid
    cdef Py_ssize_t q, k, parts = COL_PARTS if g.w >= COL_PARTS else 1
    cdef Py_ssize_t stride = (g.K + 15) // 16 * 16 + 16
    cdef floating* sums = NULL
    cdef floating* acc = <floating*>g.acc
    if cols:
        sums = <floating*>calloc(parts * stride, sizeof(floating))
        if sums == NULL:  # no memory: one part, into acc
            parts = 1
        if num_threads > parts:  # never more threads than parts
            num_threads = <int>parts
    if num_threads == 1:
        _set_serial_team()
        if cols:
            for q in range(parts):
                _step_cols(g, acc if sums == NULL else sums + q * stride,
                           _part_start(g.w, q, parts), _part_start(g.w, q + 1, parts))
        else:
            _step_rows(g, dummy, 0, g.K)
    else:
        with parallel(num_threads=num_threads):
            _note_team()
            tid = threadid()
            if cols:
                for q in range(_share_start(parts, tid), _share_start(parts, tid + 1)):
                    _step_cols(g, acc if sums == NULL else sums + q * stride,
                               _part_start(g.w, q, parts), _part_start(g.w, q + 1, parts))
            else:
                _step_rows(g, dummy, _share_start(g.K, tid), _share_start(g.K, tid + 1))
    if sums != NULL:
        for q in range(parts):
            for k in range(g.K):
                acc[k] += sums[q * stride + k]
        free(sums)


cdef void _set_window(StepArgs* g, floating[:, :, :, ::1] A, const int64_t[::1] oy,
                      const int64_t[::1] ox, Py_ssize_t H, Py_ssize_t W):
    """g's rows: A (not empty) at origins (oy, ox) of an (H, W) layer."""
    g.K, g.C, g.h, g.w = A.shape[0], A.shape[1], A.shape[2], A.shape[3]
    g.H, g.W = H, W
    g.oy, g.ox, g.A = &oy[0], &ox[0], &A[0, 0, 0, 0]


def crown_relu(floating[:, ::1] A,       # INOUT (K, n): coefficient rows
               const floating[::1] a,    # IN (n,): lower slopes
               const floating[::1] s,    # IN (n,): upper slopes
               const floating[::1] t,    # IN (n,): upper intercepts
               floating[::1] acc,        # INOUT (K,): += min(A, 0) @ t
               int num_threads):
    """Rows A through a ReLU's relaxation (a x <= y <= s x + t): a negative
    coefficient takes the upper line, others the lower."""
    cdef StepArgs g
    cdef floating dummy = 0
    if A.size == 0:
        return
    g.step, g.K, g.C, g.h, g.w, g.H, g.W = STEP_RELU, A.shape[0], 1, 1, A.shape[1], 1, A.shape[1]
    g.oy = g.ox = NULL
    g.p0, g.p1, g.p2 = &a[0], &s[0], &t[0]
    g.A, g.acc = &A[0, 0], &acc[0]
    with nogil:
        _run_step(&g, &dummy, num_threads)


cdef void _relu_live_rows(const floating* A, Py_ssize_t n, const floating* a, const floating* s,
                          const floating* t, const int64_t* live, Py_ssize_t m, floating* out,
                          floating* acc, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """Rows [start, end) of crown_relu_live: each row's live coefficients
    gathered, then the step in place (a select on the sign in the
    gathering loop was a branch, mispredicted on half the coefficients)."""
    cdef Py_ssize_t k, i
    cdef const floating* p
    cdef floating* q
    for k in range(start, end):
        p = A + k * n
        q = out + k * m
        for i in range(m):
            q[i] = p[live[i]]
        acc[k] += _relu_span(q, a, s, t, m)


def crown_relu_live(const floating[:, ::1] A,     # IN (K, n): coefficient rows
                    const floating[::1] a,        # IN (m,): the relaxation of the live neurons
                    const floating[::1] s,
                    const floating[::1] t,
                    const int64_t[::1] live,      # IN (m,): in [0, n), checked by the caller
                    floating[:, ::1] out,         # OUT (K, m)
                    floating[::1] acc,            # INOUT (K,)
                    int num_threads):
    """crown_relu on the columns live of A only, into out: the other
    neurons are dead (a = s = t = 0), so their coefficients are 0 and add
    nothing, and the dense map below sums over live alone."""
    cdef Py_ssize_t K = A.shape[0], n = A.shape[1], m = live.shape[0]
    cdef int tid
    if K == 0 or m == 0:
        return
    with nogil:
        if num_threads == 1:
            _set_serial_team()
            _relu_live_rows(&A[0, 0], n, &a[0], &s[0], &t[0], &live[0], m, &out[0, 0], &acc[0], 0, K)
        else:
            with parallel(num_threads=num_threads):
                _note_team()
                tid = threadid()
                _relu_live_rows(&A[0, 0], n, &a[0], &s[0], &t[0], &live[0], m, &out[0, 0], &acc[0],
                                _share_start(K, tid), _share_start(K, tid + 1))


def crown_box(floating[:, ::1] A,        # IN (K, n): coefficient rows
              const floating[::1] lo,    # IN (n,): the box
              const floating[::1] hi,
              floating[::1] acc,         # INOUT (K,): += the least of A x on the box
              int num_threads):
    """Each row's lower bound over the box [lo, hi], added to acc."""
    cdef StepArgs g
    cdef floating dummy = 0
    if A.size == 0:
        return
    g.step, g.K, g.C, g.h, g.w, g.H, g.W = STEP_BOX, A.shape[0], 1, 1, A.shape[1], 1, A.shape[1]
    g.oy = g.ox = NULL
    g.p0, g.p1, g.p2 = &lo[0], &hi[0], NULL
    g.A, g.acc = &A[0, 0], &acc[0]
    with nogil:
        _run_step(&g, &dummy, num_threads)


cdef void _single_rows(const double* A, const double* v, float* out, double* mag, Py_ssize_t m,
                       Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """Rows [start, end) of crown_rows_single: a value past float32's range
    becomes an infinity of its sign (a plain cast of it is undefined). The
    sum runs in ZLANES lanes, a loop of its own: the select stops gcc's
    vectoriser."""
    cdef double sums[ZLANES]
    cdef Py_ssize_t k, i, l, mv = m - m % ZLANES
    cdef const double* p
    cdef double x
    for k in range(start, end):
        p = A + k * m
        for l in range(ZLANES):
            sums[l] = 0
        for i in range(0, mv, ZLANES):
            for l in range(ZLANES):
                sums[l] += fabs(p[i + l]) * v[i + l]
        for i in range(mv, m):
            sums[0] += fabs(p[i]) * v[i]
        mag[k] = 0
        for l in range(ZLANES):
            mag[k] += sums[l]
        for i in range(m):
            x = p[i]
            out[k * m + i] = <float>(x if fabs(x) <= FLT_MAX else x * INFINITY)


def crown_rows_single(const double[:, ::1] A,    # IN (K, m): coefficient rows
                      const double[::1] v,       # IN (m,): each column's weight in the charge
                      float[:, ::1] out,         # OUT (K, m): A rounded to float32
                      double[::1] mag,           # OUT (K,): |A| @ v
                      int num_threads):
    """The rows in float32 for a float32 product, and the magnitudes its
    rounding charge is made of."""
    cdef Py_ssize_t K = A.shape[0], m = A.shape[1]
    cdef int tid
    if K == 0 or m == 0:
        return
    with nogil:
        if num_threads == 1:
            _set_serial_team()
            _single_rows(&A[0, 0], &v[0], &out[0, 0], &mag[0], m, 0, K)
        else:
            with parallel(num_threads=num_threads):
                _note_team()
                tid = threadid()
                _single_rows(&A[0, 0], &v[0], &out[0, 0], &mag[0], m,
                             _share_start(K, tid), _share_start(K, tid + 1))


cdef void _box_single_rows(const float* A, const double* lo, const double* hi, double* acc,
                           Py_ssize_t n, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """Rows [start, end) of crown_box_single: _box_span's sum, each float32
    coefficient v taken exactly into float64, its parts max(v, 0) and
    min(v, 0) as (v + |v|) / 2 and (v - |v|) / 2 (exact for float32's
    range; a select there stops gcc's vectoriser)."""
    cdef double sums[ZLANES]
    cdef double v, a
    cdef Py_ssize_t k, j, l, nv = n - n % ZLANES
    cdef const float* p
    for k in range(start, end):
        p = A + k * n
        for l in range(ZLANES):
            sums[l] = 0
        for j in range(0, nv, ZLANES):
            for l in range(ZLANES):
                v = p[j + l]
                a = fabs(v)
                sums[l] += ((v + a) * 0.5) * lo[j + l] + ((v - a) * 0.5) * hi[j + l]
        for j in range(nv, n):
            v = p[j]
            a = fabs(v)
            sums[0] += ((v + a) * 0.5) * lo[j] + ((v - a) * 0.5) * hi[j]
        for l in range(ZLANES):
            acc[k] += sums[l]


def crown_box_single(const float[:, ::1] A,      # IN (K, n): coefficient rows, float32
                     const double[::1] lo,       # IN (n,): the box
                     const double[::1] hi,
                     double[::1] acc,            # INOUT (K,): += the least of A x on the box
                     int num_threads):
    """crown_box of float32 rows, summed in float64."""
    cdef Py_ssize_t K = A.shape[0], n = A.shape[1]
    cdef int tid
    if K == 0 or n == 0:
        return
    with nogil:
        if num_threads == 1:
            _set_serial_team()
            _box_single_rows(&A[0, 0], &lo[0], &hi[0], &acc[0], n, 0, K)
        else:
            with parallel(num_threads=num_threads):
                _note_team()
                tid = threadid()
                _box_single_rows(&A[0, 0], &lo[0], &hi[0], &acc[0], n,
                                 _share_start(K, tid), _share_start(K, tid + 1))


def crown_relu_patches(floating[:, :, :, ::1] A,     # INOUT (K, C, h, w)
                       const int64_t[::1] oy,        # IN (K,): window origins
                       const int64_t[::1] ox,
                       const floating[:, :, ::1] a,  # IN (C, H, W): the relaxation
                       const floating[:, :, ::1] s,
                       const floating[:, :, ::1] t,
                       floating[::1] acc,            # INOUT (K,)
                       int num_threads):
    """crown_relu on patches; coefficients outside the layer become 0."""
    cdef StepArgs g
    cdef floating dummy = 0
    if A.size == 0:
        return
    g.step = STEP_RELU
    _set_window(&g, A, oy, ox, a.shape[1], a.shape[2])
    g.p0, g.p1, g.p2 = &a[0, 0, 0], &s[0, 0, 0], &t[0, 0, 0]
    g.acc = &acc[0]
    with nogil:
        _run_step(&g, &dummy, num_threads)


def crown_affine_patches(floating[:, :, :, ::1] A,        # INOUT (K, C, h, w)
                         const int64_t[::1] oy,           # IN (K,): window origins
                         const int64_t[::1] ox,
                         const floating[:, :, ::1] scale,  # IN (C, H, W) or None (1)
                         const floating[:, :, ::1] bias,   # IN (C, H, W)
                         floating[::1] acc,                # INOUT (K,): += A . bias
                         int num_threads):
    """Patches through y = scale x + bias; coefficients outside the layer
    become 0."""
    cdef StepArgs g
    cdef floating dummy = 0
    if A.size == 0:
        return
    g.step = STEP_AFFINE
    _set_window(&g, A, oy, ox, bias.shape[1], bias.shape[2])
    g.p0 = NULL
    if scale is not None:
        g.p0 = &scale[0, 0, 0]
    g.p1, g.p2 = &bias[0, 0, 0], NULL
    g.acc = &acc[0]
    with nogil:
        _run_step(&g, &dummy, num_threads)


def crown_box_patches(floating[:, :, :, ::1] A,       # IN (K, C, h, w)
                      const int64_t[::1] oy,          # IN (K,): window origins
                      const int64_t[::1] ox,
                      const floating[:, :, ::1] lo,   # IN (C, H, W): the box
                      const floating[:, :, ::1] hi,
                      floating[::1] acc,              # INOUT (K,)
                      int num_threads):
    """crown_box on patches (coefficients outside the layer are left out)."""
    cdef StepArgs g
    cdef floating dummy = 0
    if A.size == 0:
        return
    g.step = STEP_BOX
    _set_window(&g, A, oy, ox, lo.shape[1], lo.shape[2])
    g.p0, g.p1, g.p2 = &lo[0, 0, 0], &hi[0, 0, 0], NULL
    g.acc = &acc[0]
    with nogil:
        _run_step(&g, &dummy, num_threads)


cdef void _set_cols(StepArgs* g, int step, floating[:, ::1] A, const void* p0, const void* p1,
                    const void* p2, floating[::1] acc):
    """g's columns: A (n, K), not empty."""
    g.step, g.K, g.C, g.h, g.w, g.H, g.W = step, A.shape[1], 1, 1, A.shape[0], 1, A.shape[0]
    g.oy = g.ox = NULL
    g.p0, g.p1, g.p2 = p0, p1, p2
    g.A, g.acc = &A[0, 0], &acc[0]


def crown_relu_cols(floating[:, ::1] A,       # INOUT (n, K): the K rows as columns
                    const floating[::1] a,    # IN (n,): the relaxation
                    const floating[::1] s,
                    const floating[::1] t,
                    floating[::1] acc,        # INOUT (K,): += t @ min(A, 0)
                    int num_threads):
    """crown_relu on the columns of A."""
    cdef StepArgs g
    cdef floating dummy = 0
    if A.size == 0:
        return
    _set_cols(&g, STEP_RELU, A, &a[0], &s[0], &t[0], acc)
    with nogil:
        _run_step(&g, &dummy, num_threads, True)


def crown_box_cols(floating[:, ::1] A,        # IN (n, K)
                   const floating[::1] lo,    # IN (n,): the box
                   const floating[::1] hi,
                   floating[::1] acc,         # INOUT (K,)
                   int num_threads):
    """crown_box on the columns of A."""
    cdef StepArgs g
    cdef floating dummy = 0
    if A.size == 0:
        return
    _set_cols(&g, STEP_BOX, A, &lo[0], &hi[0], NULL, acc)
    with nogil:
        _run_step(&g, &dummy, num_threads, True)


cdef void _signed_cols_rows(const floating* M, Py_ssize_t m, const int64_t* cols, Py_ssize_t k,
                            floating* A, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """Rows [start, end) of crown_signed_cols."""
    cdef Py_ssize_t j, q
    cdef const floating* src
    cdef floating* dst
    for j in range(start, end):
        src = M + j * m
        dst = A + j * 2 * k
        for q in range(k):
            dst[q] = src[cols[q]]
        for q in range(k):
            dst[k + q] = -dst[q]


def crown_signed_cols(const floating[:, ::1] M,     # IN (n, m)
                      const int64_t[::1] cols,      # IN (k,): in [0, m), checked by the caller
                      floating[:, ::1] A,           # OUT (n, 2k)
                      int num_threads):
    """A = [M[:, cols], -M[:, cols]]: the columns of a dense layer's
    transposed weights for y_r and -y_r, in one pass over A's rows."""
    cdef Py_ssize_t n = M.shape[0], m = M.shape[1], k = cols.shape[0]
    cdef int tid
    if n == 0 or k == 0:
        return
    with nogil:
        if num_threads == 1:
            _set_serial_team()
            _signed_cols_rows(&M[0, 0], m, &cols[0], k, &A[0, 0], 0, n)
        else:
            with parallel(num_threads=num_threads):
                _note_team()
                tid = threadid()
                _signed_cols_rows(&M[0, 0], m, &cols[0], k, &A[0, 0], _share_start(n, tid),
                                  _share_start(n, tid + 1))


def crown_relaxation(const floating[::1] l,  # IN (n,): input bounds
                     const floating[::1] u,
                     floating[::1] a,        # OUT (n,): lower slopes
                     floating[::1] s,        # OUT (n,): upper slopes
                     floating[::1] t):       # OUT (n,): upper intercepts
    """The ReLU's relaxation on [l, u] (cypool.verify._crown.relaxation),
    in one pass: every value is computed and the case selects among them
    (no load under a condition; see the spans above). Any NaN in the upper
    intercept's two candidates is kept, as np.maximum keeps it."""
    cdef Py_ssize_t i, n = l.shape[0]
    cdef floating li, ui, su, t1, t2, tu
    cdef floating eps4 = 4 * (FLT_EPSILON if floating is float else DBL_EPSILON)
    cdef floating tiny = FLT_MIN if floating is float else DBL_MIN
    cdef bint active, unstable
    with nogil:
        for i in range(n):
            li = l[i]
            ui = u[i]
            active = li >= 0
            unstable = (li < 0) & (ui > 0)
            su = ui / (ui - li)
            t1 = -su * li
            t2 = ui - su * ui
            tu = t1 if (t1 >= t2) | (t1 != t1) else t2
            tu = tu + eps4 * (fabs(su * li) + ui) + tiny
            a[i] = 1 if active | (unstable & (ui >= -li)) else 0
            s[i] = 1 if active else (su if unstable else 0)
            t[i] = tu if unstable else 0
