"""zonotope.Network: a whole network run on zonotopes, fast.

What makes it faster than its layers called one by one, with the same
numbers (docs/performance.md):

* two buffers the layers write into in turn, kept from call to call;
* a first convolution convolves the input box directly (_box_conv), and
  with a ReLU and a second convolution after it, works row band by row
  band (_banded_head): after the first convolution a pixel's generator is
  zero outside a few rows, and only those are read;
* a ReLU's new generators reach the next convolution or dense layer apart
  (_tail_conv, _tail_linear), scattered there rather than convolved as
  columns of zeros;
* the dense layers multiply, per block of generators, only the neurons
  that are not zero in it (zonotope.linear): after the banded head, 83%
  of ConvMed's first dense layer's blocks; the convolutions after a ReLU
  leave out the dead neurons' vectors (tiles_forward's skip_zero_taps).
"""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

from . import _checks as chk
from ._conv_engine import tiles_forward
from ._zonotope_ops import as_zonotope, box, dense_into, from_box_into, relu_into
from .zonotope import certify, conv2d

__all__ = ["Network"]


class Network:
    """A network run on zonotopes: a list of zonotope layers
    (:class:`cypool.VectorConv2d`, :class:`cypool.VectorReLU`,
    :class:`cypool.VectorFlatten`, :class:`cypool.VectorLinear`, or any
    object with ``forward(z)``), applied in order.

    Build it from a trained network with :meth:`from_layers`; certify an
    input with :meth:`certify`. Each Python thread that runs it keeps two
    buffers (three in :meth:`certify`) as large as its largest zonotopes,
    reused from call to call.
    """

    def __init__(self, layers):
        self.layers = list(layers)
        self._local = threading.local()
        for i, layer in enumerate(self.layers):
            if not callable(getattr(layer, "forward", None)):
                raise TypeError(f"layers[{i}] has no forward method: {layer!r}")

    @classmethod
    def from_layers(cls, layers, *, dtype=np.float64, num_threads=None) -> "Network":
        """The zonotope network of a trained stack of layers.

        Parameters
        ----------
        layers : sequence, or a ``torch.nn.Sequential``
            In order, each one of:

            * cypool's ``Conv2d``, ``Linear``, ``ReLU``, ``Flatten`` (or
              their Vector counterparts), ``VectorChannelAffine``,
              ``VectorAvgPool2d``;
            * a ``torch.nn.Sequential`` (nested, or a subclass that keeps
              its ``forward``) of ``Conv2d`` (groups 1, zero padding),
              ``Linear``, ``ReLU``, ``Flatten`` (start_dim 1, end_dim -1),
              ``BatchNorm1d``/``BatchNorm2d`` (their running statistics,
              as in eval mode), ``AvgPool2d`` and the no-ops ``Identity``
              and ``Dropout`` (as in eval mode). Any other module (a
              custom ``forward``, a residual block, a functional ReLU, a
              forward hook) is refused with its path in the model: its
              children in order need not be what it computes;
            * plain numpy weights: a dict ``{"weight": w, "bias": b}``,
              with ``stride``, ``padding``, ``dilation`` for a 4-D
              (convolution) weight, a 2-D weight being a dense layer; or
              ``{"mean": m, "std": s}``, an input normalisation ``(x - m)
              / s`` per channel;
            * the strings ``"relu"`` and ``"flatten"``.

            A dense layer right after a convolution (or its ReLU) gets the
            flatten inserted, as torch's flatten order, except in a torch
            model, where torch's Linear would act on the last axis: there
            it is refused. A batch norm or channel affine right after a
            convolution or dense layer is folded into its weights.
        dtype : float64 (default) or float32
            The weights are copied in this dtype.
        num_threads : int or None
            For every layer.
        """
        from . import layers as L  # (layers imports zonotope, which imports this module)

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
            layer = _convert(L, spec, dt, num_threads, where)
            if layer is None:  # a no-op
                continue
            if isinstance(layer, L.VectorLinear) and spatial:
                if _is_torch(spec):
                    raise ValueError(f"{where}: torch's Linear after a convolution acts on the "
                                     f"last axis of each image; put nn.Flatten() before it")
                out.append(L.VectorFlatten().eval())
                spatial = False
            if isinstance(layer, L.VectorChannelAffine):
                _check_norm(spec, spatial, where)
                if out and _fold(out[-1], layer, L, where):
                    continue
            if isinstance(layer, (L.VectorConv2d, L.VectorAvgPool2d)):
                spatial = True
            elif isinstance(layer, (L.VectorFlatten, L.VectorLinear)):
                spatial = False
            out.append(layer.eval())
        return cls(out)

    def forward(self, z) -> np.ndarray:
        """The output zonotope of z (each layer in turn)."""
        return self._run(z, self._workspace()).copy()

    __call__ = forward

    def _workspace(self) -> "_Workspace":
        ws = getattr(self._local, "ws", None)
        if ws is None:
            ws = self._local.ws = _Workspace()
        return ws

    def _run(self, z, ws: "_Workspace", layers=None, times=None) -> np.ndarray:
        """The layers in turn, each writing into the workspace where it can:
        the result is a view of the workspace. A ReLU followed (past
        flattens) by a convolution or a dense layer hands its new
        generators to that layer apart (see _tail_conv). times: a dict
        that gets each layer type's seconds added, or None."""
        layers = self.layers if layers is None else layers
        tail = None  # a ReLU's new generators not yet written: (idx, mu)
        for pos, layer in enumerate(layers):
            t0 = time.perf_counter()
            try:
                z, tail = _step(layers, pos, z, tail, ws)
            except ValueError as e:  # name the layer: the input may not be the size it was built for
                k = len(self.layers) - len(layers) + pos
                raise ValueError(f"layers[{k}] ({type(layer).__name__}): {e}") from None
            if times is not None:
                key = type(layer).__name__
                times[key] = times.get(key, 0.0) + time.perf_counter() - t0
        if tail is not None:
            z = _append(z, *tail, ws.taker(z))
        return z

    def predict(self, x) -> np.ndarray:
        """The network's output on the point x (a zonotope with no generator)."""
        return self.forward(np.asarray(x, dtype=self._dtype())[..., None])[..., 0]

    def certify(self, x, eps, label, *, clip=(0.0, 1.0), return_margins=False, times=None):
        """Whether every input in the box ``x +- eps`` (clipped to ``clip``)
        is classified as label: :func:`certify` of the output of
        :func:`from_box`, in the network's dtype (see :func:`certify` for
        the result and the margins). It takes the structure of the box's
        generators into account (by row bands, in (h, w, c) order, through
        a first convolution, ReLU and convolution), which changes no
        answer: the margins are those of the layers one by one, to
        rounding.

        A batch (x of shape ``(N, ...)``, label N integers) is certified
        image by image: ``certified`` is then an (N,) bool array, and the
        margins ``(N, K)``. ``clip``'s bounds may be arrays that broadcast
        to one image (per channel: ``(C, 1, 1)``). A first channel affine
        (an input normalisation) maps the box to a box.

        times : dict, optional
            Gets the seconds of each step added: per layer type (the input
            box is counted with a first convolution, which convolves it
            directly), and ``"certify"``.
        """
        from .layers import VectorChannelAffine, VectorConv2d, VectorReLU  # (layers imports zonotope)

        if np.ndim(label) == 1:
            return self._certify_batch(x, eps, label, clip, return_margins, times)
        t0 = time.perf_counter()
        ws = self._workspace()
        layers = self.layers
        if layers and isinstance(layers[0], VectorChannelAffine):
            x, eps, clip = _affine_box(layers[0], x, eps, clip)
            layers = layers[1:]
        z = None
        if len(layers) >= 3 and isinstance(layers[0], VectorConv2d) and isinstance(layers[1], VectorReLU) \
                and isinstance(layers[2], VectorConv2d):
            head = _banded_head(x, eps, clip, *layers[:3], ws, times)
            if head is not None:
                z, layers, t0 = head, layers[3:], None
        if z is None and layers and isinstance(layers[0], VectorConv2d):  # skips the box
            z = _box_conv(x, eps, clip, layers[0], ws.taker(None))
            key = "VectorConv2d"
            layers = layers[1:] if z is not None else layers
        if z is None:
            z = from_box_into(x, eps, clip, self._dtype(), ws.taker(None))
            key = "from_box"
        if times is not None and t0 is not None:
            times[key] = times.get(key, 0.0) + time.perf_counter() - t0
        z = self._run(z, ws, layers, times)
        t0 = time.perf_counter()
        res = certify(z, label, return_margins=return_margins)
        if times is not None:
            times["certify"] = times.get("certify", 0.0) + time.perf_counter() - t0
        return res

    def _certify_batch(self, x, eps, label, clip, return_margins, times):
        """certify of each image of the batch x in turn."""
        xa = np.asarray(x)
        lab = np.asarray(label)
        if xa.ndim < 2 or lab.shape != (xa.shape[0],) or lab.dtype.kind not in "iu":
            raise ValueError(f"label must be {xa.shape[0] if xa.ndim >= 2 else 'N'} integers for "
                             f"a batch x of shape {xa.shape}, got {label!r}")
        ea = np.asarray(eps)
        if ea.ndim == xa.ndim:  # one eps per image, or per element
            try:
                ea = np.broadcast_to(ea, xa.shape)
            except ValueError:
                raise ValueError(f"eps of shape {ea.shape} does not broadcast to x's shape "
                                 f"{xa.shape}") from None
        res = [self.certify(xa[i], ea[i] if ea.ndim == xa.ndim else eps, int(lab[i]), clip=clip,
                            return_margins=True, times=times) for i in range(xa.shape[0])]
        ok = np.array([r[0] for r in res], bool)
        return (ok, np.stack([r[1] for r in res])) if return_margins else ok

    def _dtype(self) -> np.dtype:
        for layer in self.layers:
            w = getattr(layer, "weight", None)
            if isinstance(w, np.ndarray):
                return w.dtype
        return np.dtype(np.float64)

    def __repr__(self):
        inner = ",\n  ".join(repr(layer) for layer in self.layers)
        return f"Network([\n  {inner}\n])"


