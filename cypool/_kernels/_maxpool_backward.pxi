# Uses: _common.pxi only.
# Max pooling backward (scatter-add of each gradient at its index) and
# unpooling with its backward (see _maxpool_rows.pxi for the family).

cdef inline Py_ssize_t _out_of_range(const index_t* ix, Py_ssize_t n,
                                     Py_ssize_t hw) noexcept nogil:
    """How many of ix[:n] lie outside [0, hw) (one unsigned compare each: a
    negative index wraps to a huge one); vectorised."""
    cdef Py_ssize_t q, bad = 0
    for q in range(n):
        bad += <size_t>ix[q] >= <size_t>hw
    return bad


cdef inline Py_ssize_t _scatter_add(value_t* gi, Py_ssize_t hw, const value_t* go,
                                    const index_t* ix, Py_ssize_t n,
                                    Py_ssize_t m) noexcept nogil:
    """For each of m consecutive planes (gi: hw values each; go, ix: n),
    gi[:hw] = 0, then gi[ix[q]] += go[q]. Returns how many ix were out of
    range, and then writes nothing more (the caller raises and discards gi).

    The bounds are checked in one vectorised pass first, so the scatter loop
    itself is unchecked: a load, an add and a store per entry. A run of
    small planes is zeroed and checked at once, with no call per plane."""
    cdef Py_ssize_t p, q, bad = _out_of_range(ix, n * m, hw)
    memset(gi, 0, m * hw * sizeof(value_t))
    if bad:
        return bad
    for p in range(m):
        # Unrolled by four, in order (entries may share an index): a quarter
        # of the loop overhead of the plain loop, which gcc does not unroll.
        for q in range(0, n - 3, 4):
            gi[ix[q]] += go[q]
            gi[ix[q + 1]] += go[q + 1]
            gi[ix[q + 2]] += go[q + 2]
            gi[ix[q + 3]] += go[q + 3]
        for q in range(n - n % 4, n):
            gi[ix[q]] += go[q]
        gi += hw
        go += n
        ix += n
    return 0


# Tiny planes (late layers' 7x7 and 8x8) go to the scatter in runs of up
# to _RUN_BYTES, zeroed and checked at once. Larger planes don't gain from
# it: measured with bench/ab_kernels.py --op backward, runs of 10x10 to
# 14x14 planes were slower than one plane at a time.
DEF _RUN_BYTES = 2048
DEF _RUN_MAX_PLANE_BYTES = 256


DEF _BLOCK_CHUNK = 256
# Shorter output rows are left to the scatter: at OW = 12 the two vector
# loops' set-up per row cost more than they save (about 15 ns a row here).
DEF _BLOCK_MIN_OW = 16


cdef inline Py_ssize_t _block_codes(const index_t* ix, int32_t* code, Py_ssize_t n,
                                    index_t base, index_t W) noexcept nogil:
    """code[ow] = offset of index ow inside its 2x2 block (0, 1, W or W + 1),
    or -1 when it lies outside; returns how many lie outside. A separate
    loop from the writes below: gcc 12 vectorises neither when one loop mixes
    the int64 indices with float values."""
    cdef Py_ssize_t ow, miss = 0
    cdef index_t d
    cdef bint ok
    for ow in range(n):
        d = ix[ow] - base - 2 * <index_t>ow
        ok = (d == 0) | (d == 1) | (d == W) | (d == W + 1)
        code[ow] = <int32_t>d if ok else -1
        miss += not ok
    return miss


cdef inline void _block_write(value_t* r0, value_t* r1, const value_t* go,
                              const int32_t* code, Py_ssize_t n, int32_t W) noexcept nogil:
    """Write n 2x2 blocks: each gets its gradient at its code, zeros elsewhere."""
    cdef Py_ssize_t ow
    cdef int32_t c
    cdef value_t g, zero = 0
    for ow in range(n):
        c = code[ow]
        g = go[ow] + zero        # as 0 + g in the scatter: -0.0 becomes +0.0
        r0[2 * ow] = g if c == 0 else zero
        r0[2 * ow + 1] = g if c == 1 else zero
        r1[2 * ow] = g if c == W else zero
        r1[2 * ow + 1] = g if c == W + 1 else zero


