"""Slow, independent references in plain numpy for every cypool operation.

Written from the documented semantics with explicit loops and no code shared
with cypool, so that a test compares two independent implementations.
"""
import math

import numpy as np


def first_max_position(values):
    """Index of the first maximum of a 1-D sequence; NaN counts as the maximum
    and the first NaN wins (numpy's argmax rule)."""
    values = np.asarray(values)
    if values.dtype.kind == "f":
        nan = np.flatnonzero(np.isnan(values))
        if nan.size:
            return int(nan[0])
    best = 0
    for i in range(1, values.size):
        if values[i] > values[best]:
            best = i
    return best


def pool_out_size(n, k, s, p, d, ceil_mode):
    """torch.nn.MaxPool2d's documented output size."""
    eff = (n + 2 * p - d * (k - 1) - 1) / s
    out = (math.ceil(eff) if ceil_mode else math.floor(eff)) + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def max_pool2d(x, k, s=None, p=0, d=1, ceil_mode=False):
    """(out, indices) of max pooling x (..., H, W) with explicit window loops."""
    kh, kw = (k, k) if np.isscalar(k) else k
    s = (kh, kw) if s is None else s
    sh, sw = (s, s) if np.isscalar(s) else s
    ph, pw = (p, p) if np.isscalar(p) else p
    dh, dw = (d, d) if np.isscalar(d) else d
    H, W = x.shape[-2:]
    OH = pool_out_size(H, kh, sh, ph, dh, ceil_mode)
    OW = pool_out_size(W, kw, sw, pw, dw, ceil_mode)
    lead = x.shape[:-2]
    planes = x.reshape(-1, H, W)
    out = np.empty((planes.shape[0], OH, OW), dtype=x.dtype)
    idx = np.empty((planes.shape[0], OH, OW), dtype=np.int64)
    for q in range(planes.shape[0]):
        for oh in range(OH):
            for ow in range(OW):
                vals, where = [], []
                for i in range(kh):
                    for j in range(kw):
                        r = oh * sh - ph + i * dh
                        c = ow * sw - pw + j * dw
                        if 0 <= r < H and 0 <= c < W:
                            vals.append(planes[q, r, c])
                            where.append(r * W + c)
                assert vals, "window wholly in padding"
                b = first_max_position(np.array(vals, dtype=x.dtype))
                out[q, oh, ow] = vals[b]
                idx[q, oh, ow] = where[b]
    return out.reshape(lead + (OH, OW)), idx.reshape(lead + (OH, OW))


def max_pool2d_backward(grad_output, indices, input_shape):
    """np.add.at scatter of grad_output into zeros at indices, plane by plane."""
    H, W = input_shape[-2:]
    g = grad_output.reshape(-1, grad_output.shape[-2] * grad_output.shape[-1])
    ix = indices.reshape(g.shape)
    out = np.zeros((g.shape[0], H * W), dtype=grad_output.dtype)
    for q in range(g.shape[0]):
        np.add.at(out[q], ix[q], g[q])
    return out.reshape(input_shape)


def max_unpool2d(x, indices, out_hw):
    """Sequential writes in row-major order of x: the last write wins."""
    OH, OW = out_hw
    xs = x.reshape(-1, x.shape[-2] * x.shape[-1])
    ix = indices.reshape(xs.shape)
    out = np.zeros((xs.shape[0], OH * OW), dtype=x.dtype)
    for q in range(xs.shape[0]):
        for n in range(xs.shape[1]):
            out[q, ix[q, n]] = xs[q, n]
    return out.reshape(x.shape[:-2] + (OH, OW))


