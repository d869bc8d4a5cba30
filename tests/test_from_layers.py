"""zonotope.Network.from_layers reads only what it knows the meaning of:
torch modules whose computation is their children in order are accepted,
every other one is refused with its path; the no-ops, eval-mode batch
norms, average pools and input normalisations it accepts compute what
torch computes, and their bounds hold at sampled points."""
import numpy as np
import pytest

import cypool
from cypool import zonotope as Z
from helpers import torch_or_skip


def torch_net_output(model, x):
    torch = torch_or_skip()
    with torch.no_grad():
        return model(torch.from_numpy(np.ascontiguousarray(x, np.float64))[None]).numpy()[0]


def assert_sound(net, model, x, eps, rng, clip=(0.0, 1.0), n=200):
    """Every sampled point of the box has torch's output inside the network's
    output bounds, and a certified label is torch's argmax everywhere."""
    lo_box = np.maximum(x - eps, clip[0])
    hi_box = np.minimum(x + eps, clip[1])
    out_z = net(Z.from_box(x, eps, clip=clip))
    lo, up = Z.bounds(out_z)
    label = int(np.argmax(torch_net_output(model, x)))
    ok = net.certify(x, eps, label, clip=clip)
    for k in range(n):
        p = np.where(rng.random(x.shape) < 0.5, lo_box, hi_box) if k < 20 else rng.uniform(lo_box, hi_box)
        y = torch_net_output(model, p)
        assert (y >= lo - 1e-9).all() and (y <= up + 1e-9).all()
        if ok:
            assert int(np.argmax(y)) == label
    return ok


# --- refused: modules whose children in order are not what they compute -------

def _blocks():
    torch = torch_or_skip()
    nn, F = torch.nn, torch.nn.functional

    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 3, padding=1)

        def forward(self, x):
            return x + self.conv(x)

    class ConvRelu(nn.Module):  # the ReLU is functional: no child shows it
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 3, padding=1)

        def forward(self, x):
            return F.relu(self.conv(x))

    class Reversed(nn.Sequential):
        def forward(self, x):
            for m in reversed(self):
                x = m(x)
            return x

    class MyReLU(nn.ReLU):
        def forward(self, x):
            return x

    return nn, Residual, ConvRelu, Reversed, MyReLU


def test_residual_and_functional_blocks_are_refused_with_their_path():
    nn, Residual, ConvRelu, Reversed, MyReLU = _blocks()
    tail = [nn.Flatten(), nn.Linear(2 * 8 * 8, 3)]
    cases = [
        (nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), Residual(), *tail), "layers.1 (Residual)"),
        (nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Sequential(ConvRelu()), *tail),
         "layers.1.0 (ConvRelu)"),
        (nn.Sequential(Reversed(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU()), *tail), "layers.0 (Reversed)"),
        (nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), MyReLU(), *tail), "layers.1 (MyReLU)"),
        (Residual(), "layers (Residual)"),  # a custom top-level module
    ]
    for model, path in cases:
        with pytest.raises(TypeError) as info:
            Z.Network.from_layers(model)
        assert path in str(info.value)
    # inside a list too
    with pytest.raises(TypeError, match=r"layers\[1\] \(Residual\)"):
        Z.Network.from_layers([nn.Conv2d(1, 2, 3, padding=1), Residual()])


def test_a_hook_or_a_subclass_with_its_own_forward_is_refused(rng):
    torch = torch_or_skip()
    nn = torch.nn
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)).double()
    Z.Network.from_layers(model)  # accepted as it is
    handle = model[1].register_forward_hook(lambda m, i, o: -o)
    with pytest.raises(TypeError, match=r"layers.1 \(ReLU\).*hook"):
        Z.Network.from_layers(model)
    handle.remove()
    handle = model.register_forward_pre_hook(lambda m, i: (i[0] * 2,))
    with pytest.raises(TypeError, match=r"layers \(Sequential\)"):
        Z.Network.from_layers(model)
    handle.remove()

    class Plain(nn.Sequential):  # keeps Sequential's forward: accepted
        pass

    net = Z.Network.from_layers(Plain(*model))
    x = rng.random(4)
    np.testing.assert_allclose(net.predict(x), torch_net_output(model, x), rtol=1e-12, atol=1e-12)


