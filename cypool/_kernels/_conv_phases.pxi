# Uses: _pack_new, _pack_rows from _vconv.pxi; _conv_tiles.h; _tap_major.h.
# The standard convolution's shared parts (_conv.pxi's header explains
# them): the stride phases of a zero-padded image (PhaseGeom, _phase_geom,
# _fill_phases), the taps' offsets in them (_tap_offsets), the real
# positions gathered from the virtual output (_vc_grid), and the weights
# copied tap-major (_tap_major). The forward (_conv.pxi) and the backward
# (_conv_backward.pxi) use them.

cdef struct PhaseGeom:
    Py_ssize_t C, H, W        # source image
    Py_ssize_t uh, uw         # source step in the padded image (the stride, for an input gradient)
    Py_ssize_t plh, plw       # padded position of source (0, 0); may be negative (cropped)
    Py_ssize_t Hp, Wp         # padded image extent
    Py_ssize_t sh, sw         # stride phases
    Py_ssize_t Aq, Wq, plane  # phase plane rows, columns, size
    Py_ssize_t size           # buffer size: sh * sw * C * plane


# Zeros after a phase buffer, so that the forward pass may compute a chunk
# rounded up to whole register tiles (the extra outputs are dropped).
cdef enum:
    _SLACK = 64


cdef inline void _phase_geom(PhaseGeom* p, Py_ssize_t C, Py_ssize_t H, Py_ssize_t W,
                             Py_ssize_t uh, Py_ssize_t uw, Py_ssize_t plh, Py_ssize_t plw,
                             Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t sh,
                             Py_ssize_t sw) noexcept nogil:
    p.C = C; p.H = H; p.W = W; p.uh = uh; p.uw = uw; p.plh = plh; p.plw = plw
    p.Hp = Hp; p.Wp = Wp; p.sh = sh; p.sw = sw
    p.Aq = (Hp + sh - 1) // sh
    p.Wq = (Wp + sw - 1) // sw
    p.plane = p.Aq * p.Wq
    p.size = sh * sw * C * p.plane


