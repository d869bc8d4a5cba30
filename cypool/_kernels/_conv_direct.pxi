# Uses: _tap_major from _conv.pxi; Held, _hold, _release_all from _common.pxi; _conv_direct.h.
# Direct stride-1 convolution of small images (_conv_direct.h): the path
# conv.py takes for a call too small for a thread team, such as a batch-1
# training step. One zero-padded copy of each image is the only set-up,
# and the arrays are read through the buffer protocol (their pointers and
# strides) rather than typed memoryviews, whose acquisition costs as much
# as a small image's arithmetic.
cdef extern from "_conv_direct.h" nogil:
    int CYPOOL_CD_VLEN_F32
    int CYPOOL_CD_VLEN_F64
    void cypool_cd_forward_f32(const float* P, Py_ssize_t plane, Py_ssize_t ldp, int C, int kh,
                               int kw, int dh, int dw, const float* w, int O, int OH, int OW,
                               float* out, Py_ssize_t so_o, Py_ssize_t so_y, const float* bias)
    void cypool_cd_forward_f64(const double* P, Py_ssize_t plane, Py_ssize_t ldp, int C, int kh,
                               int kw, int dh, int dw, const double* w, int O, int OH, int OW,
                               double* out, Py_ssize_t so_o, Py_ssize_t so_y, const double* bias)
    void cypool_cd_weight_grad_f32(const float* P, Py_ssize_t plane, Py_ssize_t ldp, int C,
                                   int kh, int kw, int dh, int dw, const float* G,
                                   Py_ssize_t gplane, Py_ssize_t ldg, int O, int OH, int OW,
                                   float* gw, Py_ssize_t ldgw)
    void cypool_cd_weight_grad_f64(const double* P, Py_ssize_t plane, Py_ssize_t ldp, int C,
                                   int kh, int kw, int dh, int dw, const double* G,
                                   Py_ssize_t gplane, Py_ssize_t ldg, int O, int OH, int OW,
                                   double* gw, Py_ssize_t ldgw)
    float cypool_cd_sum_f32(const float* G, Py_ssize_t n)
    double cypool_cd_sum_f64(const double* G, Py_ssize_t n)


cdef struct Arr:
    # An array as the direct kernels read it: (N, C, H, W), strides in bytes.
    char* buf
    Py_ssize_t shape[4]
    Py_ssize_t strides[4]


cdef inline Py_ssize_t _vlen(floating* _) noexcept nogil:
    return CYPOOL_CD_VLEN_F32 if floating is float else CYPOOL_CD_VLEN_F64


cdef void _pad_image(const char* src, const Py_ssize_t* shape, const Py_ssize_t* strides,
                     Py_ssize_t top, Py_ssize_t left, floating* P, Py_ssize_t Hb,
                     Py_ssize_t ldp) noexcept nogil:
    """P (C planes of Hb rows of ldp values) = the image src (C, H, W) at
    row top, column left (either may be negative: cropped), zeros around."""
    cdef Py_ssize_t C = shape[1], H = shape[2], W = shape[3]
    cdef Py_ssize_t c, r, s, r_lo = max(0, top), r_hi = min(Hb, top + H)
    cdef Py_ssize_t s_lo = max(0, left), s_hi = min(ldp, left + W), sw = strides[3]
    cdef const char* row
    cdef floating* dst
    memset(P, 0, C * Hb * ldp * sizeof(floating))
    if s_hi <= s_lo:  # no column of the image inside P
        return
    for c in range(C):
        for r in range(r_lo, r_hi):
            row = src + c * strides[1] + (r - top) * strides[2] + (s_lo - left) * sw
            dst = P + (c * Hb + r) * ldp
            if sw == <Py_ssize_t>sizeof(floating):
                memcpy(dst + s_lo, row, (s_hi - s_lo) * sizeof(floating))
            else:
                for s in range(s_hi - s_lo):
                    dst[s_lo + s] = (<const floating*>(row + s * sw))[0]


