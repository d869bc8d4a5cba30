"""vector_conv2d, vector_conv2d_backward and VectorConv2d against the loop
reference in tests/reference.py, PyTorch (the permute-and-conv formulation) and finite
differences."""
import numpy as np
import pytest

import cypool
import reference as ref
from cypool._select import VectorAlgo, select_vector_backward, select_vector_forward
from cypool._testing import force, set_crowded
from helpers import torch_or_skip


def random_case(rng):
    while True:
        kh, kw = (int(v) for v in rng.integers(1, 5, size=2))
        sh, sw = (int(v) for v in rng.integers(1, 4, size=2))
        ph, pw = (int(v) for v in rng.integers(0, 3, size=2))
        dh, dw = (int(v) for v in rng.integers(1, 3, size=2))
        H, W = (int(v) for v in rng.integers(1, 10, size=2))
        if H + 2 * ph >= dh * (kh - 1) + 1 and W + 2 * pw >= dw * (kw - 1) + 1:
            break
    N, C, O = (int(v) for v in rng.integers(1, 4, size=3))
    E = int(rng.choice([1, 2, 5, 8, 16, 17, 40]))
    return (N, C, H, W, E), (O, C, kh, kw), dict(stride=(sh, sw), padding=(ph, pw), dilation=(dh, dw))


def tol(dtype):
    return dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("trial", range(40))
def test_forward_and_backward_match_reference(rng, trial):
    xs, ws, geo = random_case(rng)
    dtype = [np.float32, np.float64][trial % 2]
    batched = trial % 4 != 0
    if not batched:
        xs = (1,) + xs[1:]
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype) if trial % 3 else None
    xin = x if batched else x[0]
    out = cypool.vector_conv2d(xin, w, b, **geo)
    want = ref.vector_conv2d(x.astype(np.float64), w.astype(np.float64),
                             None if b is None else b.astype(np.float64), geo["stride"], geo["padding"],
                             geo["dilation"])
    assert out.dtype == dtype and out.flags.c_contiguous
    np.testing.assert_allclose(out, want if batched else want[0], **tol(dtype))
    g = rng.standard_normal(want.shape).astype(dtype)
    gx, gw, gb = cypool.vector_conv2d_backward(g if batched else g[0], xin, w, **geo)
    rgx, rgw, rgb = ref.vector_conv2d_backward(g.astype(np.float64), x.astype(np.float64),
                                               w.astype(np.float64), geo["stride"], geo["padding"],
                                               geo["dilation"])
    np.testing.assert_allclose(gx, rgx if batched else rgx[0], **tol(dtype))
    np.testing.assert_allclose(gw, rgw, **tol(dtype))
    np.testing.assert_allclose(gb, rgb, **tol(dtype))


def test_bias_goes_once_to_component_zero():
    x = np.zeros((3, 4, 4, 5))
    w = np.ones((2, 3, 3, 3))
    out = cypool.vector_conv2d(x, w, np.array([1.5, -2.0]))
    np.testing.assert_array_equal(out[0, ..., 0], 1.5)  # not 3 * 1.5 (once per input channel)
    np.testing.assert_array_equal(out[1, ..., 0], -2.0)
    assert (out[..., 1:] == 0).all()


def test_e_equal_one_is_an_ordinary_convolution(rng):
    x = rng.standard_normal((2, 3, 9, 9, 1))
    w = rng.standard_normal((4, 3, 3, 3))
    out = cypool.vector_conv2d(x, w, None, stride=2, padding=1)
    want = ref.vector_conv2d(x, w, None, (2, 2), (1, 1), (1, 1))
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


def test_non_contiguous_inputs(rng):
    base = rng.standard_normal((2, 6, 8, 8, 10)).astype(np.float32)
    x = base[:, ::2, :, :, ::2]
    w = rng.standard_normal((3, 4, 2, 3)).astype(np.float32).transpose(0, 1, 3, 2)[:, :3]
    assert not w.flags.c_contiguous and not w.flags.f_contiguous
    np.testing.assert_array_equal(cypool.vector_conv2d(x, w, padding=1),
                                  cypool.vector_conv2d(np.ascontiguousarray(x), np.ascontiguousarray(w), padding=1))


