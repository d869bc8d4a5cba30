# 2-D max pooling with index tracking: forward, backward (scatter-add), unpool.
#
# Layout: the caller reshapes (N, C, H, W) to P = N*C contiguous planes; every
# kernel is parallel over planes, and one thread owns a whole plane, so every
# result is deterministic. Indices are flat offsets row * W + col into a plane.
#
# Forward, per output row, over all its columns in one vectorised loop:
#   * the kh input rows of the window come from the plane itself, or, where
#     the windows reach into the padding, from a small per-thread ring of
#     copies padded with the lowest value (-inf); rows wholly in the padding
#     point at a shared row of lowest values;
#   * each window starts from (lowest, code of its first valid tap) and scans
#     every tap in row-major order with the branchless select of _pick():
#     padding never takes over, so ties keep the first valid maximum and
#     nothing ever points into the padding;
#   * 2x2/stride 2 keeps the window in registers; 3x3/stride 1 or 2 is
#     separable (a horizontal scan per input row, then a vertical one); any
#     other window makes one pass per tap over the row;
#   * a window's "code" is the int32 offset of the winning tap from the window
#     origin, turned into the int64 (or int32) flat index at the end of the row.
# 3x3/stride 1/padding 1 on planes with short rows runs the separable scan
# over the whole plane as one flat loop instead (_pool_plane_flat3).
# When the caller asks (stream_indices: the call's data exceed the
# last-level cache), the indices are written with streaming stores.
# Planes of 2**31 elements or more take the scalar window loop instead.
#
# Backward scatter-adds each plane's gradients into a zeroed plane, after one
# vectorised bounds check; when every index lies in its own 2x2 block (a
# 2x2/stride-2 pooling), it writes the blocks directly instead (_blocks2x2).

# The flat 3x3 path is for short rows: measured here (AVX2, [16, C, W, W]),
# it takes half the time of the row path at W = 14 to 32, the same at 40,
# and up to 1.3x longer from 48 on, where the row loop vectorises well and
# the whole-plane buffers no longer fit in L1. (H + 2) * W is capped so its
# two buffers stay in L2.
DEF _FLAT3_MAX_W = 39
DEF _FLAT3_MAX = 16384
# The largest output plane whose indices are streamed (see _pool_one): its
# int32 buffer (256 KiB) stays in L2.
DEF _STREAM_MAX_PLANE = 65536

cdef extern from "_simd.h" nogil:
    ctypedef struct cypool_pending:
        size_t left
    void cypool_pending_start(cypool_pending* p, void* dst, const int32_t* src, size_t n, int wide)
    void cypool_pending_finish(cypool_pending* p)
    void cypool_stream_fence()
    bint CYPOOL_FLAT3_SIMD
    bint cypool_flat3_h_f32(const float* x, const float* lcap, const float* rcap,
                            float* hv, int32_t* hc, Py_ssize_t lo, Py_ssize_t hi,
                            cypool_pending* pend)
    void cypool_flat3_v_f32(const float* hv, const int32_t* hc, float* op, int32_t* ip,
                            Py_ssize_t n, Py_ssize_t W, cypool_pending* pend)


cdef struct PoolGeom:
    Py_ssize_t H, W, OH, OW
    Py_ssize_t kh, kw, sh, sw, ph, pw, dh, dw
    Py_ssize_t Wp          # padded row length: covers every window of a row
    Py_ssize_t R           # ring slots: input rows one output row spans
    bint direct_cols       # rows need no column padding: read the plane itself
    bint separable3        # 3x3, no dilation, stride 1 or 2 along rows
    bint flat3             # 3x3, stride 1, padding 1, no dilation, small plane
    bint stream_idx        # indices go through ibuf (int32) and streaming stores
    bint weave             # ... streamed while the next plane is pooled


cdef inline Py_ssize_t _ceil_div(Py_ssize_t a, Py_ssize_t b) noexcept nogil:
    """Ceiling of a / b for b > 0 and a >= 0."""
    return (a + b - 1) // b


cdef inline void _valid_taps(Py_ssize_t start, Py_ssize_t k, Py_ssize_t d,
                             Py_ssize_t n, Py_ssize_t* lo, Py_ssize_t* hi) noexcept nogil:
    """Taps t in [lo, hi) of a window at start with k taps of step d inside [0, n)."""
    lo[0] = _ceil_div(-start, d) if start < 0 else 0
    hi[0] = _ceil_div(n - start, d) if n > start else 0
    if hi[0] > k:
        hi[0] = k


cdef inline void _window_scalar(const value_t* xp, const PoolGeom* g, Py_ssize_t h0,
                                Py_ssize_t i_lo, Py_ssize_t i_hi, Py_ssize_t ow,
                                value_t* best, Py_ssize_t* where) noexcept nogil:
    """Maximum and its flat index over one window, skipping padding taps."""
    cdef Py_ssize_t w0 = ow * g.sw - g.pw
    cdef Py_ssize_t j_lo, j_hi, i, j, pos
    cdef value_t m = 0, v
    cdef Py_ssize_t at = -1
    _valid_taps(w0, g.kw, g.dw, g.W, &j_lo, &j_hi)
    for i in range(i_lo, i_hi):
        for j in range(j_lo, j_hi):
            pos = (h0 + i * g.dh) * g.W + w0 + j * g.dw
            v = xp[pos]
            if at < 0 or takes_over(v, m):
                m = v
                at = pos
    best[0] = m
    where[0] = at


cdef inline value_t _pick(value_t v, value_t m, int32_t kv, int32_t* k,
                          bint* m_ok) noexcept nogil:
    """One branchless step of a window scan: keep m or take v (and its code kv).

    Same rule as takes_over(), with "m is not NaN" carried in m_ok instead of
    recomputed as m == m: gcc 12 does not vectorise a compare of the result
    of the previous select. Keep the order (value, code, flag): gcc's
    if-conversion is sensitive to it.
    """
    cdef bint t = (not (v <= m)) & m_ok[0]
    cdef value_t r = v if t else m
    k[0] = kv if t else k[0]
    m_ok[0] = m_ok[0] & ((v == v) | (not t))
    return r


