# Uses: PoolGeom, Workspace and the row loops from _maxpool_rows.pxi; _pool_plane_flat3 from _maxpool_flat3.pxi; _pool_small, _small_plane_fits, _small_tap_table from _maxpool_small.pxi.
# Max pooling forward: which path pools each plane, index streaming, and the
# kernel entry point (see _maxpool_rows.pxi for the family).

cdef void _pool_plane_rows(const value_t* xp, value_t* op, index_t* ip,
                           const value_t* low_row, const int32_t* kcol,
                           Workspace* ws, const PoolGeom* g, bint scalar_only) noexcept nogil:
    """Max-pool one (H, W) plane into (OH, OW) an output row at a time, on
    the row paths of _maxpool_rows.pxi (2x2, separable 3x3, generic, or
    scalar windows); ip may be NULL (no indices)."""
    cdef Py_ssize_t oh, ow, h0, i_lo, i_hi, where, i, slot
    cdef Py_ssize_t W = g.W
    cdef value_t low = _lowest(<value_t*>NULL)
    cdef value_t* orow
    cdef index_t* irow = NULL
    cdef const value_t** rows = <const value_t**>ws.rows
    cdef bint plain = g.dh == 1 and g.dw == 1
    if not g.in_place_cols:
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


cdef inline void _pool_plane(const value_t* xp, value_t* op, index_t* ip,
                             const value_t* low_row, const int32_t* kcol,
                             const value_t* caps, Workspace* ws, const PoolGeom* g,
                             bint scalar_only) noexcept nogil:
    """Pool one plane into op/ip (ip may be NULL) on the path its geometry
    takes: the flat 3x3 path or the row paths."""
    if g.flat3:
        _pool_plane_flat3(xp, op, ip, caps, ws, g)
    else:
        # Out of line, through cypool_opaque: _pool_planes is compiled once
        # now, and with the row paths inlined into it too the flat 3x3
        # path ran 11-18% slower with 2 threads.
        (<void (*)(const value_t*, value_t*, index_t*, const value_t*, const int32_t*,
                   Workspace*, const PoolGeom*, bint) noexcept nogil>cypool_opaque(
            <void*>_pool_plane_rows[value_t, index_t]))(xp, op, ip, low_row, kcol, ws, g,
                                                         scalar_only)