def _step(layers, pos, z, tail, ws):
    """Network._run's step through layers[pos]: (its output, the new
    generators it leaves apart or None)."""
    from .layers import VectorConv2d, VectorFlatten, VectorLinear, VectorReLU

    layer = layers[pos]
    if tail is not None:
        if isinstance(layer, VectorFlatten):  # C order: the indices hold
            return layer.forward(z), tail
        res = None
        if isinstance(layer, VectorConv2d) and z.ndim == 4:
            res = _tail_conv(layer, z, *tail, ws.taker(z))
        elif isinstance(layer, VectorLinear) and z.ndim == 2:
            res = _tail_linear(layer, z, *tail, ws.taker(z))
        if res is not None:
            return res, None
        z = _append(z, *tail, ws.taker(z))
    if isinstance(layer, VectorReLU) and _affine_next(layers, pos + 1):
        z, idx, mu = relu_into(as_zonotope(z), chk.num_threads_arg(layer.num_threads), ws.taker(z),
                               apart=True)
        return z, (idx, mu)
    into = getattr(layer, "_forward_into", None)
    return (layer.forward(z) if into is None else into(z, ws.taker(z))), None


def _affine_next(layers, pos) -> bool:
    """Whether the next layer from pos on, past flattens, is a convolution
    or a dense layer (which take a ReLU's new generators apart)."""
    from .layers import VectorConv2d, VectorFlatten, VectorLinear

    for layer in layers[pos:]:
        if not isinstance(layer, VectorFlatten):
            return isinstance(layer, (VectorConv2d, VectorLinear))
    return False


