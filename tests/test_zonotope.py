"""cypool.zonotope (DeepZ) against the neuron-by-neuron float64 reference in
reference.py, on random shapes and dtypes; soundness by sampling and by an
attack; the bad-input battery; the numpy layers it certifies."""
import numpy as np
import pytest

import cypool
import reference as ref
from cypool import _checks as chk
from cypool import _geometry as geo
from cypool.zonotope import _fused as fused
from cypool.zonotope import _network as N
from cypool.zonotope import _ops as zops
from cypool import zonotope as Z
from helpers import torch_or_skip

DTYPES = [np.float32, np.float64]


def tol(dt):
    return dict(rtol=1e-4, atol=1e-4) if dt == np.float32 else dict(rtol=1e-10, atol=1e-10)


def random_zonotope(rng, shape, E, dt, spread=1.0):
    """Centres around 0 and generators small enough that neurons are a mix
    of dead, stable and unstable ones."""
    z = rng.standard_normal(shape + (E,)) * spread / np.sqrt(E)
    z[..., 0] = rng.standard_normal(shape) * spread
    flat = z.reshape(-1, E)
    if len(flat) >= 3 and E > 1:  # one dead, one stable, one unstable neuron at least
        r = np.abs(flat[:3, 1:]).sum(axis=1)
        flat[:3, 0] = [-r[0] - 0.1, r[1] + 0.1, 0.0]
    return z.astype(dt)