cdef inline value_t _win2x2(const value_t* r0, const value_t* r1, Py_ssize_t w,
                            int32_t W, value_t m, int32_t* k) noexcept nogil:
    """Scan a 2x2 window at column w of rows r0, r1, from running max m."""
    cdef bint ok = True
    m = _pick(r0[w], m, 0, k, &ok)
    m = _pick(r0[w + 1], m, 1, k, &ok)
    m = _pick(r1[w], m, W, k, &ok)
    return _pick(r1[w + 1], m, W + 1, k, &ok)


cdef inline void _row_k2s2(const value_t** rows, value_t* orow, index_t* irow,
                           const int32_t* kcol, int32_t krow, Py_ssize_t OW,
                           Py_ssize_t W, Py_ssize_t origin, value_t low) noexcept nogil:
    """One output row for a 2x2 window, stride 2, no dilation.

    rows[i] points at column -pw of input row h0 + i; origin = h0 * W - pw.
    """
    cdef Py_ssize_t ow
    cdef int32_t k
    cdef const value_t* r0 = rows[0]
    cdef const value_t* r1 = rows[1]
    # Two loops rather than a test inside one, so that both vectorise.
    if irow != NULL:
        for ow in range(OW):
            k = krow + kcol[ow]
            orow[ow] = _win2x2(r0, r1, 2 * ow, <int32_t>W, low, &k)
            irow[ow] = <index_t>(origin + 2 * ow) + <index_t>k
    else:
        for ow in range(OW):
            orow[ow] = _win2x2(r0, r1, 2 * ow, <int32_t>W, low, &k)


cdef inline void _row_generic(const value_t** rows, value_t* orow, index_t* irow,
                              int32_t* code, const int32_t* kcol, int32_t krow,
                              const PoolGeom* g, Py_ssize_t origin, value_t low,
                              Py_ssize_t i_lo, Py_ssize_t i_hi) noexcept nogil:
    """One output row, any window: one vectorised pass per tap.

    Rows wholly in the padding (i outside [i_lo, i_hi)) cannot take over and
    are skipped.
    """
    cdef Py_ssize_t ow, i, j
    cdef Py_ssize_t OW = g.OW, sw = g.sw, jd
    cdef const value_t* r
    cdef int32_t off
    cdef value_t v, m
    cdef bint t
    for ow in range(OW):
        orow[ow] = low
        code[ow] = krow + kcol[ow]
    for i in range(i_lo, i_hi):
        r = rows[i]
        for j in range(g.kw):
            off = <int32_t>(i * g.dh * g.W + j * g.dw)
            jd = j * g.dw
            for ow in range(OW):
                v = r[ow * sw + jd]
                m = orow[ow]
                t = takes_over(v, m)
                orow[ow] = v if t else m
                code[ow] = off if t else code[ow]
    if irow != NULL:
        for ow in range(OW):
            irow[ow] = <index_t>(origin + ow * sw) + <index_t>code[ow]


cdef struct Workspace:
    # One per thread, allocated as one block by _workspace_new.
    void* ring             # R padded rows of Wp values (unless direct_cols)
    Py_ssize_t* tag        # input row held by each ring slot, -1 for none
    void** rows            # kh row pointers for the current output row
    int32_t* code          # per-column window codes (generic path)
    void* hval             # separable 3x3: 4 slots of OW horizontal maxima
                           # (flat 3x3: H + 2 rows of W, padding rows first and last)
    int32_t* hcode         # ... and their column codes
    Py_ssize_t htag[4]     # input row held by each slot (-1: none, -2: padding row)
    int32_t* ibuf          # with stream_idx: one output plane of indices (two with weave)
    int ibuf_flip          # with weave: which of them the next plane takes
    cypool_pending pend    # with stream_idx: the plane of indices on its way out


cdef inline size_t _round_up(size_t n) noexcept nogil:
    return (n + 63) & ~(<size_t>63)


cdef Workspace* _workspace_new(const PoolGeom* g, size_t itemsize, value_t low) noexcept nogil:
    """Allocate one thread's workspace in a single block, ring rows filled
    with low (which also types the ring); NULL when out of memory.

    One allocation rather than five: at batch size 1 the allocator is a
    visible share of a call."""
    cdef Py_ssize_t q
    cdef bint ring = not (g.direct_cols or g.flat3)
    cdef size_t n_ring = g.R * g.Wp if ring else 0
    cdef size_t n_tag = g.R if ring else 0
    cdef size_t off_rows = _round_up(sizeof(Workspace))
    cdef size_t off_tag = off_rows + _round_up(g.kh * sizeof(void*))
    cdef size_t off_ring = off_tag + _round_up(n_tag * sizeof(Py_ssize_t))
    cdef size_t n_h = (g.H + 2) * g.W if g.flat3 else (4 * g.OW if g.separable3 else 0)
    cdef size_t off_hval = off_ring + _round_up(n_ring * itemsize)
    cdef size_t off_hcode = off_hval + _round_up(n_h * itemsize)
    cdef size_t off_code = off_hcode + _round_up(n_h * sizeof(int32_t))
    cdef size_t off_ibuf = off_code + _round_up(g.OW * sizeof(int32_t))
    cdef size_t n_ibuf = (1 + g.weave) * _round_up(g.OH * g.OW * sizeof(int32_t)) if g.stream_idx else 0
    cdef char* block = <char*>malloc(off_ibuf + n_ibuf)
    cdef Workspace* ws = <Workspace*>block
    if block == NULL:
        return NULL
    ws.rows = <void**>(block + off_rows)
    ws.tag = <Py_ssize_t*>(block + off_tag) if n_tag else NULL
    ws.ring = <void*>(block + off_ring) if n_ring else NULL
    ws.code = <int32_t*>(block + off_code)
    ws.hval = <void*>(block + off_hval)
    ws.hcode = <int32_t*>(block + off_hcode)
    ws.ibuf = <int32_t*>(block + off_ibuf) if n_ibuf else NULL
    for q in range(4):
        ws.htag[q] = -1
    ws.ibuf_flip = 0
    ws.pend.left = 0
    for q in range(<Py_ssize_t>n_ring):
        (<value_t*>ws.ring)[q] = low
    if g.flat3:
        # The bottom padding row never takes over: its codes are never used.
        for q in range((g.H + 1) * g.W, (g.H + 2) * g.W):
            (<value_t*>ws.hval)[q] = low
            ws.hcode[q] = 0
    return ws


