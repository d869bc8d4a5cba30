"""max_pool2d / max_pool2d_backward / max_unpool2d against the numpy reference."""
import numpy as np
import pytest

import cypool
from cypool._backend import module_for
import reference as ref
from helpers import pool_kernel, torch_or_skip


def random_config(rng):
    """A random valid pooling configuration and input shape."""
    while True:
        kh, kw = rng.integers(1, 5, size=2)
        sh, sw = rng.integers(1, 4, size=2)
        dh, dw = rng.integers(1, 3, size=2)
        ph, pw = rng.integers(0, kh // 2 + 1), rng.integers(0, kw // 2 + 1)
        H, W = rng.integers(1, 12, size=2)
        ceil = bool(rng.integers(0, 2))
        try:
            cypool._geometry.pool_geometry(int(H), int(W), (int(kh), int(kw)), (int(sh), int(sw)),
                                         (int(ph), int(pw)), (int(dh), int(dw)), ceil)
        except ValueError:
            continue
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(H), int(W))
        return shape, dict(kernel_size=(int(kh), int(kw)), stride=(int(sh), int(sw)),
                           padding=(int(ph), int(pw)), dilation=(int(dh), int(dw)), ceil_mode=ceil)


def ref_pool(x, cfg):
    return ref.max_pool2d(x, cfg["kernel_size"], cfg["stride"], cfg["padding"],
                          cfg["dilation"], cfg["ceil_mode"])


def assert_same(a, b):
    """Equal values with NaN == NaN, and equal dtype and shape."""
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("trial", range(60))
@pytest.mark.parametrize("kind", ["plain", "ties", "specials"])
def test_forward_random_configs(rng, trial, kind, set_streams):
    shape, cfg = random_config(rng)
    dtype = [np.float32, np.float64][trial % 2]
    x = ref.random_values(rng, shape, dtype, ties=kind == "ties", specials=kind == "specials")
    out, idx = cypool.max_pool2d(x, **cfg, return_indices=True)
    rout, ridx = ref_pool(x, cfg)
    assert_same(out, rout)
    assert_same(idx, ridx)
    assert_same(cypool.max_pool2d(x, **cfg), rout)  # the no-index path
    # Indices streamed, as for calls larger than the cache.
    set_streams(True)
    for index_dtype in (np.int64, np.int32):
        out, idx = cypool.max_pool2d(x, **cfg, return_indices=True, index_dtype=index_dtype)
        assert_same(out, rout)
        assert_same(idx, ridx.astype(index_dtype))


@pytest.mark.parametrize("trial", range(24))
def test_small_planes_many_channels(rng, trial):
    # The small-plane path pools 16 planes at a time: full blocks, a last
    # partial block, one plane; ties, NaN, inf; every dtype; 1 and 2 threads.
    while True:
        shape, cfg = random_config(rng)
        if shape[-2] * shape[-1] <= 256:
            break
    P = int(rng.choice([1, 15, 16, 17, 40, 67]))
    shape = (1, P) + shape[-2:]
    dtype = [np.float32, np.float64, np.int32, np.int64, np.float16][trial % 5]
    x = ref.random_values(rng, shape, dtype, ties=trial % 3 == 0, specials=trial % 3 == 1)
    rout, ridx = ref_pool(x, cfg)
    for index_dtype in (np.int64, np.int32):
        for nt in (1, 2):
            out, idx = cypool.max_pool2d(x, **cfg, return_indices=True, index_dtype=index_dtype,
                                         num_threads=nt)
            assert_same(out, rout)
            assert_same(idx, ridx.astype(index_dtype))
    assert_same(cypool.max_pool2d(x, **cfg), rout)


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
@pytest.mark.parametrize("hw", [(1, 1), (2, 3), (3, 5), (7, 7), (8, 8), (5, 13), (9, 9), (14, 14),
                                (16, 16)])
