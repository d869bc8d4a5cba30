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
# im2col buffer is made. The tiles read each tap's block where it lies,
# but for a 1x1 convolution, whose taps they copy into a packed block
# first (_pack_mode). Where the dropped columns are a large enough share
# and there are 64 output channels or more, the tiles skip them: each
# block of real positions is gathered from its rows into a packed block
# (cypool_vc_grid), and work items are chunks of the OH * OW real
# positions. An unpadded stride-1 convolution of C-contiguous images reads
# them in place (the buffer would be a copy). With few output channels and
# short rows the forward puts output channels in the vector lanes instead
# (_conv_ovec.h): it computes the real positions only, from the image
# padded but not split into phases, one row of outputs at a time.
#
# The input gradient of a stride-1 convolution is this forward run on the
# output gradient padded by the kernel's reach, with the kernel flipped and
# transposed; a strided one's is computed by columns, added into place
# (_col2im_images). The weight gradient runs the same tiles on each chunk's
# im2col rows, or, for 8 output channels or fewer and an image without inf
# or NaN, takes dot products over e with the tap vectors.
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
    bint in_place             # the phase buffer would be the image itself: read x in place
    Py_ssize_t in_place_spill # read in place, images before this one have the next image after them
    const Py_ssize_t* off     # tap offsets in the phase buffer


# Whether conv2d's forward computes the real positions only (cypool_vc_grid):
# 1 where that pays (_job), the default; 0 never; 2 wherever it can.
cdef int _grid_mode = 1


def set_grid(int mode):
    """Diagnostic for the tests and A/B runs: the forward skips the virtual
    output's dropped columns where that pays (1, the default), never (0) or
    wherever there are more output channels than a tile holds and columns to
    skip (2). Not thread-safe; not for use."""
    global _grid_mode
    _grid_mode = mode


# Whether the forward tiles read each tap from the phase buffer (or the image
# read in place) rather than from a block copied per thread: 1 where taps
# overlap (kh * kw > 1), the default; 0 never; 2 always. The copy (_vconv.pxi,
# cypool_vc_eblock) keeps tap vectors that lie E apart from aliasing in L1,
# which a vector image's do. A standard convolution's kh * kw taps of a
# channel read the same few rows shifted, so the block they read in place is
# kh * kw times smaller than its copy, and the copy cost more than the
# unaligned loads it saves: LeNet's [64, 6, 14, 14] by 5x5 ran 17-19% faster
# without it on the AVX-512 host, the 7x7 stem 5-10%, while a 1x1
# convolution (its taps do not overlap) ran 6% slower (docs/performance.md).
cdef int _pack_mode = 1


def set_pack_mode(int mode):
    """Diagnostic for the tests and A/B runs: the forward tiles read the
    taps where they lie when they overlap (1, the default), never (0: they
    always copy each block of them first) or always (2). Not thread-safe;
    not for use."""
    global _pack_mode
    _pack_mode = mode


# Whether the forward puts output channels in the vector lanes (_conv_ovec.h):
# 1 where that pays (_takes_ovec), the default; 0 never; 2 wherever it can
# (column stride 1 or 2).
cdef int _ovec_mode = 1


def set_ovec(int mode):
    """Diagnostic for the tests and A/B runs: the forward puts output
    channels in the vector lanes where that pays (1, the default), never (0)
    or wherever the column stride is 1 or 2 (2). Not thread-safe; not for
    use."""
    global _ovec_mode
    _ovec_mode = mode


# Bytes of padded rows that the forward with output channels in the lanes
# fills at a time: a band of them, with the weights, stays in L2 (1 MiB a
# core on the AVX-512 host) while its rows of outputs run, and the next
# band's source rows are prefetched meanwhile. Filling whole images
# instead (861 KiB for the [32, 64, 56, 56] input) ran 5% slower there on
# one thread (docs/performance.md).
cdef Py_ssize_t _ov_band = 128 * 1024


def set_ov_band(Py_ssize_t nbytes):
    """Diagnostic for the tests: the bytes of padded rows a band of the
    forward with output channels in the lanes fills at a time (at least
    one row of outputs' worth). Not thread-safe; not for use."""
    global _ov_band
    _ov_band = nbytes


# Whether the tiles of _conv_ovec.h are register tiles (gcc and clang),
# else plain loops that the rule never takes.
OVEC_TILES = bool(CYPOOL_OV_FAST)


