"""The compiled back-substitution steps of cypool.verify (_kernels/_crown.pxi)
against plain numpy, on whole rows and on windows that run off the layer."""
import numpy as np
import pytest

from cypool._backend import kernel

TOL = {np.float32: dict(rtol=1e-5, atol=1e-5), np.float64: dict(rtol=1e-12, atol=1e-12)}


def coefficients(rng, shape, dt):
    """Random coefficients with exact zeros (the ReLU's tie) and a NaN."""
    A = rng.standard_normal(shape)
    A[rng.random(shape) < 0.2] = 0
    A.reshape(-1)[rng.integers(A.size)] = np.nan
    return A.astype(dt)


def relaxation(rng, shape, dt):
    return tuple(rng.uniform(0, 2, shape).astype(dt) for _ in range(3))


def relu_ref(A, a, s, t):
    """(A through the relaxation, the rows' sum of min(A, 0) t), in float64."""
    A = A.astype(np.float64)
    return A * np.where(A < 0, s, a), (np.minimum(A, 0) * t).sum(axis=1)


def box_ref(A, lo, hi):
    A = A.astype(np.float64)
    return (np.maximum(A, 0) * lo + np.minimum(A, 0) * hi).sum(axis=1)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 37, 256])
@pytest.mark.parametrize("threads", [1, 2])
def test_relu_and_box_steps_on_whole_rows(rng, dt, n, threads):
    K = int(rng.integers(1, 12))
    A = coefficients(rng, (K, n), dt)
    a, s, t = relaxation(rng, n, dt)
    start = rng.standard_normal(K).astype(dt)
    want_A, want_acc = relu_ref(A, a, s, t)
    got_A, got_acc = A.copy(), start.copy()
    kernel("crown_relu", np.dtype(dt))(got_A, a, s, t, got_acc, threads)
    np.testing.assert_allclose(got_A, want_A, **TOL[dt])
    np.testing.assert_allclose(got_acc, start + want_acc, **TOL[dt])

    lo = rng.standard_normal(n).astype(dt)
    hi = (lo + rng.uniform(0, 1, n)).astype(dt)
    got = start.copy()
    kernel("crown_box", np.dtype(dt))(A, lo, hi, got, threads)
    np.testing.assert_allclose(got, start + box_ref(A, lo, hi), **TOL[dt])
    assert np.isnan(got).sum() == np.isnan(A).any(axis=1).sum() >= 1


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 7, 8, 9, 37, 256])
def test_column_steps_equal_the_row_steps_on_the_transpose(rng, dt, n):
    """crown_relu_cols and crown_box_cols on A's transpose (n, K) give
    crown_relu's and crown_box's results, and the same bits on 1, 2 and 3
    threads (the neurons are cut in fixed parts, summed in part order)."""
    K = int(rng.choice([1, 5, 16, 33, 200]))
    A = coefficients(rng, (K, n), dt)
    a, s, t = relaxation(rng, n, dt)
    lo = rng.standard_normal(n).astype(dt)
    hi = (lo + rng.uniform(0, 1, n)).astype(dt)
    start = rng.standard_normal(K).astype(dt)
    want_A, want_acc = relu_ref(A, a, s, t)
    runs = []
    for threads in (1, 2, 3):
        got_A, got_acc = A.T.copy(), start.copy()
        kernel("crown_relu_cols", np.dtype(dt))(got_A, a, s, t, got_acc, threads)
        np.testing.assert_allclose(got_A, want_A.T, **TOL[dt])
        np.testing.assert_allclose(got_acc, start + want_acc, **TOL[dt])
        box = start.copy()
        kernel("crown_box_cols", np.dtype(dt))(A.T.copy(), lo, hi, box, threads)
        np.testing.assert_allclose(box, start + box_ref(A, lo, hi), **TOL[dt])
        assert np.isnan(box).sum() == np.isnan(A).any(axis=1).sum() >= 1
        runs.append((got_A, got_acc, box))
    for other in runs[1:]:
        for x, y in zip(runs[0], other):
            np.testing.assert_array_equal(x, y)