def test_torch_linear_after_a_convolution_needs_a_flatten():
    torch = torch_or_skip()
    nn = torch.nn
    with pytest.raises(ValueError, match=r"layers.2: .*nn.Flatten\(\)"):
        Z.Network.from_layers(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Linear(6, 3)))
    with pytest.raises(ValueError, match="start_dim=1"):
        Z.Network.from_layers(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(2), nn.Linear(36, 3)))
    with pytest.raises(TypeError, match=r"layers.1: cannot certify through torch's MaxPool2d"):
        Z.Network.from_layers(nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2)))


def test_batch_norm_without_statistics_or_in_the_wrong_place_is_refused():
    torch = torch_or_skip()
    nn = torch.nn
    with pytest.raises(ValueError, match="layers.1: a batch norm without running statistics"):
        Z.Network.from_layers(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2, track_running_stats=False)))
    with pytest.raises(ValueError, match="layers.2: BatchNorm2d needs an image"):
        Z.Network.from_layers(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.BatchNorm2d(2)))
    with pytest.raises(ValueError, match="layers.1: BatchNorm1d after a convolution"):
        Z.Network.from_layers(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm1d(2)))
    with pytest.raises(ValueError, match="layers.1: 3 channels, but the layer before it has 2"):
        Z.Network.from_layers(nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(3)))


# --- accepted: what torch computes, soundly ------------------------------------

def _trained_like(model, rng):
    """Random running statistics and affine parameters in every batch norm."""
    torch = torch_or_skip()
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.from_numpy(rng.standard_normal(m.num_features) * 0.3))
                m.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, m.num_features)))
                m.weight.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, m.num_features)))
                m.bias.copy_(torch.from_numpy(rng.standard_normal(m.num_features) * 0.1))
    return model.double().eval()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_common_layers_compute_what_torch_computes(rng, dt):
    torch = torch_or_skip()
    nn = torch.nn
    torch.manual_seed(int(rng.integers(1 << 30)))
    model = _trained_like(nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5),
        nn.AvgPool2d(2), nn.Identity(),
        nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, bias=False), nn.BatchNorm2d(4)), nn.ReLU(),
        nn.AvgPool2d(3, stride=1, padding=1), nn.Flatten(),
        nn.Linear(4 * 4 * 4, 10), nn.BatchNorm1d(10), nn.ReLU(), nn.Dropout(), nn.Linear(10, 3)), rng)
    net = Z.Network.from_layers(model, dtype=dt)
    kinds = [type(layer).__name__ for layer in net.layers]
    # every batch norm folded into the layer before it, the no-ops gone
    assert kinds == ["VectorConv2d", "VectorReLU", "VectorAvgPool2d", "VectorConv2d", "VectorReLU",
                     "VectorAvgPool2d", "VectorFlatten", "VectorLinear", "VectorReLU", "VectorLinear"]
    x = rng.random((2, 8, 8))
    tol = 1e-4 if dt == np.float32 else 1e-10
    np.testing.assert_allclose(net.predict(x), torch_net_output(model, x), rtol=tol, atol=tol)
    if dt == np.float64:
        for eps in (0.005, 0.05):
            assert_sound(net, model, x, eps, rng)


