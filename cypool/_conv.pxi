# Standard 2-D convolution, NCHW (torch.nn.functional.conv2d, groups = 1).
#
#   out[n, o, oh, ow] = bias[o] + sum over (c, i, j) of
#                       w[o, c, i, j] * x[n, c, oh*sh - ph + i*dh, ow*sw - pw + j*dw]
#
# Each image is first copied into a zero-padded buffer split into stride
# phases: element (h, w) of the padded image goes to phase (h % sh, w % sw),
# row h // sh, column w // sw, every phase plane Wq columns wide. Then the
# input element that tap (c, i, j) of output (oh, ow) reads is at
#     offset(c, i, j) + oh * Wq + ow
# so, over the "virtual" output index e = oh * Wq + ow, every tap is a
# contiguous vector of the buffer. An image's convolution becomes the
# vector convolution of a single pixel with E = (OH - 1) * Wq + OW (the
# Wq - OW columns past each output row are computed and dropped): the
# register-blocked tiles of _vconv_kernel.h do the arithmetic, and no
# im2col buffer is made. The input gradient is this forward run on the
# output gradient (upsampled by the stride, padded by the kernel's reach)
# with the kernel flipped and transposed; the weight gradient is dot
# products over e of the output gradient with the same tap vectors.
#
# Work items are (image, chunk of e). Each thread takes a contiguous run of
# them (so it fills the buffer of an image once, and the split, and with it
# the order of the weight gradient's sums, is fixed for a thread count) and
# owns its buffers.

