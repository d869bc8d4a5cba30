# Uses: ConvJob, _job, _job_free from _conv.pxi; _SLACK, _phase_geom, _fill_phases, _tap_major from _conv_phases.pxi; _vc_pixel, _vc_dots, _pack_new, _pack_rows from _vconv.pxi.
# The backward passes of the standard convolution (_conv.pxi has the
# forward pass, _conv_phases.pxi the phase buffers, tap lists and weight
# copies they share):
#   * the weight gradient: the tiles of _conv_tiles.h on each chunk's im2col
#     rows, or (as cypool._select chooses; finite images only) dot products
#     over the virtual output index with the tap vectors; summed in
#     parts, one a thread outside a crowded spell (_backend.parts_for);
#   * a strided convolution's input gradient, by columns added into place.
# (A stride-1 input gradient is _conv.pxi's forward pass, transposed.)


cdef inline bint _all_finite(const floating* v, Py_ssize_t n) noexcept nogil:
    """No inf or NaN in v[:n] (an exponent of all ones), by integer ops that
    vectorise."""
    cdef Py_ssize_t i
    cdef uint32_t bad32 = 0
    cdef uint64_t bad64 = 0
    cdef const uint32_t* b32 = <const uint32_t*>v
    cdef const uint64_t* b64 = <const uint64_t*>v
    if floating is float:
        for i in range(n):
            bad32 = bad32 | ((b32[i] & 0x7f800000u) == 0x7f800000u)
        return bad32 == 0
    else:
        for i in range(n):
            bad64 = bad64 | ((b64[i] & 0x7ff0000000000000u) == 0x7ff0000000000000u)
        return bad64 == 0


