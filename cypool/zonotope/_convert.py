"""Network.from_layers: trained layers (cypool's, numpy weights, a torch
Sequential) as zonotope layers. A torch module is read only where its
computation is known: see _torch_leaves."""
from __future__ import annotations

import sys

import numpy as np

from .. import _checks as chk
from ..layers import Conv2d, Flatten, Linear, ReLU, VectorConv2d
from ._layers import VectorAvgPool2d, VectorChannelAffine, VectorFlatten, VectorLinear, VectorReLU


def layers_of(layers, dtype, num_threads) -> list:
    """The zonotope layers of Network.from_layers (see there)."""
    dt = chk.float_dtype_arg(dtype)
    chk.num_threads_arg(num_threads)
    if _is_torch(layers):
        items = list(_torch_leaves(layers, "layers"))
    elif isinstance(layers, (list, tuple)):
        items = []
        for i, spec in enumerate(layers):
            items.extend(_torch_leaves(spec, f"layers[{i}]") if _is_torch(spec)
                         else [(f"layers[{i}]", spec)])
    else:
        raise TypeError(f"layers must be a list, a tuple or a torch.nn.Sequential, got "
                        f"{type(layers).__name__}")
    out = []
    spatial = False  # whether the zonotope is (C, H, W, E) at this point
    for where, spec in items:
        layer = _convert(spec, dt, num_threads, where)
        if layer is None:  # a no-op
            continue
        if isinstance(layer, VectorLinear) and spatial:
            if _is_torch(spec):
                raise ValueError(f"{where}: torch's Linear after a convolution acts on the "
                                 f"last axis of each image; put nn.Flatten() before it")
            out.append(VectorFlatten().eval())
            spatial = False
        if isinstance(layer, VectorChannelAffine):
            _check_norm(spec, spatial, where)
            if out and _fold(out[-1], layer, where):
                continue
        if isinstance(layer, (VectorConv2d, VectorAvgPool2d)):
            spatial = True
        elif isinstance(layer, (VectorFlatten, VectorLinear)):
            spatial = False
        out.append(layer.eval())
    return out


def _is_torch(obj) -> bool:
    """Whether obj is a torch module (torch not imported: it cannot be)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _torch_known(m) -> bool:
    """Whether torch module m computes what its class does: its class's
    forward is torch's own (a subclass may override it) and no forward
    hook can change its input or output."""
    import torch.nn as nn
    from torch.nn.modules import module as tm

    cls = next((c for c in type(m).__mro__ if c.__module__.startswith("torch.nn.")), None)
    if cls is None or cls is nn.Module or type(m).forward is not cls.forward:
        return False
    hooks = (m._forward_hooks, m._forward_pre_hooks, tm._global_forward_hooks,
             tm._global_forward_pre_hooks)
    return not any(hooks)


def _torch_leaves(module, path):
    """(path, leaf) of every layer of a torch model, in the order its
    forward runs them: a Sequential (or a subclass that keeps its forward)
    is opened; any other module with children, a custom forward or a hook
    is refused, since its children's order need not be what it computes
    (a skip connection, a functional ReLU)."""
    import torch.nn as nn

    kind = type(module).__name__
    if not _torch_known(module):
        raise TypeError(f"{path} ({kind}): from_layers reads only torch modules whose forward is "
                        f"torch's own and that have no forward hooks; this one's forward (or a "
                        f"hook) may compute something its layers in order do not")
    if isinstance(module, nn.Sequential):
        for name, child in module.named_children():
            yield from _torch_leaves(child, f"{path}.{name}")
    elif next(module.children(), None) is not None:
        raise TypeError(f"{path} ({kind}): from_layers opens only nn.Sequential containers")
    else:
        yield path, module


def _array_of(v, dt, name):
    """A weight as a numpy array of dtype dt (a torch tensor is detached)."""
    if v is None:
        return None
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    a, _ = chk.array(v, name, tuple(range(1, 5)), floating_only=True)
    return np.array(a, dtype=dt)  # a copy: later training of the source does not leak in


def _conv_padding(padding, kernel_size, dilation, where):
    """A convolution layer's padding as vector_conv2d takes it (symmetric)."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0
        kh, kw = chk.pair(kernel_size, "kernel_size")
        dh, dw = chk.pair(dilation, "dilation")
        if padding == "same" and (dh * (kh - 1)) % 2 == 0 and (dw * (kw - 1)) % 2 == 0:
            return dh * (kh - 1) // 2, dw * (kw - 1) // 2
        raise ValueError(f"{where}: padding {padding!r} of kernel {(kh, kw)} is not symmetric, "
                         f"which the zonotope convolution needs")
    return padding


