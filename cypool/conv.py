"""Standard 2-D convolution (NCHW): the functional API.

The semantics of ``torch.nn.functional.conv2d`` with ``groups=1``: ``x`` is
``(N, C, H, W)`` or unbatched ``(C, H, W)``, ``weight`` is
``(O, C, kh, kw)``, ``bias`` ``(O,)`` is added to every output element.
The kernels (``_conv.pxi``) convolve one zero-padded image at a time with
register-blocked tiles and no im2col buffer.

A training loop at batch size 1 calls these 60,000 times an epoch on tiny
images, so everything that depends only on the shapes and parameters is
worked out once (``_plan``, cached) and a call does little more than check
its arrays and run the kernel.
"""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from . import _checks as chk
from ._backend import SERIAL_BELOW, kernel, parts_for, team_for, threads_for, work

__all__ = ["conv2d", "conv2d_backward"]

# Longest chunk of an image's output positions one work item computes: its
# slice of the padded image (C rows of about this length) stays in L2.
_CHUNK_MAX = 768
# Chunks are whole multiples of every build's E block (3 vectors of 2 to 16
# values), so that only an image's last chunk has a partial block.
_CHUNK_STEP = 48


class _Pass(NamedTuple):
    """One kernel pass: its geometry arguments, the length L of an image's
    virtual output, its size for the thread policy, and (for a call too
    small for a thread team) its chunk length on one thread, else 0."""
    args: tuple
    L: int
    macs: int
    touched: int
    serial_chunk: int


class _Plan(NamedTuple):
    out_shape: tuple   # (N, O, OH, OW)
    forward: _Pass     # conv2d_forward(x, w, False, ...)
    input_grad: _Pass  # conv2d_forward(grad_out, w, True, ...)
    weight_grad: _Pass  # conv2d_weight_grad(grad_out, x, ...)
    col2im: tuple      # for a strided convolution: conv2d_input_grad_col2im's geometry
    direct: tuple      # for a small stride-1 one: (top, left) of the forward and of the
                       # input gradient, and the dilation, for the direct kernels


def _key(v):
    """A parameter as an exact cache key (a plain int as it is)."""
    return v if type(v) is int else chk.hashable(v)


