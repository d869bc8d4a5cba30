# Uses: PhaseGeom, _SLACK, _phase_geom, _fill_phases, _tap_offsets, _vc_grid, _tap_major from _conv_phases.pxi; _vc_pixel, _pack_new, _pack_rows from _vconv.pxi; _conv_tiles.h.
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
# register-blocked tiles of _conv_tiles.h do the arithmetic, and no
# im2col buffer is made. The caller chooses the algorithm
# (cypool._select.ConvAlgo); this file carries it out:
#   VIRTUAL         the tiles read each tap's block where it lies;
#   VIRTUAL_COPIED  they copy each block of taps into a packed block first;
#   GRID            each block of real positions is gathered from its rows
#                   (cypool_vc_grid); work items are chunks of the OH * OW
#                   real positions;
#   LANES           output channels in the vector lanes (_conv_ovec.h): the
#                   real positions only, from the image padded but not
#                   split into phases, a band of output rows at a time;
#   WINOGRAD        LANES with rows three taps wide by F(2, 3)
#                   (_conv_winograd.h); LANES where a weight's transform is
#                   not finite.
# An unpadded stride-1 convolution of C-contiguous images reads them in
# place (the buffer would be a copy).
#
# The input gradient of a stride-1 convolution is this forward run on the
# output gradient padded by the kernel's reach, with the kernel flipped and
# transposed; a strided one's is computed by columns, added into place
# (_col2im_images). The weight gradient runs the same tiles on each chunk's
# im2col rows, or (WeightGradAlgo.DOTS, an image without inf or NaN) takes
# dot products over e with the tap vectors.
#
# Work items are (image, chunk of e). Each thread takes a contiguous run of
# them (so it fills the buffer of an image once, and the split, and with it
# the order of the weight gradient's sums, is fixed for a thread count) and
# owns its buffers.

cdef struct ConvJob:
    # What every work item of a call shares, read-only.
    PhaseGeom p
    Py_ssize_t K              # taps (c, i, j)
    Py_ssize_t O, Op          # output channels; padded to whole register tiles / blocks
    Py_ssize_t OH, OW
    Py_ssize_t L, G, ce       # output length (virtual, or OH * OW with grid); chunks of it per image, chunk length
    bint grid                 # the real positions only (cypool_vc_grid), else the virtual output
    bint ovec                 # output channels in the lanes (_conv_ovec.h): p unsplit, items are (image, G rows of ce)
    Py_ssize_t ovs_h, ovs_w   # with ovec: the stride
    Py_ssize_t ovb            # with ovec: output rows a band (p.Aq: the padded rows they read)
    bint wino                 # with ovec: by F(2, 3) along the rows (_conv_winograd.h)
    Py_ssize_t K1, P          # with wino: taps (c, i); pairs of outputs a row
    const Py_ssize_t* offw    # with wino: where tap (c, i) of pair 0 is in a transformed band
    bint copy_taps            # the virtual output's tiles copy each block of taps first
    bint in_place             # the phase buffer would be the image itself: read x in place
    Py_ssize_t in_place_spill # read in place, images before this one have the next image after them
    const Py_ssize_t* off     # tap offsets in the phase buffer


# The algorithms of the forward kernel (cypool._select.ConvAlgo: the
# caller chooses, these kernels carry the choice out).
cdef enum:
    _VIRTUAL = 1
    _VIRTUAL_COPIED = 2
    _GRID = 3
    _LANES = 4
    _WINOGRAD = 5

# Whether the tiles of _conv_ovec.h are register tiles (gcc and clang),
# else plain loops that the selection never takes; and a vector's bytes.
OVEC_TILES = bool(CYPOOL_OV_FAST)
VECTOR_BYTES = CYPOOL_VC_VBYTES


def _last_conv_path():
    """The algorithm (cypool._select.ConvAlgo) of the calling thread's last
    pass through conv2d_forward; each Python thread has its own."""
    return cypool_conv_get_path()


