"""cypool's kernels as PyTorch operators (``torch.ops.cypool.*``), with
autograd, fake implementations for ``torch.compile`` and ``torch.export``,
and modules.

Each operator is a ``torch.library.custom_op``: its CPU tensors reach the
kernels as numpy views (no copy, whatever their strides), its outputs are
tensors over cypool's arrays, and its backward is an operator too, so that
AOT autograd traces it. A call follows ``torch.get_num_threads()`` unless
it passes ``num_threads``.

Functions: :func:`vector_conv2d`, :func:`conv2d`,
:func:`max_pool2d_with_indices`, :func:`argmax2d`. Modules:
:class:`VectorConv2d`, :class:`Conv2d`, :class:`MaxPool2d`,
:class:`GlobalMaxPool2d`.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

try:
    import torch
except ImportError:  # pragma: no cover - exercised where torch is missing
    raise ImportError("cypool.torch needs PyTorch: install a CPU build, for example "
                      "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu") from None

import numpy as np
from torch._C._functorch import is_functorch_wrapped_tensor as _functorch_wrapped
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_mode

from . import _checks as chk
from . import _geometry as geo
from .argmax import argmax2d as _np_argmax2d
from .conv import conv2d as _np_conv2d, conv2d_backward as _np_conv2d_backward
from .pooling import max_pool2d as _np_max_pool2d, max_pool2d_backward as _np_max_pool2d_backward
from .vector_conv import vector_conv2d as _np_vector_conv2d, vector_conv2d_backward as _np_vector_conv2d_backward

Tensor = torch.Tensor

__all__ = ["vector_conv2d", "conv2d", "max_pool2d_with_indices", "argmax2d", "VectorConv2d", "Conv2d",
           "MaxPool2d", "GlobalMaxPool2d"]

_FLOATS = (torch.float32, torch.float64)


def _np(t: Optional[Tensor]):
    """A CPU tensor as a numpy view (None stays None)."""
    return None if t is None else t.detach().numpy()


def _empty(dtype) -> Tensor:
    return torch.empty(0, dtype=dtype)


# --- the vector convolution ----------------------------------------------------

def _conv_fake(x, weight, stride, padding, dilation, h_axis):
    """An empty output of a convolution whose x has its rows at h_axis."""
    O, _, kh, kw = weight.shape
    OH, OW = ((x.shape[h_axis + i] + 2 * padding[i] - dilation[i] * (k - 1) - 1) // stride[i] + 1
              for i, k in enumerate((kh, kw)))
    end = x.dim() + h_axis + 2
    return x.new_empty(tuple(x.shape[:h_axis - 1]) + (O, OH, OW) + tuple(x.shape[end:]))


def _vector_conv2d_impl(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int],
                        padding: List[int], dilation: List[int], num_threads: int) -> Tensor:
    return torch.from_numpy(_np_vector_conv2d(_np(x), _np(weight), _np(bias), tuple(stride), tuple(padding),
                                              tuple(dilation), num_threads=_nt(num_threads)))


_vector_conv2d = torch.library.custom_op("cypool::vector_conv2d", _vector_conv2d_impl, mutates_args=())


@_vector_conv2d.register_fake
def _(x, weight, bias, stride, padding, dilation, num_threads):
    return _conv_fake(x, weight, stride, padding, dilation, -3)


def _grads(grads, needs, dtype) -> Tuple[Tensor, Tensor, Tensor]:
    """A backward's (grad_x, grad_w, grad_bias) as tensors, empty where not needed."""
    return tuple(torch.from_numpy(np.ascontiguousarray(g)) if need else _empty(dtype)
                 for g, need in zip(grads, needs))


