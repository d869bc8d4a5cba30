"""cypool.torch: the operators pass torch.library.opcheck and gradcheck,
equal plain-torch references (forward and gradients) over random
geometries, strides and dtypes, trace under torch.compile(fullgraph=True),
and refuse bad input by name. Skipped where torch is missing."""
import importlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch not installed")
F = torch.nn.functional
ct = pytest.importorskip("cypool.torch")

DTYPES = [torch.float32, torch.float64]


def tol(dt):
    return dict(rtol=1e-4, atol=1e-4) if dt == torch.float32 else dict(rtol=1e-10, atol=1e-10)


def vector_conv_reference(x, w, b, stride, padding, dilation):
    """Seed-001's fast answer: the components as a batch of F.conv2d, the
    bias on component 0 alone."""
    batched = x.dim() == 5
    x5 = x if batched else x.unsqueeze(0)
    N, C, H, W, E = x5.shape
    out = F.conv2d(x5.permute(0, 4, 1, 2, 3).reshape(N * E, C, H, W), w, None, stride, padding, dilation)
    out = out.reshape(N, E, *out.shape[1:]).permute(0, 2, 3, 4, 1)
    if b is not None:
        bias = torch.zeros(out.shape[-1], dtype=out.dtype)
        bias[0] = 1
        out = out + b.view(-1, 1, 1, 1) * bias
    return out if batched else out[0]