cdef inline int _job(ConvJob* j, Py_ssize_t K, Py_ssize_t O, Py_ssize_t Op,
                     Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t ce, Py_ssize_t kh, Py_ssize_t kw,
                     Py_ssize_t dh, Py_ssize_t dw, bint grid) noexcept nogil:
    """Fill the rest of j (j.p set); 1 when out of memory. grid: the
    forward computes the real positions only (cypool_vc_grid)."""
    cdef Py_ssize_t* off = <Py_ssize_t*>malloc(K * sizeof(Py_ssize_t))
    j.K = K; j.O = O; j.Op = Op; j.OH = OH; j.OW = OW; j.ce = ce
    j.grid = grid
    j.ovec = False
    j.wino = False
    j.copy_taps = False
    j.offw = NULL
    j.L = OH * OW if j.grid else (OH - 1) * j.p.Wq + OW
    j.G = (j.L + ce - 1) // ce
    j.off = off
    j.in_place = False
    if off == NULL:
        return 1
    _tap_offsets(&j.p, kh, kw, dh, dw, off)
    return 0


cdef inline void _job_free(ConvJob* j) noexcept nogil:
    free(<void*>j.off)
    free(<void*>j.offw)


cdef extern from "_conv_ovec.h" nogil:
    int CYPOOL_OV_FAST
    Py_ssize_t CYPOOL_OV_LDS(Py_ssize_t OW)
    int CYPOOL_VC_VBYTES
    void cypool_ov_rows_f32(const float* img, const Py_ssize_t* off, Py_ssize_t K,
                            const float* w, Py_ssize_t Op, Py_ssize_t O, Py_ssize_t oy0,
                            Py_ssize_t oy1, Py_ssize_t OW, Py_ssize_t rstep, Py_ssize_t sw,
                            const float* bias, float* s, float* out, Py_ssize_t so_c,
                            Py_ssize_t so_h, Py_ssize_t so_w, const char* pf,
                            Py_ssize_t pf_bytes, Py_ssize_t pf_stride, Py_ssize_t pf_n)
    void cypool_ov_rows_f64(const double* img, const Py_ssize_t* off, Py_ssize_t K,
                            const double* w, Py_ssize_t Op, Py_ssize_t O, Py_ssize_t oy0,
                            Py_ssize_t oy1, Py_ssize_t OW, Py_ssize_t rstep, Py_ssize_t sw,
                            const double* bias, double* s, double* out, Py_ssize_t so_c,
                            Py_ssize_t so_h, Py_ssize_t so_w, const char* pf,
                            Py_ssize_t pf_bytes, Py_ssize_t pf_stride, Py_ssize_t pf_n)
    void cypool_ov_block_f32(const float* wt, Py_ssize_t K, Py_ssize_t Op, float* wb)
    void cypool_ov_block_f64(const double* wt, Py_ssize_t K, Py_ssize_t Op, double* wb)


cdef extern from "_conv_winograd.h" nogil:
    Py_ssize_t CYPOOL_WG_SCRATCH(Py_ssize_t Op, Py_ssize_t OW)
    int cypool_wg_weights_f32(const float* wt, Py_ssize_t K1, Py_ssize_t Op, float* g)
    int cypool_wg_weights_f64(const double* wt, Py_ssize_t K1, Py_ssize_t Op, double* g)
    void cypool_wg_input_f32(const float* xb, Py_ssize_t C, Py_ssize_t R, Py_ssize_t Wq,
                             Py_ssize_t P, float* u)
    void cypool_wg_input_f64(const double* xb, Py_ssize_t C, Py_ssize_t R, Py_ssize_t Wq,
                             Py_ssize_t P, double* u)
    void cypool_wg_rows_f32(const float* u, Py_ssize_t ks, const Py_ssize_t* offw, Py_ssize_t K1,
                            const float* g, Py_ssize_t rstep_u, const float* img,
                            const Py_ssize_t* off, Py_ssize_t K, const float* w, Py_ssize_t Op,
                            Py_ssize_t O, Py_ssize_t oy0, Py_ssize_t oy1, Py_ssize_t OW,
                            Py_ssize_t rstep, const float* bias, float* s, float* out,
                            Py_ssize_t so_c, Py_ssize_t so_h, Py_ssize_t so_w)
    void cypool_wg_rows_f64(const double* u, Py_ssize_t ks, const Py_ssize_t* offw,
                            Py_ssize_t K1, const double* g, Py_ssize_t rstep_u,
                            const double* img, const Py_ssize_t* off, Py_ssize_t K,
                            const double* w, Py_ssize_t Op, Py_ssize_t O, Py_ssize_t oy0,
                            Py_ssize_t oy1, Py_ssize_t OW, Py_ssize_t rstep,
                            const double* bias, double* s, double* out, Py_ssize_t so_c,
                            Py_ssize_t so_h, Py_ssize_t so_w)