@pytest.mark.thread_unsafe(reason="the same team size for every call: calls on other threads start crowded spells, process-wide")
def test_threads_give_the_same_result(rng):
    x = rng.standard_normal((2, 4, 16, 16, 33)).astype(np.float32)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    a = cypool.vector_conv2d(x, w, num_threads=1, padding=1)
    b = cypool.vector_conv2d(x, w, num_threads=2, padding=1)
    np.testing.assert_array_equal(a, b)
    g = rng.standard_normal(a.shape).astype(np.float32)
    set_crowded(False)
    first = cypool.vector_conv2d_backward(g, x, w, padding=1, num_threads=2)
    set_crowded(False)
    for u, v in zip(first, cypool.vector_conv2d_backward(g, x, w, padding=1, num_threads=2)):
        np.testing.assert_array_equal(u, v)  # deterministic for a thread count


def test_backward_skips_what_is_not_needed(rng):
    x = rng.standard_normal((2, 5, 5, 3))
    w = rng.standard_normal((3, 2, 2, 2))
    g = rng.standard_normal((3, 4, 4, 3))
    gx, gw, gb = cypool.vector_conv2d_backward(g, x, w, needs_input_grad=False)
    assert gx is None and gw is not None
    gx, gw, gb = cypool.vector_conv2d_backward(g, x, w, needs_weight_grad=False)
    assert gw is None and gx.shape == x.shape and gb.shape == (3,)


@pytest.mark.parametrize("trial", range(8))
def test_matches_torch_seed_answer_and_autograd(rng, trial):
    torch = torch_or_skip()
    import torch.nn.functional as F
    xs, ws, geo = random_case(rng)
    x = rng.standard_normal(xs[1:]).astype(np.float64)  # unbatched (C, H, W, E), as the seed
    w = rng.standard_normal(ws)
    b = rng.standard_normal(ws[0])
    tx = torch.from_numpy(x).requires_grad_(True)
    tw = torch.from_numpy(w).requires_grad_(True)
    tb = torch.from_numpy(b).requires_grad_(True)
    out = F.conv2d(tx.permute(3, 0, 1, 2), tw, None, geo["stride"], geo["padding"], geo["dilation"])
    bias = torch.zeros_like(out)
    bias[0] = tb.view(-1, 1, 1)  # once, on component 0
    tout = (out + bias).permute(1, 2, 3, 0)
    np.testing.assert_allclose(cypool.vector_conv2d(x, w, b, **geo), tout.detach().numpy(), rtol=1e-10, atol=1e-10)
    g = rng.standard_normal(tuple(tout.shape))
    tout.backward(torch.from_numpy(g))
    gx, gw, gb = cypool.vector_conv2d_backward(g, x, w, **geo)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gb, tb.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_layer_init_like_torch_and_reproducible():
    a = cypool.VectorConv2d(3, 5, (3, 2), rng=7)
    b = cypool.VectorConv2d(3, 5, (3, 2), rng=np.random.default_rng(7))
    np.testing.assert_array_equal(a.weight, b.weight)
    assert a.weight.shape == (5, 3, 3, 2) and a.weight.dtype == np.float32 and a.bias.shape == (5,)
    bound = 1 / np.sqrt(3 * 3 * 2)
    assert np.abs(a.weight).max() <= bound and np.abs(a.bias).max() <= bound
    assert np.abs(a.weight).max() > 0.5 * bound
    assert cypool.VectorConv2d(3, 5, 3, bias=False).bias is None
    assert cypool.VectorConv2d(3, 5, 3, dtype=np.float64).weight.dtype == np.float64