cdef inline void _workspace_free(Workspace* ws) noexcept nogil:
    free(ws)


cdef inline const value_t* _input_row(const value_t* xp, const value_t* low_row,
                                      Workspace* ws, const PoolGeom* g,
                                      Py_ssize_t ih) noexcept nogil:
    """Pointer to column -pw of input row ih, padded with lowest values."""
    cdef Py_ssize_t slot
    cdef value_t* dst
    if ih < 0 or ih >= g.H:
        return low_row
    if g.direct_cols:
        return xp + ih * g.W
    slot = ih % g.R
    dst = (<value_t*>ws.ring) + slot * g.Wp
    if ws.tag[slot] != ih:
        memcpy(dst + g.pw, xp + ih * g.W, g.W * sizeof(value_t))
        ws.tag[slot] = ih
    return dst


cdef inline void _hrow3(const value_t* r, value_t* hv, int32_t* hc, const int32_t* kcol,
                        Py_ssize_t OW, value_t low, const Py_ssize_t S) noexcept nogil:
    """Horizontal half of a separable 3x3 scan: the first maximum of the three
    taps of every window of one input row (r points at column -pw), with its
    column code, starting from (low, code of the first valid column)."""
    cdef Py_ssize_t ow
    cdef int32_t k
    cdef bint ok
    cdef value_t m
    for ow in range(OW):
        k = kcol[ow]
        ok = True
        m = _pick(r[S * ow], low, 0, &k, &ok)
        m = _pick(r[S * ow + 1], m, 1, &k, &ok)
        hv[ow] = _pick(r[S * ow + 2], m, 2, &k, &ok)
        hc[ow] = k


cdef inline void _vert3(const value_t* v0, const int32_t* c0, const value_t* v1,
                        const int32_t* c1, const value_t* v2, const int32_t* c2,
                        value_t* orow, index_t* irow, const int32_t* kcol, int32_t krow,
                        Py_ssize_t OW, int32_t W, Py_ssize_t origin, value_t low,
                        const Py_ssize_t S) noexcept nogil:
    """Vertical half: the three rows' maxima in order, so the first maximum in
    row-major window order wins, as in the direct scan."""
    cdef Py_ssize_t ow
    cdef int32_t k
    cdef bint ok
    cdef value_t m
    for ow in range(OW):
        k = krow + kcol[ow]
        ok = True
        m = _pick(v0[ow], low, c0[ow], &k, &ok)
        m = _pick(v1[ow], m, W + c1[ow], &k, &ok)
        orow[ow] = _pick(v2[ow], m, 2 * W + c2[ow], &k, &ok)
        if irow != NULL:
            irow[ow] = <index_t>(origin + S * ow) + <index_t>k


cdef inline void _hrow3_cached(const value_t* xp, const value_t* low_row, Workspace* ws,
                               const PoolGeom* g, const int32_t* kcol, Py_ssize_t ih,
                               value_t low, value_t** hv, int32_t** hc) noexcept nogil:
    """Horizontal results of input row ih, computed once per plane and kept in
    a ring of three slots (a fourth holds the all-padding row)."""
    cdef Py_ssize_t slot = 3 if (ih < 0 or ih >= g.H) else ih % 3
    cdef Py_ssize_t key = -2 if slot == 3 else ih
    hv[0] = (<value_t*>ws.hval) + slot * g.OW
    hc[0] = ws.hcode + slot * g.OW
    if ws.htag[slot] != key:
        if g.sw == 1:
            _hrow3(_input_row(xp, low_row, ws, g, ih), hv[0], hc[0], kcol, g.OW, low, 1)
        else:
            _hrow3(_input_row(xp, low_row, ws, g, ih), hv[0], hc[0], kcol, g.OW, low, 2)
        ws.htag[slot] = key


cdef inline void _row_k3_separable(const value_t* xp, const value_t* low_row, Workspace* ws,
                                   const PoolGeom* g, const int32_t* kcol, Py_ssize_t h0,
                                   Py_ssize_t i_lo, value_t* orow, index_t* irow,
                                   value_t low) noexcept nogil:
    """One output row of a 3x3 window, stride 1 or 2 along rows, no dilation:
    a horizontal scan per input row (shared by the output rows that use it)
    and a vertical scan per output row: 4 to 6 selects an output, not 9."""
    cdef value_t* v0
    cdef value_t* v1
    cdef value_t* v2
    cdef int32_t* c0
    cdef int32_t* c1
    cdef int32_t* c2
    _hrow3_cached(xp, low_row, ws, g, kcol, h0, low, &v0, &c0)
    _hrow3_cached(xp, low_row, ws, g, kcol, h0 + 1, low, &v1, &c1)
    _hrow3_cached(xp, low_row, ws, g, kcol, h0 + 2, low, &v2, &c2)
    if g.sw == 1:
        _vert3(v0, c0, v1, c1, v2, c2, orow, irow, kcol, <int32_t>(i_lo * g.W), g.OW,
               <int32_t>g.W, h0 * g.W - g.pw, low, 1)
    else:
        _vert3(v0, c0, v1, c1, v2, c2, orow, irow, kcol, <int32_t>(i_lo * g.W), g.OW,
               <int32_t>g.W, h0 * g.W - g.pw, low, 2)