cdef int _weight_grad_items(const floating[:, :, :, ::1] gout, const floating[:, :, :, :] x,
                            floating* gw, floating* gb, const ConvJob* j, bint few,
                            Py_ssize_t q0, Py_ssize_t q1) noexcept nogil:
    """Work items [q0, q1) of a weight gradient, added into gw (O, K) and
    the bias gradient into gb (O).

    Two ways (cypool._select.WeightGradAlgo), few False or True. TILES: a chunk's real output positions r (columns
    ow < OW) give two matrices, gT[r, o] = grad_out at r and colT[r, k] =
    tap k of r (a row of im2col: the chunk's tap vectors in the phase
    buffer, transposed in blocks by _tap_major.h), and
    gw[o, k] += sum over r of gT[r, o] * colT[r, k] is the forward's matrix
    product with the positions as taps and the taps as E: the same register
    tiles. DOTS: dot products of grad_out's chunk (zeros past each
    row) with every tap vector, over the virtual index, with no gathering;
    only for an image with no inf or NaN, whose values past a row's end
    then add exact zeros."""
    cdef Py_ssize_t q, n, cur = -1, e_lo, ne, nr, t, o, e, oh, ow, k, K = j.K, Op = j.Op
    cdef Py_ssize_t Wq = j.p.Wq, e_end, r
    cdef Py_ssize_t O4 = (j.O + CYPOOL_VC_OB - 1) // CYPOOL_VC_OB * CYPOOL_VC_OB
    cdef Py_ssize_t K2 = (K + CYPOOL_VC_TB - 1) // CYPOOL_VC_TB * CYPOOL_VC_TB
    cdef bint finite = False
    cdef floating acc
    cdef floating* dst
    cdef const floating* row
    cdef floating* buf = <floating*>malloc((j.p.size + _SLACK) * sizeof(floating))
    cdef floating* gT = <floating*>malloc(j.ce * Op * sizeof(floating))
    cdef floating* colT = <floating*>malloc(j.ce * K * sizeof(floating))
    cdef floating* part = <floating*>malloc(Op * K * sizeof(floating))
    cdef const floating** rows = <const floating**>malloc(j.ce * sizeof(void*))
    cdef floating** outs = <floating**>malloc(Op * sizeof(void*))
    cdef const floating** pp = _pack_new(j.ce, <floating*>NULL)
    cdef floating* pack = _pack_rows(pp, j.ce)
    # The dot-product way's buffers: grad_out's chunk, rows and taps padded to
    # whole blocks with a zero vector, and its sums (O4, K2).
    cdef floating* gch = <floating*>malloc(j.O * j.ce * sizeof(floating)) if few else NULL
    cdef floating* zero = <floating*>calloc(j.ce, sizeof(floating)) if few else NULL
    cdef floating* gwd = <floating*>calloc(O4 * K2, sizeof(floating)) if few else NULL
    cdef const floating** gs = <const floating**>malloc(O4 * sizeof(void*)) if few else NULL
    cdef const floating** xs = <const floating**>malloc(K2 * sizeof(void*)) if few else NULL
    cdef Py_ssize_t* kidx = <Py_ssize_t*>malloc(K2 * sizeof(Py_ssize_t)) if few else NULL
    cdef int failed = (buf == NULL or gT == NULL or colT == NULL or part == NULL or rows == NULL
                       or outs == NULL or pp == NULL)
    if few and (gch == NULL or zero == NULL or gwd == NULL or gs == NULL or xs == NULL
                or kidx == NULL):
        failed = 1
    if not failed:
        for o in range(Op):
            outs[o] = part + o * K
        if few:
            for o in range(O4):
                gs[o] = gch + o * j.ce if o < j.O else zero
            for t in range(K2):
                kidx[t] = t
                xs[t] = zero
        for q in range(q0, q1):
            n = q // j.G
            if n != cur:
                _fill_phases(x, n, &j.p, buf, 0)
                finite = few and _all_finite(buf, j.p.size)
                cur = n
            e_lo = (q % j.G) * j.ce
            ne = min(j.ce, j.L - e_lo)
            if finite:
                for o in range(j.O):
                    dst = gch + o * j.ce - e_lo
                    e = e_lo
                    while e < e_lo + ne:
                        oh = e // Wq
                        e_end = min(e_lo + ne, oh * Wq + Wq)
                        row = &gout[n, o, oh, 0] - oh * Wq
                        for r in range(e, min(e_end, oh * Wq + j.OW)):
                            dst[r] = row[r]
                        for r in range(max(e, oh * Wq + j.OW), e_end):
                            dst[r] = 0
                        e = e_end
                    acc = 0
                    for r in range(e_lo, e_lo + ne):
                        acc = acc + dst[r]
                    gb[o] += acc
                for t in range(K):
                    xs[t] = buf + j.off[t] + e_lo
                o = 0
                while o < O4:
                    t = 0
                    while t < K2:
                        _vc_dots(CYPOOL_VC_OB, gs + o, CYPOOL_VC_TB, xs + t, kidx + t, ne,
                                 gwd + o * K2, K2)
                        t = t + CYPOOL_VC_TB
                    o = o + CYPOOL_VC_OB
                continue
            # The chunk's im2col rows, every position's (transposed in
            # blocks); its real positions' rows, and their rows of gT.
            if floating is float:
                cypool_tap_rows_f32(buf + e_lo, j.off, K, ne, colT)
            else:
                cypool_tap_rows_f64(buf + e_lo, j.off, K, ne, colT)
            nr = 0
            for e in range(e_lo, e_lo + ne):
                oh = e // Wq
                ow = e - oh * Wq
                if ow >= j.OW:
                    continue
                for o in range(j.O):
                    gT[nr * Op + o] = gout[n, o, oh, ow]
                for o in range(j.O, Op):
                    gT[nr * Op + o] = 0
                rows[nr] = colT + (e - e_lo) * K
                nr = nr + 1
            if nr == 0:
                continue
            for o in range(j.O):
                acc = 0
                for t in range(nr):
                    acc = acc + gT[t * Op + o]
                gb[o] += acc
            _vc_pixel(nr, rows, gT, Op, 0, K, j.O, outs, <const floating*>NULL, pack, pp)
            for o in range(j.O):
                for k in range(K):
                    gw[o * K + k] += part[o * K + k]
        if few:
            for o in range(j.O):
                for k in range(K):
                    gw[o * K + k] += gwd[o * K2 + k]
    free(buf)
    free(gT)
    free(colT)
    free(part)
    free(rows)
    free(outs)
    free(pp)
    free(gch)
    free(zero)
    free(gwd)
    free(gs)
    free(xs)
    free(kidx)
    return failed