cdef inline void _wg_band(const floating* buf, floating* u, const ConvJob* j,
                          const floating* wt, const floating* g, Py_ssize_t nrows,
                          const floating* bias, floating* s, floating* out, Py_ssize_t so_c,
                          Py_ssize_t so_h, Py_ssize_t so_w) noexcept nogil:
    """Output rows 0 .. nrows - 1 of the band of padded rows in buf, out
    at the band's first row, by F(2, 3) (j.wino)."""
    cdef Py_ssize_t ks = j.p.C * j.p.Aq * j.P
    if floating is float:
        cypool_wg_input_f32(buf, j.p.C, j.p.Aq, j.p.Wq, j.P, u)
        cypool_wg_rows_f32(u, ks, j.offw, j.K1, g, j.ovs_h * j.P, buf, j.off, j.K, wt, j.Op,
                           j.O, 0, nrows, j.OW, j.ovs_h * j.p.Wq, bias, s, out,
                           so_c, so_h, so_w)
    else:
        cypool_wg_input_f64(buf, j.p.C, j.p.Aq, j.p.Wq, j.P, u)
        cypool_wg_rows_f64(u, ks, j.offw, j.K1, g, j.ovs_h * j.P, buf, j.off, j.K, wt, j.Op,
                           j.O, 0, nrows, j.OW, j.ovs_h * j.p.Wq, bias, s, out,
                           so_c, so_h, so_w)


cdef extern from "_omp_shim.h" nogil:
    void cypool_conv_set_path(int p)
    int cypool_conv_get_path()


cdef inline void _ov_rows(const floating* img, const ConvJob* j, const floating* w,
                          Py_ssize_t oy0, Py_ssize_t oy1, const floating* bias,
                          floating* s, floating* out, Py_ssize_t so_c, Py_ssize_t so_h,
                          Py_ssize_t so_w, const char* pf, Py_ssize_t pf_bytes,
                          Py_ssize_t pf_stride, Py_ssize_t pf_n) noexcept nogil:
    if floating is float:
        cypool_ov_rows_f32(img, j.off, j.K, w, j.Op, j.O, oy0, oy1, j.OW,
                           j.ovs_h * j.p.Wq, j.ovs_w, bias, s, out, so_c, so_h, so_w,
                           pf, pf_bytes, pf_stride, pf_n)
    else:
        cypool_ov_rows_f64(img, j.off, j.K, w, j.Op, j.O, oy0, oy1, j.OW,
                           j.ovs_h * j.p.Wq, j.ovs_w, bias, s, out, so_c, so_h, so_w,
                           pf, pf_bytes, pf_stride, pf_n)


cdef inline void _copy_out(const floating* tmp, const ConvJob* j, floating[:, :, :, :] out,
                           Py_ssize_t n, Py_ssize_t lo, Py_ssize_t cnt, Py_ssize_t step,
                           const floating* bias, Py_ssize_t so) noexcept nogil:
    """Copy a chunk's outputs, positions lo to lo + cnt of rows step apart
    (Wq for the virtual output, OW for the grid's real positions; each
    output channel's ce apart in tmp), into out[n], plus the bias: the
    columns ow < OW of each row."""
    cdef Py_ssize_t o, e, e_end, oh, ow, k
    cdef floating b
    cdef const floating* src
    cdef floating* dst
    for o in range(j.O):
        b = bias[o] if bias != NULL else 0
        e = lo
        while e < lo + cnt:
            oh = e // step
            ow = e - oh * step
            e_end = min(lo + cnt, oh * step + step)
            if ow < j.OW:
                src = tmp + o * j.ce + (e - lo)
                dst = &out[n, o, oh, ow]
                if so == 1:
                    for k in range(min(e_end, oh * step + j.OW) - e):
                        dst[k] = src[k] + b
                else:
                    for k in range(min(e_end, oh * step + j.OW) - e):
                        dst[k * so] = src[k] + b
            e = e_end


