"""cypool.verify's intermediate bounds in float32 (_crown._Posterior): every
row's charged bound never exceeds the exact bound of the relaxation it was
pushed through (rational arithmetic), as whole rows, live columns, columns
and patches; and the nets and boxes that stay in float64."""
import numpy as np
import pytest

import reference as ref
from cypool import verify
from cypool.verify import _crown
from cypool.verify._net import Conv, Dense, Elementwise, ReLU, Reshape


def exact32(x):
    """x rounded to float32, held in float64."""
    return np.asarray(x).astype(np.float32).astype(np.float64)


def f32(rng, shape, scale=1.0):
    """Random float64 values that float32 holds exactly."""
    return exact32(rng.standard_normal(shape) * scale)


def conv_matrix(op):
    """op's linear part as a dense matrix, placed tap by tap (no sums)."""
    O, C, kh, kw = op.w.shape
    _, H, W = op.in_shape
    _, OH, OW = op.out_shape
    top, left = op.sym[0] + op.extra[0][0], op.sym[1] + op.extra[1][0]
    M = np.zeros((O * OH * OW, C * H * W))
    for o in range(O):
        for y in range(OH):
            for x in range(OW):
                for c in range(C):
                    for i in range(kh):
                        for j in range(kw):
                            yy = y * op.stride[0] - top + i * op.dilation[0]
                            xx = x * op.stride[1] - left + j * op.dilation[1]
                            if 0 <= yy < H and 0 <= xx < W:
                                M[(o * OH + y) * OW + x, (c * H + yy) * W + xx] = op.w[o, c, i, j]
    return M


def exact_layers(ops):
    """ops as reference.backsub_exact's layers (reshapes dropped)."""
    out = []
    for op in ops:
        if isinstance(op, ReLU):
            out.append(("relu",))
        elif isinstance(op, Dense):
            out.append(("dense", op.W, op.bias))
        elif isinstance(op, Conv):
            out.append(("dense", conv_matrix(op), op.bias.reshape(-1)))
        elif isinstance(op, Elementwise):
            out.append(("dense", np.diag(op.scale.reshape(-1)), op.bias.reshape(-1)))
    return out


def recorded_rows(monkeypatch):
    """The calls of _crown._rows that run in float32, as (ops, relax, rows,
    lo, hi, lower bounds of y_r, of -y_r), appended as bounds makes them."""
    calls = []
    real = _crown._rows

    def spy(ops, relax, rows, lo, hi, nt=0, buffers=None, post=None):
        out = real(ops, relax, rows, lo, hi, nt, buffers, post)
        if post is not None:
            calls.append((ops, dict(relax), rows.copy(), lo.copy(), hi.copy(), *out))
        return out
    monkeypatch.setattr(_crown, "_rows", spy)
    return calls


def assert_below_exact(calls):
    """Each recorded bound is at most the exact one of its relaxation."""
    assert calls
    for ops, relax, rows, lo, hi, lower, neg_upper in calls:
        assert lo.dtype == hi.dtype == np.float32
        assert all(v.dtype == np.float32 for i in relax for v in relax[i])
        layers = exact_layers(ops)
        rx = [tuple(v.reshape(-1) for v in relax[i]) for i, op in enumerate(ops) if isinstance(op, ReLU)]
        n = int(np.prod(ops[-1].out_shape))
        for k, r in enumerate(rows):
            e = np.zeros(n)
            e[r] = 1
            assert lower[k] <= ref.backsub_exact(layers, rx, e, lo, hi)
            assert neg_upper[k] <= ref.backsub_exact(layers, rx, -e, lo, hi)


def dense_net(rng):
    """Dense layers whose sums mix magnitudes, some ReLUs dead on the box
    (the live columns' path) and some always active."""
    sizes = (6, 14, 12, 10, 3)
    ops = []
    for k in range(len(sizes) - 1):
        W = f32(rng, (sizes[k + 1], sizes[k])) * np.exp2(rng.integers(-6, 6, (sizes[k + 1], sizes[k])))
        b = f32(rng, sizes[k + 1], 0.3)
        b[::5] = exact32(b[::5] - 64)  # dead
        ops += [Dense(W, b), ReLU((sizes[k + 1],))]
    return verify.Net(ops[:-1], (6,), np.float64)


def conv_net(rng):
    """Normalisation, two convolutions (strided, dilated, uneven pads: no
    3-wide taps at column stride 1), then dense layers."""
    el = Elementwise(exact32(f32(rng, (2, 6, 6)) + 2), f32(rng, (2, 6, 6)))
    c1 = Conv(f32(rng, (3, 2, 3, 2)), f32(rng, 3), (2, 6, 6), (1, 1), (1, 0, 1, 1), (1, 1))
    c2 = Conv(f32(rng, (3, 3, 2, 2), 0.5), f32(rng, 3), c1.out_shape, (1, 2), (0, 1, 1, 0), (2, 1))
    n = int(np.prod(c2.out_shape))
    d1 = Dense(f32(rng, (9, n), 0.4), f32(rng, 9))
    d1.bias[:2] = exact32(d1.bias[:2] - 64)
    ops = [el, c1, ReLU(c1.out_shape), c2, ReLU(c2.out_shape), Reshape(c2.out_shape, (n,)),
           d1, ReLU((9,)), Dense(f32(rng, (3, 9)), f32(rng, 3))]
    return verify.Net(ops, (2, 6, 6), np.float64)


