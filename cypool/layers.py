"""Layer classes: thin stateful wrappers over the functional API.

Each layer has ``forward(x)`` (also ``__call__``), ``backward(grad_output)``
returning the gradient with respect to its input, and ``train()`` /
``eval()``. In training mode ``forward`` keeps what ``backward`` needs; in
eval mode it keeps nothing (and max pooling skips index tracking).
"""
from __future__ import annotations

import numpy as np

from . import _checks as chk
from . import _geometry as geo
from ._layer_init import dense_init
from .argmax import argmax2d
from .pooling import _backward_from_forward, max_pool2d, max_pool2d_backward, max_unpool2d, max_unpool2d_backward
from .conv import conv2d, conv2d_backward
from .vector_conv import vector_conv2d, vector_conv2d_backward

__all__ = ["Layer", "MaxPool2d", "MaxUnpool2d", "GlobalMaxPool2d", "Conv2d", "VectorConv2d", "Linear",
           "ReLU", "Flatten"]


class Layer:
    """Base class: training flag and the forward/backward protocol."""

    def __init__(self):
        self.training = True
        self._cache = None

    def train(self, mode: bool = True):
        """Switch training mode on (or off with ``mode=False``); returns self."""
        self.training = bool(mode)
        if not self.training:
            self._cache = None
        return self

    def eval(self):
        """Switch to evaluation mode: forward keeps nothing for backward."""
        return self.train(False)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, x):  # pragma: no cover - abstract
        raise NotImplementedError

    def _saved(self):
        if self._cache is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward needs a forward pass in training mode first"
            )
        return self._cache


class MaxPool2d(Layer):
    """Max pooling layer that remembers where each maximum came from.

    Parameters are those of :func:`cypool.max_pool2d`. In training mode
    ``forward`` keeps the argmax indices (``self.indices``) for ``backward``.
    ``num_threads`` and ``index_dtype`` pass through to the functions.
    """

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, *,
                 index_dtype=np.int64, num_threads=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.ceil_mode = ceil_mode
        self.index_dtype = index_dtype
        self.num_threads = num_threads
        # Check the parameters now, not at the first forward.
        geo.pool_params(kernel_size, stride, padding, dilation)
        chk.num_threads_arg(num_threads)

    @property
    def indices(self):
        """Argmax indices of the last training forward pass (or None)."""
        return None if self._cache is None else self._cache[0]

    def forward(self, x):
        """Pool x; in training mode keep the indices for backward."""
        args = (self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)
        if not self.training:
            return max_pool2d(x, *args, num_threads=self.num_threads)
        out, idx = max_pool2d(x, *args, return_indices=True, index_dtype=self.index_dtype,
                              num_threads=self.num_threads)
        self._cache = (idx, x.shape if isinstance(x, np.ndarray) else np.shape(x))
        return out

    def backward(self, grad_output):
        """Gradient with respect to the last forward's input."""
        idx, shape = self._saved()
        return _backward_from_forward(grad_output, idx, shape, self.num_threads)

    def __repr__(self):
        return (f"MaxPool2d(kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, ceil_mode={self.ceil_mode})")


class MaxUnpool2d(Layer):
    """Inverse of :class:`MaxPool2d`: ``forward(x, indices, output_size=None)``.

    ``backward(grad_output)`` returns the gradient with respect to ``x``:
    each entry receives the gradient at the position it was written to, or
    zero if a later entry with the same index overwrote it.
    """

    def __init__(self, kernel_size, stride=None, padding=0, *, num_threads=None):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.num_threads = num_threads
        geo.window_params(kernel_size, stride, padding)
        chk.num_threads_arg(num_threads)

    def forward(self, x, indices, output_size=None):
        """Unpool x to the positions in indices."""
        out = max_unpool2d(x, indices, self.kernel_size, self.stride, self.padding, output_size,
                           num_threads=self.num_threads)
        if self.training:
            self._cache = (chk.index_array(indices), np.shape(x), out.shape)
        return out

    def backward(self, grad_output):
        """Gradient with respect to the last forward's x."""
        indices, x_shape, out_shape = self._saved()
        chk.same_shape(np.shape(grad_output), out_shape, "grad_output", "the forward's output")
        return max_unpool2d_backward(grad_output, indices, x_shape, num_threads=self.num_threads)

    def __repr__(self):
        return f"MaxUnpool2d(kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding})"