cdef int _direct_forward(const Arr* x, const Arr* w, const Arr* b,
                         const Arr* out, Py_ssize_t top, Py_ssize_t left, Py_ssize_t dh,
                         Py_ssize_t dw, bint transposed, floating* _) noexcept nogil:
    """out = the stride-1 convolution of x (any strides); 1 when out of memory."""
    cdef Py_ssize_t N = x.shape[0], Cin = x.shape[1], kh = w.shape[2], kw = w.shape[3]
    cdef Py_ssize_t Cout = out.shape[1], OH = out.shape[2], OW = out.shape[3], L = _vlen(_)
    cdef Py_ssize_t Hb = OH + (kh - 1) * dh, ldp = (OW + L - 1) // L * L + (kw - 1) * dw
    cdef Py_ssize_t isz = sizeof(floating), n, co, y, ow
    cdef const floating* bias = <const floating*>b.buf if b.shape[0] > 0 else NULL
    # The kernel stores rows of unit stride; any other output takes a scratch image.
    cdef bint in_place = (out.strides[3] == isz and out.strides[1] % isz == 0
                          and out.strides[2] % isz == 0 and <size_t>out.buf % isz == 0)
    cdef floating* P = <floating*>malloc(Cin * Hb * ldp * isz)
    cdef floating* wt = _tap_major(w.buf, w.shape, w.strides, transposed, Cout, _)
    cdef floating* tmp = NULL if in_place else <floating*>malloc(Cout * OH * OW * isz)
    cdef floating* dst
    cdef char* o
    cdef int failed = P == NULL or wt == NULL or (tmp == NULL and not in_place)
    if not failed:
        for n in range(N):
            _pad_image(<const char*>x.buf + n * x.strides[0], x.shape, x.strides, top, left,
                       P, Hb, ldp)
            o = <char*>out.buf + n * out.strides[0]
            dst = <floating*>o if in_place else tmp
            if floating is float:
                cypool_cd_forward_f32(P, Hb * ldp, ldp, Cin, kh, kw, dh, dw, wt, Cout, OH, OW, dst,
                                      out.strides[1] // isz if in_place else OH * OW,
                                      out.strides[2] // isz if in_place else OW, bias)
            else:
                cypool_cd_forward_f64(P, Hb * ldp, ldp, Cin, kh, kw, dh, dw, wt, Cout, OH, OW, dst,
                                      out.strides[1] // isz if in_place else OH * OW,
                                      out.strides[2] // isz if in_place else OW, bias)
            if not in_place:
                for co in range(Cout):
                    for y in range(OH):
                        for ow in range(OW):
                            (<floating*>(o + co * out.strides[1] + y * out.strides[2]
                                         + ow * out.strides[3]))[0] = tmp[(co * OH + y) * OW + ow]
    free(P)
    free(wt)
    free(tmp)
    return failed


cdef int _direct_weight_grad(const Arr* g, const Arr* x, const Arr* gw,
                             const Arr* gb, Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t top,
                             Py_ssize_t left, Py_ssize_t dh, Py_ssize_t dw,
                             floating* _) noexcept nogil:
    """gw (O, C*kh*kw) and gb (O,) (or NULL), C-contiguous = the weight and
    bias gradients, summed over the batch in order; 1 when out of memory."""
    cdef Py_ssize_t N = x.shape[0], C = x.shape[1], O = g.shape[1], OH = g.shape[2]
    cdef Py_ssize_t OW = g.shape[3], L = _vlen(_), ldg = (OW + L - 1) // L * L
    cdef Py_ssize_t Hb = OH + (kh - 1) * dh, ldp = ldg + (kw - 1) * dw, n, o, y, ow
    cdef floating* P = <floating*>malloc(C * Hb * ldp * sizeof(floating))
    cdef floating* G = <floating*>calloc(O * OH * ldg, sizeof(floating))
    cdef floating* wout = <floating*>gw.buf
    cdef floating* bout = <floating*>gb.buf if gb != NULL else NULL
    cdef const char* src
    cdef int failed = P == NULL or G == NULL
    memset(wout, 0, O * C * kh * kw * sizeof(floating))
    if bout != NULL:
        memset(bout, 0, O * sizeof(floating))
    if not failed:
        for n in range(N):
            # G: grad_output's rows, zeros to a whole vector (calloc).
            for o in range(O):
                for y in range(OH):
                    src = <const char*>g.buf + n * g.strides[0] + o * g.strides[1] + y * g.strides[2]
                    if g.strides[3] == <Py_ssize_t>sizeof(floating):
                        memcpy(G + (o * OH + y) * ldg, src, OW * sizeof(floating))
                    else:
                        for ow in range(OW):
                            G[(o * OH + y) * ldg + ow] = (<const floating*>(src + ow * g.strides[3]))[0]
                if bout == NULL:
                    pass
                elif floating is float:
                    bout[o] += cypool_cd_sum_f32(G + o * OH * ldg, OH * ldg)
                else:
                    bout[o] += cypool_cd_sum_f64(G + o * OH * ldg, OH * ldg)
            _pad_image(<const char*>x.buf + n * x.strides[0], x.shape, x.strides, top, left,
                       P, Hb, ldp)
            if floating is float:
                cypool_cd_weight_grad_f32(P, Hb * ldp, ldp, C, kh, kw, dh, dw, G, OH * ldg, ldg,
                                          O, OH, OW, wout, C * kh * kw)
            else:
                cypool_cd_weight_grad_f64(P, Hb * ldp, ldp, C, kh, kw, dh, dw, G, OH * ldg, ldg,
                                          O, OH, OW, wout, C * kh * kw)
    free(P)
    free(G)
    return failed


cdef void _as_arr(const Py_buffer* v, Arr* a, bint batched) noexcept:
    """a = v's first four axes, after a batch axis of one image put in front
    when not batched; axes it lacks have length 1 (and a trailing fifth of
    length 1, a vector image's E = 1, is left out)."""
    cdef int k, src, lead = 0 if batched else 1
    a.buf = <char*>v.buf
    for k in range(4):
        src = k - lead
        a.shape[k] = v.shape[src] if 0 <= src < v.ndim else 1
        a.strides[k] = v.strides[src] if 0 <= src < v.ndim else 0


def conv2d_direct(x,         # IN  (N, Cin, H, W[, 1]), any strides, float32 or float64
                  w,         # IN  (O, C, kh, kw), any strides
                  bias,      # IN  (Cout,), C-contiguous, or empty for none
                  out,       # OUT (N, Cout, OH, OW[, 1]), any strides
                  Py_ssize_t top, Py_ssize_t left, Py_ssize_t dh, Py_ssize_t dw,
                  bint transposed, bint batched):
    """out = the stride-1 convolution of x seen with zero padding top and
    left (negative: cropped), dilation (dh, dw), on the calling thread.
    transposed: x is an output gradient, w used flipped with its first two
    axes swapped (the input gradient). A trailing axis of length 1 (a
    vector convolution at E = 1) is ignored; not batched: x and out are
    one image without the batch axis. The arrays were checked by
    cypool.conv: dtypes alike, shapes consistent."""
    cdef Held held
    cdef Arr a[4]
    cdef int failed
    held.n = 0
    try:
        _as_arr(_hold(&held, x, False), &a[0], batched)
        _as_arr(_hold(&held, w, False), &a[1], True)
        _as_arr(_hold(&held, bias, False), &a[2], True)
        _as_arr(_hold(&held, out, True), &a[3], batched)
        with nogil:
            if held.views[0].itemsize == 4:
                failed = _direct_forward(&a[0], &a[1], &a[2], &a[3], top, left, dh, dw,
                                         transposed, <float*>NULL)
            else:
                failed = _direct_forward(&a[0], &a[1], &a[2], &a[3], top, left, dh, dw,
                                         transposed, <double*>NULL)
    finally:
        _release_all(&held)
    if failed:
        raise MemoryError("cypool.conv2d: out of memory")


cdef void _grad_bias(const Arr* g, floating* gb) noexcept nogil:
    """gb (O,) = the sum of g (N, O, OH, OW) over all but its channel axis."""
    cdef Py_ssize_t n, o, y, ow
    cdef const char* row
    cdef floating s
    for o in range(g.shape[1]):
        s = 0
        for n in range(g.shape[0]):
            for y in range(g.shape[2]):
                row = g.buf + n * g.strides[0] + o * g.strides[1] + y * g.strides[2]
                for ow in range(g.shape[3]):
                    s += (<const floating*>(row + ow * g.strides[3]))[0]
        gb[o] = s


cdef int _direct_backward(const Arr* g, const Arr* x, const Arr* w, const Arr* gx,
                          const Arr* gw, const Arr* gb, Py_ssize_t top, Py_ssize_t left,
                          Py_ssize_t itop, Py_ssize_t ileft, Py_ssize_t dh, Py_ssize_t dw,
                          floating* _) noexcept nogil:
    """The gradients that gx, gw, gb (each may be NULL) ask for; 1 when out
    of memory."""
    cdef Arr nobias
    cdef int failed = 0
    nobias.shape[0] = 0
    if gx != NULL:
        failed = _direct_forward(g, w, &nobias, gx, itop, ileft, dh, dw, True, _)
    if gw != NULL and not failed:
        failed = _direct_weight_grad(g, x, gw, gb, w.shape[2], w.shape[3], top, left, dh, dw, _)
    elif gb != NULL:
        _grad_bias(g, <floating*>gb.buf)
    return failed


def conv2d_direct_backward(g,     # IN  (N, O, OH, OW[, 1]), any strides
                           x,     # IN  (N, C, H, W[, 1]), any strides; or None without gw
                           w,     # IN  (O, C, kh, kw), any strides
                           gx,    # OUT like x, any strides; or None
                           gw,    # OUT (O, C, kh, kw) or (O, C*kh*kw), C-contiguous; or None
                           gb,    # OUT (O,), C-contiguous; or None
                           Py_ssize_t top, Py_ssize_t left, Py_ssize_t itop, Py_ssize_t ileft,
                           Py_ssize_t dh, Py_ssize_t dw, bint batched):
    """The input, weight and bias gradients of conv2d_direct's forward (top,
    left: its padding; itop, ileft: the input gradient's, a transposed
    conv2d_direct of g), those whose arrays are given. batched as for
    conv2d_direct."""
    cdef Held held
    cdef Arr a[6]
    cdef int failed
    cdef bint want_x = gx is not None, want_w = gw is not None, want_b = gb is not None
    held.n = 0
    try:
        _as_arr(_hold(&held, g, False), &a[0], batched)
        _as_arr(_hold(&held, w, False), &a[2], True)
        if want_w:
            _as_arr(_hold(&held, x, False), &a[1], batched)
        if want_x:
            _as_arr(_hold(&held, gx, True), &a[3], batched)
        if want_w:
            _as_arr(_hold(&held, gw, True), &a[4], True)
        if want_b:
            _as_arr(_hold(&held, gb, True), &a[5], True)
        with nogil:
            if held.views[0].itemsize == 4:
                failed = _direct_backward(&a[0], &a[1], &a[2], &a[3] if want_x else NULL,
                                          &a[4] if want_w else NULL, &a[5] if want_b else NULL,
                                          top, left, itop, ileft, dh, dw, <float*>NULL)
            else:
                failed = _direct_backward(&a[0], &a[1], &a[2], &a[3] if want_x else NULL,
                                          &a[4] if want_w else NULL, &a[5] if want_b else NULL,
                                          top, left, itop, ileft, dh, dw, <double*>NULL)
    finally:
        _release_all(&held)
    if failed:
        raise MemoryError("cypool.conv2d: out of memory")