def windows(arr, oy, ox, h, w):
    """arr (C, H, W) over each window: (K, C, h, w), zero outside arr."""
    C, H, W = arr.shape
    out = np.zeros((len(oy), C, h, w))
    for k in range(len(oy)):
        for i in range(h):
            for j in range(w):
                y, x = oy[k] + i, ox[k] + j
                if 0 <= y < H and 0 <= x < W:
                    out[k, :, i, j] = arr[:, y, x]
    return out


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_patch_steps_zero_what_falls_outside_the_layer(rng, dt, threads):
    for trial in range(6):
        C, H, W = (int(v) for v in rng.integers(1, 12, 3))
        h, w = (int(v) for v in rng.integers(1, 14, 2))
        K = int(rng.integers(1, 30))
        # origins from wholly before the layer to wholly past it
        oy = rng.integers(-h - 1, H + 2, K).astype(np.int64)
        ox = rng.integers(-w - 1, W + 2, K).astype(np.int64)
        A = coefficients(rng, (K, C, h, w), dt)
        inside = windows(np.ones((C, H, W)), oy, ox, h, w)
        flat = (K, -1)

        # what falls outside is dropped: a NaN there reaches nothing
        A_in = np.where(inside.reshape(flat) > 0, A.reshape(flat), 0)
        a, s, t = relaxation(rng, (C, H, W), dt)
        wa, ws, wt = (windows(v, oy, ox, h, w).reshape(flat) for v in (a, s, t))
        want_A, want_acc = relu_ref(A_in, wa, ws, wt)
        got_A, got_acc = A.copy(), np.zeros(K, dt)
        kernel("crown_relu_patches", np.dtype(dt))(got_A, oy, ox, a, s, t, got_acc, threads)
        np.testing.assert_allclose(got_A.reshape(flat), want_A, **TOL[dt])
        np.testing.assert_allclose(got_acc, want_acc, **TOL[dt])

        scale = rng.standard_normal((C, H, W)).astype(dt)
        bias = rng.standard_normal((C, H, W)).astype(dt)
        wb = windows(bias, oy, ox, h, w).reshape(flat)
        want_acc = (A_in.astype(np.float64) * wb).sum(axis=1)
        for sc in (scale, None):
            mult = inside if sc is None else windows(sc, oy, ox, h, w)
            got_A, got_acc = A.copy(), np.zeros(K, dt)
            kernel("crown_affine_patches", np.dtype(dt))(got_A, oy, ox, sc, bias, got_acc, threads)
            want_A = A_in * mult.reshape(flat)
            np.testing.assert_allclose(got_A.reshape(flat), want_A, **TOL[dt])
            np.testing.assert_allclose(got_acc, want_acc, **TOL[dt])

        A = np.nan_to_num(A)
        lo = rng.standard_normal((C, H, W)).astype(dt)
        hi = (lo + rng.uniform(0, 1, (C, H, W))).astype(dt)
        want = box_ref(A.reshape(flat) * inside.reshape(flat), windows(lo, oy, ox, h, w).reshape(flat),
                       windows(hi, oy, ox, h, w).reshape(flat))
        got = np.zeros(K, dt)
        kernel("crown_box_patches", np.dtype(dt))(A, oy, ox, lo, hi, got, threads)
        np.testing.assert_allclose(got, want, **TOL[dt])


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_signed_cols_are_the_columns_then_their_negatives(rng, dt, threads):
    n, m = int(rng.integers(1, 40)), int(rng.integers(1, 30))
    M = coefficients(rng, (n, m), dt)
    M[0, 0] = -np.inf
    cols = rng.integers(0, m, int(rng.integers(1, 2 * m + 1)))  # any order, repeats
    A = np.full((n, 2 * len(cols)), 7, dt)
    kernel("crown_signed_cols", np.dtype(dt))(M, cols, A, threads)
    np.testing.assert_array_equal(A, np.concatenate([M[:, cols], -M[:, cols]], axis=1))


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_relu_on_live_columns_is_the_relu_step_then_those_columns(rng, dt, threads):
    """crown_relu_live gives crown_relu's rows restricted to live (sorted or
    not) and its sums, where the other neurons are dead (a = s = t = 0)."""
    K, n = int(rng.integers(1, 40)), int(rng.integers(1, 300))
    A = coefficients(rng, (K, n), dt)
    a, s, t = relaxation(rng, n, dt)
    live = rng.permutation(n)[:int(rng.integers(1, n + 1))]
    dead = np.setdiff1d(np.arange(n), live)
    a[dead] = s[dead] = t[dead] = 0
    A[:, dead] = rng.choice([-5.0, 5.0], (K, dead.size))  # a dead neuron's adds nothing
    A[rng.integers(K), live[0]] = np.nan  # a live one's NaN reaches its row's sum
    start = rng.standard_normal(K).astype(dt)
    want_A, want_acc = relu_ref(A, a, s, t)
    out = np.full((K, live.size), 7, dt)
    got = start.copy()
    kernel("crown_relu_live", np.dtype(dt))(A, a[live], s[live], t[live], live.astype(np.int64), out, got,
                                            threads)
    np.testing.assert_allclose(out, want_A[:, live], **TOL[dt])
    np.testing.assert_allclose(got, start + want_acc, **TOL[dt])
    assert np.isnan(got).sum() == np.isnan(A).any(axis=1).sum() >= 1


