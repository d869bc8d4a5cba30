"""Linear bounds by back-substitution (CROWN, DeepPoly's ReLU relaxation),
with a charge for floating-point rounding.

Each ReLU with input bounds ``[l, u]`` is relaxed to ``a x <= y <= s x +
t``: ``a = s = 1, t = 0`` where ``l >= 0``; all 0 where ``u <= 0``;
otherwise ``s = u / (u - l)``, ``t = -s l``, and ``a = 1`` where ``u >=
-l``, else 0 (CROWN's adaptive lower slope). A bound of ``c . y`` is
pushed back through every layer to the input box: through an affine map
by its transpose (a dense layer's matrix product, a convolution's input
gradient), through a ReLU by the relaxation that bounds it in the right
direction. Each ReLU's input bounds are computed first, the tighter of
interval arithmetic and back-substitution, only for the neurons interval
arithmetic leaves unstable; through dense layers, the rows of a neuron
found dead on a lower ReLU's box stop there (_Dead), and a product
between two ReLUs sums over the live neurons above and writes the
columns of the live ones below only.

Rounding: every bound is computed in the net's dtype with ordinary
rounding (but the product into a float64 net's first dense layer's
inputs, in float32 and charged on its own: _box_f32), so each is widened
by a charge (_Charge): ``gamma_n = n u / (1 - n u)`` per layer (u the
unit roundoff, n its longest sum) times a
bound on ``sum |terms|`` of the computation, a first-order bound in the
style of Higham's on a computed product and of ELINA's outward
rounding. Interval bounds are widened likewise. The ReLU's upper line is
nudged up so that it stays above the ReLU on ``[l, u]`` whatever the
rounding of ``s``.
"""
from __future__ import annotations

import math

import numpy as np

from .. import _checks as chk
from .._backend import kernel, threads_for
from ._net import Conv, Dense, Reshape, ReLU, _gamma, kept, signed_cols, signed_rows
from ._patches import backsub_rows, patchable

__all__ = ["bounds", "output_lower", "as_columns"]

# Rows from which back-substitution through a convolution runs them as
# columns: below, the vector convolution's input gradient leaves lanes
# empty (on oval21's layers it overtook the batched one at 18-40 rows).
COLUMNS_MIN_ROWS = 32

# Rows from which the product into the input, through a dense map, runs in
# float32 with its rounding charged (_box_f32), for a float64 net.
F32_MIN_ROWS = 16


def relaxation(l, u):
    """(a, s, t) of the ReLU on [l, u] (see the module's docstring): the
    upper line is nudged up by ``4 eps (|s l| + u)`` plus the smallest
    normal, so that it is >= 0 at l and >= u at u whatever the rounding of
    s. l and u: flat, of one dtype. In one compiled pass (the 15 numpy
    steps took 40-76 us a call)."""
    l = np.ascontiguousarray(l)
    u = np.ascontiguousarray(u, l.dtype)
    if l.ndim != 1 or u.shape != l.shape:  # the kernel reads both to l's length
        raise ValueError(f"l and u must be flat and of one length, not {l.shape} and {u.shape}")
    a, s, t = (np.empty_like(l) for _ in range(3))
    kernel("crown_relaxation", l.dtype)(l, u, a, s, t)
    return a, s, t


def as_columns(ops, K: int) -> bool:
    """Whether K rows go back through ops as columns (``_backsub``'s
    cols): where a convolution is among ops and K >= COLUMNS_MIN_ROWS."""
    return K >= COLUMNS_MIN_ROWS and any(isinstance(op, Conv) for op in ops)


def step_threads(net) -> int:
    """Threads for the compiled steps of net's bounds: net.num_threads (0:
    OpenMP's default) where a convolution of it runs on the same team, else
    1. Between a dense net's products, which run on OpenBLAS's threads, a
    team thread spinning after a step takes a CPU from OpenBLAS's worker."""
    if any(isinstance(op, Conv) for op in net.ops):
        return chk.num_threads_arg(net.num_threads)
    return 1