# Flat 3x3, stride 1, padding 1 ("same" pooling) on small planes. Output
# plane and input plane have the same shape, so both passes run over the
# whole plane as one flat vectorised loop, with no per-row loop to pay for on
# short rows (28 wide: 3 AVX2 iterations and a tail per row otherwise):
#   * horizontal: taps p - 1, p, p + 1 of the flat plane; lcap/rcap hold
#     the highest value where the left/right tap is in the same row and the
#     lowest where it is padding, so min(tap, cap) pads the row. It
#     stores each row maximum with the flat input index it came from, so the
#     vertical pass selects indices and does no index arithmetic;
#   * vertical: over a buffer of H + 2 rows whose first and last rows are
#     padding, taps p, p + W, p + 2W.
# Each pass has two versions: one for planes without NaN, one compare and
# two selects a tap, and the NaN-aware one (_pick), about twice the work.
# The horizontal pass reports whether the plane holds a NaN; if so, it is
# redone by the NaN-aware versions. A call without indices (eval mode) takes
# a third horizontal version that keeps no indices: 20% less time for
# [16, 256, 28, 28] without indices, measured here.

cdef inline void _flat3_h_at(const value_t* x, Py_ssize_t p, Py_ssize_t W,
                             value_t* hv, int32_t* hc, value_t low) noexcept nogil:
    """Horizontal scan at flat position p, with bounds tests (plane ends)."""
    cdef Py_ssize_t w = p % W
    cdef value_t m = x[p - 1] if w > 0 else low
    cdef int32_t k = 0 if w > 0 else 1
    cdef bint ok = m == m
    m = _pick(x[p], m, 1, &k, &ok)
    hv[p] = _pick(x[p + 1] if w < W - 1 else low, m, 2, &k, &ok)
    hc[p] = <int32_t>p - 1 + k


cdef inline bint _flat3_h_fast(const value_t* x, const value_t* lcap,
                               const value_t* rcap, value_t* hv, int32_t* hc,
                               Py_ssize_t lo, Py_ssize_t hi, value_t low) noexcept nogil:
    """Horizontal scan at flat positions [lo, hi), 0 < lo, hi < H*W, for a
    plane without NaN: the first maximum of the three taps, starting from
    the left tap (or from low with the centre tap's index, in the left
    padding). Returns whether some x[p], lo <= p < hi, is NaN: then the
    results are wrong and the plane must take _flat3_h."""
    cdef Py_ssize_t p
    cdef value_t a, c, m, cap
    cdef int32_t k, q = <int32_t>lo, nan = 0
    for p in range(lo, hi):
        # The padding taps are capped (min with -inf) rather than selected:
        # gcc turns "load if in the row else low" into a masked load
        # (VMASKMOVPS), slow here. Without NaN, min(a, +inf) is a. q counts
        # in int32 beside p: derived from p, it is computed in int64.
        a = x[p - 1]
        c = x[p]
        nan |= -<int32_t>(c != c)
        cap = lcap[p]
        m = a if a < cap else cap
        k = q - <int32_t>(cap > low)
        k = q if c > m else k
        m = c if c > m else m
        a = x[p + 1]
        cap = rcap[p]
        a = a if a < cap else cap
        hc[p] = q + 1 if a > m else k
        hv[p] = a if a > m else m
        q += 1
    return nan != 0


cdef inline bint _flat3_h_values(const value_t* x, const value_t* lcap,
                                 const value_t* rcap, value_t* hv,
                                 Py_ssize_t lo, Py_ssize_t hi) noexcept nogil:
    """_flat3_h_fast without the indices (a call that returns none): the
    first maximum of the three capped taps, as there (so -0.0 and 0.0 come
    out as with indices). Returns whether some x[p], lo <= p < hi, is NaN."""
    cdef Py_ssize_t p
    cdef value_t a, b, c
    cdef int32_t nan = 0
    for p in range(lo, hi):
        a = x[p - 1]
        c = x[p]
        b = x[p + 1]
        nan |= -<int32_t>(c != c)
        a = a if a < lcap[p] else lcap[p]
        b = b if b < rcap[p] else rcap[p]
        c = c if c > a else a
        hv[p] = b if b > c else c
    return nan != 0


cdef inline void _flat3_h(const value_t* x, const value_t* lcap, const value_t* rcap,
                          value_t* hv, int32_t* hc, Py_ssize_t lo, Py_ssize_t hi,
                          value_t low) noexcept nogil:
    """_flat3_h_fast for any plane: NaN counts as the maximum, the first
    NaN wins. A NaN tap is not capped (min would drop it): the caps only
    say where the row ends."""
    cdef Py_ssize_t p
    cdef value_t a, m
    cdef int32_t k
    cdef bint ok, left
    for p in range(lo, hi):
        a = x[p - 1]
        left = lcap[p] > low
        m = a if left else low
        k = 1 - <int32_t>left
        ok = (a == a) | (not left)  # not m == m: gcc 12 won't vectorise that
        m = _pick(x[p], m, 1, &k, &ok)
        a = x[p + 1]
        hv[p] = _pick(a if rcap[p] > low else low, m, 2, &k, &ok)
        hc[p] = <int32_t>p - 1 + k


cdef inline void _flat3_v_fast(const value_t* hvb, const int32_t* hcb, value_t* op,
                               index_t* ip, Py_ssize_t n, Py_ssize_t W) noexcept nogil:
    """Vertical scan of a plane without NaN: rows r - 1, r, r + 1 of the
    horizontal results are rows r, r + 1, r + 2 of the padded buffer."""
    cdef Py_ssize_t p
    cdef value_t m, v
    cdef int32_t k, t
    if ip != NULL:
        for p in range(n):
            # Index selects written as bit masks: "hcb[p + W] if v > m else
            # k" becomes a masked load (VPMASKMOVD), slow here.
            m = hvb[p]
            k = hcb[p]
            v = hvb[p + W]
            t = -<int32_t>(v > m)
            k = (hcb[p + W] & t) | (k & ~t)
            m = v if v > m else m
            v = hvb[p + 2 * W]
            t = -<int32_t>(v > m)
            ip[p] = <index_t>((hcb[p + 2 * W] & t) | (k & ~t))
            op[p] = v if v > m else m
    else:
        for p in range(n):
            m = hvb[p]
            v = hvb[p + W]
            m = v if v > m else m
            v = hvb[p + 2 * W]
            op[p] = v if v > m else m