@lru_cache(maxsize=256)
def _plan(xshape: tuple, wshape: tuple, stride, padding, dilation, xname: str) -> _Plan:
    """Checked geometry of a convolution of x (N, C, H, W) by weight
    (O, C, kh, kw), and the arguments of its kernel passes."""
    N, C, H, W = xshape
    O, _, kh, kw = wshape
    chk.conv_channels(C, wshape, xname)
    sh, sw, dh, dw, ph0, ph1, pw0, pw1, OH, OW = chk.conv_geometry(H, W, kh, kw, stride, padding,
                                                                    dilation)
    Hp, Wp = H + ph0 + ph1, W + pw0 + pw1
    macs = N * O * OH * OW * C * kh * kw
    xsize, osize = N * C * H * W, N * O * OH * OW
    L = (OH - 1) * (-(-Wp // sw)) + OW
    forward = _pass((1, 1, ph0, pw0, Hp, Wp, sh, sw, dh, dw), L, macs, xsize + osize, N)
    # The input gradient: the forward kernel on grad_output upsampled by the
    # stride and padded by the kernel's reach, the kernel flipped.
    rh, rw = dh * (kh - 1), dw * (kw - 1)
    input_grad = _pass((sh, sw, rh - ph0, rw - pw0, H + rh, W + rw, 1, 1, dh, dw),
                       (H - 1) * (W + rw) + W, macs, xsize + osize, N)
    weight_grad = _pass((ph0, pw0, Hp, Wp, kh, kw, sh, sw, dh, dw), L, macs, xsize + osize, N)
    col2im = (ph0, pw0, sh, sw, dh, dw) if sh * sw > 1 else ()
    serial = bool(forward.serial_chunk and input_grad.serial_chunk and weight_grad.serial_chunk)
    direct = (ph0, pw0, rh - ph0, rw - pw0, dh, dw) if takes_direct(sh, sw, serial) else ()
    return _Plan((N, O, OH, OW), forward, input_grad, weight_grad, col2im, direct)


def takes_direct(sh: int, sw: int, serial: bool) -> bool:
    """Whether a convolution runs on the direct kernels (_conv_direct.h):
    stride 1, and small enough that every pass runs on the calling thread.
    One zero-padded copy of each image is their only set-up, where the
    phase kernels' (tap lists, chunks, packed weights) costs a small call
    as much as its arithmetic."""
    return serial and sh == sw == 1


# Calls that passed the checks, and their plan (chk.cached_conv_checks).
_checked: dict = {}
# This module's calls in the kernels' memo of checked calls that take the
# direct kernels (_conv_memo.pxi): a repeat runs without the Python checks.
_MEMO = 0


def _checked_plan(x, weight, stride, padding, dilation):
    """(x as given, checked; weight, batched?, plan), or from _checked."""
    return chk.cached_conv_checks(_checked, _check_plan, x, weight, stride, padding, dilation)


def _check_plan(x, weight, stride, padding, dilation):
    x4, weight, batched = _arrays(x, weight)
    plan = _plan(x4.shape, weight.shape, _key(stride), _key(padding), _key(dilation), "x")
    return x4, weight, batched, plan


def _arrays(x, weight, xname="x"):
    """x as 4-D and weight, checked; and whether x was batched."""
    x, weight = chk.conv_arrays(x, weight, (3, 4), xname)
    batched = x.ndim == 4
    return (x if batched else x[None]), weight, batched


def _chunk(L: int, N: int, threads: int) -> int:
    """Chunk length of an image's L virtual outputs: at most _CHUNK_MAX, and
    enough chunks that every thread gets work."""
    G = max(-(-L // _CHUNK_MAX), -(-threads // N))
    ce = -(-L // G)
    return -(-ce // _CHUNK_STEP) * _CHUNK_STEP


def _pass(args: tuple, L: int, macs: int, touched: int, N: int) -> _Pass:
    serial = work(macs, touched) < SERIAL_BELOW  # threads_for gives such a call one thread
    return _Pass(args, L, macs, touched, _chunk(L, N, 1) if serial else 0)


def _threads_and_chunk(p: _Pass, nt: int, N: int, count=threads_for) -> tuple[int, int]:
    """Threads for a pass (count's answer: threads_for, or parts_for), and
    its chunk length."""
    if p.serial_chunk:
        return 1, p.serial_chunk
    threads = count(nt, work(p.macs, p.touched), N * (p.L // _CHUNK_STEP + 1))
    return threads, _chunk(p.L, N, threads)


# The kernel passes, for arrays already checked against their plan (also
# used by the vector convolution, whose small-E images are run as batches
# of NCHW images through strided views).

def plan(xshape: tuple, wshape: tuple, stride, padding, dilation) -> _Plan:
    """The cached plan of a convolution of x (N, C, H, W) by weight; raises
    ValueError for bad parameters, as conv2d does."""
    return _plan(xshape, wshape, _key(stride), _key(padding), _key(dilation), "x")


# The direct kernels of a small stride-1 call (plan.direct): they take the
# arrays with any strides, as they are: batched (N, C, H, W) or one image
# (C, H, W), and vector images with E = 1 too, (N, C, H, W, 1) or (C, H, W, 1).

def direct_forward(res, x, weight, bias, d: tuple, batched: bool = True) -> None:
    kernel("conv2d_direct")(x, weight, bias, res, d[0], d[1], d[4], d[5], False, batched)


def direct_grads_into(g, x, weight, gx, gw, gb, d: tuple, batched: bool = True) -> None:
    """gx like x, gw (O, C, kh, kw) or (O, C*kh*kw) and gb (O,), C-contiguous,
    = the gradients; None for one not wanted (x too, without gw)."""
    kernel("conv2d_direct_backward")(g, x, weight, gx, gw, gb, *d, batched)


def direct_backward(g, x, weight, d: tuple, batched: bool, needs_input_grad: bool,
                    needs_weight_grad: bool):
    """conv2d_backward's (grad_x, grad_w, grad_bias) by the direct kernels."""
    dt = x.dtype
    grad_x = np.empty(x.shape, dt) if needs_input_grad else None
    grad_w = np.empty(weight.shape, dt) if needs_weight_grad else None
    grad_bias = np.empty(weight.shape[0], dt)
    kernel("conv2d_direct_backward")(g, x, weight, grad_x, grad_w, grad_bias, *d, batched)
    return grad_x, grad_w, grad_bias


def forward_into(res, x4, weight, bias, plan: _Plan, nt: int) -> None:
    """res (N, O, OH, OW), any strides = the convolution of x4 (N, C, H, W),
    any strides, plus bias (an empty array for none)."""
    if plan.direct:
        direct_forward(res, x4, weight, bias, plan.direct)
        return
    p = plan.forward
    threads, ce = _threads_and_chunk(p, nt, x4.shape[0])
    kernel("conv2d_forward", x4.dtype)(x4, weight, False, bias, res, *p.args, ce, threads)


def input_grad_into(gx, g4, weight, plan: _Plan, nt: int) -> None:
    """gx (N, C, H, W), any strides = the input gradient for grad_output g4
    (N, O, OH, OW), any strides."""
    dt, N = g4.dtype, g4.shape[0]
    p = plan.input_grad
    if plan.direct:
        direct_grads_into(g4, None, weight, gx, None, None, plan.direct)
    elif plan.col2im:
        # Strided: columns added into place, rather than a transposed
        # convolution over an output gradient with zeros between its
        # elements (3 of every 4 multiply-adds wasted at stride 2).
        threads = threads_for(nt, work(p.macs, p.touched), N)
        res = gx if gx.flags.c_contiguous else np.empty(gx.shape, dt)
        kernel("conv2d_input_grad_col2im", dt)(chk.contiguous(g4, dt), weight, res, *plan.col2im,
                                                _CHUNK_MAX, threads)
        if res is not gx:
            gx[...] = res
    else:
        threads, ce = _threads_and_chunk(p, nt, N)
        kernel("conv2d_forward", dt)(g4, weight, True, chk.no_bias(dt), gx, *p.args, ce, threads)


def weight_grad_into(gw, gb, gc, x4, weight, plan: _Plan, nt: int) -> None:
    """gw (O, C*kh*kw) and gb (O,), C-contiguous = the weight and bias
    gradients for the C-contiguous grad_output gc and x4 (any strides)."""
    if plan.direct:
        direct_grads_into(gc, x4, weight, None, gw, gb, plan.direct)
        return
    p = plan.weight_grad
    # Summed in parts, one a thread outside a crowded spell; the parts and
    # the chunks, not the team, fix the result (_backend.parts_for).
    parts, ce = _threads_and_chunk(p, nt, x4.shape[0], parts_for)
    # The chunk's im2col rows (ce x K values) stay in L2.
    ce = min(ce, max(_CHUNK_STEP, (1 << 17) // gw.shape[1] // _CHUNK_STEP * _CHUNK_STEP))
    kernel("conv2d_weight_grad", x4.dtype)(gc, x4, gw, gb, *p.args, ce, parts, team_for(parts))


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
    if out is None:
        res = kernel("memo_forward")(_MEMO, x, weight, bias, stride, padding, dilation,
                                     num_threads)
        if res is not None:  # a repeat of a checked small stride-1 call
            return res
    xc, weight, batched, plan = _checked_plan(x, weight, stride, padding, dilation)
    dt = xc.dtype
    nt = chk.num_threads_arg(num_threads)
    b = chk.bias_arg(bias, weight.shape[0], dt)
    shape = plan.out_shape if batched else plan.out_shape[1:]
    if out is None:
        res = np.empty(shape, dtype=dt)
    else:
        res = chk.out_arg(out, shape, dt)
        chk.no_overlap(res, xc)
    if plan.direct:
        direct_forward(res, xc, weight, b, plan.direct, batched)
        if out is None:
            kernel("memo_remember")(_MEMO, x, weight, stride, padding, dilation, shape, dt,
                                    plan.direct, batched)
    else:
        forward_into(res if batched else res[None], xc if batched else xc[None], weight, b, plan, nt)
    return res


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
        Summed in parts, one for each thread asked for (num_threads, or
        OpenMP's default), added in part order: the same run to run for a
        given thread count, whatever team ran the parts.
    grad_bias : ndarray, shape (O,)
        The sum of grad_output over the batch and positions.
    """
    grads = kernel("memo_backward")(_MEMO, grad_output, x, weight, stride, padding, dilation,
                                    needs_input_grad, needs_weight_grad, num_threads)
    if grads is not None:  # a repeat of a checked small stride-1 call
        return grads
    xc, weight, batched, plan = _checked_plan(x, weight, stride, padding, dilation)
    dt = xc.dtype
    shape = plan.out_shape if batched else plan.out_shape[1:]
    g = chk.grad_output_arg(grad_output, dt, shape)
    nt = chk.num_threads_arg(num_threads)
    if plan.direct:
        kernel("memo_remember")(_MEMO, x, weight, stride, padding, dilation, shape, dt,
                                plan.direct, batched)
        return direct_backward(g, xc, weight, plan.direct, batched, needs_input_grad,
                               needs_weight_grad)
    x4 = xc if batched else xc[None]
    g4 = g if batched else g[None]
    N = x4.shape[0]
    grad_x = grad_w = None
    if needs_input_grad:
        gx = np.empty(x4.shape, dtype=dt)
        input_grad_into(gx, g4, weight, plan, nt)
        grad_x = gx if batched else gx[0]
    if needs_weight_grad:
        O = weight.shape[0]
        gw = np.empty((O, weight[0].size), dtype=dt)
        grad_bias = np.empty(O, dtype=dt)
        weight_grad_into(gw, grad_bias, chk.contiguous(g4, dt), x4, weight, plan, nt)
        grad_w = gw.reshape(weight.shape)
    else:
        grad_bias = g4.sum(axis=(0, 2, 3))
    return grad_x, grad_w, grad_bias