def conv2d_weight_grad(const floating[:, :, :, ::1] gout,  # IN  (N, O, OH, OW)
                       const floating[:, :, :, :] x,       # IN  (N, C, H, W), any strides
                       floating[:, ::1] grad_w,            # OUT (O, C*kh*kw)
                       floating[::1] grad_b,               # OUT (O,)
                       Py_ssize_t plh, Py_ssize_t plw, Py_ssize_t Hp, Py_ssize_t Wp,
                       Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t sh, Py_ssize_t sw,
                       Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ce, bint dots, int parts,
                       int num_threads):
    """grad_w[o, k] = sum over images and output positions of
    grad_out[n, o, oh, ow] * (tap k of (oh, ow)); grad_b[o] = the sum of
    grad_out[:, o]. The work is cut into `parts` contiguous parts, each
    summed into partial sums of its own, which are then added in part
    order: the result depends on the number of parts, never on the team.
    dots: WeightGradAlgo.DOTS, else TILES.
    num_threads (at most parts) threads claim the parts; one thread runs
    them all in turn."""
    cdef ConvJob j
    cdef Team team
    cdef Py_ssize_t Q, O = gout.shape[1], K = x.shape[1] * kh * kw, Op, part, o, k, t, s, end
    cdef int S = parts, T = min(num_threads, parts)
    cdef floating* partial
    cdef int[1] failed
    cdef int* fail = &failed[0]
    Op = (O + CYPOOL_VC_OB - 1) // CYPOOL_VC_OB * CYPOOL_VC_OB
    part = O * K + O  # a part's sums: (O, K) weights, then O biases
    partial = <floating*>calloc(S * part, sizeof(floating))
    _phase_geom(&j.p, x.shape[1], x.shape[2], x.shape[3], 1, 1, plh, plw, Hp, Wp, sh, sw)
    failed[0] = _job(&j, K, O, Op, gout.shape[2], gout.shape[3], ce, kh, kw, dh, dw, False)
    Q = x.shape[0] * j.G
    if not failed[0] and partial != NULL:
        if T == 1:
            _set_serial_team()
            with nogil:
                for s in range(S):
                    if _weight_grad_items(gout, x, partial + s * part, partial + s * part + O * K,
                                          &j, dots, _part_start(Q, s, S), _part_start(Q, s + 1, S)):
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
                        if _weight_grad_items(gout, x, partial + s * part,
                                              partial + s * part + O * K, &j, dots,
                                              _part_start(Q, s, S), _part_start(Q, s + 1, S)):
                            fail[0] = 1
                        s = s + 1
                    s = _claim(&team, S, 1, &end)
            _team_end(&team)
        if not failed[0]:
            for o in range(O):
                for k in range(K):
                    grad_w[o, k] = partial[o * K + k]
                grad_b[o] = partial[O * K + o]
            for t in range(1, S):  # in part order
                for o in range(O):
                    for k in range(K):
                        grad_w[o, k] += partial[t * part + o * K + k]
                    grad_b[o] += partial[t * part + O * K + o]
    _job_free(&j)
    free(partial)
    if failed[0] or partial == NULL:
        raise MemoryError("cypool.conv2d_backward: out of memory")