def _live_below(ops, relax, i):
    """The live neurons of the ReLU ops[i - 1] where it lies between the
    dense maps ops[i - 2] and ops[i], else None: the only columns that
    rows through ops[i] need (Dense.T's live_in)."""
    if i > 1 and isinstance(ops[i], Dense) and isinstance(ops[i - 1], ReLU) \
            and isinstance(ops[i - 2], Dense):
        return np.flatnonzero(relax[i - 1][1])
    return None


def _backsub(ops, relax, A, lo, hi, const=None, nt=0, buffers=None, cols=False, inputs=False,
             dead=None, packed=None):
    """Lower bounds of the rows of A (K, *shape of ops[-1]'s output; cols:
    the rows as the last axis, (*shape, K)), plus const, over the box [lo,
    hi] (flat, contiguous), as computed (no rounding charge). A and const
    are consumed: changed in place where they are contiguous arrays of the
    net's dtype. nt: threads (0: OpenMP's default); buffers: the net's
    Buffers for the transposed maps, or None. inputs: also return the
    rows' coefficients on the input, (K, n), a view of A or of a buffer.
    dead: see _Dead (rows only, not with inputs). packed: A (rows) has only
    the columns of these neurons of ops[-1]'s output, a ReLU's live ones."""
    K = A.shape[-1] if cols else A.shape[0]
    dt = A.dtype
    const = np.zeros(K, dt) if const is None else const

    def flat(A):
        return np.ascontiguousarray(A.reshape(-1, K) if cols else A.reshape(K, -1))

    live = {}  # for a Dense op: its outputs that the ReLU above left alive
    below_first = False  # whether a ReLU was passed: the first one's box is the interval's
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if isinstance(op, ReLU) and dead is not None:
            if below_first:
                A, const = dead.stop(flat(A), const, i, nt, packed)
                K = const.size
                if not K:
                    return dead.result(const)
                if packed is None:
                    A = A.reshape((K,) + op.out_shape)
            below_first = True
        if isinstance(op, ReLU):
            # a negative coefficient takes the upper line (s, t), a positive
            # one the lower (a); stable neurons have a = s and t = 0
            a, s, t = (v.reshape(-1) for v in relax[i])
            Af = flat(A)
            th = threads_for(nt, Af.size, K)
            if packed is not None:
                kernel("crown_relu", dt)(Af, a[packed], s[packed], t[packed], const, th)
                A, live, packed = Af, {"live": packed}, None
                continue
            # a dead neuron (s = 0) zeroes its coefficients: the dense map
            # below sums over the others only (on mnistfc, 1 in 10 of 256)
            alive = np.flatnonzero(s) if i and isinstance(ops[i - 1], Dense) else s
            live = {"live": alive} if alive.size < s.size else {}
            if live and not cols:  # the live columns only, into a kept array
                A = kept(buffers, ("live", i), (K * alive.size,), dt).reshape(K, alive.size)
                kernel("crown_relu_live", dt)(Af, a[alive], s[alive], t[alive], alive, A, const, th)
                continue
            kernel("crown_relu_cols" if cols else "crown_relu", dt)(Af, a, s, t, const, th)
            A = Af.reshape(A.shape)
        elif cols:
            if op.bias is not None:
                const += op.bias.reshape(-1) @ A.reshape(-1, K)
            A = op.T_cols(A, buffers=buffers, **live)
            live = {}
        else:
            if op.bias is not None:
                b = op.bias.reshape(-1)
                const += A.reshape(K, -1) @ (b[live["live"]] if live else b)
            if i == 0 and isinstance(op, Dense) and not inputs and dt == np.float64 \
                    and K >= F32_MIN_ROWS:
                lb = _box_f32(op, flat(A), live.get("live"), lo, hi, const, buffers, nt)
                if lb is not None:
                    return lb if dead is None else dead.result(lb)
            # the ReLU below zeroes its dead neurons' coefficients: where it
            # lies between two dense maps, the product writes the others only
            packed = _live_below(ops, relax, i)
            if packed is not None:
                live["live_in"] = packed
            A = op.T(A, buffers=buffers, **live)
            live = {}
    Af = flat(A)
    kernel("crown_box_cols" if cols else "crown_box", dt)(Af, lo, hi, const,
                                                          threads_for(nt, Af.size, K))
    if inputs:
        return const, (Af.T if cols else Af)
    return const if dead is None else dead.result(const)