def geometries(rng, n):
    for _ in range(n):
        k = int(rng.integers(1, 4))
        s, p, d = int(rng.integers(1, 3)), int(rng.integers(0, k // 2 + 1)), int(rng.integers(1, 3))
        H = int(rng.integers(d * (k - 1) + 1, 9))
        yield k, s, p, d, H, int(rng.integers(d * (k - 1) + 1, 9))


@pytest.mark.parametrize("dt", DTYPES)
def test_vector_conv2d_equals_the_permute_answer_with_gradients(rng, dt):
    for k, s, p, d, H, W in geometries(rng, 6):
        batched = bool(rng.integers(2))
        shape = ((2,) if batched else ()) + (3, H, W, int(rng.integers(1, 6)))
        x0 = torch.from_numpy(rng.standard_normal(shape)).to(dt)
        if rng.integers(2):  # a strided view goes in as it is
            x0 = torch.from_numpy(rng.standard_normal(shape[:-1] + (2 * shape[-1],))).to(dt)[..., ::2]
        w0 = torch.from_numpy(rng.standard_normal((4, 3, k, k))).to(dt)
        b0 = torch.from_numpy(rng.standard_normal(4)).to(dt)
        got_in = [t.clone().requires_grad_() for t in (x0, w0, b0)]
        want_in = [t.clone().requires_grad_() for t in (x0, w0, b0)]
        got = ct.vector_conv2d(*got_in, s, p, d)
        want = vector_conv_reference(*want_in, s, p, d)
        torch.testing.assert_close(got, want, **tol(dt))
        g = torch.from_numpy(rng.standard_normal(tuple(want.shape))).to(dt)
        got.backward(g)
        want.backward(g)
        for a, b in zip(got_in, want_in):
            torch.testing.assert_close(a.grad, b.grad, **tol(dt))


@pytest.mark.parametrize("dt", DTYPES)
def test_conv2d_equals_torch_with_gradients(rng, dt):
    for k, s, p, d, H, W in geometries(rng, 6):
        x0 = torch.from_numpy(rng.standard_normal((2, 3, H, W))).to(dt)
        if rng.integers(2):
            x0 = x0.transpose(-1, -2).contiguous().transpose(-1, -2)  # non-contiguous
        w0 = torch.from_numpy(rng.standard_normal((5, 3, k, k))).to(dt)
        b0 = torch.from_numpy(rng.standard_normal(5)).to(dt)
        got_in = [t.clone().requires_grad_() for t in (x0, w0, b0)]
        want_in = [t.clone().requires_grad_() for t in (x0, w0, b0)]
        got, want = ct.conv2d(*got_in, s, p, d), F.conv2d(*want_in, s, p, d)
        torch.testing.assert_close(got, want, **tol(dt))
        g = torch.randn(want.shape, dtype=dt)
        got.backward(g)
        want.backward(g)
        for a, b in zip(got_in, want_in):
            torch.testing.assert_close(a.grad, b.grad, **tol(dt))


@pytest.mark.parametrize("dt", DTYPES)
def test_max_pool2d_with_indices_equals_torch_with_gradients(rng, dt):
    for k, s, p, d, H, W in geometries(rng, 8):
        ceil = bool(rng.integers(2))
        x0 = torch.from_numpy(rng.standard_normal((2, 3, H, W))).to(dt)
        if rng.integers(3) == 0:
            x0 = torch.from_numpy(rng.integers(0, 3, (2, 3, H, W)).astype(np.float64)).to(dt)  # ties
        a, b = x0.clone().requires_grad_(), x0.clone().requires_grad_()
        v, i = ct.max_pool2d_with_indices(a, k, s, p, d, ceil)
        tv, ti = F.max_pool2d(b, k, s, p, d, ceil, return_indices=True)
        torch.testing.assert_close(v, tv)
        assert i.dtype == torch.int64 and torch.equal(i, ti)
        g = torch.randn(tv.shape, dtype=dt)
        v.backward(g)
        tv.backward(g)
        torch.testing.assert_close(a.grad, b.grad, **tol(dt))


def test_argmax2d_and_global_max_pool(rng):
    x = torch.from_numpy(rng.standard_normal((3, 4, 5, 6)))
    x[0, 0] = 1.0  # a constant map: the first position
    got = ct.argmax2d(x)
    flat = x.flatten(-2).argmax(-1)
    assert got.dtype == torch.int64 and torch.equal(got, torch.stack([flat // 6, flat % 6], -1))
    xg = x.clone().requires_grad_()
    y = ct.GlobalMaxPool2d()(xg)
    torch.testing.assert_close(y, x.flatten(-2).amax(-1))
    y.sum().backward()
    want = torch.zeros_like(x).flatten(-2).scatter(-1, flat.unsqueeze(-1), 1.0).view_as(x)
    torch.testing.assert_close(xg.grad, want)


def test_opcheck_and_gradcheck_every_operator(rng):
    x5 = torch.randn(2, 3, 6, 5, 4, dtype=torch.float64, requires_grad=True)
    x4 = torch.randn(2, 3, 6, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, dtype=torch.float64, requires_grad=True)
    ops = torch.ops.cypool
    cases = [
        (ops.vector_conv2d.default, (x5, w, b, [2, 1], [1, 0], [1, 1], 0)),
        (ops.vector_conv2d.default, (x5[0].detach(), w.detach(), None, [1, 1], [1, 1], [2, 1], 2)),
        (ops.conv2d.default, (x4, w, b, [1, 2], [0, 1], [1, 1], 0)),
        (ops.conv2d.default, (x4.detach(), w.detach(), None, [1, 1], [1, 1], [1, 1], 1)),
        (ops.max_pool2d_with_indices.default, (x4, [3, 2], [2, 1], [1, 1], [1, 1], True, 0)),
        (ops.argmax2d.default, (x4.detach(), 0)),
    ]
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)
    assert torch.autograd.gradcheck(lambda x, w, b: ct.vector_conv2d(x, w, b, 2, 1, 1), (x5, w, b))
    assert torch.autograd.gradcheck(lambda x, w, b: ct.conv2d(x, w, b, 1, 1, 2), (x4, w, b))
    assert torch.autograd.gradcheck(lambda x: ct.max_pool2d_with_indices(x, 2, 1, 1)[0], (x4,))


def test_torch_compile_fullgraph_and_export(rng):
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = ct.Conv2d(1, 4, 3, padding=1)
            self.pool = ct.MaxPool2d(2)
            self.vconv = ct.VectorConv2d(4, 2, 3, padding=1)
            self.fc = torch.nn.Linear(2 * 4 * 4, 3)

        def forward(self, x):
            h = self.pool(torch.relu(self.conv(x)))
            return self.fc(self.vconv(h.permute(1, 2, 3, 0)).permute(3, 0, 1, 2).flatten(1))

    torch.manual_seed(0)
    net = Net().double()
    x = torch.randn(2, 1, 8, 8, dtype=torch.float64)
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), net(x))
    compiled(x).sum().backward()
    grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    net(x).sum().backward()
    for a, p in zip(grads, net.parameters()):
        torch.testing.assert_close(a, p.grad)
    torch.export.export(net, (x,))


def test_modules_take_torch_conv2d_parameters():
    tconv = torch.nn.Conv2d(3, 5, (3, 2), stride=2, padding=1)
    for cls in (ct.Conv2d, ct.VectorConv2d):
        m = cls(3, 5, (3, 2), stride=2, padding=1)
        assert [n for n, _ in m.named_parameters()] == ["weight", "bias"]
        m.load_state_dict(tconv.state_dict())
    x = torch.randn(2, 3, 9, 7)
    m = ct.Conv2d(3, 5, (3, 2), stride=2, padding=1)
    m.load_state_dict(tconv.state_dict())
    torch.testing.assert_close(m(x), tconv(x), rtol=1e-4, atol=1e-5)


def test_the_seed_module_in_three_lines(rng):
    """The forum's module rewritten on cypool gives its outputs."""
    class Seed(torch.nn.Module):  # its fast answer, as posted
        def __init__(self, w, b, stride, padding):
            super().__init__()
            self.weight, self.bias, self.stride, self.padding = w, b, stride, padding

        def forward(self, img):
            num_channels = img.size(0)
            out = F.conv2d(img.permute(-1, 0, 1, 2), self.weight, None, self.stride, self.padding)
            out[0] += self.bias.view(-1, 1, 1) * num_channels  # its bias, once per input channel
            return out.permute(1, 2, 3, 0)

    w, b = torch.randn(4, 3, 3, 3), torch.randn(4)
    img = torch.randn(3, 10, 10, 7)
    m = ct.VectorConv2d(3, 4, 3, stride=1, padding=1)
    m.weight.data, m.bias.data = w, b * 3  # the seed adds the bias once per input channel
    torch.testing.assert_close(m(img), Seed(w, b, 1, 1)(img), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("call, err, words", [
    (lambda: ct.vector_conv2d(torch.randn(3, 5, 5, 2, device="meta"), torch.randn(2, 3, 3, 3)), ValueError,
     "x is on meta: cypool computes on the CPU only"),
    (lambda: ct.conv2d(torch.randn(1, 3, 5, 5, dtype=torch.float16), torch.randn(2, 3, 3, 3)), TypeError,
     "x must be float32 or float64, got float16"),
    (lambda: ct.conv2d(torch.randn(1, 3, 5, 5), torch.randn(2, 4, 3, 3)), ValueError,
     "weight takes 4 input channels but x has 3"),
    (lambda: ct.conv2d(torch.randn(3, 5, 5), torch.randn(2, 3, 3, 3, dtype=torch.float64)), TypeError,
     "weight dtype"),
    (lambda: ct.vector_conv2d(torch.randn(5, 5, 2), torch.randn(2, 3, 3, 3)), ValueError,
     "x must have 4 or 5 dimensions"),
    (lambda: ct.conv2d(torch.randn(1, 3, 5, 5), torch.randn(2, 3, 3, 3), torch.randn(3)), ValueError,
     "bias must be (2,)"),
    (lambda: ct.max_pool2d_with_indices(np.zeros((1, 2, 4, 4)), 2), TypeError, "x must be a torch.Tensor"),
    (lambda: ct.max_pool2d_with_indices(torch.randn(1, 2, 4, 4), 2, padding=2), ValueError, "padding"),
    (lambda: ct.MaxPool2d(2, padding=2), ValueError, "padding"),
    (lambda: ct.conv2d(torch.randn(1, 3, 5, 5), torch.randn(2, 3, 3, 3), stride=0), ValueError, "stride"),
    (lambda: ct.argmax2d(torch.randn(4), num_threads=0), ValueError, "x must have 2 to 32 dimensions"),
])
def test_bad_input_names_the_parameter(call, err, words):
    with pytest.raises(err) as info:
        call()
    assert words in str(info.value)


def test_without_torch_the_import_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.delitem(sys.modules, "cypool.torch")
    with pytest.raises(ImportError, match="CPU build"):
        importlib.import_module("cypool.torch")


def test_eager_calls_and_the_operators_agree_with_gradients(rng):
    """An eager call runs the kernels directly (an autograd.Function); the
    operators run under tracing: both give the same values and gradients."""
    ops = torch.ops.cypool
    x5 = torch.randn(2, 3, 6, 5, 4, dtype=torch.float64)
    x4 = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    w = torch.randn(4, 3, 3, 3, dtype=torch.float64)
    b = torch.randn(4, dtype=torch.float64)
    cases = [
        (lambda x, w, b: ct.vector_conv2d(x, w, b, 2, 1),
         lambda x, w, b: ops.vector_conv2d(x, w, b, [2, 2], [1, 1], [1, 1], 0), (x5, w, b)),
        (lambda x, w, b: ct.conv2d(x, w, b, 1, 1, 2),
         lambda x, w, b: ops.conv2d(x, w, b, [1, 1], [1, 1], [2, 2], 0), (x4, w, b)),
        (lambda x: ct.max_pool2d_with_indices(x, 2, 1, 1)[0],
         lambda x: ops.max_pool2d_with_indices(x, [2, 2], [1, 1], [1, 1], [1, 1], False, 0)[0], (x4,)),
    ]
    for eager, op, inputs in cases:
        a = [t.clone().requires_grad_() for t in inputs]
        c = [t.clone().requires_grad_() for t in inputs]
        ya, yc = eager(*a), op(*c)
        assert ya.grad_fn is not None and "Fn" in type(ya.grad_fn).__name__  # the eager Function
        torch.testing.assert_close(ya, yc, rtol=0, atol=0)
        g = torch.randn(ya.shape, dtype=ya.dtype)
        ya.backward(g)
        yc.backward(g)
        for p, q in zip(a, c):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0)
        with torch.no_grad():
            assert eager(*a).grad_fn is None
    torch.testing.assert_close(ct.argmax2d(x4), ops.argmax2d(x4, 0), rtol=0, atol=0)


def test_under_a_dispatch_mode_the_operators_run():
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record():
        ct.argmax2d(torch.randn(2, 3, 4))
    assert any("cypool.argmax2d" in s for s in seen)
