# Uses: _common.pxi; _conv_tiles.h.
# Vector-pixel convolution: images whose pixels are vectors, (N, C, H, W, E).
#
#   out[n, o, oh, ow, :] = bias[o] * e_0 + sum over (c, i, j) of
#                          w[o, c, i, j] * x[n, c, oh*s - p + i*d, ow*s - p + j*d, :]
#
# For every output pixel the K = C*kh*kw taps (input pixel vectors; a vector
# of zeros for a tap in the padding) are listed, and the register-blocked
# micro-kernel of _conv_tiles.h computes all O output vectors from them:
# no im2col buffer, only a per-thread list of K pointers. The input gradient is the same
# computation run from each input pixel over the (o, i, j) taps that reach
# it; the weight gradient sums dot products over E into per-thread partials
# that are added in thread order. Every loop is parallel over pixels.

cdef extern from "_conv_tiles.h" nogil:
    void cypool_vc_pixel_f32(Py_ssize_t ntaps, const float* const* xs, const float* w,
                             Py_ssize_t ldw, Py_ssize_t e_lo, Py_ssize_t e_hi, Py_ssize_t O,
                             float* const* outs, const float* bias, float* pack,
                             const float* const* pp)
    void cypool_vc_pixel_f64(Py_ssize_t ntaps, const double* const* xs, const double* w,
                             Py_ssize_t ldw, Py_ssize_t e_lo, Py_ssize_t e_hi, Py_ssize_t O,
                             double* const* outs, const double* bias, double* pack,
                             const double* const* pp)
    int CYPOOL_VC_EB_F32
    int CYPOOL_VC_EB_F64
    void cypool_vc_dots_f32(int no, const float* const* gs, int nt, const float* const* xs,
                            const Py_ssize_t* tap, Py_ssize_t E, float* gw, Py_ssize_t ldgw)
    void cypool_vc_dots_f64(int no, const double* const* gs, int nt, const double* const* xs,
                            const Py_ssize_t* tap, Py_ssize_t E, double* gw, Py_ssize_t ldgw)
    bint cypool_vc_nonzero_f32(const float* v, Py_ssize_t n)
    bint cypool_vc_nonzero_f64(const double* v, Py_ssize_t n)
    int CYPOOL_VC_OB
    int CYPOOL_VC_TB
    int CYPOOL_VC_HALF_TAIL


cdef inline void _vc_pixel(Py_ssize_t ntaps, const floating** xs, const floating* w,
                           Py_ssize_t ldw, Py_ssize_t e_lo, Py_ssize_t e_hi, Py_ssize_t O,
                           floating** outs, const floating* bias, floating* pack,
                           const floating** pp) noexcept nogil:
    if floating is float:
        cypool_vc_pixel_f32(ntaps, xs, w, ldw, e_lo, e_hi, O, outs, bias, pack, pp)
    else:
        cypool_vc_pixel_f64(ntaps, xs, w, ldw, e_lo, e_hi, O, outs, bias, pack, pp)


cdef inline const floating** _pack_new(Py_ssize_t ntaps, floating* like) noexcept nogil:
    """Per-thread packing buffer for ntaps blocks of E: one allocation, the
    row pointers first, then the rows (_pack_rows). Returned, not written
    through an argument, so that prange makes it private."""
    cdef Py_ssize_t eb = CYPOOL_VC_EB_F32 if floating is float else CYPOOL_VC_EB_F64
    cdef Py_ssize_t t
    cdef const floating** pp = <const floating**>malloc(
        ntaps * sizeof(void*) + ntaps * eb * sizeof(floating))
    if pp == NULL:
        return NULL
    for t in range(ntaps):
        pp[t] = (<floating*>(pp + ntaps)) + t * eb
    return pp


cdef inline floating* _pack_rows(const floating** pp, Py_ssize_t ntaps) noexcept nogil:
    return <floating*>(pp + ntaps) if pp != NULL else NULL


cdef inline void _vc_dots(int no, const floating** gs, int nt, const floating** xs,
                          const Py_ssize_t* tap, Py_ssize_t E, floating* gw,
                          Py_ssize_t ldgw) noexcept nogil:
    if floating is float:
        cypool_vc_dots_f32(no, gs, nt, xs, tap, E, gw, ldgw)
    else:
        cypool_vc_dots_f64(no, gs, nt, xs, tap, E, gw, ldgw)