def _conv_layer(weight, bias, stride, padding, dilation, dt, nt, where):
    w = _array_of(weight, dt, f"{where}.weight")
    O, C, kh, kw = w.shape if w.ndim == 4 else (None,) * 4
    if O is None:
        raise ValueError(f"{where}: a convolution weight must be 4-D, got shape {w.shape}")
    layer = VectorConv2d(C, O, (kh, kw), stride, _conv_padding(padding, (kh, kw), dilation, where),
                           dilation, bias is not None, dt, num_threads=nt)
    layer.weight = w
    layer.bias = _array_of(bias, dt, f"{where}.bias")
    if layer.bias is not None and layer.bias.shape != (O,):
        raise ValueError(f"{where}: bias must have shape ({O},), got {layer.bias.shape}")
    return layer


def _dense_layer(weight, bias, dt, nt, where):
    w = _array_of(weight, dt, f"{where}.weight")
    if w.ndim != 2:
        raise ValueError(f"{where}: a dense weight must be 2-D, got shape {w.shape}")
    layer = VectorLinear(w.shape[1], w.shape[0], bias is not None, dt, num_threads=nt)
    layer.weight = w
    layer.bias = _array_of(bias, dt, f"{where}.bias")
    if layer.bias is not None and layer.bias.shape != (w.shape[0],):
        raise ValueError(f"{where}: bias must have shape ({w.shape[0]},), got {layer.bias.shape}")
    return layer