# --- from_box ----------------------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES)
def test_from_box_matches_reference(rng, dt):
    for shape in [(7,), (1, 5, 5), (3, 4, 6), (2, 2, 3, 3)]:
        x = rng.random(shape)
        x.flat[: x.size // 4] = 0.0  # clipped at the low end
        x.flat[-(x.size // 4):] = 1.0  # and at the high end
        eps = rng.choice([0.0, 0.01, 0.3], size=shape)  # zero-width boxes too
        z = Z.from_box(x, eps, dtype=dt)
        want = ref.zono_from_box(x, eps, (0.0, 1.0))
        assert z.dtype == dt and z.shape == want.shape
        np.testing.assert_allclose(z, want, **tol(dt))
        lo, up = Z.bounds(z)
        np.testing.assert_allclose(lo, np.maximum(x - eps, 0), **tol(dt))
        np.testing.assert_allclose(up, np.minimum(x + eps, 1), **tol(dt))


def test_from_box_scalar_eps_no_clip_and_points(rng):
    x = rng.standard_normal((2, 3, 3)) * 3
    z = Z.from_box(x, 0.5, clip=None)
    assert z.shape == (2, 3, 3, 1 + x.size)
    np.testing.assert_array_equal(z[..., 0], ((x - 0.5) + (x + 0.5)) / 2)  # the midpoint
    np.testing.assert_allclose(z[..., 0], x, rtol=1e-15, atol=1e-15)
    assert Z.from_box(x, 0.0, clip=None).shape == x.shape + (1,)  # every box a point
    # x on the clip edge with eps = 0 is a point too; outside by more than eps is empty
    assert Z.from_box(np.array([1.0, 0.5]), np.array([0.0, 0.1])).shape == (2, 2)


# --- bounds ------------------------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES)
def test_bounds_matches_reference(rng, dt):
    for shape, E in [((5,), 1), ((3, 4, 4), 9), ((2, 3, 5), 40), ((300,), 333), ((64, 64), 20)]:
        z = random_zonotope(rng, shape, E, dt)
        lo, up = Z.bounds(z)
        rlo, rup = ref.zono_bounds(z)
        assert lo.shape == shape and lo.dtype == dt
        np.testing.assert_allclose(lo, rlo, **tol(dt))
        np.testing.assert_allclose(up, rup, **tol(dt))
    z = random_zonotope(rng, (6, 7), 31, dt)
    view = z[::2, ::-1, 1:]  # non-contiguous, and without the first generator's... centre
    np.testing.assert_allclose(Z.bounds(view)[0], ref.zono_bounds(np.ascontiguousarray(view))[0], **tol(dt))


def test_bounds_threads_agree(rng):
    z = random_zonotope(rng, (40, 30), 150, np.float64)
    one = Z.bounds(z, num_threads=1)
    two = Z.bounds(z, num_threads=2)
    np.testing.assert_array_equal(one[0], two[0])
    np.testing.assert_array_equal(one[1], two[1])


# --- relu --------------------------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES)
def test_relu_matches_reference(rng, dt):
    for shape, E in [((4,), 3), ((3, 5, 5), 12), ((2, 6, 6), 50), ((500,), 200), ((16, 13, 13), 20)]:
        z = random_zonotope(rng, shape, E, dt)
        lo, up = ref.zono_bounds(z)
        assert (up <= 0).any() and (lo >= 0).any() and ((lo < 0) & (up > 0)).any()
        out = Z.relu(z)
        want = ref.zono_relu(z)
        assert out.shape == want.shape and out.dtype == dt and out.flags.c_contiguous
        np.testing.assert_allclose(out, want, **tol(dt))


def test_relu_new_generators_in_neuron_order(rng):
    z = random_zonotope(rng, (3, 4, 4), 6, np.float64)
    lo, up = ref.zono_bounds(z)
    unstable = np.flatnonzero(((lo < 0) & (up > 0)).ravel())
    out = Z.relu(z).reshape(-1, 6 + len(unstable))
    for k, i in enumerate(unstable):  # component 6 + k belongs to the k-th unstable neuron
        col = out[:, 6 + k]
        assert np.flatnonzero(col).tolist() == [i]
        assert col[i] > 0


def test_relu_edge_cases(rng):
    z = random_zonotope(rng, (10,), 5, np.float64)
    z[:, 1:] = 0  # no generators: bounds are points, nothing unstable
    np.testing.assert_array_equal(Z.relu(z), np.where(z[:, :1] > 0, z, 0))
    one = np.array([[0.5], [-0.5], [0.0]])  # E = 1
    np.testing.assert_array_equal(Z.relu(one), [[0.5], [0.0], [0.0]])
    dead = np.array([[-1.0, 0.5, 0.5]])  # u == 0 exactly: dead
    np.testing.assert_array_equal(Z.relu(dead), np.zeros((1, 3)))
    edge = np.array([[1.0, 0.5, 0.5]])  # l == 0 exactly: stable
    np.testing.assert_array_equal(Z.relu(edge), edge)
    views = random_zonotope(rng, (8, 9), 30, np.float64)[::2, :, ::3]
    np.testing.assert_allclose(Z.relu(views), ref.zono_relu(np.ascontiguousarray(views)), rtol=1e-12)


def test_relu_threads_agree(rng):
    z = random_zonotope(rng, (8, 20, 20), 30, np.float64)
    np.testing.assert_array_equal(Z.relu(z, num_threads=1), Z.relu(z, num_threads=2))


# --- linear, flatten, certify ------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES)
def test_linear_matches_reference(rng, dt):
    z = random_zonotope(rng, (20,), 9, dt)
    w = rng.standard_normal((7, 20)).astype(dt)
    b = rng.standard_normal(7).astype(dt)
    np.testing.assert_allclose(Z.linear(z, w, b), ref.zono_linear(z, w, b), **tol(dt))
    np.testing.assert_allclose(Z.linear(z, w), ref.zono_linear(z, w, None), **tol(dt))
    batch = random_zonotope(rng, (3, 20), 9, dt)
    got = Z.linear(batch, w, b)
    assert got.shape == (3, 7, 9)
    for n in range(3):
        np.testing.assert_allclose(got[n], ref.zono_linear(batch[n], w, b), **tol(dt))
    out = np.empty((7, 9), dt)
    assert Z.linear(z, w, b, out=out) is out
    np.testing.assert_allclose(out, ref.zono_linear(z, w, b), **tol(dt))


def test_linear_and_flatten_match_torch(rng):
    torch = torch_or_skip()
    z = random_zonotope(rng, (4, 3, 3), 11, np.float64)
    w = rng.standard_normal((5, 36))
    b = rng.standard_normal(5)
    # torch: generators first, the bias on the centre only
    tz = torch.from_numpy(np.moveaxis(z, -1, 0)).flatten(1)
    want = torch.nn.functional.linear(tz, torch.from_numpy(w)).numpy().T.copy()
    want[:, 0] += b
    np.testing.assert_allclose(Z.linear(Z.flatten(z), w, b), want, rtol=1e-12, atol=1e-12)
    assert Z.flatten(z[None]).shape == (1, 36, 11)


def test_certify_matches_reference(rng):
    for K in (2, 10):
        z = random_zonotope(rng, (K,), 15, np.float64, spread=3)
        for label in range(K):
            ok, m = Z.certify(z, label, return_margins=True)
            want = ref.zono_margins(z, label)
            np.testing.assert_allclose(m, want, rtol=1e-12)
            assert ok == bool((want > 0).all()) and Z.certify(z, label) == ok
    # a clear winner is certified; a batch gives one answer per zonotope
    z = np.zeros((3, 4))
    z[1, 0] = 5
    z[:, 1:] = 0.1 * rng.standard_normal((3, 3))
    assert Z.certify(z, 1) is True and Z.certify(z, 0) is False
    oks, ms = Z.certify(np.stack([z, z]), np.array([1, 0]), return_margins=True)
    assert oks.tolist() == [True, False] and ms.shape == (2, 3)
    assert np.isinf(ms[0, 1]) and np.isinf(ms[1, 0])


# --- the whole network -------------------------------------------------------

def small_net(rng, dt=np.float64):
    """A small ConvSmall-like stack as reference layers and as cypool dicts."""
    w1 = rng.standard_normal((4, 2, 3, 3)) * 0.5
    b1 = rng.standard_normal(4) * 0.1
    w2 = rng.standard_normal((6, 4 * 4 * 4)) * 0.3
    b2 = rng.standard_normal(6) * 0.1
    w3 = rng.standard_normal((3, 6)) * 0.5
    b3 = np.array([0.5, 0.0, -0.2])
    layers = [("conv", w1, b1, 2, 1), ("relu",), ("flatten",), ("linear", w2, b2), ("relu",),
              ("linear", w3, b3)]
    dicts = [{"weight": w1.astype(dt), "bias": b1.astype(dt), "stride": 2, "padding": 1}, "relu",
             "flatten", {"weight": w2.astype(dt), "bias": b2.astype(dt)}, "relu",
             {"weight": w3.astype(dt), "bias": b3.astype(dt)}]
    return layers, dicts


def test_network_matches_reference(rng):
    verified = 0
    for trial in range(6):
        layers, dicts = small_net(rng)
        net = Z.Network.from_layers(dicts)
        for eps in (0.0, 0.01, 0.05, 0.2):
            x = rng.random((2, 8, 8))
            x[0, 0, :3] = [0.0, 1.0, 0.999]  # clipped at both ends
            label = int(np.argmax(net.predict(x)))
            want_ok, want_m = ref.deepz_certify(x, eps, layers, label)
            ok, m = net.certify(x, eps, label, return_margins=True)
            assert ok == want_ok
            np.testing.assert_allclose(m, want_m, rtol=1e-9, atol=1e-9)
            verified += ok
    assert 0 < verified < 24  # the cases exercise both answers


def test_network_forward_is_not_the_workspace(rng):
    _, dicts = small_net(rng)
    net = Z.Network.from_layers(dicts)
    z = Z.from_box(rng.random((2, 8, 8)), 0.05)
    a = net(z)
    b = net(Z.from_box(rng.random((2, 8, 8)), 0.1))
    assert not np.may_share_memory(a, b)
    np.testing.assert_array_equal(a, net(z))


def test_network_from_cypool_layers_and_torch(rng):
    conv = cypool.Conv2d(2, 4, 3, stride=2, padding=1, rng=1)
    lin1, lin2 = cypool.Linear(64, 6, rng=2), cypool.Linear(6, 3, rng=3)
    stack = [conv, cypool.ReLU(), cypool.Flatten(), lin1, cypool.ReLU(), lin2]
    x = rng.random((2, 8, 8)).astype(np.float32)
    net = Z.Network.from_layers(stack)
    assert net.layers[0].weight.dtype == np.float64
    # the point zonotope runs the network itself
    want = x
    for layer in stack:
        want = layer.eval().forward(want)
    np.testing.assert_allclose(net.predict(x), want, rtol=1e-5, atol=1e-5)
    # the flatten is inferred when left out
    net2 = Z.Network.from_layers([conv, "relu", lin1, "relu", lin2], dtype=np.float32)
    assert isinstance(net2.layers[2], cypool.VectorFlatten)
    z = Z.from_box(x, 0.02, dtype=np.float32)
    np.testing.assert_allclose(net2(z), net(z.astype(np.float64)), rtol=1e-4, atol=1e-4)
    torch = pytest.importorskip("torch")
    seq = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, stride=2, padding=1), torch.nn.ReLU(),
                              torch.nn.Flatten(), torch.nn.Sequential(torch.nn.Linear(64, 6), torch.nn.ReLU()),
                              torch.nn.Linear(6, 3)).double()
    tnet = Z.Network.from_layers(seq)
    with torch.no_grad():
        want = seq(torch.from_numpy(x.astype(np.float64))[None]).numpy()[0]
    np.testing.assert_allclose(tnet.predict(x), want, rtol=1e-10, atol=1e-10)


# --- soundness ---------------------------------------------------------------

def concrete_layers(x, layers):
    """Every layer's output on the point x (float64)."""
    outs = []
    for layer in layers:
        kind = layer[0]
        if kind == "conv":
            _, w, b, s, p = layer
            x = ref.conv2d(x[None], w, b, (s, s), ((p, p), (p, p)), (1, 1))[0]
        elif kind == "relu":
            x = np.maximum(x, 0)
        elif kind == "flatten":
            x = x.reshape(-1)
        else:
            x = layer[1] @ x + layer[2]
        outs.append(x)
    return outs


def test_sound_by_sampling(rng):
    layers, dicts = small_net(rng)
    net = Z.Network.from_layers(dicts)
    for eps in (0.02, 0.1):
        x = rng.random((2, 8, 8))
        z = Z.from_box(x, eps)
        zs = []
        for layer in net.layers:
            z = layer.forward(z)
            zs.append(z)
        label = int(np.argmax(net.predict(x)))
        certified = net.certify(x, eps, label)
        lo_box, hi_box = np.maximum(x - eps, 0), np.minimum(x + eps, 1)
        for k in range(300):
            if k < 20:  # corners of the box
                p = np.where(rng.random(x.shape) < 0.5, lo_box, hi_box)
            else:
                p = rng.uniform(lo_box, hi_box)
            for out, zk in zip(concrete_layers(p, layers), zs):
                lo, up = Z.bounds(zk)
                assert (out >= lo - 1e-9).all() and (out <= up + 1e-9).all()
            if certified:
                assert int(np.argmax(out)) == label


def test_certified_images_resist_an_attack(rng):
    """PGD on the margin with cypool's own layers' gradients: a certified
    image is never flipped, and every attack point stays inside the bounds."""
    conv = cypool.Conv2d(1, 4, 3, stride=2, padding=1, dtype=np.float64, rng=5)
    lin1 = cypool.Linear(64, 8, dtype=np.float64, rng=6)
    lin2 = cypool.Linear(8, 3, dtype=np.float64, rng=7)
    stack = [conv, cypool.ReLU(), cypool.Flatten(), lin1, cypool.ReLU(), lin2]
    net = Z.Network.from_layers(stack)
    certified_seen = 0
    for _ in range(8):
        x = rng.random((1, 8, 8))
        label = int(np.argmax(net.predict(x)))
        for eps in (0.01, 0.05, 0.15):
            ok = net.certify(x, eps, label)
            lo, up = Z.bounds(net(Z.from_box(x, eps)))
            certified_seen += ok
            lo_box, hi_box = np.maximum(x - eps, 0), np.minimum(x + eps, 1)
            for target in range(3):
                if target == label:
                    continue
                p = x.copy()
                for _ in range(10):
                    h = p[None]
                    for layer in stack:
                        h = layer.train().forward(h)
                    g = np.zeros_like(h)
                    g[0, target], g[0, label] = 1.0, -1.0  # ascend logit[target] - logit[label]
                    for layer in reversed(stack):
                        g = layer.backward(g) if layer is not conv else conv.backward(g)
                    p = np.clip(p + 0.25 * eps * np.sign(g[0]), lo_box, hi_box)
                    logits = net.predict(p)
                    assert (logits >= lo - 1e-9).all() and (logits <= up + 1e-9).all()
                    if ok:
                        assert int(np.argmax(logits)) == label
    assert certified_seen > 0


# --- bad input ---------------------------------------------------------------

@pytest.mark.parametrize("call, err, words", [
    (lambda: Z.from_box(np.array([np.nan, 0.5]), 0.1), ValueError, "x must be finite"),
    (lambda: Z.from_box(np.ones(3), np.inf), ValueError, "eps must be finite"),
    (lambda: Z.from_box(np.ones(3), -0.1), ValueError, "eps must be >= 0"),
    (lambda: Z.from_box(np.ones(3), np.ones(4)), ValueError, "eps of shape"),
    (lambda: Z.from_box(np.ones(3), 0.1, clip=(1.0, 0.0)), ValueError, "clip must be in order"),
    (lambda: Z.from_box(np.ones(3), 0.1, clip=(0.0,)), ValueError, "clip"),
    (lambda: Z.from_box(np.ones(3), 0.1, clip=(0.0, np.nan)), ValueError, "clip must be finite"),
    (lambda: Z.from_box(np.full(3, 2.0), 0.1), ValueError, "outside clip"),
    (lambda: Z.from_box(np.ones(3), 0.1, dtype=np.int32), TypeError, "dtype"),
    (lambda: Z.from_box(np.ones(3, bool), 0.1), TypeError, "x must be real"),
    (lambda: Z.from_box(np.float64(0.5), 0.1), ValueError, "x must have"),
    (lambda: Z.bounds(np.ones((3, 2), np.int64)), TypeError, "z must be float32 or float64"),
    (lambda: Z.bounds(np.ones((3, 0))), ValueError, "empty"),
    (lambda: Z.bounds(np.ones(3), num_threads=0), ValueError, "num_threads"),
    (lambda: Z.relu(np.array([[np.inf, 1.0]])), ValueError, "not finite"),
    (lambda: Z.relu(np.array([[0.0, np.nan]])), ValueError, "not finite"),
    (lambda: Z.linear(np.ones((4, 3)), np.ones((2, 5))), ValueError, "weight has 5 input features"),
    (lambda: Z.linear(np.ones((2, 2, 2, 3)), np.ones((2, 8))), ValueError, "z must have 2 or 3"),
    (lambda: Z.linear(np.ones((4, 3)), np.ones((2, 4), np.float32)), TypeError, "weight dtype"),
    (lambda: Z.linear(np.ones((4, 3)), np.ones((2, 4)), np.ones(3)), ValueError, "bias must have shape"),
    (lambda: Z.linear(np.ones((4, 3)), np.ones((2, 4)), out=np.ones((2, 4))), ValueError, "out must have"),
    (lambda: Z.flatten(np.ones((3, 3))), ValueError, "z must have 4 or 5"),
    (lambda: Z.certify(np.ones((3, 2)), 3), ValueError, "label must be in [0, 3)"),
    (lambda: Z.certify(np.ones((3, 2)), -1), ValueError, "label must be in"),
    (lambda: Z.certify(np.ones((3, 2)), True), TypeError, "label must be an integer"),
    (lambda: Z.certify(np.ones((3, 2)), 1.0), TypeError, "label must be an integer"),
    (lambda: Z.certify(np.ones((2, 3, 2)), 1), ValueError, "label must be 2 integers"),
    (lambda: Z.certify(np.array([[1.0, np.nan], [0.0, 0.0]]), 0), ValueError, "z_logits must be finite"),
    (lambda: Z.certify(np.ones(3), 0), ValueError, "z_logits must have 2 or 3"),
    (lambda: Z.Network.from_layers(["relu", "softmax"]), ValueError, "layers[1]: unknown layer name"),
    (lambda: Z.Network.from_layers([object()]), TypeError, "layers[0]: cannot certify"),
    (lambda: Z.Network.from_layers("relu"), TypeError, "layers must be"),
    (lambda: Z.Network.from_layers([{"weight": np.ones((2, 3)), "stride": 2}]), ValueError, "stride"),
    (lambda: Z.Network.from_layers([{"bias": np.ones(2)}]), ValueError, "needs a 'weight'"),
    (lambda: Z.Network.from_layers([{"weight": np.ones((2, 3)), "bias": np.ones(3)}]), ValueError,
     "layers[0]: bias must have shape (2,)"),
    (lambda: Z.Network.from_layers([cypool.Conv2d(1, 2, 2, padding="same")]), ValueError, "not symmetric"),
    (lambda: Z.Network.from_layers(["relu"], dtype=np.float16), TypeError, "dtype"),
    (lambda: Z.Network([object()]), TypeError, "layers[0] has no forward"),
])
def test_bad_input(call, err, words):
    with pytest.raises(err, match=None) as info:
        call()
    assert words in str(info.value)


def test_network_bad_input_names_the_parameter(rng):
    _, dicts = small_net(rng)
    net = Z.Network.from_layers(dicts)
    with pytest.raises(ValueError, match="x must be finite"):
        net.certify(np.full((2, 8, 8), np.nan), 0.1, 0)
    with pytest.raises(ValueError, match="label must be in"):
        net.certify(rng.random((2, 8, 8)), 0.1, 3)
    with pytest.raises(ValueError, match="input channels"):
        net.certify(rng.random((3, 8, 8)), 0.1, 0)


# --- the numpy layers that train what is certified ---------------------------

def test_dense_layers_match_torch(rng):
    torch = torch_or_skip()
    x = rng.standard_normal((5, 12)).astype(np.float64)
    lin = cypool.Linear(12, 7, dtype=np.float64, rng=0)
    relu, flat = cypool.ReLU(), cypool.Flatten()
    tl = torch.nn.Linear(12, 7).double()
    tl.weight.data, tl.bias.data = torch.from_numpy(lin.weight), torch.from_numpy(lin.bias)
    tx = torch.from_numpy(x).requires_grad_()
    ty = torch.relu(tl(tx))
    g = rng.standard_normal((5, 7))
    ty.backward(torch.from_numpy(g))
    y = relu.forward(lin.forward(x))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12)
    gx = lin.backward(relu.backward(g))
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(lin.grad_weight, tl.weight.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(lin.grad_bias, tl.bias.grad.numpy(), rtol=1e-12)
    img = rng.standard_normal((2, 3, 4, 4))
    f = flat.forward(img)
    assert f.shape == (2, 48)
    np.testing.assert_array_equal(flat.backward(f), img)
    assert cypool.Linear(3, 2).forward(np.ones(3, np.float32)).shape == (2,)


def test_vector_linear_backward_matches_finite_differences(rng):
    layer = cypool.VectorLinear(6, 4, dtype=np.float64, rng=0)
    z = rng.standard_normal((2, 6, 5))
    g = rng.standard_normal((2, 4, 5))
    layer.forward(z)
    gz = layer.backward(g)
    f = lambda w, b, zz: float((Z.linear(zz, w, b) * g).sum())  # noqa: E731
    h = 1e-6
    dw = np.zeros_like(layer.weight)
    for i in np.ndindex(dw.shape):
        w2 = layer.weight.copy()
        w2[i] += h
        dw[i] = (f(w2, layer.bias, z) - f(layer.weight, layer.bias, z)) / h
    np.testing.assert_allclose(layer.grad_weight, dw, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(layer.grad_bias, g[:, :, 0].sum(0), rtol=1e-12)
    np.testing.assert_allclose(gz, np.matmul(layer.weight.T, g), rtol=1e-12)


def test_layer_bad_input():
    with pytest.raises(ValueError, match="x has 4 features but the layer takes 3"):
        cypool.Linear(3, 2).forward(np.ones((2, 4), np.float32))
    with pytest.raises(TypeError, match="x dtype float64 must match"):
        cypool.Linear(3, 2).forward(np.ones((2, 3)))
    with pytest.raises(ValueError, match="in_features and out_features must be positive"):
        cypool.Linear(0, 2)
    with pytest.raises(TypeError, match="in_features must be an integer"):
        cypool.VectorLinear(2.0, 2)
    lin = cypool.Linear(3, 2)
    lin.forward(np.ones((2, 3), np.float32))
    with pytest.raises(ValueError, match="grad_output must have shape"):
        lin.backward(np.ones((2, 3), np.float32))
    with pytest.raises(RuntimeError, match="needs a forward pass"):
        cypool.ReLU().backward(np.ones(3))
    with pytest.raises(ValueError, match="x must have 3 or 4"):
        cypool.Flatten().forward(np.ones((2, 2)))


# --- the fast paths ----------------------------------------------------------

@pytest.mark.parametrize("dt", DTYPES)
def test_linear_in_weight_blocks_and_threads(rng, dt, monkeypatch):
    """The dense product runs as blocks of output channels (forced small
    here) whose E the threads share: any split gives the reference."""
    z = random_zonotope(rng, (2, 37), 101, dt)  # E not a multiple of 48
    w = rng.standard_normal((23, 37)).astype(dt)
    b = rng.standard_normal(23).astype(dt)
    want = np.stack([ref.zono_linear(z[n], w, b) for n in range(2)])
    whole = Z.linear(z, w, b, num_threads=2)
    np.testing.assert_allclose(whole, want, **tol(dt))
    monkeypatch.setattr(zops, "DENSE_BLOCK_BYTES", 37 * 8 * dt().itemsize)  # blocks of 8 channels
    np.testing.assert_array_equal(Z.linear(z, w, b, num_threads=2), whole)
    np.testing.assert_array_equal(Z.linear(z, w, b, num_threads=1), whole)
    np.testing.assert_array_equal(Z.linear(z[:, ::-1][:, ::-1], w, b), whole)  # a view


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("O", [1, 3, 4, 10, 37])
def test_linear_leaves_out_zero_rows_exactly(rng, dt, O, monkeypatch):
    """The dense kernel multiplies, per block of E, only the rows of z that
    are not all zero there: dead neurons (whole rows), generators that miss
    a neuron (runs of zeros, some -0.0), at every alignment to the blocks.
    The result is the reference's, and bit for bit the product over every
    row (finite=False), with 1 and 2 threads, in one block of output
    channels and in several."""
    monkeypatch.setattr(zops, "SKIP_FROM_CHANNELS", 1)
    D, E = 53, 131
    z = random_zonotope(rng, (D,), E, dt)
    z[rng.random(D) < 0.4] = 0  # dead neurons
    for d in range(D):  # each row nonzero in one window of generators
        lo = int(rng.integers(0, E))
        z[d, :lo] = 0
        z[d, lo + int(rng.integers(0, 40)):] = 0
    z[5, 1:] = -0.0
    z[rng.random(z.shape) < 0.2] = 0
    w = rng.standard_normal((O, D)).astype(dt)
    b = rng.standard_normal(O).astype(dt)
    want = ref.zono_linear(z, w, b)
    every_row = np.empty((O, E), dt)
    zops.dense_into(z, w, b, every_row, 1, finite=False)
    for nt in (1, 2):
        got = Z.linear(z, w, b, num_threads=nt)
        np.testing.assert_allclose(got, want, **tol(dt))
        np.testing.assert_array_equal(got, every_row)
    monkeypatch.setattr(zops, "DENSE_BLOCK_BYTES", D * 8 * dt().itemsize)  # blocks of 8 channels
    np.testing.assert_array_equal(Z.linear(z, w, b, num_threads=2), every_row)
    np.testing.assert_array_equal(Z.linear(np.stack([z, z[::-1]]), w, b)[0], every_row)


def test_linear_on_random_shapes_writes_only_its_output(rng, monkeypatch):
    """Every end of E and of the output channels, listed rows or all of
    them, one or several channel blocks, batched or not, into a view of a
    wider array whose margin must stay as it was."""
    for trial in range(150):
        D, E, O, B = (int(v) for v in rng.integers(1, [40, 60, 40, 3]))
        dt = DTYPES[trial % 2]
        z = rng.standard_normal((B, D, E)).astype(dt)
        z[rng.random(z.shape) < 0.6] = 0
        w = rng.standard_normal((O, D)).astype(dt)
        b = rng.standard_normal(O).astype(dt) if trial % 3 else None
        monkeypatch.setattr(zops, "SKIP_FROM_CHANNELS", int(rng.integers(1, 20)))
        monkeypatch.setattr(zops, "DENSE_BLOCK_BYTES", int(rng.choice([1 << 20, D * 4 * 8])))
        wide = np.full((B, O + 2, E + 5), 7, dt)
        out = wide[:, 1:O + 1, 2:E + 2]
        if B == 1:
            Z.linear(z[0], w, b, out=np.ascontiguousarray(out[0]))  # the public path
            zops.dense_into(z[0], w, chk.bias_arg(b, O, np.dtype(dt)), out[0], int(rng.integers(1, 3)))
        else:
            zops.dense_into(z, w, chk.bias_arg(b, O, np.dtype(dt)), out, int(rng.integers(1, 3)))
        want = np.stack([ref.zono_linear(z[n], w, b) for n in range(B)])
        np.testing.assert_allclose(out, want, **tol(dt))
        wide[:, 1:O + 1, 2:E + 2] = 7
        assert (wide == 7).all()


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("stride, padding, dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2), ((2, 1), (0, 1), (1, 2))])
def test_vector_conv_leaves_out_zero_taps_exactly(rng, dt, stride, padding, dilation):
    """The certification path's convolution leaves out the input vectors
    that are all zero in a chunk of E (dead neurons), and the padding: the
    convolution over every tap, and the reference's; with a weight of inf,
    every tap again (inf * 0 is NaN)."""
    from cypool import _conv_engine as engine
    x = rng.standard_normal((1, 5, 9, 8, 61)).astype(dt)
    x[0, rng.random((5, 9, 8)) < 0.5] = 0  # dead neurons
    x[0, 1, 2, 3, 1:] = -0.0
    w = rng.standard_normal((6, 5, 3, 3)).astype(dt)
    b = rng.standard_normal(6).astype(dt)
    _, _, _, geom = geo.vector_conv_args(x, w, stride, padding, dilation)
    shape = (1, 6, geom.out_hw[0], geom.out_hw[1], 61)
    every, skip = np.empty(shape, dt), np.empty(shape, dt)
    for nt in (1, 2):
        engine.tiles_forward(x, w, b, every, geom.window, nt)
        engine.tiles_forward(x, w, b, skip, geom.window, nt, skip_zero_taps=True)
        # bit for bit with gcc 12; gcc 16's build differs in the last bit
        # at the last component of E (not yet explained)
        np.testing.assert_allclose(skip, every, rtol=4 * np.finfo(dt).eps, atol=4 * np.finfo(dt).eps)
    want = ref.vector_conv2d(x, w, b, geom.window[2:4], geom.window[4:6], geom.window[6:8])
    np.testing.assert_allclose(skip, want, **tol(dt))
    w[2, 1, 0, 0] = np.inf
    engine.tiles_forward(x, w, b, every, geom.window, 1)
    engine.tiles_forward(x, w, b, skip, geom.window, 1, skip_zero_taps=True)
    np.testing.assert_array_equal(skip, every)
    assert np.isnan(skip[0, 2]).any()


def test_dense_kernel_refuses_disagreeing_shapes():
    """zono_dense checks what it indexes by: a wrong caller gets an error,
    not a write out of bounds."""
    from cypool._backend import kernel
    fn = kernel("zono_dense", np.dtype(np.float64))
    z, w, b, out = np.ones((5, 30)), np.ones((4, 5)), np.zeros(0), np.empty((4, 30))
    nb = -(-30 // kernel("dense_block")(False))
    rows, counts = np.empty((nb, 5), np.intp), np.full(nb, -1, np.intp)
    fn(z, w, b, out, rows, counts, 1)
    np.testing.assert_array_equal(out, 5.0)
    for bad in [(z, np.ones((4, 6)), b, out, rows, counts), (z, w, np.zeros(3), out, rows, counts),
                (z, w, b, np.empty((4, 29)), rows, counts), (z, w, b, out, rows[:-1], counts[:-1]),
                (z, w, b, out, np.empty((nb, 4), np.intp), counts)]:
        with pytest.raises(ValueError, match="zono_dense"):
            fn(*bad, 1)


def test_linear_with_a_non_finite_weight_is_numpys(rng):
    """A weight of inf or NaN times a zero generator is NaN, as in numpy and
    torch: zero rows are left out only where every weight is finite."""
    z = random_zonotope(rng, (20,), 40, np.float64)
    z[3] = 0
    z[7, 1:] = 0
    w = rng.standard_normal((8, 20))
    w[2, 3], w[5, 7] = np.inf, np.nan
    with np.errstate(invalid="ignore"):
        want = ref.zono_linear(z, w, None)
    assert np.isnan(want[2]).all()
    np.testing.assert_allclose(Z.linear(z, w), want, rtol=1e-12, atol=1e-12)


def test_vector_conv_of_one_pixel_splits_e(rng):
    """Fewer output pixels than threads: the threads share E (the bias on
    component 0 only, in whichever share holds it)."""
    x = rng.standard_normal((1, 5, 2, 2, 200))
    w = rng.standard_normal((6, 5, 2, 2))
    b = rng.standard_normal(6)
    want = ref.vector_conv2d(x, w, b, (1, 1), (0, 0), (1, 1))
    for nt in (1, 2):
        got = cypool.vector_conv2d(x, w, b, num_threads=nt)
        assert got.shape == (1, 6, 1, 1, 200)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stride, padding, dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2), ((2, 1), (0, 1), (1, 2))])
def test_first_convolution_without_the_box(rng, stride, padding, dilation):
    """Network.certify convolves the box directly (centre, and each pixel's
    generator scattered as the weights it meets): the dense convolution's
    numbers, points (eps 0 pixels) and clipped pixels included."""
    conv = cypool.VectorConv2d(3, 4, 3, stride, padding, dilation, dtype=np.float64, rng=1)
    x = rng.random((3, 9, 8))
    eps = rng.choice([0.0, 0.05], size=x.shape)
    x[0, 0, :2] = [0.0, 1.0]
    ws = N._Workspace()
    got = fused.box_conv(x, eps, (0.0, 1.0), conv, ws.taker(None))
    want = conv.forward(Z.from_box(x, eps))
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(got[..., 1:], want[..., 1:])  # each generator is one product
    assert fused.box_conv(x.reshape(-1), eps.reshape(-1), (0.0, 1.0), conv, ws.taker(None)) is None


def test_network_hands_new_generators_apart(rng):
    """A ReLU's new generators reach the next convolution or dense layer
    apart (scattered there): the same zonotopes as the layers one by one,
    through a flatten, at the end of a network, after a ReLU, batched."""
    conv1 = cypool.VectorConv2d(2, 3, 3, stride=1, padding=1, dtype=np.float64, rng=1)
    conv2 = cypool.VectorConv2d(3, 4, 3, stride=2, padding=1, dilation=1, dtype=np.float64, rng=2)
    conv3 = cypool.VectorConv2d(4, 3, 2, stride=1, padding=0, dilation=2, dtype=np.float64, rng=3)
    lin = cypool.VectorLinear(3 * 1 * 1, 5, dtype=np.float64, rng=4)
    stacks = [
        [conv1, cypool.VectorReLU(), conv2, cypool.VectorReLU(), conv3, cypool.VectorReLU(),
         cypool.VectorFlatten(), lin, cypool.VectorReLU()],
        [conv1, cypool.VectorReLU(), cypool.VectorReLU(), conv2],
    ]
    for stack in stacks:
        net = Z.Network([layer.eval() for layer in stack])
        for eps in (0.05, 0.3):
            z = Z.from_box(rng.random((2, 6, 6)), eps)
            want = z
            for layer in stack:
                want = layer.forward(want)
            got = net(z)
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-13)
            assert want.shape[-1] > z.shape[-1]  # new generators were made
    batched = Z.from_box(rng.random((2, 2, 6, 6)), 0.1)
    net = Z.Network([conv1.eval(), cypool.VectorReLU(), conv2.eval()])
    want = conv2.forward(Z.relu(conv1.forward(batched)))
    np.testing.assert_allclose(net(batched), want, rtol=1e-12, atol=1e-13)


