"""Back-substitution of single neurons of a convolution's output, in patches.

A neuron ``(o, y, x)`` of a convolution depends on a window of its input,
and through the layers below on a window that grows by each kernel: its
coefficients are nonzero only there. So each row is carried as a small
tensor ``(C, h, w)`` and the window's origin in the current layer's
frame, instead of a whole image: the compiled steps (_kernels/_crown.pxi)
read a ReLU's or an elementwise map's arrays over each window (zero
outside the layer, where a convolution's padding stands), and a
convolution's transpose runs on the patches. It gives the bounds
_crown._backsub gives, at the cost of the window rather than of the
image.
"""
from __future__ import annotations

import numpy as np

from .. import _conv_engine as engine
from .._backend import kernel, threads_for
from ._net import Conv, Elementwise, ReLU, kept, signed_rows

__all__ = ["patchable", "backsub_rows"]


def patchable(ops) -> bool:
    """Whether the neurons of ops[-1]'s output can be bounded in patches:
    a convolution, with only convolutions, ReLUs and elementwise maps of
    images below it."""
    return (bool(ops) and isinstance(ops[-1], Conv)
            and all(isinstance(op, (Conv, ReLU, Elementwise)) and len(op.out_shape) == 3
                    for op in ops))


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


def backsub_rows(ops, relax, rows, lo, hi, nt=0, buffers=None):
    """Lower bounds of ``y_r`` and of ``-y_r`` for the flat rows r of
    ops[-1]'s output, over the box [lo, hi] (flat), as computed (no
    rounding charge): two arrays of len(rows). ops: patchable; nt:
    threads (0: OpenMP's default); buffers: the net's Buffers, or None."""
    last = ops[-1]
    dt = last.w.dtype
    O, OH, OW = last.out_shape
    o, rem = np.divmod(rows, OH * OW)
    y, x = np.divmod(rem, OW)
    wd = _dilated(last)
    n = len(rows)
    A = signed_rows(wd, o, buffers, ("rows", id(last)))  # +e_r, then -e_r
    b = last.bias[o, y, x]
    const = np.concatenate([b, -b])
    oy, ox = _origin(last, y, x)
    oy, ox = np.concatenate([oy, oy]).astype(np.int64), np.concatenate([ox, ox]).astype(np.int64)
    # the steps below change A and const in place, zeroing the
    # coefficients that fall outside a layer (a convolution's padding)
    for j in range(len(ops) - 2, -1, -1):
        op = ops[j]
        K, C, h, w = A.shape
        th = threads_for(nt, A.size, K)
        if isinstance(op, ReLU):
            kernel("crown_relu_patches", dt)(A, oy, ox, *relax[j], const, th)
        elif isinstance(op, Elementwise):
            kernel("crown_affine_patches", dt)(A, oy, ox, np.ascontiguousarray(op.scale, dt),
                                               np.ascontiguousarray(op.bias, dt), const, th)
        else:  # a convolution: its output window to its input window
            kernel("crown_affine_patches", dt)(A, oy, ox, None, op.bias, const, th)
            wd = _dilated(op)
            sh, sw = op.stride
            Hn, Wn = (h - 1) * sh + wd.shape[2], (w - 1) * sw + wd.shape[3]
            shape = (K, wd.shape[1], Hn, Wn)
            out = kept(buffers, ("patches", id(op)), shape, dt)
            # the engine's pass with a plan made here (14 us): conv2d_backward's
            # checks took a fifth of it on oval21
            plan = engine.plan(shape, wd.shape, op.stride, (0, 0), (1, 1), dt, winograd=False)
            engine.input_grad_into(out, A, np.ascontiguousarray(wd), plan, nt)
            A = out
            oy, ox = _origin(op, oy, ox)
    shape = ops[0].in_shape
    kernel("crown_box_patches", dt)(A, oy, ox, np.ascontiguousarray(lo, dt).reshape(shape),
                                    np.ascontiguousarray(hi, dt).reshape(shape), const,
                                    threads_for(nt, A.size, A.shape[0]))
    return const[:n], const[n:]