def _box_f32(op, A, live, lo, hi, const, buffers, nt):
    """const plus the least over the box [lo, hi] of the rows A (K, m)
    through the dense map op (its rows live, or all), with the product in
    float32. About the box's centre mid, with a radius rad that holds it,
    the least is ``A (W mid) - |A W| rad``: the first term in float64, the
    second from ``C = fl32(A) fl32(W)``, its sum in float64. Rounding A and
    W to float32 and summing m terms moves C by at most ``gamma_{m+3} |A|
    |W|`` (float32's gamma), so the second term moves by at most that
    times ``|A| . (|W| rad)``; the first is charged ``gamma_{n+m+2} |A| .
    (|W| |mid|)`` (W m x n), 1% more on both for the float64 sums and second-order
    terms, and float32's underflow as 2^-149 a term (Dense.single). None
    where a value is not finite (the caller goes on in float64)."""
    K, m = A.shape
    W32, wmid, nrad, rad, v, tiny = op.single(live, lo, hi)
    A32 = kept(buffers, ("A32", id(op)), (K * m,), np.float32).reshape(K, m)
    charge = np.empty(K)
    kernel("crown_rows_single")(A, v, A32, charge, threads_for(nt, A.size, K))
    C = kept(buffers, ("C32", id(op)), (K * W32.shape[1],), np.float32).reshape(K, W32.shape[1])
    with np.errstate(over="ignore", invalid="ignore"):  # rows past float32's range: None
        np.matmul(A32, W32, out=C)
    out = const + A @ wmid
    kernel("crown_box_single")(C, nrad, rad, out, threads_for(nt, C.size, K))  # -|C| . rad
    charge += tiny
    out -= charge
    return out if np.isfinite(out).all() else None


class _Dead:
    """Stops the rows of the neurons found dead below their layer, for
    _backsub: the rows of m neurons, ``+e_r`` then ``-e_r``. At each ReLU
    below the first (whose output box gives the interval bound), the
    ``-e_r`` rows are bounded on that ReLU's output box (``boxes[i]``,
    sound bounds); where one is above the neuron's rounding charge
    (``margin``), ``u < 0``: the neuron is dead, its bounds are not used
    further, and both its rows stop there. A live neuron goes on to the
    input: its bounds, and so the next layers' boxes, are unchanged."""

    def __init__(self, boxes, margin):
        self.boxes, self.margin = boxes, margin
        m = margin.size
        self.going = np.arange(m)
        self.out = np.full(2 * m, -np.inf, margin.dtype)

    def stop(self, Af, const, i, nt, packed=None):
        """Af (2k, n) and const (2k,) without the rows of the neurons dead
        on ReLU i's output box; packed: the neurons whose columns alone Af
        has (the others' box is 0), or None."""
        k = const.size // 2
        v = const[k:].copy()
        lo, hi = self.boxes[i] if packed is None else (b[packed] for b in self.boxes[i])
        kernel("crown_box", Af.dtype)(Af[k:], lo, hi, v, threads_for(nt, Af[k:].size, k))
        dead = v > self.margin[self.going]
        if not dead.any():
            return Af, const
        m = self.margin.size
        self.out[m + self.going[dead]] = v[dead]
        keep = np.flatnonzero(~dead)
        rows = np.concatenate([keep, keep + k])
        self.going = self.going[keep]
        return np.take(Af, rows, axis=0), const[rows]

    def result(self, const):
        """The bounds of every row: const's for the rows that went on."""
        m, k = self.margin.size, const.size // 2
        self.out[self.going] = const[:k]
        self.out[m + self.going] = const[k:]
        return self.out