class GlobalMaxPool2d(Layer):
    """Global max pooling: ``(N, C, H, W)`` (or ``(C, H, W)``) to ``(N, C)``.

    In training mode ``forward`` keeps the argmax of every map;
    ``self.coords`` holds them as ``[row, col]`` (shape ``(N, C, 2)``), for
    uses such as centring a mask on each map's maximum. ``backward`` sends each
    gradient to its map's argmax and zero elsewhere.
    """

    def __init__(self, *, num_threads=None):
        super().__init__()
        self.num_threads = num_threads
        chk.num_threads_arg(num_threads)

    @property
    def coords(self):
        """``[row, col]`` of each map's maximum from the last training forward."""
        return None if self._cache is None else self._cache[0]

    def forward(self, x):
        """Per-map maxima of x."""
        x, _ = chk.array(x, "x", (3, 4))
        values, coords = argmax2d(x, return_values=True, num_threads=self.num_threads)
        if self.training:
            self._cache = (coords, x.shape)
        return values

    def backward(self, grad_output):
        """Gradient with respect to the last forward's input."""
        coords, shape = self._saved()
        grad_output, _ = chk.array(grad_output, "grad_output", (1, 2))
        chk.same_shape(grad_output.shape, shape[:-2], "grad_output", "the forward's output")
        flat = coords[..., 0] * shape[-1] + coords[..., 1]
        # One "window" per map: the max-pool scatter does exactly this.
        return max_pool2d_backward(grad_output[..., None, None], flat[..., None, None], shape,
                                   num_threads=self.num_threads)

    def __repr__(self):
        return "GlobalMaxPool2d()"


class VectorConv2d(Layer):
    """Convolution over images whose pixels are vectors (see
    :func:`cypool.vector_conv2d`): ``(C, H, W, E)`` or ``(N, C, H, W, E)``.

    ``.weight`` ``(out_channels, in_channels, kh, kw)`` and ``.bias``
    ``(out_channels,)`` (or None) are initialised like ``torch.nn.Conv2d``:
    uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``, fan_in = in_channels *
    kh * kw, drawn from ``rng`` (a ``numpy.random.Generator`` or a seed).
    ``backward(grad_output)`` fills ``.grad_weight`` and ``.grad_bias`` and
    returns the input gradient; in eval mode nothing is kept for it.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 bias=True, dtype=np.float32, rng=None, *, num_threads=None):
        super().__init__()
        _conv_init(self, in_channels, out_channels, kernel_size, stride, padding, dilation, bias,
                   dtype, rng, num_threads, geo.step_params)

    def forward(self, x, *, out=None):
        """Convolve x (into ``out`` if given); in training mode keep x for backward."""
        out = vector_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                            out=out, num_threads=self.num_threads)
        if self.training:
            self._cache = x
        return out

    def _forward_into(self, z, alloc):
        """forward(z) into alloc(shape, dtype) (zonotope.Network's buffers)."""
        z = np.asarray(z)
        sh, sw, ph, pw, dh, dw = geo.step_params(self.stride, self.padding, self.dilation)
        kh, kw = self.weight.shape[2:]
        OH = (z.shape[-3] + 2 * ph - dh * (kh - 1) - 1) // sh + 1 if z.ndim in (4, 5) else 0
        OW = (z.shape[-2] + 2 * pw - dw * (kw - 1) - 1) // sw + 1 if z.ndim in (4, 5) else 0
        if OH < 1 or OW < 1 or z.dtype != self.weight.dtype:
            return self.forward(z)  # which raises the checks' error
        return self.forward(z, out=alloc(z.shape[:-4] + (self.weight.shape[0], OH, OW, z.shape[-1]),
                                         z.dtype))

    def backward(self, grad_output):
        """Fill .grad_weight and .grad_bias; return the input gradient."""
        x = self._saved()
        gx, gw, gb = vector_conv2d_backward(grad_output, x, self.weight, self.stride, self.padding,
                                            self.dilation, num_threads=self.num_threads)
        self.grad_weight = gw
        self.grad_bias = gb if self.bias is not None else None
        return gx

    def __repr__(self):
        O, C, kh, kw = self.weight.shape
        return (f"VectorConv2d({C}, {O}, kernel_size={(kh, kw)}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, bias={self.bias is not None})")


def _conv_init(layer, in_channels, out_channels, kernel_size, stride, padding, dilation, bias, dtype,
               rng, num_threads, check_params):
    """Shared constructor of the convolution layers: checks every parameter
    now, not at the first forward, and initialises .weight and .bias like
    torch.nn.Conv2d (uniform in +-1/sqrt(fan_in))."""
    cin, cout, kh, kw, dt = chk.conv_layer_args(in_channels, out_channels, kernel_size, dtype)
    chk.num_threads_arg(num_threads)
    check_params(stride, padding, dilation)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    bound = 1.0 / np.sqrt(cin * kh * kw)
    layer.weight = gen.uniform(-bound, bound, size=(cout, cin, kh, kw)).astype(dt)
    layer.bias = gen.uniform(-bound, bound, size=cout).astype(dt) if bias else None
    layer.stride, layer.padding, layer.dilation = stride, padding, dilation
    layer.num_threads = num_threads
    layer.grad_weight = None
    layer.grad_bias = None


def _conv_params(kernel_size):
    """The parameter check of Conv2d (padding may be 'same' or 'valid')."""
    kh, kw = chk.pair(kernel_size, "kernel_size")
    return lambda s, p, d: geo.conv_params(kh, kw, s, p, d)


class Conv2d(Layer):
    """2-D convolution layer for NCHW images (see :func:`cypool.conv2d`),
    ``(N, C, H, W)`` or ``(C, H, W)``.

    ``.weight`` ``(out_channels, in_channels, kh, kw)`` and ``.bias``
    ``(out_channels,)`` (or None) are initialised like ``torch.nn.Conv2d``:
    uniform in ``[-1/sqrt(fan_in), 1/sqrt(fan_in)]``, fan_in = in_channels *
    kh * kw, drawn from ``rng`` (a ``numpy.random.Generator`` or a seed).
    ``backward(grad_output)`` fills ``.grad_weight`` and ``.grad_bias`` and
    returns the input gradient (``needs_input_grad=False`` skips it, for a
    first layer); in eval mode forward keeps nothing. Update ``.weight``
    and ``.bias`` in place or assign new arrays: each call reads them anew.
    """

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 bias=True, dtype=np.float32, rng=None, *, num_threads=None):
        super().__init__()
        _conv_init(self, in_channels, out_channels, kernel_size, stride, padding, dilation, bias,
                   dtype, rng, num_threads, _conv_params(kernel_size))

    def forward(self, x, *, out=None):
        """Convolve x (into ``out`` if given); in training mode keep x for backward."""
        res = conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, out=out,
                     num_threads=self.num_threads)
        if self.training:
            self._cache = x
        return res

    def backward(self, grad_output, *, needs_input_grad=True):
        """Fill .grad_weight and .grad_bias; return the input gradient (None
        with ``needs_input_grad=False``)."""
        x = self._saved()
        gx, gw, gb = conv2d_backward(grad_output, x, self.weight, self.stride, self.padding,
                                     self.dilation, needs_input_grad=needs_input_grad,
                                     num_threads=self.num_threads)
        self.grad_weight = gw
        self.grad_bias = gb if self.bias is not None else None
        return gx

    def __repr__(self):
        O, C, kh, kw = self.weight.shape
        return (f"Conv2d({C}, {O}, kernel_size={(kh, kw)}, stride={self.stride}, "
                f"padding={self.padding!r}, dilation={self.dilation}, bias={self.bias is not None})")


