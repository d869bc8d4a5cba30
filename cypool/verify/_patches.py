"""Back-substitution of single neurons of a convolution's output, in patches.

A neuron ``(o, y, x)`` of a convolution depends on a window of its input,
and through the layers below on a window that grows by each kernel: its
coefficients are nonzero only there. So each row is carried as a small
tensor ``(C, h, w)`` and the window's origin in the current layer's
frame, instead of a whole image: a ReLU's or an elementwise map's arrays
are gathered over each window (zero outside the layer, where a
convolution's padding stands), and a convolution's transpose runs on the
patches. It gives the bounds _crown._backsub gives, at the cost of the
window rather than of the image.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..conv import conv2d_backward
from ._net import Conv, Elementwise, ReLU

__all__ = ["patchable", "backsub_rows"]


def patchable(ops) -> bool:
    """Whether the neurons of ops[-1]'s output can be bounded in patches:
    a convolution, with only convolutions, ReLUs and elementwise maps of
    images below it."""
    return (bool(ops) and isinstance(ops[-1], Conv)
            and all(isinstance(op, (Conv, ReLU, Elementwise)) and len(op.out_shape) == 3
                    for op in ops))


def _gather(arr, oy, ox, h, w):
    """arr (C, H, W) over each window (h, w) at origins (oy, ox): (K, C, h,
    w), zero outside arr."""
    C, H, W = arr.shape
    pt, pl = max(0, -int(oy.min())), max(0, -int(ox.min()))
    pb, pr = max(0, int(oy.max()) + h - H), max(0, int(ox.max()) + w - W)
    if pt or pb or pl or pr:
        arr = np.pad(arr, ((0, 0), (pt, pb), (pl, pr)))
    view = sliding_window_view(arr, (h, w), axis=(1, 2))  # (C, H', W', h, w)
    # windows first: the gather then writes (K, C, h, w) in order, 4-8x
    # faster than gathering (C, K, h, w) and transposing
    return view.transpose(1, 2, 0, 3, 4)[oy + pt, ox + pl]


def _rowdot(X, Y):
    """The dot product of each row k of X and Y (K, ...): one pass, no
    temporary."""
    K = X.shape[0]
    return np.einsum("ij,ij->i", X.reshape(K, -1), Y.reshape(K, -1))


def _dilated(conv):
    """conv's weight with its dilation's zeros written in."""
    w = conv.w
    dh, dw = conv.dilation
    if dh == dw == 1:
        return w
    O, C, kh, kw = w.shape
    out = np.zeros((O, C, (kh - 1) * dh + 1, (kw - 1) * dw + 1), w.dtype)
    out[:, :, ::dh, ::dw] = w
    return out


def _origin(conv, y, x):
    """The origin, in conv's input frame, of the window of output (y, x)."""
    top = conv.sym[0] + conv.extra[0][0]
    left = conv.sym[1] + conv.extra[1][0]
    return y * conv.stride[0] - top, x * conv.stride[1] - left


def backsub_rows(ops, relax, rows, lo, hi):
    """Lower bounds of ``y_r`` and of ``-y_r`` for the flat rows r of
    ops[-1]'s output, over the box [lo, hi] (flat): two arrays of
    len(rows), as computed (no rounding charge). ops: patchable."""
    last = ops[-1]
    O, OH, OW = last.out_shape
    o, rem = np.divmod(rows, OH * OW)
    y, x = np.divmod(rem, OW)
    wd = _dilated(last)
    A = np.concatenate([wd[o], -wd[o]])  # (2K, C, kh, kw): +e_r, then -e_r
    b = last.bias[o, y, x]
    const = np.concatenate([b, -b])
    oy, ox = _origin(last, y, x)
    oy, ox = np.concatenate([oy, oy]), np.concatenate([ox, ox])
    for j in range(len(ops) - 2, -1, -1):
        op = ops[j]
        K, C, h, w = A.shape
        if isinstance(op, ReLU):
            a, s, t = (_gather(v, oy, ox, h, w) for v in relax[j])
            const += _rowdot(np.minimum(A, 0), t)
            A = A * np.where(A < 0, s, a)
        elif isinstance(op, Elementwise):
            const += _rowdot(A, _gather(op.bias, oy, ox, h, w))
            A = A * _gather(op.scale, oy, ox, h, w)
        else:  # a convolution: its output window to its input window
            inside = _gather(np.ones(op.out_shape, A.dtype), oy, ox, h, w)
            A = A * inside
            const += _rowdot(A, _gather(op.bias, oy, ox, h, w))
            wd = _dilated(op)
            sh, sw = op.stride
            Hn, Wn = (h - 1) * sh + wd.shape[2], (w - 1) * sw + wd.shape[3]
            A, _, _ = conv2d_backward(np.ascontiguousarray(A),
                                      np.broadcast_to(np.zeros((), A.dtype), (K, wd.shape[1], Hn, Wn)),
                                      wd, op.stride, 0, 1, needs_weight_grad=False)
            oy, ox = _origin(op, oy, ox)
    K, C, h, w = A.shape
    shape = ops[0].in_shape
    lo_g = _gather(lo.reshape(shape), oy, ox, h, w)
    hi_g = _gather(hi.reshape(shape), oy, ox, h, w)
    lower = const + _rowdot(np.maximum(A, 0), lo_g) + _rowdot(np.minimum(A, 0), hi_g)
    n = len(rows)
    return lower[:n], lower[n:]
