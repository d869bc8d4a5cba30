"""Max pooling with index tracking: the functional API.

Conventions are PyTorch's (``torch.nn.functional.max_pool2d``): see README,
"Semantics". Inputs are ``(N, C, H, W)`` or unbatched ``(C, H, W)``.
"""
from __future__ import annotations

import numpy as np

from . import _checks as chk
from . import _geometry as geo
from ._backend import kernel, streams, threads_for

__all__ = ["max_pool2d", "max_pool2d_backward", "max_unpool2d", "max_unpool2d_backward"]


def _planes(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """x as C-contiguous (N*C, H, W) planes of the kernel dtype."""
    return chk.contiguous(x, dtype).reshape(-1, x.shape[-2], x.shape[-1])


def max_pool2d(
    x,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode=False,
    return_indices=False,
    *,
    index_dtype=np.int64,
    out=None,
    num_threads=None,
):
    """2-D max pooling over the last two axes, optionally with argmax indices.

    Parameters
    ----------
    x : ndarray, shape (N, C, H, W) or (C, H, W)
        Input; float32, float64, float16 or integer dtypes up to 64 bits
        (not uint64). Any strides.
    kernel_size, stride, padding, dilation : int or (int, int)
        As in ``torch.nn.MaxPool2d``. ``stride`` defaults to ``kernel_size``;
        padding is implicit -inf with ``0 <= padding <= kernel_size // 2``.
    ceil_mode : bool
        Use ceiling instead of floor for the output size; a window that would
        start in the right or bottom padding is dropped.
    return_indices : bool
        Also return the position of each maximum.
    index_dtype : np.int64 or np.int32, keyword-only
        dtype of the indices.
    out : ndarray, or a tuple (values, indices) with return_indices, keyword-only
        C-contiguous arrays of the output's shape (values in x's dtype,
        indices in index_dtype) to write into and return, numpy's meaning
        of ``out``: a loop that reuses them allocates nothing and does not
        fault in fresh pages.
    num_threads : int or None, keyword-only
        Threads to use; None means OpenMP's default (``OMP_NUM_THREADS``,
        threadpoolctl limits). Small inputs always run on one thread.

    Returns
    -------
    out : ndarray, shape (N, C, OH, OW) or (C, OH, OW), dtype of x
    indices : ndarray of index_dtype, same shape as out
        Only with ``return_indices=True``. Flat offsets ``row * W + col``
        into each input plane: the first maximum in row-major window order,
        or the first NaN. Never a position in the padding.

    Raises
    ------
    TypeError, ValueError
        For an unsupported dtype or rank, an empty dimension, or parameters
        that give no valid pooling (each message names the parameter).
    """
    x, kd = chk.array(x, "x", (3, 4))
    H, W = x.shape[-2:]
    geom = geo.pool_geometry(H, W, kernel_size, stride, padding, dilation, bool(ceil_mode))
    kh, kw, sh, sw, ph, pw, dh, dw, OH, OW = geom
    nt = chk.num_threads_arg(num_threads)
    idt = chk.index_dtype_arg(index_dtype, H * W) if return_indices else chk.INDEX_DTYPES[1]
    shape = x.shape[:-2] + (OH, OW)
    outs = None if out is None else _pool_outs(out, x, shape, idt, return_indices)
    planes = _planes(x, kd)
    P = planes.shape[0]
    if outs is not None and kd == x.dtype:
        res = outs[0].reshape(P, OH, OW)
    else:
        res = np.empty((P, OH, OW), dtype=kd)
    if outs is not None and return_indices:
        idx = outs[1].reshape(P, OH, OW)
    else:
        idx = np.empty((P, OH, OW) if return_indices else (1, 1, 1), dtype=idt)
    threads = threads_for(nt, planes.size + res.size, P)
    stream = return_indices and streams(planes.nbytes + res.nbytes, idx.nbytes)
    kernel("max_pool2d_forward", kd, idt)(
        planes, res, idx, bool(return_indices), H * W >= chk.INT32_LIMIT, stream,
        kh, kw, sh, sw, ph, pw, dh, dw, threads,
    )
    if outs is not None:
        if kd != x.dtype:
            outs[0][...] = res.reshape(shape)  # computed widened, stored in x's dtype
        return out
    res = res.reshape(shape)
    if kd != x.dtype:
        res = res.astype(x.dtype)
    if return_indices:
        return res, idx.reshape(shape)
    return res


def _pool_outs(out, x, shape, idt, return_indices):
    """max_pool2d's out=, checked: (values, indices or None)."""
    if return_indices:
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError("out must be a tuple (values, indices) when return_indices=True, "
                            f"got {type(out).__name__}")
        values = chk.out_arg(out[0], shape, x.dtype, "out[0]")
        indices = chk.out_arg(out[1], shape, idt, "out[1]")
        chk.no_overlap(indices, values, "out[1]", "out[0]")
        chk.no_overlap(indices, x, "out[1]")
    else:
        if isinstance(out, tuple):
            raise TypeError("out must be one array when return_indices=False, got a tuple")
        values, indices = chk.out_arg(out, shape, x.dtype), None
    chk.no_overlap(values, x, "out[0]" if return_indices else "out")
    return values, indices


def _place(name, values, kd, indices, out_shape, num_threads, bound, shape_args=()):
    """Run a kernel that writes values (..., h, w) at flat indices into zeroed
    planes of out_shape (scatter-add for backward, assignment for unpool).
    shape_args go to the kernel before the thread count.

    The kernel skips and counts indices outside the output plane; any such
    index is a ValueError and the result is discarded.
    """
    nt = chk.num_threads_arg(num_threads)
    n = values.shape[-2] * values.shape[-1]
    src = chk.contiguous(values, kd).reshape(-1, n)
    ix = chk.contiguous(indices, indices.dtype).reshape(-1, n)
    P = src.shape[0]
    out = np.empty((P, out_shape[-2] * out_shape[-1]), dtype=kd)
    run = kernel(name, kd, ix.dtype)
    bad = run(src, ix, out, *shape_args, threads_for(nt, out.size + 2 * src.size, P))
    if bad:
        raise ValueError(f"indices: {bad} entries lie outside {bound} = [0, {out.shape[1]})")
    out = out.reshape(out_shape)
    return out if kd == values.dtype else out.astype(values.dtype)


def max_pool2d_backward(grad_output, indices, input_shape, *, num_threads=None):
    """Gradient of :func:`max_pool2d` with respect to its input.

    Every output gradient is added to the input position its index names,
    so overlapping windows that share a maximum accumulate. Each plane is
    summed by one thread in row-major order: results are deterministic.

    Parameters
    ----------
    grad_output : ndarray, shape (N, C, OH, OW) or (C, OH, OW)
    indices : ndarray of int32/int64, same shape
        As returned by ``max_pool2d(..., return_indices=True)``.
    input_shape : tuple of int
        Shape of the pooled input, ``(N, C, H, W)`` or ``(C, H, W)``.
    num_threads : int or None, keyword-only

    Returns
    -------
    grad_input : ndarray of input_shape, dtype of grad_output

    Raises
    ------
    ValueError
        If shapes disagree, input_shape cannot have produced grad_output, or
        an index lies outside ``[0, H*W)`` (nothing is written then).
    """
    grad_output, kd, indices, shape = _backward_args(grad_output, indices, input_shape)
    return _backward(grad_output, kd, indices, shape, num_threads)


def _backward_args(grad_output, indices, input_shape):
    """max_pool2d_backward's checks: (grad_output, kernel dtype, indices,
    input_shape as a tuple)."""
    grad_output, kd = chk.array(grad_output, "grad_output", (3, 4))
    indices = chk.index_array(indices)
    chk.same_shape(indices.shape, grad_output.shape, "indices", "grad_output")
    shape = chk.shape_arg(input_shape, "input_shape", grad_output.ndim)
    chk.pool_backward_shapes(grad_output.shape, shape)
    return grad_output, kd, indices, shape


def _backward(grad_output, kd, indices, input_shape, num_threads):
    """max_pool2d_backward's kernel call, after the checks. The kernel takes
    OW and W to recognise the 2x2/stride-2 case."""
    return _place("max_pool2d_backward", grad_output, kd, indices, input_shape,
                  num_threads, "[0, H*W)", (grad_output.shape[-1], input_shape[-1]))


def _backward_from_forward(grad_output, indices: np.ndarray, input_shape: tuple, num_threads):
    """max_pool2d_backward for a MaxPool2d layer: indices and input_shape are
    those its own forward produced and kept (checked then), so only
    grad_output is checked here, which matters at batch size one."""
    grad_output, kd = chk.array(grad_output, "grad_output", (3, 4))
    chk.same_shape(indices.shape, grad_output.shape, "indices", "grad_output")
    return _backward(grad_output, kd, indices, input_shape, num_threads)


def max_unpool2d(x, indices, kernel_size, stride=None, padding=0, output_size=None, *, num_threads=None):
    """Partial inverse of :func:`max_pool2d`: place values at their indices.

    Positions no index names are zero. When an index repeats within a
    plane, the value that comes last in row-major order of ``x`` wins
    (deterministic, as numpy's ``a.flat[idx] = v`` does).

    Parameters
    ----------
    x : ndarray, shape (N, C, H, W) or (C, H, W)
    indices : ndarray of int32/int64, same shape
        Flat offsets into each output plane.
    kernel_size, stride, padding : int or (int, int)
        Those of the pooling being inverted; they size the output as
        ``torch.nn.MaxUnpool2d`` does: ``(H - 1) * stride - 2 * padding + kernel_size``.
    output_size : tuple or None
        ``(..., OH, OW)`` to pick a size within ``stride - 1`` above the default.
    num_threads : int or None, keyword-only

    Returns
    -------
    out : ndarray, shape (N, C, OH, OW) or (C, OH, OW), dtype of x

    Raises
    ------
    ValueError
        If an index lies outside ``[0, OH*OW)`` (nothing is written), or
        sizes are inconsistent.
    """
    x, kd = chk.array(x, "x", (3, 4))
    indices = chk.index_array(indices)
    chk.same_shape(indices.shape, x.shape, "indices", "x")
    H, W = x.shape[-2:]
    if isinstance(output_size, list):
        output_size = tuple(output_size)
    OH, OW = geo.unpool_geometry(H, W, kernel_size, stride, padding, output_size)
    return _place("max_unpool2d", x, kd, indices, x.shape[:-2] + (OH, OW),
                  num_threads, "[0, OH*OW)")


def max_unpool2d_backward(grad_output, indices, x_shape, *, num_threads=None):
    """Gradient of :func:`max_unpool2d` with respect to its ``x``.

    Parameters
    ----------
    grad_output : ndarray, shape of the unpooled output, (N, C, OH, OW) or (C, OH, OW)
    indices : ndarray of int, shape x_shape
        The indices given to the forward call.
    x_shape : tuple of int
        The shape of the forward call's x.

    Returns
    -------
    grad_x : ndarray of x_shape
        Each entry receives the gradient at the position it was written to,
        or zero if a later entry with the same index overwrote it.
    """
    grad_output, kd = chk.array(grad_output, "grad_output", (3, 4))
    indices = chk.index_array(indices)
    x_shape = chk.shape_arg(x_shape, "x_shape", grad_output.ndim)
    chk.unpool_backward_shapes(grad_output.shape, indices.shape, x_shape)
    OH, OW = grad_output.shape[-2:]
    H, W = x_shape[-2:]
    go = chk.contiguous(grad_output, kd).reshape(-1, OH * OW)
    ix = chk.contiguous(indices, indices.dtype).reshape(-1, H * W)
    chk.unpool_indices_in_range(ix, OH, OW)
    gx = np.empty(ix.shape, dtype=kd)
    nt = threads_for(chk.num_threads_arg(num_threads), go.size + 2 * gx.size, gx.shape[0])
    kernel("max_unpool2d_backward", kd, ix.dtype)(go, ix, gx, nt)
    gx = gx.reshape(x_shape)
    return gx if kd == grad_output.dtype else gx.astype(grad_output.dtype)