def last_forward_path():
    """Diagnostic for the tests: how the calling thread's last forward or
    stride-1 input gradient pass through the phase buffers ran ("virtual",
    "grid", "ovec" or "winograd"); each Python thread has its own."""
    return ("virtual", "grid", "ovec", "winograd")[cypool_conv_get_path()]


cdef inline bint _takes_ovec(Py_ssize_t O, Py_ssize_t OW, Py_ssize_t Wq, Py_ssize_t sw,
                             Py_ssize_t K, Py_ssize_t L) noexcept nogil:
    """Whether a forward with O output channels, rows of OW outputs (Wq in
    its phase planes), column stride sw and K taps puts output channels in
    the vector lanes (L of them)."""
    if sw > 2 or _ovec_mode == 0:
        return False
    if _ovec_mode == 2:
        return True
    # Measured both ways on the AVX-512 host (docs/performance.md, "Output
    # channels in the lanes"). With 32 registers, where the channels fill
    # whole vectors, it won wherever the virtual output drops a tenth of
    # its columns or more (0.56-0.93x the time), on rows of 16 outputs or
    # fewer (0.83-1.00x), and, since its tiles write the sums through a
    # scratch row and their weights lie in blocks, on every 3x3 convolution
    # of 32 input channels or more, 256 taps or more, whatever its rows
    # (0.92-1.00x); it lost on the 7x7 stem's 147 taps of 3 channels
    # (1.03-1.10x), where a tile's stores weigh more, and with half-empty
    # vectors (8 channels of 16: 1.7-2.1x). With 16 registers (the AVX2 and
    # SSE2 builds) its tiles are narrower; it won where a quarter or more is
    # dropped and the channels fill pairs of vectors (0.60-0.84x), and at
    # 256 taps or more (0.65-0.98x with AVX2, the 1x1 convolution's 256 a
    # tie; 0.85-0.88x with SSE2).
    if CYPOOL_VC_VBYTES == 64:
        return CYPOOL_OV_FAST and O % L == 0 and ((Wq - OW) * 10 >= Wq or OW <= 16 or K >= 256)
    return CYPOOL_OV_FAST and O % (2 * L) == 0 and ((Wq - OW) * 4 >= Wq or K >= 256)


# Whether the forward with output channels in the lanes runs rows three
# taps wide by F(2, 3) (_conv_winograd.h): 1 where that pays (_takes_wino),
# the default; 0 never; 2 wherever it can.
cdef int _wino_mode = 1


def set_wino(int mode):
    """Diagnostic for the tests and A/B runs: the forward with output
    channels in the lanes runs rows three taps wide by F(2, 3) where that
    pays (1, the default), never (0) or wherever it can (2). Not
    thread-safe; not for use."""
    global _wino_mode
    _wino_mode = mode


cdef inline bint _takes_wino(Py_ssize_t K1, Py_ssize_t OW) noexcept nogil:
    """Whether a forward in the lanes with K1 taps (c, i) of three and
    rows of OW outputs runs by F(2, 3)."""
    if _wino_mode != 1:
        return _wino_mode == 2
    # Measured both ways on the AVX-512 host (docs/performance.md, "F(2, 3)
    # along the rows"): with the AVX-512 module, 0.77-0.94x the time of the
    # lanes' direct sums on 3x3 layers of 32-256 input channels and rows of
    # 14-112 outputs, but 1.08x on 7-wide rows, whose four pairs make
    # narrow tiles; with SSE2, 0.72-0.77x. The AVX2 module's narrower tiles
    # (6 x 2) gained less: 0.85x on 56-wide rows of 192 pairs (c, i),
    # 0.96-0.98x on 14-28-wide rows, and lost on the 32-wide rows of 96
    # pairs (1.06x).
    if CYPOOL_VC_VBYTES == 32:
        return CYPOOL_OV_FAST and K1 >= 128 and OW >= 28
    return CYPOOL_OV_FAST and K1 >= 16 and OW >= 13