cdef inline void _flat3_v(const value_t* hvb, const int32_t* hcb, value_t* op,
                          index_t* ip, Py_ssize_t n, Py_ssize_t W) noexcept nogil:
    """_flat3_v_fast for any plane (NaN-aware picks)."""
    cdef Py_ssize_t p
    cdef value_t m
    cdef int32_t k
    cdef bint ok
    for p in range(n):
        m = hvb[p]
        k = hcb[p]
        ok = m == m
        m = _pick(hvb[p + W], m, hcb[p + W], &k, &ok)
        op[p] = _pick(hvb[p + 2 * W], m, hcb[p + 2 * W], &k, &ok)
        if ip != NULL:
            ip[p] = <index_t>k


cdef inline void _pool_plane_flat3(const value_t* xp, value_t* op, index_t* ip,
                                   const value_t* caps, Workspace* ws,
                                   const PoolGeom* g) noexcept nogil:
    """Max-pool one small plane with a 3x3 window, stride 1, padding 1."""
    cdef Py_ssize_t W = g.W, HW = g.H * g.W, w
    cdef value_t low = _lowest(<value_t*>NULL)
    cdef value_t* hvb = <value_t*>ws.hval
    cdef int32_t* hcb = ws.hcode
    cdef value_t* hv = hvb + W
    cdef int32_t* hc = hcb + W
    cdef bint nan = xp[0] != xp[0] or xp[HW - 1] != xp[HW - 1]
    _flat3_h_at(xp, 0, W, hv, hc, low)
    if HW > 1:
        if ip == NULL:
            nan |= _flat3_h_values(xp, caps, caps + HW, hv, 1, HW - 1)
        elif value_t is float and index_t is int32_t and CYPOOL_FLAT3_SIMD:
            # Streams the previous plane's indices as it goes (g.weave).
            nan |= cypool_flat3_h_f32(xp, caps, caps + HW, hv, hc, 1, HW - 1, &ws.pend)
        else:
            nan |= _flat3_h_fast(xp, caps, caps + HW, hv, hc, 1, HW - 1, low)
        if nan:
            _flat3_h(xp, caps, caps + HW, hv, hc, 1, HW - 1, low)
        _flat3_h_at(xp, HW - 1, W, hv, hc, low)
    # Top padding row: never takes over, and holds the index the first
    # valid row gives, so an all-lowest window still points at a valid tap.
    for w in range(W):
        hvb[w] = low
        hcb[w] = hc[w]
    if nan:
        _flat3_v(hvb, hcb, op, ip, HW, W)
    elif value_t is float and index_t is int32_t and CYPOOL_FLAT3_SIMD and ip != NULL:
        cypool_flat3_v_f32(hvb, hcb, op, ip, HW, W, &ws.pend)
    else:
        _flat3_v_fast(hvb, hcb, op, ip, HW, W)


cdef void _pool_plane(const value_t* xp, value_t* op, index_t* ip,
                      const value_t* low_row, const int32_t* kcol,
                      Workspace* ws, const PoolGeom* g, bint scalar_only) noexcept nogil:
    """Max-pool one (H, W) plane into (OH, OW); ip may be NULL (no indices)."""
    cdef Py_ssize_t oh, ow, h0, i_lo, i_hi, where, i, slot
    cdef Py_ssize_t W = g.W
    cdef value_t low = _lowest(<value_t*>NULL)
    cdef value_t* orow
    cdef index_t* irow = NULL
    cdef const value_t** rows = <const value_t**>ws.rows
    cdef bint plain = g.dh == 1 and g.dw == 1
    if not g.direct_cols:
        for slot in range(g.R):
            ws.tag[slot] = -1
    for slot in range(3):
        ws.htag[slot] = -1  # slot 3, the padding row, is the same for every plane
    for oh in range(g.OH):
        h0 = oh * g.sh - g.ph
        _valid_taps(h0, g.kh, g.dh, g.H, &i_lo, &i_hi)
        orow = op + oh * g.OW
        if ip != NULL:
            irow = ip + oh * g.OW
        if scalar_only:
            for ow in range(g.OW):
                _window_scalar(xp, g, h0, i_lo, i_hi, ow, &orow[ow], &where)
                if irow != NULL:
                    irow[ow] = <index_t>where
            continue
        if not g.separable3:
            for i in range(g.kh):
                rows[i] = _input_row(xp, low_row, ws, g, h0 + i * g.dh)
        if plain and g.kh == 2 and g.kw == 2 and g.sw == 2:
            _row_k2s2(rows, orow, irow, kcol, <int32_t>(i_lo * W), g.OW, W,
                      h0 * W - g.pw, low)
        elif g.separable3:
            _row_k3_separable(xp, low_row, ws, g, kcol, h0, i_lo, orow, irow, low)
        else:
            _row_generic(rows, orow, irow, ws.code, kcol, <int32_t>(i_lo * g.dh * W),
                         g, h0 * W - g.pw, low, i_lo, i_hi)


cdef inline void _pool_path(const value_t* xp, value_t* op, index_t* ip,
                            const value_t* low_row, const int32_t* kcol,
                            const value_t* caps, Workspace* ws, const PoolGeom* g,
                            bint scalar_only) noexcept nogil:
    """Pool one plane into op/ip (ip may be NULL) on the path its geometry takes."""
    if g.flat3:
        _pool_plane_flat3(xp, op, ip, caps, ws, g)
    else:
        _pool_plane(xp, op, ip, low_row, kcol, ws, g, scalar_only)