cdef int _forward_items(const floating[:, :, :, :] x, const floating* wt, const floating* g,
                        const floating* bias, floating[:, :, :, :] out, const ConvJob* j,
                        Py_ssize_t Q, Py_ssize_t B, Team* team) noexcept nogil:
    """Work items of a forward call, with buffers of this thread's own: all
    Q of them (team NULL), or those this thread claims B at a time from
    the call's team (_claim); 1 when out of memory. Item q is
    chunk q % G of image q // G."""
    cdef Py_ssize_t q, qend = -1, n, cur = -1, e_lo, ne, t, o, Wq = j.p.Wq
    cdef Py_ssize_t so = out.strides[3] // <Py_ssize_t>sizeof(floating)  # output column step
    cdef Py_ssize_t soc = out.strides[1] // <Py_ssize_t>sizeof(floating)
    cdef Py_ssize_t soh = out.strides[2] // <Py_ssize_t>sizeof(floating)
    cdef Py_ssize_t oy, oyb, h_lo, h_hi, pf_bytes = 0
    cdef const char* pf
    # The forward's source rows are contiguous, those of a channel a piece.
    cdef bint pf_ok = (j.ovec and j.p.uh == 1 and x.strides[3] == sizeof(floating)
                       and x.strides[2] == x.shape[3] * x.strides[3])
    # The narrowest vector tile (_conv_tiles.h): half a vector where
    # there is one, else a third of the E block (one vector).
    cdef Py_ssize_t eb = CYPOOL_VC_EB_F32 if floating is float else CYPOOL_VC_EB_F64
    cdef Py_ssize_t vt = eb // 6 if CYPOOL_VC_HALF_TAIL else eb // 3
    cdef floating* buf = <floating*>malloc((j.p.size + _SLACK) * sizeof(floating))
    cdef floating* tmp = <floating*>malloc(
        (CYPOOL_WG_SCRATCH(j.Op, j.OW) if j.wino else
         j.Op * (CYPOOL_OV_LDS(j.OW) if j.ovec else j.ce)) * sizeof(floating))
    # With wino, the transformed band (cypool_wg_input).
    cdef floating* u = <floating*>malloc((4 * j.p.C * j.p.Aq * j.P if j.wino else 1)
                                         * sizeof(floating))
    cdef const floating** xs = <const floating**>malloc(j.K * sizeof(void*))
    cdef floating** outs = <floating**>malloc(j.Op * sizeof(void*))
    cdef const floating** pp = _pack_new(j.K, <floating*>NULL)
    cdef floating* pack = _pack_rows(pp, j.K)
    cdef const floating* img = buf
    cdef int failed = (buf == NULL or tmp == NULL or xs == NULL or outs == NULL or pp == NULL
                       or u == NULL)
    cdef bint nopack = not j.copy_taps
    if not failed:
        for o in range(j.Op):
            outs[o] = tmp + o * j.ce
        q = _claim(team, Q, B, &qend) if team != NULL else 0
        while q < Q:
            n = q // j.G
            if n != cur:
                if j.in_place:
                    img = &x[n, 0, 0, 0]
                elif not j.ovec:
                    _fill_phases(x, n, &j.p, buf, 0)
                cur = n
            e_lo = (q % j.G) * j.ce
            ne = min(j.ce, j.L - e_lo)
            if j.ovec:
                # Rows e_lo .. e_lo + ne - 1 of the output, in bands of
                # ovb rows whose padded rows fill buf (unless read in place).
                oy = e_lo
                while oy < e_lo + ne:
                    oyb = min(e_lo + ne, oy + j.ovb)
                    if j.in_place:
                        _ov_rows(img, j, wt, oy, oyb, bias, tmp, &out[n, 0, 0, 0], soc, soh,
                                 so, NULL, 0, 0, 0)
                    elif j.wino:
                        _fill_phases(x, n, &j.p, buf, oy * j.ovs_h)
                        _wg_band(buf, u, j, wt, g, oyb - oy, bias, tmp, &out[n, 0, oy, 0],
                                 soc, soh, so)
                    else:
                        _fill_phases(x, n, &j.p, buf, oy * j.ovs_h)
                        # The next band's source rows (the next image's first
                        # band after this image's last), into L2 meanwhile.
                        pf = NULL
                        if pf_ok and (oyb < j.OH or n + 1 < x.shape[0]):
                            h_lo = max(0, (oyb if oyb < j.OH else 0) * j.ovs_h - j.p.plh)
                            h_hi = min(j.p.H, h_lo + j.p.Aq)
                            if h_lo < h_hi:
                                pf = <const char*>&x[n if oyb < j.OH else n + 1, 0, h_lo,
                                                     0]
                                pf_bytes = (h_hi - h_lo) * x.strides[2]
                        _ov_rows(buf, j, wt, 0, oyb - oy, bias, tmp, &out[n, 0, oy, 0], soc,
                                 soh, so, pf, pf_bytes, x.strides[1], j.p.C)
                    oy = oyb
            elif j.grid:
                for t in range(j.K):
                    xs[t] = img + j.off[t]
                _vc_grid(j.K, xs, wt, j.Op, e_lo, ne, j.OW, Wq, j.O, outs, pack, pp)
                _copy_out(tmp, j, out, n, e_lo, ne, j.OW, bias, so)
            else:
                for t in range(j.K):
                    xs[t] = img + j.off[t] + e_lo
                # Whole vectors: the end of the last one may read the
                # buffer's slack (or, read in place, the next image), and its
                # outputs past ne are not copied out. The last image read in
                # place has nothing after it: its tiles stop at ne.
                _vc_pixel(j.K, xs, wt, j.Op, 0,
                          ne if j.in_place and n >= j.in_place_spill
                          else min(j.ce, (ne + vt - 1) // vt * vt),
                          j.O, outs, <const floating*>NULL,
                          NULL if nopack else pack, NULL if nopack else pp)
                _copy_out(tmp, j, out, n, e_lo, ne, Wq, bias, so)
            q = _claim(team, Q, B, &qend) if team != NULL and q + 1 >= qend else q + 1
    free(buf)
    free(tmp)
    free(u)
    free(xs)
    free(outs)
    free(pp)
    return failed


def conv2d_forward(const floating[:, :, :, :] x,     # IN  (N, C, H, W), any strides
                   const floating[:, :, :, :] w,     # IN  (O, C, kh, kw), any strides; transposed: (C, O, kh, kw)
                   bint transposed,
                   const floating[::1] bias,         # IN  (O,), or empty for none
                   floating[:, :, :, :] out,         # OUT (N, O, OH, OW), any strides
                   Py_ssize_t uh, Py_ssize_t uw, Py_ssize_t plh, Py_ssize_t plw,
                   Py_ssize_t Hp, Py_ssize_t Wp, Py_ssize_t sh, Py_ssize_t sw,
                   Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ce, int algo,
                   Py_ssize_t ov_band, int num_threads):
    """out = the convolution of x, seen as zero-padded to (Hp, Wp) with its
    element (h, w) at (plh + h*uh, plw + w*uw), with stride (sh, sw) and
    dilation (dh, dw). uh = uw = 1 for a forward pass. The input gradient
    runs this on the output gradient with transposed=True: w is then the
    forward's weight, and the convolution uses it flipped, its first two
    axes swapped. ce: chunk of the output positions (of the virtual output,
    which is longer than the real positions the grid way computes). algo:
    a cypool._select.ConvAlgo but DIRECT, feasible for the call. ov_band:
    with LANES, the bytes of padded rows filled a band at a time. One
    thread runs without an OpenMP region."""
    cdef ConvJob j
    cdef Py_ssize_t kh = w.shape[2], kw = w.shape[3], K = x.shape[1] * kh * kw, Q, B
    cdef Py_ssize_t O = out.shape[1], Op = (O + CYPOOL_VC_OB - 1) // CYPOOL_VC_OB * CYPOOL_VC_OB
    cdef const floating* bptr = &bias[0] if bias.shape[0] > 0 else NULL
    cdef floating* wt
    cdef floating* wb
    cdef floating* wg = NULL
    cdef Py_ssize_t c, i
    cdef Team team
    cdef int[1] failed
    cdef int* fail = &failed[0]
    cdef Py_ssize_t N = x.shape[0], OH = out.shape[2], L = CYPOOL_VC_VBYTES // sizeof(floating), g
    cdef bint wino = algo == _WINOGRAD
    cdef bint ovec = wino or algo == _LANES
    # An unpadded stride-1 convolution of C-contiguous images (or any with
    # output channels in the lanes, but by F(2, 3)): the phase buffer would
    # be a copy of each image, so the taps read x in place.
    cdef bint in_place = (uh == 1 and uw == 1 and (ovec or (sh == 1 and sw == 1)) and not wino
                          and plh == 0 and plw == 0 and Hp == x.shape[2] and Wp == x.shape[3]
                          and x.strides[3] == sizeof(floating)
                          and x.strides[2] == x.shape[3] * sizeof(floating)
                          and x.strides[1] == x.shape[2] * x.shape[3] * sizeof(floating))
    if ovec:
        # Output channels in the lanes: the image padded, not split into
        # phases; work items are (image, chunk of output rows), whole
        # images where there are four a thread or more. Unless read in
        # place, the padded rows are filled a band at a time (ov_band).
        Op = (O + L - 1) // L * L
        _phase_geom(&j.p, x.shape[1], x.shape[2], x.shape[3], uh, uw, plh, plw, Hp, Wp, 1, 1)
        j.ovb = OH
        if not in_place:
            g = (kh - 1) * dh + 1  # padded rows an output row reads
            j.ovb = ov_band // (x.shape[1] * j.p.Wq * <Py_ssize_t>sizeof(floating))  # rows
            j.ovb = max(1, min(OH, (j.ovb - g) // sh + 1))
            j.p.Aq = (j.ovb - 1) * sh + g
            j.p.plane = j.p.Aq * j.p.Wq
            j.p.size = x.shape[1] * j.p.plane
        failed[0] = _job(&j, K, O, Op, OH, out.shape[3], OH, kh, kw, dh, dw, False)
        j.ovec = True
        j.ovs_h = sh
        j.ovs_w = sw
        if N < 4 * num_threads:
            g = min(OH, (4 * num_threads + N - 1) // N)  # chunks an image
            j.ce = (OH + g - 1) // g
        j.L = OH
        j.G = (OH + j.ce - 1) // j.ce
        if wino and not failed[0]:
            j.K1 = x.shape[1] * kh
            j.P = (out.shape[3] + 1) // 2
            j.offw = <Py_ssize_t*>malloc(j.K1 * sizeof(Py_ssize_t))
            if j.offw == NULL:
                failed[0] = 1
            else:
                for c in range(x.shape[1]):
                    for i in range(kh):
                        (<Py_ssize_t*>j.offw)[c * kh + i] = (c * j.p.Aq + i * dh) * j.P
                j.wino = True
    else:
        _phase_geom(&j.p, x.shape[1], x.shape[2], x.shape[3], uh, uw, plh, plw, Hp, Wp, sh, sw)
        failed[0] = _job(&j, K, O, Op, OH, out.shape[3], ce, kh, kw, dh, dw, algo == _GRID)
        j.copy_taps = algo == _VIRTUAL_COPIED
    j.in_place = in_place
    # Rounding a chunk up to whole vectors reads at most a vector past an
    # image's end: inside x when the images are back to back, but the last.
    j.in_place_spill = (x.shape[0] - 1 if x.strides[0] == x.shape[1] * x.strides[1] else 0)
    wt = _tap_major(<const char*>&w[0, 0, 0, 0], &w.shape[0], &w.strides[0], transposed, Op,
                    <floating*>NULL)
    if j.wino and wt != NULL:
        # The transformed weights; where one is not finite, the direct way.
        wg = <floating*>malloc(4 * j.K1 * Op * sizeof(floating))
        if wg == NULL:
            failed[0] = 1
        elif ((cypool_wg_weights_f32(wt, j.K1, Op, wg) if floating is float
               else cypool_wg_weights_f64(wt, j.K1, Op, wg))):
            free(wg)
            wg = NULL
            j.wino = False
    if j.ovec and wt != NULL:
        wb = <floating*>malloc(K * Op * sizeof(floating))
        if wb != NULL:
            if floating is float:
                cypool_ov_block_f32(wt, K, Op, wb)
            else:
                cypool_ov_block_f64(wt, K, Op, wb)
        free(wt)
        wt = wb
    Q = x.shape[0] * j.G
    cypool_conv_set_path(_WINOGRAD if j.wino else _LANES if j.ovec else algo)
    # Claims of whole images where there are four or more a thread (about
    # eight claims a thread), so that a thread fills an image's phase
    # buffer once (docs/performance.md); fewer images a chunk at a time,
    # so that every thread gets work.
    B = (j.G * max(1, x.shape[0] // (8 * num_threads)) if x.shape[0] >= 4 * num_threads
         else 1)
    if not failed[0] and wt != NULL:
        if num_threads == 1:
            _set_serial_team()
            with nogil:
                failed[0] = _forward_items(x, wt, wg, bptr, out, &j, Q, Q, NULL)
        else:
            _team_begin(&team)
            with nogil, parallel(num_threads=num_threads):
                _note_team()
                if _forward_items(x, wt, wg, bptr, out, &j, Q, B, &team):
                    fail[0] = 1
            _team_end(&team)
    _job_free(&j)
    free(wt)
    free(wg)
    if failed[0] or wt == NULL:
        raise MemoryError("cypool.conv2d: out of memory")
