"""Feature-map argmax: the (row, col) of the maximum of every H x W map."""
from __future__ import annotations

import numpy as np

from . import _checks as chk
from ._backend import SERIAL_BELOW as _SERIAL_BELOW, kernel, threads_for

__all__ = ["argmax2d"]

# A map is split across threads only when there are fewer maps than threads
# and each part still has at least this many elements.
_MIN_SEGMENT = 1 << 15


def argmax2d(x, *, return_values=False, index_dtype=np.int64, num_threads=None):
    """Position of the maximum of every 2-D map over the last two axes.

    Exactly ``np.unravel_index(x.reshape(*lead, -1).argmax(-1), (H, W))``,
    stacked on a last axis: the first maximum in row-major order wins; NaN
    counts as the maximum and the first NaN wins (the same rule as
    :func:`cypool.max_pool2d`).

    Parameters
    ----------
    x : ndarray, shape (..., H, W), at least 2-D
        float32 or float64; float16 and integer types up to 64 bits (not
        uint64) are also accepted. Any strides.
    return_values : bool, keyword-only
        Also return the maxima.
    index_dtype : np.int64 or np.int32, keyword-only
    num_threads : int or None, keyword-only
        None follows OpenMP's default. Maps are processed in parallel; when
        there are fewer maps than threads, large maps are split and the
        parts merged in order.

    Returns
    -------
    coords : ndarray of index_dtype, shape (..., 2)
        ``[row, col]`` of each map's maximum.
    values : ndarray, shape (...), dtype of x
        Only with ``return_values=True``, returned first: ``(values, coords)``.
    """
    x, kd = chk.array(x, "x", tuple(range(2, 33)))
    H, W = x.shape[-2:]
    lead = x.shape[:-2]
    idt = chk.index_dtype_arg(index_dtype, max(H, W))
    nt = chk.num_threads_arg(num_threads)
    maps = chk.contiguous(x, kd).reshape(-1, H * W)
    P, n = maps.shape
    values = np.empty(P, dtype=kd)
    coords = np.empty((P, 2), dtype=idt)
    threads = threads_for(nt, maps.size, P * max(1, n // _MIN_SEGMENT))
    segments = 1
    if threads > P and n >= 2 * _MIN_SEGMENT and maps.size >= _SERIAL_BELOW:
        segments = min(-(-threads // P), n // _MIN_SEGMENT)
    kernel("argmax2d", kd, idt)(maps, values, coords, W, segments, threads)
    coords = coords.reshape(lead + (2,))
    if not return_values:
        return coords
    values = values.reshape(lead)
    return values if kd == x.dtype else values.astype(x.dtype), coords
