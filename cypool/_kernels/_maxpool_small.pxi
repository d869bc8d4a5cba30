# Uses: PoolGeom, _ceil_div from _maxpool_rows.pxi; _maxpool_small.h.
# Max pooling forward on small planes (the 14x14 and 7x7 maps of a network's
# late layers, hundreds of channels): LANES planes at a time, vectorised
# across the planes instead of along a row too short to fill a vector.
#
# One table, made once per call and shared by the threads, lists for each
# output position the plane offsets of its window's taps that are inside the
# plane, in row-major window order (a window never lies wholly in the
# padding, so each has one at least). Per block of LANES planes a thread
#   1. copies them into a buffer that holds element i of plane b at
#      i * LANES + b (planes innermost);
#   2. scans each output position's taps by takes_over()'s rule, each step
#      one LANES-wide load, compare and select of the value and of the tap
#      offset, which is the index itself (_maxpool_small.h): the padding is
#      never read, so ties keep the first valid maximum and NaN the first NaN;
#   3. copies the LANES results of each position back to the planes.
# No per-plane setup remains (the row path's ring of padded rows costs more
# than the pooling on planes this small).

# Planes of at most _SMALL_MAX_HW elements (and outputs of at most as many)
# with windows of at most _SMALL_MAX_TAPS taps take this path; its buffers
# (input, values, int32 offsets) are on the stack: 80 KiB for float64.
DEF _SMALL_LANES = 16  # CYPOOL_SMALL_LANES of _maxpool_small.h
DEF _SMALL_MAX_HW = 256
DEF _SMALL_MAX_TAPS = 64
# 3x3/stride 1/padding 1 pooling keeps a path of its own (_maxpool_flat3.pxi)
# even on 7x7 planes: this one is faster there only while its input and
# outputs are cached (docs/performance.md).


cdef extern from "_maxpool_small.h" nogil:
    void cypool_small_scan_f32(const float* buf, float* best, int32_t* code, const int32_t* taps,
                               const int32_t* ntaps, Py_ssize_t T, Py_ssize_t n_out)
    void cypool_small_scan_f64(const double* buf, double* best, int32_t* code, const int32_t* taps,
                               const int32_t* ntaps, Py_ssize_t T, Py_ssize_t n_out)
    void cypool_small_scan_i32(const int32_t* buf, int32_t* best, int32_t* code,
                               const int32_t* taps, const int32_t* ntaps, Py_ssize_t T,
                               Py_ssize_t n_out)
    void cypool_small_scan_i64(const int64_t* buf, int64_t* best, int32_t* code,
                               const int32_t* taps, const int32_t* ntaps, Py_ssize_t T,
                               Py_ssize_t n_out)
    void cypool_small_in_4(const void* x, Py_ssize_t nb, Py_ssize_t HW, void* buf)
    void cypool_small_out_4(const void* src, Py_ssize_t nb, Py_ssize_t n_out, void* dst)
    void cypool_small_out_i64(const int32_t* src, Py_ssize_t nb, Py_ssize_t n_out,
                              int64_t* dst)


cdef bint _small_plane_fits(Py_ssize_t H, Py_ssize_t W, Py_ssize_t OH, Py_ssize_t OW,
                            Py_ssize_t kh, Py_ssize_t kw) noexcept nogil:
    return H * W <= _SMALL_MAX_HW and OH * OW <= _SMALL_MAX_HW and kh * kw <= _SMALL_MAX_TAPS


cdef void _small_tap_table(const PoolGeom* g, int32_t* taps, int32_t* ntaps) noexcept nogil:
    """taps[o * kh * kw + t]: the plane offset of output o's t-th tap inside
    the plane, row-major; ntaps[o]: how many there are."""
    cdef Py_ssize_t oh, ow, i, j, r, c, o, n
    cdef Py_ssize_t T = g.kh * g.kw
    for oh in range(g.OH):
        for ow in range(g.OW):
            o = oh * g.OW + ow
            n = 0
            for i in range(g.kh):
                r = oh * g.sh - g.ph + i * g.dh
                if r < 0 or r >= g.H:
                    continue
                for j in range(g.kw):
                    c = ow * g.sw - g.pw + j * g.dw
                    if 0 <= c < g.W:
                        taps[o * T + n] = <int32_t>(r * g.W + c)
                        n += 1
            ntaps[o] = <int32_t>n