cdef inline Py_ssize_t _block_row2x2(value_t* r0, value_t* r1, const value_t* go,
                                     const index_t* ix, Py_ssize_t OW, index_t base,
                                     index_t W) noexcept nogil:
    """Write the 2x2 blocks of one output row. Returns how many indices lie
    outside their own block (then the caller redoes the plane)."""
    cdef int32_t code[_BLOCK_CHUNK]
    cdef Py_ssize_t o0, n, miss = 0
    for o0 in range(0, OW, _BLOCK_CHUNK):
        n = min(OW - o0, _BLOCK_CHUNK)
        miss += _block_codes(ix + o0, code, n, base + 2 * <index_t>o0, W)
        _block_write(r0 + 2 * o0, r1 + 2 * o0, go + o0, code, n, <int32_t>W)
    return miss


cdef Py_ssize_t _blocks2x2(value_t* gi, Py_ssize_t H, Py_ssize_t W, const value_t* go,
                           const index_t* ix, Py_ssize_t OH, Py_ssize_t OW) noexcept nogil:
    """Backward of one plane whose indices each lie in their own 2x2 block
    (rows 2oh, 2oh + 1, columns 2ow, 2ow + 1), as a 2x2/stride-2 pooling
    gives: the blocks are disjoint, so every input position gets at most one
    gradient and the plane is written in one pass, with no zeroing first and
    no scatter. Needs H >= 2 OH and W >= 2 OW; the rest of the plane is zero.
    Returns how many indices lie outside their block: the plane is then
    wrong and must be redone by _scatter_add."""
    cdef Py_ssize_t oh, miss = 0
    cdef value_t* r0
    for oh in range(OH):
        r0 = gi + 2 * oh * W
        miss += _block_row2x2(r0, r0 + W, go + oh * OW, ix + oh * OW, OW,
                              <index_t>(2 * oh * W), <index_t>W)
        if W > 2 * OW:
            memset(r0 + 2 * OW, 0, (W - 2 * OW) * sizeof(value_t))
            memset(r0 + W + 2 * OW, 0, (W - 2 * OW) * sizeof(value_t))
    memset(gi + 2 * OH * W, 0, (H - 2 * OH) * W * sizeof(value_t))
    return miss


cdef inline Py_ssize_t _backward_plane(value_t* gi, Py_ssize_t H, Py_ssize_t W,
                                       const value_t* go, const index_t* ix,
                                       Py_ssize_t OH, Py_ssize_t OW,
                                       bint blocks) noexcept nogil:
    """One plane of max_pool2d_backward; returns its out-of-range count."""
    if blocks and _blocks2x2(gi, H, W, go, ix, OH, OW) == 0:
        return 0
    return _scatter_add(gi, H * W, go, ix, OH * OW, 1)


cdef Py_ssize_t _backward_planes(value_t[:, ::1] grad_input, Py_ssize_t H, Py_ssize_t W,
                                 const value_t[:, ::1] grad_output, const index_t[:, ::1] indices,
                                 Py_ssize_t OH, Py_ssize_t OW, bint blocks,
                                 Py_ssize_t p0, Py_ssize_t p1) noexcept nogil:
    """Planes [p0, p1); returns their out-of-range count."""
    cdef Py_ssize_t p, m, bad = 0
    cdef Py_ssize_t plane_bytes = H * W * sizeof(value_t)
    cdef Py_ssize_t run = 0
    if not blocks and plane_bytes <= _RUN_MAX_PLANE_BYTES:
        run = _RUN_BYTES // plane_bytes
    if run > 1:
        p = p0
        while p < p1:
            m = min(run, p1 - p)
            bad += _scatter_add(&grad_input[p, 0], H * W, &grad_output[p, 0], &indices[p, 0],
                                OH * OW, m)
            p = p + m
        return bad
    for p in range(p0, p1):
        bad += _backward_plane(&grad_input[p, 0], H, W, &grad_output[p, 0],
                               &indices[p, 0], OH, OW, blocks)
    return bad


