"""cypool.verify: VNN-LIB properties, ONNX networks (against onnx's own
reference evaluator), bounds that contain every sampled output and never
exceed the exact bound of their relaxation (rational arithmetic), verdicts
that agree with an attack, the command line, and the bad-input battery."""
import csv
import os
import pickle
import sys

import numpy as np
import pytest

import reference as ref
from cypool import verify
from cypool.verify import __main__ as cli
from cypool.verify._crown import bounds, output_lower
from cypool.verify._net import ReLU

onnx = pytest.importorskip("onnx", reason="onnx (cypool[onnx]) not installed")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "vnncomp2021")


# --- building ONNX models -------------------------------------------------------

def make_model(path, nodes, inits, in_shape, out_name, opset=15):
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
        [helper.make_tensor_value_info(out_name, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) if np.asarray(v).dtype.kind == "f"
         else numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, str(path))
    return str(path)


def onnx_eval(path, x):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(str(path)).run(None, {"x": np.asarray(x, np.float32)})[0]


def dense_model(path, rng, sizes=(6, 8, 8, 3)):
    nodes, inits, cur = [], {}, "x"
    for k in range(len(sizes) - 1):
        inits[f"W{k}"] = rng.standard_normal((sizes[k + 1], sizes[k])) / np.sqrt(sizes[k])
        inits[f"b{k}"] = rng.standard_normal(sizes[k + 1]) * 0.1
        nodes.append(helper.make_node("Gemm", [cur, f"W{k}", f"b{k}"], [f"g{k}"], transB=1))
        cur = f"g{k}"
        if k < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [cur], [f"r{k}"]))
            cur = f"r{k}"
    return make_model(path, nodes, inits, [1, sizes[0]], cur)


