"""Standard 2-D convolution (NCHW): the functional API.

The semantics of ``torch.nn.functional.conv2d`` with ``groups=1``: ``x`` is
``(N, C, H, W)`` or unbatched ``(C, H, W)``, ``weight`` is
``(O, C, kh, kw)``, ``bias`` ``(O,)`` is added to every output element.
The engine (``_conv_engine``) plans each kind of call once and runs its
kernel passes (``_kernels/_conv.pxi``): register-blocked tiles over one
zero-padded image at a time, no im2col buffer; small stride-1 calls take
the direct kernels.
"""
from __future__ import annotations

import numpy as np

from . import _checks as chk
from . import _conv_engine as engine
from ._backend import kernel

__all__ = ["conv2d", "conv2d_backward"]


def _checks(x, weight, stride, padding, dilation):
    """(x as 4-D, weight, batched?, plan), checked, for engine.checked."""
    x, weight = chk.conv_arrays(x, weight, (3, 4), "x")
    batched = x.ndim == 4
    x4 = x if batched else x[None]
    return x4, weight, batched, engine.plan(x4.shape, weight.shape, stride, padding, dilation,
                                           x4.dtype)


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
        res = kernel("memo_forward")(engine.CONV2D, x, weight, bias, stride, padding, dilation,
                                     num_threads)
        if res is not None:  # a repeat of a checked small stride-1 call
            return res
    xc, weight, batched, plan = engine.checked(engine.CONV2D, _checks, x, weight, stride, padding,
                                               dilation)
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
        engine.direct_forward(res, xc, weight, b, plan.direct, batched)
        if out is None:
            engine.remember(engine.CONV2D, x, weight, stride, padding, dilation, shape, dt,
                            plan.direct, batched)
    else:
        engine.forward_into(res if batched else res[None], xc if batched else xc[None], weight,
                            b, plan, nt)
    return res


def conv2d_backward(grad_output, x, weight, stride=1, padding=0, dilation=1, *,
                    needs_input_grad=True, needs_weight_grad=True, grad_x_out=None,
                    num_threads=None):
    """Gradients of :func:`conv2d`.

    Parameters
    ----------
    grad_output : ndarray, shape (N, O, OH, OW) or (O, OH, OW)
    x, weight, stride, padding, dilation
        As given to the forward call.
    needs_input_grad, needs_weight_grad : bool, keyword-only
        Skip a gradient that is not needed (it is returned as None).
    grad_x_out : ndarray, optional, keyword-only
        C-contiguous array of x's shape and dtype to write grad_x into (and
        return), not overlapping grad_output or weight (nor x, with
        needs_weight_grad): for loops that reuse their buffers (a fresh
        array's pages fault in on its first write). Only with
        needs_input_grad.
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
    if grad_x_out is None:
        grads = kernel("memo_backward")(engine.CONV2D, grad_output, x, weight, stride, padding,
                                        dilation, needs_input_grad, needs_weight_grad, num_threads)
        if grads is not None:  # a repeat of a checked small stride-1 call
            return grads
    xc, weight, batched, plan = engine.checked(engine.CONV2D, _checks, x, weight, stride, padding,
                                               dilation)
    dt = xc.dtype
    shape = plan.out_shape if batched else plan.out_shape[1:]
    g = chk.grad_output_arg(grad_output, dt, shape)
    nt = chk.num_threads_arg(num_threads)
    if grad_x_out is not None:
        gx = engine.checked_grad_x_out(grad_x_out, g, xc, weight, needs_input_grad,
                                       needs_weight_grad)
    if plan.direct:
        if grad_x_out is None:
            engine.remember(engine.CONV2D, x, weight, stride, padding, dilation, shape, dt,
                            plan.direct, batched)
        fresh_x = needs_input_grad and grad_x_out is None
        grad_x, grad_w, grad_bias = engine.grads_like(xc, weight, fresh_x, needs_weight_grad)
        if grad_x_out is not None:
            grad_x = gx
        engine.direct_backward(g, xc, weight, grad_x, grad_w, grad_bias, plan.direct, batched)
        return grad_x, grad_w, grad_bias
    x4 = xc if batched else xc[None]
    g4 = g if batched else g[None]
    grad_x = grad_w = None
    if needs_input_grad:
        if grad_x_out is None:
            gx = np.empty(xc.shape, dtype=dt)
        engine.input_grad_into(gx if batched else gx[None], g4, weight, plan, nt)
        grad_x = gx
    if needs_weight_grad:
        O = weight.shape[0]
        gw = np.empty((O, weight[0].size), dtype=dt)
        grad_bias = np.empty(O, dtype=dt)
        engine.weight_grad_into(gw, grad_bias, chk.contiguous(g4, dt), x4, weight, plan, nt)
        grad_w = gw.reshape(weight.shape)
    else:
        grad_bias = g4.sum(axis=(0, 2, 3))
    return grad_x, grad_w, grad_bias