class _Workspace:
    """Two buffers that a network's layers write their outputs into, each
    layer into the one its input is not in, kept from call to call (per
    Python thread): a certification loop reuses warm pages instead of
    faulting in fresh ones for every layer of every image (a 20 MiB
    zonotope's pages cost milliseconds). They grow to the largest
    zonotopes seen, a quarter more for the next image's."""

    def __init__(self):
        self.bufs = [np.empty(0, np.uint8), np.empty(0, np.uint8)]
        self.spare = np.empty(0, np.uint8)

    def scratch(self, shape, dtype):
        """A third buffer, for a step's own temporaries (not an output)."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if self.spare.nbytes < nbytes:
            self.spare = np.empty(0, np.uint8)
            self.spare = np.empty(nbytes + nbytes // 4, np.uint8)
        return self.spare[:nbytes].view(dtype).reshape(shape)

    def taker(self, avoid):
        """alloc(shape, dtype) for a layer whose input is avoid."""
        def alloc(shape, dtype):
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            i = 1 if avoid is not None and np.may_share_memory(self.bufs[0], avoid) else 0
            if self.bufs[i].nbytes < nbytes:
                self.bufs[i] = np.empty(0, np.uint8)  # freed before the larger one is made
                self.bufs[i] = np.empty(nbytes + nbytes // 4, np.uint8)
            return self.bufs[i][:nbytes].view(dtype).reshape(shape)
        return alloc


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


def _conv_layer(L, weight, bias, stride, padding, dilation, dt, nt, where):
    w = _array_of(weight, dt, f"{where}.weight")
    O, C, kh, kw = w.shape if w.ndim == 4 else (None,) * 4
    if O is None:
        raise ValueError(f"{where}: a convolution weight must be 4-D, got shape {w.shape}")
    layer = L.VectorConv2d(C, O, (kh, kw), stride, _conv_padding(padding, (kh, kw), dilation, where),
                           dilation, bias is not None, dt, num_threads=nt)
    layer.weight = w
    layer.bias = _array_of(bias, dt, f"{where}.bias")
    if layer.bias is not None and layer.bias.shape != (O,):
        raise ValueError(f"{where}: bias must have shape ({O},), got {layer.bias.shape}")
    return layer


def _dense_layer(L, weight, bias, dt, nt, where):
    w = _array_of(weight, dt, f"{where}.weight")
    if w.ndim != 2:
        raise ValueError(f"{where}: a dense weight must be 2-D, got shape {w.shape}")
    layer = L.VectorLinear(w.shape[1], w.shape[0], bias is not None, dt, num_threads=nt)
    layer.weight = w
    layer.bias = _array_of(bias, dt, f"{where}.bias")
    if layer.bias is not None and layer.bias.shape != (w.shape[0],):
        raise ValueError(f"{where}: bias must have shape ({w.shape[0]},), got {layer.bias.shape}")
    return layer


def _convert(L, spec, dt, nt, where):
    """One layer of from_layers as its zonotope layer, or None for a no-op."""
    if isinstance(spec, str):
        if spec == "relu":
            return L.VectorReLU(num_threads=nt)
        if spec == "flatten":
            return L.VectorFlatten()
        raise ValueError(f"{where}: unknown layer name {spec!r} (use 'relu' or 'flatten')")
    if isinstance(spec, dict):
        if set(spec) == {"mean", "std"}:
            std = _array_of(spec["std"], np.float64, f"{where}.std")
            if (std == 0).any():
                raise ValueError(f"{where}: std must be nonzero")
            mean = _array_of(spec["mean"], np.float64, f"{where}.mean")
            return L.VectorChannelAffine(1 / std, -mean / std, dtype=dt)
        if "weight" not in spec:
            raise ValueError(f"{where}: a dict layer needs a 'weight' (or is {{'mean', 'std'}})")
        unknown = set(spec) - {"weight", "bias", "stride", "padding", "dilation"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        if np.ndim(spec["weight"]) == 4:
            return _conv_layer(L, spec["weight"], spec.get("bias"), spec.get("stride", 1),
                               spec.get("padding", 0), spec.get("dilation", 1), dt, nt, where)
        if set(spec) - {"weight", "bias"}:
            raise ValueError(f"{where}: stride, padding and dilation are for 4-D (convolution) weights")
        return _dense_layer(L, spec["weight"], spec.get("bias"), dt, nt, where)
    if isinstance(spec, (L.Conv2d, L.VectorConv2d)):
        return _conv_layer(L, spec.weight, spec.bias, spec.stride, spec.padding, spec.dilation, dt,
                           nt, where)
    if isinstance(spec, (L.Linear, L.VectorLinear)):
        return _dense_layer(L, spec.weight, spec.bias, dt, nt, where)
    if isinstance(spec, (L.ReLU, L.VectorReLU)):
        return L.VectorReLU(num_threads=nt)
    if isinstance(spec, (L.Flatten, L.VectorFlatten)):
        return L.VectorFlatten()
    if isinstance(spec, L.VectorChannelAffine):
        return L.VectorChannelAffine(spec.scale, spec.shift, dtype=dt)
    if isinstance(spec, L.VectorAvgPool2d):
        return L.VectorAvgPool2d(spec.kernel_size, spec.stride, spec.padding, divisor=spec.divisor)
    if _is_torch(spec):
        return _convert_torch(L, spec, dt, nt, where)
    raise TypeError(f"{where}: cannot certify through a {type(spec).__name__}")


def _convert_torch(L, m, dt, nt, where):
    """A torch leaf (checked by _torch_leaves) as its zonotope layer, or None."""
    import torch.nn as nn

    if isinstance(m, nn.Conv2d):
        if m.groups != 1 or m.padding_mode != "zeros":
            raise ValueError(f"{where}: only groups=1 and zero padding are supported, got {m!r}")
        return _conv_layer(L, m.weight, m.bias, m.stride, m.padding, m.dilation, dt, nt, where)
    if isinstance(m, nn.Linear):
        return _dense_layer(L, m.weight, m.bias, dt, nt, where)
    if isinstance(m, nn.ReLU):
        return L.VectorReLU(num_threads=nt)
    if isinstance(m, nn.Flatten):
        if m.start_dim != 1 or m.end_dim != -1:
            raise ValueError(f"{where}: only Flatten(start_dim=1, end_dim=-1) is supported, got {m!r}")
        return L.VectorFlatten()
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
        return L.VectorChannelAffine(scale, shift, dtype=dt)
    if isinstance(m, nn.AvgPool2d):
        if m.ceil_mode:
            raise ValueError(f"{where}: AvgPool2d with ceil_mode=True is not supported")
        if not m.count_include_pad and m.padding not in (0, (0, 0)):
            raise ValueError(f"{where}: AvgPool2d with padding needs count_include_pad=True")
        return L.VectorAvgPool2d(m.kernel_size, m.stride, m.padding, divisor=m.divisor_override)
    raise TypeError(f"{where}: cannot certify through torch's {type(m).__name__}")


def _check_norm(spec, spatial: bool, where):
    """A torch batch norm's kind agrees with where it stands."""
    if type(spec).__name__ == "BatchNorm2d" and not spatial:
        raise ValueError(f"{where}: BatchNorm2d needs an image, but the layers before it flatten")
    if type(spec).__name__ == "BatchNorm1d" and spatial:
        raise ValueError(f"{where}: BatchNorm1d after a convolution is not supported")