def relaxation_ref(l, u):
    """The ReLU's relaxation on [l, u] in numpy steps, in l's dtype."""
    dt = l.dtype
    active, unstable = l >= 0, (l < 0) & (u > 0)
    a, s, t = active.astype(dt), active.astype(dt), np.zeros_like(l)
    with np.errstate(all="ignore"):
        lu, uu = l[unstable], u[unstable]
        su = uu / (uu - lu)
        tu = np.maximum(-su * lu, uu - su * uu)
        tu = tu + 4 * np.finfo(dt).eps * (np.abs(su * lu) + uu) + np.finfo(dt).tiny
    s[unstable], t[unstable] = su, tu
    a[unstable] = (uu >= -lu).astype(dt)
    return a, s, t


@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 5, 8, 33, 1000])
def test_relaxation_is_numpys_and_stays_above_the_relu(rng, dt, n):
    """crown_relaxation against the numpy steps (the upper intercept within
    the nudge: gcc may fuse u - s u into one rounding), with every case: active, dead, unstable
    (wide, thin, u = -l, huge, tiny), 0 at either end, NaN and inf; and in
    exact arithmetic, every unstable neuron's upper line is >= 0 at l and
    >= u at u."""
    from fractions import Fraction

    from cypool.verify._crown import relaxation

    scale = 10.0 ** rng.integers(-30, 30, n)
    l = rng.standard_normal(n) * scale
    u = l + rng.uniform(0, 3, n) * scale
    cases = [(-1, 1), (0, 1), (-1, 0), (-0.0, 2), (-3, 1e-30), (-1e-30, 5), (1, 2), (-2, -1),
             (np.nan, 1), (-1, np.nan), (-np.inf, 1), (-1, np.inf), (-1e30, 1e30)]
    for k, (lk, uk) in enumerate(cases[:n]):
        l[k], u[k] = lk, uk
    l, u = l.astype(dt), u.astype(dt)
    a, s, t = relaxation(l, u)
    ra, rs, rt = relaxation_ref(l, u)
    assert a.dtype == s.dtype == t.dtype == dt
    np.testing.assert_array_equal(a, ra)
    np.testing.assert_array_equal(s, rs)
    np.testing.assert_array_equal(np.isnan(t), np.isnan(rt))
    with np.errstate(all="ignore"):
        nudge = 4 * np.finfo(dt).eps * (np.abs(s * l) + u) + np.finfo(dt).tiny
    unstable = (l < 0) & (u > 0) & np.isfinite(rt)
    assert (np.abs(t - rt)[unstable] <= nudge[unstable]).all()
    np.testing.assert_array_equal(t[~unstable & np.isfinite(rt)], rt[~unstable & np.isfinite(rt)])
    for k in np.flatnonzero((l < 0) & (u > 0) & np.isfinite(t)):
        L, U, S, T = (Fraction(float(v)) for v in (l[k], u[k], s[k], t[k]))
        assert S * L + T >= 0 and S * U + T >= U
    with pytest.raises(ValueError, match="l and u"):
        relaxation(l, u[:-1])
