"""argmax2d and GlobalMaxPool2d against numpy's argmax + unravel_index."""
import numpy as np
import pytest

import cypool
import reference as ref
from helpers import torch_or_skip


def np_argmax2d(x):
    """The issue's definition: unravel_index of argmax over the flattened map."""
    H, W = x.shape[-2:]
    flat = x.reshape(*x.shape[:-2], H * W)
    a = flat.argmax(-1)
    return np.stack(np.unravel_index(a, (H, W)), axis=-1), np.take_along_axis(flat, a[..., None], -1)[..., 0]


@pytest.mark.parametrize("trial", range(40))
@pytest.mark.parametrize("kind", ["plain", "ties", "specials"])
def test_matches_numpy_on_random_shapes(rng, trial, kind):
    ndim = int(rng.integers(2, 6))
    lead = tuple(int(v) for v in rng.integers(1, 4, size=ndim - 2))
    H, W = (int(v) for v in rng.integers(1, 70, size=2))
    dtype = [np.float32, np.float64, np.int32, np.int64, np.int8, np.uint16][trial % 6]
    x = ref.random_values(rng, lead + (H, W), dtype, ties=kind == "ties",
                          specials=kind == "specials" and np.dtype(dtype).kind == "f")
    want_c, want_v = np_argmax2d(x)
    got_v, got_c = cypool.argmax2d(x, return_values=True)
    np.testing.assert_array_equal(got_c, want_c)
    assert got_c.dtype == np.int64 and got_v.dtype == x.dtype
    np.testing.assert_array_equal(got_v, want_v)


@pytest.mark.parametrize("fill", [0.0, -np.inf, np.inf, np.nan, 7.0])
def test_constant_maps(fill):
    x = np.full((2, 3, 33, 65), fill, dtype=np.float32)
    np.testing.assert_array_equal(cypool.argmax2d(x), np.zeros((2, 3, 2), np.int64))


def test_nan_placement_first_nan_wins(rng):
    x = rng.standard_normal((4, 50, 70)).astype(np.float32)
    x[1, 10, 5] = np.nan
    x[1, 30, 0] = np.nan
    x[2, 49, 69] = np.nan  # last element
    x[3, 0, 0] = np.nan  # first element
    np.testing.assert_array_equal(cypool.argmax2d(x), np_argmax2d(x)[0])
    np.testing.assert_array_equal(cypool.argmax2d(x)[1:], [[10, 5], [49, 69], [0, 0]])


def test_late_maximum_and_ties_across_chunks():
    x = np.zeros((1, 100, 100), np.float64)
    x[0, 99, 98] = x[0, 99, 99] = 1.0
    x[0, 50, 3] = 0.5
    np.testing.assert_array_equal(cypool.argmax2d(x), [[99, 98]])
    x[0, 7, 7] = 1.0
    np.testing.assert_array_equal(cypool.argmax2d(x), [[7, 7]])


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_split_large_maps_merge_in_order(rng, threads):
    # One or two large maps are split across threads: ties and NaN across segments.
    for nmaps in (1, 2):
        x = np.round(rng.standard_normal((nmaps, 512, 300)), 1).astype(np.float32)
        x[0, 400, 7] = x[0, 100, 3] = x[0, 450, 299] = 9.0  # tie: the earliest must win
        got = cypool.argmax2d(x, num_threads=threads)
        np.testing.assert_array_equal(got, np_argmax2d(x)[0])
        x[0, 300, 1] = np.nan
        x[0, 499, 0] = np.nan
        np.testing.assert_array_equal(cypool.argmax2d(x, num_threads=threads), np_argmax2d(x)[0])


def test_non_contiguous_views(rng):
    base = ref.random_values(rng, (6, 5, 40, 36), np.float32, ties=True, specials=True)
    for x in (base.transpose(1, 0, 3, 2), base[::2, :, ::3, 1::2], base[..., ::-1, :]):
        assert not x.flags.c_contiguous
        np.testing.assert_array_equal(cypool.argmax2d(x), np_argmax2d(x)[0])


def test_int32_index_dtype(rng):
    x = rng.standard_normal((3, 20, 20))
    c = cypool.argmax2d(x, index_dtype=np.int32)
    assert c.dtype == np.int32
    np.testing.assert_array_equal(c, np_argmax2d(x)[0])


@pytest.mark.parametrize("x, kwargs, exc, name", [
    (np.zeros(5), {}, ValueError, "x"),
    (np.zeros((3, 0, 4)), {}, ValueError, "x"),
    (np.zeros((3, 4, 0)), {}, ValueError, "x"),
    (np.zeros((3, 4), bool), {}, TypeError, "x"),
    (np.zeros((3, 4), complex), {}, TypeError, "x"),
    (np.zeros((3, 4), object), {}, TypeError, "x"),
    (np.zeros((3, 4)), dict(index_dtype=np.float32), TypeError, "index_dtype"),
    (np.zeros((3, 4)), dict(num_threads=0), ValueError, "num_threads"),
])
def test_bad_input(x, kwargs, exc, name):
    with pytest.raises(exc, match=name):
        cypool.argmax2d(x, **kwargs)


def test_int32_index_dtype_too_small_for_the_map():
    big = np.broadcast_to(np.zeros(1, np.int8), (1, 2**31, 1))
    with pytest.raises(ValueError, match="index_dtype"):
        cypool.argmax2d(big, index_dtype=np.int32)


def test_global_max_pool_layer(rng):
    x = ref.random_values(rng, (2, 5, 9, 11), np.float64, ties=True)
    layer = cypool.GlobalMaxPool2d()
    y = layer(x)
    np.testing.assert_array_equal(y, x.max(axis=(2, 3)))
    np.testing.assert_array_equal(layer.coords, np_argmax2d(x)[0])
    g = rng.standard_normal(y.shape)
    gx = layer.backward(g)
    want = np.zeros_like(x)
    for n, c in np.ndindex(y.shape):
        r, col = layer.coords[n, c]
        want[n, c, r, col] = g[n, c]
    np.testing.assert_array_equal(gx, want)
    # unbatched, and eval keeps nothing
    assert layer(x[0]).shape == (5,)
    assert layer.backward(g[0]).shape == x[0].shape
    layer.eval()
    layer(x)
    assert layer.coords is None
    with pytest.raises(RuntimeError):
        layer.backward(g)


def test_global_max_pool_rejects_bad_grad(rng):
    layer = cypool.GlobalMaxPool2d()
    layer(rng.standard_normal((2, 3, 4, 4)))
    with pytest.raises(ValueError, match="grad_output"):
        layer.backward(np.zeros((2, 4)))


def test_matches_torch(rng):
    torch = torch_or_skip()
    x = ref.random_values(rng, (4, 7, 31, 29), np.float32)
    t = torch.from_numpy(x).flatten(2).argmax(-1)
    want = np.stack([(t // 29).numpy(), (t % 29).numpy()], -1)
    np.testing.assert_array_equal(cypool.argmax2d(x), want)


@pytest.mark.parametrize("trial", range(5))
def test_many_maps_in_parallel(rng, trial):
    # Enough work for the parallel path over maps (each thread owns whole maps).
    # Many tiny maps make threads finish maps at the same moments: a result
    # shared between threads by mistake shows up here.
    for shape in [(4, 16, 64, 64), (1, 30000, 3, 3)]:
        x = ref.random_values(rng, shape, np.float32, ties=True, specials=trial % 2 == 1)
        for threads in (2, 3):
            np.testing.assert_array_equal(cypool.argmax2d(x, num_threads=threads), np_argmax2d(x)[0])