def _fold(prev, affine, L, where) -> bool:
    """Fold a channel affine into the convolution or dense layer right
    before it (its output channels): True where it was folded."""
    if not isinstance(prev, (L.VectorConv2d, L.VectorLinear)):
        return False
    O = prev.weight.shape[0]
    if affine.channels not in (1, O):
        raise ValueError(f"{where}: {affine.channels} channels, but the layer before it has {O}")
    scale = np.broadcast_to(affine.scale, (O,)).astype(prev.weight.dtype)
    shift = np.broadcast_to(affine.shift, (O,)).astype(prev.weight.dtype)
    prev.weight *= scale.reshape((O,) + (1,) * (prev.weight.ndim - 1))
    prev.bias = shift + (0 if prev.bias is None else prev.bias * scale)
    return True


def _affine_box(affine, x, eps, clip):
    """(x, eps, clip) of the box that a first channel affine maps the box
    ``x +- eps`` clipped to ``clip`` to: its image, a box."""
    shape, centre, half, _ = box(x, eps, clip)
    C = affine.channels
    if C != 1 and shape[0] != C:
        raise ValueError(f"x has {shape[0]} channels (shape {shape}) but the network's first "
                         f"layer normalises {C}")
    per = (-1,) + (1,) * (len(shape) - 1)
    scale = affine.scale.astype(np.float64).reshape(per)
    shift = affine.shift.astype(np.float64).reshape(per)
    return centre.reshape(shape) * scale + shift, half.reshape(shape) * np.abs(scale), None