cdef struct Col2imWork:
    # One thread's buffers for _col2im_images, taken once a call.
    void* pad      # the padded input gradient of one image (C, Hp, Wp)
    void* cols     # a chunk's columns (Kp, ce)
    void** xs      # O pointers: the chunk of each output channel
    void** outs    # Kp pointers: the rows of cols
    void** pp      # the tiles' packing pointers (_pack_new)


cdef inline Py_ssize_t _col2im_hp(Py_ssize_t H, Py_ssize_t ph, Py_ssize_t sh, Py_ssize_t dh,
                                  Py_ssize_t kh) noexcept nogil:
    return H + 2 * ph + sh * dh * kh  # generous margins


cdef int _col2im_work(Col2imWork* ws, Py_ssize_t C, Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t O,
                      Py_ssize_t Kp, Py_ssize_t ce, floating* like) noexcept nogil:
    """Take a thread's buffers; 1 when out of memory (free them either way)."""
    ws.pad = malloc(C * Hp * Wp * sizeof(floating))
    ws.cols = malloc(Kp * ce * sizeof(floating))
    ws.xs = <void**>malloc(O * sizeof(void*))
    ws.outs = <void**>malloc(Kp * sizeof(void*))
    ws.pp = <void**><void*>_pack_new(O, like)
    return ws.pad == NULL or ws.cols == NULL or ws.xs == NULL or ws.outs == NULL or ws.pp == NULL


cdef void _col2im_free(Col2imWork* ws) noexcept nogil:
    free(ws.pad)
    free(ws.cols)
    free(ws.xs)
    free(ws.outs)
    free(ws.pp)


cdef void _col2im_images(const Col2imWork* ws, const floating[:, :, :, ::1] gout,
                         const floating* wt, Py_ssize_t Kp, floating[:, :, :, ::1] gx,
                         Py_ssize_t kh, Py_ssize_t kw, Py_ssize_t ph, Py_ssize_t pw,
                         Py_ssize_t sh, Py_ssize_t sw, Py_ssize_t dh, Py_ssize_t dw,
                         Py_ssize_t ce, Py_ssize_t n0, Py_ssize_t n1) noexcept nogil:
    """Input gradients of images [n0, n1) by columns, in ws's buffers: for a
    chunk of output positions, cols[k, e] = sum over o of w[o, k] *
    grad_out[o, e] (the register tiles, with the O channels as taps and the
    positions as E), then every column is added into the padded input
    gradient at its tap's position."""
    cdef Py_ssize_t O = gout.shape[1], OH = gout.shape[2], OW = gout.shape[3]
    cdef Py_ssize_t C = gx.shape[1], H = gx.shape[2], W = gx.shape[3]
    cdef Py_ssize_t Hp = _col2im_hp(H, ph, sh, dh, kh), Wp = _col2im_hp(W, pw, sw, dw, kw)
    cdef Py_ssize_t P = OH * OW, n, e_lo, ne, o, k, c, i, jj, e, oh, ow, e_end, r, h
    cdef floating* pad = <floating*>ws.pad
    cdef floating* cols = <floating*>ws.cols
    cdef const floating** xs = <const floating**>ws.xs
    cdef floating** outs = <floating**>ws.outs
    cdef const floating** pp = <const floating**>ws.pp
    cdef floating* pack = _pack_rows(pp, O)
    cdef floating* dst
    cdef const floating* src
    for k in range(Kp):
        outs[k] = cols + k * ce
    for n in range(n0, n1):
        memset(pad, 0, C * Hp * Wp * sizeof(floating))
        e_lo = 0
        while e_lo < P:
            ne = min(ce, P - e_lo)
            for o in range(O):
                xs[o] = &gout[n, o, 0, 0] + e_lo
            _vc_pixel(O, xs, wt, Kp, 0, ne, Kp, outs, <const floating*>NULL, pack, pp)
            k = 0
            for c in range(C):
                for i in range(kh):
                    for jj in range(kw):
                        src = cols + k * ce - e_lo
                        e = e_lo
                        while e < e_lo + ne:
                            oh = e // OW
                            ow = e - oh * OW
                            e_end = min(e_lo + ne, oh * OW + OW)
                            dst = pad + (c * Hp + oh * sh + i * dh) * Wp + jj * dw
                            for r in range(ow, ow + e_end - e):
                                dst[r * sw] += src[oh * OW + r]
                            e = e_end
                        k = k + 1
            e_lo = e_lo + ne
        for c in range(C):
            for h in range(H):
                memcpy(&gx[n, c, h, 0], pad + (c * Hp + h + ph) * Wp + pw, W * sizeof(floating))