cdef struct PhaseGeom:
    Py_ssize_t C, H, W        # source image
    Py_ssize_t uh, uw         # source step in the padded image (the stride, for an input gradient)
    Py_ssize_t plh, plw       # padded position of source (0, 0); may be negative (cropped)
    Py_ssize_t Hp, Wp         # padded image extent
    Py_ssize_t sh, sw         # stride phases
    Py_ssize_t Aq, Wq, plane  # phase plane rows, columns, size
    Py_ssize_t size           # buffer size: sh * sw * C * plane


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
                              floating* buf) noexcept nogil:
    """buf = image n of x, zero-padded, upsampled by (uh, uw), split into
    stride phases (see the top of this file)."""
    cdef Py_ssize_t c, h, w, hh, ww, w_lo, w_hi
    cdef floating* row
    memset(buf, 0, p.size * sizeof(floating))
    # Source columns that land inside the padded width.
    w_lo = 0
    while w_lo < p.W and p.plw + w_lo * p.uw < 0:
        w_lo = w_lo + 1
    w_hi = p.W
    while w_hi > w_lo and p.plw + (w_hi - 1) * p.uw >= p.Wp:
        w_hi = w_hi - 1
    for c in range(p.C):
        for h in range(p.H):
            hh = p.plh + h * p.uh
            if hh < 0 or hh >= p.Hp:
                continue
            row = buf + ((hh % p.sh) * p.sw * p.C + c) * p.plane + (hh // p.sh) * p.Wq
            if p.sw == 1 and p.uw == 1:
                row = row + p.plw
                for w in range(w_lo, w_hi):
                    row[w] = x[n, c, h, w]
            else:
                for w in range(w_lo, w_hi):
                    ww = p.plw + w * p.uw
                    row[(ww % p.sw) * p.C * p.plane + ww // p.sw] = x[n, c, h, w]


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


cdef inline Py_ssize_t _share_start(Py_ssize_t Q, int t) noexcept nogil:
    """Where thread t's contiguous share of Q work items starts (share t
    ends where share t + 1 starts). Assign the result in the parallel block,
    so that Cython makes the variable private to the thread."""
    return Q * t // omp_get_num_threads()


cdef floating* _tap_major_weights(const floating[:, :, :, :] w, bint transposed,
                                  Py_ssize_t Op) noexcept nogil:
    """The weights as (K, Op) rows, one per tap (c, i, j), output channels
    padded to Op with zeros; transposed: the input gradient's weights, taps
    (o, i, j) and outputs c, the kernel flipped. NULL when out of memory."""
    cdef Py_ssize_t A = w.shape[0], B = w.shape[1], kh = w.shape[2], kw = w.shape[3]
    cdef Py_ssize_t a, b, i, j, k
    cdef Py_ssize_t S = B if not transposed else A   # tap channels
    cdef floating* wt = <floating*>calloc(S * kh * kw * Op, sizeof(floating))
    if wt == NULL:
        return NULL
    for a in range(A):
        for b in range(B):
            for i in range(kh):
                for j in range(kw):
                    if transposed:  # tap (a, i, j), output b
                        k = (a * kh + kh - 1 - i) * kw + kw - 1 - j
                        wt[k * Op + b] = w[a, b, i, j]
                    else:           # tap (b, i, j), output a
                        k = (b * kh + i) * kw + j
                        wt[k * Op + a] = w[a, b, i, j]
    return wt


def conv2d_forward(const floating[:, :, :, :] x,     # IN  (N, C, H, W), any strides
                   const floating[:, :, :, :] w,     # IN  (O, C, kh, kw), any strides; transposed: (C, O, kh, kw)
                   bint transposed,
                   const floating[::1] bias,         # IN  (O,), or empty for none
                   floating[:, :, :, ::1] out,       # OUT (N, O, OH, OW)
                   Py_ssize_t uh, Py_ssize_t uw, Py_ssize_t plh, Py_ssize_t plw,
                   Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t sh, Py_ssize_t sw,
                   Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ce, int num_threads):
    """out = the convolution of x, seen as zero-padded to (Hp, Wp) with its
    element (h, w) at (plh + h*uh, plw + w*uw), with stride (sh, sw) and
    dilation (dh, dw). uh = uw = 1 for a forward pass. The input gradient
    runs this on the output gradient with transposed=True: w is then the
    forward's weight, and the convolution uses it flipped, its first two
    axes swapped. ce: chunk of the virtual output."""
    cdef PhaseGeom p
    cdef Py_ssize_t kh = w.shape[2], kw = w.shape[3], K = x.shape[1] * kh * kw
    cdef Py_ssize_t N = x.shape[0], O = out.shape[1], OH = out.shape[2], OW = out.shape[3]
    cdef Py_ssize_t Op = (O + CYPOOL_VC_OB - 1) // CYPOOL_VC_OB * CYPOOL_VC_OB
    cdef Py_ssize_t L, G, Q, q, q0, q1, n, cur, e_lo, ne, t, o, e, e_end, oh, ow, r
    cdef int tid
    cdef Py_ssize_t* off
    cdef floating* wt
    cdef floating* buf
    cdef floating* tmp
    cdef floating* src
    cdef floating* dst
    cdef floating b
    cdef const floating** xs
    cdef floating** outs
    cdef const floating** pp
    cdef floating* pack
    cdef bint has_bias = bias.shape[0] > 0
    cdef int[1] failed
    cdef int* fail = &failed[0]
    failed[0] = 0
    _phase_geom(&p, x.shape[1], x.shape[2], x.shape[3], uh, uw, plh, plw, Hp, Wp, sh, sw)
    L = (OH - 1) * p.Wq + OW
    G = (L + ce - 1) // ce
    Q = N * G
    off = <Py_ssize_t*>malloc(K * sizeof(Py_ssize_t))
    wt = _tap_major_weights(w, transposed, Op)
    if off == NULL or wt == NULL:
        free(off)
        free(wt)
        raise MemoryError("cypool.conv2d: out of memory")
    _tap_offsets(&p, kh, kw, dh, dw, off)
    with nogil, parallel(num_threads=num_threads):
        _note_team()
        tid = threadid()
        q0 = _share_start(Q, tid)
        q1 = _share_start(Q, tid + 1)
        buf = <floating*>malloc(p.size * sizeof(floating))
        tmp = <floating*>malloc(Op * ce * sizeof(floating))
        xs = <const floating**>malloc(K * sizeof(void*))
        outs = <floating**>malloc(Op * sizeof(void*))
        pp = _pack_new(K, <floating*>NULL)
        pack = _pack_rows(pp, K)
        if buf == NULL or tmp == NULL or xs == NULL or outs == NULL or pp == NULL:
            fail[0] = 1
        else:
            for o in range(Op):
                outs[o] = tmp + o * ce
            cur = -1
            for q in range(q0, q1):
                n = q // G
                if n != cur:
                    _fill_phases(x, n, &p, buf)
                    cur = n
                e_lo = (q % G) * ce
                ne = min(ce, L - e_lo)
                for t in range(K):
                    xs[t] = buf + off[t] + e_lo
                _vc_pixel(K, xs, wt, Op, 0, ne, Op, outs, <const floating*>NULL, pack, pp)
                # The chunk's real outputs (columns ow < OW), plus the bias.
                for o in range(O):
                    b = bias[o] if has_bias else 0
                    e = e_lo
                    while e < e_lo + ne:
                        oh = e // p.Wq
                        ow = e % p.Wq
                        e_end = min(e_lo + ne, oh * p.Wq + p.Wq)
                        if ow < OW:
                            src = tmp + o * ce + (e - e_lo)
                            dst = &out[n, o, oh, ow]
                            for r in range(min(e_end, oh * p.Wq + OW) - e):
                                dst[r] = src[r] + b
                        e = e_end
        free(buf)
        free(tmp)
        free(xs)
        free(outs)
        free(pp)
    free(off)
    free(wt)
    if failed[0]:
        raise MemoryError("cypool.conv2d: out of memory")


def conv2d_weight_grad(const floating[:, :, :, ::1] gout,  # IN  (N, O, OH, OW)
                       const floating[:, :, :, :] x,       # IN  (N, C, H, W), any strides
                       floating[:, :, ::1] partial,        # OUT (threads, Op, Kp), zeroed by the caller
                       Py_ssize_t plh, Py_ssize_t plw, Py_ssize_t Hp, Py_ssize_t Wp,
                       Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                       Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ce):
    """partial[t, o, k] = this thread's share of the sum over images and
    output positions of grad_out[n, o, oh, ow] * (tap k of (oh, ow)); the
    caller adds the partials in thread order. Op and Kp are O and K padded
    to whole dot-product blocks: the padding rows and columns read zeros.
    Runs on partial.shape[0] threads."""
    cdef PhaseGeom p
    cdef Py_ssize_t N = x.shape[0], O = gout.shape[1], OH = gout.shape[2], OW = gout.shape[3]
    cdef Py_ssize_t Op = partial.shape[1], Kp = partial.shape[2], K
    cdef Py_ssize_t L, G, Q, q, q0, q1, n, cur, e_lo, ne, t, o, e, oh, ow
    cdef int T = partial.shape[0], tid
    cdef Py_ssize_t* off
    cdef Py_ssize_t* kidx
    cdef floating* buf
    cdef floating* tmp
    cdef floating* zero
    cdef const floating** xs
    cdef const floating** gs
    cdef int[1] failed
    cdef int* fail = &failed[0]
    failed[0] = 0
    _phase_geom(&p, x.shape[1], x.shape[2], x.shape[3], 1, 1, plh, plw, Hp, Wp, sh, sw)
    K = p.C * kh * kw
    L = (OH - 1) * p.Wq + OW
    G = (L + ce - 1) // ce
    Q = N * G
    off = <Py_ssize_t*>malloc(K * sizeof(Py_ssize_t))
    kidx = <Py_ssize_t*>malloc(Kp * sizeof(Py_ssize_t))
    zero = <floating*>calloc(ce, sizeof(floating))  # shared, read-only: the padding rows
    if off == NULL or kidx == NULL or zero == NULL:
        free(off)
        free(kidx)
        free(zero)
        raise MemoryError("cypool.conv2d_backward: out of memory")
    _tap_offsets(&p, kh, kw, dh, dw, off)
    for t in range(Kp):
        kidx[t] = t
    with nogil, parallel(num_threads=T):
        tid = threadid()
        q0 = _share_start(Q, tid)
        q1 = _share_start(Q, tid + 1)
        buf = <floating*>malloc(p.size * sizeof(floating))
        tmp = <floating*>malloc(O * ce * sizeof(floating))
        xs = <const floating**>malloc(Kp * sizeof(void*))
        gs = <const floating**>malloc(Op * sizeof(void*))
        if buf == NULL or tmp == NULL or xs == NULL or gs == NULL:
            fail[0] = 1
        else:
            for o in range(Op):
                gs[o] = tmp + o * ce if o < O else zero
            for t in range(K, Kp):
                xs[t] = zero
            cur = -1
            for q in range(q0, q1):
                n = q // G
                if n != cur:
                    _fill_phases(x, n, &p, buf)
                    cur = n
                e_lo = (q % G) * ce
                ne = min(ce, L - e_lo)
                # The chunk of grad_out on the virtual index: zero past each row.
                for o in range(O):
                    for e in range(ne):
                        oh = (e_lo + e) // p.Wq
                        ow = (e_lo + e) % p.Wq
                        tmp[o * ce + e] = gout[n, o, oh, ow] if ow < OW else 0
                for t in range(K):
                    xs[t] = buf + off[t] + e_lo
                o = 0
                while o < Op:
                    t = 0
                    while t < Kp:
                        _vc_dots(CYPOOL_VC_OB, gs + o, CYPOOL_VC_TB, xs + t, kidx + t, ne,
                                 &partial[tid, o, 0], Kp)
                        t = t + CYPOOL_VC_TB
                    o = o + CYPOOL_VC_OB
        free(buf)
        free(tmp)
        free(xs)
        free(gs)
    free(off)
    free(kidx)
    free(zero)
    if failed[0]:
        raise MemoryError("cypool.conv2d_backward: out of memory")


def dots_block():
    """(output channels, taps) per weight-gradient dot-product block: the
    caller pads the partial sums to whole blocks."""
    return CYPOOL_VC_OB, CYPOOL_VC_TB
