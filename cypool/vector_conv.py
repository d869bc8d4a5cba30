"""Vector-pixel convolution: the functional API.

Images whose every pixel is a vector of E components, ``(C, H, W, E)`` or
batched ``(N, C, H, W, E)`` (zonotopes in neural-network verification,
component 0 the centre and 1..E-1 the error-term generators). A scalar weight
multiplies a whole pixel vector and vectors add elementwise; the bias is
added once, to component 0 of every output pixel.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _checks as chk
from . import conv
from ._backend import kernel, padded_columns, parts_for, team_for, threads_for, work

__all__ = ["vector_conv2d", "vector_conv2d_backward"]


# Bytes of tap vectors to keep in L2 while neighbouring pixels reuse them.
_L2_BUDGET = 512 * 1024


def _e_chunk(E: int, rows: int, row_vectors: int, itemsize: int) -> int:
    """Length of the E chunks swept over all pixels: the vectors that `rows`
    consecutive pixel rows read (row_vectors each) fit in _L2_BUDGET; a
    multiple of 48 (of every variant's E block: 3 vectors of 2 to 8
    values), whole E when it fits anyway."""
    per = max(1, rows * row_vectors * itemsize)
    ec = max(48, (_L2_BUDGET // per) // 48 * 48)
    return E if ec >= E else ec


# Calls that passed the checks, and what the checks gave (chk.cached_conv_checks).
_checked: dict = {}
# This module's calls in the kernels' memo of checked calls that take the
# direct kernels (_conv_memo.pxi): a repeat runs without the Python checks.
_MEMO = 1


class _Call(NamedTuple):
    """What the checks of a call give, kept for the calls that repeat it."""
    geom: tuple        # (kh, kw, sh, sw, ph, pw, dh, dw)
    out_hw: tuple      # (OH, OW)
    out_shape: tuple   # the output's shape, as x is batched or not
    plan: object       # at small E, conv2d's plan of the component images; else None
    direct: tuple      # at E = 1, a call small enough for conv2d's direct kernels
                       # (which take (N, C, H, W, 1) arrays as they are): conv.plan's
                       # arguments for them; else ()


def _checks_and_plan(x, weight, stride, padding, dilation):
    """chk.vector_conv_args, and at small E the plan of conv2d's kernels, so
    that a repeated call (a training loop) makes neither again."""
    x5, weight, batched, (geom, out_hw) = chk.vector_conv_args(x, weight, stride, padding, dilation)
    N, E, (sh, sw) = x5.shape[0], x5.shape[4], geom[2:4]
    taps = weight.shape[1] * geom[0] * geom[1]
    by_conv = forward_by_conv(E, sh, sw, taps) or backward_by_conv(E, sh, sw)
    plan = _small_e_plan(x5, weight, geom) if by_conv else None
    direct = plan.direct if plan is not None and E == 1 else ()
    out_shape = (N, weight.shape[0], *out_hw, E)
    return x5, weight, batched, _Call(geom, out_hw, out_shape if batched else out_shape[1:], plan,
                                      direct)


# At small E the convolution (forward, or backward) can run as a standard
# NCHW convolution of the E component images (conv2d's kernels, through
# strided views: no copy of x or of the output), which vectorises along
# output positions, where the E-vectorised tiles leave most of a vector
# empty. Which way is faster depends on E and the stride (bench/README.md
# and docs/performance.md have the measurements behind these rules).

def forward_by_conv(E: int, sh: int, sw: int, taps: int) -> bool:
    """Whether the forward takes conv2d's kernels: below E = 16, except a
    strided convolution at E = 8 with few taps (C*kh*kw) an output: there a
    component image's set-up (its phase split, its output written E
    values apart) outweighs its arithmetic, and E = 8 fills an AVX2
    vector tile."""
    return E < 16 and (E % 8 != 0 or sh == sw == 1 or taps >= _FEW_TAPS)


# Below this many taps an output, a strided forward at E = 8 takes the tiles.
_FEW_TAPS = 64


def backward_by_conv(E: int, sh: int, sw: int) -> bool:
    """Whether the backward takes conv2d's kernels: up to E = 20, and up
    to E = 32 at stride 1."""
    return E <= 20 or (E <= 32 and sh == sw == 1)


def _component_images(a5: np.ndarray):
    """The NCHW batches conv2d's kernels run on, as views of a
    (N, C, H, W, E) array: at E = 1 the whole batch, (N, C, H, W), in one
    call; otherwise image n as E images (E, C, H, W), one call an image."""
    if a5.shape[4] == 1:
        return (a5[..., 0],)
    return [a5[n].transpose(3, 0, 1, 2) for n in range(a5.shape[0])]


def _small_e_plan(x5, weight, geom):
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    N, C, H, W, E = x5.shape
    return conv.plan((N if E == 1 else E, C, H, W), weight.shape, (sh, sw), (ph, pw), (dh, dw))


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
        res = kernel("memo_forward")(_MEMO, x, weight, bias, stride, padding, dilation,
                                     num_threads)
        if res is not None:  # a repeat of a checked small call at E = 1
            return res
    xc, weight, batched, call = chk.cached_conv_checks(_checked, _checks_and_plan, x, weight,
                                                       stride, padding, dilation)
    dt = xc.dtype
    b = chk.bias_arg(bias, weight.shape[0], dt)
    nt = chk.num_threads_arg(num_threads)
    if call.direct and out is None:  # a small call at E = 1: the direct kernels
        res = np.empty(call.out_shape, dt)
        conv.direct_forward(res, xc, weight, b, call.direct, batched)
        kernel("memo_remember")(_MEMO, x, weight, stride, padding, dilation, call.out_shape, dt,
                                call.direct, batched)
        return res
    geom, (OH, OW), plan, O = call.geom, call.out_hw, call.plan, weight.shape[0]
    x5 = xc if batched else xc[None]
    N, E = x5.shape[0], x5.shape[4]
    if out is None:
        res = np.empty((N, O, OH, OW, E), dtype=dt)
    else:
        res = chk.out_arg(out, call.out_shape, dt)
        res = res if batched else res[None]
        for a, name in ((x5, "x"), (weight, "weight"), (b, "bias")):
            chk.no_overlap(res, a, xname=name)
    if forward_by_conv(E, *geom[2:4], weight.size // O):
        # conv2d's bias goes to every component image: at E = 1, that is
        # component 0; otherwise it is added to component 0 afterwards.
        kb = b if E == 1 else chk.no_bias(dt)
        for ri, xi in zip(_component_images(res), _component_images(x5)):
            conv.forward_into(ri, xi, weight, kb, plan, nt)
        if bias is not None and E > 1:
            res[..., 0] += b[:, None, None]
    else:
        tiles_forward(x5, weight, b, res, geom, nt)
    if out is not None:
        return out
    return res if batched else res[0]


def tiles_forward(x5, weight, b, out, geom, nt):
    """out (N, O, OH, OW, E), its last axis contiguous (the rest may be a
    view's) = the convolution of x5 by the E-vectorised tiles."""
    N, C, H, W, E = x5.shape
    O, _, kh, kw = weight.shape
    dt = x5.dtype
    xc = chk.contiguous(x5, dt)
    wt = padded_columns(weight.reshape(O, C * kh * kw).T)  # (K, O padded): one row per tap
    # Multiply-adds count too (_backend.work): a strided call over 16 to 32
    # components can touch few elements and still be worth a team.
    macs = out.size * C * kh * kw
    # The kernel splits the pixels among threads, or E where there are
    # fewer pixels than threads (a dense layer as a 1 x 1 convolution).
    items = max(N * out.shape[2] * out.shape[3], -(-E // 48))
    threads = threads_for(nt, work(macs, xc.size + out.size), items)
    ec = _e_chunk(E, kh, C * W, dt.itemsize)  # a row of outputs reads kh input rows of C*W vectors
    b = padded_columns(b[None, :])[0] if b.size else b
    kernel("vector_conv2d_forward", dt)(xc, wt, b, out, *geom, ec, threads)


def vector_conv2d_backward(grad_output, x, weight, stride=1, padding=0, dilation=1, *,
                           needs_input_grad=True, needs_weight_grad=True, num_threads=None):
    """Gradients of :func:`vector_conv2d`.

    Parameters
    ----------
    grad_output : ndarray, shape (O, OH, OW, E) or (N, O, OH, OW, E)
    x, weight, stride, padding, dilation
        As given to the forward call.
    needs_input_grad, needs_weight_grad : bool, keyword-only
        Skip a gradient that is not needed (it is returned as None).
    num_threads : int or None, keyword-only

    Returns
    -------
    grad_x : ndarray like x, or None
    grad_weight : ndarray like weight, or None
    grad_bias : ndarray of shape (O,)
        The sum of ``grad_output[..., 0]`` over the batch and positions.
    """
    grads = kernel("memo_backward")(_MEMO, grad_output, x, weight, stride, padding, dilation,
                                    needs_input_grad, needs_weight_grad, num_threads)
    if grads is not None:  # a repeat of a checked small call at E = 1
        return grads
    return backward(grad_output, x, weight, stride, padding, dilation, needs_input_grad,
                    needs_weight_grad, num_threads)


def backward(grad_output, x, weight, stride, padding, dilation, needs_input_grad, needs_weight_grad,
             num_threads, small_e=None):
    """vector_conv2d_backward; small_e chooses the kernels (None: by
    backward_by_conv, as the public function does). cypool.dask passes the
    choice of the whole array to each of its E chunks, so that the input
    gradient of every chunk is the one the whole array gets, bit for bit."""
    xc, weight, batched, call = chk.cached_conv_checks(_checked, _checks_and_plan, x, weight,
                                                       stride, padding, dilation)
    dt = xc.dtype
    g = chk.grad_output_arg(grad_output, dt, call.out_shape)
    nt = chk.num_threads_arg(num_threads)
    if call.direct and small_e is not False:  # a small call at E = 1: the direct kernels
        kernel("memo_remember")(_MEMO, x, weight, stride, padding, dilation, call.out_shape, dt,
                                call.direct, batched)
        return conv.direct_backward(g, xc, weight, call.direct, batched, needs_input_grad,
                                    needs_weight_grad)
    geom, (OH, OW), plan = call.geom, call.out_hw, call.plan
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    N, C, H, W, E = xc.shape if batched else (1, *xc.shape)
    O = weight.shape[0]
    x5 = xc if batched else xc[None]
    g5 = chk.contiguous(g if batched else g[None], dt)
    grad_x = grad_w = None
    if small_e is None:
        small_e = backward_by_conv(E, sh, sw)
    if small_e:
        if plan is None:
            plan = _small_e_plan(x5, weight, geom)
        return _small_e_backward(g5, x5, weight, plan, batched,
                                 needs_input_grad, needs_weight_grad, nt)
    grad_bias = g5[..., 0].sum(axis=(0, 2, 3))
    touched = g5.size + x5.size
    if needs_input_grad:
        w2 = padded_columns(weight.transpose(2, 3, 0, 1).reshape(kh * kw * O, C))
        gx = np.empty((N, C, H, W, E), dtype=dt)
        threads = threads_for(nt, touched, N * H * W)
        ec = _e_chunk(E, -(-kh // sh), O * OW, dt.itemsize)  # input rows reach ceil(kh/sh) output rows
        kernel("vector_conv2d_input_grad", dt)(g5, w2, gx, sh, sw, ph, pw, dh, dw, kh, kw, ec, threads)
        grad_x = gx if batched else gx[0]
    if needs_weight_grad:
        x5c = chk.contiguous(x5, dt)
        # Summed in parts, one a thread outside a crowded spell: the parts,
        # not the team, fix the result (_backend.parts_for).
        parts = parts_for(nt, touched, N * OH * OW)
        partial = np.zeros((parts, O, C * kh * kw), dtype=dt)
        kernel("vector_conv2d_weight_grad", dt)(g5, x5c, partial, *geom, team_for(parts))
        grad_w = partial[0]
        for s in range(1, parts):  # in part order: deterministic
            grad_w = grad_w + partial[s]
        grad_w = grad_w.reshape(weight.shape)
    return grad_x, grad_w, grad_bias


def _small_e_backward(g5, x5, weight, plan, batched, needs_input_grad, needs_weight_grad, nt):
    """(grad_x, grad_w, grad_bias) of a small-E convolution, by conv2d's
    kernels on the component images (_component_images), the weight
    gradients of successive calls added in image order. At E = 1, conv2d's
    bias gradient (the sum over the one component image) is grad_bias."""
    E = x5.shape[4]
    grad_x = grad_w = grad_bias = None
    if needs_input_grad:
        gx = np.empty(x5.shape, dtype=x5.dtype)
        for gxi, gi in zip(_component_images(gx), _component_images(g5)):
            conv.input_grad_into(gxi, gi, weight, plan, nt)
        grad_x = gx if batched else gx[0]
    if needs_weight_grad:
        O = weight.shape[0]
        gb = np.empty(O, dtype=x5.dtype)  # conv2d's: summed over all E components
        for gi, xi in zip(_component_images(g5), _component_images(x5)):
            gw = np.empty((O, weight[0].size), dtype=x5.dtype)
            conv.weight_grad_into(gw, gb, chk.contiguous(gi, x5.dtype), xi, weight, plan, nt)
            grad_w = gw if grad_w is None else grad_w + gw
        if E == 1:
            grad_bias = gb
        grad_w = grad_w.reshape(weight.shape)
    if grad_bias is None:
        grad_bias = g5[..., 0].sum(axis=(0, 2, 3))
    return grad_x, grad_w, grad_bias