def max_pool2d_backward(const value_t[:, ::1] grad_output,  # IN  (P, OH*OW)
                        const index_t[:, ::1] indices,      # IN  (P, OH*OW)
                        value_t[:, ::1] grad_input,         # OUT (P, H*W), fully written
                        Py_ssize_t OW, Py_ssize_t W, int num_threads):
    """Scatter-add grad_output into zeroed planes at indices.

    Returns the number of indices outside [0, H*W); the planes holding them
    are left zero, and the caller raises. Each plane is zeroed just before
    its scatter, so it is still in L1 when the scatter writes it.

    When the first plane's indices each lie in their own 2x2 block (any
    2x2/stride-2 pooling), every plane is first tried by _blocks2x2, which
    writes it in one vectorised pass; a plane where that fails is redone by
    the scatter, so the result never depends on the guess.
    """
    cdef Py_ssize_t P = grad_output.shape[0], n = grad_output.shape[1]
    cdef Py_ssize_t hw = grad_input.shape[1], t
    cdef Py_ssize_t OH = n // OW if OW > 0 else 0
    cdef Py_ssize_t H = hw // W if W > 0 else 0
    cdef Py_ssize_t bad = 0, start, end, B
    cdef Py_ssize_t* counts
    cdef Team team
    cdef bint blocks = OW >= _BLOCK_MIN_OW and H >= 2 * OH and W >= 2 * OW
    if P == 0 or hw == 0:
        return 0
    with nogil:
        # Plane 0 decides whether the others try the 2x2-block pass first.
        if blocks:
            blocks = _blocks2x2(&grad_input[0, 0], H, W, &grad_output[0, 0],
                                &indices[0, 0], OH, OW) == 0
        if not blocks:
            bad = _scatter_add(&grad_input[0, 0], hw, &grad_output[0, 0], &indices[0, 0], n, 1)
    if num_threads == 1:
        _set_serial_team()
        with nogil:
            bad += _backward_planes(grad_input, H, W, grad_output, indices, OH, OW, blocks, 1, P)
        return bad
    # Planes 1 to P - 1, claimed a block at a time (_claim); each thread
    # counts its bad indices in a slot of its own.
    counts = <Py_ssize_t*>calloc(num_threads, sizeof(Py_ssize_t))
    if counts == NULL:
        raise MemoryError("cypool.max_pool2d_backward: out of memory")
    B = _claim_block(P - 1, num_threads)
    _team_begin(&team)
    with nogil, parallel(num_threads=num_threads):
        _note_team()
        end = -1
        start = _claim(&team, P - 1, B, &end)
        while start < P - 1:
            counts[threadid()] += _backward_planes(grad_input, H, W, grad_output, indices, OH, OW,
                                                   blocks, 1 + start, 1 + end)
            start = _claim(&team, P - 1, B, &end)
    _team_end(&team)
    for t in range(num_threads):
        bad += counts[t]
    free(counts)
    return bad


cdef inline Py_ssize_t _scatter_set(value_t* o, Py_ssize_t hw, const value_t* xv,
                                    const index_t* ix, Py_ssize_t n) noexcept nogil:
    """o[:hw] = 0, then o[ix[q]] = xv[q] in order; returns how many ix were
    out of range, and then writes nothing more (as _scatter_add)."""
    cdef Py_ssize_t q, bad = _out_of_range(ix, n, hw)
    memset(o, 0, hw * sizeof(value_t))
    if bad:
        return bad
    for q in range(n):
        o[ix[q]] = xv[q]
    return 0


