"""Zonotopes for certifying networks: DeepZ, end to end.

A zonotope is a numpy array whose last axis holds, for every neuron,
component 0 (the centre) and then the generators: neuron ``i`` takes the
values ``z[i, 0] + sum_j z[i, j] * e_j`` for every choice of the error terms
``e_j`` in ``[-1, 1]``, the same ``e_j`` for all neurons. An image is
``(C, H, W, E)``, the layout :func:`cypool.vector_conv2d` convolves, and a
dense activation ``(D, E)``: the dense form of ELINA's affine forms, with
the generators last.

Certifying one image against an L-infinity perturbation of ``eps``::

    z = from_box(x, eps)                      # (C, H, W, 1 + n)
    z = conv2d(z, w1, b1, stride=2)           # cypool.vector_conv2d
    z = relu(z)                               # DeepZ: grows E
    z = linear(flatten(z), w2, b2)            # (O, E)
    ok = certify(z, label)

or :class:`Network` for a whole trained stack. Results are not sound under
floating-point rounding: every bound is computed in the array's dtype with
ordinary rounding (as the DeepZ of the Adversarial Robustness Toolbox and
the PyTorch zonotopes of MN-BaB do; ERAN's ELINA rounds outwards and is
sound). float64, the default, keeps the error far below any margin that
matters; float32 runs about twice as fast.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from . import _checks as chk
from ._backend import kernel, padded_columns, threads_for, work
from .vector_conv import vector_conv2d as conv2d

__all__ = ["from_box", "bounds", "relu", "linear", "flatten", "conv2d", "certify", "Network"]


def _zonotope(z, name: str = "z", ndims: tuple | None = None) -> np.ndarray:
    """z checked: a float32/float64 array with a component axis (its last)
    and no empty dimension."""
    z, _ = chk.array(z, name, ndims or tuple(range(1, 33)), floating_only=True)
    return z


def _real_array(v, name: str) -> np.ndarray:
    """v as a float64 array of finite values (bools and non-numbers refused)."""
    a = np.asarray(v)
    if a.dtype == object or a.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be real numbers, got dtype {a.dtype}")
    a = a.astype(np.float64, copy=False)
    if not np.isfinite(a).all():
        raise ValueError(f"{name} must be finite")
    return a


def _clip_arg(clip) -> tuple[float, float]:
    if clip is None:
        return -np.inf, np.inf
    if not isinstance(clip, (tuple, list)) or len(clip) != 2:
        raise ValueError(f"clip must be None or a pair (lo, hi), got {clip!r}")
    lo, hi = (_real_array(c, "clip") if np.ndim(c) == 0 else None for c in clip)
    if lo is None or hi is None:
        raise ValueError(f"clip must be None or a pair of numbers (lo, hi), got {clip!r}")
    lo, hi = float(lo), float(hi)
    if not lo <= hi:
        raise ValueError(f"clip must be in order, lo <= hi, got {clip!r}")
    return lo, hi


def from_box(x, eps, clip=(0.0, 1.0), *, dtype=np.float64) -> np.ndarray:
    """The zonotope of the box ``x +- eps``, clipped to ``clip``.

    Parameters
    ----------
    x : array_like
        The point (an image ``(C, H, W)``, or flat), finite.
    eps : float or array_like broadcastable to x
        Half-width of the box, finite and >= 0.
    clip : (lo, hi) or None
        The box is ``[max(x - eps, lo), min(x + eps, hi)]`` element by
        element (the valid pixel range); None does not clip.
    dtype : float64 (default) or float32

    Returns
    -------
    z : ndarray, shape ``x.shape + (1 + n,)``
        Component 0 is the box's midpoint; element ``i`` of x (in C order)
        gets its own generator of half the box's width, except elements
        whose box is a point (``eps == 0``, or clipped to one value), which
        get none: n counts the others.
    """
    return _from_box(x, eps, clip, chk.float_dtype_arg(dtype), np.empty)


def _from_box(x, eps, clip, dt: np.dtype, alloc) -> np.ndarray:
    """from_box, its output from alloc(shape, dtype)."""
    shape, centre, half, free = _box(x, eps, clip)
    z = alloc((centre.size, 1 + free.size), dt)
    z.fill(0)
    z[:, 0] = centre
    z[free, 1 + np.arange(free.size)] = half[free]
    return z.reshape(shape + (1 + free.size,))


def _box(x, eps, clip):
    """The checked box: (x's shape, its flat midpoint and half-widths,
    float64, and the flat indices of the elements whose box is not a
    point)."""
    xa = _real_array(x, "x")
    if xa.ndim == 0 or xa.size == 0:
        raise ValueError(f"x must have at least one element and one dimension, got shape {xa.shape}")
    ea = _real_array(eps, "eps")
    if (ea < 0).any():
        raise ValueError("eps must be >= 0")
    try:
        ea = np.broadcast_to(ea, xa.shape)
    except ValueError:
        raise ValueError(f"eps of shape {ea.shape} does not broadcast to x's shape {xa.shape}") from None
    lo, hi = _clip_arg(clip)
    blo = np.maximum(xa - ea, lo)
    bhi = np.minimum(xa + ea, hi)
    if (blo > bhi).any():
        raise ValueError(f"x lies farther than eps outside clip={clip!r}: the box is empty")
    half = ((bhi - blo) / 2).ravel()
    return xa.shape, ((blo + bhi) / 2).ravel(), half, np.flatnonzero(half > 0)


def _box_conv(x, eps, clip, conv, alloc):
    """conv.forward(from_box(x, eps, clip)) without making the box's
    zonotope: the centre convolved as a one-component image, and each
    generator (one pixel's half-width, zero elsewhere) scattered as the
    weights that meet its pixel. Each generator column of the output is
    one product, as in the dense convolution (whose other terms are
    zeros); only the centre's sum may round differently. None where x is
    not an image for this convolution (the dense path then checks it)."""
    shape, centre, half, free = _box(x, eps, clip)
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


def _rows(z: np.ndarray) -> np.ndarray:
    """z as C-contiguous (neurons, E): a view when it already is one."""
    return np.ascontiguousarray(z).reshape(-1, z.shape[-1])


def _bounds_rows(z2: np.ndarray, nt: int):
    n = z2.shape[0]
    lower = np.empty(n, z2.dtype)
    upper = np.empty(n, z2.dtype)
    threads = threads_for(nt, z2.size, n)
    kernel("zono_bounds", z2.dtype)(z2, lower, upper, threads)
    return lower, upper


def bounds(z, *, num_threads=None):
    """The interval of every neuron of zonotope z.

    Returns
    -------
    (lower, upper) : ndarrays of shape ``z.shape[:-1]``
        The centre minus and plus the sum of the generators' absolute
        values.
    """
    z = _zonotope(z)
    nt = chk.num_threads_arg(num_threads)
    lower, upper = _bounds_rows(_rows(z), nt)
    return lower.reshape(z.shape[:-1]), upper.reshape(z.shape[:-1])


def relu(z, *, num_threads=None) -> np.ndarray:
    """The DeepZ ReLU transformer.

    Per neuron, with ``l``, ``u`` its bounds: ``u <= 0`` gives 0; ``l >= 0``
    leaves the neuron unchanged; otherwise (unstable), with ``lam = u / (u -
    l)`` and ``mu = -lam * l / 2``, the centre becomes ``lam * c + mu``, the
    generators ``lam * g``, and one new generator is appended, equal to
    ``mu`` at this neuron and 0 at every other.

    All leading axes are neurons of one zonotope. The new generators follow
    the old ones in the order of their neurons in z (C order): the k-th
    unstable neuron owns component ``E + k``.

    Returns
    -------
    out : C-contiguous ndarray, shape ``z.shape[:-1] + (E + n_unstable,)``
        Written in one pass into a fresh array (no one-hot block is built).

    Raises ValueError where a bound is not finite (an inf or NaN in z, or
    a sum that overflowed): no relaxation is sound there.
    """
    z = _zonotope(z)
    return _relu(z, chk.num_threads_arg(num_threads), np.empty)


def _relu(z: np.ndarray, nt: int, alloc, apart: bool = False):
    """relu of a checked z, its output from alloc(shape, dtype). apart:
    return (the old components, the unstable neurons' flat indices, their
    new generators' values) instead, the new generators not written."""
    z2 = _rows(z)
    lower, upper = _bounds_rows(z2, nt)
    if not (np.isfinite(lower).all() and np.isfinite(upper).all()):
        raise ValueError("z has a neuron whose bounds are not finite (inf or NaN in z)")
    unstable = (lower < 0) & (upper > 0)
    slot = np.cumsum(unstable, dtype=np.int64)
    k = int(slot[-1])
    slot -= 1
    n, E = z2.shape
    F = E if apart else E + k
    out = alloc((n, F), z.dtype)
    threads = threads_for(nt, z2.size + out.size, n)
    kernel("zono_relu", z.dtype)(z2, lower, upper, slot, out, threads)
    out = out.reshape(z.shape[:-1] + (F,))
    if not apart:
        return out
    idx = np.flatnonzero(unstable)
    lam = upper[idx] / (upper[idx] - lower[idx])  # as the kernel computes them
    return out, idx, -lam * lower[idx] / 2


# A ReLU's new generators, each mu at one neuron and 0 at every other, need
# not be written out when a convolution or a dense layer follows: that
# layer's output column of such a generator is one product a neuron (the
# dense product would add zeros to it), scattered. Network does this; the
# results are those of the dense form, to the bit.

def _tail_conv(conv, z, idx, mu, alloc):
    """conv.forward of z with the new generators (idx, mu) appended, for
    an unbatched (C, H, W, E) z: the tiles over z, the generators
    scattered."""
    from .vector_conv import tiles_forward

    x5, weight, _, (geom, (OH, OW)) = chk.vector_conv_args(z, conv.weight, conv.stride, conv.padding,
                                                           conv.dilation)
    kh, kw, sh, sw, ph, pw, dh, dw = geom
    _, C, H, W, E = x5.shape
    O, k, dt = weight.shape[0], idx.size, weight.dtype
    b = chk.bias_arg(conv.bias, O, dt)
    out = alloc((1, O, OH, OW, E + k), dt)
    tiles_forward(x5, weight, b, out[..., :E], geom, chk.num_threads_arg(conv.num_threads))
    tail = out[0, ..., E:]
    tail.fill(0)
    c, h, w = idx // (H * W), idx // W % H, idx % W
    g = np.arange(k)
    for i in range(kh):
        rh = h + ph - i * dh  # neuron row h meets tap row i at output row rh / sh
        okh = (rh % sh == 0) & (rh >= 0) & (rh < OH * sh)
        for j in range(kw):
            rw = w + pw - j * dw
            m = okh & (rw % sw == 0) & (rw >= 0) & (rw < OW * sw)
            tail[:, rh[m] // sh, rw[m] // sw, g[m]] = weight[:, c[m], i, j] * mu[m]
    return out[0]


def _tail_linear(dense, z, idx, mu, alloc):
    """dense.forward of z with the new generators (idx, mu) appended, for
    an unbatched (D, E) z."""
    weight = dense.weight
    if z.dtype != weight.dtype or z.shape[0] != weight.shape[1]:
        return None
    O, E, k = weight.shape[0], z.shape[1], idx.size
    out = alloc((O, E + k), z.dtype)
    b = chk.bias_arg(dense.bias, O, z.dtype)
    _dense_into(chk.contiguous(z, z.dtype), weight, b, out[:, :E], chk.num_threads_arg(dense.num_threads))
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


def flatten(z) -> np.ndarray:
    """``(C, H, W, E)`` to ``(C*H*W, E)``, batched ``(N, C, H, W, E)`` to
    ``(N, C*H*W, E)``: torch's flatten order (a view where z is contiguous)."""
    z = _zonotope(z, ndims=(4, 5))
    return z.reshape(-1, z.shape[-1]) if z.ndim == 4 else z.reshape(z.shape[0], -1, z.shape[-1])


def linear(z, weight, bias=None, *, out=None, num_threads=None) -> np.ndarray:
    """A dense layer on a zonotope: ``torch.nn.functional.linear`` on each
    component, the bias on component 0 only.

    Parameters
    ----------
    z : ndarray, shape (D, E) or batched (N, D, E), float32 or float64
    weight : ndarray, shape (O, D), z's dtype
    bias : ndarray, shape (O,), or None
    out : ndarray, optional, keyword-only
        C-contiguous array of the output's shape and dtype to write into
        (numpy's meaning), not overlapping z.
    num_threads : int or None, keyword-only
        None follows OpenMP's default.

    Returns
    -------
    out : C-contiguous ndarray, shape (O, E) or (N, O, E)

    One matrix product over all components, in cypool's own threads (the
    vector convolution's register tiles, as a 1 x 1 convolution of one
    pixel whose E components the threads share), not numpy's BLAS: a
    BLAS thread pool keeps spinning for about 0.1 s after each product
    and starves the next kernel's threads on a small machine
    (docs/performance.md).
    """
    z = _zonotope(z, ndims=(2, 3))
    weight, _ = chk.array(weight, "weight", (2,), floating_only=True)
    if weight.dtype != z.dtype:
        raise TypeError(f"weight dtype {weight.dtype} must match z dtype {z.dtype}")
    D = z.shape[-2]
    if weight.shape[1] != D:
        raise ValueError(f"weight has {weight.shape[1]} input features but z has {D} neurons "
                         f"(z shape {z.shape}; flatten a (C, H, W, E) zonotope first)")
    b = chk.bias_arg(bias, weight.shape[0], z.dtype)
    nt = chk.num_threads_arg(num_threads)
    shape = z.shape[:-2] + (weight.shape[0], z.shape[-1])
    if out is None:
        out = np.empty(shape, z.dtype)
    else:
        out = chk.out_arg(out, shape, z.dtype)
        chk.no_overlap(out, z, xname="z")
        chk.no_overlap(out, weight, xname="weight")
        chk.no_overlap(out, b, xname="bias")
    _dense_into(chk.contiguous(z, z.dtype), weight, b, out, nt)
    return out


# Bytes of a weight block (a chunk of output channels) kept in cache while
# the threads sweep E: beyond it, every E block would stream the whole
# weight matrix from memory (a 1000 x 1568 float64 layer ran 2.9x slower
# than in one block of 128 channels).
_DENSE_BLOCK_BYTES = 1 << 20


def _dense_into(z: np.ndarray, weight: np.ndarray, b: np.ndarray, out: np.ndarray, nt: int) -> None:
    """out (..., O, E) = weight (O, D) @ z (..., D, E), C-contiguous, and b
    (or nothing, where empty) on component 0."""
    O, D = weight.shape
    E, dt = z.shape[-1], z.dtype
    oc = max(4, _DENSE_BLOCK_BYTES // (D * dt.itemsize) // 4 * 4)
    fn = kernel("vector_conv2d_forward", dt)
    z3, out3 = z.reshape(-1, D, E), out.reshape(-1, O, E)
    threads = threads_for(nt, work(O * D * E, (O + D) * E), -(-E // 48))
    for o0 in range(0, O, oc):
        o1 = min(O, o0 + oc)
        wt = padded_columns(weight[o0:o1].T)  # (D, channels padded): one row per input neuron
        bb = padded_columns(b[None, o0:o1])[0] if b.size else b
        for n in range(z3.shape[0]):
            fn(z3[n].reshape(1, D, 1, 1, E), wt, bb, out3[n, o0:o1].reshape(1, o1 - o0, 1, 1, E),
               1, 1, 1, 1, 0, 0, 1, 1, E, threads)




def _label_arg(label, K: int, batch):
    if batch is None:
        lab = chk.as_int(label, "label")
        if not 0 <= lab < K:
            raise ValueError(f"label must be in [0, {K}), got {lab}")
        return lab
    lab = np.asarray(label)
    if lab.dtype.kind not in "iu" or lab.shape != (batch,):
        raise ValueError(f"label must be {batch} integers for a batch of {batch}, got {label!r}")
    if ((lab < 0) | (lab >= K)).any():
        raise ValueError(f"label must be in [0, {K}), got {lab}")
    return lab.astype(np.intp)


def certify(z_logits, label, *, return_margins=False):
    """Whether no point of the zonotope can be classified other than label.

    Parameters
    ----------
    z_logits : ndarray, shape (K, E) or batched (N, K, E)
        The logits' zonotope.
    label : int, or N ints for a batch
    return_margins : bool
        Also return the margins.

    Returns
    -------
    certified : bool (an (N,) bool array for a batch)
        True when, for every other class j, the lower bound of
        ``z[label] - z[j]`` (centres and generators subtracted, then
        bounded) is > 0.
    margins : ndarray, shape (K,) or (N, K), with return_margins
        Those lower bounds; the label's own entry is +inf.
    """
    z = _zonotope(z_logits, "z_logits", (2, 3))
    batch = z.shape[0] if z.ndim == 3 else None
    z3 = z if batch is not None else z[None]
    K = z3.shape[1]
    lab = _label_arg(label, K, batch)
    labs = np.atleast_1d(lab)
    if not np.isfinite(z3).all():
        raise ValueError("z_logits must be finite")
    d = z3[np.arange(z3.shape[0]), labs][:, None, :] - z3  # (N, K, E)
    margins = d[..., 0] - np.abs(d[..., 1:]).sum(axis=-1)
    margins[np.arange(z3.shape[0]), labs] = np.inf
    ok = (margins > 0).all(axis=1)
    if batch is None:
        ok, margins = bool(ok[0]), margins[0]
    return (ok, margins) if return_margins else ok


class Network:
    """A network run on zonotopes: a list of zonotope layers
    (:class:`cypool.VectorConv2d`, :class:`cypool.VectorReLU`,
    :class:`cypool.VectorFlatten`, :class:`cypool.VectorLinear`, or any
    object with ``forward(z)``), applied in order.

    Build it from a trained network with :meth:`from_layers`; certify an
    input with :meth:`certify`.
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
              their Vector counterparts);
            * ``torch.nn.Conv2d`` (groups 1, zero padding), ``Linear``,
              ``ReLU``, ``Flatten`` (nested ``Sequential`` too);
            * plain numpy weights: a dict ``{"weight": w, "bias": b}``,
              with ``stride``, ``padding``, ``dilation`` for a 4-D
              (convolution) weight, a 2-D weight being a dense layer;
            * the strings ``"relu"`` and ``"flatten"``.

            A dense layer right after a convolution (or its ReLU) gets the
            flatten inserted, as torch's flatten order.
        dtype : float64 (default) or float32
            The weights are copied in this dtype.
        num_threads : int or None
            For every layer.
        """
        from . import layers as L  # layers.py imports this module's functions

        dt = chk.float_dtype_arg(dtype)
        chk.num_threads_arg(num_threads)
        if _is_torch(layers):
            layers = list(_torch_leaves(layers))
        elif not isinstance(layers, (list, tuple)):
            raise TypeError(f"layers must be a list, a tuple or a torch.nn.Sequential, got "
                            f"{type(layers).__name__}")
        out = []
        spatial = False  # whether the zonotope is (C, H, W, E) at this point
        for i, spec in enumerate(layers):
            layer = _convert(L, spec, dt, num_threads, f"layers[{i}]")
            if isinstance(layer, L.VectorLinear) and spatial:
                out.append(L.VectorFlatten().eval())
                spatial = False
            if isinstance(layer, L.VectorConv2d):
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
            z, tail = _step(layers, pos, z, tail, ws)
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
        the result and the margins).

        times : dict, optional
            Gets the seconds of each step added: per layer type (the input
            box is counted with a first convolution, which convolves it
            directly), and ``"certify"``.
        """
        from .layers import VectorConv2d  # layers.py imports this module's functions

        t0 = time.perf_counter()
        ws = self._workspace()
        layers = self.layers
        z = None
        if layers and isinstance(layers[0], VectorConv2d):  # a first convolution skips the box
            z = _box_conv(x, eps, clip, layers[0], ws.taker(None))
        if z is None:
            z = _from_box(x, eps, clip, self._dtype(), ws.taker(None))
            key = "from_box"
        else:
            layers = layers[1:]
            key = "VectorConv2d"
        if times is not None:
            times[key] = times.get(key, 0.0) + time.perf_counter() - t0
        z = self._run(z, ws, layers, times)
        t0 = time.perf_counter()
        res = certify(z, label, return_margins=return_margins)
        if times is not None:
            times["certify"] = times.get("certify", 0.0) + time.perf_counter() - t0
        return res

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
        z, idx, mu = _relu(_zonotope(z), chk.num_threads_arg(layer.num_threads), ws.taker(z),
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
    return type(obj).__module__.startswith("torch.")


def _torch_leaves(module):
    """The leaf modules of a torch module, in order (nested Sequentials opened)."""
    children = list(module.children())
    if not children:
        yield module
    for child in children:
        yield from _torch_leaves(child)


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
    """One layer of from_layers as its zonotope layer."""
    if isinstance(spec, str):
        if spec == "relu":
            return L.VectorReLU(num_threads=nt)
        if spec == "flatten":
            return L.VectorFlatten()
        raise ValueError(f"{where}: unknown layer name {spec!r} (use 'relu' or 'flatten')")
    if isinstance(spec, dict):
        if "weight" not in spec:
            raise ValueError(f"{where}: a dict layer needs a 'weight'")
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
    if _is_torch(spec):
        return _convert_torch(L, spec, dt, nt, where)
    raise TypeError(f"{where}: cannot certify through a {type(spec).__name__}")


def _convert_torch(L, m, dt, nt, where):
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
        return L.VectorFlatten()
    raise TypeError(f"{where}: cannot certify through torch's {type(m).__name__}")