class _Charge:
    """The rounding charge of back-substituted bounds, layer by layer.

    F bounds the magnitude of every value the network's layers take on
    the box (``F = |W| F + |b|`` through an affine map; a ReLU does not
    increase it), and bounds ``sum |terms|`` of the computation of a row
    c's bound by ``|c| . F`` at its layer (the coefficients back-
    substituted are at most ``|c| |W_k| ... |W_j|``, the ReLU slopes being
    in [0, 1]). gam sums, over the affine maps passed, ``gamma`` of the
    longest sum each computes; the charge is ``2 gam |c| . F``.
    """

    def __init__(self, lo, hi, input_shape, dt):
        self.dt = dt
        self.F = np.maximum(np.abs(lo), np.abs(hi)).reshape((1,) + input_shape)
        self.gam = _gamma(math.prod(input_shape) + 2, dt)

    def affine(self, op, radius):
        """Through op, given ``op.radius(self.F)`` (radius)."""
        F = radius + (0 if op.bias is None else np.abs(op.bias))
        self.F = F * (1 + 4 * _gamma(op.fan_in + 2, self.dt)) + np.finfo(self.dt).tiny
        self.gam += _gamma(op.fan_in + math.prod(op.out_shape) + 2, self.dt)

    def relu(self):
        self.gam += 4 * np.finfo(self.dt).eps

    def of_rows(self, rows):
        """The charge of the unit rows e_r (and -e_r) of F's flat indices."""
        return 2 * self.gam * self.F.reshape(-1)[rows] + np.finfo(self.dt).tiny

    def of(self, C):
        """The charge of the rows of C (K, *shape of F)."""
        K = C.shape[0]
        return 2 * self.gam * (np.abs(C).reshape(K, -1) @ self.F.reshape(-1)) + np.finfo(self.dt).tiny


def _rows(ops, relax, rows, lo, hi, nt=0, buffers=None, boxes=None, margin=None):
    """Lower bounds of ``y_r`` and of ``-y_r`` for the flat rows r of
    ops[-1]'s output: in patches where ops allow it, else whole. boxes,
    margin: the ReLUs' output boxes and the rows' charges, for _Dead where
    the rows go whole through dense layers."""
    if patchable(ops):
        return backsub_rows(ops, relax, rows, lo, hi, nt, buffers)
    last = ops[-1]
    if isinstance(last, Dense):  # e_r through it: its row r, then -e_r
        cols = as_columns(ops, 2 * rows.size)
        if cols:
            A = signed_cols(last.WT(), rows, buffers, ("cols", id(last)), nt)
        else:
            packed = _live_below(ops, relax, len(ops) - 1)
            A = signed_rows(last.W, rows, buffers, ("rows", id(last)), packed)
        b = last.bias[rows]
        dead = None if cols or boxes is None else _Dead(boxes, margin)
        lb = _backsub(ops[:-1], relax, A, lo, hi, np.concatenate([b, -b]), nt, buffers, cols,
                      dead=dead, packed=None if cols else packed)
    else:
        n = int(np.prod(last.out_shape))
        A = np.zeros((2 * rows.size, n), lo.dtype)
        A[np.arange(rows.size), rows] = 1
        A[rows.size + np.arange(rows.size), rows] = -1
        lb = _backsub(ops, relax, A.reshape((-1,) + last.out_shape), lo, hi, None, nt, buffers)
    return lb[:rows.size], lb[rows.size:]


