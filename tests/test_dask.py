"""cypool.dask against the in-memory functions: random shapes, parameters
and chunkings (uneven chunks, chunks of one, chunk edges off the stride),
ties, NaN and inf; on Dask's threaded scheduler and on a 2-process
distributed.LocalCluster on the loopback interface."""
import numpy as np
import pytest

da = pytest.importorskip("dask.array", reason="dask not installed: cypool.dask untested")
dask = pytest.importorskip("dask")

import cypool  # noqa: E402
import cypool.dask as cdask  # noqa: E402
from cypool import _geometry as geo  # noqa: E402


def random_chunks(rng, n):
    """A random partition of n: one chunk, chunks of one, or uneven cuts."""
    kind = rng.integers(4)
    if kind == 0 or n == 1:
        return (n,)
    if kind == 1:
        return (1,) * n
    cuts = np.sort(rng.choice(np.arange(1, n), size=rng.integers(1, min(n - 1, 4) + 1), replace=False))
    return tuple(np.diff(np.concatenate([[0], cuts, [n]])).tolist())


def chunked(rng, x, fixed=()):
    """x as a dask array in random chunks (axes in fixed: one chunk)."""
    chunks = tuple((n,) if a in fixed else random_chunks(rng, n) for a, n in enumerate(x.shape))
    return da.from_array(x, chunks=chunks)


def spiky(rng, shape, dtype):
    """Random values with ties, and for floats NaN, +inf and -inf."""
    x = rng.integers(-3, 4, size=shape).astype(dtype)  # few values: many ties
    if rng.random() < 0.5:
        x = rng.standard_normal(shape).astype(dtype) if np.dtype(dtype).kind == "f" else x
    if np.dtype(dtype).kind == "f":
        flat = x.reshape(-1)
        for v in (np.nan, np.inf, -np.inf):
            k = rng.integers(0, 3)
            flat[rng.integers(0, flat.size, size=k)] = v
    return x