cdef inline void _fill_phases(const floating[:, :, :, :] x, Py_ssize_t n, const PhaseGeom* p,
                              floating* buf, Py_ssize_t a0) noexcept nogil:
    """buf = image n of x, zero-padded, upsampled by (uh, uw), split into
    stride phases (see the top of this file): the phase rows a0 .. a0 +
    Aq - 1 of it (a band of the padded image where a0 > 0 or Aq is less
    than all its rows). Divisions only per source row, not per channel or
    phase: at a small call they cost more than the copying."""
    cdef Py_ssize_t c, h, w, hh, ww, w_lo, w_hi, sx, r, q, k, m, r0, q0, at
    cdef Py_ssize_t cplane = p.C * p.plane  # from one column phase to the next
    cdef floating* row
    cdef floating* dst
    cdef const char* src
    memset(buf, 0, (p.size + _SLACK) * sizeof(floating))
    # Source columns that land inside the padded width.
    w_lo = 0
    while w_lo < p.W and p.plw + w_lo * p.uw < 0:
        w_lo = w_lo + 1
    w_hi = p.W
    while w_hi > w_lo and p.plw + (w_hi - 1) * p.uw >= p.Wp:
        w_hi = w_hi - 1
    # Column w_lo's phase and column in it (plw + w_lo >= 0).
    r0 = (p.plw + w_lo) % p.sw
    q0 = (p.plw + w_lo) // p.sw
    sx = x.strides[3]
    for h in range(p.H):
        hh = p.plh + h * p.uh
        if hh < 0 or hh >= p.Hp or hh // p.sh < a0 or hh // p.sh >= a0 + p.Aq:
            continue
        at = (hh % p.sh) * p.sw * cplane + (hh // p.sh - a0) * p.Wq
        for c in range(p.C):
            row = buf + at + c * p.plane
            src = <const char*>&x[n, c, h, 0]
            if p.sw == 1 and p.uw == 1:
                row = row + p.plw
                if sx == sizeof(floating):
                    memcpy(row + w_lo, src + w_lo * sx, (w_hi - w_lo) * sizeof(floating))
                else:
                    for w in range(w_lo, w_hi):
                        row[w] = (<const floating*>(src + w * sx))[0]
            elif p.uw == 1:
                # Deinterleave the row into its sw phases: source column
                # w_lo + k is the first of phase (r0 + k) % sw.
                for k in range(min(p.sw, w_hi - w_lo)):
                    r = r0 + k
                    q = q0
                    if r >= p.sw:
                        r = r - p.sw
                        q = q + 1
                    dst = row + r * cplane + q
                    w = w_lo + k
                    m = 0
                    while w < w_hi:
                        dst[m] = (<const floating*>(src + w * sx))[0]
                        w = w + p.sw
                        m = m + 1
            else:
                for w in range(w_lo, w_hi):
                    ww = p.plw + w * p.uw
                    row[(ww % p.sw) * cplane + ww // p.sw] = (<const floating*>(src + w * sx))[0]


cdef inline void _tap_offsets(const PhaseGeom* p, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t dh,
                              Py_ssize_t dw, Py_ssize_t* off) noexcept nogil:
    """off[(c * kh + i) * kw + j]: where tap (c, i, j) of output (0, 0) is."""
    cdef Py_ssize_t c, i, j, vi, vj, k = 0
    for c in range(p.C):
        for i in range(kh):
            vi = i * dh
            for j in range(kw):
                vj = j * dw
                off[k] = ((((vi % p.sh) * p.sw + vj % p.sw) * p.C + c) * p.plane
                          + (vi // p.sh) * p.Wq + vj // p.sw)
                k = k + 1


cdef extern from "_conv_tiles.h" nogil:
    void cypool_vc_grid_f32(Py_ssize_t ntaps, const float* const* xs, const float* w,
                            Py_ssize_t ldw, Py_ssize_t r_lo, Py_ssize_t nr, Py_ssize_t OW,
                            Py_ssize_t Wq, Py_ssize_t O, float* const* outs, float* pack,
                            const float* const* pp)
    void cypool_vc_grid_f64(Py_ssize_t ntaps, const double* const* xs, const double* w,
                            Py_ssize_t ldw, Py_ssize_t r_lo, Py_ssize_t nr, Py_ssize_t OW,
                            Py_ssize_t Wq, Py_ssize_t O, double* const* outs, double* pack,
                            const double* const* pp)


cdef inline void _vc_grid(Py_ssize_t ntaps, const floating** xs, const floating* w,
                          Py_ssize_t ldw, Py_ssize_t r_lo, Py_ssize_t nr, Py_ssize_t OW,
                          Py_ssize_t Wq, Py_ssize_t O, floating** outs, floating* pack,
                          const floating** pp) noexcept nogil:
    if floating is float:
        cypool_vc_grid_f32(ntaps, xs, w, ldw, r_lo, nr, OW, Wq, O, outs, pack, pp)
    else:
        cypool_vc_grid_f64(ntaps, xs, w, ldw, r_lo, nr, OW, Wq, O, outs, pack, pp)


cdef extern from "_tap_major.h" nogil:
    void cypool_tap_major_f32(const char* w, const Py_ssize_t* shape, const Py_ssize_t* strides,
                              int transposed, Py_ssize_t ldt, float* wt)
    void cypool_tap_major_f64(const char* w, const Py_ssize_t* shape, const Py_ssize_t* strides,
                              int transposed, Py_ssize_t ldt, double* wt)
    void cypool_tap_rows_f32(const float* base, const Py_ssize_t* off, Py_ssize_t K,
                             Py_ssize_t n, float* out)
    void cypool_tap_rows_f64(const double* base, const Py_ssize_t* off, Py_ssize_t K,
                             Py_ssize_t n, double* out)


cdef floating* _tap_major(const char* w, const Py_ssize_t* shape, const Py_ssize_t* strides,
                          bint transposed, Py_ssize_t ldt, floating* _) noexcept nogil:
    """The weights w (O, C, kh, kw) at byte strides as (K, ldt) rows, one per
    tap (c, i, j), output channels padded to ldt with zeros; transposed: the
    input gradient's weights, taps (o, i, j) and outputs c, the kernel
    flipped (_tap_major.h). Malloc'd; NULL when out of memory."""
    cdef Py_ssize_t K = (shape[0] if transposed else shape[1]) * shape[2] * shape[3]
    cdef floating* wt = <floating*>malloc(K * ldt * sizeof(floating))
    if wt != NULL:
        if floating is float:
            cypool_tap_major_f32(w, shape, strides, transposed, ldt, wt)
        else:
            cypool_tap_major_f64(w, shape, strides, transposed, ldt, wt)
    return wt