def random_values(rng, shape, dtype, *, ties=False, specials=False):
    """Random values; ties: few distinct values; specials: NaN/±inf sprinkled in."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        x = rng.standard_normal(shape)
        if ties:
            x = np.round(x * 2) / 2
        x = x.astype(dtype)
        if specials:
            m = rng.random(shape)
            x[m < 0.03] = np.nan
            x[(m >= 0.03) & (m < 0.06)] = np.inf
            x[(m >= 0.06) & (m < 0.12)] = -np.inf
        return x
    info = np.iinfo(dtype)
    if ties:
        return rng.integers(-3 if info.min < 0 else 0, 4, size=shape).astype(dtype)
    return rng.integers(info.min, info.max, size=shape, endpoint=True, dtype=dtype)


def vector_conv2d(x, w, b, stride, padding, dilation):
    """Vector-pixel convolution by explicit loops over output pixels and taps:
    x (N, C, H, W, E), w (O, C, kh, kw), bias once on component 0."""
    N, C, H, W, E = x.shape
    O, _, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    OH = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    OW = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((N, O, OH, OW, E), dtype=np.float64)
    for oh in range(OH):
        for ow in range(OW):
            for i in range(kh):
                for j in range(kw):
                    r, c = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                    if 0 <= r < H and 0 <= c < W:
                        # (N, C, E) x (O, C) -> (N, O, E)
                        out[:, :, oh, ow, :] += np.einsum("nce,oc->noe", x[:, :, r, c, :], w[:, :, i, j])
    if b is not None:
        out[..., 0] += b[None, :, None, None]
    return out


def vector_conv2d_backward(g, x, w, stride, padding, dilation):
    """(grad_x, grad_w, grad_bias) by the same loops, transposed."""
    N, C, H, W, E = x.shape
    O, _, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    OH, OW = g.shape[2:4]
    gx = np.zeros(x.shape, dtype=np.float64)
    gw = np.zeros(w.shape, dtype=np.float64)
    for oh in range(OH):
        for ow in range(OW):
            for i in range(kh):
                for j in range(kw):
                    r, c = oh * sh - ph + i * dh, ow * sw - pw + j * dw
                    if 0 <= r < H and 0 <= c < W:
                        gx[:, :, r, c, :] += np.einsum("noe,oc->nce", g[:, :, oh, ow, :], w[:, :, i, j])
                        gw[:, :, i, j] += np.einsum("noe,nce->oc", g[:, :, oh, ow, :], x[:, :, r, c, :])
    return gx, gw, g[..., 0].sum(axis=(0, 2, 3))


def conv2d(x, w, b, stride, padding, dilation):
    """Standard NCHW convolution by explicit loops over taps on a zero-padded
    copy: x (N, C, H, W), w (O, C, kh, kw), padding ((top, bottom), (left,
    right)); the bias is added to every output element."""
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    (sh, sw), ((pt, pb), (pl, pr)), (dh, dw) = stride, padding, dilation
    xp = np.zeros((N, C, H + pt + pb, W + pl + pr))
    xp[:, :, pt:pt + H, pl:pl + W] = x
    OH = (H + pt + pb - dh * (kh - 1) - 1) // sh + 1
    OW = (W + pl + pr - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((N, O, OH, OW))
    for oh in range(OH):
        for ow in range(OW):
            for i in range(kh):
                for j in range(kw):
                    patch = xp[:, :, oh * sh + i * dh, ow * sw + j * dw]  # (N, C)
                    out[:, :, oh, ow] += patch @ w[:, :, i, j].T
    if b is not None:
        out += b[None, :, None, None]
    return out


def conv2d_backward(g, x, w, stride, padding, dilation):
    """(grad_x, grad_w, grad_bias) of conv2d by the same loops, transposed."""
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    (sh, sw), ((pt, pb), (pl, pr)), (dh, dw) = stride, padding, dilation
    xp = np.zeros((N, C, H + pt + pb, W + pl + pr))
    xp[:, :, pt:pt + H, pl:pl + W] = x
    gxp = np.zeros_like(xp)
    gw = np.zeros(w.shape)
    OH, OW = g.shape[2:]
    for oh in range(OH):
        for ow in range(OW):
            for i in range(kh):
                for j in range(kw):
                    r, c = oh * sh + i * dh, ow * sw + j * dw
                    gxp[:, :, r, c] += g[:, :, oh, ow] @ w[:, :, i, j]
                    gw[:, :, i, j] += g[:, :, oh, ow].T @ xp[:, :, r, c]
    return gxp[:, :, pt:pt + H, pl:pl + W], gw, g.sum(axis=(0, 2, 3))


# DeepZ on zonotopes, neuron by neuron in float64 (cypool.zonotope's oracle).
# A zonotope is (..., E): component 0 the centre, then the generators.

def zono_from_box(x, eps, clip):
    x = np.asarray(x, dtype=np.float64)
    eps = np.broadcast_to(np.asarray(eps, dtype=np.float64), x.shape)
    lo, hi = clip if clip is not None else (-np.inf, np.inf)
    cols = []
    centre = np.empty(x.size)
    for i, (xi, ei) in enumerate(zip(x.ravel(), eps.ravel())):
        a, b = max(xi - ei, lo), min(xi + ei, hi)
        centre[i] = (a + b) / 2
        if b > a:
            g = np.zeros(x.size)
            g[i] = (b - a) / 2
            cols.append(g)
    return np.column_stack([centre] + cols).reshape(x.shape + (1 + len(cols),))


def zono_bounds(z):
    z2 = np.asarray(z, dtype=np.float64).reshape(-1, z.shape[-1])
    lo, up = np.empty(len(z2)), np.empty(len(z2))
    for i, row in enumerate(z2):
        r = 0.0
        for g in row[1:]:
            r += abs(g)
        lo[i], up[i] = row[0] - r, row[0] + r
    return lo.reshape(z.shape[:-1]), up.reshape(z.shape[:-1])


def zono_relu(z):
    z2 = np.asarray(z, dtype=np.float64).reshape(-1, z.shape[-1])
    lo, up = zono_bounds(z2)
    rows, new = [], []
    for i, row in enumerate(z2):
        if up[i] <= 0:
            rows.append(np.zeros_like(row))
        elif lo[i] >= 0:
            rows.append(row.copy())
        else:
            lam = up[i] / (up[i] - lo[i])
            mu = -lam * lo[i] / 2
            r = lam * row
            r[0] += mu
            rows.append(r)
            g = np.zeros(len(z2))
            g[i] = mu
            new.append(g)
    out = np.column_stack([np.array(rows)] + new) if new else np.array(rows)
    return out.reshape(z.shape[:-1] + (out.shape[1],))


def zono_linear(z, w, b):
    z = np.asarray(z, dtype=np.float64)
    O, D = w.shape
    out = np.zeros((O, z.shape[-1]))
    for o in range(O):
        for d in range(D):
            out[o] += w[o, d] * z[d]
        if b is not None:
            out[o, 0] += b[o]
    return out


def zono_margins(z, label):
    z = np.asarray(z, dtype=np.float64)
    m = np.full(len(z), np.inf)
    for j in range(len(z)):
        if j != label:
            d = z[label] - z[j]
            m[j] = d[0] - np.abs(d[1:]).sum()
    return m


def deepz_certify(x, eps, layers, label, clip=(0.0, 1.0)):
    """(certified, margins) of the box x +- eps through layers: a list of
    ("conv", w, b, stride, padding), ("relu",), ("flatten",), ("linear", w, b)."""
    z = zono_from_box(x, eps, clip)
    for layer in layers:
        kind = layer[0]
        if kind == "conv":
            _, w, b, s, p = layer
            z = vector_conv2d(z[None], w.astype(np.float64),
                              None if b is None else b.astype(np.float64), (s, s), (p, p), (1, 1))[0]
        elif kind == "relu":
            z = zono_relu(z)
        elif kind == "flatten":
            z = z.reshape(-1, z.shape[-1])
        else:
            _, w, b = layer
            z = zono_linear(z, w.astype(np.float64), None if b is None else b.astype(np.float64))
    m = zono_margins(z, label)
    return bool((m > 0).all()), m


def backsub_exact(layers, relax, c, lo, hi):
    """The lower bound of ``c . y`` over the box [lo, hi] of a dense ReLU
    net, back-substituted through the given ReLU relaxations in exact
    rational arithmetic (fractions). layers: ("dense", W, b) and ("relu",)
    in order; relax: one (a, s, t) per ReLU, in order: a x <= relu(x) <=
    s x + t. Every float is taken at its exact value."""
    from fractions import Fraction as Fr

    def fr(v):
        return [Fr(float(x)) for x in np.asarray(v, np.float64).reshape(-1)]

    A = fr(c)
    const = Fr(0)
    k = len(relax)
    for layer in reversed(layers):
        if layer[0] == "relu":
            k -= 1
            a, s, t = (fr(v) for v in relax[k])
            const += sum(Ai * ti for Ai, ti in zip(A, t) if Ai < 0)
            A = [Ai * (ai if Ai >= 0 else si) for Ai, ai, si in zip(A, a, s)]
        else:
            _, W, b = layer
            W = np.asarray(W, np.float64)
            const += sum(Ai * Fr(float(bi)) for Ai, bi in zip(A, np.reshape(b, -1)) if Ai)
            out = [Fr(0)] * W.shape[1]
            for o in (o for o in range(len(A)) if A[o]):  # the nonzero terms only
                for i in np.flatnonzero(W[o]):
                    out[i] += A[o] * Fr(float(W[o, i]))
            A = out
    return const + sum(Ai * (Fr(float(l)) if Ai >= 0 else Fr(float(h))) for Ai, l, h in zip(A, lo, hi))
