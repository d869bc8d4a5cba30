# Uses: _common.pxi; _simd.h.
# 2-D max pooling with index tracking: the shared geometry, the per-row
# window loops and their per-thread workspace. The family is split by concern:
#   _maxpool_rows.pxi      this file: geometry, row loops, workspace;
#   _maxpool_flat3.pxi     3x3/stride 1/padding 1 over a whole small plane;
#   _maxpool_small.pxi     planes of at most 256 elements, 16 at a time;
#   _maxpool_forward.pxi   the choice of path per plane, streaming, the entry point;
#   _maxpool_backward.pxi  the backward (scatter-add) and unpooling.
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

# The flat 3x3 path is for short rows: from about 40 columns on, the row
# loop vectorises well and the whole-plane buffers no longer fit in L1
# (docs/performance.md). (H + 2) * W is capped so its two buffers stay in L2.
DEF _FLAT3_MAX_W = 39
DEF _FLAT3_MAX = 16384
# The largest output plane whose indices are streamed (see _pool_plane_streamed): its
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
    bint in_place_cols       # rows need no column padding: read the plane itself
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
    void* ring             # R padded rows of Wp values (unless in_place_cols)
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
    cdef bint ring = not (g.in_place_cols or g.flat3)
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
    if g.in_place_cols:
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
    row-major window order wins, as in the per-window scan."""
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