def _convert(spec, dt, nt, where):
    """One layer of from_layers as its zonotope layer, or None for a no-op."""
    if isinstance(spec, str):
        if spec == "relu":
            return VectorReLU(num_threads=nt)
        if spec == "flatten":
            return VectorFlatten()
        raise ValueError(f"{where}: unknown layer name {spec!r} (use 'relu' or 'flatten')")
    if isinstance(spec, dict):
        if set(spec) == {"mean", "std"}:
            std = _array_of(spec["std"], np.float64, f"{where}.std")
            if (std == 0).any():
                raise ValueError(f"{where}: std must be nonzero")
            mean = _array_of(spec["mean"], np.float64, f"{where}.mean")
            return VectorChannelAffine(1 / std, -mean / std, dtype=dt)
        if "weight" not in spec:
            raise ValueError(f"{where}: a dict layer needs a 'weight' (or is {{'mean', 'std'}})")
        unknown = set(spec) - {"weight", "bias", "stride", "padding", "dilation"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        if np.ndim(spec["weight"]) == 4:
            return _conv_layer(spec["weight"], spec.get("bias"), spec.get("stride", 1),
                               spec.get("padding", 0), spec.get("dilation", 1), dt, nt, where)
        if set(spec) - {"weight", "bias"}:
            raise ValueError(f"{where}: stride, padding and dilation are for 4-D (convolution) weights")
        return _dense_layer(spec["weight"], spec.get("bias"), dt, nt, where)
    if isinstance(spec, (Conv2d, VectorConv2d)):
        return _conv_layer(spec.weight, spec.bias, spec.stride, spec.padding, spec.dilation, dt,
                           nt, where)
    if isinstance(spec, (Linear, VectorLinear)):
        return _dense_layer(spec.weight, spec.bias, dt, nt, where)
    if isinstance(spec, (ReLU, VectorReLU)):
        return VectorReLU(num_threads=nt)
    if isinstance(spec, (Flatten, VectorFlatten)):
        return VectorFlatten()
    if isinstance(spec, VectorChannelAffine):
        return VectorChannelAffine(spec.scale, spec.shift, dtype=dt)
    if isinstance(spec, VectorAvgPool2d):
        return VectorAvgPool2d(spec.kernel_size, spec.stride, spec.padding, divisor=spec.divisor)
    if _is_torch(spec):
        return _convert_torch(spec, dt, nt, where)
    raise TypeError(f"{where}: cannot certify through a {type(spec).__name__}")


def _convert_torch(m, dt, nt, where):
    """A torch leaf (checked by _torch_leaves) as its zonotope layer, or None."""
    import torch.nn as nn

    if isinstance(m, nn.Conv2d):
        if m.groups != 1 or m.padding_mode != "zeros":
            raise ValueError(f"{where}: only groups=1 and zero padding are supported, got {m!r}")
        return _conv_layer(m.weight, m.bias, m.stride, m.padding, m.dilation, dt, nt, where)
    if isinstance(m, nn.Linear):
        return _dense_layer(m.weight, m.bias, dt, nt, where)
    if isinstance(m, nn.ReLU):
        return VectorReLU(num_threads=nt)
    if isinstance(m, nn.Flatten):
        if m.start_dim != 1 or m.end_dim != -1:
            raise ValueError(f"{where}: only Flatten(start_dim=1, end_dim=-1) is supported, got {m!r}")
        return VectorFlatten()
    if isinstance(m, (nn.Identity, nn.Dropout, nn.Dropout1d, nn.Dropout2d)):
        return None
    if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
        if m.running_mean is None or m.running_var is None:
            raise ValueError(f"{where}: a batch norm without running statistics normalises by "
                             f"each batch's, which has no fixed function to certify")
        var = _array_of(m.running_var, np.float64, f"{where}.running_var")
        mean = _array_of(m.running_mean, np.float64, f"{where}.running_mean")
        scale = 1 / np.sqrt(var + m.eps)
        if m.weight is not None:
            scale = scale * _array_of(m.weight, np.float64, f"{where}.weight")
        shift = -mean * scale
        if m.bias is not None:
            shift = shift + _array_of(m.bias, np.float64, f"{where}.bias")
        return VectorChannelAffine(scale, shift, dtype=dt)
    if isinstance(m, nn.AvgPool2d):
        if m.ceil_mode:
            raise ValueError(f"{where}: AvgPool2d with ceil_mode=True is not supported")
        if not m.count_include_pad and m.padding not in (0, (0, 0)):
            raise ValueError(f"{where}: AvgPool2d with padding needs count_include_pad=True")
        return VectorAvgPool2d(m.kernel_size, m.stride, m.padding, divisor=m.divisor_override)
    raise TypeError(f"{where}: cannot certify through torch's {type(m).__name__}")


def _check_norm(spec, spatial: bool, where):
    """A torch batch norm's kind agrees with where it stands."""
    if type(spec).__name__ == "BatchNorm2d" and not spatial:
        raise ValueError(f"{where}: BatchNorm2d needs an image, but the layers before it flatten")
    if type(spec).__name__ == "BatchNorm1d" and spatial:
        raise ValueError(f"{where}: BatchNorm1d after a convolution is not supported")


def _fold(prev, affine, where) -> bool:
    """Fold a channel affine into the convolution or dense layer right
    before it (its output channels): True where it was folded."""
    if not isinstance(prev, (VectorConv2d, VectorLinear)):
        return False
    O = prev.weight.shape[0]
    if affine.channels not in (1, O):
        raise ValueError(f"{where}: {affine.channels} channels, but the layer before it has {O}")
    scale = np.broadcast_to(affine.scale, (O,)).astype(prev.weight.dtype)
    shift = np.broadcast_to(affine.shift, (O,)).astype(prev.weight.dtype)
    prev.weight *= scale.reshape((O,) + (1,) * (prev.weight.ndim - 1))
    prev.bias = shift + (0 if prev.bias is None else prev.bias * scale)
    return True
