"""Network: a whole network run on zonotopes, fast (docs/performance.md).

It keeps two buffers the layers write into in turn, from call to call,
and takes the fused paths of _fused.py where its layers allow: the input
box convolved directly, the first convolutions by row bands, a ReLU's new
generators handed to the next layer apart. Each changes no answer.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from .. import _checks as chk
from ..layers import VectorConv2d
from ._convert import layers_of
from ._functions import certify
from ._fused import append_tail, banded_head, box_conv, tail_conv, tail_linear
from ._layers import VectorChannelAffine, VectorFlatten, VectorLinear, VectorReLU
from ._ops import as_zonotope, box, from_box_into, relu_into

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
        return cls(layers_of(layers, dtype, num_threads))

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
        generators to that layer apart (see tail_conv). times: a dict
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
            z = append_tail(z, *tail, ws.taker(z))
        return z

    def predict(self, x) -> np.ndarray:
        """The network's output on the point x (a zonotope with no generator)."""
        return self.forward(np.asarray(x, dtype=self._dtype())[..., None])[..., 0]

    def certify(self, x, eps, label, *, clip=(0.0, 1.0), return_margins=False, times=None):
        """Whether every input in the box ``x +- eps`` (clipped to ``clip``)
        is classified as label: :func:`certify` of the output of
        :func:`from_box`, in the network's dtype (see :func:`certify` for
        the result and the margins). It takes the structure of the box's
        generators into account (by row bands, the generators in the order
        of the pixels they reach, through a first convolution, ReLU and
        convolution), which changes no answer: the margins are those of
        the layers one by one, to rounding.

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
            head = banded_head(x, eps, clip, *layers[:3], ws, times)
            if head is not None:
                z, layers, t0 = head, layers[3:], None
        if z is None and layers and isinstance(layers[0], VectorConv2d):  # skips the box
            z = box_conv(x, eps, clip, layers[0], ws.taker(None))
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
    layer = layers[pos]
    if tail is not None:
        if isinstance(layer, VectorFlatten):  # C order: the indices hold
            return layer.forward(z), tail
        res = None
        if isinstance(layer, VectorConv2d) and z.ndim == 4:
            res = tail_conv(layer, z, *tail, ws.taker(z))
        elif isinstance(layer, VectorLinear) and z.ndim == 2:
            res = tail_linear(layer, z, *tail, ws.taker(z))
        if res is not None:
            return res, None
        z = append_tail(z, *tail, ws.taker(z))
    if isinstance(layer, VectorReLU) and _affine_next(layers, pos + 1):
        z, idx, mu = relu_into(as_zonotope(z), chk.num_threads_arg(layer.num_threads), ws.taker(z),
                               apart=True)
        return z, (idx, mu)
    into = getattr(layer, "_forward_into", None)
    return (layer.forward(z) if into is None else into(z, ws.taker(z))), None


def _affine_next(layers, pos) -> bool:
    """Whether the next layer from pos on, past flattens, is a convolution
    or a dense layer (which take a ReLU's new generators apart)."""
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
