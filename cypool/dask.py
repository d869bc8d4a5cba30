"""cypool on Dask arrays: the same operations, lazily, chunk by chunk.

Every function takes ``dask.array`` arrays (numpy arrays are wrapped as one
chunk) and returns ``dask.array`` arrays whose computed values are exactly
those of the in-memory function on the whole array, whatever the chunking:

* :func:`argmax2d`: chunks along the leading axes map directly; chunks of a
  map give (value, global flat index) partials that a tree of pairwise
  merges reduces under the first-maximum rule.
* :func:`max_pool2d`: chunks along N and C map directly; along H and W the
  output is cut where a window starts at an input chunk edge, and each
  output block reads the input rows and columns its windows cover (its
  neighbours' edges included). Indices are global offsets into each plane.
* :func:`max_pool2d_backward`: chunks along N and C map directly.
* :func:`vector_conv2d`: chunks along N and E map directly (the bias goes to
  the chunk that holds component 0); spatial chunks are cut as for pooling,
  each output block reading its receptive field.
* :func:`vector_conv2d_backward`: chunks along N and E; the weight gradient is
  the sum of the chunks' gradients in block order, so it is deterministic for
  a given chunking (equal to the in-memory one up to rounding).

Threads: each Dask task runs one cypool kernel on ``num_threads`` OpenMP
threads, 1 by default, because Dask already runs one task per worker thread
(a core each, by default). Raise it only when worker threads times
``num_threads`` stays within the cores, e.g. one worker thread per machine
and ``num_threads`` = its cores. ``None`` means OpenMP's default: all cores
per task.

Parameters are checked when the graph is built, with the in-memory
functions' own checks and messages; nothing is computed for it.

Needs ``pip install 'cypool[dask]'`` (dask[array] and distributed).
"""
from __future__ import annotations

import operator
from functools import partial

import numpy as np

try:
    import dask.array as da
except ImportError as e:  # pragma: no cover - exercised only without dask
    raise ImportError("cypool.dask needs dask: pip install 'cypool[dask]'") from e

from . import _checks as chk
from . import _geometry as geo
from . import argmax as _argmax
from . import pooling as _pooling
from . import _select
from . import vector_conv as _vconv

__all__ = ["argmax2d", "max_pool2d", "max_pool2d_backward", "vector_conv2d", "vector_conv2d_backward"]


# --------------------------------------------------------------------------
# Arguments


def _dask(x, name: str) -> da.Array:
    """x as a dask array with known chunk sizes (a numpy array: one chunk)."""
    if not isinstance(x, da.Array):
        if not (isinstance(x, np.ndarray) or hasattr(x, "__array__") or isinstance(x, (list, tuple))):
            raise TypeError(f"{name} must be a dask or numpy array, got {type(x).__name__}")
        x = da.from_array(np.asarray(x), chunks=-1)
    if any(c != c for cs in x.chunks for c in cs):  # NaN: unknown sizes
        raise ValueError(f"{name} has unknown chunk sizes; call {name}.compute_chunk_sizes() first")
    return x


def _shadow(x: da.Array) -> np.ndarray:
    """A numpy stand-in for x's shape and dtype (one element, zero strides)
    that the in-memory checks can inspect: nothing is computed or allocated."""
    return np.broadcast_to(np.zeros((), dtype=x.dtype), x.shape)


def _small(x):
    """A small operand (weight, bias) as numpy, or None: a dask one is
    computed, the rest is left to the in-memory checks."""
    return x.compute() if isinstance(x, da.Array) else x


# --------------------------------------------------------------------------
# Cutting a windowed operation's output along one axis


