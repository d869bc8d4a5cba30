# Uses: PoolGeom, Workspace, _pick from _maxpool_rows.pxi.
# Max pooling, the flat 3x3 path (see _maxpool_rows.pxi for the family).
#
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
# a third horizontal version that keeps no indices (docs/performance.md,
# "Why the kernels are shaped as they are").

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