def _interval(op, c, r, ch):
    """The box (centre c, radius r) through one affine op, widened where
    ch (the _Charge, or None) is given, which goes through op too. Its
    three radii are one product: the weights are read once."""
    if isinstance(op, Reshape):
        if ch is not None:
            ch.F = op.apply(ch.F)
        return op.apply(c), op.apply(r)
    c2 = op.apply(c)
    if ch is None:
        return c2, op.radius(r)
    r2, rc, rF = op.radius(np.concatenate([r, np.abs(c) + r, ch.F]))[:, None]
    g = _gamma(op.fan_in + 2, c.dtype)
    ch.affine(op, rF)
    return c2, r2 + 2 * g * (rc + np.abs(op.bias)) + np.finfo(c.dtype).tiny


def bounds(net, lo, hi, *, charge=True):
    """The input bounds ``{i: (l, u)}`` of every ReLU ops[i] of net, flat,
    over the box [lo, hi] (a neuron found dead below its layer: ``u < 0``
    and l the interval's), their relaxations ``{i: (a, s, t)}``, and the
    rounding charge at the output (None without charge)."""
    dt = net.dtype
    nt = step_threads(net)
    lo = np.ascontiguousarray(lo, dt)
    hi = np.ascontiguousarray(hi, dt)
    c = ((lo + hi) / 2).reshape((1,) + net.input_shape)
    r = ((hi - lo) / 2).reshape((1,) + net.input_shape)
    if charge:  # the midpoint's rounding
        r = r + np.finfo(dt).eps * np.abs(c) + np.finfo(dt).tiny
    ch = _Charge(lo, hi, net.input_shape, dt) if charge else None
    pre, relax, boxes = {}, {}, {}
    affine_since_relu = 0
    for i, op in enumerate(net.ops):
        if not isinstance(op, ReLU):
            c, r = _interval(op, c, r, ch)
            affine_since_relu += not isinstance(op, Reshape)
            continue
        l, u = (c - r).reshape(-1), (c + r).reshape(-1)
        # one affine map from the input: its box is already the exact bound
        if relax or affine_since_relu > 1:
            rows = np.flatnonzero((l < 0) & (u > 0))
            if rows.size:
                margin = np.zeros(rows.size, dt) if ch is None else ch.of_rows(rows)
                lower, neg_upper = _rows(net.ops[:i], relax, rows, lo, hi, nt, net.buffers,
                                         boxes, margin)
                lower -= margin
                neg_upper -= margin
                l[rows] = np.maximum(l[rows], lower)
                u[rows] = np.minimum(u[rows], -neg_upper)
        pre[i] = (l, u)
        boxes[i] = (np.maximum(l, 0), np.maximum(u, 0))
        relax[i] = tuple(v.reshape(op.in_shape) for v in relaxation(l, u))
        lo_out, hi_out = (v.reshape((1,) + op.in_shape) for v in boxes[i])
        c, r = (lo_out + hi_out) / 2, (hi_out - lo_out) / 2
        if charge:
            r = r + np.finfo(dt).eps * np.abs(c) + np.finfo(dt).tiny
            ch.relu()
        affine_since_relu = 0
    return pre, relax, ch


def output_lower(net, relax, charge, C, lo, hi, *, inputs=False):
    """Lower bounds of ``C @ y`` (C of shape (K, n_outputs)) over the box,
    less the rounding charge (the _Charge from bounds, or None). inputs:
    also the corners of the box that minimise each row's linear lower
    bound, (K, n): where the relaxation is tight, the net's worst points."""
    dt = net.dtype
    A = np.array(C, dt).reshape((-1,) + net.ops[-1].out_shape)  # a copy: _backsub consumes it
    ch = None if charge is None else charge.of(A)
    cols = as_columns(net.ops, A.shape[0])
    if cols:
        A = np.ascontiguousarray(np.moveaxis(A, 0, -1))
    lo = np.ascontiguousarray(lo, dt)
    hi = np.ascontiguousarray(hi, dt)
    lb = _backsub(net.ops, relax, A, lo, hi, None, step_threads(net),
                  net.buffers, cols, inputs)
    if inputs:
        lb, coef = lb
        corners = np.where(coef > 0, lo, hi)
    lb = lb if ch is None else lb - ch
    return (lb, corners) if inputs else lb