cdef inline void _pool_one(const value_t* xp, value_t* op, index_t* ip,
                           const value_t* low_row, const int32_t* kcol,
                           const value_t* caps, Workspace* ws, const PoolGeom* g,
                           bint scalar_only) noexcept nogil:
    """_pool_path, with the indices streamed out when g.stream_idx: pooled as
    int32 into the workspace, then widened as they are streamed (a store
    and a load per 8 indices in the workspace, not two of each). With
    g.weave they are streamed while the next plane is pooled, from the other
    of two buffers; the thread's last plane, or what a plane holding NaN
    left, goes at the next cypool_pending_finish."""
    cdef Py_ssize_t n = g.OH * g.OW
    cdef int32_t* buf = ws.ibuf
    if ip == NULL or not g.stream_idx:
        _pool_path(xp, op, ip, low_row, kcol, caps, ws, g, scalar_only)
        return
    if g.weave:
        buf += ws.ibuf_flip * (_round_up(n * sizeof(int32_t)) // sizeof(int32_t))
        ws.ibuf_flip ^= 1
    _pool_path(xp, op, buf, low_row, kcol, caps, ws, g, scalar_only)
    cypool_pending_finish(&ws.pend)
    cypool_pending_start(&ws.pend, ip, buf, n, index_t is int64_t)
    if not g.weave:
        cypool_pending_finish(&ws.pend)


def max_pool2d_forward(const value_t[:, :, ::1] x,     # IN  (P, H, W)
                       value_t[:, :, ::1] out,         # OUT (P, OH, OW)
                       index_t[:, :, ::1] indices,     # OUT (P, OH, OW), ignored unless with_indices
                       bint with_indices, bint scalar_only, bint stream_indices,
                       Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                       Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t dh, Py_ssize_t dw,
                       int num_threads):
    cdef PoolGeom g
    cdef Py_ssize_t P = x.shape[0], p, ow, j_lo, j_hi, n_low
    cdef value_t low = _lowest(<value_t*>NULL)
    cdef value_t* low_row = NULL
    cdef value_t* caps = NULL
    cdef int32_t* kcol = NULL
    cdef Py_ssize_t n_caps
    cdef Workspace* ws
    cdef int[1] failed
    cdef int* fail = &failed[0]
    failed[0] = 0
    g.H = x.shape[1]; g.W = x.shape[2]; g.OH = out.shape[1]; g.OW = out.shape[2]
    g.kh = kh; g.kw = kw; g.sh = sh; g.sw = sw
    g.ph = ph; g.pw = pw; g.dh = dh; g.dw = dw
    # Columns -pw .. Wp-pw-1 of a padded row: every tap of every window, and
    # the whole input row, which the ring copies in at offset pw.
    g.Wp = max((g.OW - 1) * sw + (kw - 1) * dw + 1, pw + g.W)
    g.R = (kh - 1) * dh + 1
    g.separable3 = kh == 3 and kw == 3 and dh == 1 and dw == 1 and (sw == 1 or sw == 2)
    g.direct_cols = pw == 0 and (g.OW - 1) * sw + (kw - 1) * dw + 1 <= g.W
    g.flat3 = (g.separable3 and sh == 1 and sw == 1 and ph == 1 and pw == 1
               and not scalar_only and g.W <= _FLAT3_MAX_W
               and (g.H + 2) * g.W <= _FLAT3_MAX)
    # Streaming goes through a per-thread plane of int32 indices: planes of
    # 2**31 elements or more (scalar_only) and outputs of more than
    # _STREAM_MAX_PLANE indices a plane are written directly.
    g.stream_idx = (with_indices and stream_indices and not scalar_only
                    and g.OH * g.OW <= _STREAM_MAX_PLANE)
    # Streaming a plane's indices while the next plane is pooled (the
    # float32 flat 3x3 path, whose passes are written with intrinsics): in
    # the vertical pass alone, [16, 256, 28, 28] took 0.76-0.96 ms against
    # 0.81-1.05 ms without weaving, interleaved here at moderate load, with
    # no gain while other tenants saturated the memory link; from the start
    # of the horizontal pass, see cypool_flat3_h_f32 in _simd.h.
    # Loops written in Cython would have to be cut into chunks to take it:
    # with chunks of 128 outputs the flat path was 10% slower.
    g.weave = g.stream_idx and g.flat3 and value_t is float and CYPOOL_FLAT3_SIMD
    if P == 0 or g.OH == 0 or g.OW == 0:
        return
    # Read-only, shared by all threads: a row of lowest values and the code
    # of each column's first valid tap (nonzero only where it starts in the
    # left padding); for the flat 3x3 path, caps for the left taps, then for
    # the right ones: per position of a plane, the highest value where that
    # tap is in its row, else the lowest.
    n_low = max(g.Wp, g.W)
    n_caps = 2 * g.H * g.W if g.flat3 else 0
    low_row = <value_t*>malloc((n_low + n_caps) * sizeof(value_t) + g.OW * sizeof(int32_t))
    if low_row == NULL:
        raise MemoryError("cypool.max_pool2d: out of memory")
    caps = low_row + n_low
    kcol = <int32_t*>(caps + n_caps)
    for p in range(n_caps):
        caps[p] = _highest(<value_t*>NULL)
    for p in range(0, n_caps // 2, g.W):
        caps[p] = low
        caps[n_caps // 2 + p + g.W - 1] = low
    for ow in range(n_low):
        low_row[ow] = low
    for ow in range(g.OW):
        _valid_taps(ow * sw - pw, kw, dw, g.W, &j_lo, &j_hi)
        kcol[ow] = <int32_t>(j_lo * dw)
    if num_threads == 1:
        # Small calls: no parallel region at all, not even a team of one.
        with nogil:
            _note_team()
            ws = _workspace_new(&g, sizeof(value_t), low)
            if ws == NULL:
                fail[0] = 1
            else:
                for p in range(P):
                    _pool_one(&x[p, 0, 0], &out[p, 0, 0],
                              &indices[p, 0, 0] if with_indices else NULL,
                              low_row, kcol, caps, ws, &g, scalar_only)
                if g.stream_idx:
                    cypool_pending_finish(&ws.pend)
                    cypool_stream_fence()
                _workspace_free(ws)
    else:
        with nogil, parallel(num_threads=num_threads):
            ws = _workspace_new(&g, sizeof(value_t), low)
            if ws == NULL:
                fail[0] = 1
            else:
                for p in prange(P, schedule="static"):
                    _note_team()
                    _pool_one(&x[p, 0, 0], &out[p, 0, 0],
                              &indices[p, 0, 0] if with_indices else NULL,
                              low_row, kcol, caps, ws, &g, scalar_only)
                if g.stream_idx:
                    cypool_pending_finish(&ws.pend)
                    cypool_stream_fence()
                _workspace_free(ws)
    free(low_row)
    if failed[0]:
        raise MemoryError("cypool.max_pool2d: out of memory for per-thread buffers")


cdef inline Py_ssize_t _out_of_range(const index_t* ix, Py_ssize_t n,
                                     Py_ssize_t hw) noexcept nogil:
    """How many of ix[:n] lie outside [0, hw) (one unsigned compare each: a
    negative index wraps to a huge one); vectorised."""
    cdef Py_ssize_t q, bad = 0
    for q in range(n):
        bad += <size_t>ix[q] >= <size_t>hw
    return bad


cdef inline Py_ssize_t _scatter_add(value_t* gi, Py_ssize_t hw, const value_t* go,
                                    const index_t* ix, Py_ssize_t n) noexcept nogil:
    """gi[:hw] = 0, then gi[ix[q]] += go[q]; returns how many ix were out of
    range, and then writes nothing more (the caller raises and discards gi).

    The bounds are checked in one vectorised pass first, so the scatter loop
    itself is unchecked: a load, an add and a store per entry."""
    cdef Py_ssize_t q, bad = _out_of_range(ix, n, hw)
    memset(gi, 0, hw * sizeof(value_t))
    if bad:
        return bad
    # Unrolled by four, in order (entries may share an index): a quarter of
    # the loop overhead of the plain loop, which gcc does not unroll.
    for q in range(0, n - 3, 4):
        gi[ix[q]] += go[q]
        gi[ix[q + 1]] += go[q + 1]
        gi[ix[q + 2]] += go[q + 2]
        gi[ix[q + 3]] += go[q + 3]
    for q in range(n - n % 4, n):
        gi[ix[q]] += go[q]
    return 0


DEF _BLOCK_CHUNK = 256
# Shorter output rows are left to the scatter: at OW = 12 the two vector
# loops' set-up per row cost more than they save (about 15 ns a row here).
DEF _BLOCK_MIN_OW = 16


cdef inline Py_ssize_t _block_codes(const index_t* ix, int32_t* code, Py_ssize_t n,
                                    index_t base, index_t W) noexcept nogil:
    """code[ow] = offset of index ow inside its 2x2 block (0, 1, W or W + 1),
    or -1 when it lies outside; returns how many lie outside. A separate
    loop from the writes below: gcc 12 vectorises neither when one loop mixes
    the int64 indices with float values."""
    cdef Py_ssize_t ow, miss = 0
    cdef index_t d
    cdef bint ok
    for ow in range(n):
        d = ix[ow] - base - 2 * <index_t>ow
        ok = (d == 0) | (d == 1) | (d == W) | (d == W + 1)
        code[ow] = <int32_t>d if ok else -1
        miss += not ok
    return miss


cdef inline void _block_write(value_t* r0, value_t* r1, const value_t* go,
                              const int32_t* code, Py_ssize_t n, int32_t W) noexcept nogil:
    """Write n 2x2 blocks: each gets its gradient at its code, zeros elsewhere."""
    cdef Py_ssize_t ow
    cdef int32_t c
    cdef value_t g, zero = 0
    for ow in range(n):
        c = code[ow]
        g = go[ow] + zero        # as 0 + g in the scatter: -0.0 becomes +0.0
        r0[2 * ow] = g if c == 0 else zero
        r0[2 * ow + 1] = g if c == 1 else zero
        r1[2 * ow] = g if c == W else zero
        r1[2 * ow + 1] = g if c == W + 1 else zero


cdef inline Py_ssize_t _block_row2x2(value_t* r0, value_t* r1, const value_t* go,
                                     const index_t* ix, Py_ssize_t OW, index_t base,
                                     index_t W) noexcept nogil:
    """Write the 2x2 blocks of one output row. Returns how many indices lie
    outside their own block (then the caller redoes the plane)."""
    cdef int32_t code[_BLOCK_CHUNK]
    cdef Py_ssize_t o0, n, miss = 0
    for o0 in range(0, OW, _BLOCK_CHUNK):
        n = min(OW - o0, _BLOCK_CHUNK)
        miss += _block_codes(ix + o0, code, n, base + 2 * <index_t>o0, W)
        _block_write(r0 + 2 * o0, r1 + 2 * o0, go + o0, code, n, <int32_t>W)
    return miss


cdef Py_ssize_t _blocks2x2(value_t* gi, Py_ssize_t H, Py_ssize_t W, const value_t* go,
                           const index_t* ix, Py_ssize_t OH, Py_ssize_t OW) noexcept nogil:
    """Backward of one plane whose indices each lie in their own 2x2 block
    (rows 2oh, 2oh + 1, columns 2ow, 2ow + 1), as a 2x2/stride-2 pooling
    gives: the blocks are disjoint, so every input position gets at most one
    gradient and the plane is written in one pass, with no zeroing first and
    no scatter. Needs H >= 2 OH and W >= 2 OW; the rest of the plane is zero.
    Returns how many indices lie outside their block: the plane is then
    wrong and must be redone by _scatter_add."""
    cdef Py_ssize_t oh, miss = 0
    cdef value_t* r0
    for oh in range(OH):
        r0 = gi + 2 * oh * W
        miss += _block_row2x2(r0, r0 + W, go + oh * OW, ix + oh * OW, OW,
                              <index_t>(2 * oh * W), <index_t>W)
        if W > 2 * OW:
            memset(r0 + 2 * OW, 0, (W - 2 * OW) * sizeof(value_t))
            memset(r0 + W + 2 * OW, 0, (W - 2 * OW) * sizeof(value_t))
    memset(gi + 2 * OH * W, 0, (H - 2 * OH) * W * sizeof(value_t))
    return miss


cdef inline Py_ssize_t _backward_plane(value_t* gi, Py_ssize_t H, Py_ssize_t W,
                                       const value_t* go, const index_t* ix,
                                       Py_ssize_t OH, Py_ssize_t OW,
                                       bint blocks) noexcept nogil:
    """One plane of max_pool2d_backward; returns its out-of-range count."""
    if blocks and _blocks2x2(gi, H, W, go, ix, OH, OW) == 0:
        return 0
    return _scatter_add(gi, H * W, go, ix, OH * OW)


def max_pool2d_backward(const value_t[:, ::1] grad_output,  # IN  (P, OH*OW)
                        const index_t[:, ::1] indices,      # IN  (P, OH*OW)
                        value_t[:, ::1] grad_input,         # OUT (P, H*W), fully written
                        Py_ssize_t OW, Py_ssize_t W, int num_threads):
    """Scatter-add grad_output into zeroed planes at indices.

    Returns the number of indices outside [0, H*W); the planes holding them
    are left zero, and the caller raises. Each plane is zeroed just before
    its scatter, so it is still in L1 when the scatter writes it.

    When the first plane's indices each lie in their own 2x2 block (any
    2x2/stride-2 pooling), every plane is first tried by _blocks2x2, which
    writes it in one vectorised pass; a plane where that fails is redone by
    the scatter, so the result never depends on the guess.

    (Streaming stores for large outputs were tried: 10-15% slower here, as
    repeated calls find much of the output still in the 32 MiB L3.)
    """
    cdef Py_ssize_t P = grad_output.shape[0], n = grad_output.shape[1]
    cdef Py_ssize_t hw = grad_input.shape[1], p
    cdef Py_ssize_t OH = n // OW if OW > 0 else 0
    cdef Py_ssize_t H = hw // W if W > 0 else 0
    cdef Py_ssize_t bad = 0
    cdef bint blocks = OW >= _BLOCK_MIN_OW and H >= 2 * OH and W >= 2 * OW
    if P == 0 or hw == 0:
        return 0
    with nogil:
        # Plane 0 decides whether the others try the 2x2-block pass first.
        if blocks:
            blocks = _blocks2x2(&grad_input[0, 0], H, W, &grad_output[0, 0],
                                &indices[0, 0], OH, OW) == 0
        if not blocks:
            bad = _scatter_add(&grad_input[0, 0], hw, &grad_output[0, 0], &indices[0, 0], n)
        if num_threads == 1:
            for p in range(1, P):
                bad += _backward_plane(&grad_input[p, 0], H, W, &grad_output[p, 0],
                                       &indices[p, 0], OH, OW, blocks)
    if num_threads == 1:
        return bad
    for p in prange(1, P, nogil=True, schedule="static", num_threads=num_threads):
        bad += _backward_plane(&grad_input[p, 0], H, W, &grad_output[p, 0],
                               &indices[p, 0], OH, OW, blocks)
    return bad


cdef inline Py_ssize_t _scatter_set(value_t* o, Py_ssize_t hw, const value_t* xv,
                                    const index_t* ix, Py_ssize_t n) noexcept nogil:
    """o[:hw] = 0, then o[ix[q]] = xv[q] in order; returns how many ix were
    out of range, and then writes nothing more (as _scatter_add)."""
    cdef Py_ssize_t q, bad = _out_of_range(ix, n, hw)
    memset(o, 0, hw * sizeof(value_t))
    if bad:
        return bad
    for q in range(n):
        o[ix[q]] = xv[q]
    return 0


def max_unpool2d(const value_t[:, ::1] x,            # IN  (P, H*W)
                 const index_t[:, ::1] indices,      # IN  (P, H*W)
                 value_t[:, ::1] out,                # OUT (P, OH*OW), fully written
                 int num_threads):
    """Write x into zeroed planes at indices; a repeated index keeps the last
    value in row-major order. Returns the number of out-of-range indices;
    the planes holding them are left zero, and the caller raises."""
    cdef Py_ssize_t P = x.shape[0], n = x.shape[1]
    cdef Py_ssize_t hw = out.shape[1], p
    cdef Py_ssize_t bad = 0
    for p in prange(P, nogil=True, schedule="static", num_threads=num_threads):
        bad += _scatter_set(&out[p, 0], hw, &x[p, 0], &indices[p, 0], n)
    return bad


def max_unpool2d_backward(const value_t[:, ::1] grad_output,  # IN  (P, OH*OW)
                          const index_t[:, ::1] indices,      # IN  (P, H*W), all in range
                          value_t[:, ::1] grad_input,         # OUT (P, H*W)
                          int num_threads):
    """Exact gradient of max_unpool2d: entry q gets grad_output at indices[q]
    if it is the value that stayed there (the last writer), else zero.

    indices must have been checked by max_unpool2d (all in [0, OH*OW))."""
    cdef Py_ssize_t P = grad_output.shape[0], ohw = grad_output.shape[1]
    cdef Py_ssize_t n = indices.shape[1], p, q
    cdef Py_ssize_t* writer
    cdef const index_t* ix
    cdef const value_t* go
    cdef value_t* gi
    cdef int[1] failed
    cdef int* fail = &failed[0]
    failed[0] = 0
    with nogil, parallel(num_threads=num_threads):
        writer = <Py_ssize_t*>malloc(ohw * sizeof(Py_ssize_t))
        if writer == NULL:
            fail[0] = 1
        else:
            for p in prange(P, schedule="static"):
                ix = &indices[p, 0]
                go = &grad_output[p, 0]
                gi = &grad_input[p, 0]
                for q in range(n):
                    writer[ix[q]] = q
                for q in range(n):
                    gi[q] = go[ix[q]] if writer[ix[q]] == q else 0
            free(writer)
    if failed[0]:
        raise MemoryError("cypool.MaxUnpool2d.backward: out of memory")
