"""cypool.verify's bounds on convolution nets never exceed the exact bound of
the relaxation they were pushed through (rational arithmetic), rounding
charge included: every unstable neuron's row, in patches, as whole rows
(a dead neuron's stopped at a ReLU's box below) and as columns (dead
ReLUs' columns left out), and the output's rows, in float32 and
float64."""
import numpy as np
import pytest

import reference as ref
from cypool import verify
from cypool.verify import _crown
from cypool.verify._net import Conv, Dense, Elementwise, ReLU, Reshape


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


def relaxations(ops, relax, start=0):
    return [tuple(np.asarray(v).reshape(-1) for v in relax[start + i])
            for i, op in enumerate(ops[start:]) if isinstance(op, ReLU)]


def stop_bounds(ops, relax, pre, c):
    """The exact bounds of ``c . y`` (y ops[-1]'s output) through ops[j + 1:]
    on the output box of each ReLU ops[j] below the first: where a dense
    layer's row found its neuron dead (_crown._Dead)."""
    relus = [j for j, op in enumerate(ops) if isinstance(op, ReLU)][:-1]
    return [ref.backsub_exact(exact_layers(ops[j + 1:]), relaxations(ops, relax, j + 1), c,
                              np.maximum(pre[j][0], 0), np.maximum(pre[j][1], 0)) for j in relus]


def conv_net(rng):
    """Normalisation, two convolutions (strided, dilated, uneven pads), a
    dense layer with ReLUs dead on the box, and the output layer."""
    el = Elementwise(rng.uniform(0.5, 2, (2, 6, 6)), rng.standard_normal((2, 6, 6)))
    c1 = Conv(rng.standard_normal((3, 2, 3, 2)), rng.standard_normal(3), (2, 6, 6), (1, 1), (1, 0, 1, 1), (1, 1))
    c2 = Conv(rng.standard_normal((3, 3, 2, 3)) * 0.5, rng.standard_normal(3), c1.out_shape, (1, 2), (0, 1, 1, 0),
              (2, 1))
    n = int(np.prod(c2.out_shape))
    d1 = Dense(rng.standard_normal((9, n)) * 0.4, rng.standard_normal(9))
    d1.bias[:2] -= 64  # dead
    ops = [el, c1, ReLU(c1.out_shape), c2, ReLU(c2.out_shape), Reshape(c2.out_shape, (n,)),
           d1, ReLU((9,)), Dense(rng.standard_normal((3, 9)), rng.standard_normal(3))]
    return verify.Net(ops, (2, 6, 6), np.float64)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_convolution_bounds_never_exceed_the_exact_bound(rng, monkeypatch, dt, layout):
    """The second convolution's neurons in patches; the dense layer's and
    the output's as rows or as columns through both convolutions."""
    monkeypatch.setattr(_crown, "COLUMNS_MIN_ROWS", 1 if layout == "columns" else 10 ** 9)
    calls, charges = [], []
    real_rows, real_charge = _crown._rows, _crown._Charge.of_rows

    def rows_spy(ops, relax, rows, *args):
        out = real_rows(ops, relax, rows, *args)
        calls.append((ops, dict(relax), rows, out[0].copy(), out[1].copy()))
        return out

    def charge_spy(self, rows):
        out = real_charge(self, rows)
        charges.append(out.copy())
        return out
    monkeypatch.setattr(_crown, "_rows", rows_spy)
    monkeypatch.setattr(_crown._Charge, "of_rows", charge_spy)
    for _ in range(2):
        net = conv_net(rng).astype(dt)
        lo = rng.standard_normal(net.n_inputs).astype(dt)
        hi = (lo + rng.uniform(0, 0.8, lo.size)).astype(dt)
        calls.clear(), charges.clear()
        pre, relax, charge = _crown.bounds(net, lo, hi)
        assert {type(c[0][-1]) for c in calls} == {Conv, Dense} and len(charges) == len(calls)
        for (ops, rx, rows, lower, neg_upper), ch in zip(calls, charges):
            layers = exact_layers(ops)
            n = int(np.prod(ops[-1].out_shape))
            for k, r in enumerate(rows):
                e = np.zeros(n)
                e[r] = 1
                assert lower[k] - ch[k] <= ref.backsub_exact(layers, relaxations(ops, rx), e, lo, hi)
                exact = ref.backsub_exact(layers, relaxations(ops, rx), -e, lo, hi)
                if neg_upper[k] - ch[k] > exact:  # only a dead neuron's row, stopped below
                    assert layout == "rows" and isinstance(ops[-1], Dense) and neg_upper[k] > ch[k]
                    assert neg_upper[k] - ch[k] <= max(stop_bounds(ops, rx, pre, -e))
        assert any((relax[7][1] == 0).ravel())  # dead neurons' columns were left out
        C = rng.standard_normal((4, 3)).astype(dt)
        lb = _crown.output_lower(net, relax, charge, C, lo, hi)
        layers, rx = exact_layers(net.ops), relaxations(net.ops, relax)
        for k in range(4):
            assert lb[k] <= ref.backsub_exact(layers, rx, C[k], lo, hi)


def test_the_exact_reference_reads_a_convolution_as_its_op_does(rng):
    """conv_matrix against the op itself, so that the check above bounds
    the network the op computes."""
    net = conv_net(rng)
    for op in net.ops:
        if isinstance(op, Conv):
            X = rng.standard_normal((3,) + op.in_shape)
            want = op.apply(X).reshape(3, -1)
            got = X.reshape(3, -1) @ conv_matrix(op).T + op.bias.reshape(-1)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
