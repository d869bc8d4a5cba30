"""The zonotope layers: dense, ReLU, flatten, channel affine, average
pool (the vector convolution's layer, VectorConv2d, is cypool.layers')."""
from __future__ import annotations

import numpy as np

from .. import _checks as chk
from .. import _geometry as geo
from .._layer_init import dense_init
from ..layers import Layer
from ._functions import flatten, linear, relu
from ._ops import as_zonotope, relu_into

__all__ = ["VectorLinear", "VectorReLU", "VectorFlatten", "VectorChannelAffine", "VectorAvgPool2d"]


class VectorLinear(Layer):
    """Dense layer on zonotopes (see :func:`cypool.zonotope.linear`):
    ``(D, E)`` or ``(N, D, E)`` to ``(O, E)`` or ``(N, O, E)``, the bias on
    component 0 only, in cypool's threads (``num_threads``). Parameters
    and initialisation as :class:`Linear`; ``backward(g)`` fills
    ``.grad_weight`` and ``.grad_bias`` and returns the input gradient.
    """

    def __init__(self, in_features, out_features, bias=True, dtype=np.float32, rng=None, *,
                 num_threads=None):
        super().__init__()
        dense_init(self, in_features, out_features, bias, dtype, rng)
        chk.num_threads_arg(num_threads)
        self.num_threads = num_threads

    def forward(self, z, *, out=None):
        """linear(z, weight, bias) (into ``out`` if given); in training mode
        keep z for backward."""
        res = linear(z, self.weight, self.bias, out=out, num_threads=self.num_threads)
        if self.training:
            self._cache = np.asarray(z)
        return res

    def _forward_into(self, z, alloc):
        """forward(z) into alloc(shape, dtype) (zonotope.Network's buffers)."""
        z = np.asarray(z)
        if z.ndim not in (2, 3) or z.dtype != self.weight.dtype:
            return self.forward(z)  # which raises the checks' error
        return self.forward(z, out=alloc(z.shape[:-2] + (self.weight.shape[0], z.shape[-1]), z.dtype))

    def backward(self, grad_output):
        """Fill .grad_weight and .grad_bias; return the input gradient."""
        z = self._saved()
        O, D = self.weight.shape
        g = chk.same_shape_grad(grad_output, z.shape[:-2] + (O, z.shape[-1]), z.dtype)
        # d/dW sum over every component (and image) of g . (W z): g z^T
        g3, z3 = g.reshape(-1, O, g.shape[-1]), z.reshape(-1, D, z.shape[-1])
        self.grad_weight = np.einsum("noe,nde->od", g3, z3, optimize=True)
        self.grad_bias = g3[..., 0].sum(axis=0) if self.bias is not None else None
        return np.matmul(self.weight.T, g)

    def __repr__(self):
        O, D = self.weight.shape
        return f"VectorLinear({D}, {O}, bias={self.bias is not None})"


class VectorReLU(Layer):
    """The DeepZ ReLU on zonotopes (see :func:`cypool.zonotope.relu`): the
    output has one more generator per unstable neuron. A certification
    layer: it has no backward (training through the relaxation is not
    supported), and keeps nothing."""

    def __init__(self, *, num_threads=None):
        super().__init__()
        chk.num_threads_arg(num_threads)
        self.num_threads = num_threads

    def forward(self, z):
        """relu(z)."""
        return relu(z, num_threads=self.num_threads)

    def _forward_into(self, z, alloc):
        """forward(z) into alloc(shape, dtype) (zonotope.Network's buffers)."""
        return relu_into(as_zonotope(z), chk.num_threads_arg(self.num_threads), alloc)

    def __repr__(self):
        return "VectorReLU()"


class VectorFlatten(Layer):
    """``(C, H, W, E)`` to ``(C*H*W, E)`` (batched ``(N, C, H, W, E)`` to
    ``(N, C*H*W, E)``): the zonotope side of :class:`Flatten`."""

    def forward(self, z):
        """flatten(z); keeps z's shape for backward."""
        out = flatten(z)
        if self.training:
            self._cache = np.shape(z)
        return out

    def backward(self, grad_output):
        """grad_output in the input's shape."""
        shape = self._saved()
        return np.asarray(grad_output).reshape(shape)

    def __repr__(self):
        return "VectorFlatten()"