def test_small_planes_4_byte_transposes(rng, dtype, hw):
    """4-byte values go into and out of the planes-innermost layout in 8x8
    blocks: plane sizes and output counts that are and are not multiples
    of 8, a partial last block of planes, both index dtypes (3x3/s1/p1
    takes the flat path)."""
    x = ref.random_values(rng, (2, 21) + hw, dtype, ties=True,
                          specials=np.dtype(dtype).kind == "f")
    for k, s, p in [(2, 2, 0), (3, 1, 1), (3, 2, 1), (1, 1, 0)]:
        if min(hw) < k - 2 * p or (hw[0] + 2 * p) < k or (hw[1] + 2 * p) < k:
            continue
        rout, ridx = ref.max_pool2d(x, k, s, p, 1, False)
        for index_dtype in (np.int64, np.int32):
            for nt in (1, 2):
                out, idx = cypool.max_pool2d(x, k, s, p, return_indices=True,
                                             index_dtype=index_dtype, num_threads=nt)
                assert_same(out, rout)
                assert_same(idx, ridx.astype(index_dtype))


def test_small_planes_late_layer_shapes(rng):
    # The specialised cases of VGG/ResNet late layers, with ties and NaN.
    for shape, k, s, p in [((3, 40, 14, 14), 2, 2, 0), ((2, 33, 7, 7), 3, 2, 1), ((2, 20, 7, 7), 3, 1, 1),
                           ((1, 17, 16, 16), 2, 2, 0), ((2, 9, 13, 13), 3, 2, 1)]:
        x = ref.random_values(rng, shape, np.float32, ties=True)
        x[0, 0, 1, 1] = np.nan
        for ceil in (False, True):
            out, idx = cypool.max_pool2d(x, k, s, p, ceil_mode=ceil, return_indices=True)
            rout, ridx = ref.max_pool2d(x, k, s, p, 1, ceil)
            assert_same(out, rout)
            assert_same(idx, ridx)