cdef struct ConvGeom:
    Py_ssize_t N, C, H, W, E, O, OH, OW
    Py_ssize_t kh, kw, sh, sw, ph, pw, dh, dw


cdef inline Py_ssize_t _forward_taps(const floating* xn, const ConvGeom* g, Py_ssize_t oh,
                                     Py_ssize_t ow, const floating** xs,
                                     Py_ssize_t* kidx) noexcept nogil:
    """Valid taps of output pixel (oh, ow): input vector pointers and their
    (c, i, j) row in the weights. Returns how many."""
    cdef Py_ssize_t c, i, j, ih, iw, n = 0
    for c in range(g.C):
        for i in range(g.kh):
            ih = oh * g.sh - g.ph + i * g.dh
            if ih < 0 or ih >= g.H:
                continue
            for j in range(g.kw):
                iw = ow * g.sw - g.pw + j * g.dw
                if iw < 0 or iw >= g.W:
                    continue
                xs[n] = xn + ((c * g.H + ih) * g.W + iw) * g.E
                kidx[n] = (c * g.kh + i) * g.kw + j
                n += 1
    return n


cdef inline bint _any_nonzero(const floating* v, Py_ssize_t n) noexcept nogil:
    """Whether v[:n] has a value other than 0 (-0.0 is 0; NaN is not)."""
    if floating is float:
        return cypool_vc_nonzero_f32(v, n)
    return cypool_vc_nonzero_f64(v, n)


cdef inline Py_ssize_t _nonzero_taps(Py_ssize_t ntaps, Py_ssize_t e_lo, Py_ssize_t e_hi,
                                     const floating** xs, Py_ssize_t* kidx) noexcept nogil:
    """Compacts the taps xs[:ntaps], kidx[:ntaps] to those whose rows have a
    nonzero in [e_lo, e_hi) (_any_nonzero). Returns how many are left."""
    cdef Py_ssize_t t, n = 0
    for t in range(ntaps):
        if _any_nonzero(xs[t] + e_lo, e_hi - e_lo):
            xs[n] = xs[t]
            kidx[n] = kidx[t]
            n = n + 1
    return n


cdef inline Py_ssize_t _live_taps(const floating* xn, const ConvGeom* g, Py_ssize_t oh,
                                  Py_ssize_t ow, Py_ssize_t e_lo, Py_ssize_t e_hi,
                                  const floating** xs, Py_ssize_t* kidx) noexcept nogil:
    """_forward_taps less the taps whose components [e_lo, e_hi) are all
    zero (in a zonotope after a ReLU: the dead neurons). Returns how many."""
    return _nonzero_taps(_forward_taps(xn, g, oh, ow, xs, kidx), e_lo, e_hi, xs, kidx)


cdef inline void _all_taps(const floating* xn, const ConvGeom* g, Py_ssize_t oh,
                           Py_ssize_t ow, const floating* zero,
                           const floating** xs) noexcept nogil:
    """Every tap (c, i, j) of output pixel (oh, ow), in weight-row order; a
    tap in the zero padding points at a vector of zeros. Border pixels then
    do a few useless multiply-adds, but every pixel uses the weight matrix
    as it is, with no gathering."""
    cdef Py_ssize_t c, i, j, ih, iw, n = 0
    for c in range(g.C):
        for i in range(g.kh):
            ih = oh * g.sh - g.ph + i * g.dh
            for j in range(g.kw):
                iw = ow * g.sw - g.pw + j * g.dw
                if ih < 0 or ih >= g.H or iw < 0 or iw >= g.W:
                    xs[n] = zero
                else:
                    xs[n] = xn + ((c * g.H + ih) * g.W + iw) * g.E
                n += 1


cdef inline const floating* _weight_rows(const floating* w, Py_ssize_t ld, Py_ssize_t ntaps,
                                         Py_ssize_t ktotal, const Py_ssize_t* kidx,
                                         floating* buf) noexcept nogil:
    """The weight rows of the listed taps, contiguous: w itself when every
    tap is present (the interior), else gathered into buf."""
    cdef Py_ssize_t t
    if ntaps == ktotal:
        return w
    for t in range(ntaps):
        memcpy(buf + t * ld, w + kidx[t] * ld, ld * sizeof(floating))
    return buf