def test_layer_gradients_by_finite_differences(rng):
    layer = cypool.VectorConv2d(2, 3, (2, 3), stride=(1, 2), padding=1, dtype=np.float64, rng=1)
    x = rng.standard_normal((1, 2, 4, 5, 3))
    out = layer(x)
    w_out = rng.standard_normal(out.shape)
    gx = layer.backward(w_out)
    eps = 1e-6

    def loss():
        return (layer(x) * w_out).sum()

    for idx in [(0, 0, 0, 0, 0), (0, 1, 3, 4, 2), (0, 1, 2, 2, 1)]:
        x[idx] += eps
        up = loss()
        x[idx] -= 2 * eps
        down = loss()
        x[idx] += eps
        assert abs((up - down) / (2 * eps) - gx[idx]) < 1e-6
    for idx in [(0, 0, 0, 0), (2, 1, 1, 2)]:
        layer.weight[idx] += eps
        up = loss()
        layer.weight[idx] -= 2 * eps
        down = loss()
        layer.weight[idx] += eps
        assert abs((up - down) / (2 * eps) - layer.grad_weight[idx]) < 1e-6
    layer.bias[1] += eps
    up = loss()
    layer.bias[1] -= 2 * eps
    down = loss()
    layer.bias[1] += eps
    assert abs((up - down) / (2 * eps) - layer.grad_bias[1]) < 1e-6
    layer.eval()
    layer(x)
    with pytest.raises(RuntimeError):
        layer.backward(w_out)


X = np.zeros((3, 6, 6, 4), np.float32)
Wt = np.zeros((2, 3, 3, 3), np.float32)


@pytest.mark.parametrize("args, kwargs, exc, name", [
    ((X, Wt[:, :2]), {}, ValueError, "channels"),
    ((X, np.zeros((2, 3, 9, 9), np.float32)), {}, ValueError, "weight"),
    ((X, Wt), dict(stride=0), ValueError, "stride"),
    ((X, Wt), dict(dilation=0), ValueError, "dilation"),
    ((X, Wt), dict(padding=-1), ValueError, "padding"),
    ((X, Wt, np.zeros(3, np.float32)), {}, ValueError, "bias"),
    ((X, Wt, np.zeros(2, np.float64)), {}, TypeError, "bias"),
    ((X[0], Wt), {}, ValueError, "x"),
    ((X, Wt[0]), {}, ValueError, "weight"),
    ((X.astype(np.float64), Wt), {}, TypeError, "dtype"),
    ((X.astype(np.int32), Wt), {}, TypeError, "x"),
    ((X.astype(np.float16), Wt), {}, TypeError, "x"),
    ((X, Wt), dict(num_threads=0), ValueError, "num_threads"),
])
def test_bad_input(args, kwargs, exc, name):
    with pytest.raises(exc, match=name):
        cypool.vector_conv2d(*args, **kwargs)


def test_backward_bad_grad_output():
    g = np.zeros((2, 4, 4, 4), np.float32)
    with pytest.raises(ValueError, match="grad_output"):
        cypool.vector_conv2d_backward(g[:, :3], X, Wt)
    with pytest.raises(TypeError, match="grad_output"):
        cypool.vector_conv2d_backward(g.astype(np.float64), X, Wt)