def max_unpool2d(const value_t[:, ::1] x,            # IN  (P, H*W)
                 const index_t[:, ::1] indices,      # IN  (P, H*W)
                 value_t[:, ::1] out,                # OUT (P, OH*OW), fully written
                 int num_threads):
    """Write x into zeroed planes at indices; a repeated index keeps the last
    value in row-major order. Returns the number of out-of-range indices;
    the planes holding them are left zero, and the caller raises."""
    cdef Py_ssize_t P = x.shape[0], n = x.shape[1]
    cdef Py_ssize_t hw = out.shape[1], p, t, start, end, B
    cdef Py_ssize_t bad = 0
    cdef Py_ssize_t* counts
    cdef Team team
    if num_threads == 1:
        _set_serial_team()
        with nogil:
            for p in range(P):
                bad += _scatter_set(&out[p, 0], hw, &x[p, 0], &indices[p, 0], n)
        return bad
    # Planes claimed a block at a time (_claim), bad indices counted per thread.
    counts = <Py_ssize_t*>calloc(num_threads, sizeof(Py_ssize_t))
    if counts == NULL:
        raise MemoryError("cypool.max_unpool2d: out of memory")
    B = _claim_block(P, num_threads)
    _team_begin(&team)
    with nogil, parallel(num_threads=num_threads):
        _note_team()
        end = -1
        start = _claim(&team, P, B, &end)
        while start < P:
            for p in range(start, end):
                counts[threadid()] += _scatter_set(&out[p, 0], hw, &x[p, 0], &indices[p, 0], n)
            start = _claim(&team, P, B, &end)
    _team_end(&team)
    for t in range(num_threads):
        bad += counts[t]
    free(counts)
    return bad


cdef int _unpool_backward_planes(const value_t[:, ::1] grad_output, const index_t[:, ::1] indices,
                                 value_t[:, ::1] grad_input,
                                 Py_ssize_t p0, Py_ssize_t p1) noexcept nogil:
    """Planes [p0, p1), with a writer table of this thread's own; 1 when out
    of memory."""
    cdef Py_ssize_t n = indices.shape[1], p, q
    cdef Py_ssize_t* writer = <Py_ssize_t*>malloc(grad_output.shape[1] * sizeof(Py_ssize_t))
    cdef const index_t* ix
    cdef const value_t* go
    cdef value_t* gi
    if writer == NULL:
        return 1
    for p in range(p0, p1):
        ix = &indices[p, 0]
        go = &grad_output[p, 0]
        gi = &grad_input[p, 0]
        for q in range(n):
            writer[ix[q]] = q
        for q in range(n):
            gi[q] = go[ix[q]] if writer[ix[q]] == q else 0
    free(writer)
    return 0


def max_unpool2d_backward(const value_t[:, ::1] grad_output,  # IN  (P, OH*OW)
                          const index_t[:, ::1] indices,      # IN  (P, H*W), all in range
                          value_t[:, ::1] grad_input,         # OUT (P, H*W)
                          int num_threads):
    """Exact gradient of max_unpool2d: entry q gets grad_output at indices[q]
    if it is the value that stayed there (the last writer), else zero.

    indices must have been checked by max_unpool2d (all in [0, OH*OW))."""
    cdef Py_ssize_t P = grad_output.shape[0], start, end, B
    cdef Team team
    cdef int[1] failed
    cdef int* fail = &failed[0]
    failed[0] = 0
    if num_threads == 1:
        _set_serial_team()
        with nogil:
            failed[0] = _unpool_backward_planes(grad_output, indices, grad_input, 0, P)
    else:
        B = _claim_block(P, num_threads)
        _team_begin(&team)
        with nogil, parallel(num_threads=num_threads):
            _note_team()
            end = -1
            start = _claim(&team, P, B, &end)
            while start < P:  # (a writer table a block: a small malloc)
                if _unpool_backward_planes(grad_output, indices, grad_input, start, end):
                    fail[0] = 1
                start = _claim(&team, P, B, &end)
        _team_end(&team)
    if failed[0]:
        raise MemoryError("cypool.MaxUnpool2d.backward: out of memory")