def _box_conv(x, eps, clip, conv, alloc):
    """conv.forward(from_box(x, eps, clip)) without making the box's
    zonotope: the centre convolved as a one-component image, and each
    generator (one pixel's half-width, zero elsewhere) scattered as the
    weights that meet its pixel. Each generator column of the output is
    one product, as in the dense convolution (whose other terms are
    zeros); only the centre's sum may round differently. None where x is
    not an image for this convolution (the dense path then checks it)."""
    shape, centre, half, free = box(x, eps, clip)
    w = conv.weight
    O, C, kh, kw = w.shape
    if len(shape) != 3 or shape[0] != C:
        return None
    dt = w.dtype
    c_out = conv2d(centre.reshape(shape + (1,)).astype(dt), w, conv.bias, conv.stride, conv.padding,
                   conv.dilation, num_threads=conv.num_threads)
    _, OH, OW, _ = c_out.shape
    out = alloc((O, OH, OW, 1 + free.size), dt)
    out.fill(0)
    out[..., 0] = c_out[..., 0]
    _, H, W = shape
    sh, sw, ph, pw, dh, dw = chk.step_params(conv.stride, conv.padding, conv.dilation)
    gen = np.full(centre.size, -1, np.intp)
    gen[free] = np.arange(free.size)
    scale = half[free].astype(dt)
    for i in range(kh):
        rows = np.arange(OH) * sh - ph + i * dh
        oh = np.flatnonzero((rows >= 0) & (rows < H))
        for j in range(kw):
            cols = np.arange(OW) * sw - pw + j * dw
            ow = np.flatnonzero((cols >= 0) & (cols < W))
            # pixel (c, rows[oh], cols[ow]) meets tap (c, i, j) at output (oh, ow)
            pix = (np.arange(C)[:, None, None] * H + rows[oh][:, None]) * W + cols[ow]
            g = gen[pix]
            c_idx, a, b = np.nonzero(g >= 0)
            gg = g[c_idx, a, b]
            out[:, oh[a], ow[b], 1 + gg] = w[:, c_idx, i, j] * scale[gg]
    return out