def _axis_blocks(n: int, chunks: tuple, k: int, s: int, p: int, d: int, out_n: int, count):
    """Output blocks (o0, o1, base, lo, hi) along an axis of n inputs in the
    given chunks, for windows o that start at input o*s - p and span
    (k - 1)*d + 1: outputs [o0, o1) are outputs [o0 - base, o1 - base) of
    the in-memory operation, with the same padding p, on inputs [lo, hi).

    A block starts at the first window that starts in an input chunk. Its
    slice starts base = o0 - ceil(p/s) windows early (or at 0), so that the
    call's own padding lands where no kept window reads it; it ends where
    its last window does, or at n for the last block, whose windows reach
    the true padding. count(length) is the in-memory output size of a
    slice; a block it cannot give is merged into the next one.
    """
    cut = {0, out_n}
    start = 0
    for c in chunks[:-1]:
        start += c
        cut.add(min(out_n, -(-(start + p) // s)))
    lead = -(-p // s)
    blocks: list = []
    o0 = 0
    for o1 in sorted(cut)[1:]:
        while True:
            base = max(0, o0 - lead)
            lo = base * s
            hi = n if o1 == out_n else min(n, (o1 - 1) * s - p + (k - 1) * d + 1)
            if lo < hi and count(hi - lo) >= o1 - base:
                blocks.append((o0, o1, base, lo, hi))
                o0 = o1
                break
            if o1 < out_n or not blocks:  # join the next block (the whole axis always works)
                break
            o0 = blocks.pop()[0]  # the last block failed: join the one before it
    return blocks


def _counter(geometry, axis: int):
    """count(length) for _axis_blocks: the output size along axis (0: rows,
    1: columns) of the in-memory geometry, 0 where it refuses the slice."""
    def count(length):
        try:
            return geometry(length, axis)
        except ValueError:
            return 0
    return count


def _spatial_grid(x: da.Array, window: geo.Window, out_hw: tuple, geometry, hw_axes=(-2, -1)):
    """(row blocks, column blocks) of _axis_blocks that cut the out_hw
    output of x, whose rows and columns are the axes hw_axes, for windows
    (kh, kw, sh, sw, ph, pw, dh, dw)."""
    ah, aw = (a % x.ndim for a in hw_axes)
    kh, kw, sh, sw, ph, pw, dh, dw = window
    rows = _axis_blocks(x.shape[ah], x.chunks[ah], kh, sh, ph, dh, out_hw[0], _counter(geometry, 0))
    cols = _axis_blocks(x.shape[aw], x.chunks[aw], kw, sw, pw, dw, out_hw[1], _counter(geometry, 1))
    return rows, cols


def _block_input(x: da.Array, r, c, hw_axes=(-2, -1), whole=()):
    """x[..., lo:hi (rows), lo:hi (columns), ...] with the rows, columns and
    the axes in whole each in one chunk."""
    ah, aw = (a % x.ndim for a in hw_axes)
    index = [slice(None)] * x.ndim
    index[ah] = slice(r[3], r[4])
    index[aw] = slice(c[3], c[4])
    xs = x[tuple(index)]
    return xs.rechunk({ah: -1, aw: -1, **{a % x.ndim: -1 for a in whole}})


# --------------------------------------------------------------------------
# argmax2d


def _partials_dtype(dtype):
    """(value, global flat index) records: what argmax2d's reduction carries."""
    return np.dtype([("v", dtype), ("i", np.int64)])


def _argmax_partial(block, W, num_threads, block_info=None):
    """(max, global flat index of the first max) of each map of a chunk, as
    records of shape (..., 1, 1)."""
    values, coords = _argmax.argmax2d(block, return_values=True, num_threads=num_threads)
    (r0, _), (c0, _) = block_info[0]["array-location"][-2:]
    rec = np.empty(values.shape + (1, 1), dtype=_partials_dtype(values.dtype))
    rec["v"][..., 0, 0] = values
    rec["i"][..., 0, 0] = (coords[..., 0].astype(np.int64) + r0) * W + coords[..., 1] + c0
    return rec


def _first_max(rec, axis=None, keepdims=True):
    """Records (..., a, b) reduced over the last two axes to (..., 1, 1) under
    the first-maximum rule: the largest value, NaN above all; on a tie (or
    among NaN) the smallest flat index. Associative: any tree gives it."""
    v = rec["v"].reshape(rec.shape[:-2] + (-1,))
    i = rec["i"].reshape(v.shape)
    best = v.max(axis=-1, keepdims=True)  # NaN where there is one
    won = v == best
    if v.dtype.kind == "f":
        won |= np.isnan(v) & np.isnan(best)
    k = np.where(won, i, np.iinfo(np.int64).max).argmin(axis=-1)[..., None]
    out = np.empty(rec.shape[:-2] + (1, 1), dtype=rec.dtype)
    out["v"][..., 0, 0] = np.take_along_axis(v, k, -1)[..., 0]
    out["i"][..., 0, 0] = np.take_along_axis(i, k, -1)[..., 0]
    return out


def _values(rec):
    return rec["v"][..., 0, 0]


def _coords(rec, W, dtype):
    flat = rec["i"][..., 0, 0]
    return np.stack([flat // W, flat % W], axis=-1).astype(dtype, copy=False)


def argmax2d(x, *, return_values=False, index_dtype=np.int64, num_threads=1):
    """:func:`cypool.argmax2d` on a dask array ``(..., H, W)``, chunked anywhere.

    Returns coords ``(..., 2)`` (and the maxima first, with
    ``return_values=True``) as dask arrays. ``num_threads`` is per task.
    """
    x = _dask(x, "x")
    chk.array(_shadow(x), "x", tuple(range(2, 33)))
    H, W = x.shape[-2:]
    idt = chk.index_dtype_arg(index_dtype, max(H, W))
    nt = chk.num_threads_arg(num_threads) or None
    rec = _partials_dtype(x.dtype)
    lead, ndim = x.chunks[:-2], x.ndim
    parts = x.map_blocks(partial(_argmax_partial, W=W, num_threads=nt), dtype=rec,
                         chunks=lead + ((1,) * len(x.chunks[-2]), (1,) * len(x.chunks[-1])),
                         meta=np.empty((0,) * ndim, rec))
    best = parts
    if parts.shape[-2:] != (1, 1):  # a tree of merges (dask's split_every)
        best = da.reduction(parts, lambda r, axis, keepdims: r, _first_max, axis=(ndim - 2, ndim - 1),
                            keepdims=True, dtype=rec, concatenate=True, meta=np.empty((0,) * ndim, rec))
    coords = best.map_blocks(partial(_coords, W=W, dtype=idt), dtype=idt, drop_axis=ndim - 1,
                             chunks=lead + ((2,),), meta=np.empty((0,) * (ndim - 1), idt))
    if not return_values:
        return coords
    values = best.map_blocks(_values, dtype=x.dtype, drop_axis=(ndim - 2, ndim - 1), chunks=lead,
                             meta=np.empty((0,) * (ndim - 2), x.dtype))
    return values, coords


# --------------------------------------------------------------------------
# max pooling


def _pool_block(block, r, c, W, params, return_indices, idt, num_threads):
    """The pooled output block (and its global indices) of an input slice."""
    kernel_size, stride, padding, dilation, ceil_mode = params
    res = _pooling.max_pool2d(block, kernel_size, stride, padding, dilation, ceil_mode, return_indices,
                              index_dtype=np.int64, num_threads=num_threads)
    keep = (Ellipsis, slice(r[0] - r[2], r[1] - r[2]), slice(c[0] - c[2], c[1] - c[2]))
    if not return_indices:
        return res[keep]
    out, idx = res[0][keep], res[1][keep]
    w = block.shape[-1]
    idx = (idx // w + r[3]) * W + idx % w + c[3]  # slice offsets to whole-plane offsets
    return out, idx.astype(idt, copy=False)


def max_pool2d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False, *, index_dtype=np.int64, num_threads=1):
    """:func:`cypool.max_pool2d` on a dask array ``(N, C, H, W)`` or ``(C, H, W)``.

    Chunks along N and C map directly. Along H and W, each output block
    reads the input its windows cover (neighbouring chunks' edges too), so
    any chunking gives the in-memory result; indices are flat offsets into
    each whole input plane. ``num_threads`` is per task.
    """
    x = _dask(x, "x")
    chk.array(_shadow(x), "x", (3, 4))
    H, W = x.shape[-2:]
    ceil_mode = bool(ceil_mode)
    geom = geo.pool_geometry(H, W, kernel_size, stride, padding, dilation, ceil_mode)
    idt = chk.index_dtype_arg(index_dtype, H * W) if return_indices else None
    nt = chk.num_threads_arg(num_threads) or None
    params = (kernel_size, stride, padding, dilation, ceil_mode)

    def geometry(length, axis):
        hw = (length, W) if axis == 0 else (H, length)
        return geo.pool_geometry(*hw, kernel_size, stride, padding, dilation, ceil_mode).out_hw[axis]

    rows, cols = _spatial_grid(x, geom.window, geom.out_hw, geometry)
    outs, idxs = [], []
    for r in rows:
        orow, irow = [], []
        for c in cols:
            fn = partial(_pool_block, r=r, c=c, W=W, params=params, return_indices=bool(return_indices),
                         idt=idt, num_threads=nt)
            xs = _block_input(x, r, c)
            # blockwise over every axis, none contracted: each chunk reaches
            # fn as it is (apply_gufunc would copy it into a new array)
            ind = tuple(range(x.ndim))
            sizes = {ind[-2]: lambda _, n=r[1] - r[0]: n, ind[-1]: lambda _, n=c[1] - c[0]: n}
            meta = np.empty((0,) * x.ndim, x.dtype)
            res = da.blockwise(fn, ind, xs, ind, adjust_chunks=sizes, meta=meta, concatenate=False)
            if return_indices:
                o = da.blockwise(operator.getitem, ind, res, ind, 0, None, meta=meta)
                i = da.blockwise(operator.getitem, ind, res, ind, 1, None, meta=meta.astype(idt))
                irow.append(i)
            else:
                o = res
            orow.append(o)
        outs.append(orow)
        idxs.append(irow)
    out = da.block(outs)
    return (out, da.block(idxs)) if return_indices else out


def _unpool_block(g, ix, H, W, num_threads):
    shape = g.shape[:-2] + (H, W)
    return _pooling.max_pool2d_backward(g, ix, shape, num_threads=num_threads)


def max_pool2d_backward(grad_output, indices, input_shape, *, num_threads=1):
    """:func:`cypool.max_pool2d_backward` on dask arrays chunked along N and C
    (each plane's H and W are brought into one chunk). Indices out of range
    raise ValueError when the graph is computed, as in memory."""
    g = _dask(grad_output, "grad_output")
    ix = _dask(indices, "indices")
    _, _, ishadow, shape = _pooling._backward_args(_shadow(g), _shadow(ix), input_shape)
    nt = chk.num_threads_arg(num_threads) or None
    H, W = shape[-2:]
    g = g.rechunk({g.ndim - 2: -1, g.ndim - 1: -1})
    ix = ix.rechunk(g.chunks).astype(ishadow.dtype, copy=False)
    return da.map_blocks(partial(_unpool_block, H=H, W=W, num_threads=nt), g, ix, dtype=g.dtype,
                         chunks=g.chunks[:-2] + ((H,), (W,)))


# --------------------------------------------------------------------------
# vector convolution


def _conv_block(block, weight, bias, r, c, params, num_threads, block_info=None):
    """The output block of an input slice; the bias only where the block
    holds component 0."""
    first = block_info[0]["array-location"][-1][0] == 0
    out = _vconv.vector_conv2d(block, weight, bias if first else None, *params, num_threads=num_threads)
    return out[..., r[0] - r[2]:r[1] - r[2], c[0] - c[2]:c[1] - c[2], :]


def _conv_checks(x, weight, stride, padding, dilation, num_threads):
    """(x, weight, its geo.WindowGeometry, threads), by the in-memory checks."""
    x = _dask(x, "x")
    weight = _small(weight)
    _, weight, _, geom = geo.vector_conv_args(_shadow(x), weight, stride, padding, dilation)
    return x, weight, geom, chk.num_threads_arg(num_threads) or None


def vector_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, *, num_threads=1):
    """:func:`cypool.vector_conv2d` on a dask array ``(C, H, W, E)`` or
    ``(N, C, H, W, E)``; weight and bias are numpy (a dask one is computed).

    Chunks along N and E map directly, the bias going to the chunk that
    holds component 0; C is brought into one chunk; spatial chunks read
    their receptive field from their neighbours. ``num_threads`` is per task.
    """
    x, weight, geom, nt = _conv_checks(x, weight, stride, padding, dilation, num_threads)
    O = weight.shape[0]
    bias = chk.bias_arg(_small(bias), O, x.dtype) if bias is not None else None
    H, W = x.shape[-3:-1]
    params = (stride, padding, dilation)

    def geometry(length, axis):
        hw = (length, W) if axis == 0 else (H, length)
        g = geo.conv_geometry(*hw, geom.kh, geom.kw, (geom.sh, geom.sw), (geom.ph, geom.pw),
                              (geom.dh, geom.dw))
        return (g.OH, g.OW)[axis]

    rows, cols = _spatial_grid(x, geom.window, geom.out_hw, geometry, (-3, -2))
    grid = []
    for r in rows:
        row = []
        for c in cols:
            xs = _block_input(x, r, c, (-3, -2), whole=(-4,))
            chunks = xs.chunks[:-4] + ((O,), (r[1] - r[0],), (c[1] - c[0],), xs.chunks[-1])
            fn = partial(_conv_block, weight=weight, bias=bias, r=r, c=c, params=params, num_threads=nt)
            row.append(da.map_blocks(fn, xs, dtype=x.dtype, chunks=chunks))
        grid.append(row)
    # da.block joins the last axes: put (OH, OW) last for it, then back
    if len(grid) == 1 and len(grid[0]) == 1:
        return grid[0][0]
    moved = [[da.moveaxis(b, -1, -3) for b in row] for row in grid]
    return da.moveaxis(da.block(moved), -3, -1)


def _input_grad_block(g, x, weight, params, algo, num_threads):
    return _vconv._backward(g, x, weight, *params, True, False, num_threads, algo)[0]


def _weight_grad_block(g, x, weight, params, algo, nb, num_threads):
    gw = _vconv._backward(g, x, weight, *params, False, True, num_threads, algo)[1]
    return gw[(None,) * nb]


def _sum_in_order(parts):
    """The weight-gradient blocks (E blocks, [N blocks,] O, C, kh, kw) added
    one by one, E block by E block, image block by image block."""
    flat = parts.reshape((-1,) + parts.shape[-4:])
    total = flat[0].copy()
    for p in flat[1:]:
        total += p
    return total


def vector_conv2d_backward(grad_output, x, weight, stride=1, padding=0, dilation=1, *,
                           needs_input_grad=True, needs_weight_grad=True, num_threads=1):
    """:func:`cypool.vector_conv2d_backward` on dask arrays chunked along N
    and E (C, H and W, and O, OH and OW, are brought into one chunk each).

    Returns ``(grad_x, grad_weight, grad_bias)`` as dask arrays (None for a
    gradient not needed). grad_x is the in-memory one exactly; grad_weight
    adds the chunks' gradients in block order, and grad_bias sums component
    0 over the chunks that hold it: deterministic for a given chunking, and
    equal to the in-memory ones up to rounding.
    """
    x, weight, geom, nt = _conv_checks(x, weight, stride, padding, dilation, num_threads)
    OH, OW = geom.out_hw
    g = _dask(grad_output, "grad_output")
    batched = x.ndim == 5
    want = ((x.shape[0],) if batched else ()) + (weight.shape[0], OH, OW, x.shape[-1])
    chk.grad_output_arg(_shadow(g), x.dtype, want)
    lead = x.ndim - 4  # 1 when batched
    x = x.rechunk({lead: -1, lead + 1: -1, lead + 2: -1})
    g = g.rechunk(x.chunks[:lead] + ((want[lead],), (OH,), (OW,), x.chunks[-1]))
    params = (stride, padding, dilation)
    # The whole array's E-vectorised tiles in every chunk where it takes
    # them; else each chunk's own choice of conv2d's kernels (never TILES
    # at a smaller E).
    whole = _select.select_vector_backward(x.shape[-1], geom.sh, geom.sw)
    algo = whole if whole == _select.VectorAlgo.TILES else None
    grad_x = grad_w = None
    if needs_input_grad:
        fn = partial(_input_grad_block, weight=weight, params=params, algo=algo, num_threads=nt)
        grad_x = da.map_blocks(fn, g, x, dtype=x.dtype, chunks=x.chunks)
    if needs_weight_grad:
        fn = partial(_weight_grad_block, weight=weight, params=params, algo=algo, nb=lead + 1,
                     num_threads=nt)
        # one (1, [1,] O, C, kh, kw) gradient per block: axes (E, [N,]) weight's
        n = "n" if batched else ""
        parts = da.blockwise(fn, "e" + n + "OCkl", g, n + "opqe", x, n + "cyxe", dtype=x.dtype,
                             new_axes=dict(zip("OCkl", weight.shape)), concatenate=True)
        blocks = tuple(range(lead + 1))
        grad_w = parts.rechunk({a: -1 for a in blocks}).map_blocks(
            _sum_in_order, dtype=x.dtype, drop_axis=blocks, chunks=tuple((s,) for s in weight.shape))
    gb = g[..., 0].sum(axis=tuple(a for a in range(g.ndim - 1) if a != lead))
    return grad_x, grad_w, gb
