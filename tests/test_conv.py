"""conv2d, conv2d_backward and Conv2d against the loop reference in
tests/reference.py and, where installed, PyTorch."""
import contextlib

import numpy as np
import pytest

import cypool
import reference as ref
from cypool._conv_engine import plan
from cypool._select import ConvAlgo
from cypool._testing import force, last_conv_algo, set_crowded
from helpers import torch_or_skip


def random_case(rng, big=False):
    """(x shape, weight shape, parameters, reference padding)."""
    while True:
        kh, kw = (int(v) for v in rng.integers(1, 6, size=2))
        sh, sw = (int(v) for v in rng.integers(1, 4, size=2))
        dh, dw = (int(v) for v in rng.integers(1, 3, size=2))
        H, W = (int(v) for v in rng.integers(1, 30 if big else 12, size=2))
        if rng.random() < 0.2 and sh == sw == 1:
            padding, pad = "same", ((dh * (kh - 1) // 2, dh * (kh - 1) - dh * (kh - 1) // 2),
                                    (dw * (kw - 1) // 2, dw * (kw - 1) - dw * (kw - 1) // 2))
        else:
            ph, pw = (int(v) for v in rng.integers(0, 5, size=2))
            padding, pad = (ph, pw), ((ph, ph), (pw, pw))
        if H + sum(pad[0]) >= dh * (kh - 1) + 1 and W + sum(pad[1]) >= dw * (kw - 1) + 1:
            break
    N = int(rng.integers(1, 9 if big else 4))
    C, O = (int(v) for v in rng.integers(1, 20 if big else 6, size=2))
    geo = dict(stride=(sh, sw), padding=padding, dilation=(dh, dw))
    return (N, C, H, W), (O, C, kh, kw), geo, pad


def tol(dtype):
    return dict(rtol=1e-4, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)


def _spaced(a):
    """a's values through a view whose elements lie two apart."""
    b = np.zeros(a.shape + (2,), a.dtype)
    b[..., 0] = a
    return b[..., 0]


def check_against_reference(rng, xs, ws, geo, pad, dtype, batched, with_bias, num_threads=None,
                            view=False):
    if not batched:
        xs = (1,) + xs[1:]
    x = rng.standard_normal(xs)
    w = rng.standard_normal(ws)
    b = rng.standard_normal(ws[0]) if with_bias else None
    want = ref.conv2d(x, w, b, geo["stride"], pad, geo["dilation"])
    g = rng.standard_normal(want.shape)
    rgx, rgw, rgb = ref.conv2d_backward(g, x, w, geo["stride"], pad, geo["dilation"])
    xc, wc, gc = x.astype(dtype), w.astype(dtype), g.astype(dtype)
    if view:  # the same values through non-contiguous, negative-stride views
        xc = np.ascontiguousarray(xc[:, :, ::-1, :]).transpose(0, 1, 3, 2).copy().transpose(0, 1, 3, 2)[:, :, ::-1, :]
        wc = np.asfortranarray(wc[:, ::-1])[:, ::-1]
        gc = np.ascontiguousarray(gc[..., ::-1])[..., ::-1]
        xc, wc = (_spaced(a) if a.flags.c_contiguous else a for a in (xc, wc))  # 1x1 planes
        assert not xc.flags.c_contiguous or xc.size == 1
        assert not wc.flags.c_contiguous or wc.size == 1
    bc = None if b is None else b.astype(dtype)
    if not batched:
        xc, gc, want, rgx, g = xc[0], gc[0], want[0], rgx[0], g[0]
    out = cypool.conv2d(xc, wc, bc, **geo, num_threads=num_threads)
    assert out.dtype == dtype and out.flags.c_contiguous and out.shape == want.shape
    np.testing.assert_allclose(out, want, **tol(dtype))
    gx, gw, gb = cypool.conv2d_backward(gc, xc, wc, **geo, num_threads=num_threads)
    assert gx.dtype == gw.dtype == gb.dtype == dtype
    np.testing.assert_allclose(gx, rgx, **tol(dtype))
    np.testing.assert_allclose(gw, rgw, **tol(dtype))
    np.testing.assert_allclose(gb, rgb, **tol(dtype))


@pytest.mark.parametrize("trial", range(60))
def test_matches_reference(rng, trial):
    xs, ws, geo, pad = random_case(rng)
    dtype = [np.float32, np.float64][trial % 2]
    check_against_reference(rng, xs, ws, geo, pad, dtype, batched=trial % 4 != 0,
                            with_bias=trial % 3 != 0, view=trial % 5 == 0)


@pytest.mark.parametrize("trial", range(8))
@pytest.mark.parametrize("num_threads", [1, 2, 3])
def test_matches_reference_threaded(rng, trial, num_threads):
    # Large enough to run on a thread team, split by images and by chunks.
    xs, ws, geo, pad = random_case(rng, big=True)
    xs = (xs[0], max(xs[1], 8), max(xs[2], 24), max(xs[3], 24))
    ws = (max(ws[0], 8), xs[1]) + ws[2:]
    check_against_reference(rng, xs, ws, geo, pad, np.float32, batched=True, with_bias=True,
                            num_threads=num_threads)


@pytest.mark.thread_unsafe(reason="asserts the team a call ran on: calls on other threads start crowded spells, process-wide")
def test_large_image_runs_on_the_requested_team(rng):
    from cypool import _backend
    if not _backend.kernels.openmp_info()[0]:
        pytest.skip("serial build")
    set_crowded(False)
    x = rng.standard_normal((1, 16, 64, 64)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    out = cypool.conv2d(x, w, padding=1, num_threads=2)
    assert _backend.kernels.last_team_size() == 2
    np.testing.assert_allclose(out, cypool.conv2d(x, w, padding=1, num_threads=1), rtol=1e-6, atol=1e-5)


def test_fresh_outputs_are_fully_written(rng):
    # Poisoned buffers: every element must be written, on every thread count.
    x = rng.standard_normal((5, 6, 30, 31)).astype(np.float32)
    w = rng.standard_normal((7, 6, 3, 3)).astype(np.float32)
    want = cypool.conv2d(x, w, padding=1, num_threads=1)
    for nt in (1, 2, 4):
        out = np.full(want.shape, np.nan, np.float32)
        cypool.conv2d(x, w, padding=1, out=out, num_threads=nt)
        np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("algo", ["virtual", "grid"])
@pytest.mark.parametrize("trial", range(16))
def test_forward_with_and_without_the_dropped_columns(rng, trial, algo):
    # The forward computes either the virtual output (each row Wq wide, the
    # columns past OW dropped) or only the real positions, gathered from
    # their rows (cypool_vc_grid); where each is taken is a cost rule, so
    # both are forced here, on shapes with 5 to 19 output channels (the
    # gather needs more than a tile's 4) and every geometry, and into a
    # poisoned out= that must be fully written.
    xs, ws, geo, pad = random_case(rng, big=trial % 2 == 1)
    ws = (5 + int(rng.integers(0, 15)),) + ws[1:]
    with force(conv=algo):
        check_against_reference(rng, xs, ws, geo, pad, [np.float32, np.float64][trial % 2],
                                batched=True, with_bias=trial % 3 != 0, view=trial % 4 == 0,
                                num_threads=1 + trial % 3)
        x = rng.standard_normal(xs).astype(np.float32)
        w = rng.standard_normal(ws).astype(np.float32)
        want = cypool.conv2d(x, w, None, **geo)
        out = np.full(want.shape, np.nan, np.float32)
        cypool.conv2d(x, w, None, **geo, out=out, num_threads=2)
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("trial", range(12))
def test_forward_reads_taps_in_place_or_from_a_copy(rng, trial):
    # Over the virtual output the tiles read each block of the taps either
    # where it lies (the phase buffer, or the image read in place) or from a
    # per-thread copy; a cost rule picks one (a 1x1 kernel copies). Both are
    # forced here, with more output channels than a tile holds (fewer never
    # copy): the same sums, so the same bits, and the reference's values,
    # forward and input gradient.
    while True:
        xs, ws, geo, pad = random_case(rng, big=True)
        ws = (5 + int(rng.integers(0, 15)),) + ws[1:]
        xs = (max(xs[0], 4),) + xs[1:]
        if min(xs[2:]) > 2:
            break
    dtype = [np.float32, np.float64][trial % 2]
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    got = {}
    for algo in ("virtual_copied", "virtual"):
        with force(conv=algo):
            check_against_reference(rng, xs, ws, geo, pad, dtype, batched=True,
                                    with_bias=trial % 3 != 0, view=trial % 4 == 0,
                                    num_threads=1 + trial % 3)
            out = np.full(cypool.conv2d(x, w, **geo).shape, np.nan, dtype)
            cypool.conv2d(x, w, None, **geo, out=out, num_threads=1 + trial % 2)
            assert last_conv_algo() == ConvAlgo[algo.upper()]
            got[algo] = out
    np.testing.assert_array_equal(got["virtual"], got["virtual_copied"])


@pytest.mark.parametrize("trial", range(16))
def test_forward_with_output_channels_in_the_lanes(rng, trial):
    # The forward puts output positions in the vector lanes (the virtual
    # output or the grid) or output channels (_conv_ovec.h); a cost rule
    # picks one, so both are forced here: output channels that fill whole
    # vectors of every build or do not, column strides 1 and 2 (3 falls
    # back), 1-3 images cut into row chunks on 2 or 3 threads or whole
    # images on one, views, and a stride-1 input gradient (the same
    # forward, transposed). Then the same call into a poisoned out=, and an
    # image with NaN and +-inf: the same sums in the same order both ways,
    # so the same bits. The lanes run again with bands of one row of
    # outputs (their padded rows filled a band at a time, the next band
    # prefetched): the same bits again.
    while True:
        xs, ws, geo, pad = random_case(rng, big=True)
        O = [8, 16, 32, 48, 64, 5 + int(rng.integers(0, 30))][trial % 6]
        ws = (O,) + ws[1:]
        xs = (1 + trial % 3,) + xs[1:]
        if min(xs[2:]) > 2:
            break
    dtype = [np.float32, np.float64][trial % 2]
    nt = 1 + trial % 3
    x = rng.standard_normal(xs).astype(dtype)
    x.flat[rng.integers(0, x.size, size=3)] = [np.nan, np.inf, -np.inf]
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(O).astype(dtype)
    want = ref.conv2d(x.astype(np.float64), w, b, geo["stride"], pad, geo["dilation"])
    got = {}
    for algo in ("virtual", "lanes"):
        with force(conv=algo):
            check_against_reference(rng, xs, ws, geo, pad, dtype, batched=True,
                                    with_bias=trial % 4 != 0, view=trial % 5 == 0,
                                    num_threads=nt)
            out = np.full(want.shape, np.nan, dtype)
            cypool.conv2d(x, w, b, **geo, out=out, num_threads=nt)
            if algo == "lanes" and geo["stride"][1] <= 2:
                assert last_conv_algo() == ConvAlgo.LANES
            np.testing.assert_allclose(out, want, equal_nan=True, **tol(dtype))
            got[algo] = out
    np.testing.assert_array_equal(got["virtual"], got["lanes"])
    with force(conv="lanes", ov_band=1):
        out = np.full(want.shape, np.nan, dtype)
        cypool.conv2d(x, w, b, **geo, out=out, num_threads=nt)
    np.testing.assert_array_equal(out, got["lanes"])


@pytest.mark.parametrize("trial", range(16))
def test_forward_by_f23_along_the_rows(rng, trial):
    # Rows three taps wide at column stride and dilation 1 may run by F(2, 3)
    # (_conv_winograd.h), forced here against the reference and the lanes'
    # direct sums: any kernel height, row stride and dilation, padding,
    # odd and even rows, channels that fill vectors or not, 1-3 images on
    # 1-3 threads, views, bands of one row. Then inputs with NaN and +-inf,
    # and values whose transformed sums overflow though the direct ones do
    # not: those rows run the direct way, to the reference's inf, NaN and
    # finite values. Weights that are not finite turn it off for the call.
    while True:
        xs, ws, geo, pad = random_case(rng, big=True)
        O = [16, 32, 48, 5 + int(rng.integers(0, 40))][trial % 4]
        ws = (O,) + ws[1:3] + (3,)
        geo["stride"] = (geo["stride"][0], 1)
        geo["dilation"] = (geo["dilation"][0], 1)
        if geo["padding"] == "same":
            pad = (pad[0], (1, 1))
        xs = (1 + trial % 3,) + xs[1:3] + (int(rng.integers(4, 40)),)
        if (xs[2] + sum(pad[0]) >= geo["dilation"][0] * (ws[2] - 1) + 1
                and xs[3] + sum(pad[1]) - 2 >= 2):
            break
    dtype = [np.float32, np.float64][trial % 2]
    nt = 1 + trial % 3
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(O).astype(dtype) if trial % 4 else None
    if trial % 5 == 0:  # a view
        x = np.ascontiguousarray(np.swapaxes(x, 2, 3)).swapaxes(2, 3)
    want = ref.conv2d(x.astype(np.float64), w, b, geo["stride"], pad, geo["dilation"])
    with force(conv="lanes"):
        direct = cypool.conv2d(x, w, b, **geo, num_threads=nt)
    with force(conv="winograd"):
        out = np.full(want.shape, np.nan, dtype)
        cypool.conv2d(x, w, b, **geo, out=out, num_threads=nt)
        assert last_conv_algo() == ConvAlgo.WINOGRAD
    np.testing.assert_allclose(out, want, **tol(dtype))
    np.testing.assert_allclose(out, direct, **tol(dtype))
    with force(conv="winograd", ov_band=1):
        np.testing.assert_array_equal(cypool.conv2d(x, w, b, **geo, num_threads=nt), out)
    # NaN, +-inf, and a pair of huge values (their sum overflows in the
    # transformed rows; the direct sums, with small weights, do not).
    xb = x.copy()
    big = np.finfo(dtype).max / 1.5
    xb.flat[rng.integers(0, x.size, size=3)] = [np.nan, np.inf, -np.inf]
    n, r, c = (int(rng.integers(0, v)) for v in (xs[0], xs[2], xs[3] - 1))
    c -= (c + pad[1][0]) % 2 == 0 and c > 0  # at padded columns 2m + 1, 2m + 2: U1 = inf
    xb[n, :, r, c:c + 2] = big
    ws_small = np.abs(w) * 1e-3  # no cancellation of huge terms, in any order
    with np.errstate(over="ignore", invalid="ignore"):
        want = ref.conv2d(xb.astype(np.float64), ws_small, b, geo["stride"], pad,
                          geo["dilation"])
        want = want.astype(dtype)  # float32's overflow where float64's sums pass its max
    with force(conv="winograd"):
        got = cypool.conv2d(xb, ws_small, b, **geo, num_threads=nt)
        assert last_conv_algo() == ConvAlgo.WINOGRAD
    np.testing.assert_allclose(got, want, equal_nan=True, **tol(dtype))
    wbad = w.copy()
    wbad.flat[int(rng.integers(0, w.size))] = np.inf
    with np.errstate(invalid="ignore"):
        want = ref.conv2d(x.astype(np.float64), wbad, b, geo["stride"], pad, geo["dilation"])
    with force(conv="winograd"):
        got = cypool.conv2d(x, wbad, b, **geo, num_threads=nt)
        assert last_conv_algo() == ConvAlgo.LANES  # the kernel's fallback
    np.testing.assert_allclose(got, want, equal_nan=True, **tol(dtype))


@pytest.mark.parametrize("shape, O, k, stride, padding, path", [
    ((64, 6, 14, 14), 16, 5, 1, 0, "lanes"),   # LeNet's second convolution
    ((4, 16, 13, 13), 32, 4, 2, 0, "lanes"),   # a small verification network's strided layer
    ((3, 32, 6, 6), 64, 3, 1, 1, "lanes"),
    ((2, 64, 28, 28), 128, 3, 1, 1, "winograd"),  # 2 columns of 30 dropped, but 576 taps
    ((2, 64, 7, 7), 128, 3, 1, 1, "lanes"),    # rows of 7: too short for F(2, 3)
    ((8, 8, 28, 28), 8, 3, 1, 1, "virtual"),   # 2 columns of 30 dropped
    ((1, 3, 64, 64), 64, 7, 2, 3, "virtual"),  # a stem: 3 of 35 columns dropped, 147 taps
    ((16, 6, 14, 14), 12, 5, 1, 0, "virtual"),  # channels that fill no whole vector
    ((2, 16, 16, 16), 72, 3, 1, 1, "grid"),    # 72 channels fill no pair of vectors
    ((4, 64, 28, 28), 64, 1, 1, 0, "virtual_copied"),  # a 1x1 kernel's taps do not overlap
])
def test_forward_takes_output_channels_in_the_lanes_where_it_pays(rng, shape, O, k, stride,
                                                                   padding, path):
    # The rule (cypool._select.select_conv, asked directly and through a
    # call): rows that drop a quarter or more of the
    # virtual output's columns, or 256 taps or more, with channels that
    # fill pairs of vectors take it in every build; few dropped columns
    # and few taps, or partly filled vectors, do not. Rows three taps wide
    # and 13 or more outputs long, of 16 (channel, kernel row) pairs or
    # more, run by F(2, 3) (28 and 128 with AVX2). 64 channels or more on
    # rows with enough dropped columns gather the real positions; a 1x1
    # kernel copies its taps. Against the reference.
    from cypool import _backend
    if not _backend.module_for("conv2d_forward").OVEC_TILES:
        pytest.skip("a build without gcc's vector types never takes it")
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((O, shape[1], k, k)).astype(np.float32)
    b = rng.standard_normal(O).astype(np.float32)
    want = ref.conv2d(x, w, b, (stride, stride), ((padding,) * 2,) * 2, (1, 1))
    p = plan(shape, w.shape, stride, padding, 1, np.float32)
    assert ConvAlgo(p.forward.algo[0]) == ConvAlgo[path.upper()]
    out = cypool.conv2d(x, w, b, stride, padding)
    assert last_conv_algo() == ConvAlgo[path.upper()]
    np.testing.assert_allclose(out, want, **tol(np.float32))


@pytest.mark.parametrize("stride, padding", [(1, 1), (2, 1), (1, 0)])
def test_batches_claimed_by_whole_images(rng, stride, padding):
    # Four images a thread or more: threads claim whole images, several at
    # a time, each cut into chunks; 37 images leave a short last claim. The
    # forward and (through the same kernel) a stride-1 input gradient must
    # match the reference on every thread count.
    x = rng.standard_normal((37, 3, 40, 50)).astype(np.float32)
    w = rng.standard_normal((6, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    pad = ((padding, padding), (padding, padding))
    want = ref.conv2d(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64),
                      (stride, stride), pad, (1, 1))
    g = rng.standard_normal(want.shape).astype(np.float32)
    rgx, _, _ = ref.conv2d_backward(g.astype(np.float64), x.astype(np.float64), w.astype(np.float64),
                                    (stride, stride), pad, (1, 1))
    for nt in (1, 2, 3):
        got = cypool.conv2d(x, w, b, stride, padding, num_threads=nt)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        gx = cypool.conv2d_backward(g, x, w, stride, padding, needs_weight_grad=False,
                                    num_threads=nt)[0]
        np.testing.assert_allclose(gx, rgx, rtol=1e-4, atol=1e-4)


@pytest.mark.thread_unsafe(reason="the same team size for every call: calls on other threads start crowded spells, process-wide")
def test_weight_grad_is_deterministic_for_a_thread_count(rng):
    # (each call outside a crowded spell: a late team thread in the call
    # before, on a loaded machine, would put the next one on one thread)
    x = rng.standard_normal((6, 8, 20, 20)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    g = rng.standard_normal((6, 8, 18, 18)).astype(np.float32)
    set_crowded(False)
    first = cypool.conv2d_backward(g, x, w, num_threads=2)[1]
    for _ in range(3):
        set_crowded(False)
        np.testing.assert_array_equal(cypool.conv2d_backward(g, x, w, num_threads=2)[1], first)


def test_special_values_propagate(rng):
    x = rng.standard_normal((1, 2, 8, 8))
    x[0, 0, 3, 3] = np.nan
    x[0, 1, 0, 0] = np.inf
    w = np.ones((1, 2, 3, 3))
    out = cypool.conv2d(x, w)
    want = ref.conv2d(x, w, None, (1, 1), ((0, 0), (0, 0)), (1, 1))
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_allclose(out[~np.isnan(out)], want[~np.isnan(want)])
    assert np.isinf(out[0, 0, 0, 0])
    const = cypool.conv2d(np.full((1, 1, 5, 5), 2.0), np.full((1, 1, 3, 3), 0.5), np.array([1.0]))
    np.testing.assert_array_equal(const, 10.0)


def test_padding_same_and_valid(rng):
    x = rng.standard_normal((2, 3, 9, 10))
    for k, d in [(3, 1), (4, 1), (2, 3), ((2, 5), (2, 1))]:
        w = rng.standard_normal((4, 3) + ((k, k) if isinstance(k, int) else k))
        out = cypool.conv2d(x, w, padding="same", dilation=d)
        assert out.shape[2:] == x.shape[2:]
    w = rng.standard_normal((4, 3, 3, 3))
    np.testing.assert_array_equal(cypool.conv2d(x, w, padding="valid"), cypool.conv2d(x, w))


def test_out_argument(rng):
    x = rng.standard_normal((2, 3, 9, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    out = np.empty((2, 4, 7, 7), np.float32)
    assert cypool.conv2d(x, w, out=out) is out
    np.testing.assert_array_equal(out, cypool.conv2d(x, w))
    out1 = np.empty((4, 7, 7), np.float32)
    assert cypool.conv2d(x[0], w, out=out1) is out1
    np.testing.assert_array_equal(out1, out[0])
    for bad, exc in [(np.empty((2, 4, 7, 6), np.float32), ValueError),
                     (np.empty((2, 4, 7, 7), np.float64), TypeError),
                     (np.empty((2, 4, 7, 14), np.float32)[..., ::2], ValueError),
                     ([0.0], TypeError)]:
        with pytest.raises(exc, match="out"):
            cypool.conv2d(x, w, out=bad)
    alias = np.zeros((1, 1, 5, 5), np.float32)
    with pytest.raises(ValueError, match="out"):
        cypool.conv2d(alias, np.ones((1, 1, 1, 1), np.float32), out=alias)


@pytest.mark.parametrize("geo", [dict(stride=1, padding=1, dilation=1),   # direct, then tiled
                                 dict(stride=2, padding=1, dilation=1),   # col2im
                                 dict(stride=1, padding=0, dilation=2)])  # direct
def test_grad_x_out_argument(rng, geo):
    """grad_x written into a poisoned grad_x_out equals the loop reference,
    batched and not, whichever kernel the call takes."""
    pad = ((geo["padding"],) * 2,) * 2
    for N, C, H, O in [(2, 3, 9, 4), (3, 8, 20, 16)]:
        x = rng.standard_normal((N, C, H, H))
        w = rng.standard_normal((O, C, 3, 3))
        g = rng.standard_normal(cypool.conv2d(x, w, **geo).shape)
        rgx, _, _ = ref.conv2d_backward(g, x, w, (geo["stride"],) * 2, pad, (geo["dilation"],) * 2)
        out = np.full(x.shape, np.nan)
        gx, gw, _ = cypool.conv2d_backward(g, x, w, **geo, grad_x_out=out)
        assert gx is out and gw is not None
        np.testing.assert_allclose(out, rgx, rtol=1e-10, atol=1e-10)
        out1 = np.full(x.shape[1:], np.nan)
        gx1 = cypool.conv2d_backward(g[1], x[1], w, **geo, grad_x_out=out1, needs_weight_grad=False)[0]
        assert gx1 is out1
        np.testing.assert_allclose(out1, rgx[1], rtol=1e-10, atol=1e-10)
    for bad, exc in [(np.empty(x.shape[:-1] + (H + 1,)), ValueError),
                     (np.empty(x.shape, np.float32), TypeError),
                     (np.empty(x.shape[:-1] + (2 * H,))[..., ::2], ValueError),
                     ([0.0], TypeError)]:
        with pytest.raises(exc, match="grad_x_out"):
            cypool.conv2d_backward(g, x, w, **geo, grad_x_out=bad)
    with pytest.raises(ValueError, match="grad_x_out"):
        cypool.conv2d_backward(g, x, w, **geo, grad_x_out=np.empty(x.shape), needs_input_grad=False)
    alias = np.zeros(max(g.size, x.size))
    with pytest.raises(ValueError, match="grad_x_out must not overlap grad_output"):
        cypool.conv2d_backward(alias[:g.size].reshape(g.shape), x, w, **geo,
                               grad_x_out=alias[:x.size].reshape(x.shape))
    with pytest.raises(ValueError, match="grad_x_out must not overlap x"):
        cypool.conv2d_backward(g, x, w, **geo, grad_x_out=x)
    # without the weight gradient x is not read: x's own array may take grad_x
    x2 = x.copy()
    cypool.conv2d_backward(g, x2, w, **geo, grad_x_out=x2, needs_weight_grad=False)
    np.testing.assert_allclose(x2, rgx, rtol=1e-10, atol=1e-10)


def test_gradients_not_asked_for_are_none(rng):
    x = rng.standard_normal((1, 2, 6, 6))
    w = rng.standard_normal((3, 2, 3, 3))
    g = rng.standard_normal((1, 3, 4, 4))
    gx, gw, gb = cypool.conv2d_backward(g, x, w, needs_input_grad=False)
    assert gx is None and gw is not None
    gx, gw, gb = cypool.conv2d_backward(g, x, w, needs_weight_grad=False)
    assert gw is None and gx is not None
    np.testing.assert_allclose(gb, g.sum(axis=(0, 2, 3)))


@pytest.mark.parametrize("trial", range(12))
def test_matches_torch(rng, trial):
    torch = torch_or_skip()
    xs, ws, geo, _ = random_case(rng, big=trial % 2 == 1)
    x = rng.standard_normal(xs)
    w = rng.standard_normal(ws)
    b = rng.standard_normal(ws[0])
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    ty = torch.nn.functional.conv2d(tx, tw, tb, **geo)
    g = rng.standard_normal(tuple(ty.shape))
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(cypool.conv2d(x, w, b, **geo), ty.detach().numpy(), rtol=1e-10, atol=1e-10)
    gx, gw, gb = cypool.conv2d_backward(g, x, w, **geo)
    np.testing.assert_allclose(gx, tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gw, tw.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(gb, tb.grad.numpy(), rtol=1e-10, atol=1e-10)


def test_layer_train_eval_and_gradient(rng):
    layer = cypool.Conv2d(2, 3, 3, padding=1, dtype=np.float64, rng=0)
    x = rng.standard_normal((2, 2, 5, 5))
    out = layer(x)
    np.testing.assert_allclose(out, ref.conv2d(x, layer.weight, layer.bias, (1, 1), ((1, 1), (1, 1)), (1, 1)))
    g = rng.standard_normal(out.shape)
    gx = layer.backward(g)
    rgx, rgw, rgb = ref.conv2d_backward(g, x, layer.weight, (1, 1), ((1, 1), (1, 1)), (1, 1))
    np.testing.assert_allclose(gx, rgx)
    np.testing.assert_allclose(layer.grad_weight, rgw)
    np.testing.assert_allclose(layer.grad_bias, rgb)
    assert layer.backward(g, needs_input_grad=False) is None
    layer.eval()
    layer(x)
    with pytest.raises(RuntimeError, match="forward"):
        layer.backward(g)
    nobias = cypool.Conv2d(2, 3, 3, bias=False, rng=0)
    nobias(x.astype(np.float32))
    nobias.backward(np.ones((2, 3, 3, 3), np.float32))
    assert nobias.bias is None and nobias.grad_bias is None


def test_layer_initialised_like_torch():
    layer = cypool.Conv2d(4, 8, (3, 5), rng=np.random.default_rng(1))
    bound = 1 / np.sqrt(4 * 3 * 5)
    assert layer.weight.shape == (8, 4, 3, 5) and layer.weight.dtype == np.float32
    assert np.abs(layer.weight).max() <= bound and np.abs(layer.bias).max() <= bound
    assert np.abs(layer.weight).max() > bound / 2
    np.testing.assert_array_equal(cypool.Conv2d(4, 8, (3, 5), rng=7).weight, cypool.Conv2d(4, 8, (3, 5), rng=7).weight)


@pytest.mark.parametrize("O", [2, 12])
def test_non_finite_inputs_in_the_weight_gradient(rng, O):
    # inf and NaN in x: each weight gradient must be what the loops give,
    # whichever way (dot products or im2col rows) the kernel takes.
    x = rng.standard_normal((2, 3, 9, 10))
    x[0, 1, 4, 9] = np.inf     # last column: read past a row's end by the wrapped taps
    x[1, 2, 0, 0] = np.nan
    x[1, 0, 8, 3] = -np.inf
    w = rng.standard_normal((O, 3, 3, 3))
    geo = dict(stride=1, padding=1, dilation=1)
    want = ref.conv2d(x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1))
    g = rng.standard_normal(want.shape)
    _, rgw, _ = ref.conv2d_backward(g, x, w, (1, 1), ((1, 1), (1, 1)), (1, 1))
    _, gw, _ = cypool.conv2d_backward(g, x, w, **geo, needs_input_grad=False)
    np.testing.assert_array_equal(np.isnan(gw), np.isnan(rgw))
    np.testing.assert_allclose(gw[~np.isnan(gw)], rgw[~np.isnan(rgw)], rtol=1e-10)
    # Finite images in the same batch as a non-finite one stay exact.
    x[1] = rng.standard_normal(x[1].shape)
    _, rgw, _ = ref.conv2d_backward(g, x, w, (1, 1), ((1, 1), (1, 1)), (1, 1))
    _, gw, _ = cypool.conv2d_backward(g, x, w, **geo, needs_input_grad=False)
    np.testing.assert_array_equal(np.isnan(gw), np.isnan(rgw))
    np.testing.assert_allclose(gw[~np.isnan(gw)], rgw[~np.isnan(rgw)], rtol=1e-10)


@pytest.mark.parametrize("k", [1, 3])
def test_unpadded_stride1_reads_images_in_place(rng, k):
    # No padding and stride 1: the kernel reads each C-contiguous image in
    # place, rounding chunks up into the next image except for the last;
    # batches whose images are not back to back (every other image, the
    # batch reversed) must give the same as their contiguous copies.
    base = rng.standard_normal((10, 5, 13, 11)).astype(np.float32)
    w = rng.standard_normal((9, 5, k, k)).astype(np.float32)
    b = rng.standard_normal(9).astype(np.float32)
    for x in (base, base[::2], base[::-1], base[3:4], base[0]):
        want = ref.conv2d(np.asarray(x, np.float64).reshape((-1,) + base.shape[1:]), w.astype(np.float64),
                          b.astype(np.float64), (1, 1), ((0, 0), (0, 0)), (1, 1))
        for nt in (1, 2):
            got = cypool.conv2d(x, w, b, num_threads=nt)
            np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4)


@pytest.fixture
def forced_path():
    """forced_path(path): every stride-1 convolution after it, in the test,
    runs on the direct kernels ("direct", small or not) or on the phase
    kernels ("virtual")."""
    with contextlib.ExitStack() as stack:
        yield lambda path: stack.enter_context(force(conv=path))


@pytest.mark.parametrize("path", ["direct", "virtual"])
@pytest.mark.parametrize("trial", range(24))
def test_both_stride1_kernels_match_reference(rng, forced_path, path, trial):
    # Small calls take the direct kernels, the rest the phase kernels; each
    # is forced here on every stride-1 case: 1 to 9 output channels (every
    # tile height and the last block of 1-3), rows shorter and longer than
    # a vector, dilation, 'same' padding, views, one image and several.
    forced_path(path)
    while True:
        xs, ws, geo, pad = random_case(rng, big=trial % 3 == 0)
        if geo["stride"] == (1, 1) or geo["padding"] == "same":
            break
        geo["stride"] = (1, 1)
        if all(H + sum(p) >= d * (k - 1) + 1 for H, p, d, k in
               zip(xs[2:], pad, geo["dilation"], ws[2:])):
            break
    ws = (int(rng.integers(1, 10)),) + ws[1:]
    check_against_reference(rng, xs, ws, geo, pad, [np.float32, np.float64][trial % 2],
                            batched=trial % 4 != 1, with_bias=trial % 3 != 2, view=trial % 5 == 0)


def test_small_stride1_calls_take_the_direct_kernels():
    f32 = np.float32
    assert plan((1, 1, 28, 28), (2, 1, 5, 5), 1, 0, 1, f32).direct
    assert plan((1, 1, 28, 28), (2, 1, 5, 5), 1, 2, 2, f32).direct
    assert not plan((1, 1, 28, 28), (2, 1, 5, 5), 2, 0, 1, f32).direct  # strided
    assert not plan((32, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1, f32).direct  # a team's work
    with force(conv="virtual"):
        assert not plan((1, 1, 28, 28), (2, 1, 5, 5), 1, 0, 1, f32).direct
    with force(conv="direct"):
        assert plan((32, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1, f32).direct
        assert not plan((1, 1, 28, 28), (2, 1, 5, 5), 2, 0, 1, f32).direct  # strided


def test_weight_gradient_rule_and_both_ways(rng):
    # 8 output channels or fewer take dot products, more the tiles
    # (select_weight_grad); both forced on one call give the reference's
    # gradient.
    from cypool._select import WeightGradAlgo, select_weight_grad
    assert select_weight_grad(8) == WeightGradAlgo.DOTS
    assert select_weight_grad(9) == WeightGradAlgo.TILES
    x = rng.standard_normal((3, 4, 20, 19))
    w = rng.standard_normal((6, 4, 3, 3))
    g = rng.standard_normal((3, 6, 18, 17))
    want = ref.conv2d_backward(g, x, w, (1, 1), ((0, 0), (0, 0)), (1, 1))
    for algo in ("dots", "tiles"):
        with force(conv="virtual", weight_grad=algo):
            got = cypool.conv2d_backward(g, x, w, num_threads=2)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("path", ["direct", "virtual"])
@pytest.mark.parametrize("W", [7, 13, 21, 37])
def test_inf_read_only_by_a_rows_last_vector(rng, forced_path, path, W):
    # The last vector of an output row runs past the row's end; its extra
    # lanes read real pixels (an inf here) that no output of that tap
    # reads. They must not reach the weight gradient (0 * inf is NaN).
    forced_path(path)
    x = rng.standard_normal((2, 2, 6, W))
    x[0, 1, :, W - 1] = np.inf
    x[1, 0, 2, W - 2] = -np.inf
    w = rng.standard_normal((3, 2, 3, 3))
    with np.errstate(invalid="ignore"):  # inf - inf in the loops
        want = ref.conv2d(x, w, None, (1, 1), ((0, 0), (0, 0)), (1, 1))
        g = rng.standard_normal(want.shape)
        rgx, rgw, rgb = ref.conv2d_backward(g, x, w, (1, 1), ((0, 0), (0, 0)), (1, 1))
    gx, gw, gb = cypool.conv2d_backward(g, x, w)
    assert np.isfinite(rgw[:, :, :, 0]).any()
    for got, exp in ((gw, rgw), (gx, rgx), (gb, rgb), (cypool.conv2d(x, w), want)):
        np.testing.assert_array_equal(np.isnan(got), np.isnan(exp))
        np.testing.assert_allclose(got[~np.isnan(got)], exp[~np.isnan(exp)], rtol=1e-10)