cdef inline void _conv_geom(ConvGeom* g, Py_ssize_t N, Py_ssize_t C, Py_ssize_t H,
                            Py_ssize_t W, Py_ssize_t E, Py_ssize_t O, Py_ssize_t OH,
                            Py_ssize_t OW, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh,
                            Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t dh,
                            Py_ssize_t dw) noexcept nogil:
    g.N = N; g.C = C; g.H = H; g.W = W; g.E = E; g.O = O; g.OH = OH; g.OW = OW
    g.kh = kh; g.kw = kw; g.sh = sh; g.sw = sw; g.ph = ph; g.pw = pw; g.dh = dh; g.dw = dw


def channel_block():
    """Output channels per register tile. Callers pad the weights' channel
    columns to a multiple of it (zero columns); a last block of 1 to 3
    channels takes tiles of its own width."""
    return CYPOOL_VC_OB


cdef int _forward_pixels(const floating[:, :, :, :, ::1] x, const floating[:, ::1] wt,
                         const floating* bptr, floating[:, :, :, :, :] out, const ConvGeom* g,
                         const floating* zero, Py_ssize_t e_chunk,
                         Py_ssize_t q0, Py_ssize_t q1, Py_ssize_t e_begin,
                         Py_ssize_t e_end, bint skip) noexcept nogil:
    """Output pixels [q0, q1) (pixel q is (n, oh, ow) in row-major order),
    components [e_begin, e_end) in chunks of e_chunk, with buffers of this
    thread's own; 1 when out of memory. skip: leave out the taps that are
    zero in a chunk, their weight rows gathered (_live_taps)."""
    cdef Py_ssize_t K = wt.shape[0], Op = wt.shape[1], q, n, oh, ow, o, e_lo, e_hi, ntaps
    cdef const floating* wrows
    cdef const floating** xs = <const floating**>malloc(K * sizeof(void*))
    cdef floating** outs = <floating**>malloc(Op * sizeof(void*))
    cdef const floating** pp = _pack_new(K, <floating*>NULL)
    cdef floating* pack = _pack_rows(pp, K)
    cdef Py_ssize_t* kidx = <Py_ssize_t*>malloc(K * sizeof(Py_ssize_t)) if skip else NULL
    cdef floating* wbuf = <floating*>malloc(K * Op * sizeof(floating)) if skip else NULL
    cdef int failed = xs == NULL or outs == NULL or pp == NULL or (skip and (kidx == NULL or wbuf == NULL))
    if not failed:
        e_lo = e_begin
        while e_lo < e_end:
            e_hi = min(e_lo + e_chunk, e_end)
            for q in range(q0, q1):
                n = q // (g.OH * g.OW)
                oh = (q // g.OW) % g.OH
                ow = q % g.OW
                for o in range(g.O):
                    outs[o] = &out[n, o, oh, ow, 0]
                if skip:
                    ntaps = _live_taps(&x[n, 0, 0, 0, 0], g, oh, ow, e_lo, e_hi, xs, kidx)
                    wrows = _weight_rows(&wt[0, 0], Op, ntaps, K, kidx, wbuf)
                else:
                    _all_taps(&x[n, 0, 0, 0, 0], g, oh, ow, zero, xs)
                    ntaps, wrows = K, &wt[0, 0]
                _vc_pixel(ntaps, xs, wrows, Op, e_lo, e_hi, g.O, outs, bptr, pack, pp)
            e_lo = e_lo + e_chunk
    free(xs)
    free(outs)
    free(pp)
    free(kidx)
    free(wbuf)
    return failed


def vector_conv2d_forward(const floating[:, :, :, :, ::1] x,    # IN  (N, C, H, W, E)
                          const floating[:, ::1] wt,            # IN  (K, Op): weight rows per tap (c, i, j), O padded to Op
                          const floating[::1] bias,             # IN  (Op,), or empty for none
                          floating[:, :, :, :, :] out,          # OUT (N, O, OH, OW, E), E contiguous (a view may have E + k)
                          Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                          Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t dh, Py_ssize_t dw,
                          Py_ssize_t e_chunk, bint skip, int num_threads):
    """E is swept in chunks of e_chunk, each over all of a thread's pixels,
    so that the tap vectors neighbouring pixels share are still in L2 when
    reused. Threads share the pixels, or, where there are fewer pixels
    than threads (a 1 x 1 convolution of a single pixel, say), the
    components, in multiples of 48 (every variant's E block).
    skip: leave out the taps that are zero in a chunk (certification's
    dead neurons); only where every weight is finite, since inf or NaN
    times 0 must give NaN."""
    cdef ConvGeom g
    cdef Py_ssize_t P, e_units
    if out.strides[4] != sizeof(floating):
        raise ValueError("vector_conv2d_forward: out's last axis must be contiguous")
    cdef floating* zero
    cdef const floating* bptr = &bias[0] if bias.shape[0] > 0 else NULL
    cdef int tid
    cdef Py_ssize_t start, end, B
    cdef Team team
    cdef int[1] failed
    cdef int* fail = &failed[0]
    failed[0] = 0
    _conv_geom(&g, x.shape[0], x.shape[1], x.shape[2], x.shape[3], x.shape[4], out.shape[1],
               out.shape[2], out.shape[3], kh, kw, sh, sw, ph, pw, dh, dw)
    P = g.N * g.OH * g.OW
    zero = <floating*>calloc(g.E, sizeof(floating))  # shared, read-only
    if zero == NULL:
        raise MemoryError("cypool.vector_conv2d: out of memory")
    e_units = (g.E + 47) // 48
    if num_threads == 1:
        _set_serial_team()
        with nogil:
            failed[0] = _forward_pixels(x, wt, bptr, out, &g, zero, e_chunk, 0, P, 0, g.E, skip)
    elif P < num_threads:
        with nogil, parallel(num_threads=num_threads):
            _note_team()
            tid = threadid()
            if _forward_pixels(x, wt, bptr, out, &g, zero, e_chunk, 0, P,
                               min(g.E, 48 * _share_start(e_units, tid)),
                               min(g.E, 48 * _share_start(e_units, tid + 1)), skip):
                fail[0] = 1
    else:
        B = _claim_block(P, num_threads)
        _team_begin(&team)
        with nogil, parallel(num_threads=num_threads):
            _note_team()
            end = -1
            start = _claim(&team, P, B, &end)
            while start < P:
                if _forward_pixels(x, wt, bptr, out, &g, zero, e_chunk, start, end, 0, g.E, skip):
                    fail[0] = 1
                start = _claim(&team, P, B, &end)
        _team_end(&team)
    free(zero)
    if failed[0]:
        raise MemoryError("cypool.vector_conv2d: out of memory")


cdef void _nonzero_rows(const floating[:, :, :, :, ::1] gout, Py_ssize_t e_chunk,
                        unsigned char* nz) noexcept nogil:
    """nz[k * R + r] = whether row r of gout (its R = N O OH OW rows of E)
    has a nonzero in the k-th chunk of e_chunk components."""
    cdef Py_ssize_t E = gout.shape[4], R = gout.shape[0] * gout.shape[1] * gout.shape[2] * gout.shape[3]
    cdef Py_ssize_t r, k = 0, e_lo = 0
    cdef const floating* v = &gout[0, 0, 0, 0, 0]
    while e_lo < E:
        for r in range(R):
            nz[k * R + r] = _any_nonzero(v + r * E + e_lo, min(e_chunk, E - e_lo))
        e_lo = e_lo + e_chunk
        k = k + 1


cdef int _input_grad_pixels(const floating[:, :, :, :, ::1] gout, const floating[:, ::1] w2,
                            floating[:, :, :, :, ::1] gx, const ConvGeom* g, Py_ssize_t e_chunk,
                            Py_ssize_t q0, Py_ssize_t q1,
                            const unsigned char* nz) noexcept nogil:
    """Input pixels [q0, q1) (pixel q is (n, ih, iw) in row-major order), E
    in chunks of e_chunk, with buffers of this thread's own; 1 when out of
    memory. nz: NULL, or _nonzero_rows of gout: the taps whose gradient
    rows are zero in a chunk are left out."""
    cdef Py_ssize_t K = w2.shape[0], Cp = w2.shape[1], q, n, ih, iw, i, j, o, c, a, b, oh, ow
    cdef Py_ssize_t ntaps, e_lo, e_hi, row
    cdef const unsigned char* live = nz
    cdef const floating** xs = <const floating**>malloc(K * sizeof(void*))
    cdef floating** outs = <floating**>malloc(Cp * sizeof(void*))
    cdef Py_ssize_t* kidx = <Py_ssize_t*>malloc(K * sizeof(Py_ssize_t))
    cdef floating* wbuf = <floating*>malloc(K * Cp * sizeof(floating))
    cdef const floating** pp = _pack_new(K, <floating*>NULL)
    cdef floating* pack = _pack_rows(pp, K)
    cdef const floating* wrows
    cdef int failed = xs == NULL or outs == NULL or kidx == NULL or wbuf == NULL or pp == NULL
    if not failed:
        e_lo = 0
        while e_lo < g.E:
            e_hi = min(e_lo + e_chunk, g.E)
            for q in range(q0, q1):
                n = q // (g.H * g.W)
                ih = (q // g.W) % g.H
                iw = q % g.W
                ntaps = 0
                for i in range(g.kh):
                    a = ih + g.ph - i * g.dh
                    if a < 0 or a % g.sh != 0 or a // g.sh >= g.OH:
                        continue
                    oh = a // g.sh
                    for j in range(g.kw):
                        b = iw + g.pw - j * g.dw
                        if b < 0 or b % g.sw != 0 or b // g.sw >= g.OW:
                            continue
                        ow = b // g.sw
                        row = (n * g.O * g.OH + oh) * g.OW + ow  # of o = 0; o adds OH OW
                        for o in range(g.O):
                            xs[ntaps] = &gout[n, o, oh, ow, 0]
                            kidx[ntaps] = (i * g.kw + j) * g.O + o
                            # branch-free: which rows are zero follows no pattern
                            ntaps = ntaps + (1 if live == NULL else live[row + o * g.OH * g.OW])
                for c in range(g.C):
                    outs[c] = &gx[n, c, ih, iw, 0]
                if ntaps == 0:
                    for c in range(g.C):
                        memset(outs[c] + e_lo, 0, (e_hi - e_lo) * sizeof(floating))
                else:
                    wrows = _weight_rows(&w2[0, 0], Cp, ntaps, K, kidx, wbuf)
                    _vc_pixel(ntaps, xs, wrows, Cp, e_lo, e_hi, g.C, outs,
                              <const floating*>NULL, pack, pp)
            e_lo = e_lo + e_chunk
            if live != NULL:
                live = live + g.N * g.O * g.OH * g.OW
    free(xs)
    free(outs)
    free(kidx)
    free(wbuf)
    free(pp)
    return failed


def vector_conv2d_input_grad(const floating[:, :, :, :, ::1] gout,  # IN  (N, O, OH, OW, E)
                             const floating[:, ::1] w2,             # IN  (kh*kw*O, Cp): rows per tap (i, j, o), C padded to Cp
                             floating[:, :, :, :, ::1] gx,          # OUT (N, C, H, W, E)
                             Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t ph, Py_ssize_t pw,
                             Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t kh, Py_ssize_t kw,
                             Py_ssize_t e_chunk, bint skip, int num_threads):
    """grad_x[n, c, ih, iw] = sum over (i, j, o) reaching (ih, iw) of
    w[o, c, i, j] * grad_out[n, o, oh, ow]: a gather, so pixels are
    independent. E is swept in chunks, as in the forward. skip: leave out
    the grad_out rows that are zero in a chunk (the same sums where w is
    finite; a back-substitution's dead ReLUs)."""
    cdef ConvGeom g
    cdef Py_ssize_t P
    cdef Py_ssize_t start, end, B
    cdef Team team
    cdef unsigned char* nz = NULL
    cdef int[1] failed
    cdef int* fail = &failed[0]
    failed[0] = 0
    _conv_geom(&g, gx.shape[0], gx.shape[1], gx.shape[2], gx.shape[3], gx.shape[4],
               gout.shape[1], gout.shape[2], gout.shape[3], kh, kw, sh, sw, ph, pw, dh, dw)
    P = g.N * g.H * g.W
    if skip:  # each row is read by up to kh kw input pixels: tested once here
        nz = <unsigned char*>malloc(max(1, (g.E + e_chunk - 1) // e_chunk * g.N * g.O * g.OH * g.OW))
        if nz == NULL:
            raise MemoryError("cypool.vector_conv2d_backward: out of memory")
        with nogil:
            _nonzero_rows(gout, e_chunk, nz)
    if num_threads == 1:
        _set_serial_team()
        with nogil:
            failed[0] = _input_grad_pixels(gout, w2, gx, &g, e_chunk, 0, P, nz)
    else:
        B = _claim_block(P, num_threads)
        _team_begin(&team)
        with nogil, parallel(num_threads=num_threads):
            _note_team()
            end = -1
            start = _claim(&team, P, B, &end)
            while start < P:
                if _input_grad_pixels(gout, w2, gx, &g, e_chunk, start, end, nz):
                    fail[0] = 1
                start = _claim(&team, P, B, &end)
        _team_end(&team)
    free(nz)
    if failed[0]:
        raise MemoryError("cypool.vector_conv2d_backward: out of memory")


cdef int _weight_grad_pixels(const floating[:, :, :, :, ::1] gout,
                             const floating[:, :, :, :, ::1] x, floating* partial,
                             Py_ssize_t K, const ConvGeom* g,
                             Py_ssize_t q0, Py_ssize_t q1) noexcept nogil:
    """Output pixels [q0, q1) into this thread's (O, K) partial sums, with
    buffers of its own; 1 when out of memory."""
    cdef Py_ssize_t q, n, oh, ow, o, t0, ntaps
    cdef int no, nt
    cdef const floating** xs = <const floating**>malloc(K * sizeof(void*))
    cdef const floating** gs = <const floating**>malloc(g.O * sizeof(void*))
    cdef Py_ssize_t* kidx = <Py_ssize_t*>malloc(K * sizeof(Py_ssize_t))
    cdef int failed = xs == NULL or gs == NULL or kidx == NULL
    if not failed:
        for q in range(q0, q1):
            n = q // (g.OH * g.OW)
            oh = (q // g.OW) % g.OH
            ow = q % g.OW
            ntaps = _forward_taps(&x[n, 0, 0, 0, 0], g, oh, ow, xs, kidx)
            for o in range(g.O):
                gs[o] = &gout[n, o, oh, ow, 0]
            o = 0
            while o < g.O:
                no = <int>min(<Py_ssize_t>CYPOOL_VC_OB, g.O - o)
                t0 = 0
                while t0 < ntaps:
                    nt = <int>min(<Py_ssize_t>CYPOOL_VC_TB, ntaps - t0)
                    _vc_dots(no, gs + o, nt, xs + t0, kidx + t0, g.E, partial + o * K, K)
                    t0 = t0 + CYPOOL_VC_TB
                o = o + CYPOOL_VC_OB
    free(xs)
    free(gs)
    free(kidx)
    return failed


def vector_conv2d_weight_grad(const floating[:, :, :, :, ::1] gout,  # IN  (N, O, OH, OW, E)
                              const floating[:, :, :, :, ::1] x,     # IN  (N, C, H, W, E)
                              floating[:, :, ::1] partial,          # OUT (threads, O, K), zeroed by the caller
                              Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                              Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t dh, Py_ssize_t dw,
                              int num_threads):
    """partial[s, o, k] = part s of the sum over pixels and E of
    grad_out[n, o, oh, ow, :] . x_tap_k[:], the pixels cut into
    partial.shape[0] contiguous parts; the caller adds the partials in part
    order, so the result depends on the number of parts, never on the
    team. num_threads (at most the parts) threads claim the parts; one
    thread runs them all in turn."""
    cdef ConvGeom g
    cdef Team team
    cdef Py_ssize_t K = partial.shape[2], P, s, end
    cdef int S = partial.shape[0], T = min(num_threads, partial.shape[0])
    cdef int[1] failed
    cdef int* fail = &failed[0]
    failed[0] = 0
    _conv_geom(&g, x.shape[0], x.shape[1], x.shape[2], x.shape[3], x.shape[4], gout.shape[1],
               gout.shape[2], gout.shape[3], kh, kw, sh, sw, ph, pw, dh, dw)
    P = g.N * g.OH * g.OW
    if T == 1:
        _set_serial_team()
        with nogil:
            for s in range(S):
                if _weight_grad_pixels(gout, x, &partial[s, 0, 0], K, &g, _part_start(P, s, S),
                                       _part_start(P, s + 1, S)):
                    failed[0] = 1
                    break
    else:
        _team_begin(&team)
        with nogil, parallel(num_threads=T):
            _note_team()
            end = -1
            s = _claim(&team, S, 1, &end)
            while s < S:
                while s < end:  # one part, or a static share of them (_testing.set_claiming)
                    if _weight_grad_pixels(gout, x, &partial[s, 0, 0], K, &g,
                                           _part_start(P, s, S), _part_start(P, s + 1, S)):
                        fail[0] = 1
                    s = s + 1
                s = _claim(&team, S, 1, &end)
        _team_end(&team)
    if failed[0]:
        raise MemoryError("cypool.vector_conv2d_backward: out of memory")