# A ReLU's new generators, each mu at one neuron and 0 at every other, need
# not be written out when a convolution or a dense layer follows: that
# layer's output column of such a generator is one product a neuron (the
# dense product would add zeros to it), scattered. Network does this; the
# results are those of the dense form, to the bit.

def _tail_conv(conv, z, idx, mu, alloc):
    """conv.forward of z with the new generators (idx, mu) appended, for
    an unbatched (C, H, W, E) z: the tiles over z, the generators
    scattered."""
    x5, weight, _, geom = chk.vector_conv_args(z, conv.weight, conv.stride, conv.padding,
                                               conv.dilation)
    _, C, H, W, E = x5.shape
    O, k, dt = weight.shape[0], idx.size, weight.dtype
    b = chk.bias_arg(conv.bias, O, dt)
    out = alloc((1, O, geom.OH, geom.OW, E + k), dt)
    tiles_forward(x5, weight, b, out[..., :E], geom.window, chk.num_threads_arg(conv.num_threads),
                  skip_zero_taps=True)
    _scatter_tail(out[0, ..., E:], idx, mu, weight, geom.window, H, W)
    return out[0]


def _scatter_tail(tail, idx, mu, weight, window: chk.Window, H, W):
    """tail (O, OH, OW, k) = the convolution (by window) of the k
    generators that are mu[g] at neuron idx[g] of a (C, H, W) image and
    0 elsewhere: one product an output."""
    kh, kw, sh, sw, ph, pw, dh, dw = window
    _, OH, OW, k = tail.shape
    tail.fill(0)
    c, h, w = idx // (H * W), idx // W % H, idx % W
    # neuron row h meets tap row i at output row rh / sh (and so for columns): every tap at once
    rh = h[:, None] + ph - np.arange(kh) * dh  # (k, kh)
    rw = w[:, None] + pw - np.arange(kw) * dw  # (k, kw)
    okh = (rh % sh == 0) & (rh >= 0) & (rh < OH * sh)
    okw = (rw % sw == 0) & (rw >= 0) & (rw < OW * sw)
    g, i, j = np.nonzero(okh[:, :, None] & okw[:, None, :])
    tail[:, rh[g, i] // sh, rw[g, j] // sw, g] = weight[:, c[g], i, j] * mu[g]


def _tail_linear(dense, z, idx, mu, alloc):
    """dense.forward of z with the new generators (idx, mu) appended, for
    an unbatched (D, E) z."""
    weight = dense.weight
    if z.dtype != weight.dtype or z.shape[0] != weight.shape[1]:
        return None
    O, E, k = weight.shape[0], z.shape[1], idx.size
    out = alloc((O, E + k), z.dtype)
    b = chk.bias_arg(dense.bias, O, z.dtype)
    dense_into(chk.contiguous(z, z.dtype), weight, b, out[:, :E], chk.num_threads_arg(dense.num_threads))
    np.multiply(weight[:, idx], mu, out=out[:, E:])
    return out


def _append(z, idx, mu, alloc):
    """z with the new generators (idx, mu) written out."""
    E, k = z.shape[-1], idx.size
    out = alloc(z.shape[:-1] + (E + k,), z.dtype)
    out[..., :E] = z
    out[..., E:] = 0
    out.reshape(-1, E + k)[idx, E + np.arange(k)] = mu
    return out


# The banded head. After a first convolution, the generator of input pixel
# (c, h, w) is zero in every output row whose window misses row h: with the
# generators in (h, w, c) order, output row r of the convolution holds
# nonzeros only in a band [lo[r], hi[r]) of generators. The first
# convolution and its ReLU then keep each row's band alone ("banded
# storage": row r's columns 1.. are generators lo[r]..), and the second
# convolution reads, for each of its output rows, the bands of the rows in
# its window. Generators in (h, w, c) order rather than C order change no
# certificate (bounds and margins sum over generators in any order).

def _banded_head(x, eps, clip, conv1, relu, conv2, ws, times):
    """conv2(relu(conv1(box))) of an image x, by bands; None where x is not
    an image for conv1 or conv2 does not take conv1's output (the general
    path then checks it). The ReLU's new generators follow the box's."""
    shape, centre, half, _ = box(x, eps, clip)
    w1, w2 = conv1.weight, conv2.weight
    if len(shape) != 3 or shape[0] != w1.shape[1] or w2.shape[1] != w1.shape[0] \
            or w2.dtype != w1.dtype:
        return None
    t0 = time.perf_counter()
    C, H, W = shape
    dt = w1.dtype
    # the free pixels (whose box is not a point), in (h, w, c) order
    order = np.arange(C * H * W).reshape(C, H, W).transpose(1, 2, 0).ravel()
    pix = order[half[order] > 0]
    n = pix.size
    gen = np.full(C * H * W, -1, np.intp)
    gen[pix] = np.arange(n)
    row_start = np.searchsorted(pix // W % H, np.arange(H + 1))  # pixel row h: [row_start[h], row_start[h + 1])
    c_out = conv2d(centre.reshape(shape + (1,)).astype(dt), w1, conv1.bias, conv1.stride, conv1.padding,
                   conv1.dilation, num_threads=conv1.num_threads)
    O1, OH1, OW1, _ = c_out.shape
    kh, kw = w1.shape[2:]
    sh, sw, ph, pw, dh, dw = chk.step_params(conv1.stride, conv1.padding, conv1.dilation)
    top = np.arange(OH1) * sh - ph
    lo = row_start[np.clip(top, 0, H)]
    hi = row_start[np.clip(top + (kh - 1) * dh + 1, 0, H)]
    band = int((hi - lo).max())
    zb = ws.taker(None)((O1, OH1, OW1, 1 + band), dt)
    zb.fill(0)
    zb[..., 0] = c_out[..., 0]
    # pixel (c, rows[r, i], cols[q, j]) meets tap (c, i, j) at output (r, q): every tap at once
    rows = top[:, None] + np.arange(kh) * dh  # (OH1, kh)
    cols = np.arange(OW1)[:, None] * sw - pw + np.arange(kw) * dw  # (OW1, kw)
    inside = ((rows >= 0) & (rows < H))[None, :, :, None, None] & ((cols >= 0) & (cols < W))[None, None, None]
    flat = (np.arange(C)[:, None, None, None, None] * H + rows[None, :, :, None, None]) * W \
        + cols[None, None, None]  # (C, OH1, kh, OW1, kw)
    g = np.where(inside, gen[np.where(inside, flat, 0)], -1)
    c_idx, r, i, q, j = np.nonzero(g >= 0)
    gg = g[c_idx, r, i, q, j]
    zb[:, r, q, 1 + gg - lo[r]] = w1[:, c_idx, i, j] * half[pix[gg]].astype(dt)
    t1 = time.perf_counter()
    # the ReLU on banded storage: a row's zeros beyond its band change nothing
    zr, idx, mu = relu_into(zb, chk.num_threads_arg(relu.num_threads), ws.taker(zb), apart=True)
    t2 = time.perf_counter()
    x5, _, _, geom = chk.vector_conv_args(np.broadcast_to(np.zeros((), dt), (O1, OH1, OW1, 1)),
                                          w2, conv2.stride, conv2.padding, conv2.dilation)
    kh2, kw2, sh2, sw2, ph2, pw2, dh2, dw2, OH2, OW2 = geom
    O2, k = w2.shape[0], idx.size
    out = ws.taker(zr)((O2, OH2, OW2, 1 + n + k), dt)
    b2, nt2 = chk.bias_arg(conv2.bias, O2, dt), chk.num_threads_arg(conv2.num_threads)
    for r in range(OH2):
        rows = r * sh2 - ph2 + np.arange(kh2) * dh2
        inside = np.flatnonzero((rows >= 0) & (rows < OH1))
        u_lo = int(lo[rows[inside]].min()) if inside.size else 0
        u_hi = int(hi[rows[inside]].max()) if inside.size else 0
        slab = ws.scratch((O1, kh2, OW1, 1 + u_hi - u_lo), dt)  # the window's rows, their bands aligned
        slab.fill(0)
        for t in inside:
            rr = rows[t]
            width = int(hi[rr] - lo[rr])
            slab[:, t, :, 0] = zr[:, rr, :, 0]
            slab[:, t, :, 1 + lo[rr] - u_lo:1 + lo[rr] - u_lo + width] = zr[:, rr, :, 1:1 + width]
        # the slab's rows are the window's (stride, padding and dilation in
        # rows done), and a dead neuron's vector is left out by the tiles
        res = np.empty((1, O2, 1, OW2, slab.shape[-1]), dt)
        tiles_forward(slab[None], w2, b2, res, chk.Window(kh2, kw2, 1, sw2, 0, pw2, 1, dw2), nt2,
                      skip_zero_taps=True)
        res = res[0]
        row = out[:, r]
        row[..., 0] = res[:, 0, :, 0]
        row[..., 1:1 + u_lo] = 0
        row[..., 1 + u_lo:1 + u_hi] = res[:, 0, :, 1:]
        row[..., 1 + u_hi:1 + n] = 0
    _scatter_tail(out[..., 1 + n:], idx, mu, w2, geom.window, OH1, OW1)
    if times is not None:
        t3 = time.perf_counter()
        times["VectorConv2d"] = times.get("VectorConv2d", 0.0) + (t1 - t0) + (t3 - t2)
        times["VectorReLU"] = times.get("VectorReLU", 0.0) + (t2 - t1)
    return out