def conv2d_input_grad_col2im(const floating[:, :, :, ::1] gout,  # IN  (N, O, OH, OW)
                             const floating[:, :, :, :] w,       # IN  (O, C, kh, kw), any strides
                             floating[:, :, :, ::1] gx,          # OUT (N, C, H, W)
                             Py_ssize_t ph, Py_ssize_t pw, Py_ssize_t sh, Py_ssize_t sw,
                             Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ce, int num_threads):
    """The input gradient of a strided convolution (ph, pw: top and left
    padding), by columns: no zeros inserted between the output gradient's
    elements, as the transposed convolution of conv2d_forward would need.
    Threads take whole images."""
    cdef Py_ssize_t O = w.shape[0], K = w.shape[1] * w.shape[2] * w.shape[3], N = gx.shape[0]
    cdef Py_ssize_t Kp = (K + CYPOOL_VC_OB - 1) // CYPOOL_VC_OB * CYPOOL_VC_OB, o, c, i, j
    cdef floating* wt = <floating*>calloc(O * Kp, sizeof(floating))  # (O, Kp): rows per channel o
    cdef Py_ssize_t start, end, kh = w.shape[2], kw = w.shape[3], C = gx.shape[1]
    cdef Py_ssize_t Hp = _col2im_hp(gx.shape[2], ph, sh, dh, kh)
    cdef Py_ssize_t Wp = _col2im_hp(gx.shape[3], pw, sw, dw, kw)
    cdef Col2imWork ws
    cdef Col2imWork* mine
    cdef Team team
    cdef int[1] failed
    cdef int* fail = &failed[0]
    failed[0] = wt == NULL
    if not failed[0]:
        for o in range(O):
            for c in range(w.shape[1]):
                for i in range(w.shape[2]):
                    for j in range(w.shape[3]):
                        wt[o * Kp + (c * w.shape[2] + i) * w.shape[3] + j] = w[o, c, i, j]
        if num_threads == 1:
            _set_serial_team()
            with nogil:
                failed[0] = _col2im_work(&ws, C, Hp, Wp, O, Kp, ce, <floating*>NULL)
                if not failed[0]:
                    _col2im_images(&ws, gout, wt, Kp, gx, kh, kw, ph, pw, sh, sw, dh, dw, ce, 0, N)
                _col2im_free(&ws)
        else:
            # Whole images claimed one at a time (_claim), each thread's
            # buffers taken once.
            _team_begin(&team)
            with nogil, parallel(num_threads=num_threads):
                _note_team()
                mine = <Col2imWork*>calloc(1, sizeof(Col2imWork))  # (assigned here: private)
                if mine == NULL or _col2im_work(mine, C, Hp, Wp, O, Kp, ce, <floating*>NULL):
                    fail[0] = 1
                end = -1
                start = _claim(&team, N, 1, &end)
                while start < N:
                    if not fail[0]:
                        _col2im_images(mine, gout, wt, Kp, gx, kh, kw, ph, pw, sh, sw, dh, dw, ce,
                                       start, end)
                    start = _claim(&team, N, 1, &end)
                if mine != NULL:
                    _col2im_free(mine)
                free(mine)
            _team_end(&team)
    free(wt)
    if failed[0]:
        raise MemoryError("cypool.conv2d_backward: out of memory")