def _vector_conv2d_backward_impl(grad: Tensor, x: Tensor, weight: Tensor, stride: List[int],
                                 padding: List[int], dilation: List[int], needs: List[bool],
                                 num_threads: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _grads(_np_vector_conv2d_backward(_np(grad), _np(x), _np(weight), tuple(stride), tuple(padding),
                                             tuple(dilation), needs_input_grad=needs[0],
                                             needs_weight_grad=needs[1], num_threads=_nt(num_threads)),
                  needs, x.dtype)


_vector_conv2d_backward = torch.library.custom_op("cypool::vector_conv2d_backward",
                                                  _vector_conv2d_backward_impl, mutates_args=())


def _conv_backward_fake(grad, x, weight, stride, padding, dilation, needs, num_threads):
    return (x.new_empty(x.shape) if needs[0] else x.new_empty(0),
            x.new_empty(weight.shape) if needs[1] else x.new_empty(0),
            x.new_empty(weight.shape[:1]) if needs[2] else x.new_empty(0))


_vector_conv2d_backward.register_fake(_conv_backward_fake)


def _conv_setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, num_threads = inputs
    ctx.save_for_backward(x, weight)
    ctx.params = (stride, padding, dilation, num_threads)
    ctx.has_bias = bias is not None


def _conv_grads(op):
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        stride, padding, dilation, num_threads = ctx.params
        needs = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        if not any(needs):
            return None, None, None, None, None, None, None
        gx, gw, gb = op(grad, x, weight, stride, padding, dilation, needs, num_threads)
        return (gx if needs[0] else None, gw if needs[1] else None, gb if needs[2] else None,
                None, None, None, None)
    return backward


_vector_conv2d.register_autograd(_conv_grads(_vector_conv2d_backward), setup_context=_conv_setup)


# --- the standard convolution ----------------------------------------------------

def _conv2d_impl(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: List[int], padding: List[int],
                 dilation: List[int], num_threads: int) -> Tensor:
    return torch.from_numpy(_np_conv2d(_np(x), _np(weight), _np(bias), tuple(stride), tuple(padding),
                                       tuple(dilation), num_threads=_nt(num_threads)))


_conv2d = torch.library.custom_op("cypool::conv2d", _conv2d_impl, mutates_args=())


@_conv2d.register_fake
def _(x, weight, bias, stride, padding, dilation, num_threads):
    return _conv_fake(x, weight, stride, padding, dilation, -2)


def _conv2d_backward_impl(grad: Tensor, x: Tensor, weight: Tensor, stride: List[int], padding: List[int],
                          dilation: List[int], needs: List[bool], num_threads: int) -> Tuple[Tensor, Tensor, Tensor]:
    return _grads(_np_conv2d_backward(_np(grad), _np(x), _np(weight), tuple(stride), tuple(padding),
                                      tuple(dilation), needs_input_grad=needs[0], needs_weight_grad=needs[1],
                                      num_threads=_nt(num_threads)),
                  needs, x.dtype)


_conv2d_backward = torch.library.custom_op("cypool::conv2d_backward", _conv2d_backward_impl, mutates_args=())
_conv2d_backward.register_fake(_conv_backward_fake)
_conv2d.register_autograd(_conv_grads(_conv2d_backward), setup_context=_conv_setup)


# --- max pooling --------------------------------------------------------------

def _pool_len(n, k, s, p, d, ceil_mode):
    span = n + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


def _max_pool2d_with_indices_impl(x: Tensor, kernel_size: List[int], stride: List[int], padding: List[int],
                             dilation: List[int], ceil_mode: bool, num_threads: int) -> Tuple[Tensor, Tensor]:
    values, indices = _np_max_pool2d(_np(x), tuple(kernel_size), tuple(stride), tuple(padding), tuple(dilation),
                                     ceil_mode, True, num_threads=_nt(num_threads))
    return torch.from_numpy(values), torch.from_numpy(indices)


_max_pool2d_with_indices = torch.library.custom_op("cypool::max_pool2d_with_indices",
                                                   _max_pool2d_with_indices_impl, mutates_args=())


@_max_pool2d_with_indices.register_fake
def _(x, kernel_size, stride, padding, dilation, ceil_mode, num_threads):
    OH = _pool_len(x.shape[-2], kernel_size[0], stride[0], padding[0], dilation[0], ceil_mode)
    OW = _pool_len(x.shape[-1], kernel_size[1], stride[1], padding[1], dilation[1], ceil_mode)
    shape = tuple(x.shape[:-2]) + (OH, OW)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.int64)


def _max_pool2d_backward_impl(grad: Tensor, indices: Tensor, x: Tensor, num_threads: int) -> Tensor:
    return torch.from_numpy(_np_max_pool2d_backward(_np(grad), _np(indices), tuple(x.shape),
                                                    num_threads=_nt(num_threads)))


_max_pool2d_backward = torch.library.custom_op("cypool::max_pool2d_backward", _max_pool2d_backward_impl,
                                               mutates_args=())


@_max_pool2d_backward.register_fake
def _(grad, indices, x, num_threads):
    return grad.new_empty(x.shape)


def _pool_setup(ctx, inputs, output):
    x, *_, num_threads = inputs
    ctx.save_for_backward(output[1], x)
    ctx.num_threads = num_threads


