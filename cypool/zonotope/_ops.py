"""The zonotope passes behind the functions, the layers and Network: checks of a zonotope and of an input box, the
box's zonotope, each neuron's bounds, the DeepZ ReLU and the dense layer,
each into an output that the caller allocates (np.empty, or a Network's
reused buffers)."""
from __future__ import annotations

import numpy as np

from .. import _checks as chk
from .._backend import kernel, threads_for, work


def as_zonotope(z, name: str = "z", ndims: tuple | None = None) -> np.ndarray:
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


def _clip_arg(clip, shape):
    """clip as (lo, hi): numbers, or arrays that broadcast to x's shape
    (per channel: ``(C, 1, 1)`` for a ``(C, H, W)`` image)."""
    if clip is None:
        return -np.inf, np.inf
    if not isinstance(clip, (tuple, list)) or len(clip) != 2:
        raise ValueError(f"clip must be None or a pair (lo, hi), got {clip!r}")
    lo, hi = (_real_array(c, "clip") for c in clip)
    for c in (lo, hi):
        try:
            np.broadcast_to(c, shape)
        except ValueError:
            raise ValueError(f"clip's bounds of shape {c.shape} do not broadcast to x's shape "
                             f"{shape}") from None
    if not (lo <= hi).all():
        raise ValueError(f"clip must be in order, lo <= hi, got {clip!r}")
    return lo, hi


def box(x, eps, clip):
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
    lo, hi = _clip_arg(clip, xa.shape)
    blo = np.maximum(xa - ea, lo)
    bhi = np.minimum(xa + ea, hi)
    if (blo > bhi).any():
        raise ValueError("x lies farther than eps outside clip: the box is empty")
    half = ((bhi - blo) / 2).ravel()
    return xa.shape, ((blo + bhi) / 2).ravel(), half, np.flatnonzero(half > 0)


def from_box_into(x, eps, clip, dt: np.dtype, alloc) -> np.ndarray:
    """from_box, its output from alloc(shape, dtype)."""
    shape, centre, half, free = box(x, eps, clip)
    z = alloc((centre.size, 1 + free.size), dt)
    z.fill(0)
    z[:, 0] = centre
    z[free, 1 + np.arange(free.size)] = half[free]
    return z.reshape(shape + (1 + free.size,))


def rows(z: np.ndarray) -> np.ndarray:
    """z as C-contiguous (neurons, E): a view when it already is one."""
    return np.ascontiguousarray(z).reshape(-1, z.shape[-1])


def bounds_rows(z2: np.ndarray, nt: int):
    n = z2.shape[0]
    lower = np.empty(n, z2.dtype)
    upper = np.empty(n, z2.dtype)
    threads = threads_for(nt, z2.size, n)
    kernel("zono_bounds", z2.dtype)(z2, lower, upper, threads)
    return lower, upper


def relu_into(z: np.ndarray, nt: int, alloc, apart: bool = False):
    """relu of a checked z, its output from alloc(shape, dtype). apart:
    return (the old components, the unstable neurons' flat indices, their
    new generators' values) instead, the new generators not written."""
    z2 = rows(z)
    lower, upper = bounds_rows(z2, nt)
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


# Bytes of a weight block (a chunk of output channels) kept in cache while
# the threads sweep E: beyond it, every E block would stream the whole
# weight matrix from memory (a 1000 x 1568 float64 layer ran 2.9x slower
# than in one block of 128 channels).
DENSE_BLOCK_BYTES = 1 << 20


# Output channels below which listing a block's zero rows (a read of all
# of z) costs more than it saves.
SKIP_FROM_CHANNELS = 16


def dense_into(z: np.ndarray, weight: np.ndarray, b: np.ndarray, out: np.ndarray, nt: int,
               finite: bool | None = None) -> None:
    """out (..., O, E) = weight (O, D) @ z (..., D, E), and b (or nothing,
    where empty) on component 0. z and out have E contiguous; out may be a
    view of a wider array. finite: whether every weight is finite, where
    the caller knows (else found here): only then does the kernel leave out
    the rows of z that are zero in a block of E."""
    O, D = weight.shape
    E, dt = z.shape[-1], z.dtype
    if D == 0 or E == 0 or O == 0:
        out[...] = 0
        if b.size and E:
            out[..., 0] = b
        return
    z3, out3 = z.reshape(-1, D, E), out.reshape(-1, O, E)
    weight = np.ascontiguousarray(weight)
    skip = O >= SKIP_FROM_CHANNELS and (finite if finite is not None else bool(np.isfinite(weight).all()))
    oc = max(4, DENSE_BLOCK_BYTES // (D * dt.itemsize) // 4 * 4)
    fn = kernel("zono_dense", dt)
    nb = -(-E // kernel("dense_block")(dt == np.float32))
    threads = threads_for(nt, work(O * D * E, (O + D) * E), -(-E // 48))
    # each block's nonzero rows, listed by the first channel block's call
    N = z3.shape[0]
    rows = np.empty((N, nb, D) if skip else (N, 0, 0), np.intp)
    counts = np.full((N, nb if skip else 0), -1, np.intp)
    for o0 in range(0, O, oc):
        o1 = min(O, o0 + oc)
        for n in range(N):
            fn(z3[n], weight[o0:o1], b[o0:o1] if b.size else b, out3[n, o0:o1], rows[n], counts[n],
               threads)
