"""Property-based tests (hypothesis): every public function and layer against
the independent references in reference.py, on drawn shapes (1-wide, 1-high,
long and thin, more and fewer planes than threads), every parameter in its
valid range, every dtype, values with ties, NaN, inf, constants and
denormals, and C-order, Fortran-order, strided and negative-stride views;
and inputs just past the edge of validity, which must be refused cleanly.

Profiles (conftest.py): "ci" (the default: fixed seed, a bounded number of
examples) and "long": CYPOOL_HYPOTHESIS_PROFILE=long pytest tests/test_fuzz.py
--hypothesis-show-statistics.
"""
import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import cypool  # noqa: E402
import reference as ref  # noqa: E402
from cypool import _geometry as geo  # noqa: E402

POOL_DTYPES = [np.float32, np.float64, np.float16, np.int8, np.int16, np.int32, np.int64, np.uint8,
               np.uint16, np.uint32]
FLOAT_DTYPES = [np.float32, np.float64]


@st.composite
def values(draw, shape, dtype):
    """An array of shape and dtype: plain, few distinct values (ties), with
    NaN and inf, constant, or (floats) denormal."""
    dtype = np.dtype(dtype)
    kind = draw(st.sampled_from(["plain", "ties", "specials", "constant", "denormal"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if kind == "constant":
        return np.full(shape, 1 if dtype.kind != "f" else -0.5, dtype=dtype)
    if dtype.kind != "f":
        return ref.random_values(rng, shape, dtype, ties=kind != "plain")
    if kind == "denormal":
        tiny = np.finfo(dtype).tiny
        return (rng.integers(-3, 4, size=shape) * tiny / 8).astype(dtype)
    return ref.random_values(rng, shape, dtype, ties=kind == "ties", specials=kind == "specials")


@st.composite
def laid_out(draw, x):
    """x as it is, in Fortran order, as a strided view, or as a negative-stride
    view: the same values, other memory layouts."""
    how = draw(st.sampled_from(["c", "fortran", "strided", "negative"]))
    if how == "fortran":
        return np.asfortranarray(x)
    if how == "strided":
        big = np.zeros(x.shape[:-1] + (2 * x.shape[-1],), dtype=x.dtype)
        big[..., ::2] = x
        return big[..., ::2]
    if how == "negative":
        return np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    return x


def plane_shape(draw, hmax=16):
    """(H, W): small, 1-wide, 1-high or long and thin."""
    kind = draw(st.sampled_from(["square", "row", "column", "thin"]))
    if kind == "row":
        return 1, draw(st.integers(1, 40))
    if kind == "column":
        return draw(st.integers(1, 40)), 1
    if kind == "thin":
        return draw(st.integers(1, 3)), draw(st.integers(20, 90))
    return draw(st.integers(1, hmax)), draw(st.integers(1, hmax))


@st.composite
def pool_case(draw):
    """(x, parameters) of a valid max pooling: (N, C, H, W) or (C, H, W)."""
    H, W = plane_shape(draw)
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = draw(st.one_of(st.none(), st.tuples(st.integers(1, 4), st.integers(1, 4))))
    p = (draw(st.integers(0, k[0] // 2)), draw(st.integers(0, k[1] // 2)))
    d = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    ceil = draw(st.booleans())
    try:
        geo.pool_geometry(H, W, k, s, p, d, ceil)
    except ValueError:
        assume(False)
    lead = draw(st.sampled_from([(1, 1), (1, 3), (2, 9), (3,), (1, 17)]))  # planes below/above threads
    dtype = draw(st.sampled_from(POOL_DTYPES))
    x = draw(laid_out(draw(values(lead + (H, W), dtype))))
    return x, dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)


def same(a, b):
    assert a.shape == b.shape, (a.shape, b.shape)
    np.testing.assert_array_equal(a, b)


def ref_pool(x, cfg):
    return ref.max_pool2d(x, cfg["kernel_size"], cfg["stride"], cfg["padding"], cfg["dilation"],
                          cfg["ceil_mode"])


@given(pool_case(), st.sampled_from([np.int32, np.int64]), st.sampled_from([None, 1, 2]))
def test_max_pool2d(case, index_dtype, threads):
    x, cfg = case
    out, idx = cypool.max_pool2d(x, **cfg, return_indices=True, index_dtype=index_dtype,
                                 num_threads=threads)
    rout, ridx = ref_pool(x, cfg)
    assert out.dtype == x.dtype and idx.dtype == index_dtype
    same(out, rout)
    same(idx, ridx)
    same(cypool.max_pool2d(x, **cfg, num_threads=threads), rout)


@given(pool_case(), st.sampled_from([None, 1, 2]), st.data())
def test_max_pool2d_backward_and_unpool(case, threads, data):
    x, cfg = case
    x = x.astype(data.draw(st.sampled_from(FLOAT_DTYPES)))
    out, idx = cypool.max_pool2d(x, **cfg, return_indices=True)
    g = data.draw(laid_out(np.random.default_rng(0).standard_normal(out.shape).astype(x.dtype)))
    same(cypool.max_pool2d_backward(g, idx, x.shape, num_threads=threads),
         ref.max_pool2d_backward(g, idx, x.shape).astype(x.dtype))
    layer = cypool.MaxPool2d(**cfg)
    same(layer(x), out)
    same(layer.backward(g), ref.max_pool2d_backward(g, idx, x.shape).astype(x.dtype))
    # unpool back to the input's size (any size torch accepts)
    if cfg["dilation"] == (1, 1):
        size = x.shape[-2:]
        try:
            un = cypool.max_unpool2d(out, idx, cfg["kernel_size"], cfg["stride"], cfg["padding"],
                                     output_size=size, num_threads=threads)
        except ValueError:
            return  # a size torch refuses too (checked in test_maxpool)
        same(un, ref.max_unpool2d(out, idx, size))


@st.composite
def argmax_case(draw):
    H, W = plane_shape(draw, 40)
    lead = draw(st.sampled_from([(), (1,), (3,), (2, 9), (1, 1, 5)]))
    dtype = draw(st.sampled_from(POOL_DTYPES))
    return draw(laid_out(draw(values(lead + (H, W), dtype))))


@given(argmax_case(), st.sampled_from([np.int32, np.int64]), st.sampled_from([None, 1, 2]))
def test_argmax2d(x, index_dtype, threads):
    v, c = cypool.argmax2d(x, return_values=True, index_dtype=index_dtype, num_threads=threads)
    H, W = x.shape[-2:]
    flat = x.reshape(x.shape[:-2] + (H * W,))
    want = np.stack(np.unravel_index(flat.argmax(-1), (H, W)), -1)
    same(c, want.astype(index_dtype))
    same(v, flat.max(-1) if x.dtype.kind != "f" else np.take_along_axis(flat, flat.argmax(-1)[..., None],
                                                                       -1)[..., 0])
    if x.ndim == 4:
        layer = cypool.GlobalMaxPool2d()
        same(layer(x), v)
        same(layer.coords, c.astype(np.int64))


@st.composite
def conv_case(draw, vector):
    """(x, weight, bias, stride, padding, dilation) of a valid convolution."""
    H, W = plane_shape(draw, 12)
    C, O = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    k = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    s = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    p = (draw(st.integers(0, 3)), draw(st.integers(0, 3)))
    d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    assume(H + 2 * p[0] >= d[0] * (k[0] - 1) + 1 and W + 2 * p[1] >= d[1] * (k[1] - 1) + 1)
    N = draw(st.sampled_from([1, 2, 3]))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    shape = (N, C, H, W) + ((draw(st.sampled_from([1, 2, 5, 9, 20])),) if vector else ())
    x = draw(values(shape, dtype))
    x[~np.isfinite(x)] = 0.25  # finite: sums of inf and NaN are compared by their own tests
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    w = rng.standard_normal((O, C) + k).astype(dtype)
    b = rng.standard_normal(O).astype(dtype) if draw(st.booleans()) else None
    return draw(laid_out(x)), w, b, s, p, d


def close(a, b, dtype):
    tol = dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, **tol)


def check_conv(fwd, bwd, ref_fwd, ref_bwd, case, threads):
    """A convolution and its backward against the reference's, on one case;
    ref_* take (..., stride, padding, dilation) as the reference spells them."""
    x, w, b, s, p, d = case
    out = fwd(x, w, b, s, p, d, num_threads=threads)
    close(out, ref_fwd(x, w, b), x.dtype)
    g = np.random.default_rng(1).standard_normal(out.shape).astype(x.dtype)
    for got, want in zip(bwd(g, x, w, s, p, d, num_threads=threads), ref_bwd(g, x, w)):
        close(got, want, x.dtype)


@given(conv_case(vector=False), st.sampled_from([None, 1, 2]))
def test_conv2d_and_backward(case, threads):
    s, p, d = case[3:]
    pads = ((p[0], p[0]), (p[1], p[1]))
    check_conv(cypool.conv2d, cypool.conv2d_backward,
               lambda x, w, b: ref.conv2d(x, w, b, s, pads, d),
               lambda g, x, w: ref.conv2d_backward(g, x, w, s, pads, d), case, threads)


@given(conv_case(vector=True), st.sampled_from([None, 1, 2]))
def test_vector_conv2d_and_backward(case, threads):
    s, p, d = case[3:]
    check_conv(cypool.vector_conv2d, cypool.vector_conv2d_backward,
               lambda x, w, b: ref.vector_conv2d(x, w, b, s, p, d),
               lambda g, x, w: ref.vector_conv2d_backward(g, x, w, s, p, d), case, threads)


@given(conv_case(vector=False))
def test_conv_layers(case):
    x, w, b, s, p, d = case
    layer = cypool.Conv2d(w.shape[1], w.shape[0], w.shape[2:], s, p, d, bias=b is not None, dtype=x.dtype)
    layer.weight[...] = w
    if b is not None:
        layer.bias[...] = b
    out = layer(x)
    close(out, ref.conv2d(x, w, b, s, ((p[0], p[0]), (p[1], p[1])), d), x.dtype)
    vlayer = cypool.VectorConv2d(w.shape[1], w.shape[0], w.shape[2:], s, p, d, bias=b is not None,
                                 dtype=x.dtype)
    vlayer.weight[...] = w
    if b is not None:
        vlayer.bias[...] = b
    close(vlayer(x[..., None])[..., 0], out, x.dtype)


# Just past the edge of validity: refused with a ValueError or TypeError
# naming the parameter, never a crash or a wrong answer.

@given(pool_case(), st.sampled_from(["index", "negative index", "padding", "stride", "dilation",
                                      "kernel"]))
def test_just_invalid_inputs_are_refused(case, what):
    x, cfg = case
    x = x.astype(np.float64)
    out, idx = cypool.max_pool2d(x, **cfg, return_indices=True)
    H, W = x.shape[-2:]
    if what in ("index", "negative index"):
        bad = idx.copy()
        bad.reshape(-1)[-1] = H * W if what == "index" else -1
        with pytest.raises(ValueError, match="indices"):
            cypool.max_pool2d_backward(np.ones_like(out), bad, x.shape)
        if cfg["dilation"] == (1, 1) and cfg["stride"] is not None:
            with pytest.raises(ValueError, match="indices|output_size"):
                cypool.max_unpool2d(out, bad, cfg["kernel_size"], cfg["stride"], cfg["padding"],
                                    output_size=(H, W))
        return
    bad_cfg = dict(cfg)
    k = cfg["kernel_size"]
    if what == "padding":
        bad_cfg["padding"] = (k[0] // 2 + 1, cfg["padding"][1])
    elif what == "stride":
        bad_cfg["stride"] = (0, 1)
    elif what == "dilation":
        bad_cfg["dilation"] = (1, 0)
    else:
        bad_cfg["kernel_size"] = (0, k[1])
    with pytest.raises(ValueError, match=what if what != "kernel" else "kernel_size"):
        cypool.max_pool2d(x, **bad_cfg)