class Linear(Layer):
    """Dense layer ``y = x @ weight.T + bias`` (``torch.nn.Linear``) on
    ``(in_features,)`` or ``(N, in_features)`` arrays, in numpy's BLAS.

    ``.weight`` ``(out_features, in_features)`` and ``.bias`` are
    initialised like torch's; ``backward(g)`` fills ``.grad_weight`` and
    ``.grad_bias`` and returns the input gradient.
    """

    def __init__(self, in_features, out_features, bias=True, dtype=np.float32, rng=None):
        super().__init__()
        dense_init(self, in_features, out_features, bias, dtype, rng)

    def forward(self, x):
        """x @ weight.T + bias; in training mode keep x for backward."""
        x = chk.dense_input(x, self.weight)
        y = x @ self.weight.T
        if self.bias is not None:
            y += self.bias
        if self.training:
            self._cache = x
        return y

    def backward(self, grad_output):
        """Fill .grad_weight and .grad_bias; return the input gradient."""
        x = self._saved()
        g = chk.same_shape_grad(grad_output, x.shape[:-1] + (self.weight.shape[0],), x.dtype)
        g2, x2 = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
        self.grad_weight = g2.T @ x2
        self.grad_bias = g2.sum(axis=0) if self.bias is not None else None
        return g @ self.weight

    def __repr__(self):
        O, D = self.weight.shape
        return f"Linear({D}, {O}, bias={self.bias is not None})"


class ReLU(Layer):
    """``max(x, 0)`` on any array; ``backward(g)`` passes g where x > 0."""

    def forward(self, x):
        """max(x, 0); in training mode keep where x > 0."""
        y = np.maximum(x, 0)
        if self.training:
            self._cache = y > 0
        return y

    def backward(self, grad_output):
        """grad_output where the input was > 0, else 0."""
        mask = self._saved()
        g = chk.same_shape_grad(grad_output, mask.shape, None)
        return np.where(mask, g, np.zeros((), g.dtype))

    def __repr__(self):
        return "ReLU()"


class Flatten(Layer):
    """``(N, C, H, W)`` to ``(N, C*H*W)``, or ``(C, H, W)`` to ``(C*H*W,)``:
    ``torch.nn.Flatten``'s order; ``backward`` reshapes back."""

    def forward(self, x):
        """x flattened (a view where x is contiguous); keeps x's shape for backward."""
        x, _ = chk.array(x, "x", (3, 4))
        if self.training:
            self._cache = x.shape
        return x.reshape(-1) if x.ndim == 3 else x.reshape(x.shape[0], -1)

    def backward(self, grad_output):
        """grad_output in the input's shape."""
        shape = self._saved()
        g = chk.same_shape_grad(grad_output, (int(np.prod(shape)),) if len(shape) == 3
                                else (shape[0], int(np.prod(shape[1:]))), None)
        return g.reshape(shape)

    def __repr__(self):
        return "Flatten()"