cdef inline int _job(ConvJob* j, Py_ssize_t K, Py_ssize_t O, Py_ssize_t Op,
                     Py_ssize_t OH, Py_ssize_t OW, Py_ssize_t ce, Py_ssize_t kh, Py_ssize_t kw,
                     Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t grid_unit) noexcept nogil:
    """Fill the rest of j (j.p set); 1 when out of memory. grid_unit: for a
    forward pass, which may compute the real positions only (see below),
    the values in the grid gather's copy unit (32 bytes); else 0."""
    cdef Py_ssize_t* off = <Py_ssize_t*>malloc(K * sizeof(Py_ssize_t))
    j.K = K; j.O = O; j.Op = Op; j.OH = OH; j.OW = OW; j.ce = ce
    # Skipping the Wq - OW dropped columns of every Wq saves that share of
    # the multiply-adds, about 3 O cycles a tap and block of positions, for
    # a gather of about 20 cycles more than the packing copy it replaced
    # (fitted on the AVX2 host, docs/performance.md): it pays where
    # (Wq - OW) * O >= 8 * Wq, and only with 64 output channels or more.
    # Since overlapping taps are read in place (_pack_mode), the gather is
    # no longer set against a copy, and with 32 output channels it lost
    # everywhere measured (4-21% on [64, 16, 12, 12] by 5x5), with 64 or
    # more it won or tied. The rows must be whole copy units, or three
    # units or more: a row cut short of a unit is copied a value at a
    # time, which lost on rows of 5 and 10 values.
    j.grid = grid_unit > 0 and O > CYPOOL_VC_OB and j.p.Wq > OW and (
        _grid_mode == 2 or (_grid_mode == 1 and O >= 64
                            and (OW % grid_unit == 0 or OW >= 3 * grid_unit)
                            and (j.p.Wq - OW) * O >= 8 * j.p.Wq))
    j.ovec = False
    j.wino = False
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
    cdef bint nopack = _pack_mode == 2 or (_pack_mode == 1 and j.K > j.p.C)
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
                   Py_ssize_t dh, Py_ssize_t dw, Py_ssize_t ce, int num_threads):
    """out = the convolution of x, seen as zero-padded to (Hp, Wp) with its
    element (h, w) at (plh + h*uh, plw + w*uw), with stride (sh, sw) and
    dilation (dh, dw). uh = uw = 1 for a forward pass. The input gradient
    runs this on the output gradient with transposed=True: w is then the
    forward's weight, and the convolution uses it flipped, its first two
    axes swapped. ce: chunk of the output positions (of the virtual output,
    which is longer than the real positions the grid way computes). One
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
    cdef bint ovec = _takes_ovec(O, out.shape[3], (Wp + sw - 1) // sw, sw, K, L)
    # With output channels in the lanes, rows three taps wide at column
    # stride and dilation 1 may run by F(2, 3) (_conv_winograd.h).
    cdef bint wino = (ovec and kw == 3 and dw == 1 and sw == 1 and out.shape[3] >= 2
                      and _takes_wino(x.shape[1] * kh, out.shape[3]))
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
        # place, the padded rows are filled a band at a time (_ov_band).
        Op = (O + L - 1) // L * L
        _phase_geom(&j.p, x.shape[1], x.shape[2], x.shape[3], uh, uw, plh, plw, Hp, Wp, 1, 1)
        j.ovb = OH
        if not in_place:
            g = (kh - 1) * dh + 1  # padded rows an output row reads
            j.ovb = _ov_band // (x.shape[1] * j.p.Wq * <Py_ssize_t>sizeof(floating))  # rows
            j.ovb = max(1, min(OH, (j.ovb - g) // sh + 1))
            j.p.Aq = (j.ovb - 1) * sh + g
            j.p.plane = j.p.Aq * j.p.Wq
            j.p.size = x.shape[1] * j.p.plane
        failed[0] = _job(&j, K, O, Op, OH, out.shape[3], OH, kh, kw, dh, dw, 0)
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
        failed[0] = _job(&j, K, O, Op, OH, out.shape[3], ce, kh, kw, dh, dw,
                         32 // sizeof(floating))
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
    cypool_conv_set_path(3 if j.wino else 2 if j.ovec else 1 if j.grid else 0)
    # Claims of whole images where there are four or more a thread (about
    # eight claims a thread): a thread then fills an image's phase buffer
    # once for all its chunks. Claimed one chunk at a time, the threads
    # took turns on each image's chunks and both filled every image: 3-6%
    # slower than a static split on three of bench_conv.py's shapes
    # (docs/performance.md). Fewer images are claimed a chunk at a time,
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