def test_certify_times_each_step(rng):
    _, dicts = small_net(rng)
    net = Z.Network.from_layers(dicts)
    times = {}
    x = rng.random((2, 8, 8))
    ok = net.certify(x, 0.05, 0, times=times)
    assert ok == net.certify(x, 0.05, 0)
    assert set(times) == {"VectorConv2d", "VectorReLU", "VectorFlatten", "VectorLinear", "certify"}
    assert all(v >= 0 for v in times.values())
    dense_first = Z.Network.from_layers([{"weight": np.ones((3, 4))}, "relu", {"weight": np.ones((2, 3))}])
    times = {}
    dense_first.certify(rng.random(4), 0.1, 0, times=times)
    assert "from_box" in times


@pytest.mark.parametrize("C, k1, s1, p1, d1, s2, p2, d2", [
    (1, 3, 2, 0, 1, 2, 0, 1),
    (1, 4, 2, 0, 1, 2, 0, 1),   # ConvSmall's: windows of whole strips of 2 rows
    (1, 4, 2, 1, 1, 2, 1, 1),   # ConvMed's
    (2, 4, 2, 1, 1, 1, 1, 1),   # strips of 2 rows, several channels
    (2, 2, 2, 1, 3, 1, 0, 1),   # strips of 2 rows, dilated windows
    (3, 3, 1, 1, 1, 2, 1, 1),   # several channels: generators reordered
    (2, 3, 1, 0, 2, 1, 2, 2),   # dilations
    (2, 3, 2, 1, 1, 1, 0, 1),
])
def test_banded_head_matches_reference(rng, C, k1, s1, p1, d1, s2, p2, d2):
    """conv, ReLU, conv by row bands (Network.certify's head): the
    reference's margins, and the whole zonotope's bounds as the layers one
    by one give them, through padding, strides, dilation and points."""
    w1 = rng.standard_normal((4, C, k1, k1)) * 0.5
    b1 = rng.standard_normal(4) * 0.1
    w2 = rng.standard_normal((3, 4, 3, 3)) * 0.4
    b2 = rng.standard_normal(3) * 0.1
    x = rng.random((C, 11, 10))
    conv1 = {"weight": w1, "bias": b1, "stride": s1, "padding": p1, "dilation": d1}
    conv2 = {"weight": w2, "bias": b2, "stride": s2, "padding": p2, "dilation": d2}
    head = Z.Network.from_layers([conv1, "relu", conv2])
    out_shape = head.layers[2].forward(head.layers[1].forward(head.layers[0].forward(
        Z.from_box(x, 0.0))))[..., 0].shape
    D = int(np.prod(out_shape))
    w3 = rng.standard_normal((4, D)) * 0.3
    net = Z.Network.from_layers([conv1, "relu", conv2, "relu", "flatten", {"weight": w3, "bias": np.zeros(4)}])
    layers = [("conv", w1, b1, s1, p1), ("relu",), ("conv", w2, b2, s2, p2), ("relu",), ("flatten",),
              ("linear", w3, np.zeros(4))]
    for eps in (0.0, 0.02, rng.choice([0.0, 0.1], size=x.shape)):
        label = int(np.argmax(net.predict(x)))
        ok, m = net.certify(x, eps, label, return_margins=True)
        if d1 == d2 == 1:  # the reference convolution has no dilation argument
            want_ok, want_m = ref.deepz_certify(x, eps, layers, label)
            assert ok == want_ok
            np.testing.assert_allclose(m, want_m, rtol=1e-9, atol=1e-9)
        # the head alone against the layers one by one: the same bounds
        ws = N._Workspace()
        z = fused.banded_head(x, eps, (0.0, 1.0), *head.layers, ws, None)
        want = head.layers[0].forward(Z.from_box(x, eps))
        want = head.layers[2].forward(Z.relu(want))
        assert z.shape == want.shape
        for got_b, want_b in zip(Z.bounds(z), Z.bounds(want)):
            np.testing.assert_allclose(got_b, want_b, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(z[..., 0], want[..., 0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(np.sort(np.abs(z[..., 1:]).sum((0, 1, 2))),
                                   np.sort(np.abs(want[..., 1:]).sum((0, 1, 2))), rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("k, stride, padding, dilation", [(4, 2, 1, 1), (3, 1, 0, 1), (3, 2, 2, 2), (2, 3, 0, 1)])
def test_new_generators_ordered_by_the_first_output_they_reach(rng, k, stride, padding, dilation):
    """reach_order sorts neurons by the first output pixel (row-major) of
    the convolution that reads them, ties in their given order, those read
    by none last; the banded head writes its ReLU's new generators so."""
    C, H, W, O = 3, 7, 6, 2
    w = np.ones((O, C, k, k))
    _, _, _, geom = geo.vector_conv_args(np.zeros((C, H, W, 1)), w, stride, padding, dilation)
    idx = rng.permutation(C * H * W)[:50]
    first = []
    for i in idx:  # the one-hot image's convolution: the first output it is nonzero at
        x = np.zeros((1, C, H, W, 1))
        x.reshape(-1)[i] = 1.0
        y = ref.vector_conv2d(x, w, None, (stride,) * 2, (padding,) * 2, (dilation,) * 2)[0, 0, ..., 0]
        hit = np.flatnonzero(y.reshape(-1))
        first.append(hit[0] if hit.size else y.size)
    first = np.array(first)
    order = fused.reach_order(idx, geom.window, H, W, geom.OH, geom.OW)
    assert sorted(order) == list(range(idx.size))
    assert (np.diff(first[order]) >= 0).all()
    for f in np.unique(first):  # stable
        same = order[first[order] == f]
        assert (np.diff(same) > 0).all()
    # the head: each new generator's column reaches its first output pixel in that order
    conv1 = {"weight": rng.standard_normal((4, 1, 4, 4)), "bias": np.zeros(4), "stride": 2, "padding": 1}
    conv2 = {"weight": rng.standard_normal((3, 4, 4, 4)), "bias": np.zeros(3), "stride": 2, "padding": 1}
    head = Z.Network.from_layers([conv1, "relu", conv2])
    x = rng.random((1, 16, 16))
    z = fused.banded_head(x, 0.2, (0.0, 1.0), *head.layers, N._Workspace(), None)
    tail = z[..., 1 + x.size:]
    assert tail.shape[-1] > 10
    reached = np.abs(tail).sum(axis=0).reshape(-1, tail.shape[-1]) > 0  # (pixels, generators)
    assert reached.any(axis=0).all()
    assert (np.diff(reached.argmax(axis=0)) >= 0).all()
