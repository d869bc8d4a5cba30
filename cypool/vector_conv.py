"""Vector-pixel convolution: the functional API.

Images whose every pixel is a vector of E components, ``(C, H, W, E)`` or
batched ``(N, C, H, W, E)`` (zonotopes in neural-network verification,
component 0 the centre and 1..E-1 the error-term generators). A scalar weight
multiplies a whole pixel vector and vectors add elementwise; the bias is
added once, to component 0 of every output pixel.
"""
from __future__ import annotations

import numpy as np

from . import _checks as chk
from . import _conv_engine as engine
from ._backend import kernel
from ._select import VectorAlgo

__all__ = ["vector_conv2d", "vector_conv2d_backward"]


def vector_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, *, out=None,
                  num_threads=None):
    """2-D convolution over images whose pixels are vectors.

    Parameters
    ----------
    x : ndarray, shape (C, H, W, E) or (N, C, H, W, E)
        float32 or float64. E is the pixel-vector length (E = 1 is an
        ordinary image).
    weight : ndarray, shape (O, C, kh, kw), same dtype
        A scalar weight multiplies a whole pixel vector.
    bias : ndarray, shape (O,), or None
        Added once, to component 0 of every output pixel (the zonotope
        centre). The reference code people start from adds it once per
        input channel, contradicting its own rule; cypool follows the rule.
    stride, padding, dilation : int or (int, int)
        As in ``torch.nn.Conv2d``; padding is zeros in every component.
    out : ndarray, optional, keyword-only
        C-contiguous array of the output's shape and dtype to write into
        (numpy's meaning: it is filled and returned), for loops that reuse
        their buffers; it must not overlap x, weight or bias.
    num_threads : int or None, keyword-only
        None follows OpenMP's default.

    Returns
    -------
    out : C-contiguous ndarray, shape (O, OH, OW, E) or (N, O, OH, OW, E)
    """
    if out is None:
        res = kernel("memo_forward")(engine.VECTOR_CONV2D, x, weight, bias, stride, padding,
                                     dilation, num_threads)
        if res is not None:  # a repeat of a checked small call at E = 1
            return res
    xc, weight, batched, call = engine.checked(engine.VECTOR_CONV2D, engine.vector_checks, x,
                                               weight, stride, padding, dilation)
    dt = xc.dtype
    b = chk.bias_arg(bias, weight.shape[0], dt)
    nt = chk.num_threads_arg(num_threads)
    if call.direct and out is None:  # a small call at E = 1: the direct kernels
        res = np.empty(call.out_shape, dt)
        engine.direct_forward(res, xc, weight, b, call.direct, batched)
        engine.remember(engine.VECTOR_CONV2D, x, weight, stride, padding, dilation,
                        call.out_shape, dt, call.direct, batched)
        return res
    x5 = xc if batched else xc[None]
    if out is None:
        res = np.empty(x5.shape[:1] + call.out_shape[-4:], dtype=dt)
    else:
        res = chk.out_arg(out, call.out_shape, dt)
        res = res if batched else res[None]
        for a, name in ((x5, "x"), (weight, "weight"), (b, "bias")):
            chk.no_overlap(res, a, xname=name)
    engine.vector_forward_into(res, x5, weight, b, call, nt)
    if out is not None:
        return out
    return res if batched else res[0]


def vector_conv2d_backward(grad_output, x, weight, stride=1, padding=0, dilation=1, *,
                           needs_input_grad=True, needs_weight_grad=True, grad_x_out=None,
                           num_threads=None):
    """Gradients of :func:`vector_conv2d`.

    Parameters
    ----------
    grad_output : ndarray, shape (O, OH, OW, E) or (N, O, OH, OW, E)
    x, weight, stride, padding, dilation
        As given to the forward call.
    needs_input_grad, needs_weight_grad : bool, keyword-only
        Skip a gradient that is not needed (it is returned as None).
    grad_x_out : ndarray, optional, keyword-only
        As for :func:`cypool.conv2d_backward`: a C-contiguous array of x's
        shape and dtype to write grad_x into (and return), for loops that
        reuse their buffers. Only with needs_input_grad.
    num_threads : int or None, keyword-only

    Returns
    -------
    grad_x : ndarray like x, or None
    grad_weight : ndarray like weight, or None
    grad_bias : ndarray of shape (O,)
        The sum of ``grad_output[..., 0]`` over the batch and positions.
    """
    if grad_x_out is None:
        grads = kernel("memo_backward")(engine.VECTOR_CONV2D, grad_output, x, weight, stride,
                                        padding, dilation, needs_input_grad, needs_weight_grad,
                                        num_threads)
        if grads is not None:  # a repeat of a checked small call at E = 1
            return grads
    return _backward(grad_output, x, weight, stride, padding, dilation, needs_input_grad,
                    needs_weight_grad, num_threads, grad_x_out=grad_x_out)


def _backward(grad_output, x, weight, stride, padding, dilation, needs_input_grad, needs_weight_grad,
             num_threads, algo=None, grad_x_out=None):
    """vector_conv2d_backward after the C memo; algo, a VectorAlgo, chooses
    the kernels (None: the call's; see engine.vector_backward)."""
    xc, weight, batched, call = engine.checked(engine.VECTOR_CONV2D, engine.vector_checks, x,
                                               weight, stride, padding, dilation)
    dt = xc.dtype
    g = chk.grad_output_arg(grad_output, dt, call.out_shape)
    nt = chk.num_threads_arg(num_threads)
    gx = None
    if grad_x_out is not None:
        gx = engine.checked_grad_x_out(grad_x_out, g, xc, weight, needs_input_grad,
                                       needs_weight_grad)
    if call.direct and algo != VectorAlgo.TILES:  # a small call at E = 1: the direct kernels
        if gx is None:
            engine.remember(engine.VECTOR_CONV2D, x, weight, stride, padding, dilation,
                            call.out_shape, dt, call.direct, batched)
        grad_x, grad_w, grad_bias = engine.grads_like(xc, weight, needs_input_grad and gx is None,
                                                      needs_weight_grad)
        grad_x = grad_x if gx is None else gx
        engine.direct_backward(g, xc, weight, grad_x, grad_w, grad_bias, call.direct, batched)
        return grad_x, grad_w, grad_bias
    grad_x, grad_w, grad_bias = engine.vector_backward(g, xc, weight, batched, call,
                                                       needs_input_grad, needs_weight_grad, nt,
                                                       algo, gx)
    return (grad_x if gx is None else gx), grad_w, grad_bias