cdef void _pool_small_block(const value_t* x, value_t* op, index_t* ip, Py_ssize_t nb,
                            const int32_t* taps, const int32_t* ntaps, Py_ssize_t T,
                            Py_ssize_t HW, Py_ssize_t n_out) noexcept nogil:
    """Pool nb <= LANES consecutive planes x (HW each) into op/ip (n_out
    each; ip may be NULL)."""
    cdef value_t buf[_SMALL_MAX_HW * _SMALL_LANES]
    cdef value_t best[_SMALL_MAX_HW * _SMALL_LANES]
    cdef int32_t code[_SMALL_MAX_HW * _SMALL_LANES]
    cdef Py_ssize_t b, i, o
    cdef const value_t* src
    # 1. planes innermost; lanes past nb repeat the last plane (never stored)
    if sizeof(value_t) == 4:
        cypool_small_in_4(x, nb, HW, buf)
    else:
        for b in range(_SMALL_LANES):
            src = x + min(b, nb - 1) * HW
            for i in range(HW):
                buf[i * _SMALL_LANES + b] = src[i]
    # 2. every output position's window, LANES planes at once
    if value_t is float:
        cypool_small_scan_f32(buf, best, code, taps, ntaps, T, n_out)
    elif value_t is double:
        cypool_small_scan_f64(buf, best, code, taps, ntaps, T, n_out)
    elif value_t is int32_t:
        cypool_small_scan_i32(buf, best, code, taps, ntaps, T, n_out)
    else:
        cypool_small_scan_i64(buf, best, code, taps, ntaps, T, n_out)
    # 3. back to the planes, each written contiguously
    if sizeof(value_t) == 4:
        cypool_small_out_4(best, nb, n_out, op)
    else:
        for b in range(nb):
            for o in range(n_out):
                op[b * n_out + o] = best[o * _SMALL_LANES + b]
    if ip == NULL:
        return
    if index_t is int32_t:
        cypool_small_out_4(code, nb, n_out, ip)
    else:
        cypool_small_out_i64(code, nb, n_out, ip)


cdef void _pool_small_blocks(const value_t* x, value_t* op, index_t* ip, Py_ssize_t P,
                             const PoolGeom* g, const int32_t* taps, const int32_t* ntaps,
                             Py_ssize_t blk0, Py_ssize_t blk1) noexcept nogil:
    """Blocks [blk0, blk1) of LANES planes (the last one may be partial)."""
    cdef Py_ssize_t HW = g.H * g.W, n_out = g.OH * g.OW, T = g.kh * g.kw, blk, p0
    for blk in range(blk0, blk1):
        p0 = blk * _SMALL_LANES
        _pool_small_block(x + p0 * HW, op + p0 * n_out, ip + p0 * n_out if ip != NULL else NULL,
                          min(_SMALL_LANES, P - p0), taps, ntaps, T, HW, n_out)


cdef void _pool_small(const value_t* x, value_t* op, index_t* ip, Py_ssize_t P,
                      const PoolGeom* g, const int32_t* taps, const int32_t* ntaps,
                      int num_threads) noexcept nogil:
    """All P planes, LANES at a time, the blocks claimed by the threads
    (_claim)."""
    cdef Py_ssize_t nblocks = _ceil_div(P, _SMALL_LANES), start, end
    cdef Py_ssize_t B = _claim_block(nblocks, num_threads)
    cdef Team team
    if num_threads == 1:
        _set_serial_team()
        _pool_small_blocks(x, op, ip, P, g, taps, ntaps, 0, nblocks)
        return
    _team_begin(&team)
    with parallel(num_threads=num_threads):
        _note_team()
        end = -1
        start = _claim(&team, nblocks, B, &end)
        while start < nblocks:
            _pool_small_blocks(x, op, ip, P, g, taps, ntaps, start, end)
            start = _claim(&team, nblocks, B, &end)
    _team_end(&team)
