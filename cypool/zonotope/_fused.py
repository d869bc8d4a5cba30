"""The fused paths of Network: the same numbers as the layers one by one,
without computing with the zeros a box's and a ReLU's generators hold."""
from __future__ import annotations

import time

import numpy as np

from .. import _checks as chk
from .. import _geometry as geo
from .._conv_engine import tiles_forward
from ._functions import conv2d
from ._ops import box, dense_into, relu_into


def box_conv(x, eps, clip, conv, alloc):
    """conv.forward(from_box(x, eps, clip)) without making the box's
    zonotope: the centre convolved as a one-component image, and each
    generator (one pixel's half-width, zero elsewhere) scattered as the
    weights that meet its pixel. Each generator column of the output is
    one product, as in the dense convolution (whose other terms are
    zeros); only the centre's sum may round differently. None where x is
    not an image for this convolution (the dense path then checks it)."""
    shape, centre, half, free = box(x, eps, clip)
    w = conv.weight
    O, C, kh, kw = w.shape
    if len(shape) != 3 or shape[0] != C:
        return None
    dt = w.dtype
    c_out = conv2d(centre.reshape(shape + (1,)).astype(dt), w, conv.bias, conv.stride, conv.padding,
                   conv.dilation, num_threads=conv.num_threads)
    _, OH, OW, _ = c_out.shape
    out = alloc((O, OH, OW, 1 + free.size), dt)
    out.fill(0)
    out[..., 0] = c_out[..., 0]
    _, H, W = shape
    sh, sw, ph, pw, dh, dw = geo.step_params(conv.stride, conv.padding, conv.dilation)
    gen = np.full(centre.size, -1, np.intp)
    gen[free] = np.arange(free.size)
    scale = half[free].astype(dt)
    for i in range(kh):
        rows = np.arange(OH) * sh - ph + i * dh
        oh = np.flatnonzero((rows >= 0) & (rows < H))
        for j in range(kw):
            cols = np.arange(OW) * sw - pw + j * dw
            ow = np.flatnonzero((cols >= 0) & (cols < W))
            # pixel (c, rows[oh], cols[ow]) meets tap (c, i, j) at output (oh, ow)
            pix = (np.arange(C)[:, None, None] * H + rows[oh][:, None]) * W + cols[ow]
            g = gen[pix]
            c_idx, a, b = np.nonzero(g >= 0)
            gg = g[c_idx, a, b]
            out[:, oh[a], ow[b], 1 + gg] = w[:, c_idx, i, j] * scale[gg]
    return out


# A ReLU's new generators, each mu at one neuron and 0 at every other, need
# not be written out when a convolution or a dense layer follows: that
# layer's output column of such a generator is one product a neuron (the
# dense product would add zeros to it), scattered. Network does this; the
# results are those of the dense form, to the bit.

def tail_conv(conv, z, idx, mu, alloc):
    """conv.forward of z with the new generators (idx, mu) appended, for
    an unbatched (C, H, W, E) z: the tiles over z, the generators
    scattered."""
    x5, weight, _, geom = geo.vector_conv_args(z, conv.weight, conv.stride, conv.padding,
                                               conv.dilation)
    _, C, H, W, E = x5.shape
    O, k, dt = weight.shape[0], idx.size, weight.dtype
    b = chk.bias_arg(conv.bias, O, dt)
    out = alloc((1, O, geom.OH, geom.OW, E + k), dt)
    tiles_forward(x5, weight, b, out[..., :E], geom.window, chk.num_threads_arg(conv.num_threads),
                  skip_zero_taps=True)
    scatter_tail(out[0, ..., E:], idx, mu, weight, geom.window, H, W)
    return out[0]


def _reach(idx, window: geo.Window, H, W, OH, OW):
    """Where the neurons idx of a (C, H, W) image meet the taps of a
    convolution (by window) with output (OH, OW): their channels, and per
    tap row (column) the output row (column) times the stride, valid
    where okh (okw)."""
    kh, kw, sh, sw, ph, pw, dh, dw = window
    c, h, w = idx // (H * W), idx // W % H, idx % W
    # neuron row h meets tap row i at output row rh / sh (and so for columns): every tap at once
    rh = h[:, None] + ph - np.arange(kh) * dh  # (k, kh)
    rw = w[:, None] + pw - np.arange(kw) * dw  # (k, kw)
    okh = (rh % sh == 0) & (rh >= 0) & (rh < OH * sh)
    okw = (rw % sw == 0) & (rw >= 0) & (rw < OW * sw)
    return c, rh, rw, okh, okw