def _pool_grads(op):
    def backward(ctx, grad, grad_indices):
        indices, x = ctx.saved_tensors
        return op(grad, indices, x, ctx.num_threads), None, None, None, None, None, None
    return backward


_max_pool2d_with_indices.register_autograd(_pool_grads(_max_pool2d_backward), setup_context=_pool_setup)


# --- argmax ----------------------------------------------------------------------

def _argmax2d_impl(x: Tensor, num_threads: int) -> Tensor:
    return torch.from_numpy(_np_argmax2d(_np(x), num_threads=_nt(num_threads)))


_argmax2d = torch.library.custom_op("cypool::argmax2d", _argmax2d_impl, mutates_args=())


@_argmax2d.register_fake
def _(x, num_threads):
    return x.new_empty(tuple(x.shape[:-2]) + (2,), dtype=torch.int64)


# --- eager calls: the kernels directly ------------------------------------------
# An eager call on plain CPU tensors skips the dispatcher (about 10 us a call)
# and custom_op's autograd wrapper (about 40 us): it runs the same
# implementation, and its backward the same backward implementation, in an
# autograd.Function. While a graph is traced, under a dispatch mode or a
# functorch transform, the operators run.

def _eager(*tensors) -> bool:
    if torch.compiler.is_compiling() or _current_mode() is not None:
        return False
    return all(t is None or ((type(t) is Tensor or type(t) is torch.nn.Parameter)
                             and not _functorch_wrapped(t)) for t in tensors)


def _wants_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _function(name, impl, setup, backward, non_differentiable=()):
    """An autograd.Function running impl forward and backward (eager calls)."""
    def forward(ctx, *args):
        out = impl(*args)
        setup(ctx, args, out)
        for k in non_differentiable:
            ctx.mark_non_differentiable(out[k])
        return out
    return type(name, (torch.autograd.Function,), {"forward": staticmethod(forward),
                                                    "backward": staticmethod(backward)})


_VectorConvFn = _function("_VectorConvFn", _vector_conv2d_impl, _conv_setup,
                          _conv_grads(_vector_conv2d_backward_impl))
_ConvFn = _function("_ConvFn", _conv2d_impl, _conv_setup, _conv_grads(_conv2d_backward_impl))
_PoolFn = _function("_PoolFn", _max_pool2d_with_indices_impl, _pool_setup,
                    _pool_grads(_max_pool2d_backward_impl), non_differentiable=(1,))


def _run(op, impl, fn, args, tensors):
    if not _eager(*tensors):
        return op(*args)
    return fn.apply(*args) if fn is not None and _wants_grad(*tensors) else impl(*args)


# --- the public functions: checks, then the operator ---------------------------

def _tensor(t, name, dims, dtypes=_FLOATS):
    if not isinstance(t, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device}: cypool computes on the CPU only (move it with .cpu())")
    if dtypes is not None and t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} must be {want}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() not in dims:
        want = f"{dims[0]} to {dims[-1]}" if len(dims) > 2 else " or ".join(map(str, dims))
        raise ValueError(f"{name} must have {want} dimensions, got shape {tuple(t.shape)}")
    return t


def _threads(num_threads) -> int:
    """The operators' num_threads: 0 follows torch.get_num_threads() when
    the kernel runs (not when a graph is traced)."""
    return 0 if num_threads is None else chk.num_threads_arg(num_threads)


def _nt(num_threads: int) -> int:
    return num_threads or torch.get_num_threads()


def _pair(v, name):
    return list(chk.pair(v, name))


def _conv_args(x, weight, bias, stride, padding, dilation, x_dims, channel_axis):
    _tensor(x, "x", x_dims)
    _tensor(weight, "weight", (4,))
    if weight.dtype != x.dtype:
        raise TypeError(f"weight dtype {weight.dtype} must match x dtype {x.dtype}")
    if weight.shape[1] != x.shape[channel_axis]:
        raise ValueError(f"weight takes {weight.shape[1]} input channels but x has "
                         f"{x.shape[channel_axis]} (x shape {tuple(x.shape)})")
    if bias is not None:
        _tensor(bias, "bias", (1,))
        if bias.dtype != x.dtype or bias.shape[0] != weight.shape[0]:
            raise ValueError(f"bias must be ({weight.shape[0]},) of x's dtype, got "
                             f"{tuple(bias.shape)} {bias.dtype}")
    return _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")