@pytest.mark.parametrize("case", ["2x2s2", "3x3s1p1", "3x3s2p1", "2x2s2ceil", "3x3s2p1ceil"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("stream", [False, True])
def test_specialised_paths(rng, case, dtype, stream, set_streams):
    set_streams(stream)
    cfg = {
        "2x2s2": dict(kernel_size=2, stride=2),
        "3x3s1p1": dict(kernel_size=3, stride=1, padding=1),
        "3x3s2p1": dict(kernel_size=3, stride=2, padding=1),
        "2x2s2ceil": dict(kernel_size=2, stride=2, ceil_mode=True),
        "3x3s2p1ceil": dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    }[case]
    for shape in [(2, 3, 9, 13), (1, 2, 24, 24), (1, 1, 3, 3), (2, 1, 2, 37)]:
        if case.startswith("3x3") and min(shape[-2:]) < 2:
            continue
        for kind in ["plain", "ties", "specials"]:
            x = ref.random_values(rng, shape, dtype, ties=kind == "ties",
                                  specials=kind == "specials" and np.dtype(dtype).kind == "f")
            full = {"kernel_size": None, "stride": None, "padding": 0, "dilation": 1, "ceil_mode": False}
            full.update(cfg)
            rout, ridx = ref_pool(x, full)
            out, idx = cypool.max_pool2d(x, **cfg, return_indices=True)
            assert_same(out, rout)
            assert_same(idx, ridx)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 1, 7), (2, 1, 7, 1), (2, 3, 28, 28),
                                   (1, 2, 5, 39), (1, 2, 5, 40), (1, 1, 500, 30)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
def test_3x3_stride1_pad1_flat_path(rng, shape, dtype, stream, set_streams):
    """3x3/s1/p1 ("same") pooling runs over small planes as one flat loop
    with row-edge masks; rows of 40 and more, and (1, 1, 500, 30) (above
    its size limit), take the row path. Edges, ties, specials and
    all-lowest planes on both; indices written with plain stores and, as
    for inputs larger than the cache, with streaming stores."""
    set_streams(stream)
    for kind in ["plain", "ties", "specials", "lowest"]:
        x = ref.random_values(rng, shape, dtype, ties=kind == "ties",
                              specials=kind == "specials" and np.dtype(dtype).kind == "f")
        if kind == "lowest":
            low = -np.inf if np.dtype(dtype).kind == "f" else np.iinfo(dtype).min
            x[..., : shape[-2] // 2 + 1, :] = low
        rout, ridx = ref.max_pool2d(x, 3, 1, 1, 1, False)
        out, idx = cypool.max_pool2d(x, 3, 1, 1, return_indices=True)
        assert_same(out, rout)
        assert_same(idx, ridx)
        assert_same(cypool.max_pool2d(x, 3, 1, 1), rout)
        _, idx32 = cypool.max_pool2d(x, 3, 1, 1, return_indices=True, index_dtype=np.int32)
        assert_same(idx32, ridx.astype(np.int32))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flat_path_redoes_only_planes_with_nan(rng, dtype, stream, set_streams):
    """The flat 3x3 path scans a plane without NaN with plain compares and
    redoes a plane holding one, with indices and without: a single NaN at
    the plane's first or last element, at a row's first or last column or inside, among planes with
    none (some with +-inf), and planes of 23 values, so that the index
    planes of a batch start at every alignment."""
    set_streams(stream)
    for H, W in [(6, 7), (1, 23), (28, 28)]:
        spots = [0, H * W - 1, W - 1, (H - 1) * W, H * W // 2]
        x = rng.standard_normal((len(spots) + 3, 2, H, W)).astype(dtype)
        x[-1, 0].flat[::3] = np.inf
        x[-1, 1].flat[1::4] = -np.inf
        for i, at in enumerate(spots):
            x[i, i % 2].flat[at] = np.nan
        rout, ridx = ref.max_pool2d(x, 3, 1, 1, 1, False)
        for step in (1, 2):  # all planes, and a non-contiguous view
            out, idx = cypool.max_pool2d(x[::step], 3, 1, 1, return_indices=True)
            assert_same(out, rout[::step])
            assert_same(idx, ridx[::step])
            assert_same(cypool.max_pool2d(x[::step], 3, 1, 1), rout[::step])


@pytest.mark.parametrize("cfg", [dict(kernel_size=2, stride=2), dict(kernel_size=3, stride=1, padding=1),
                                 dict(kernel_size=3, stride=2, padding=1),
                                 dict(kernel_size=3, stride=1, padding=1, dilation=2)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_signed_zero_ties_keep_the_first(rng, cfg, dtype):
    """-0.0 == 0.0, so a window of both ties: the output is the first one,
    sign included, with indices and without (the paths without indices
    have loops of their own)."""
    x = rng.choice(np.array([-0.0, 0.0, -1.0], dtype=dtype), size=(2, 3, 28, 28))
    full = {"stride": None, "padding": 0, "dilation": 1, "ceil_mode": False}
    full.update(cfg)
    rout, _ = ref_pool(x, full)
    bits = np.uint32 if dtype == np.float32 else np.uint64
    out, _ = cypool.max_pool2d(x, **cfg, return_indices=True)
    np.testing.assert_array_equal(out.view(bits), rout.view(bits))
    np.testing.assert_array_equal(cypool.max_pool2d(x, **cfg).view(bits), rout.view(bits))


@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("shape", [(9, 1, 28, 28), (7, 2, 5, 13), (100, 1, 28, 28)])
def test_flat_path_streams_a_plane_during_the_next(rng, shape, index_dtype, set_streams):
    """On the float32 flat 3x3 path, a plane's indices are streamed while
    the next plane is pooled, from the other of two buffers; a plane with
    NaN, and each thread's last plane, stream theirs at the end. Planes of
    65 outputs leave a tail and partial lines; (100, 1, 28, 28) runs on a
    thread team (OpenMP's default size). Streamed results equal those written directly, which the
    other tests check against the reference (and the small shapes are
    checked against it here too)."""
    x = rng.standard_normal(shape).astype(np.float32)
    x[3, 0, 2, 4] = np.nan
    x[-1, 0, 0, 0] = np.nan
    results = {}
    for stream in (False, True):
        set_streams(stream)
        results[stream] = cypool.max_pool2d(x, 3, 1, 1, return_indices=True, index_dtype=index_dtype)
    assert_same(results[True][0], results[False][0])
    assert_same(results[True][1], results[False][1])
    if x.size < 10000:
        rout, ridx = ref.max_pool2d(x, 3, 1, 1, 1, False)
        assert_same(results[True][0], rout)
        assert_same(results[True][1], ridx.astype(index_dtype))


def test_indices_stream_only_when_that_keeps_the_rest_cached():
    from cypool import _backend
    llc = _backend.LAST_LEVEL_CACHE
    assert llc >= 1 << 20
    assert _backend.streams(llc // 2, llc)          # input and output still fit
    assert _backend.streams(llc, 1)
    assert not _backend.streams(llc // 4, llc // 4)  # everything fits anyway
    assert not _backend.streams(2 * llc, llc)        # nothing stays cached anyway


def test_constant_and_all_minus_inf_planes_index_first_valid_tap():
    for fill in [0.0, -np.inf, np.inf, np.nan]:
        x = np.full((1, 2, 5, 6), fill, dtype=np.float32)
        for cfg in [dict(kernel_size=3, stride=1, padding=1), dict(kernel_size=2, stride=2),
                    dict(kernel_size=3, stride=2, padding=1, dilation=2, ceil_mode=True)]:
            rout, ridx = ref.max_pool2d(x, cfg["kernel_size"], cfg["stride"], cfg.get("padding", 0),
                                        cfg.get("dilation", 1), cfg.get("ceil_mode", False))
            out, idx = cypool.max_pool2d(x, **cfg, return_indices=True)
            assert_same(out, rout)
            assert_same(idx, ridx)


def test_integer_extremes_and_small_int_dtypes(rng):
    for dtype in [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.float16]:
        x = ref.random_values(rng, (2, 2, 7, 8), dtype)
        x[0, 0, :3, :3] = np.iinfo(dtype).min if np.dtype(dtype).kind != "f" else -np.inf
        out, idx = cypool.max_pool2d(x, 3, 2, 1, return_indices=True)
        rout, ridx = ref.max_pool2d(x, 3, 2, 1)
        assert_same(out, rout)
        assert_same(idx, ridx)


def test_first_nan_wins_and_nan_beats_inf():
    x = np.array([[[[1.0, np.inf], [np.nan, np.nan]]]], dtype=np.float32)
    out, idx = cypool.max_pool2d(x, 2, return_indices=True)
    assert np.isnan(out[0, 0, 0, 0]) and idx[0, 0, 0, 0] == 2


def test_ties_pick_first_in_row_major_order():
    x = np.zeros((1, 1, 4, 4), dtype=np.float64)
    x[0, 0, 1, 0] = x[0, 0, 0, 1] = 5  # both in window (0, 0); (0, 1) comes first
    _, idx = cypool.max_pool2d(x, 2, return_indices=True)
    assert idx[0, 0, 0, 0] == 1


@pytest.mark.parametrize("view", ["transpose", "slice", "negative", "channels_last"])
def test_non_contiguous_views(rng, view):
    base = ref.random_values(rng, (3, 4, 10, 12), np.float32, ties=True)
    x = {
        "transpose": base.transpose(1, 0, 2, 3),
        "slice": base[:, ::2, 1::1, ::2],
        "negative": base[:, :, ::-1, ::-1],
        "channels_last": np.ascontiguousarray(base.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2),
    }[view]
    assert not x.flags.c_contiguous
    for cfg in [dict(kernel_size=2), dict(kernel_size=3, stride=1, padding=1)]:
        a = cypool.max_pool2d(x, **cfg, return_indices=True)
        b = cypool.max_pool2d(np.ascontiguousarray(x), **cfg, return_indices=True)
        assert_same(a[0], b[0])
        assert_same(a[1], b[1])


def test_unbatched_and_int32_indices(rng):
    x = ref.random_values(rng, (3, 9, 9), np.float64, ties=True)
    out, idx = cypool.max_pool2d(x, 3, 2, 1, return_indices=True, index_dtype=np.int32)
    rout, ridx = ref.max_pool2d(x, 3, 2, 1)
    assert out.shape == (3, 5, 5) and idx.dtype == np.int32
    assert_same(out, rout)
    np.testing.assert_array_equal(idx, ridx)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, np.int8])
@pytest.mark.parametrize("trial", range(6))
def test_out_argument_matches_the_reference(rng, dtype, trial):
    """out= is written in full and returned (poisoned buffers, every thread
    count, both index dtypes, batched and unbatched, a non-contiguous
    input; float16 and int8 are computed widened and stored back)."""
    shape, cfg = random_config(rng)
    x = ref.random_values(rng, shape, dtype, ties=True, specials=np.dtype(dtype).kind == "f")
    if trial % 2:
        x = np.ascontiguousarray(x.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    if trial % 3 == 2:
        x = x[0]
    rout, ridx = ref_pool(x, cfg)
    poison = 7 if np.dtype(dtype).kind == "i" else np.nan
    for nt in (1, 2):
        for index_dtype in (np.int64, np.int32):
            vals = np.full(rout.shape, poison, dtype)
            ind = np.full(rout.shape, -5, index_dtype)
            got = cypool.max_pool2d(x, **cfg, return_indices=True, index_dtype=index_dtype,
                                    out=(vals, ind), num_threads=nt)
            assert got[0] is vals and got[1] is ind
            assert_same(vals, rout)
            assert_same(ind, ridx.astype(index_dtype))
        vals = np.full(rout.shape, poison, dtype)
        assert cypool.max_pool2d(x, **cfg, out=vals, num_threads=nt) is vals
        assert_same(vals, rout)


def test_out_argument_bad_input():
    x = np.zeros((2, 3, 8, 8), np.float32)
    good_v, good_i = np.empty((2, 3, 4, 4), np.float32), np.empty((2, 3, 4, 4), np.int64)
    cases = [
        (dict(out=np.empty((2, 3, 4, 5), np.float32)), ValueError, "out must have shape"),
        (dict(out=np.empty((2, 3, 4, 4), np.float64)), TypeError, "out must have dtype"),
        (dict(out=np.empty((2, 3, 4, 8), np.float32)[..., ::2]), ValueError, "out must be a writable"),
        (dict(out=[0.0]), TypeError, "out must be a numpy array"),
        (dict(out=(good_v, good_i)), TypeError, "out must be one array"),
        (dict(out=good_v, return_indices=True), TypeError, "out must be a tuple"),
        (dict(out=(good_v,), return_indices=True), TypeError, "out must be a tuple"),
        (dict(out=(good_v, np.empty((2, 3, 4, 4), np.int32)), return_indices=True), TypeError,
         r"out\[1\] must have dtype"),
        (dict(out=(np.empty((3, 4, 4), np.float32), good_i), return_indices=True), ValueError,
         r"out\[0\] must have shape"),
        (dict(out=(good_v, np.empty((2, 3, 4, 2), np.int64)), return_indices=True), ValueError,
         r"out\[1\] must have shape"),
    ]
    for kwargs, exc, match in cases:
        with pytest.raises(exc, match=match):
            cypool.max_pool2d(x, 2, **kwargs)
    read_only = np.empty((2, 3, 4, 4), np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="out must be a writable"):
        cypool.max_pool2d(x, 2, out=read_only)
    # Outputs that overlap the input or each other.
    buf = np.zeros(2 * 3 * 8 * 8 * 2, np.float32)
    xa = buf[:x.size].reshape(x.shape)
    with pytest.raises(ValueError, match="out must not overlap x"):
        cypool.max_pool2d(xa, 2, out=buf[:96].reshape(2, 3, 4, 4))
    with pytest.raises(ValueError, match=r"out\[1\] must not overlap x"):
        cypool.max_pool2d(xa, 2, return_indices=True,
                          out=(good_v, buf[:192].view(np.int64).reshape(2, 3, 4, 4)))
    shared = np.zeros(96 * 2, np.int64)
    with pytest.raises(ValueError, match=r"out\[1\] must not overlap out\[0\]"):
        cypool.max_pool2d(x, 2, return_indices=True,
                          out=(shared.view(np.float32)[:96].reshape(2, 3, 4, 4),
                               shared[:96].reshape(2, 3, 4, 4)))


@pytest.mark.parametrize("trial", range(20))
def test_scalar_path_for_huge_planes_agrees(rng, trial):
    # Planes of 2**31+ elements take the scalar kernel; check it on small ones.
    shape, cfg = random_config(rng)
    x = ref.random_values(rng, shape, np.float64, ties=True, specials=trial % 2 == 1)
    planes = x.reshape(-1, *shape[-2:])
    out, idx = cypool.max_pool2d(x, **cfg, return_indices=True)
    geometry = cypool._geometry.pool_geometry(
        shape[2], shape[3], cfg["kernel_size"], cfg["stride"], cfg["padding"], cfg["dilation"], cfg["ceil_mode"])
    o2, i2 = pool_kernel(module_for("max_pool2d_forward"), planes, geometry, scalar_only=True)
    assert_same(o2.reshape(out.shape), out)
    assert_same(i2.reshape(idx.shape), idx)


def test_threads_give_identical_results(rng):
    x = ref.random_values(rng, (4, 16, 40, 40), np.float32, ties=True, specials=True)
    a = cypool.max_pool2d(x, 3, 2, 1, return_indices=True, num_threads=1)
    b = cypool.max_pool2d(x, 3, 2, 1, return_indices=True, num_threads=2)
    assert_same(a[0], b[0])
    assert_same(a[1], b[1])
    g = ref.random_values(rng, a[0].shape, np.float32)
    assert_same(cypool.max_pool2d_backward(g, a[1], x.shape, num_threads=1),
                cypool.max_pool2d_backward(g, a[1], x.shape, num_threads=2))


# ---------------------------------------------------------------- backward

@pytest.mark.parametrize("trial", range(30))
def test_backward_matches_add_at(rng, trial):
    shape, cfg = random_config(rng)
    dtype = [np.float32, np.float64][trial % 2]
    x = ref.random_values(rng, shape, dtype, ties=True)
    out, idx = cypool.max_pool2d(x, **cfg, return_indices=True)
    g = ref.random_values(rng, out.shape, dtype)
    got = cypool.max_pool2d_backward(g, idx, x.shape)
    want = ref.max_pool2d_backward(g, idx, x.shape)
    assert got.dtype == want.dtype and got.shape == x.shape
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == np.float32 else 1e-12)


def _bitwise_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("shape", [(2, 3, 32, 32), (1, 2, 57, 59), (3, 1, 4, 600), (1, 1, 2, 33)])
def test_backward_2x2_block_pass(rng, dtype, index_dtype, shape):
    """Rows of 16 or more 2x2/stride-2 outputs are written block by block
    instead of scattered: same result bit for bit (-0.0 gradients become
    +0.0 as in 0 + g; odd trailing rows and columns are zero), with ties,
    specials and gradients of every sign."""
    for kind in ["plain", "ties", "specials"]:
        x = ref.random_values(rng, shape, dtype, ties=kind == "ties", specials=kind == "specials")
        out, idx = cypool.max_pool2d(x, 2, 2, return_indices=True, index_dtype=index_dtype)
        g = ref.random_values(rng, out.shape, dtype, specials=True)
        g.flat[::7] = -0.0
        for nt in (1, 2):
            got = cypool.max_pool2d_backward(g, idx, x.shape, num_threads=nt)
            _bitwise_same(got, ref.max_pool2d_backward(g, idx, x.shape))


def test_backward_block_pass_falls_back_per_plane(rng):
    """Indices outside their own 2x2 block, in plane 0 or a later plane,
    still get the scatter's answer; an out-of-range one in a later plane
    still raises."""
    x = ref.random_values(rng, (2, 8, 64, 64), np.float32)
    out, idx = cypool.max_pool2d(x, 2, 2, return_indices=True)
    g = ref.random_values(rng, out.shape, np.float32)
    for plane in [(0, 0), (1, 5)]:
        moved = idx.copy()
        moved[plane][3, 20] = 0  # the plane's (0, 0): another block's position
        moved[plane][3, 21] = 0  # twice: the gradients must add up there
        for nt in (1, 2):
            _bitwise_same(cypool.max_pool2d_backward(g, moved, x.shape, num_threads=nt),
                          ref.max_pool2d_backward(g, moved, x.shape))
        moved[plane][5, 5] = 64 * 64
        with pytest.raises(ValueError, match="indices"):
            cypool.max_pool2d_backward(g, moved, x.shape, num_threads=2)
    # Overlapping 3x3/stride-2 pooling gives H = 2 OH too: indices leave
    # their 2x2 blocks, so plane 0 sends every plane to the scatter.
    out3, idx3 = cypool.max_pool2d(x, 3, 2, 1, return_indices=True)
    g3 = ref.random_values(rng, out3.shape, np.float32)
    np.testing.assert_allclose(cypool.max_pool2d_backward(g3, idx3, x.shape),
                               ref.max_pool2d_backward(g3, idx3, x.shape), rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("hw, k, s, p", [(7, 3, 1, 1), (7, 3, 2, 1), (8, 2, 2, 0), (4, 3, 1, 1)])
def test_backward_tiny_planes_in_runs(rng, dtype, hw, k, s, p):
    """Tiny planes are scattered several at a time: a plane count that is
    not a multiple of the run, repeated indices, and an out-of-range index
    in a plane inside a run (which must still raise)."""
    x = ref.random_values(rng, (3, 37, hw, hw), dtype, ties=True, specials=True)
    out, idx = cypool.max_pool2d(x, k, s, p, return_indices=True)
    g = ref.random_values(rng, out.shape, dtype)
    for nt in (1, 2):
        np.testing.assert_allclose(cypool.max_pool2d_backward(g, idx, x.shape, num_threads=nt),
                                   ref.max_pool2d_backward(g, idx, x.shape), rtol=1e-6)
    bad = idx.copy()
    bad[1, 13, 0, 0] = hw * hw
    for nt in (1, 2):
        with pytest.raises(ValueError, match="indices"):
            cypool.max_pool2d_backward(g, bad, x.shape, num_threads=nt)


def test_backward_overlapping_windows_accumulate():
    x = np.zeros((1, 1, 3, 3), dtype=np.float64)
    x[0, 0, 1, 1] = 1.0  # the maximum of all four 2x2 stride-1 windows
    out, idx = cypool.max_pool2d(x, 2, stride=1, return_indices=True)
    assert (idx == 4).all()
    g = cypool.max_pool2d_backward(np.ones_like(out), idx, x.shape)
    assert g[0, 0, 1, 1] == 4.0 and g.sum() == 4.0


def test_backward_sends_tied_gradient_to_one_element_unlike_mask_recipe():
    # The popular equality-mask recipe sends gradient to every tied maximum; we do not.
    x = np.ones((1, 1, 2, 2), dtype=np.float32)
    out, idx = cypool.max_pool2d(x, 2, return_indices=True)
    g = cypool.max_pool2d_backward(np.ones_like(out), idx, x.shape)
    np.testing.assert_array_equal(g[0, 0], [[1, 0], [0, 0]])


def test_backward_is_deterministic(rng):
    x = ref.random_values(rng, (2, 8, 33, 33), np.float32, ties=True)
    out, idx = cypool.max_pool2d(x, 3, 1, 1, return_indices=True)
    g = ref.random_values(rng, out.shape, np.float32)
    first = cypool.max_pool2d_backward(g, idx, x.shape)
    for _ in range(3):
        assert_same(cypool.max_pool2d_backward(g, idx, x.shape), first)


@pytest.mark.parametrize("bad", [-1, 20, 2**40])
def test_backward_out_of_range_index_raises(bad):
    idx = np.zeros((1, 1, 2, 2), dtype=np.int64)
    idx[0, 0, 1, 1] = bad
    with pytest.raises(ValueError, match="indices"):
        cypool.max_pool2d_backward(np.ones((1, 1, 2, 2), np.float32), idx, (1, 1, 4, 5))


# ---------------------------------------------------------------- unpool

@pytest.mark.parametrize("trial", range(20))
def test_unpool_matches_reference(rng, trial):
    while True:  # parameters whose unpooled output is not empty
        shape = (int(rng.integers(1, 3)), int(rng.integers(1, 4)), int(rng.integers(2, 9)), int(rng.integers(2, 9)))
        k, s = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        p = int(rng.integers(0, k // 2 + 1))
        H, W = shape[-2:]
        OH, OW = (H - 1) * s - 2 * p + k, (W - 1) * s - 2 * p + k
        if OH >= 1 and OW >= 1:
            break
    x = ref.random_values(rng, shape, np.float64)
    idx = rng.integers(0, OH * OW, size=shape)  # repeats included
    got = cypool.max_unpool2d(x, idx, k, s, p)
    assert_same(got, ref.max_unpool2d(x, idx, (OH, OW)))


def test_unpool_back_to_an_odd_size_after_ceil_mode(rng):
    # [1, 1, 5, 5] pooled 2x2/s2 with ceil_mode is 3x3; unpooling it with the
    # default size gives 6x6, and torch accepts 5x5 (default - stride < 5).
    x = ref.random_values(rng, (1, 2, 5, 5), np.float64)
    out, idx = cypool.max_pool2d(x, 2, ceil_mode=True, return_indices=True)
    u = cypool.max_unpool2d(out, idx, 2, output_size=x.shape)
    assert u.shape == x.shape
    np.testing.assert_array_equal(u, ref.max_unpool2d(out, idx, (5, 5)))
    layer = cypool.MaxUnpool2d(2)
    np.testing.assert_array_equal(layer(out, idx, output_size=(5, 5)), u)
    np.testing.assert_array_equal(layer.backward(u), cypool.max_unpool2d_backward(u, idx, out.shape))
    # The range is stated per dimension: (default - stride, default + stride).
    with pytest.raises(ValueError, match=r"height must be between 5 and 7"):
        cypool.max_unpool2d(out, idx, 2, output_size=(4, 5))
    with pytest.raises(ValueError, match=r"width must be between 5 and 7"):
        cypool.max_unpool2d(out, idx, 2, output_size=(6, 8))


def test_unpool_repeated_index_last_wins_and_output_size():
    x = np.array([[[[1.0, 2.0], [3.0, 4.0]]]])
    idx = np.array([[[[5, 5], [0, 5]]]])
    out = cypool.max_unpool2d(x, idx, 2, output_size=(1, 1, 5, 5))
    assert out.shape == (1, 1, 5, 5)
    assert out[0, 0, 1, 0] == 4.0 and out[0, 0, 0, 0] == 3.0 and out.sum() == 7.0


def test_unpool_inverts_pool(rng):
    x = ref.random_values(rng, (2, 3, 8, 8), np.float32)
    out, idx = cypool.max_pool2d(x, 2, return_indices=True)
    u = cypool.max_unpool2d(out, idx, 2)
    mask = np.zeros(x.shape, bool)
    np.put_along_axis(mask.reshape(6, -1), idx.reshape(6, -1), True, axis=1)
    np.testing.assert_array_equal(u[mask], x[mask])
    assert (u[~mask] == 0).all()


@pytest.mark.parametrize("bad", [-1, 25])
def test_unpool_out_of_range_index_raises(bad):
    idx = np.zeros((1, 1, 2, 2), dtype=np.int64)
    idx[0, 0, 0, 1] = bad
    with pytest.raises(ValueError, match="indices"):
        cypool.max_unpool2d(np.ones((1, 1, 2, 2)), idx, 3, 2)


# ---------------------------------------------------------------- PyTorch

@pytest.mark.parametrize("trial", range(25))
def test_matches_torch(rng, trial):
    torch = torch_or_skip()
    import torch.nn.functional as F
    shape, cfg = random_config(rng)
    x = ref.random_values(rng, shape, np.float32, ties=True)
    out, idx = cypool.max_pool2d(x, **cfg, return_indices=True)
    tx = torch.from_numpy(x).requires_grad_(True)
    tout, tidx = F.max_pool2d(tx, cfg["kernel_size"], cfg["stride"], cfg["padding"], cfg["dilation"],
                              ceil_mode=cfg["ceil_mode"], return_indices=True)
    np.testing.assert_array_equal(out, tout.detach().numpy())
    np.testing.assert_array_equal(idx, tidx.numpy())
    g = ref.random_values(rng, out.shape, np.float32)
    tout.backward(torch.from_numpy(g))
    np.testing.assert_allclose(cypool.max_pool2d_backward(g, idx, x.shape), tx.grad.numpy(), rtol=1e-6)
    k, s, p = cfg["kernel_size"], cfg["stride"], cfg["padding"]
    if cfg["dilation"] == (1, 1):  # ceil_mode too: torch's output_size range
        u = cypool.max_unpool2d(out, idx, k, s, p, output_size=x.shape)
        tu = F.max_unpool2d(torch.from_numpy(out), tidx, k, s, p, output_size=x.shape[-2:])
        np.testing.assert_array_equal(u, tu.numpy())


def test_torch_agrees_except_nan_index(rng):
    torch = torch_or_skip()
    import torch.nn.functional as F
    x = ref.random_values(rng, (2, 3, 12, 12), np.float32, specials=True)
    out, idx = cypool.max_pool2d(x, 3, 2, 1, return_indices=True)
    tout, tidx = F.max_pool2d(torch.from_numpy(x), 3, 2, 1, return_indices=True)
    np.testing.assert_array_equal(out, tout.numpy())
    nan = np.isnan(out)
    np.testing.assert_array_equal(idx[~nan], tidx.numpy()[~nan])