def conv_model(path, rng):
    """Normalisation, a convolution with uneven pads, batch norm, an average
    pool without the padding in its count, torch's exported flatten
    (Shape, Gather, Unsqueeze, Concat, Reshape), MatMul and Add."""
    inits = {
        "mean": rng.random((1, 2, 1, 1)), "std": rng.uniform(0.5, 1.5, (1, 2, 1, 1)),
        "w": rng.standard_normal((3, 2, 3, 3)) * 0.5, "cb": rng.standard_normal(3) * 0.1,
        "bn_s": rng.uniform(0.5, 1.5, 3), "bn_b": rng.standard_normal(3) * 0.1,
        "bn_m": rng.standard_normal(3) * 0.1, "bn_v": rng.uniform(0.5, 2, 3),
        "zero": np.array(0, np.int64), "minus1": np.array([-1], np.int64),
        "M": rng.standard_normal((3 * 4 * 3, 4)) * 0.3, "mb": rng.standard_normal(4) * 0.1,
        "W2": rng.standard_normal((3, 4)), "b2": rng.standard_normal(3) * 0.1,
    }
    nodes = [
        helper.make_node("Sub", ["x", "mean"], ["n1"]),
        helper.make_node("Div", ["n1", "std"], ["n2"]),
        helper.make_node("Conv", ["n2", "w", "cb"], ["c1"], pads=[1, 0, 2, 1], strides=[1, 1]),
        helper.make_node("BatchNormalization", ["c1", "bn_s", "bn_b", "bn_m", "bn_v"], ["bn"], epsilon=1e-3),
        helper.make_node("Relu", ["bn"], ["r1"]),
        helper.make_node("AveragePool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 0, 0]),
        helper.make_node("Shape", ["p1"], ["shp"]),
        helper.make_node("Gather", ["shp", "zero"], ["n0"], axis=0),
        helper.make_node("Unsqueeze", ["n0", "zero_axes"], ["n0u"]),
        helper.make_node("Concat", ["n0u", "minus1"], ["newshape"], axis=0),
        helper.make_node("Reshape", ["p1", "newshape"], ["flat"]),
        helper.make_node("MatMul", ["flat", "M"], ["m1"]),
        helper.make_node("Add", ["m1", "mb"], ["a1"]),
        helper.make_node("Relu", ["a1"], ["r2"]),
        helper.make_node("Gemm", ["r2", "W2", "b2"], ["y"], transB=1, alpha=0.5, beta=2.0),
        helper.make_node("Identity", ["y"], ["out"]),
    ]
    inits["zero_axes"] = np.array([0], np.int64)
    return make_model(path, nodes, inits, [1, 2, 7, 6], "out")


# --- VNN-LIB ---------------------------------------------------------------------

def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_read_vnnlib_boxes_and_disjunctions(tmp_path):
    text = """; a comment
(declare-const X_0 Real)
(declare-const X_1 Real)
(declare-const Y_0 Real)
(declare-const Y_1 Real)
(declare-const Y_2 Real)
(assert (<= X_0 0.5))
(assert (>= X_0 -0.5))
(assert (<= X_1 1e-1))
(assert (>= X_1 -1.5E-1))
(assert (or (and (>= Y_0 Y_2) (<= Y_1 3.0)) (and (<= (+ Y_0 (* 2 Y_1)) (- Y_2 1)))))
"""
    spec = verify.read_vnnlib(write(tmp_path, "a.vnnlib", text))
    np.testing.assert_array_equal(spec.lower, [-0.5, -0.15])
    np.testing.assert_array_equal(spec.upper, [0.5, 0.1])
    assert len(spec.disjuncts) == 2
    (A0, b0), (A1, b1) = spec.disjuncts
    np.testing.assert_array_equal(A0, [[-1, 0, 1], [0, 1, 0]])  # Y_2 - Y_0 <= 0, Y_1 <= 3
    np.testing.assert_array_equal(b0, [0, 3])
    np.testing.assert_array_equal(A1, [[1, 2, -1]])
    np.testing.assert_array_equal(b1, [-1])
    assert spec.is_counterexample([2.0, 1.0, 1.0]) and not spec.is_counterexample([0.0, 5.0, 1.0])
    # several input boxes: a list of specs
    boxes = """(declare-const X_0 Real)
(declare-const Y_0 Real)
(declare-const Y_1 Real)
(assert (or (and (>= X_0 0) (<= X_0 1) (>= Y_0 Y_1)) (and (>= X_0 2) (<= X_0 3) (<= Y_0 Y_1))))
"""
    specs = verify.read_vnnlib(write(tmp_path, "b.vnnlib", boxes))
    assert [(s.lower[0], s.upper[0]) for s in specs] == [(0, 1), (2, 3)]
    np.testing.assert_array_equal(specs[1].disjuncts[0][0], [[1, -1]])


@pytest.mark.parametrize("text, words", [
    ("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (<= X_0 1)", "unbalanced"),
    ("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (<= X_0 1)))", "unbalanced"),
    ("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (<= X_0 1))\n(assert (<= Y_0 0))",
     "X_0 has no finite lower and upper bound"),
    ("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (<= X_0 1))\n(assert (>= X_0 0))\n"
     "(assert (<= (* Y_0 Y_0) 1))", "not linear"),
    ("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (<= X_0 1))\n(assert (>= X_0 0))\n"
     "(assert (<= Y_0 X_0))", "mixes inputs X and outputs Y"),
    ("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(check-sat)", "unsupported command"),
    ("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (<= X_0 1))\n(assert (>= X_0 0))\n"
     "(assert (<= Z_0 1))", "not a declared variable"),
    ("(declare-const X_0 Real)\n(declare-const X_2 Real)\n(declare-const Y_0 Real)", "X_0 to X_1"),
    ("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(assert (<= X_0 1))\n(assert (>= X_0 0))\n"
     "(assert (=> Y_0 1))", "unsupported connective"),
])
def test_read_vnnlib_refuses_what_it_cannot_read(tmp_path, text, words):
    with pytest.raises(ValueError) as info:
        verify.read_vnnlib(write(tmp_path, "bad.vnnlib", text))
    assert words in str(info.value)


# --- ONNX ----------------------------------------------------------------------------

def test_load_onnx_computes_what_onnx_computes(tmp_path, rng):
    for path in (dense_model(tmp_path / "d.onnx", rng), conv_model(tmp_path / "c.onnx", rng)):
        net = verify.load_onnx(path)
        shape = (1,) + net.input_shape
        for _ in range(3):
            x = rng.standard_normal(shape).astype(np.float32)
            want = onnx_eval(path, x)
            np.testing.assert_allclose(net.forward(x), want, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(verify.load_onnx(path, dtype=np.float32).forward(x), want,
                                       rtol=1e-4, atol=1e-5)


def test_load_onnx_from_torch_export(tmp_path, rng):
    torch = pytest.importorskip("torch")
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 5), nn.ReLU(), nn.Linear(5, 3)).eval()
    path = str(tmp_path / "t.onnx")
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, torch.zeros(1, 1, 8, 8), path, dynamo=False, input_names=["x"])
    net = verify.load_onnx(path)
    x = rng.random((2, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(net.forward(x), want, rtol=1e-4, atol=1e-5)


def test_load_onnx_names_an_unsupported_op_and_a_branch(tmp_path, rng):
    inits = {"W": rng.standard_normal((3, 4))}
    p = make_model(tmp_path / "s.onnx", [helper.make_node("Gemm", ["x", "W"], ["g"], transB=1),
                                         helper.make_node("Sigmoid", ["g"], ["y"], name="act1")],
                   inits, [1, 4], "y")
    with pytest.raises(ValueError, match=r"node 'act1' \(Sigmoid\): unsupported op Sigmoid"):
        verify.load_onnx(p)
    p = make_model(tmp_path / "r.onnx", [helper.make_node("Gemm", ["x", "W"], ["g"], transB=1),
                                         helper.make_node("Relu", ["g"], ["r"]),
                                         helper.make_node("Add", ["g", "r"], ["y"], name="skip")],
                   inits, [1, 4], "y")
    with pytest.raises(ValueError, match="only chains are supported"):
        verify.load_onnx(p)
    bad = tmp_path / "junk.onnx"
    bad.write_bytes(b"not a protobuf at all \x00\xff")
    with pytest.raises(ValueError, match="is not a readable ONNX model"):
        verify.load_onnx(str(bad))
    with pytest.raises(TypeError, match="dtype"):
        verify.load_onnx(p, dtype=np.float16)


def test_load_onnx_without_onnx_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(ImportError, match=r"cypool\[onnx\]"):
        verify.load_onnx(str(tmp_path / "x.onnx"))


# --- bounds: sound, and never above the exact bound of their relaxation -------------

def random_dense_net(tmp_path, rng, sizes):
    path = dense_model(tmp_path / f"n{rng.integers(1 << 30)}.onnx", rng, sizes)
    return path


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_bounds_contain_every_sampled_value(tmp_path, rng, dt):
    for path in (random_dense_net(tmp_path, rng, (5, 12, 12, 4)), conv_model(tmp_path / "c.onnx", rng)):
        net = verify.load_onnx(path, dtype=dt)
        n = net.n_inputs
        centre = rng.standard_normal(n)
        lo, hi = centre - 0.3, centre + 0.3
        pre, relax, charge = bounds(net, lo, hi)
        C = rng.standard_normal((6, net.n_outputs))
        lb = output_lower(net, relax, charge, C, lo, hi)
        X = np.concatenate([rng.uniform(lo, hi, (300, n)), np.where(rng.random((50, n)) < 0.5, lo, hi)])
        f64 = net.astype(np.float64)
        Y = X.reshape((-1,) + net.input_shape)
        for i, op in enumerate(f64.ops):
            if isinstance(op, ReLU):
                v = Y.reshape(len(X), -1)
                assert (v >= pre[i][0]).all() and (v <= pre[i][1]).all()
            Y = op.apply(Y)
        assert ((Y.reshape(len(X), -1) @ C.T) >= lb).all()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_bounds_never_exceed_the_exact_bound_of_their_relaxation(tmp_path, rng, dt):
    for trial in range(4):
        sizes = (4, 7, 6, 3)
        path = random_dense_net(tmp_path, rng, sizes)
        net = verify.load_onnx(path, dtype=dt)
        # exact values of the weights as held
        layers, relus = [], []
        for i, op in enumerate(net.ops):
            if isinstance(op, ReLU):
                layers.append(("relu",))
                relus.append(i)
            elif hasattr(op, "W"):
                layers.append(("dense", op.W, op.bias))
        centre = rng.standard_normal(4)
        lo, hi = (centre - 0.5).astype(dt), (centre + 0.5).astype(dt)
        pre, relax, charge = bounds(net, lo, hi)
        rx = [tuple(np.asarray(v).reshape(-1) for v in relax[i]) for i in relus]
        C = rng.standard_normal((3, 3)).astype(dt)
        lb = output_lower(net, relax, charge, C, lo, hi)
        for k in range(3):
            assert lb[k] <= ref.backsub_exact(layers, rx, C[k], lo, hi)
        # the second ReLU's input, back-substituted through the first's relaxation
        head = verify.Net(net.ops[:relus[1]], net.input_shape, dt)
        _, _, head_charge = bounds(head, lo, hi)
        E = np.concatenate([np.eye(6), -np.eye(6)]).astype(dt)
        lb2 = output_lower(head, {relus[0]: relax[relus[0]]}, head_charge, E, lo, hi)
        for j in range(12):
            assert lb2[j] <= ref.backsub_exact(layers[:3], rx[:1], E[j], lo, hi)
        l2, u2 = pre[relus[1]]  # and the bounds kept of unstable neurons are no looser
        unstable = (l2 < 0) & (u2 > 0)
        tol = 1e-5 if dt == np.float32 else 1e-12  # (other row counts round otherwise)
        assert (l2 >= lb2[:6] - tol)[unstable].all() and (u2 <= -lb2[6:] + tol)[unstable].all()


def test_the_float32_product_into_the_input_is_charged_for_its_rounding(tmp_path, rng, monkeypatch):
    """Many rows through a float64 net's first dense map run as a float32
    product (_crown._box_f32), charged for its rounding: the bounds never
    exceed the exact bound of their relaxation (rational arithmetic), and
    stay within float32's rounding of it."""
    from cypool.verify import _crown
    ran = []
    real = _crown._box_f32

    def spy(*args):
        out = real(*args)
        ran.append(out is not None)
        return out
    monkeypatch.setattr(_crown, "_box_f32", spy)
    for trial in range(3):
        net = verify.load_onnx(random_dense_net(tmp_path, rng, (30, 40, 24, 5)), dtype=np.float64)
        layers, relus = [], []
        for i, op in enumerate(net.ops):
            if isinstance(op, ReLU):
                layers.append(("relu",))
                relus.append(i)
            else:
                layers.append(("dense", op.W, op.bias))
        centre = 20 * rng.standard_normal(30)  # large values: float32's rounding shows
        lo, hi = centre - 1, centre + 1
        pre, relax, charge = bounds(net, lo, hi)
        head = verify.Net(net.ops[:relus[1]], net.input_shape, np.float64)
        _, _, head_charge = bounds(head, lo, hi)
        E = np.concatenate([np.eye(24), -np.eye(24)])
        ran.clear()
        lb = output_lower(head, {relus[0]: relax[relus[0]]}, head_charge, E, lo, hi)
        assert ran == [True]
        rx = [tuple(np.asarray(v).reshape(-1) for v in relax[relus[0]])]
        want = np.array([float(ref.backsub_exact(layers[:3], rx, E[j], lo, hi)) for j in range(48)])
        assert (lb <= want).all()
        assert (lb >= want - 1e-3 * (1 + np.abs(want))).all()


def test_the_float32_product_falls_back_to_float64_past_its_range(rng, monkeypatch):
    """Rows too large for float32 go through the first dense map in
    float64, with the float64 product's bounds."""
    from cypool.verify import _crown
    from cypool.verify._net import Dense
    d1 = Dense(rng.standard_normal((20, 6)), rng.standard_normal(20))
    d2 = Dense(rng.standard_normal((4, 20)), rng.standard_normal(4))
    net = verify.Net([d1, ReLU((20,)), d2], (6,), np.float64)
    lo = rng.standard_normal(6)
    hi = lo + 1
    _, relax, _ = _crown.bounds(net, lo, hi, charge=False)
    C = rng.standard_normal((32, 4))
    C[3] *= 1e300  # past float32's range
    got = _crown._backsub(net.ops, relax, C.copy(), lo, hi)
    monkeypatch.setattr(_crown, "F32_MIN_ROWS", 10 ** 9)
    want = _crown._backsub(net.ops, relax, C.copy(), lo, hi)
    np.testing.assert_array_equal(got, want)
    assert np.isfinite(got).all()


# --- check: verdicts ------------------------------------------------------------------

def robustness_spec(lo, hi, label, K):
    A = [np.eye(K)[label] - np.eye(K)[j] for j in range(K) if j != label]  # y_label <= y_j
    return verify.Spec(np.asarray(lo, float), np.asarray(hi, float),
                       [(a[None], np.zeros(1)) for a in A])


def test_check_holds_violated_and_unknown(tmp_path, rng):
    net = verify.load_onnx(random_dense_net(tmp_path, rng, (5, 16, 16, 3)))
    x = rng.standard_normal(5)
    y = net.forward(x)[0]
    label = int(np.argmax(y))
    res = verify.check(net, robustness_spec(x, x, label, 3))  # a point: its own class
    assert res.status == "holds" and res.time > 0
    wrong = int(np.argmin(y))
    res = verify.check(net, robustness_spec(x - 1e-3, x + 1e-3, wrong, 3))  # the centre disagrees
    assert res.status == "violated"
    cx, cy = res.counterexample
    assert (cx >= x - 1e-3).all() and (cx <= x + 1e-3).all()
    np.testing.assert_array_equal(cy, net.astype(np.float64).forward(cx)[0])
    assert robustness_spec(x, x, wrong, 3).is_counterexample(cy)


def test_a_conjunct_without_output_constraints_is_violated_anywhere(tmp_path, rng):
    """A disjunct with no output row holds of every output: a counterexample
    at any point of its box, first, last or alone among the disjuncts (the
    stacked rows once read a neighbour's row for it, or ran off the end)."""
    net = verify.load_onnx(random_dense_net(tmp_path, rng, (3, 6, 2)))
    text = """(declare-const X_0 Real)
(declare-const X_1 Real)
(declare-const X_2 Real)
(declare-const Y_0 Real)
(declare-const Y_1 Real)
(assert (>= X_0 -1))
(assert (<= X_1 1))
(assert (>= X_1 -1))
(assert (<= X_2 1))
(assert (>= X_2 -1))
(assert (or (and (<= X_0 1) (<= Y_0 -1000)) (and (<= X_0 0.5))))
"""
    specs = verify.read_vnnlib(write(tmp_path, "empty.vnnlib", text))
    assert [len(A) for s in specs for A, _ in s.disjuncts] == [1, 0]
    res = verify.check(net, specs)
    assert res.status == "violated" and res.counterexample[0][0] <= 0.5
    far = (np.array([[1.0, -1.0]]), np.array([-1000.0]))  # y0 - y1 <= -1000: never on this box
    none = (np.zeros((0, 2)), np.zeros(0))
    for disjuncts in ([none], [far, none], [none, far], [far, none, far]):
        spec = verify.Spec(-np.ones(3), np.ones(3), disjuncts)
        res = verify.check(net, spec)
        assert res.status == "violated" and spec.is_counterexample(res.counterexample[1])
        assert verify.attack(net, spec) is not None
    res = verify.check(net, verify.Spec(-np.ones(3), np.ones(3), [far, far]))
    assert res.status == "holds" and [len(m) for m in res.lower[0]] == [1, 1]


def test_verdicts_agree_with_an_attack(tmp_path, rng):
    """Over random nets and boxes: a "holds" is never broken by a strong
    attack, and every "violated" carries a counterexample."""
    seen = set()
    for trial in range(12):
        net = verify.load_onnx(random_dense_net(tmp_path, rng, (4, 10, 10, 3)))
        x = rng.standard_normal(4)
        label = int(np.argmax(net.forward(x)[0]))
        eps = [0.01, 0.1, 0.5][trial % 3]
        spec = robustness_spec(x - eps, x + eps, label, 3)
        res = verify.check(net, spec)
        seen.add(res.status)
        if res.status == "holds":
            assert verify.attack(net, spec, steps=200, points=64, seed=trial + 1) is None
            X = rng.uniform(spec.lower, spec.upper, (2000, 4))
            assert not any(spec.is_counterexample(y) for y in net.forward(X))
        elif res.status == "violated":
            cx, cy = res.counterexample
            assert spec.is_counterexample(net.forward(cx)[0])
    assert "holds" in seen


def test_the_attack_after_the_bounds_starts_where_they_are_least(tmp_path, rng):
    """h = relu(w . x - 10.8) on [-1, 1]^12 is above 0.5 only within 0.35
    of the corner sign(w), and its gradient is 0 everywhere else: no attack
    from the centre or random points gets there. The bounds' linear
    function is least at that corner, so check starts there."""
    w = rng.choice([-1.0, 1.0], 12)
    path = make_model(tmp_path / "corner.onnx", [
        helper.make_node("Gemm", ["x", "W0", "b0"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("Gemm", ["r", "W1", "b1"], ["y"], transB=1)],
        {"W0": w[None], "b0": [-10.8], "W1": [[-1.0], [0.0]], "b1": [0.5, 0.0]}, [1, 12], "y")
    net = verify.load_onnx(path)
    spec = robustness_spec(-np.ones(12), np.ones(12), 0, 2)  # a counterexample: y0 <= y1
    assert verify.attack(net, spec, steps=20, points=16) is None
    res = verify.check(net, spec)
    assert res.status == "violated"
    cx, cy = res.counterexample
    assert w @ cx >= 11.3 and spec.is_counterexample(net.forward(cx)[0])
    assert verify.check(net, spec, attack_steps=0).status == "violated"  # the corner itself


@pytest.mark.parametrize("make_spec, err, words", [
    (lambda net: verify.Spec(np.zeros(3), np.ones(3), [(np.ones((1, 3)), np.zeros(1))]), ValueError,
     "spec has 3 inputs but the net takes 5"),
    (lambda net: verify.Spec(np.zeros(5), np.ones(5), [(np.ones((1, 2)), np.zeros(1))]), ValueError,
     "constrains 2 outputs but the net has 3"),
    (lambda net: verify.Spec(np.full(5, np.nan), np.ones(5), [(np.ones((1, 3)), np.zeros(1))]), ValueError,
     "input bounds must be finite"),
    (lambda net: "spec.vnnlib", TypeError, "spec must be a Spec"),
])
def test_check_bad_input(tmp_path, rng, make_spec, err, words):
    net = verify.load_onnx(random_dense_net(tmp_path, rng, (5, 4, 3)))
    with pytest.raises(err) as info:
        verify.check(net, make_spec(net))
    assert words in str(info.value)
    with pytest.raises(TypeError, match="net must be a network from load_onnx"):
        verify.check("net.onnx", verify.Spec(np.zeros(5), np.ones(5), [(np.ones((1, 3)), np.zeros(1))]))
    for timeout in (-1, 0, True, float("nan"), "30", np.bool_(True)):
        with pytest.raises(ValueError, match="timeout"):
            verify.check(net, verify.Spec(np.zeros(5), np.ones(5), [(np.ones((1, 3)), np.zeros(1))]),
                         timeout=timeout)
    # attack() checks what check() checks, one spec at a time
    with pytest.raises(err) as info:
        verify.attack(net, make_spec(net))
    assert words in str(info.value)


@pytest.mark.parametrize("kw, err, words", [
    (dict(steps=-1), ValueError, "steps must be an integer >= 0"),
    (dict(steps=2.5), TypeError, "steps must be an integer"),
    (dict(points=0), ValueError, "points must be an integer >= 1"),
    (dict(points=True), TypeError, "points must be an integer"),
    (dict(patience=0), ValueError, "patience must be an integer >= 1"),
    (dict(min_gain=-0.1), ValueError, "min_gain must be a number in [0, 1)"),
    (dict(min_gain=1.0), ValueError, "min_gain must be a number in [0, 1)"),
    (dict(min_gain=float("nan")), ValueError, "min_gain must be a number in [0, 1)"),
    (dict(deadline="soon"), ValueError, "deadline must be"),
    (dict(deadline=float("nan")), ValueError, "deadline must be"),
    (dict(deadline=True), ValueError, "deadline must be"),
])
def test_attack_bad_arguments(tmp_path, rng, kw, err, words):
    net = verify.load_onnx(random_dense_net(tmp_path, rng, (5, 4, 3)))
    spec = verify.Spec(np.zeros(5), np.ones(5), [(np.ones((1, 3)), np.zeros(1))])
    with pytest.raises(err) as info:
        verify.attack(net, spec, **kw)
    assert words in str(info.value)
    with pytest.raises(TypeError, match="one Spec"):
        verify.attack(net, [spec, spec])


def test_check_bad_attack_steps(tmp_path, rng):
    net = verify.load_onnx(random_dense_net(tmp_path, rng, (5, 4, 3)))
    spec = verify.Spec(np.zeros(5), np.ones(5), [(np.ones((1, 3)), np.zeros(1))])
    with pytest.raises(ValueError, match="attack_steps must be an integer >= 0"):
        verify.check(net, spec, attack_steps=-2)


# --- the command line -----------------------------------------------------------------

def spec_file(tmp_path, name, lo, hi, label, K):
    lines = [f"(declare-const X_{i} Real)" for i in range(len(lo))]
    lines += [f"(declare-const Y_{j} Real)" for j in range(K)]
    for i, (a, b) in enumerate(zip(lo, hi)):
        lines += [f"(assert (>= X_{i} {float(a)!r}))", f"(assert (<= X_{i} {float(b)!r}))"]
    lines.append("(assert (or " + " ".join(f"(and (>= Y_{j} Y_{label}))" for j in range(K) if j != label) + "))")
    return write(tmp_path, name, "\n".join(lines) + "\n")


def test_command_line_one_instance_and_a_folder(tmp_path, rng, capsys):
    net_path = random_dense_net(tmp_path, rng, (3, 8, 3))
    net = verify.load_onnx(net_path)
    x = rng.standard_normal(3)
    y = net.forward(x)[0]
    spec_file(tmp_path, "hold.vnnlib", x, x, int(np.argmax(y)), 3)
    spec_bad = spec_file(tmp_path, "bad.vnnlib", x - 1e-3, x + 1e-3, int(np.argmin(y)), 3)
    out = tmp_path / "res.txt"
    assert cli.main([net_path, spec_bad, "--out", str(out), "--timeout", "30"]) == 0
    text = out.read_text().splitlines()
    assert text[0] == "violated" and text[1].startswith("((X_0 ") and text[-1].endswith("))")
    assert len(text) == 1 + 3 + 3
    with open(tmp_path / "instances.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([[os.path.basename(net_path), "hold.vnnlib", "10"],
                                  [os.path.basename(net_path), "bad.vnnlib", "10"]])
    capsys.readouterr()
    assert cli.main(["--instances", str(tmp_path / "instances.csv"), "--out-dir", str(tmp_path / "o")]) == 0
    rows = list(csv.reader(capsys.readouterr().out.splitlines()))
    assert [r[2] for r in rows] == ["holds", "violated"]
    assert (tmp_path / "o" / (os.path.splitext(os.path.basename(net_path))[0] + "_hold.txt")).read_text() == "holds\n"
    pytest.importorskip("distributed")
    assert cli.main(["--instances", str(tmp_path / "instances.csv"), "--local-cluster", "1"]) == 0
    rows2 = list(csv.reader(capsys.readouterr().out.splitlines()))
    assert [r[:3] for r in rows2] == [r[:3] for r in rows]


# --- the shared VNN-COMP folders, where present ---------------------------------------

@pytest.mark.parametrize("folder", ["mnistfc", "oval21"])
def test_shared_vnncomp_networks(folder, rng):
    d = os.path.join(SHARED, folder)
    if not os.path.isdir(d):
        pytest.skip("shared/vnncomp2021 not present")
    rows = cli.read_instances(os.path.join(d, "instances.csv"))
    net = verify.load_onnx(rows[0][0])
    x = rng.random((1,) + net.input_shape).astype(np.float32)
    np.testing.assert_allclose(net.forward(x), _onnx_eval_named(rows[0][0], x), rtol=1e-4, atol=1e-4)
    for _, spec_path, _ in rows[:3]:
        spec = verify.read_vnnlib(spec_path)
        res = verify.check(net, spec)
        if res.status == "violated":
            cx, cy = res.counterexample
            assert (cx >= spec.lower).all() and (cx <= spec.upper).all() and spec.is_counterexample(cy)


def _input_name(path):
    return onnx.load(path).graph.input[0].name


def _onnx_eval_named(path, x):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(path).run(None, {_input_name(path): x.reshape(
        [d.dim_value for d in onnx.load(path).graph.input[0].type.tensor_type.shape.dim])})[0]


def test_patches_give_the_whole_back_substitution(rng):
    """Neurons of a convolution bounded in patches (dilation, uneven pads,
    a convolution right after another, an elementwise map, windows at the
    borders) equal the back-substitution through whole images."""
    from cypool.verify import _crown, _patches
    from cypool.verify._net import Conv, Elementwise

    c1 = Conv(rng.standard_normal((4, 2, 3, 3)), rng.standard_normal(4), (2, 9, 8), (1, 1), (2, 1, 0, 2), (2, 2))
    c2 = Conv(rng.standard_normal((3, 4, 2, 3)), rng.standard_normal(3), c1.out_shape, (2, 1), (1, 1, 1, 0), (1, 1))
    c3 = Conv(rng.standard_normal((3, 3, 3, 3)) * 0.5, rng.standard_normal(3), c2.out_shape, (1, 2), (1, 1, 1, 1), (1, 1))
    el = Elementwise(rng.uniform(-1, 1, c3.out_shape), rng.standard_normal(c3.out_shape))
    c4 = Conv(rng.standard_normal((2, 3, 2, 2)), rng.standard_normal(2), c3.out_shape, (1, 1), (0, 1, 1, 0), (1, 1))
    ops = [c1, ReLU(c1.out_shape), c2, c3, el, ReLU(el.out_shape), c4]
    net = verify.Net(ops, (2, 9, 8), np.float64)
    lo = rng.standard_normal(net.n_inputs) - 0.5
    hi = lo + rng.uniform(0, 1, lo.size)
    pre, relax, _ = _crown.bounds(net, lo, hi, charge=False)
    for k in (3, 7):  # after c2 and c3 (a conv right after a conv), and the last conv
        sub = ops[:k] if k == 3 else ops
        assert _patches.patchable(sub)
        rows = np.arange(int(np.prod(sub[-1].out_shape)))
        got_lo, got_neg_hi = _patches.backsub_rows(sub, relax, rows, lo, hi)
        E = np.concatenate([np.eye(rows.size), -np.eye(rows.size)])
        want = _crown._backsub(sub, relax, E.reshape((-1,) + sub[-1].out_shape), lo, hi)
        np.testing.assert_allclose(got_lo, want[:rows.size], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got_neg_hi, want[rows.size:], rtol=1e-12, atol=1e-12)
    assert not _patches.patchable(ops[:2]) and not _patches.patchable(ops[:5])


@pytest.mark.parametrize("stride", [(1, 1), (2, 2)])
def test_convolutions_of_the_bounds_run_direct_sums(rng, monkeypatch, stride):
    """The rounding charge bounds a direct sum's error only: with F(2, 3)
    forced, the plans of cypool.verify's convolutions (the op's, and the
    patches') still run LANES, where conv2d's own plan takes F(2, 3)."""
    from cypool import _conv_engine as engine
    from cypool._select import ConvAlgo
    from cypool._testing import force
    from cypool.verify import _patches
    from cypool.verify._net import Conv

    c1 = Conv(rng.standard_normal((8, 4, 3, 3)), np.zeros(8), (4, 12, 12), stride, (1, 1, 1, 1), (1, 1))
    c2 = Conv(rng.standard_normal((3, 8, 3, 3)), np.zeros(3), c1.out_shape, (1, 1), (1, 1, 1, 1), (1, 1))
    ops = [c1, ReLU(c1.out_shape), c2]
    plans = []
    real = engine.input_grad_into
    monkeypatch.setattr(engine, "input_grad_into", lambda *a: plans.append(a[3]) or real(*a))
    lo = rng.standard_normal(c1.in_shape).reshape(-1)
    hi = lo + 1
    with force(conv=ConvAlgo.WINOGRAD):
        plans.append(c1._plan(3, np.dtype(np.float64)))
        _, relax, _ = bounds(verify.Net(ops, c1.in_shape, np.float64), lo, hi, charge=False)
        _patches.backsub_rows(ops, relax, np.arange(10), lo, hi)
        theirs = engine.plan((3, 4, 12, 12), c1.w.shape, stride, (1, 1), (1, 1), np.float64)
    assert len(plans) == 2  # the op's plan, and the patches' one
    algos = {p.algo[0] for plan in plans for p in (plan.forward, plan.input_grad) if p.algo}
    assert ConvAlgo.WINOGRAD not in algos and ConvAlgo.LANES in algos
    if stride == (1, 1):
        assert theirs.forward.algo[0] == ConvAlgo.WINOGRAD


def test_the_steps_of_a_dense_net_run_on_the_calling_thread(tmp_path, rng, monkeypatch):
    """step_threads: a net's own thread count where it has a convolution
    (which runs on the same team), else 1 (its products run on OpenBLAS's
    threads); bounds hands every compiled step that count."""
    from cypool.verify import _crown
    dense = verify.load_onnx(random_dense_net(tmp_path, rng, (5, 12, 12, 3)))
    conv = verify.load_onnx(conv_model(tmp_path / "c.onnx", rng))
    assert _crown.step_threads(dense.with_threads(2)) == 1
    assert _crown.step_threads(conv.with_threads(2)) == 2
    assert _crown.step_threads(conv.with_threads(3)) == 3
    seen = []
    real = _crown.threads_for
    monkeypatch.setattr(_crown, "threads_for", lambda nt, *a: seen.append(nt) or real(nt, *a))
    lo = rng.standard_normal(dense.n_inputs)
    _, relax, charge = bounds(dense.with_threads(2), lo, lo + 1)
    output_lower(dense.with_threads(2), relax, charge, np.eye(3), lo, lo + 1)
    assert seen and set(seen) == {1}


def test_dense_rows_of_dead_neurons_stop_without_changing_a_relaxation(tmp_path, rng, monkeypatch):
    """On deep dense nets, the rows of neurons found dead at a ReLU's box
    below their layer stop there (_crown._Dead), and every ReLU's
    relaxation, the output's bounds and the live neurons' bounds are
    those of rows all taken to the input."""
    from cypool.verify import _crown
    stopped = []
    real_stop = _crown._Dead.stop

    def spy(self, Af, const, i, nt, packed=None):
        A, c = real_stop(self, Af, const, i, nt, packed)
        stopped.append(const.size - c.size)
        return A, c
    monkeypatch.setattr(_crown._Dead, "stop", spy)
    for trial in range(3):
        net = verify.load_onnx(random_dense_net(tmp_path, rng, (6, 30, 30, 30, 30, 4)))
        lo = rng.standard_normal(net.n_inputs)
        hi = lo + rng.uniform(0, 1, lo.size)
        C = rng.standard_normal((5, 4))
        pre, relax, ch = bounds(net, lo, hi)
        lb = output_lower(net, relax, ch, C, lo, hi)
        with monkeypatch.context() as m:
            m.setattr(_crown._Dead, "stop", lambda self, Af, const, *args: (Af, const))
            pre_all, relax_all, ch_all = bounds(net, lo, hi)
            lb_all = output_lower(net, relax_all, ch_all, C, lo, hi)
        for i in relax:
            for v, w in zip(relax[i], relax_all[i]):
                np.testing.assert_allclose(v, w, rtol=1e-12, atol=1e-12)
            live = pre_all[i][1] > 0
            np.testing.assert_array_equal(pre[i][1] > 0, live)
            np.testing.assert_allclose(pre[i][0][live], pre_all[i][0][live], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(pre[i][1][live], pre_all[i][1][live], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lb, lb_all, rtol=1e-12, atol=1e-12)
    assert sum(stopped) > 0


@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_kept_buffers_give_the_bounds_of_fresh_arrays(rng, monkeypatch, layout):
    """Bounds computed into the net's kept buffers, box after box (rows of
    different counts), equal those computed into fresh arrays; one array is
    kept per use, whatever the count of rows."""
    from cypool.verify import _crown
    from cypool.verify._net import Conv, Dense, Reshape

    monkeypatch.setattr(_crown, "COLUMNS_MIN_ROWS", 1 if layout == "columns" else 10 ** 9)

    c1 = Conv(rng.standard_normal((4, 2, 3, 3)), rng.standard_normal(4), (2, 9, 8), (2, 1), (1, 1, 1, 0), (1, 1))
    c2 = Conv(rng.standard_normal((3, 4, 3, 2)), rng.standard_normal(3), c1.out_shape, (1, 2), (1, 0, 1, 1), (1, 1))
    n = int(np.prod(c2.out_shape))
    ops = [c1, ReLU(c1.out_shape), c2, ReLU(c2.out_shape), Reshape(c2.out_shape, (n,)),
           Dense(rng.standard_normal((7, n)), rng.standard_normal(7)), ReLU((7,)),
           Dense(rng.standard_normal((3, 7)), rng.standard_normal(3))]
    kept = verify.Net(ops, (2, 9, 8), np.float64)
    fresh = verify.Net(ops, (2, 9, 8), np.float64)
    fresh.buffers = None
    C = rng.standard_normal((5, 3))
    boxes = []
    for width in (0.3, 1.0, 0.05):
        lo = rng.standard_normal(kept.n_inputs)
        boxes.append((lo, lo + rng.uniform(0, width, lo.size)))
    for lo, hi in boxes + boxes[::-1]:
        got, want = bounds(kept, lo, hi), bounds(fresh, lo, hi)
        for i in want[0]:
            np.testing.assert_array_equal(got[0][i][0], want[0][i][0])
            np.testing.assert_array_equal(got[0][i][1], want[0][i][1])
        np.testing.assert_array_equal(output_lower(kept, got[1], got[2], C, lo, hi),
                                      output_lower(fresh, want[1], want[2], C, lo, hi))
    arrays = kept.buffers._local.arrays
    assert len({(key, last, dt) for key, _, last, dt in arrays}) == len(arrays)
    # a net with buffers still pickles (for Dask or multiprocessing), without them
    again = pickle.loads(pickle.dumps(kept))
    assert not again.buffers._local.__dict__
    np.testing.assert_array_equal(bounds(again, lo, hi)[0][3][0], bounds(fresh, lo, hi)[0][3][0])


def test_dense_rows_give_the_one_hot_back_substitution(rng):
    """A dense layer's neurons bounded from its rows equal e_r pushed back
    through the whole chain."""
    from cypool.verify import _crown
    from cypool.verify._net import Dense

    d1 = Dense(rng.standard_normal((9, 5)), rng.standard_normal(9))
    d2 = Dense(rng.standard_normal((7, 9)), rng.standard_normal(7))
    ops = [d1, ReLU((9,)), d2]
    net = verify.Net(ops + [ReLU((7,)), Dense(rng.standard_normal((2, 7)), np.zeros(2))], (5,), np.float64)
    lo = rng.standard_normal(5) - 0.5
    hi = lo + rng.uniform(0, 1.5, 5)
    _, relax, _ = _crown.bounds(net, lo, hi, charge=False)
    rows = np.array([6, 0, 3])
    got_lo, got_neg_hi = _crown._rows(ops, relax, rows, lo, hi)
    E = np.zeros((6, 7))
    E[np.arange(3), rows], E[3 + np.arange(3), rows] = 1, -1
    want = _crown._backsub(ops, relax, E, lo, hi)
    np.testing.assert_allclose(got_lo, want[:3], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got_neg_hi, want[3:], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cols", [False, True])
def test_dense_maps_under_dead_relus_sum_over_the_live_neurons(rng, monkeypatch, cols):
    """Back through a dense map whose outputs a ReLU above mostly kills, only
    the live neurons are summed; as rows, between two ReLUs, only the
    columns of the live neurons below are written; and the bound is still
    the relaxation's exact one (rational arithmetic): as rows and as
    columns."""
    from cypool.verify import _crown
    from cypool.verify._net import Dense

    d1 = Dense(rng.standard_normal((12, 5)), rng.standard_normal(12))
    d1.bias[::3] -= 100  # dead on the box
    d1.bias[1::3] += 100  # active
    d2 = Dense(rng.standard_normal((9, 12)), rng.standard_normal(9))
    d2.bias[:4] -= 100
    d3 = Dense(rng.standard_normal((3, 9)), rng.standard_normal(3))
    net = verify.Net([d1, ReLU((12,)), d2, ReLU((9,)), d3], (5,), np.float64)
    lo = rng.standard_normal(5) - 0.5
    hi = lo + rng.uniform(0.2, 1.5, 5)
    _, relax, _ = _crown.bounds(net, lo, hi, charge=False)
    for i, n in ((1, 12), (3, 9)):  # some dead, some not
        assert 4 <= (relax[i][1] == 0).sum() < n
    seen = []
    for name in ("T", "T_cols"):
        def spy(self, A, buffers=None, live=None, _f=getattr(Dense, name), **kw):
            seen.append(tuple(None if v is None else list(v) for v in (live, kw.get("live_in"))))
            return _f(self, A, buffers=buffers, live=live, **kw)
        monkeypatch.setattr(Dense, name, spy)
    C = rng.standard_normal((4, 3))
    A = np.ascontiguousarray(C.T) if cols else C.copy()
    got = _crown._backsub(net.ops, relax, A, lo, hi, cols=cols)
    live3, live1 = (list(np.flatnonzero(relax[i][1])) for i in (3, 1))
    if cols:
        assert seen == [(None, None), (live3, None), (live1, None)]
    else:
        assert seen == [(None, live3), (live3, live1), (live1, None)]
    layers = [("dense", d1.W, d1.bias), ("relu",), ("dense", d2.W, d2.bias), ("relu",), ("dense", d3.W, d3.bias)]
    rx = [relax[1], relax[3]]
    for k in range(4):
        want = float(ref.backsub_exact(layers, rx, C[k], lo, hi))
        assert abs(got[k] - want) <= 1e-12 * (1 + abs(want))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_rows_as_columns_give_the_bounds_of_rows(rng, monkeypatch, dt):
    """Back-substitution with the rows as the last axis (the vector
    convolution's input gradient) gives the bounds of rows, through an
    elementwise map, dilated and strided convolutions with uneven pads,
    dense layers and ReLUs, on 1 and 2 threads, into kept buffers and
    fresh arrays; and so do whole bound computations."""
    from cypool.verify import _crown
    from cypool.verify._net import Conv, Dense, Elementwise, Reshape

    el = Elementwise(rng.uniform(0.5, 2, (2, 9, 8)), rng.standard_normal((2, 9, 8)))
    c1 = Conv(rng.standard_normal((4, 2, 3, 3)), rng.standard_normal(4), (2, 9, 8), (1, 1), (2, 1, 0, 2), (2, 2))
    c2 = Conv(rng.standard_normal((5, 4, 3, 2)), rng.standard_normal(5), c1.out_shape, (2, 1), (1, 0, 1, 1), (1, 1))
    n = int(np.prod(c2.out_shape))
    ops = [el, c1, ReLU(c1.out_shape), c2, ReLU(c2.out_shape), Reshape(c2.out_shape, (n,)),
           Dense(rng.standard_normal((40, n)) / 4, rng.standard_normal(40)), ReLU((40,)),
           Dense(rng.standard_normal((36, 40)), rng.standard_normal(36))]
    net = verify.Net(ops, (2, 9, 8), np.float64).astype(dt)
    lo = rng.standard_normal(net.n_inputs) - 0.5
    hi = lo + rng.uniform(0, 0.5, lo.size)
    lo, hi = lo.astype(dt), hi.astype(dt)
    pre, relax, ch = _crown.bounds(net, lo, hi)
    tol = dict(rtol=1e-4, atol=1e-3) if dt == np.float32 else dict(rtol=1e-11, atol=1e-11)
    for K in (1, 33):
        A = rng.standard_normal((K, 36)).astype(dt)
        want = _crown._backsub(net.ops, relax, A.copy(), lo, hi)
        for nt, buffers in ((1, None), (2, net.buffers), (2, None)):
            got = _crown._backsub(net.ops, relax, np.ascontiguousarray(A.T), lo, hi, nt=nt,
                                  buffers=buffers, cols=True)
            np.testing.assert_allclose(got, want, **tol)
    monkeypatch.setattr(_crown, "COLUMNS_MIN_ROWS", 10 ** 9)
    want = _crown.bounds(net, lo, hi)[0]
    C = rng.standard_normal((40, 36))
    want_out = output_lower(net, relax, ch, C, lo, hi)
    monkeypatch.setattr(_crown, "COLUMNS_MIN_ROWS", 1)
    got = _crown.bounds(net, lo, hi)[0]
    for i in want:
        # as rows, a neuron found dead below its layer stops there, its
        # upper bound below 0 and its lower bound the interval's
        live = want[i][1] > 0
        np.testing.assert_array_equal(got[i][1] > 0, live)
        for w, g in zip(want[i], got[i]):
            np.testing.assert_allclose(g[live], w[live], **tol)
    np.testing.assert_allclose(output_lower(net, relax, ch, C, lo, hi), want_out, **tol)


@pytest.mark.parametrize("min_rows", [1, 10 ** 9])
def test_output_corners_attain_an_affine_nets_lower_bounds(rng, monkeypatch, min_rows):
    """Without a ReLU the bound of each row is exact, and attained at the
    corner output_lower returns for it: as rows and as columns."""
    from cypool.verify import _crown
    from cypool.verify._net import Conv, Dense, Reshape

    monkeypatch.setattr(_crown, "COLUMNS_MIN_ROWS", min_rows)
    c1 = Conv(rng.standard_normal((3, 2, 3, 3)), rng.standard_normal(3), (2, 7, 6), (2, 1), (1, 0, 1, 1), (1, 1))
    n = int(np.prod(c1.out_shape))
    net = verify.Net([c1, Reshape(c1.out_shape, (n,)), Dense(rng.standard_normal((4, n)), rng.standard_normal(4))],
                     (2, 7, 6), np.float64)
    lo = rng.standard_normal(net.n_inputs)
    hi = lo + rng.uniform(0, 1, lo.size)
    C = rng.standard_normal((40, 4))
    _, relax, ch = _crown.bounds(net, lo, hi)
    lb, corners = output_lower(net, relax, ch, C, lo, hi, inputs=True)
    np.testing.assert_array_equal(lb, output_lower(net, relax, ch, C, lo, hi))
    assert corners.shape == (40, net.n_inputs) and ((corners == lo) | (corners == hi)).all()
    at = np.einsum("kj,kj->k", net.forward(corners), C)
    np.testing.assert_allclose(at, lb, rtol=1e-9, atol=1e-9)
    assert (at >= lb).all()


def test_columns_are_chosen_for_many_rows_through_a_convolution():
    from cypool.verify import _crown
    from cypool.verify._net import Conv, Dense

    conv = Conv(np.ones((2, 1, 3, 3)), np.zeros(2), (1, 5, 5), (1, 1), (0, 0, 0, 0), (1, 1))
    dense = Dense(np.ones((3, 4)), np.zeros(3))
    K = _crown.COLUMNS_MIN_ROWS
    assert _crown.as_columns([conv, ReLU(conv.out_shape)], K)
    assert not _crown.as_columns([conv, ReLU(conv.out_shape)], K - 1)
    assert not _crown.as_columns([dense, ReLU((3,))], 10 * K)


def test_attack_violations_match_a_loop_over_disjuncts(rng):
    """The stacked disjuncts give, per point, the least over disjuncts of
    the largest A y - b, and its first row, as a plain loop does (ties
    included)."""
    from cypool.verify._check import _Rows

    for trial in range(20):
        n_out = int(rng.integers(2, 6))
        disjuncts = []
        for _ in range(int(rng.integers(1, 5))):
            m = int(rng.integers(1, 4))
            disjuncts.append((rng.integers(-2, 3, (m, n_out)).astype(float),
                              rng.integers(-1, 2, m).astype(float)))
        Y = rng.integers(-2, 3, (7, n_out)).astype(float)  # small integers: many ties
        v, rows = _Rows(disjuncts).violations(Y)
        for p, y in enumerate(Y):
            best, row = np.inf, None
            for A, b in disjuncts:
                vals = A @ y - b
                j = int(np.argmax(vals))
                if vals[j] < best:
                    best, row = vals[j], A[j]
            assert v[p] == best
            np.testing.assert_array_equal(rows[p], row)


def test_trace_and_backward_give_the_gradient(tmp_path, rng):
    """Net.gradient (trace, then backward) against central differences, on
    a net with normalisation, a convolution, batch norm and pooling."""
    net = verify.load_onnx(conv_model(tmp_path / "c.onnx", rng))
    x = rng.standard_normal((3, net.n_inputs))
    g = rng.standard_normal((3, net.n_outputs))
    grad = net.gradient(x, g)
    assert grad.shape == x.shape
    Y, masks = net.trace(x)
    np.testing.assert_array_equal(Y, net.forward(x))
    h = 1e-6
    for i in rng.choice(net.n_inputs, 6, replace=False):
        e = np.zeros(net.n_inputs)
        e[i] = h
        fd = ((net.forward(x + e) - net.forward(x - e)) * g).sum(axis=1) / (2 * h)
        np.testing.assert_allclose(grad[:, i], fd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_conv_op_matches_the_reference(rng, dt):
    """The verify net's convolution (the engine's plans, made once per batch
    size) and its transpose, against the loop reference: strides, dilation,
    uneven pads, stride-1 small calls, batches of 1 to 5, strided inputs, a
    pickle of the op, its absolute-value form (radius)."""
    import pickle as pkl
    from cypool.verify._net import Conv

    tol = dict(rtol=1e-4, atol=1e-4) if dt == np.float32 else dict(rtol=1e-11, atol=1e-11)
    for trial in range(8):
        C, O = rng.integers(1, 5, 2)
        H, W = rng.integers(5, 12, 2)
        kh, kw = rng.integers(1, 4, 2)
        stride = tuple(int(v) for v in rng.integers(1, 3, 2))
        dil = tuple(int(v) for v in rng.integers(1, 3, 2))
        pads = tuple(int(v) for v in rng.integers(0, 3, 4))
        w = rng.standard_normal((O, C, kh, kw)).astype(dt)
        op = Conv(w, rng.standard_normal(O).astype(dt), (C, H, W), stride, pads, dil)
        pad = ((pads[0], pads[2]), (pads[1], pads[3]))
        for n in (1, int(rng.integers(2, 6)), 1):
            for o in (op, pkl.loads(pkl.dumps(op))):
                X = rng.standard_normal((n, C, H, 2 * W)).astype(dt)[..., ::2]  # a strided view
                want = ref.conv2d(X, w, None, stride, pad, dil)
                np.testing.assert_allclose(o.apply(X), want + o.bias, **tol)
                np.testing.assert_allclose(o.radius(X), ref.conv2d(X, np.abs(w), None, stride, pad, dil), **tol)
                A = rng.standard_normal((n,) + o.out_shape).astype(dt)
                gx, _, _ = ref.conv2d_backward(A, X, w, stride, pad, dil)
                np.testing.assert_allclose(o.T(A), gx, **tol)


def test_astype_is_made_once(tmp_path, rng):
    net = verify.load_onnx(random_dense_net(tmp_path, rng, (4, 6, 3)), dtype=np.float32)
    assert net.astype(np.float32) is net
    f64 = net.astype(np.float64)
    assert f64 is net.astype("float64") and f64.dtype == np.float64
    np.testing.assert_array_equal(f64.ops[0].W, net.ops[0].W.astype(np.float64))


def test_with_threads_is_made_once(tmp_path, rng):
    """check(num_threads=n) reuses one net per n, and so its kept buffers."""
    net = verify.load_onnx(random_dense_net(tmp_path, rng, (4, 6, 3)))
    two = net.with_threads(2)
    assert two is net.with_threads(2) and two.num_threads == 2
    assert net.with_threads(None) is net.with_threads(None) is not two
    np.testing.assert_array_equal(two.forward(np.ones(4)), net.forward(np.ones(4)))
    with pytest.raises(ValueError, match="num_threads"):
        net.with_threads(0)
    with pytest.raises(TypeError, match="num_threads"):
        net.with_threads("2")


def test_attack_stops_when_steps_gain_too_little(tmp_path, rng, monkeypatch):
    """patience steps in a row that lower the least violation by no more
    than min_gain of its size end the attack; a step that gains more
    resets the count."""
    from cypool.verify import _check

    net = verify.load_onnx(random_dense_net(tmp_path, rng, (4, 6, 3)))
    spec = robustness_spec(np.zeros(4), np.ones(4), 0, 3)
    script = iter([1.0, 0.99, 0.5, 0.499, 0.498, 0.497, 0.496, 0.495])
    seen = []

    def scripted(self, Y):
        v = next(script)
        seen.append(v)
        return np.full(len(Y), v), np.tile(self.A[0], (len(Y), 1))

    monkeypatch.setattr(_check._Rows, "violations", scripted)
    assert _check.attack(net, spec, steps=7, points=2, patience=2, min_gain=0.02) is None
    assert seen == [1.0, 0.99, 0.5, 0.499, 0.498]  # 0.99: stale 1; 0.5 resets; then 2 stale
    seen.clear()
    script = iter([1.0, 0.99, 0.5, 0.499, 0.498, 0.497, 0.496, 0.495])
    assert _check.attack(net, spec, steps=7, points=2, patience=2) is None
    assert seen == [1.0, 0.99, 0.5, 0.499, 0.498, 0.497, 0.496, 0.495]  # each one lower: no stop


def test_attacks_stop_where_their_pace_cannot_reach_zero(tmp_path, rng, monkeypatch):
    """reach: the attack stops once the least violation would stay above 0
    after the steps left, falling at each as much per unit of step size as
    at the last step ("last"; a rise stops it at once; after the first
    step, as much as at it), or by its mean fall since the first trace
    ("mean"); check's attack before the bounds runs with "last", from the
    box's centre, and the one after with "mean"."""
    from cypool.verify import _check

    net = verify.load_onnx(random_dense_net(tmp_path, rng, (4, 6, 3)))
    spec = robustness_spec(np.zeros(4), np.ones(4), 0, 3)
    (_, rows), = _check._checked_specs(net, spec)
    seen = []

    def scripted(values):
        values = iter(values)

        def violations(self, Y):
            seen.append(next(values))
            return np.full(len(Y), seen[-1]), np.tile(self.A[0], (len(Y), 1))
        monkeypatch.setattr(_check._Rows, "violations", violations)

    def run(reach):
        seen.clear()
        X = _check._starts(spec, 2, 0)
        return _check._attack(net, spec, rows, X, 5, None, 9, 0.0, reach=reach)

    sizes = np.array([_check._step(k, 5) for k in range(5)])
    assert sizes[0] == 0.25 and np.isclose(sizes[-1], 0.02) and (np.diff(sizes) < 0).all()
    # falls in proportion to the steps' sizes, 1.001 in all: "last" sees 0 in reach throughout
    steady = list(1 - 1.001 * np.cumsum(np.r_[0, sizes[:-1]]) / sizes.sum()) + [0.01]
    # the same, but the third step falls half as far: its pace leaves 0 out of reach
    slower = steady[:3] + [steady[2] - 0.5 * (steady[2] - steady[3])] + [0.02, 0.01]
    # "last": 0.25 in 4 steps left reaches 0.75; then 0.25 by a step of 0.133 reaches 0.24 more
    paced = [1.0, 0.75, 0.5, 0.375, 0.25, 0.125]
    first = [1.0, 0.9, 0.5, 0.375, 0.25, 0.125]  # 0.1 in 4 steps left: 0.4
    # mean falls 0.25, 0.25, 0.208, 0.1875: 0.25 stays above 0 at 0.1875 for 1 step
    for values, reach, want in ((steady, "last", steady), (slower, "last", slower[:4]),
                                (paced, "last", paced[:3]), (first, "last", first[:2]),
                                (paced, "mean", paced[:5]), (paced, None, paced)):
        scripted(values)
        assert run(reach) is None and seen == want
    rise = [1.0, 1.125, 0.5, 0.375, 0.25, 0.125]
    for reach, want in (("last", rise[:2]), ("mean", rise[:2])):  # mean: no fall yet
        scripted(rise)
        assert run(reach) is None and seen == want
    late = [1.0, 0.5, 0.55, 0.3, 0.15, 0.05]  # a rise after a fall: "mean" goes on
    for reach, want in (("last", late[:3]), ("mean", late)):
        scripted(late)
        assert run(reach) is None and seen == want
    even = [1.25, 1.0, 0.75, 0.5, 0.25, 0.125]  # the mean pace just reaches 0 by the last step
    scripted(even)
    assert run("mean") is None and seen == even

    monkeypatch.undo()
    calls = []  # attacks that find nothing: check runs both, the first from the centre alone
    monkeypatch.setattr(_check, "_attack", lambda *a, **k: calls.append((a[3], k.get("reach"))))
    assert verify.check(net, spec).status == "unknown"
    assert [reach for _, reach in calls] == ["last", "mean"]
    np.testing.assert_array_equal(calls[0][0], [(spec.lower + spec.upper) / 2])


def test_products_of_few_rows_are_matmuls(rng):
    """_net.product, row by row for 2 or 3 rows by a large matrix, gives
    np.matmul's values (each row's sums are gemv's, gemm's up to rounding),
    into out or a fresh array, for 1-D and 2-D left operands."""
    from cypool.verify._net import FEW_ROWS_MIN_SIZE, product

    B = rng.standard_normal((300, FEW_ROWS_MIN_SIZE // 300 + 1))
    for n in range(1, 6):
        A = rng.standard_normal((n, 300))
        out = np.full((n, B.shape[1]), np.nan)
        np.testing.assert_allclose(product(A, B), A @ B, rtol=1e-13, atol=1e-13)
        assert product(A, B, out) is out
        np.testing.assert_allclose(out, A @ B, rtol=1e-13, atol=1e-13)
        np.testing.assert_allclose(product(A.T[:2].copy(), B[:n]), A.T[:2] @ B[:n], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(product(A[0], B), A[0] @ B, rtol=1e-13, atol=1e-13)