@pytest.mark.parametrize("E", [1, 3, 8, 40])
def test_out_argument(rng, E):
    # Both ways of computing it (conv2d's kernels at small E, the tiles at
    # E = 40), batched and not, into a poisoned buffer.
    x = rng.standard_normal((2, 3, 9, 8, E)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    want = cypool.vector_conv2d(x, w, b, stride=(1, 2))
    np.testing.assert_allclose(want, ref.vector_conv2d(x.astype(np.float64), w.astype(np.float64),
                                                       b.astype(np.float64), (1, 2), (0, 0), (1, 1)),
                               rtol=1e-4, atol=1e-4)
    out = np.full(want.shape, np.nan, np.float32)
    assert cypool.vector_conv2d(x, w, b, stride=(1, 2), out=out) is out
    np.testing.assert_array_equal(out, want)
    out1 = np.full(want.shape[1:], np.nan, np.float32)
    assert cypool.vector_conv2d(x[1], w, b, stride=(1, 2), out=out1) is out1
    np.testing.assert_array_equal(out1, want[1])
    layer = cypool.VectorConv2d(3, 4, (3, 2), stride=(1, 2), rng=0)
    out.fill(np.nan)
    assert layer(x, out=out) is out
    np.testing.assert_array_equal(out, layer(x))


def test_out_argument_bad_input(rng):
    x = rng.standard_normal((2, 3, 9, 8, 5)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = np.zeros(4, np.float32)
    for bad, exc in [(np.empty((2, 4, 7, 6, 4), np.float32), ValueError),
                     (np.empty((4, 7, 6, 5), np.float32), ValueError),
                     (np.empty((2, 4, 7, 6, 5), np.float64), TypeError),
                     (np.empty((2, 4, 7, 6, 10), np.float32)[..., ::2], ValueError),
                     (np.empty((2, 4, 7, 6, 5), np.float32)[::-1], ValueError),
                     ([0.0], TypeError)]:
        with pytest.raises(exc, match="out"):
            cypool.vector_conv2d(x, w, b, out=bad)
    ro = np.empty((2, 4, 7, 6, 5), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out"):
        cypool.vector_conv2d(x, w, b, out=ro)
    # Sharing memory with an input: x itself, the weight or the bias.
    sq = np.zeros((1, 1, 4, 4, 2), np.float32)
    with pytest.raises(ValueError, match="out must not overlap x"):
        cypool.vector_conv2d(sq, np.ones((1, 1, 1, 1), np.float32), out=sq)
    buf = np.zeros(2 * 4 * 7 * 6 * 5 + 2, np.float32)
    with pytest.raises(ValueError, match="out must not overlap bias"):
        cypool.vector_conv2d(x, w, buf[-4:], out=buf[:-2].reshape(2, 4, 7, 6, 5))
    wbuf = np.zeros(4 * 3 * 3 * 3 + 2 * 4 * 7 * 6 * 5, np.float32)
    wv = wbuf[:108].reshape(4, 3, 3, 3)
    with pytest.raises(ValueError, match="out must not overlap weight"):
        cypool.vector_conv2d(x, wv, b, out=wbuf[100:100 + 1680].reshape(2, 4, 7, 6, 5))


@pytest.mark.parametrize("E", [1, 3, 40])
@pytest.mark.parametrize("algo", list(VectorAlgo))
def test_grad_x_out_argument(rng, E, algo):
    """grad_x written into a poisoned grad_x_out equals the reference,
    batched and not, whichever kernels the call takes, and is returned."""
    x = rng.standard_normal((2, 3, 9, 8, E))
    w = rng.standard_normal((4, 3, 3, 2))
    with force(vector_backward=algo):
        g = rng.standard_normal(cypool.vector_conv2d(x, w, None, 1, 1).shape)
        want = ref.vector_conv2d_backward(g, x, w, (1, 1), (1, 1), (1, 1))[0]
        out = np.full(x.shape, np.nan)
        gx, gw, gb = cypool.vector_conv2d_backward(g, x, w, 1, 1, grad_x_out=out)
        assert gx is out and gw is not None
        np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-10)
        out1 = np.full(x.shape[1:], np.nan)
        gx1 = cypool.vector_conv2d_backward(g[1], x[1], w, 1, 1, needs_weight_grad=False,
                                            grad_x_out=out1)[0]
        assert gx1 is out1
        np.testing.assert_allclose(out1, want[1], rtol=1e-10, atol=1e-10)


def test_grad_x_out_bad_input(rng):
    x = rng.standard_normal((2, 3, 9, 8, 5))
    w = rng.standard_normal((4, 3, 3, 3))
    g = rng.standard_normal((2, 4, 7, 6, 5))
    for bad, exc in [(np.empty((2, 3, 9, 8, 4)), ValueError),
                     (np.empty(x.shape, np.float32), TypeError),
                     (np.empty((2, 3, 9, 8, 10))[..., ::2], ValueError),
                     ([0.0], TypeError)]:
        with pytest.raises(exc, match="grad_x_out"):
            cypool.vector_conv2d_backward(g, x, w, grad_x_out=bad)
    with pytest.raises(ValueError, match="grad_x_out needs needs_input_grad"):
        cypool.vector_conv2d_backward(g, x, w, grad_x_out=np.empty(x.shape), needs_input_grad=False)
    alias = np.zeros(max(g.size, x.size))
    with pytest.raises(ValueError, match="grad_x_out must not overlap grad_output"):
        cypool.vector_conv2d_backward(alias[:g.size].reshape(g.shape), x, w,
                                      grad_x_out=alias[:x.size].reshape(x.shape))
    with pytest.raises(ValueError, match="grad_x_out must not overlap x"):
        cypool.vector_conv2d_backward(g, x, w, grad_x_out=x)
    wbuf = np.zeros(w.size + x.size)
    with pytest.raises(ValueError, match="grad_x_out must not overlap weight"):
        cypool.vector_conv2d_backward(g, x, wbuf[:w.size].reshape(w.shape),
                                      grad_x_out=wbuf[w.size - 1:-1].reshape(x.shape))
    # without the weight gradient x is not read: x's own array may take grad_x
    want = cypool.vector_conv2d_backward(g, x, w, needs_weight_grad=False)[0]
    x2 = x.copy()
    cypool.vector_conv2d_backward(g, x2, w, grad_x_out=x2, needs_weight_grad=False)
    np.testing.assert_array_equal(x2, want)


def test_layer_bad_parameters():
    with pytest.raises(ValueError, match="channels"):
        cypool.VectorConv2d(0, 3, 3)
    with pytest.raises(TypeError, match="dtype"):
        cypool.VectorConv2d(1, 3, 3, dtype=np.int32)
    with pytest.raises(ValueError, match="kernel_size"):
        cypool.VectorConv2d(1, 3, 0)


def test_e_chunked_sweep_matches(rng, monkeypatch):
    # Large E is swept in chunks over all pixels; force tiny chunks here.
    import cypool._conv_engine as vc
    x = rng.standard_normal((1, 3, 6, 7, 70))
    w = rng.standard_normal((5, 3, 3, 2))
    b = rng.standard_normal(5)
    want = ref.vector_conv2d(x, w, b, (1, 2), (1, 1), (1, 1))
    g = rng.standard_normal(want.shape)
    rgx, rgw, _ = ref.vector_conv2d_backward(g, x, w, (1, 2), (1, 1), (1, 1))
    monkeypatch.setattr(vc, "_L2_BUDGET", 1)
    assert vc._e_chunk(70, 3, 100, 8) == 48
    np.testing.assert_allclose(cypool.vector_conv2d(x, w, b, (1, 2), 1), want, rtol=1e-10, atol=1e-10)
    gx, gw, _ = cypool.vector_conv2d_backward(g, x, w, (1, 2), 1)
    np.testing.assert_allclose(gx, rgx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gw, rgw, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("O,C", [(8, 3), (6, 2), (5, 1), (7, 4)])
def test_vector_tiles_at_every_end_of_e(rng, dtype, O, C):
    # The E-vectorised tiles forced at E = 1 to 25 (at small E conv2d's
    # kernels take the call): every partial block at the end of E, of 1 to
    # 7 components after the vector tiles, with the bias on component 0;
    # output channels 4 at a time and a last block of 1 to 3 (O in the
    # forward, C in the input gradient).
    with force(vector_forward="tiles", vector_backward="tiles"):
        _tiles_at_every_end_of_e(rng, dtype, O, C)


def _tiles_at_every_end_of_e(rng, dtype, O, C):
    for E in range(1, 26):
        x = rng.standard_normal((2, C, 7, 6, E)).astype(dtype)
        x[0, -1, 2, :, :] = 0.0
        w = rng.standard_normal((O, C, 3, 2)).astype(dtype)
        b = rng.standard_normal(O).astype(dtype)
        x64, w64 = x.astype(np.float64), w.astype(np.float64)
        out = cypool.vector_conv2d(x, w, b, (2, 1), 1)
        np.testing.assert_allclose(out, ref.vector_conv2d(x64, w64, b.astype(np.float64), (2, 1), (1, 1),
                                                          (1, 1)), **tol(dtype), err_msg=f"E = {E}")
        g = rng.standard_normal(out.shape).astype(dtype)
        for got, want in zip(cypool.vector_conv2d_backward(g, x, w, (2, 1), 1),
                             ref.vector_conv2d_backward(g.astype(np.float64), x64, w64, (2, 1), (1, 1),
                                                        (1, 1))):
            np.testing.assert_allclose(got, want, **tol(dtype), err_msg=f"E = {E}")


@pytest.mark.parametrize("E,stride,O,forward,backward", [
    (1, 1, 16, "images", "images"), (7, 2, 16, "images", "images"), (8, 1, 16, "rows", "rows"),
    (8, 2, 16, "tiles", "images"), (8, 2, 2, "tiles", "images"), (12, 2, 32, "images", "images"),
    (15, 1, 16, "rows", "rows"), (16, 1, 32, "rows", "rows"), (16, 1, 2, "rows", "rows"),
    (16, 2, 2, "tiles", "images"), (20, 2, 16, "tiles", "images"), (24, 1, 16, "tiles", "rows"),
    (24, 2, 16, "tiles", "tiles"), (32, 1, 16, "tiles", "rows"), (33, 1, 16, "tiles", "tiles"),
    (2, 1, 16, "rows", "rows"), (17, 1, 16, "tiles", "rows"), (4, 3, 16, "images", "images")])
def test_selection_rules(E, stride, O, forward, backward):
    # cypool._select's rules: rows flattened at column stride 1 and small E,
    # the component images below E = 16 (a strided forward but at E = 8),
    # the E-vectorised tiles above; the backward takes conv2d's kernels
    # further, up to E = 20, and E = 32 at stride 1.
    assert select_vector_forward(E, stride, stride, O) == VectorAlgo[forward.upper()]
    assert select_vector_backward(E, stride, stride) == VectorAlgo[backward.upper()]
    with force(vector_forward="rows", vector_backward="tiles"):
        assert select_vector_forward(E, stride, stride, O) == (
            VectorAlgo.ROWS if stride == 1 else VectorAlgo[forward.upper()])
        assert select_vector_backward(E, stride, stride) == VectorAlgo.TILES


@pytest.mark.parametrize("trial", range(12))
def test_forward_by_flattened_rows(rng, trial):
    # At column stride 1 and 2 <= E <= 16 the forward, and the backward, are
    # standard convolutions of the rows flattened to W * E values
    # (flat_plan): against
    # the reference, with row strides, padding, dilation, NaN and +-inf, a
    # non-contiguous x, batched or not, on 1-3 threads, and against the
    # component images' way, which runs the same sums: the same bits in the
    # forward, and the input gradient equal to rounding.
    E = int(rng.integers(2, 17))
    kh, kw = (int(v) for v in rng.integers(1, 5, size=2))
    geo = dict(stride=(1 + trial % 2, 1), padding=(int(rng.integers(0, 3)), int(rng.integers(0, 3))),
               dilation=(1 + trial % 3 // 2, 1 + trial % 2))
    H = int(rng.integers(geo["dilation"][0] * (kh - 1) + 1, 16))
    W = int(rng.integers(geo["dilation"][1] * (kw - 1) + 1, 16))
    N, C, O = 1 + trial % 3, int(rng.integers(1, 6)), int(rng.integers(1, 40))
    dtype = [np.float32, np.float64][trial % 2]
    x = rng.standard_normal((N, C, H, W, E)).astype(dtype)
    x.flat[rng.integers(0, x.size, size=3)] = [np.nan, np.inf, -np.inf]
    w = rng.standard_normal((O, C, kh, kw)).astype(dtype)
    b = rng.standard_normal(O).astype(dtype) if trial % 4 else None
    xin = np.ascontiguousarray(x[:, :, ::-1])[:, :, ::-1] if trial % 3 == 0 else x
    nt = 1 + trial % 3
    assert select_vector_forward(E, 1, 1, O) == VectorAlgo.ROWS
    out = cypool.vector_conv2d(xin if N > 1 else xin[0], w, b, **geo, num_threads=nt)
    with np.errstate(invalid="ignore"):  # inf - inf in the reference's sums
        want = ref.vector_conv2d(x.astype(np.float64), w.astype(np.float64),
                                 None if b is None else b.astype(np.float64), geo["stride"],
                                 geo["padding"], geo["dilation"])
    np.testing.assert_allclose(out, want if N > 1 else want[0], equal_nan=True, **tol(dtype))
    # The backward (rows flattened too), on finite values.
    xf = np.nan_to_num(xin, posinf=3.0, neginf=-3.0)
    g = rng.standard_normal(want.shape).astype(dtype)
    got = cypool.vector_conv2d_backward(g if N > 1 else g[0], xf if N > 1 else xf[0], w, **geo,
                                        num_threads=nt)
    rg = ref.vector_conv2d_backward(g.astype(np.float64), xf.astype(np.float64),
                                    w.astype(np.float64), geo["stride"], geo["padding"],
                                    geo["dilation"])
    for a, r in zip(got, (rg[0] if N > 1 else rg[0][0], rg[1], rg[2])):
        np.testing.assert_allclose(a, r, **tol(dtype))
    with force(vector_forward="images", vector_backward="images"):
        by_images = cypool.vector_conv2d(xin if N > 1 else xin[0], w, b, **geo, num_threads=nt)
        gx_images = cypool.vector_conv2d_backward(g if N > 1 else g[0], xf if N > 1 else xf[0],
                                                  w, **geo, num_threads=nt)[0]
    np.testing.assert_array_equal(out, by_images)
    # The input gradient's sums are the component images' too, but a small
    # call may take the direct kernels one way and the phase tiles the
    # other, whose contractions into multiply-adds a newer gcc (Debian's,
    # tools/newer_python.sh) orders differently: equal to rounding.
    np.testing.assert_allclose(got[0], gx_images, rtol=1e-12 if dtype == np.float64 else 1e-5,
                               atol=1e-12 if dtype == np.float64 else 1e-5)


@pytest.mark.parametrize("O", [2, 6])
@pytest.mark.parametrize("stride", [1, 2])
def test_e16_both_ways(rng, O, stride):
    # At E = 16 a stride-1 forward runs on flattened rows; a strided one
    # takes the E-vectorised tiles (select_vector_forward): each against the
    # reference, with padding, dilation, a bias and a zero pixel.
    x = rng.standard_normal((2, 3, 13, 12, 16)).astype(np.float32)
    x[1, 0, 3, :, :] = 0.0
    w = rng.standard_normal((O, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    assert select_vector_forward(16, stride, stride, O) == (VectorAlgo.ROWS if stride == 1
                                                            else VectorAlgo.TILES)
    out = cypool.vector_conv2d(x, w, b, stride, 1, (1, 2))
    want = ref.vector_conv2d(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                             (stride, stride), (1, 1), (1, 2))
    np.testing.assert_allclose(out, want, **tol(np.float32))


@pytest.mark.parametrize("E", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_small_e_sweep_matches_reference(rng, E, dtype):
    # The E values of the small-E sweep, on both sides of each crossover
    # (cypool._select.select_vector_forward / select_vector_backward), batched,
    # with padding, stride and dilation, and ties and specials in x.
    x = rng.standard_normal((2, 3, 11, 9, E)).astype(dtype)
    x[0, 1, 2, 3, :] = 0.0
    w = rng.standard_normal((5, 3, 3, 2)).astype(dtype)
    b = rng.standard_normal(5).astype(dtype)
    geo = dict(stride=(2, 1), padding=(1, 2), dilation=(2, 1))
    args = ((2, 1), (1, 2), (2, 1))
    out = cypool.vector_conv2d(x, w, b, **geo)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    np.testing.assert_allclose(out, ref.vector_conv2d(x64, w64, b.astype(np.float64), *args), **tol(dtype))
    g = rng.standard_normal(out.shape).astype(dtype)
    for got, want in zip(cypool.vector_conv2d_backward(g, x, w, **geo),
                         ref.vector_conv2d_backward(g.astype(np.float64), x64, w64, *args)):
        np.testing.assert_allclose(got, want, **tol(dtype))
    # Unbatched, and a non-contiguous x, give the same.
    np.testing.assert_allclose(cypool.vector_conv2d(x[1], w, b, **geo), out[1], **tol(dtype))
    xv = np.ascontiguousarray(x[:, :, ::-1])[:, :, ::-1]
    np.testing.assert_array_equal(cypool.vector_conv2d(xv, w, b, **geo), out)
    # The backward of non-contiguous views, on one thread and two (at E = 1
    # the whole batch is one NCHW call).
    gv = np.ascontiguousarray(g[:, :, ::-1])[:, :, ::-1]
    for nt in (1, 2):
        for got, want in zip(cypool.vector_conv2d_backward(gv, xv, w, **geo, num_threads=nt),
                             ref.vector_conv2d_backward(g.astype(np.float64), x64, w64, *args)):
            np.testing.assert_allclose(got, want, **tol(dtype))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("stride, padding, dilation", [(1, 0, 1), (2, 1, 1), (1, 2, 2), ((2, 1), (0, 1), (1, 2))])
def test_input_grad_leaves_out_zero_rows_exactly(rng, dt, stride, padding, dilation):
    """The input gradient by the tiles leaves out the gradient rows that are
    all zero in a chunk of E (a back-substitution's dead ReLUs): the sums
    over every row, and the reference's; a row of NaN or one nonzero value
    is kept; with a weight of inf, every row again (inf * 0 is NaN)."""
    from cypool import _conv_engine as engine
    from cypool import _geometry as geo

    E = 61
    x = np.zeros((1, 5, 9, 8, E), dt)
    w = rng.standard_normal((6, 5, 3, 3)).astype(dt)
    _, _, _, geom = geo.vector_conv_args(x, w, stride, padding, dilation)
    OH, OW = geom.out_hw
    g = rng.standard_normal((1, 6, OH, OW, E)).astype(dt)
    g[0, rng.random((6, OH, OW)) < 0.5] = 0  # dead neurons
    g[0, 1, 0, 0] = -0.0
    g[0, 2, 0, 0] = 0
    g[0, 2, 0, 0, E - 1] = 3  # one value at the end of the row
    every, skip = np.empty(x.shape, dt), np.empty(x.shape, dt)
    for nt in (1, 2):
        engine.vector_input_grad_into(every, g, w, geom, nt)
        engine.vector_input_grad_into(skip, g, w, geom, nt, skip_zero_taps=True)
        np.testing.assert_allclose(skip, every, rtol=4 * np.finfo(dt).eps, atol=4 * np.finfo(dt).eps)
    want, _, _ = ref.vector_conv2d_backward(g.astype(np.float64), x, w.astype(np.float64),
                                            geom.window[2:4], geom.window[4:6], geom.window[6:8])
    np.testing.assert_allclose(skip, want, **tol(dt))
    g[0, 3, 1, 1] = np.nan
    engine.vector_input_grad_into(skip, g, w, geom, 1, skip_zero_taps=True)
    assert np.isnan(skip).any()
    g[0, 3, 1, 1] = 0
    w[2, 1, 0, 0] = np.inf
    engine.vector_input_grad_into(every, g, w, geom, 1)
    engine.vector_input_grad_into(skip, g, w, geom, 1, skip_zero_taps=True)
    np.testing.assert_array_equal(skip, every)
    assert np.isnan(skip).any()


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_input_grad_leaves_out_rows_by_chunk_and_image(rng, dt, monkeypatch):
    """With E in chunks and several images, a row is left out only in the
    chunks of the image where it is zero: rows zero in one chunk and not
    the next, and an image whose zero rows differ from the other's."""
    from cypool import _conv_engine as engine
    from cypool import _geometry as geo

    monkeypatch.setattr(engine, "_L2_BUDGET", 1)  # chunks of 48: three of E = 110
    E = 110
    x = np.zeros((2, 3, 8, 8, E), dt)
    w = rng.standard_normal((5, 3, 4, 4)).astype(dt)
    _, _, _, geom = geo.vector_conv_args(x, w, 2, 1, 1)
    OH, OW = geom.out_hw
    g = rng.standard_normal((2, 5, OH, OW, E)).astype(dt)
    for n in range(2):
        for lo, hi in ((0, 48), (48, 96), (96, E)):
            g[n, rng.random((5, OH, OW)) < 0.4, lo:hi] = 0
    assert engine._e_chunk(E, 2, 5 * OW, g.itemsize) == 48
    every, skip = np.empty(x.shape, dt), np.empty(x.shape, dt)
    want, _, _ = ref.vector_conv2d_backward(g.astype(np.float64), x, w.astype(np.float64),
                                            (2, 2), (1, 1), (1, 1))
    for nt in (1, 2):
        engine.vector_input_grad_into(every, g, w, geom, nt)
        engine.vector_input_grad_into(skip, g, w, geom, nt, skip_zero_taps=True)
        np.testing.assert_allclose(skip, every, rtol=4 * np.finfo(dt).eps, atol=4 * np.finfo(dt).eps)
        np.testing.assert_allclose(skip, want, **tol(dt))