def test_input_normalisation_and_per_channel_clip(rng):
    torch = torch_or_skip()
    nn = torch.nn
    mean, std = np.array([0.4, 0.6]), np.array([0.2, 0.3])
    lo, hi = np.array([0.0, 0.1]).reshape(2, 1, 1), np.array([1.0, 0.9]).reshape(2, 1, 1)

    class Normalize(nn.Module):  # the torch model's own first step
        def forward(self, x):
            m = torch.from_numpy(mean).reshape(2, 1, 1)
            return (x - m) / torch.from_numpy(std).reshape(2, 1, 1)

    body = nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(4, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64, 3)).double()
    model = nn.Sequential(Normalize(), body)
    net = Z.Network.from_layers([{"mean": mean, "std": std}, body])
    assert isinstance(net.layers[0], cypool.VectorChannelAffine)
    x = rng.uniform(0.1, 0.9, (2, 8, 8))
    np.testing.assert_allclose(net.predict(x), torch_net_output(model, x), rtol=1e-10, atol=1e-10)
    label = int(np.argmax(net.predict(x)))
    for eps in (0.002, 0.03):
        # certify maps the box through the normalisation: the same margins as
        # the layer-by-layer forward of the normalised box's zonotope
        _, margins = net.certify(x, eps, label, clip=(lo, hi), return_margins=True)
        blo, bhi = np.maximum(x - eps, lo), np.minimum(x + eps, hi)
        nlo, nhi = (blo - mean.reshape(2, 1, 1)) / std.reshape(2, 1, 1), (bhi - mean.reshape(2, 1, 1)) / std.reshape(2, 1, 1)
        z = Z.from_box((nlo + nhi) / 2, (nhi - nlo) / 2, clip=None)
        for layer in net.layers[1:]:
            z = layer.forward(z)
        _, want = Z.certify(z, label, return_margins=True)
        np.testing.assert_allclose(margins, want, rtol=1e-9, atol=1e-9)
        assert_sound(net, model, x, eps, rng, clip=(lo, hi), n=60)