def box(rng, net, width):
    lo = rng.standard_normal(net.n_inputs)
    return lo, lo + rng.uniform(0, width, lo.size)


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_dense_rows_never_exceed_the_exact_bound(rng, monkeypatch, layout):
    monkeypatch.setattr(_crown, "COLUMNS_MIN_ROWS", 1 if layout == "columns" else 10 ** 9)
    calls = recorded_rows(monkeypatch)
    for _ in range(3):
        net = dense_net(rng)
        assert _crown.narrowed(net, *box(rng, net, 1)) is not None
        _crown.bounds(net, *box(rng, net, 1.5))
    assert any((relax[i][1] == 0).any() for _, relax, *_ in calls for i in relax)  # dead ReLUs
    assert_below_exact(calls)


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_convolution_rows_never_exceed_the_exact_bound(rng, monkeypatch, layout):
    """The second convolution's neurons in patches, the dense layer's as
    rows or as columns through both convolutions."""
    monkeypatch.setattr(_crown, "COLUMNS_MIN_ROWS", 1 if layout == "columns" else 10 ** 9)
    calls = recorded_rows(monkeypatch)
    for _ in range(2):
        net = conv_net(rng)
        _crown.bounds(net, *box(rng, net, 0.8))
    assert {type(ops[-1]) for ops, *_ in calls} == {Conv, Dense}
    assert_below_exact(calls)


def test_a_cancelling_product_is_charged(rng, monkeypatch):
    """Rows ``a h_0 - b h_1`` of ReLU outputs ``h = (c x, d x)``, active on
    a box far from 0, with ``a c`` close to ``b d``: the float32 products
    lose most of the difference, and only their own charge covers it (the
    box's is of the small difference, the ReLUs' slopes are exact)."""
    calls = recorded_rows(monkeypatch)
    k = 12
    a, c, d = (exact32(rng.uniform(1, 2, k)) for _ in range(3))
    b = exact32(a * c / d)
    W1 = np.zeros((2 * k, 1))
    W1[0::2, 0], W1[1::2, 0] = c, d
    W2 = np.zeros((k, 2 * k))
    W2[np.arange(k), 2 * np.arange(k)], W2[np.arange(k), 2 * np.arange(k) + 1] = a, -b
    ops = [Dense(W1, np.zeros(2 * k)), ReLU((2 * k,)), Dense(W2, np.zeros(k)), ReLU((k,)),
           Dense(np.ones((1, k)), np.zeros(1))]
    net = verify.Net(ops, (1,), np.float64)
    _crown.bounds(net, np.array([1000.0]), np.array([1001.0]))
    assert calls[0][2].size == k  # every row, unstable by intervals
    assert_below_exact(calls)


def test_float32_rows_are_within_their_charge_of_float64(rng):
    """The float32 bounds lose little to float64's: the charge and float32's
    rounding only."""
    net = dense_net(rng)
    lo, hi = box(rng, net, 0.5)
    pre32 = _crown.bounds(net, lo, hi)[0]
    pre64 = _crown.bounds(net, lo, hi, charge=False)[0]
    for i in pre64:
        scale = np.abs(pre64[i]).max()
        for a, b in zip(pre32[i], pre64[i]):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * scale)


def test_outward32_contains_the_box(rng):
    lo = rng.standard_normal(1000) * np.exp2(rng.integers(-30, 30, 1000))
    hi = lo + np.abs(rng.standard_normal(1000))
    lo32, hi32 = _crown.outward32(lo, hi)
    assert lo32.dtype == hi32.dtype == np.float32
    assert (lo32 <= lo).all() and (hi32 >= hi).all()
    assert (np.nextafter(lo32, np.float32(np.inf)) > lo).all()
    assert (np.nextafter(hi32, np.float32(-np.inf)) < hi).all()


def test_what_stays_in_float64(rng):
    """float64 throughout for a float32 net (its own rounding charge), for
    weights float32 does not hold, for a 3-wide convolution at column
    stride 1 (F(2, 3) may run it), and for a box past NARROW_MAX."""
    net = dense_net(rng)
    lo, hi = box(rng, net, 1)
    assert _crown.narrowed(net, lo, hi) is net.exact_in(np.float32) is not None
    assert _crown.narrowed(net.astype(np.float32), lo, hi) is None
    assert _crown.narrowed(net, lo, hi + 2 * _crown.NARROW_MAX) is None
    ops = list(net.ops)
    ops[0] = Dense(ops[0].W + 1e-12, ops[0].bias)
    assert _crown.narrowed(verify.Net(ops, (6,), np.float64), lo, hi) is None
    for stride, width, narrow in (((1, 1), 3, False), ((1, 2), 3, True), ((1, 1), 2, True)):
        c = Conv(f32(rng, (2, 1, 3, width)), f32(rng, 2), (1, 6, 6), stride, (1, 1, 1, 1), (1, 1))
        n = int(np.prod(c.out_shape))
        cnet = verify.Net([c, ReLU(c.out_shape), Reshape(c.out_shape, (n,)), Dense(f32(rng, (2, n)), f32(rng, 2))],
                          (1, 6, 6), np.float64)
        assert (_crown.narrowed(cnet, *box(rng, cnet, 1)) is not None) == narrow