@pytest.fixture(scope="module")
def cluster_client():
    distributed = pytest.importorskip("distributed", reason="distributed not installed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       host="127.0.0.1", dashboard_address=None)
    client = distributed.Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(params=["threads", "cluster"])
def compute(request):
    """compute(*dask arrays) -> numpy results, on the scheduler of the param;
    compute.cases(n): how many of n random cases to run there (a cluster
    round trip costs ~0.1 s: a third of them)."""
    if request.param == "threads":
        def run(*arrays):
            return dask.compute(*arrays, scheduler="threads")
        run.cases = lambda n: n
    else:
        client = request.getfixturevalue("cluster_client")

        def run(*arrays):
            return tuple(client.compute(list(arrays), sync=True))
        run.cases = lambda n: max(2, n // 3)
    return run


def same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f")


def test_argmax2d(rng, compute):
    for case in range(compute.cases(12)):
        ndim = int(rng.integers(2, 5))
        shape = tuple(int(n) for n in rng.integers(1, 6, size=ndim - 2)) + tuple(
            int(n) for n in rng.integers(1, 19, size=2))
        dtype = rng.choice([np.float32, np.float64, np.float16, np.int32, np.int64])
        x = spiky(rng, shape, dtype)
        X = chunked(rng, x)
        idt = rng.choice([np.int32, np.int64])
        v, c = compute(*cdask.argmax2d(X, return_values=True, index_dtype=idt))
        v0, c0 = cypool.argmax2d(x, return_values=True, index_dtype=idt)
        same(v, v0)
        same(c, c0)
        (c1,) = compute(cdask.argmax2d(X, index_dtype=idt))
        same(c1, c0)


def test_argmax2d_first_maximum_across_chunks(compute):
    # Ties and NaN in several chunks of a map: the first in row-major order wins.
    x = np.zeros((2, 6, 6))
    x[0, 4, 0] = x[0, 1, 5] = x[0, 5, 5] = 7.0  # (1, 5) is first, in another chunk than (4, 0)
    x[1, 3, 3] = x[1, 2, 4] = np.nan  # (2, 4) first
    x[1, 0, 0] = np.inf
    X = da.from_array(x, chunks=(1, 3, 2))
    v, c = compute(*cdask.argmax2d(X, return_values=True))
    assert c.tolist() == [[1, 5], [2, 4]]
    assert v[0] == 7.0 and np.isnan(v[1])


def pool_params(rng, H, W):
    """Random max-pooling parameters valid for an (H, W) plane, or None."""
    k = tuple(int(v) for v in rng.integers(1, 5, size=2))
    s = tuple(int(v) for v in rng.integers(1, 4, size=2)) if rng.random() < 0.8 else None
    p = tuple(int(rng.integers(0, kk // 2 + 1)) for kk in k)
    d = tuple(int(v) for v in rng.integers(1, 3, size=2))
    ceil = bool(rng.random() < 0.4)
    try:
        geo.pool_geometry(H, W, k, s, p, d, ceil)
    except ValueError:
        return None
    return dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)


def test_max_pool2d_and_backward(rng, compute):
    done = 0
    while done < compute.cases(14):
        batched = rng.random() < 0.7
        shape = ((int(rng.integers(1, 4)),) if batched else ()) + (
            int(rng.integers(1, 4)), int(rng.integers(1, 20)), int(rng.integers(1, 20)))
        params = pool_params(rng, *shape[-2:])
        if params is None:
            continue
        done += 1
        dtype = rng.choice([np.float32, np.float64, np.int32, np.float16])
        x = spiky(rng, shape, dtype)
        X = chunked(rng, x)
        idt = rng.choice([np.int32, np.int64])
        out, idx = compute(*cdask.max_pool2d(X, return_indices=True, index_dtype=idt, **params))
        out0, idx0 = cypool.max_pool2d(x, return_indices=True, index_dtype=idt, **params)
        same(out, out0)
        same(idx, idx0)
        (plain,) = compute(cdask.max_pool2d(X, **params))
        same(plain, out0)
        if dtype not in (np.float32, np.float64):
            continue
        g = rng.standard_normal(out0.shape).astype(dtype)
        (gx,) = compute(cdask.max_pool2d_backward(chunked(rng, g), chunked(rng, idx0), shape))
        same(gx, cypool.max_pool2d_backward(g, idx0, shape))


def test_max_pool2d_chunk_edges_off_the_stride(compute):
    # Every chunk edge between window starts, windows overlapping (k3 s2),
    # the padding on both sides, and ties across the edges.
    x = np.zeros((1, 1, 17, 17), np.float32)
    x[0, 0, ::4, ::3] = 1.0
    X = da.from_array(x, chunks=(1, 1, (3, 1, 5, 8), (2, 2, 2, 11)))
    for ceil in (False, True):
        out, idx = compute(*cdask.max_pool2d(X, 3, 2, 1, ceil_mode=ceil, return_indices=True))
        out0, idx0 = cypool.max_pool2d(x, 3, 2, 1, ceil_mode=ceil, return_indices=True)
        same(out, out0)
        same(idx, idx0)


def conv_cases(rng, n):
    """n random vector convolutions that the in-memory function accepts:
    (x, weight, bias or None, parameters, its output)."""
    done = 0
    while done < n:
        batched = rng.random() < 0.6
        C, O = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        kh, kw = (int(v) for v in rng.integers(1, 4, size=2))
        E = int(rng.choice([1, 3, 8, 17, 24]))
        H, W = (int(v) for v in rng.integers(3, 14, size=2))
        params = dict(stride=tuple(int(v) for v in rng.integers(1, 3, size=2)),
                      padding=tuple(int(v) for v in rng.integers(0, 3, size=2)),
                      dilation=tuple(int(v) for v in rng.integers(1, 3, size=2)))
        dtype = rng.choice([np.float32, np.float64])
        shape = ((int(rng.integers(1, 4)),) if batched else ()) + (C, H, W, E)
        x = rng.standard_normal(shape).astype(dtype)
        x.reshape(-1)[rng.integers(0, x.size, size=3)] = 0.5  # repeated values
        w = rng.standard_normal((O, C, kh, kw)).astype(dtype)
        b = rng.standard_normal(O).astype(dtype) if rng.random() < 0.7 else None
        try:
            out = cypool.vector_conv2d(x, w, b, **params)
        except ValueError:  # kernel larger than the padded input
            continue
        done += 1
        yield x, w, b, params, out


def test_vector_conv2d(rng, compute):
    for x, w, b, params, out0 in conv_cases(rng, compute.cases(10)):
        (out,) = compute(cdask.vector_conv2d(chunked(rng, x), w, b, **params))
        same(out, out0)


def test_vector_conv2d_backward(rng, compute):
    for x, w, _, params, out0 in conv_cases(rng, compute.cases(8)):
        g = rng.standard_normal(out0.shape).astype(x.dtype)
        lead = x.ndim - 4
        X = chunked(rng, x, fixed=range(lead, lead + 3))  # chunked along N and E
        G = chunked(rng, g)
        gx0, gw0, gb0 = cypool.vector_conv2d_backward(g, x, w, **params)
        res = cdask.vector_conv2d_backward(G, X, w, **params)
        gx, gw, gb = compute(*res)
        same(gx, gx0)  # exact: each chunk runs the kernels the whole array would
        tol = dict(rtol=1e-5, atol=1e-4) if x.dtype == np.float32 else dict(rtol=1e-12, atol=1e-10)
        np.testing.assert_allclose(gw, gw0, **tol)
        np.testing.assert_allclose(gb, gb0, **tol)
        assert gw.dtype == gw0.dtype and gb.shape == gb0.shape
        gx2, gw2, gb2 = compute(*res)  # the same chunking: the same bits
        same(gw2, gw)
        same(gb2, gb)


def test_vector_conv2d_bias_on_component_0_only():
    x = np.zeros((1, 4, 4, 6))
    w = np.ones((2, 1, 1, 1))
    out = cdask.vector_conv2d(da.from_array(x, chunks=(1, 4, 4, (1, 2, 3))), w, np.array([1.0, 2.0]))
    out = out.compute(scheduler="sync")
    assert (out[..., 0] == np.array([1.0, 2.0])[:, None, None]).all()
    assert (out[..., 1:] == 0).all()


def exploding(shape, dtype=np.float64, chunks=None):
    """A dask array that raises if anything is ever computed from it."""
    def boom(block):
        raise AssertionError("computed while building the graph")
    base = da.zeros(shape, dtype=dtype, chunks=chunks or shape)
    return base.map_blocks(boom, dtype=dtype)


@pytest.mark.parametrize("call", [
    lambda m, x: m.max_pool2d(x, 0),
    lambda m, x: m.max_pool2d(x, 3, padding=2),
    lambda m, x: m.max_pool2d(x, 2, stride=2.0),
    lambda m, x: m.max_pool2d(x, 2, return_indices=True, index_dtype=np.int16),
    lambda m, x: m.max_pool2d(x, 2, num_threads=0),
    lambda m, x: m.max_pool2d(x, 40),
    lambda m, x: m.argmax2d(x, index_dtype=np.float32),
    lambda m, x: m.argmax2d(x[0, 0, 0]),
    lambda m, x: m.max_pool2d_backward(x[:, :, :4, :4], np.zeros((2, 3, 4, 4), np.float32), (2, 3, 8, 8)),
    lambda m, x: m.max_pool2d_backward(x[:, :, :4, :4], np.zeros((2, 3, 4, 4), np.int64), (2, 3, 8)),
    lambda m, x: m.vector_conv2d(x[..., None], np.ones((2, 4, 3, 3))),
    lambda m, x: m.vector_conv2d(x[..., None], np.ones((2, 3, 3, 3), np.float32)),
    lambda m, x: m.vector_conv2d(x[..., None], np.ones((2, 3, 3, 3)), np.ones(3)),
    lambda m, x: m.vector_conv2d(x[..., None], np.ones((2, 3, 3, 3)), stride=0),
    lambda m, x: m.vector_conv2d(x[..., None], np.ones((2, 3, 30, 3))),
    lambda m, x: m.vector_conv2d_backward(np.ones((2, 2, 5, 6, 1)), x[..., None], np.ones((2, 3, 3, 3))),
])
def test_bad_input_refused_when_the_graph_is_built(call):
    x = np.zeros((2, 3, 8, 8))
    with pytest.raises((TypeError, ValueError)) as want:
        call(cypool, x)
    with pytest.raises(want.type) as got:
        call(cdask, exploding(x.shape, chunks=(1, 2, 3, 5)))
    assert str(got.value) == str(want.value)


def test_unknown_chunks_and_non_arrays_refused():
    x = da.from_array(np.arange(12.0).reshape(3, 4), chunks=2)
    with pytest.raises(ValueError, match="x has unknown chunk sizes"):
        cdask.argmax2d(x[x[:, 0] > 1])
    with pytest.raises(TypeError, match="x must be a dask or numpy array"):
        cdask.argmax2d("abc")


def test_numpy_input_is_one_chunk():
    x = np.random.default_rng(0).standard_normal((2, 3, 5, 5))
    out = cdask.max_pool2d(x, 2)
    assert isinstance(out, da.Array)
    same(out.compute(), cypool.max_pool2d(x, 2))


def test_vector_conv2d_backward_chunks_run_the_whole_arrays_kernels():
    # E = 40 takes the E-vectorised kernels, a chunk of 8 alone the small-E
    # ones: they round differently, and grad_x must be the whole array's.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 9, 9, 40))
    w = rng.standard_normal((4, 3, 3, 3))
    g = rng.standard_normal((2, 4, 9, 9, 40))
    gx0 = cypool.vector_conv2d_backward(g, x, w, padding=1)[0]
    X = da.from_array(x, chunks=(1, 3, 9, 9, (8, 32)))
    gx = cdask.vector_conv2d_backward(g, X, w, padding=1)[0].compute(scheduler="sync")
    same(gx, gx0)