def test_a_batch_is_certified_image_by_image(rng):
    torch = torch_or_skip()
    nn = torch.nn
    model = nn.Sequential(nn.Conv2d(1, 3, 3, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(27, 4)).double()
    net = Z.Network.from_layers(model)
    x = rng.random((5, 1, 8, 8))
    labels = np.array([int(np.argmax(net.predict(xi))) for xi in x])
    eps = np.array([0.0, 0.001, 0.01, 0.05, 0.2]).reshape(5, 1, 1, 1)
    ok, margins = net.certify(x, eps, labels, return_margins=True)
    assert ok.shape == (5,) and margins.shape == (5, 4)
    for i in range(5):
        ok_i, m_i = net.certify(x[i], eps[i], int(labels[i]), return_margins=True)
        assert ok[i] == ok_i
        np.testing.assert_array_equal(margins[i], m_i)
    assert ok[0]  # a zero-width box is its own point
    np.testing.assert_array_equal(net.certify(x, 0.01, labels), [net.certify(xi, 0.01, int(li))
                                                                 for xi, li in zip(x, labels)])
    with pytest.raises(ValueError, match="label must be 5 integers"):
        net.certify(x, 0.01, labels[:4])
    with pytest.raises(ValueError, match="label must be 5 integers"):
        net.certify(x, 0.01, labels.astype(float))


# --- the layers themselves -------------------------------------------------------

@pytest.mark.parametrize("k, s, p, div", [(2, None, 0, None), (3, 1, 1, None), (3, 2, 1, 5), ((2, 3), (1, 2), (1, 0), None)])
def test_vector_avg_pool_is_torch_on_every_component(rng, k, s, p, div):
    torch = torch_or_skip()
    z = rng.standard_normal((2, 3, 7, 8, 4))
    layer = cypool.VectorAvgPool2d(k, s, p, divisor=div)
    got = layer(z)
    want = torch.nn.functional.avg_pool2d(torch.from_numpy(np.moveaxis(z, -1, 1).reshape(-1, 7, 8)), k, s, p,
                                          divisor_override=div).numpy()
    want = np.moveaxis(want.reshape(2, 4, 3, *want.shape[-2:]), 1, -1)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(layer(z[0]), got[0])


def test_vector_channel_affine(rng):
    z = rng.standard_normal((3, 4, 5, 6))
    layer = cypool.VectorChannelAffine([1.0, -2.0, 0.5], [0.1, 0.2, 0.3])
    out = layer(z)
    want = z * np.array([1.0, -2.0, 0.5]).reshape(3, 1, 1, 1)
    want[..., 0] += np.array([0.1, 0.2, 0.3]).reshape(3, 1, 1)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(layer(z[None])[0], want)  # batched
    np.testing.assert_array_equal(layer(z.reshape(3, -1))[..., 0], z.reshape(3, -1)[..., 0] * [1, -2, 0.5] + [0.1, 0.2, 0.3])
    lo, up = Z.bounds(out)
    zlo, zup = Z.bounds(z)
    s = np.array([1.0, -2.0, 0.5]).reshape(3, 1, 1)
    np.testing.assert_allclose(lo, np.minimum(zlo * s, zup * s) + [[[0.1]], [[0.2]], [[0.3]]], atol=1e-12)
    assert cypool.VectorChannelAffine(2.0, 0.0)(z).shape == z.shape  # one value for every channel


@pytest.mark.parametrize("call, err, words", [
    (lambda: cypool.VectorChannelAffine([1.0, np.nan], 0.0), ValueError, "scale must be finite"),
    (lambda: cypool.VectorChannelAffine([1.0, 2.0], [0.0, 0.0, 0.0]), ValueError, "one value per channel"),
    (lambda: cypool.VectorChannelAffine(np.ones((2, 2)), 0.0), TypeError, "scale must be a number or a 1-D"),
    (lambda: cypool.VectorChannelAffine([1.0, 2.0], 0.0)(np.ones((3, 2, 2, 2))), ValueError, "3 channels"),
    (lambda: cypool.VectorAvgPool2d(2, padding=2), ValueError, "padding must be at most half"),
    (lambda: cypool.VectorAvgPool2d(0), ValueError, "kernel_size must be positive"),
    (lambda: cypool.VectorAvgPool2d(2, divisor=0), ValueError, "divisor"),
    (lambda: cypool.VectorAvgPool2d(4)(np.ones((1, 3, 3, 2))), ValueError, "smaller than the 4x4 window"),
    (lambda: cypool.VectorAvgPool2d(2)(np.ones((3, 2))), ValueError, "z must have"),
    (lambda: Z.Network.from_layers([{"mean": [0.5], "std": [0.0]}]), ValueError, "layers[0]: std must be nonzero"),
    (lambda: Z.from_box(np.ones((2, 3, 3)) / 2, 0.1, clip=(np.zeros((3, 1, 1)), 1.0)), ValueError,
     "do not broadcast to x's shape"),
    (lambda: Z.Network.from_layers([{"mean": [0.5, 0.5], "std": [1.0, 1.0]}, "relu"]).certify(
        np.ones((3, 2, 2)) / 2, 0.1, 0), ValueError, "x has 3 channels"),
])
def test_bad_input(call, err, words):
    with pytest.raises(err) as info:
        call()
    assert words in str(info.value)


def test_a_first_affine_with_a_negative_scale_maps_the_box(rng):
    affine = cypool.VectorChannelAffine([-1.5, 2.0], [0.3, -0.1])
    conv = {"weight": rng.standard_normal((3, 2, 3, 3)), "bias": rng.standard_normal(3)}
    net = Z.Network.from_layers([affine, conv, "relu", "flatten", {"weight": rng.standard_normal((2, 27))}])
    x = rng.random((2, 5, 5))
    _, margins = net.certify(x, 0.05, 0, return_margins=True)
    z = Z.from_box(x, 0.05)
    for layer in net.layers:
        z = layer.forward(z)
    np.testing.assert_allclose(margins, Z.certify(z, 0, return_margins=True)[1], rtol=1e-9, atol=1e-9)


def test_an_input_of_another_size_names_the_layer(rng):
    layers = [cypool.Conv2d(1, 2, 3, stride=2, padding=1, rng=0), cypool.ReLU(), cypool.Flatten(),
              cypool.Linear(32, 3, rng=0)]
    net = Z.Network.from_layers(layers)
    with pytest.raises(ValueError, match=r"layers\[3\] \(VectorLinear\): weight has 32 input features "
                                         r"but z has 50 neurons"):
        net.certify(rng.random((1, 9, 9)), 0.1, 0)
    with pytest.raises(ValueError, match=r"layers\[3\] \(VectorLinear\)"):
        net.predict(rng.random((1, 9, 9)))
