# Uses: _common.pxi only.
# Zonotope kernels for DeepZ certification (cypool/zonotope.py): the bounds
# of every neuron, and the DeepZ ReLU, over the rows of a C-contiguous
# (n, E) array whose row i is neuron i's (centre, generator 1, ...,
# generator E-1).
# Uses from _common.pxi: floating, int64_t, memcpy, memset, _share_start,
# _note_team, _set_serial_team.
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
