# Uses: _common.pxi; _vconv.pxi (_pack_new, _pack_rows, _any_nonzero); _conv_tiles.h.
# Zonotope kernels for DeepZ certification (cypool/zonotope.py): the bounds
# of every neuron, and the DeepZ ReLU, over the rows of a C-contiguous
# (n, E) array whose row i is neuron i's (centre, generator 1, ...,
# generator E-1); and the dense layer (below).
# Uses from _common.pxi: floating, int64_t, memcpy, memset, malloc, free,
# _share_start, _note_team, _set_serial_team, Team, _team_begin, _team_end,
# _claim_block, _claim.
#
# Both are bound by memory: one read of z (and one write of the ReLU's
# output, first touched here, inside the parallel loop, so that a fresh
# output's pages fault in on every thread at once). Rows are split in
# contiguous shares, one per thread.

DEF ZLANES = 8


cdef inline floating _abs_sum(const floating* g, Py_ssize_t n) noexcept nogil:
    """sum |g[:n]| in ZLANES running sums (independent, so gcc vectorises
    them without reassociating a single sum)."""
    cdef floating acc[ZLANES]
    cdef floating v, s = 0
    cdef Py_ssize_t i, l, nv = n - n % ZLANES
    for l in range(ZLANES):
        acc[l] = 0
    for i in range(0, nv, ZLANES):
        for l in range(ZLANES):
            v = g[i + l]
            acc[l] += v if v >= 0 else -v
    for l in range(ZLANES):
        s += acc[l]
    for i in range(nv, n):
        v = g[i]
        s += v if v >= 0 else -v
    return s