def scatter_tail(tail, idx, mu, weight, window: geo.Window, H, W):
    """tail (O, OH, OW, k) = the convolution (by window) of the k
    generators that are mu[g] at neuron idx[g] of a (C, H, W) image and
    0 elsewhere: one product an output."""
    _, OH, OW, k = tail.shape
    tail.fill(0)
    c, rh, rw, okh, okw = _reach(idx, window, H, W, OH, OW)
    g, i, j = np.nonzero(okh[:, :, None] & okw[:, None, :])
    tail[:, rh[g, i] // window.sh, rw[g, j] // window.sw, g] = weight[:, c[g], i, j] * mu[g]


def reach_order(idx, window: geo.Window, H, W, OH, OW):
    """The order of the neurons idx (of a (C, H, W) image) by the first
    output pixel of the convolution (by window) that each reaches, in
    row-major order (stable): generators so ordered reach few rows of the
    flattened output per block of E, which the dense layer after them
    skips the rest of (in ConvMed's, 40% fewer multiply-adds at eps
    0.05)."""
    _, rh, rw, okh, okw = _reach(idx, window, H, W, OH, OW)
    big = np.iinfo(np.intp).max // 4
    first_row = np.where(okh, rh // window.sh, big).min(axis=1, initial=big)
    first_col = np.where(okw, rw // window.sw, big).min(axis=1, initial=big)
    none = (first_row == big) | (first_col == big)  # read by no output
    first_row[none], first_col[none] = big, big
    return np.lexsort((first_col, first_row))


def tail_linear(dense, z, idx, mu, alloc):
    """dense.forward of z with the new generators (idx, mu) appended, for
    an unbatched (D, E) z."""
    weight = dense.weight
    if z.dtype != weight.dtype or z.shape[0] != weight.shape[1]:
        return None
    O, E, k = weight.shape[0], z.shape[1], idx.size
    out = alloc((O, E + k), z.dtype)
    b = chk.bias_arg(dense.bias, O, z.dtype)
    dense_into(chk.contiguous(z, z.dtype), weight, b, out[:, :E], chk.num_threads_arg(dense.num_threads))
    np.multiply(weight[:, idx], mu, out=out[:, E:])
    return out


def append_tail(z, idx, mu, alloc):
    """z with the new generators (idx, mu) written out."""
    E, k = z.shape[-1], idx.size
    out = alloc(z.shape[:-1] + (E + k,), z.dtype)
    out[..., :E] = z
    out[..., E:] = 0
    out.reshape(-1, E + k)[idx, E + np.arange(k)] = mu
    return out


# The banded head. After a first convolution, the generator of input pixel
# (c, h, w) is zero in every output row whose window misses row h: with the
# generators in row order (by strips of rows, see banded_head), output row
# r of the convolution holds nonzeros only in a band [lo[r], hi[r]) of
# generators. The first convolution and its ReLU then keep each row's band
# alone ("banded storage": row r's columns 1.. are generators lo[r]..),
# and the second convolution reads, for each of its output rows, the bands
# of the rows in its window. Generators in this order rather than C order
# change no certificate (bounds and margins sum over generators in any
# order).

def banded_head(x, eps, clip, conv1, relu, conv2, ws, times):
    """conv2(relu(conv1(box))) of an image x, by bands; None where x is not
    an image for conv1 or conv2 does not take conv1's output (the general
    path then checks it). The ReLU's new generators follow the box's."""
    shape, centre, half, _ = box(x, eps, clip)
    w1, w2 = conv1.weight, conv2.weight
    if len(shape) != 3 or shape[0] != w1.shape[1] or w2.shape[1] != w1.shape[0] \
            or w2.dtype != w1.dtype:
        return None
    t0 = time.perf_counter()
    C, H, W = shape
    dt = w1.dtype
    kh, kw = w1.shape[2:]
    sh, sw, ph, pw, dh, dw = geo.step_params(conv1.stride, conv1.padding, conv1.dilation)
    span = (kh - 1) * dh + 1
    # the free pixels (whose box is not a point) in strips of sr rows, each
    # in (w, h, c) order: sr = sh where conv1's windows cover whole strips
    # (then 24 generators are 12 columns by 2 rows, not 24 by 1, and reach
    # fewer neurons of the layers after), else rows
    sr = sh if span % sh == 0 else 1
    c, h, w = np.indices(shape).reshape(3, -1)
    order = np.lexsort((c, h, w, (h + ph) // sr))
    pix = order[half[order] > 0]
    n = pix.size
    gen = np.full(C * H * W, -1, np.intp)
    gen[pix] = np.arange(n)
    strip_start = np.searchsorted((pix // W % H + ph) // sr, np.arange((H - 1 + ph) // sr + 2))
    c_out = conv2d(centre.reshape(shape + (1,)).astype(dt), w1, conv1.bias, conv1.stride, conv1.padding,
                   conv1.dilation, num_threads=conv1.num_threads)
    O1, OH1, OW1, _ = c_out.shape
    top = np.arange(OH1) * sh - ph
    first, last = np.clip(top, 0, H), np.clip(top + span, 0, H)  # the window's rows [first, last)
    lo = strip_start[(first + ph) // sr]
    hi = np.where(last > first, strip_start[(last - 1 + ph) // sr + 1], lo)
    band = int((hi - lo).max())
    zb = ws.taker(None)((O1, OH1, OW1, 1 + band), dt)
    zb.fill(0)
    zb[..., 0] = c_out[..., 0]
    # pixel (c, rows[r, i], cols[q, j]) meets tap (c, i, j) at output (r, q): every tap at once
    rows = top[:, None] + np.arange(kh) * dh  # (OH1, kh)
    cols = np.arange(OW1)[:, None] * sw - pw + np.arange(kw) * dw  # (OW1, kw)
    inside = ((rows >= 0) & (rows < H))[None, :, :, None, None] & ((cols >= 0) & (cols < W))[None, None, None]
    flat = (np.arange(C)[:, None, None, None, None] * H + rows[None, :, :, None, None]) * W \
        + cols[None, None, None]  # (C, OH1, kh, OW1, kw)
    g = np.where(inside, gen[np.where(inside, flat, 0)], -1)
    c_idx, r, i, q, j = np.nonzero(g >= 0)
    gg = g[c_idx, r, i, q, j]
    zb[:, r, q, 1 + gg - lo[r]] = w1[:, c_idx, i, j] * half[pix[gg]].astype(dt)
    t1 = time.perf_counter()
    # the ReLU on banded storage: a row's zeros beyond its band change nothing
    zr, idx, mu = relu_into(zb, chk.num_threads_arg(relu.num_threads), ws.taker(zb), apart=True)
    t2 = time.perf_counter()
    x5, _, _, geom = geo.vector_conv_args(np.broadcast_to(np.zeros((), dt), (O1, OH1, OW1, 1)),
                                          w2, conv2.stride, conv2.padding, conv2.dilation)
    kh2, kw2, sh2, sw2, ph2, pw2, dh2, dw2, OH2, OW2 = geom
    O2, k = w2.shape[0], idx.size
    # the new generators in the order of the output pixels they reach (any order certifies alike)
    order = reach_order(idx, geom.window, OH1, OW1, OH2, OW2)
    idx, mu = idx[order], mu[order]
    out = ws.taker(zr)((O2, OH2, OW2, 1 + n + k), dt)
    b2, nt2 = chk.bias_arg(conv2.bias, O2, dt), chk.num_threads_arg(conv2.num_threads)
    for r in range(OH2):
        rows = r * sh2 - ph2 + np.arange(kh2) * dh2
        inside = np.flatnonzero((rows >= 0) & (rows < OH1))
        u_lo = int(lo[rows[inside]].min()) if inside.size else 0
        u_hi = int(hi[rows[inside]].max()) if inside.size else 0
        slab = ws.scratch((O1, kh2, OW1, 1 + u_hi - u_lo), dt)  # the window's rows, their bands aligned
        slab.fill(0)
        for t in inside:
            rr = rows[t]
            width = int(hi[rr] - lo[rr])
            slab[:, t, :, 0] = zr[:, rr, :, 0]
            slab[:, t, :, 1 + lo[rr] - u_lo:1 + lo[rr] - u_lo + width] = zr[:, rr, :, 1:1 + width]
        # the slab's rows are the window's (stride, padding and dilation in
        # rows done), and a dead neuron's vector is left out by the tiles
        res = np.empty((1, O2, 1, OW2, slab.shape[-1]), dt)
        tiles_forward(slab[None], w2, b2, res, geo.Window(kh2, kw2, 1, sw2, 0, pw2, 1, dw2), nt2,
                      skip_zero_taps=True)
        res = res[0]
        row = out[:, r]
        row[..., 0] = res[:, 0, :, 0]
        row[..., 1:1 + u_lo] = 0
        row[..., 1 + u_lo:1 + u_hi] = res[:, 0, :, 1:]
        row[..., 1 + u_hi:1 + n] = 0
    scatter_tail(out[..., 1 + n:], idx, mu, w2, geom.window, OH1, OW1)
    if times is not None:
        t3 = time.perf_counter()
        times["VectorConv2d"] = times.get("VectorConv2d", 0.0) + (t1 - t0) + (t3 - t2)
        times["VectorReLU"] = times.get("VectorReLU", 0.0) + (t2 - t1)
    return out
