"""The zonotope functions: the input box, bounds, the DeepZ ReLU, the
dense layer, flatten, certify (cypool.zonotope's docstring)."""
from __future__ import annotations

import numpy as np

from .. import _checks as chk
from ..vector_conv import vector_conv2d as conv2d
from ._ops import as_zonotope, bounds_rows, dense_into, from_box_into, relu_into, rows

__all__ = ["from_box", "bounds", "relu", "linear", "flatten", "conv2d", "certify"]


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
        element (the valid pixel range); lo and hi are numbers or arrays
        that broadcast to x (per channel: shape ``(C, 1, 1)``). None does
        not clip.
    dtype : float64 (default) or float32

    Returns
    -------
    z : ndarray, shape ``x.shape + (1 + n,)``
        Component 0 is the box's midpoint; element ``i`` of x (in C order)
        gets its own generator of half the box's width, except elements
        whose box is a point (``eps == 0``, or clipped to one value), which
        get none: n counts the others.
    """
    return from_box_into(x, eps, clip, chk.float_dtype_arg(dtype), np.empty)


def bounds(z, *, num_threads=None):
    """The interval of every neuron of zonotope z.

    Returns
    -------
    (lower, upper) : ndarrays of shape ``z.shape[:-1]``
        The centre minus and plus the sum of the generators' absolute
        values.
    """
    z = as_zonotope(z)
    nt = chk.num_threads_arg(num_threads)
    lower, upper = bounds_rows(rows(z), nt)
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
    z = as_zonotope(z)
    return relu_into(z, chk.num_threads_arg(num_threads), np.empty)


def flatten(z) -> np.ndarray:
    """``(C, H, W, E)`` to ``(C*H*W, E)``, batched ``(N, C, H, W, E)`` to
    ``(N, C*H*W, E)``: torch's flatten order (a view where z is contiguous)."""
    z = as_zonotope(z, ndims=(4, 5))
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
    vector convolution's register tiles, on blocks of components the
    threads claim), not numpy's BLAS: a BLAS thread pool keeps spinning
    for about 0.1 s after each product and starves the next kernel's
    threads on a small machine (docs/performance.md). Each block of
    components multiplies only the neurons (rows of z) that are not all
    zero in it: dead neurons, and those its generators do not reach. The
    result is the same; where a weight is inf or NaN every row is used,
    so that inf times 0 gives NaN as in torch.
    """
    z = as_zonotope(z, ndims=(2, 3))
    weight, _ = chk.array(weight, "weight", (2,), floating_only=True)
    if weight.dtype != z.dtype:
        raise TypeError(f"weight dtype {weight.dtype} must match z dtype {z.dtype}")
    D = z.shape[-2]
    if weight.shape[1] != D:
        raise ValueError(f"weight has {weight.shape[1]} input features but z has {D} neurons "
                         f"(z shape {z.shape})")
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
    dense_into(chk.contiguous(z, z.dtype), weight, b, out, nt)
    return out


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
    z = as_zonotope(z_logits, "z_logits", (2, 3))
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