cdef inline void _pool_plane_streamed(const value_t* xp, value_t* op, index_t* ip,
                                      const value_t* low_row, const int32_t* kcol,
                                      const value_t* caps, Workspace* ws, const PoolGeom* g,
                                      bint scalar_only) noexcept nogil:
    """_pool_plane, with the indices streamed out when g.stream_idx: pooled as
    int32 into the workspace, then widened as they are streamed (a store
    and a load per 8 indices in the workspace, not two of each). With
    g.weave they are streamed while the next plane is pooled, from the other
    of two buffers; the thread's last plane, or what a plane holding NaN
    left, goes at the next cypool_pending_finish."""
    cdef Py_ssize_t n = g.OH * g.OW
    cdef int32_t* buf = ws.ibuf
    if ip == NULL or not g.stream_idx:
        _pool_plane(xp, op, ip, low_row, kcol, caps, ws, g, scalar_only)
        return
    if g.weave:
        buf += ws.ibuf_flip * (_round_up(n * sizeof(int32_t)) // sizeof(int32_t))
        ws.ibuf_flip ^= 1
    _pool_plane(xp, op, buf, low_row, kcol, caps, ws, g, scalar_only)
    cypool_pending_finish(&ws.pend)
    cypool_pending_start(&ws.pend, ip, buf, n, index_t is int64_t)
    if not g.weave:
        cypool_pending_finish(&ws.pend)


cdef int _pool_planes(const value_t[:, :, ::1] x, value_t[:, :, ::1] out,
                      index_t[:, :, ::1] indices, bint with_indices,
                      const value_t* low_row, const int32_t* kcol, const value_t* caps,
                      const PoolGeom* g, bint scalar_only,
                      Py_ssize_t p0, Py_ssize_t p1) noexcept nogil:
    """Planes [p0, p1), with a workspace of this thread's own; 1 when out
    of memory."""
    cdef Py_ssize_t p
    cdef Workspace* ws = _workspace_new(g, sizeof(value_t), _lowest(<value_t*>NULL))
    if ws == NULL:
        return 1
    for p in range(p0, p1):
        _pool_plane_streamed(&x[p, 0, 0], &out[p, 0, 0],
                             &indices[p, 0, 0] if with_indices else NULL,
                             low_row, kcol, caps, ws, g, scalar_only)
    if g.stream_idx:
        cypool_pending_finish(&ws.pend)
        cypool_stream_fence()
    _workspace_free(ws)
    return 0


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
    cdef Py_ssize_t start, end, B
    cdef Team team
    # _pool_planes, called through a pointer gcc cannot see through: one
    # copy serves the serial and the parallel path (see cypool_opaque).
    cdef int (*planes)(const value_t[:, :, ::1], value_t[:, :, ::1], index_t[:, :, ::1], bint,
                       const value_t*, const int32_t*, const value_t*, const PoolGeom*, bint,
                       Py_ssize_t, Py_ssize_t) noexcept nogil
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
    g.in_place_cols = pw == 0 and (g.OW - 1) * sw + (kw - 1) * dw + 1 <= g.W
    g.flat3 = (g.separable3 and sh == 1 and sw == 1 and ph == 1 and pw == 1
               and not scalar_only and g.W <= _FLAT3_MAX_W
               and (g.H + 2) * g.W <= _FLAT3_MAX)
    # Streaming goes through a per-thread plane of int32 indices: planes of
    # 2**31 elements or more (scalar_only) and outputs of more than
    # _STREAM_MAX_PLANE indices a plane are written directly.
    g.stream_idx = (with_indices and stream_indices and not scalar_only
                    and g.OH * g.OW <= _STREAM_MAX_PLANE)
    # Streaming a plane's indices while the next plane is pooled: only the
    # float32 flat 3x3 path, whose passes are written with intrinsics
    # (cypool_flat3_h_f32 in _simd.h). Loops written in Cython would have to
    # be cut into chunks to take it, which costs more than it saves
    # (docs/performance.md).
    g.weave = g.stream_idx and g.flat3 and value_t is float and CYPOOL_FLAT3_SIMD
    if P == 0 or g.OH == 0 or g.OW == 0:
        return
    if not g.flat3 and not scalar_only and _small_plane_fits(g.H, g.W, g.OH, g.OW, kh, kw):
        _forward_small(x, out, indices, with_indices, &g, num_threads)
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
    planes = <int (*)(const value_t[:, :, ::1], value_t[:, :, ::1], index_t[:, :, ::1], bint,
                      const value_t*, const int32_t*, const value_t*, const PoolGeom*, bint,
                      Py_ssize_t, Py_ssize_t) noexcept nogil>cypool_opaque(
        <void*>_pool_planes[value_t, index_t])
    if num_threads == 1:
        # Small calls: no parallel region at all, not even a team of one.
        _set_serial_team()
        with nogil:
            failed[0] = planes(x, out, indices, with_indices, low_row, kcol, caps,
                               &g, scalar_only, 0, P)
    else:
        B = _claim_block(P, num_threads)
        _team_begin(&team)
        with nogil, parallel(num_threads=num_threads):
            _note_team()
            end = -1
            start = _claim(&team, P, B, &end)
            while start < P:
                if planes(x, out, indices, with_indices, low_row, kcol, caps, &g,
                          scalar_only, start, end):
                    fail[0] = 1
                start = _claim(&team, P, B, &end)
        _team_end(&team)
    free(low_row)
    if failed[0]:
        raise MemoryError("cypool.max_pool2d: out of memory for per-thread buffers")


cdef void _forward_small(const value_t[:, :, ::1] x, value_t[:, :, ::1] out,
                         index_t[:, :, ::1] indices, bint with_indices, const PoolGeom* g,
                         int num_threads) except *:
    """The forward on the small-plane path (_maxpool_small.pxi)."""
    cdef Py_ssize_t n_out = g.OH * g.OW, T = g.kh * g.kw
    cdef int32_t* taps = <int32_t*>malloc((n_out * T + n_out) * sizeof(int32_t))
    if taps == NULL:
        raise MemoryError("cypool.max_pool2d: out of memory")
    _small_tap_table(g, taps, taps + n_out * T)
    with nogil:
        _pool_small(&x[0, 0, 0], &out[0, 0, 0], &indices[0, 0, 0] if with_indices else NULL,
                    x.shape[0], g, taps, taps + n_out * T, num_threads)
    free(taps)