def _channel_axis(z):
    """The channel (or feature) axis of a zonotope: 0 of (C, H, W, E) and
    (D, E), 1 of batched (N, C, H, W, E) and (N, D, E)."""
    return 0 if z.ndim in (2, 4) else 1


class VectorChannelAffine(Layer):
    """``scale[c] * x + shift[c]`` per channel of an image (or per feature
    of a flat input), on zonotopes: every component scaled, the shift on
    component 0 only. An eval-mode batch norm, or an input normalisation
    ``(x - mean) / std`` (``scale = 1 / std``, ``shift = -mean / std``).
    A one-element scale or shift applies to every channel. A certification
    layer: no backward."""

    def __init__(self, scale, shift, *, dtype=np.float64):
        super().__init__()
        dt = chk.float_dtype_arg(dtype)
        self.scale, self.shift = (np.array(_finite_vector(v, name), dtype=dt)
                                  for v, name in ((scale, "scale"), (shift, "shift")))
        if self.scale.size != 1 and self.shift.size != 1 and self.scale.size != self.shift.size:
            raise ValueError(f"scale ({self.scale.size}) and shift ({self.shift.size}) must have "
                             f"one value per channel")

    @property
    def channels(self) -> int:
        """The channel count it applies to (1: any)."""
        return max(self.scale.size, self.shift.size)

    def forward(self, z):
        """The scaled and shifted zonotope (a new array)."""
        z = as_zonotope(z, ndims=(2, 3, 4, 5))
        ax = _channel_axis(z)
        C = self.channels
        if C != 1 and z.shape[ax] != C:
            raise ValueError(f"z has {z.shape[ax]} channels (axis {ax} of shape {z.shape}) but "
                             f"the layer has {C}")
        shape = (-1,) + (1,) * (z.ndim - ax - 1)
        out = z * self.scale.astype(z.dtype).reshape(shape)
        out[..., 0] += self.shift.astype(z.dtype).reshape(shape[:-1])
        return out

    def __repr__(self):
        return f"VectorChannelAffine(channels={self.channels})"


def _finite_vector(v, name):
    a = np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v)
    if a.dtype.kind not in "iuf" or a.ndim > 1 or a.size == 0:
        raise TypeError(f"{name} must be a number or a 1-D array of numbers, got {a.dtype} "
                        f"of shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite")
    return a.reshape(-1)


class VectorAvgPool2d(Layer):
    """Average pooling on zonotopes, ``(C, H, W, E)`` or ``(N, C, H, W,
    E)``: ``torch.nn.AvgPool2d`` with ``count_include_pad=True`` and
    ``ceil_mode=False`` on every component (it is linear). ``divisor``
    replaces ``kh * kw`` (torch's ``divisor_override``). A certification
    layer: no backward."""

    def __init__(self, kernel_size, stride=None, padding=0, *, divisor=None):
        super().__init__()
        kh, kw, sh, sw, ph, pw = geo.window_params(kernel_size, stride, padding)
        if not (2 * ph <= kh and 2 * pw <= kw):
            raise ValueError(f"padding must be at most half the kernel_size, got padding {padding} "
                             f"for kernel_size {kernel_size}")
        if divisor is not None and chk.as_int(divisor, "divisor") < 1:
            raise ValueError(f"divisor must be a positive integer or None, got {divisor!r}")
        self.kernel_size, self.stride, self.padding = (kh, kw), (sh, sw), (ph, pw)
        self.divisor = kh * kw if divisor is None else int(divisor)

    def forward(self, z):
        """The pooled zonotope (a new array)."""
        z = as_zonotope(z, ndims=(4, 5))
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        H, W = z.shape[-3:-1]
        OH, OW = (H + 2 * ph - kh) // sh + 1, (W + 2 * pw - kw) // sw + 1
        if OH < 1 or OW < 1:
            raise ValueError(f"z's {H}x{W} planes are smaller than the {kh}x{kw} window")
        lead = ((0, 0),) * (z.ndim - 3)
        zp = np.pad(z, lead + ((ph, ph), (pw, pw), (0, 0)))
        out = np.zeros(z.shape[:-3] + (OH, OW, z.shape[-1]), z.dtype)
        for i in range(kh):
            for j in range(kw):
                out += zp[..., i:i + sh * (OH - 1) + 1:sh, j:j + sw * (OW - 1) + 1:sw, :]
        out /= self.divisor
        return out

    def __repr__(self):
        return (f"VectorAvgPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, divisor={self.divisor})")
