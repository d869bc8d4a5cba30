"""Standard 2-D convolution (NCHW): the functional API.

The semantics of ``torch.nn.functional.conv2d`` with ``groups=1``: ``x`` is
``(N, C, H, W)`` or unbatched ``(C, H, W)``, ``weight`` is
``(O, C, kh, kw)``, ``bias`` ``(O,)`` is added to every output element.
The kernels (``_conv.pxi``) convolve one zero-padded image at a time with
register-blocked tiles and no im2col buffer.
"""
from __future__ import annotations

import numpy as np

from . import _checks as chk
from ._backend import kernel, threads_for

__all__ = ["conv2d", "conv2d_backward"]

# Longest chunk of an image's output positions one work item computes: its
# slice of the padded image (C rows of about this length) stays in L2.
_CHUNK_MAX = 768
# Chunks are whole multiples of every build's E block (3 vectors of 2 to 16
# values), so that only an image's last chunk has a partial block.
_CHUNK_STEP = 48


def _chunk(L: int, N: int, threads: int) -> int:
    """Chunk length of an image's L output positions: at most _CHUNK_MAX,
    and enough chunks that every thread gets work."""
    G = max(-(-L // _CHUNK_MAX), -(-threads // N))
    ce = -(-L // G)
    return -(-ce // _CHUNK_STEP) * _CHUNK_STEP


def _plan(x, weight, stride, padding, dilation, xname="x"):
    """Checked (x as 4-D, batched?, weight, geometry)."""
    x, _ = chk.array(x, xname, (3, 4), floating_only=True)
    weight, _ = chk.array(weight, "weight", (4,), floating_only=True)
    chk.same_dtype("weight", weight, xname, x)
    batched = x.ndim == 4
    x4 = x if batched else x[None]
    C, H, W = x4.shape[1:]
    O, Cw, kh, kw = weight.shape
    if Cw != C:
        raise ValueError(f"weight has {Cw} input channels but {xname} has {C} (weight shape {weight.shape})")
    geom = chk.conv_geometry(H, W, kh, kw, chk.hashable(stride), chk.hashable(padding),
                              chk.hashable(dilation))
    return x4, batched, weight, geom


_NO_BIAS = {np.dtype(t): np.empty(0, t) for t in (np.float32, np.float64)}


def _bias(bias, O: int, dtype: np.dtype) -> np.ndarray:
    if bias is None:
        return _NO_BIAS[dtype]
    b, _ = chk.array(bias, "bias", (1,), floating_only=True)
    if b.dtype != dtype:
        raise TypeError(f"bias dtype {b.dtype} must match x dtype {dtype}")
    if b.shape != (O,):
        raise ValueError(f"bias must have shape ({O},) for {O} output channels, got {b.shape}")
    return chk.contiguous(b, dtype)


def _threads(nt: int, macs: int, touched: int, items: int) -> int:
    # A multiply-add costs far less than a memory access: count 8 as one
    # element of work, so that batch-1 calls of a small network stay serial.
    return threads_for(nt, macs // 8 + touched, items)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, *, out=None, num_threads=None):
    """2-D convolution, as ``torch.nn.functional.conv2d`` with ``groups=1``.

    Parameters
    ----------
    x : ndarray, shape (N, C, H, W) or (C, H, W)
        float32 or float64; any strides.
    weight : ndarray, shape (O, C, kh, kw), same dtype as x
    bias : ndarray, shape (O,), same dtype, or None
        Added to every output element of its channel.
    stride, dilation : int or (int, int)
    padding : int, (int, int), 'valid' or 'same'
        Zero padding on both sides; 'same' (stride 1 only) pads so that the
        output has the input's size, the odd one out on the bottom/right.
    out : ndarray, optional, keyword-only
        C-contiguous array of the output's shape and dtype to write into
        (numpy's meaning: it is filled and returned), for loops that reuse
        their buffers.
    num_threads : int or None, keyword-only
        None follows OpenMP's default; small calls run on one thread.

    Returns
    -------
    out : C-contiguous ndarray, shape (N, O, OH, OW) or (O, OH, OW), dtype of x
        ``OH = (H + 2*ph - dh*(kh-1) - 1) // sh + 1``, likewise OW.

    Raises
    ------
    TypeError, ValueError
        For a wrong rank or dtype, mixed dtypes, a channel or bias mismatch,
        a kernel larger than the padded input, or bad parameters, naming
        the parameter, before any kernel runs.
    """
    x4, batched, weight, geom = _plan(x, weight, stride, padding, dilation)
    sh, sw, dh, dw, ph0, ph1, pw0, pw1, OH, OW = geom
    N, C, H, W = x4.shape
    O, _, kh, kw = weight.shape
    dt = x4.dtype
    nt = chk.num_threads_arg(num_threads)
    b = _bias(bias, O, dt)
    shape = (N, O, OH, OW)
    if out is None:
        res = np.empty(shape, dtype=dt)
    else:
        res = chk.out_arg(out, shape if batched else shape[1:], dt).reshape(shape)
        if np.may_share_memory(res, x4):
            raise ValueError("out must not overlap x")
    Hp, Wp = H + ph0 + ph1, W + pw0 + pw1
    L = (OH - 1) * (-(-Wp // sw)) + OW
    threads = _threads(nt, N * O * OH * OW * C * kh * kw, x4.size + res.size, N * (L // _CHUNK_STEP + 1))
    kernel("conv2d_forward", dt)(x4, weight, False, b, res, 1, 1, ph0, pw0, Hp, Wp, sh, sw, dh, dw,
                                 _chunk(L, N, threads), threads)
    if out is not None:
        return out
    return res if batched else res[0]


def conv2d_backward(grad_output, x, weight, stride=1, padding=0, dilation=1, *,
                    needs_input_grad=True, needs_weight_grad=True, num_threads=None):
    """Gradients of :func:`conv2d`.

    Parameters
    ----------
    grad_output : ndarray, shape (N, O, OH, OW) or (O, OH, OW)
    x, weight, stride, padding, dilation
        As given to the forward call.
    needs_input_grad, needs_weight_grad : bool, keyword-only
        Skip a gradient that is not needed (it is returned as None).
    num_threads : int or None, keyword-only

    Returns
    -------
    grad_x : ndarray like x (C-contiguous), or None
    grad_weight : ndarray like weight, or None
        Summed per thread, the partial sums added in thread order: the same
        run to run for a given thread count.
    grad_bias : ndarray, shape (O,)
        ``grad_output.sum(axis=(0, 2, 3))``.
    """
    x4, batched, weight, geom = _plan(x, weight, stride, padding, dilation)
    sh, sw, dh, dw, ph0, ph1, pw0, pw1, OH, OW = geom
    N, C, H, W = x4.shape
    O, _, kh, kw = weight.shape
    dt = x4.dtype
    g, _ = chk.array(grad_output, "grad_output", (3, 4), floating_only=True)
    chk.same_dtype("grad_output", g, "x", x4)
    want = (N, O, OH, OW) if batched else (O, OH, OW)
    if g.shape != want:
        raise ValueError(f"grad_output must have shape {want} for this x and weight, got {g.shape}")
    nt = chk.num_threads_arg(num_threads)
    g4 = g if batched else g[None]
    grad_bias = g4.sum(axis=(0, 2, 3))
    grad_x = grad_w = None
    K = C * kh * kw
    macs = N * O * OH * OW * K
    if needs_input_grad:
        # The forward kernel on grad_output upsampled by the stride and padded
        # by the kernel's reach, with the kernel flipped and transposed.
        gx = np.empty((N, C, H, W), dtype=dt)
        rh, rw = dh * (kh - 1), dw * (kw - 1)
        L = (H - 1) * (W + rw) + W
        threads = _threads(nt, macs, g4.size + gx.size, N * (L // _CHUNK_STEP + 1))
        kernel("conv2d_forward", dt)(g4, weight, True, _NO_BIAS[dt], gx, sh, sw, rh - ph0, rw - pw0,
                                     H + rh, W + rw, 1, 1, dh, dw, _chunk(L, N, threads), threads)
        grad_x = gx if batched else gx[0]
    if needs_weight_grad:
        gc = chk.contiguous(g4, dt)
        ob, tb = kernel("dots_block")()
        Hp, Wp = H + ph0 + ph1, W + pw0 + pw1
        L = (OH - 1) * (-(-Wp // sw)) + OW
        threads = _threads(nt, macs, g4.size + x4.size, N * (L // _CHUNK_STEP + 1))
        partial = np.zeros((threads, -(-O // ob) * ob, -(-K // tb) * tb), dtype=dt)
        kernel("conv2d_weight_grad", dt)(gc, x4, partial, ph0, pw0, Hp, Wp, kh, kw, sh, sw, dh, dw,
                                         _chunk(L, N, threads))
        gw = partial[0]
        for t in range(1, threads):  # in thread order: deterministic
            gw = gw + partial[t]
        grad_w = np.ascontiguousarray(gw[:O, :K]).reshape(weight.shape)
    return grad_x, grad_w, grad_bias