def vector_conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, *, num_threads=None) -> Tensor:
    """:func:`cypool.vector_conv2d` on tensors, with autograd: x ``(C, H, W,
    E)`` or ``(N, C, H, W, E)``, weight ``(O, C, kh, kw)``, bias ``(O,)``
    added to component 0 only."""
    s, p, d = _conv_args(x, weight, bias, stride, padding, dilation, (4, 5), -4)
    return _run(_vector_conv2d, _vector_conv2d_impl, _VectorConvFn,
                (x, weight, bias, s, p, d, _threads(num_threads)), (x, weight, bias))


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, *, num_threads=None) -> Tensor:
    """:func:`cypool.conv2d` on tensors (``F.conv2d`` with groups 1), with
    autograd."""
    s, p, d = _conv_args(x, weight, bias, stride, padding, dilation, (3, 4), -3)
    return _run(_conv2d, _conv2d_impl, _ConvFn, (x, weight, bias, s, p, d, _threads(num_threads)),
                (x, weight, bias))


def max_pool2d_with_indices(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False, *,
                            num_threads=None) -> Tuple[Tensor, Tensor]:
    """Values and int64 indices equal to ``F.max_pool2d(...,
    return_indices=True)`` (but a NaN's index: cypool's is the first NaN),
    with autograd to x."""
    _tensor(x, "x", (3, 4))
    k = _pair(kernel_size, "kernel_size")
    s = k if stride is None else _pair(stride, "stride")
    args = (x, k, s, _pair(padding, "padding"), _pair(dilation, "dilation"), bool(ceil_mode),
            _threads(num_threads))
    return _run(_max_pool2d_with_indices, _max_pool2d_with_indices_impl, _PoolFn, args, (x,))


def argmax2d(x, *, num_threads=None) -> Tensor:
    """The ``(row, col)`` of the maximum of every map, int64 ``(..., 2)``."""
    _tensor(x, "x", tuple(range(2, 33)), dtypes=None)
    return _run(_argmax2d, _argmax2d_impl, None, (x, _threads(num_threads)), (x,))


# --- modules -------------------------------------------------------------------------

class _ConvBase(torch.nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, bias=True,
                 dtype=None, num_threads=None):
        super().__init__()
        conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding, dilation, bias=bias,
                               dtype=dtype)  # torch's initialisation and parameter shapes
        self.weight, self.bias = conv.weight, conv.bias
        self.stride, self.padding, self.dilation = conv.stride, conv.padding, conv.dilation
        if isinstance(self.padding, str):
            raise ValueError("padding must be numbers, not a string")
        self.num_threads = num_threads

    def extra_repr(self):
        O, C, kh, kw = self.weight.shape
        return (f"{C}, {O}, kernel_size={(kh, kw)}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, bias={self.bias is not None}")


class VectorConv2d(_ConvBase):
    """The vector convolution as a module; parameters named and shaped as
    ``torch.nn.Conv2d``'s. Input ``(C, H, W, E)`` or ``(N, C, H, W, E)``."""

    def forward(self, x):
        return vector_conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                             num_threads=self.num_threads)


class Conv2d(_ConvBase):
    """``torch.nn.Conv2d`` (groups 1, zero padding) on cypool's kernels."""

    def forward(self, x):
        return conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation,
                      num_threads=self.num_threads)


class MaxPool2d(torch.nn.Module):
    """Max pooling; ``return_indices=True`` also returns the int64 indices."""

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1, return_indices=False, ceil_mode=False,
                 *, num_threads=None):
        super().__init__()
        geo.pool_params(kernel_size, stride, padding, dilation)
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.return_indices, self.ceil_mode, self.num_threads = return_indices, ceil_mode, num_threads

    def forward(self, x):
        values, indices = max_pool2d_with_indices(x, self.kernel_size, self.stride, self.padding,
                                                  self.dilation, self.ceil_mode, num_threads=self.num_threads)
        return (values, indices) if self.return_indices else values


class GlobalMaxPool2d(torch.nn.Module):
    """``(N, C, H, W)`` to ``(N, C)``: each map's maximum, the gradient to
    its position (the argmax's)."""

    def __init__(self, *, num_threads=None):
        super().__init__()
        self.num_threads = num_threads

    def forward(self, x):
        coords = argmax2d(x, num_threads=self.num_threads)
        flat = (coords[..., 0] * x.shape[-1] + coords[..., 1]).unsqueeze(-1)
        return x.flatten(-2).gather(-1, flat).squeeze(-1)