cdef void _bounds_rows(const floating* z, Py_ssize_t E, floating* lower, floating* upper,
                       Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """lower, upper of rows [start, end): centre -/+ the generators' absolute sum."""
    cdef Py_ssize_t i
    cdef floating c, r
    for i in range(start, end):
        c = z[i * E]
        r = _abs_sum(z + i * E + 1, E - 1)
        lower[i] = c - r
        upper[i] = c + r


def zono_bounds(const floating[:, ::1] z,  # IN  (n, E): centre, then the generators
                floating[::1] lower,       # OUT (n,)
                floating[::1] upper,       # OUT (n,)
                int num_threads):
    """The interval of every neuron of a zonotope."""
    cdef Py_ssize_t n = z.shape[0], E = z.shape[1]
    cdef int tid
    if num_threads == 1:
        _set_serial_team()
        with nogil:
            _bounds_rows(&z[0, 0], E, &lower[0], &upper[0], 0, n)
    else:
        with nogil, parallel(num_threads=num_threads):
            _note_team()
            tid = threadid()
            _bounds_rows(&z[0, 0], E, &lower[0], &upper[0],
                         _share_start(n, tid), _share_start(n, tid + 1))


cdef void _relu_rows(const floating* z, Py_ssize_t E, const floating* lower,
                     const floating* upper, const int64_t* slot, floating* out, Py_ssize_t F,
                     Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """Rows [start, end) of the DeepZ ReLU into out (n, F), F = E + the
    number of unstable neurons; slot[i] is neuron i's new generator (for
    the unstable ones). F = E writes the old components alone (the caller
    keeps the new generators apart)."""
    cdef Py_ssize_t i, j
    cdef floating l, u, lam, mu
    cdef const floating* zi
    cdef floating* oi
    for i in range(start, end):
        zi = z + i * E
        oi = out + i * F
        l = lower[i]
        u = upper[i]
        if u <= 0:  # dead: 0
            memset(oi, 0, F * sizeof(floating))
        elif l >= 0:  # stable: unchanged
            memcpy(oi, zi, E * sizeof(floating))
            memset(oi + E, 0, (F - E) * sizeof(floating))
        else:  # unstable: lam * z + mu, and mu as a new generator
            lam = u / (u - l)
            mu = -lam * l / 2
            for j in range(E):
                oi[j] = lam * zi[j]
            oi[0] += mu
            if F > E:
                memset(oi + E, 0, (F - E) * sizeof(floating))
                oi[E + slot[i]] = mu


def zono_relu(const floating[:, ::1] z,      # IN  (n, E)
              const floating[::1] lower,     # IN  (n,) zono_bounds of z, all finite
              const floating[::1] upper,     # IN  (n,)
              const int64_t[::1] slot,       # IN  (n,) for unstable neurons, 0 <= slot < F - E
              floating[:, ::1] out,          # OUT (n, F): F = E + all the new generators, or E
              int num_threads):
    """The DeepZ ReLU of every neuron (zonotope.relu checked the arguments)."""
    cdef Py_ssize_t n = z.shape[0], E = z.shape[1], F = out.shape[1]
    cdef int tid
    if num_threads == 1:
        _set_serial_team()
        with nogil:
            _relu_rows(&z[0, 0], E, &lower[0], &upper[0], &slot[0], &out[0, 0], F, 0, n)
    else:
        with nogil, parallel(num_threads=num_threads):
            _note_team()
            tid = threadid()
            _relu_rows(&z[0, 0], E, &lower[0], &upper[0], &slot[0], &out[0, 0], F,
                       _share_start(n, tid), _share_start(n, tid + 1))


# The dense layer, out (O, E) = w (O, D) z (D, E). In a zonotope after a
# ReLU and a convolution most rows of a block of E are zero: the dead
# neurons' rows, and the rows a block of generators does not reach (each
# generator lives in a window of the image; in ConvMed's 1568 x E product,
# 83% of the blocks of 12 are zero). Each block of E lists the rows that
# are not all zero, once per product (the first call of a product's blocks
# of output channels), and multiplies those alone: the sum of the others
# is 0, so the result is the same, in the same order of addition.

cdef extern from "_conv_tiles.h" nogil:
    void cypool_vc_rows_f32(Py_ssize_t n, const float* const* xs, Py_ssize_t xoff,
                            const Py_ssize_t* rowi, const float* w, Py_ssize_t ldw,
                            Py_ssize_t e0, Py_ssize_t O, float* const* outs, const float* bias)
    void cypool_vc_rows_f64(Py_ssize_t n, const double* const* xs, Py_ssize_t xoff,
                            const Py_ssize_t* rowi, const double* w, Py_ssize_t ldw,
                            Py_ssize_t e0, Py_ssize_t O, double* const* outs, const double* bias)


cdef struct DenseArgs:
    const void* z       # (D, E), rows ldz apart
    const void* bias    # (O,) or NULL
    void* out           # (O, E), rows ldo apart
    Py_ssize_t D, E, O, ldz, ldw, ldo   # ldw: the weights' (O, D) row stride
    Py_ssize_t* rows    # (number of blocks, D): block b's rows that are not all zero
    Py_ssize_t* counts  # how many, or -1 before they are listed; NULL: every row


cdef Py_ssize_t _list_rows(const floating* z, Py_ssize_t ldz, Py_ssize_t D, Py_ssize_t e0,
                           Py_ssize_t eb, Py_ssize_t* rows) noexcept nogil:
    """The rows d < D of z whose block [e0, e0 + eb) is not all zero, into
    rows; returns how many."""
    cdef Py_ssize_t d, n = 0
    for d in range(D):
        if _any_nonzero(z + d * ldz + e0, eb):
            rows[n] = d
            n = n + 1
    return n


cdef inline void _rows_tiles(Py_ssize_t n, const floating** pp, const Py_ssize_t* rowi,
                             const floating* w, Py_ssize_t ldw, Py_ssize_t e0, Py_ssize_t O,
                             floating** outs, const floating* bias) noexcept nogil:
    if floating is float:
        cypool_vc_rows_f32(n, pp, 0, rowi, w, ldw, e0, O, outs, bias)
    else:
        cypool_vc_rows_f64(n, pp, 0, rowi, w, ldw, e0, O, outs, bias)


cdef struct DenseBuffers:
    # One thread's: the packed rows of a block, their pointers, and the
    # outputs' rows; the last 1 to 3 outputs' weights and bias as a full
    # tile of OB (zero rows beyond O), written through tail.
    void* pack
    void* pp
    void* outs          # O4 + OB row pointers
    void* tail          # (O4 + OB, eb): a short block's outputs, and the last tile's
    void* wrem          # (OB, D)
    void* brem          # (OB,)
    Py_ssize_t* every   # 0 .. D - 1


cdef void _dense_block(const DenseArgs* a, const floating* w, const DenseBuffers* buf,
                       Py_ssize_t e0, Py_ssize_t ne, Py_ssize_t n,
                       const Py_ssize_t* rowi) noexcept nogil:
    """Components [e0, e0 + ne) of every output from the n rows listed. A
    block shorter than the tiles' (the end of E) is padded with zeros and
    written through tail, and so are the last 1 to 3 outputs."""
    cdef Py_ssize_t eb = CYPOOL_VC_EB_F32 if floating is float else CYPOOL_VC_EB_F64
    cdef Py_ssize_t O = a.O, O4 = a.O - a.O % CYPOOL_VC_OB, t, o
    cdef const floating* z = <const floating*>a.z
    cdef const floating* bias = <const floating*>a.bias if e0 == 0 else NULL
    cdef floating* out = <floating*>a.out
    cdef floating* pack = <floating*>buf.pack
    cdef floating** outs = <floating**>buf.outs
    cdef floating* tail = <floating*>buf.tail
    cdef bint full = ne == eb
    for t in range(n):
        memcpy(pack + t * eb, z + rowi[t] * a.ldz + e0, ne * sizeof(floating))
        if not full:
            memset(pack + t * eb + ne, 0, (eb - ne) * sizeof(floating))
    for o in range(O4):
        outs[o] = out + o * a.ldo if full else tail + o * eb
    _rows_tiles(n, <const floating**>buf.pp, rowi, w, a.ldw, e0 if full else 0, O4, outs, bias)
    if O4 < O:  # the last 1 to 3 outputs, as a full tile through tail
        for o in range(O4, O4 + CYPOOL_VC_OB):
            outs[o] = tail + o * eb
        _rows_tiles(n, <const floating**>buf.pp, rowi, <const floating*>buf.wrem, a.D, 0,
                    CYPOOL_VC_OB, outs + O4, <const floating*>buf.brem if bias != NULL else NULL)
    for o in range(0 if not full else O4, O):
        memcpy(out + o * a.ldo + e0, tail + o * eb, ne * sizeof(floating))


cdef int _dense_blocks(const DenseArgs* a, const floating* w, Team* team, Py_ssize_t nb,
                       Py_ssize_t B) noexcept nogil:
    """The blocks of E this thread claims from team ([0, nb) when team is
    NULL), with buffers of its own; 1 when out of memory."""
    cdef Py_ssize_t eb = CYPOOL_VC_EB_F32 if floating is float else CYPOOL_VC_EB_F64
    cdef Py_ssize_t D = a.D, O4 = a.O - a.O % CYPOOL_VC_OB, b, d, i, e0, n, start, end = -1
    cdef const Py_ssize_t* rowi
    cdef const floating** pp = _pack_new(D, <floating*>NULL)
    cdef DenseBuffers buf
    buf.pp = pp
    buf.pack = _pack_rows(pp, D)
    buf.every = <Py_ssize_t*>malloc(D * sizeof(Py_ssize_t))
    buf.outs = malloc((O4 + CYPOOL_VC_OB) * sizeof(void*))
    buf.tail = malloc((O4 + CYPOOL_VC_OB) * eb * sizeof(floating))
    buf.wrem = calloc(CYPOOL_VC_OB * D, sizeof(floating))
    buf.brem = calloc(CYPOOL_VC_OB, sizeof(floating))
    cdef int failed = (pp == NULL or buf.every == NULL or buf.outs == NULL or buf.tail == NULL
                       or buf.wrem == NULL or buf.brem == NULL)
    if not failed:
        for d in range(D):
            buf.every[d] = d
        for i in range(a.O - O4):
            memcpy(<floating*>buf.wrem + i * D, w + (O4 + i) * a.ldw, D * sizeof(floating))
            if a.bias != NULL:
                (<floating*>buf.brem)[i] = (<const floating*>a.bias)[O4 + i]
        if team == NULL:
            start, end = 0, nb
        else:
            start = _claim(team, nb, B, &end)
        while start < nb:
            for b in range(start, end):
                e0 = b * eb
                if a.counts == NULL:
                    rowi, n = buf.every, D
                else:
                    if a.counts[b] < 0:
                        a.counts[b] = _list_rows(<const floating*>a.z, a.ldz, D, e0,
                                                 min(eb, a.E - e0), a.rows + b * D)
                    rowi, n = a.rows + b * D, a.counts[b]
                _dense_block(a, w, &buf, e0, min(eb, a.E - e0), n, rowi)
            if team == NULL:
                break
            start = _claim(team, nb, B, &end)
    free(pp)
    free(buf.every)
    free(buf.outs)
    free(buf.tail)
    free(buf.wrem)
    free(buf.brem)
    return failed


def dense_block(bint single):
    """Components of E in a block of zono_dense: float32 (single) or float64."""
    return CYPOOL_VC_EB_F32 if single else CYPOOL_VC_EB_F64


def zono_dense(const floating[:, :] z,       # IN  (D, E), E contiguous
               const floating[:, ::1] w,     # IN  (O, D)
               const floating[::1] bias,     # IN  (O,), or empty for none
               floating[:, :] out,           # OUT (O, E), E contiguous (a view may have E + k)
               Py_ssize_t[:, ::1] rows,      # IN/OUT (ceil(E / eb), D): the blocks' rows that are not all zero
               Py_ssize_t[::1] counts,       # IN/OUT (ceil(E / eb),): how many, -1 before listed; empty: use every row
               int num_threads):
    """out = w z, plus bias on component 0: threads claim blocks of eb
    components (dense_block). The caller (zonotope.linear, which checked
    the arguments) gives rows and counts (counts all -1) to the first call
    of a product and the same arrays to its other blocks of output
    channels; empty counts where a weight is not finite: inf or NaN times
    a zero must give NaN, as in torch."""
    cdef DenseArgs a
    cdef Py_ssize_t eb = CYPOOL_VC_EB_F32 if floating is float else CYPOOL_VC_EB_F64
    cdef Py_ssize_t nb = (z.shape[1] + eb - 1) // eb, B
    cdef Team team
    cdef int[1] failed
    cdef int* fail = &failed[0]
    if (z.shape[1] > 1 and z.strides[1] != sizeof(floating)) or \
            (out.shape[1] > 1 and out.strides[1] != sizeof(floating)):
        raise ValueError("zono_dense: z's and out's last axes must be contiguous")
    if w.shape[0] != out.shape[0] or w.shape[1] != z.shape[0] or out.shape[1] != z.shape[1] \
            or 0 < bias.shape[0] < out.shape[0] or z.shape[0] == 0 or z.shape[1] == 0 \
            or out.shape[0] == 0 or (counts.shape[0] > 0 and (
                counts.shape[0] < nb or rows.shape[0] < nb or rows.shape[1] != z.shape[0])):
        raise ValueError("zono_dense: shapes do not agree")
    a.z, a.out = &z[0, 0], &out[0, 0]
    a.bias = &bias[0] if bias.shape[0] > 0 else NULL
    a.D, a.E, a.O = z.shape[0], z.shape[1], out.shape[0]
    a.ldz = z.strides[0] // <Py_ssize_t>sizeof(floating)
    a.ldw = w.shape[1]
    a.ldo = out.strides[0] // <Py_ssize_t>sizeof(floating)
    a.rows = &rows[0, 0] if counts.shape[0] > 0 else NULL
    a.counts = &counts[0] if counts.shape[0] > 0 else NULL
    failed[0] = 0
    if num_threads == 1 or nb < 2:
        _set_serial_team()
        with nogil:
            failed[0] = _dense_blocks(&a, &w[0, 0], NULL, nb, nb)
    else:
        B = _claim_block(nb, num_threads)
        _team_begin(&team)
        with nogil, parallel(num_threads=num_threads):
            _note_team()
            if _dense_blocks(&a, &w[0, 0], &team, nb, B):
                fail[0] = 1
        _team_end(&team)
    if failed[0]:
        raise MemoryError("cypool.zonotope: out of memory")
