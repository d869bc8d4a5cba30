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
arithmetic leaves unstable.

Rounding: every bound is computed in the net's dtype with ordinary
rounding, so each is widened by a charge (_Charge): ``gamma_n = n u / (1
- n u)`` per layer (u the unit roundoff, n its longest sum) times a
bound on ``sum |terms|`` of the computation, a first-order bound in the
style of Higham's on a computed product and of ELINA's outward
rounding. Interval bounds are widened likewise. The ReLU's upper line is
nudged up so that it stays above the ReLU on ``[l, u]`` whatever the
rounding of ``s``.
"""
from __future__ import annotations

import numpy as np

from .. import _checks as chk
from .._backend import kernel, threads_for
from ._net import Conv, Dense, Reshape, ReLU, kept, signed_cols, signed_rows
from ._patches import backsub_rows, patchable

__all__ = ["bounds", "output_lower", "as_columns"]

# Rows from which back-substitution through a convolution runs them as
# columns: below, the vector convolution's input gradient leaves lanes
# empty (on oval21's layers it overtook the batched one at 18-40 rows).
COLUMNS_MIN_ROWS = 32


def _gamma(n: int, dtype) -> float:
    u = np.finfo(dtype).eps / 2
    return n * u / (1 - n * u)


def relaxation(l, u):
    """(a, s, t) of the ReLU on [l, u] (see the module's docstring)."""
    dt = l.dtype
    active = l >= 0
    unstable = (l < 0) & (u > 0)
    a = active.astype(dt)
    s = a.copy()
    t = np.zeros_like(l)
    lu, uu = l[unstable], u[unstable]
    su = uu / (uu - lu)
    # the line must be >= 0 at l and >= u at u, whatever the rounding of su
    tu = np.maximum(-su * lu, uu - su * uu)
    tu = tu + 4 * np.finfo(dt).eps * (np.abs(su * lu) + uu) + np.finfo(dt).tiny
    s[unstable], t[unstable] = su, tu
    a[unstable] = (uu >= -lu).astype(dt)
    return a, s, t


def as_columns(ops, K: int) -> bool:
    """Whether K rows go back through ops as columns (``_backsub``'s
    cols): where a convolution is among ops and K >= COLUMNS_MIN_ROWS."""
    return K >= COLUMNS_MIN_ROWS and any(isinstance(op, Conv) for op in ops)


def _backsub(ops, relax, A, lo, hi, const=None, nt=0, buffers=None, cols=False, inputs=False,
             post=None):
    """Lower bounds of the rows of A (K, *shape of ops[-1]'s output; cols:
    the rows as the last axis, (*shape, K)), plus const, over the box [lo,
    hi] (flat, contiguous), as computed (no rounding charge; post, a
    _Posterior: charged by it, in float64). A and const are consumed:
    changed in place where they are contiguous arrays of the net's dtype.
    nt: threads (0: OpenMP's default); buffers: the net's Buffers for the
    transposed maps, or None. inputs: also return the rows' coefficients
    on the input, (K, n), a view of A or of a buffer."""
    K = A.shape[-1] if cols else A.shape[0]
    dt = A.dtype
    const = np.zeros(K, dt) if const is None else const
    if post is not None:
        post.start(K)

    def flat(A):
        return np.ascontiguousarray(A.reshape(-1, K) if cols else A.reshape(K, -1))

    live = {}  # for a Dense op: its outputs that the ReLU above left alive
    for i in range(len(ops) - 1, -1, -1):
        op = ops[i]
        if post is not None:
            post.step(i, A, const, cols, live.get("live") if not cols else None)
        if isinstance(op, ReLU):
            # a negative coefficient takes the upper line (s, t), a positive
            # one the lower (a); stable neurons have a = s and t = 0
            a, s, t = (v.reshape(-1) for v in relax[i])
            Af = flat(A)
            th = threads_for(nt, Af.size, K)
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
            A = op.T(A, buffers=buffers, **live)
            live = {}
    Af = flat(A)
    if post is not None:
        post.step("box", Af, const, cols)
    kernel("crown_box_cols" if cols else "crown_box", dt)(Af, lo, hi, const,
                                                          threads_for(nt, Af.size, K))
    if post is not None:
        const = post.lower(const)
    if inputs:
        return const, (Af.T if cols else Af)
    return const


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
        self.gam = _gamma(int(np.prod(input_shape)) + 2, dt)

    def affine(self, op, radius):
        """Through op, given ``op.radius(self.F)`` (radius)."""
        F = radius + (0 if op.bias is None else np.abs(op.bias))
        self.F = F * (1 + 4 * _gamma(op.fan_in + 2, self.dt)) + np.finfo(self.dt).tiny
        self.gam += _gamma(op.fan_in + int(np.prod(op.out_shape)) + 2, self.dt)

    def relu(self):
        self.gam += 4 * np.finfo(self.dt).eps

    def of_rows(self, rows):
        """The charge of the unit rows e_r (and -e_r) of F's flat indices."""
        return 2 * self.gam * self.F.reshape(-1)[rows] + np.finfo(self.dt).tiny

    def of(self, C):
        """The charge of the rows of C (K, *shape of F)."""
        K = C.shape[0]
        return 2 * self.gam * (np.abs(C).reshape(K, -1) @ self.F.reshape(-1)) + np.finfo(self.dt).tiny


_F32 = np.dtype(np.float32)
_EPS32 = float(np.finfo(_F32).eps)
_TINY32 = float(np.finfo(_F32).tiny)


def _up32(v):
    """v (float64, >= 0) as float32, rounded up, underflow to the least normal."""
    out = (np.asarray(v, np.float64) * (1 + 2 * _EPS32)).astype(_F32)
    return np.maximum(out, _F32.type(_TINY32))


def outward32(lo, hi):
    """The float32 box around [lo, hi] (float64): each end rounded outward."""
    lo32, hi32 = lo.astype(_F32), hi.astype(_F32)
    lo32 = np.where(lo32 > lo, np.nextafter(lo32, _F32.type(-np.inf)), lo32)
    hi32 = np.where(hi32 < hi, np.nextafter(hi32, _F32.type(np.inf)), hi32)
    return lo32, hi32


def _terms(op) -> int:
    """The most terms a sum of op's transposed map adds: a dense layer's
    outputs; a convolution's channels times taps, plus the taps its
    strided form adds columns over (col2im); 1 for an elementwise map."""
    if isinstance(op, Dense):
        return op.W.shape[0]
    if isinstance(op, Conv):
        O, _, kh, kw = op.w.shape
        return (O + 1) * kh * kw
    return 1


class _Posterior:
    """The rounding charge of a back-substitution in float32, from the
    coefficients it computed (a posteriori), in float64.

    Y bounds the magnitude of an affine map's input (the box at the input,
    else the ReLU outputs' upper bounds) and Z that of a ReLU's input. The
    computed rows ``A`` at a step are exact rows of a sound bound but for
    that step's rounding, which moves it by at most: through an affine map,
    ``gamma_m |A| |W| Y`` (``m``: its sums' terms) and ``gamma_{n+2}
    (|A| |b| + |const|)`` for the bias; through a ReLU, ``u |A| Z`` for the
    products by its slopes other than 0 and 1 and ``gamma_{n+2} (|A| |t| + |const|)`` for the
    intercepts; at the box, ``gamma_{n+2} (|A| X + |const|)``. Each step so
    costs ``|A| . V + g |const|``, V and g made once per layer. A ReLU's
    step takes the affine map's below it too: its rows are no larger than
    the ReLU's (slopes in [0, 1]), and its const at most the ReLU's plus
    ``|A| |t|``. ``|A| . V`` is summed in float32 and widened by its own
    gamma; underflow adds at most the least normal per term, times the
    values' magnitude.
    """

    def __init__(self, lo32, hi32, buffers=None):
        X = np.maximum(np.abs(lo32), np.abs(hi32)).astype(np.float64)
        self.V, self.g, self.tiny = {}, {}, {}
        self.buffers = buffers
        self._set("box", X.size, _gamma(X.size + 2, _F32) * X, X)

    def _set(self, key, n, V, Y):
        self.V[key] = V.reshape(-1)
        self.g[key] = _gamma(n + 2, _F32)
        self.tiny[key] = 4 * _TINY32 * (n + 2) * (1 + float(np.sum(Y)))

    def affine(self, i, op, G, Y):
        """ops[i] = op, an affine map; G = op.radius(Y), Y as above."""
        if isinstance(op, Reshape):
            return
        n = int(np.prod(op.out_shape))
        self._set(i, n, _gamma(_terms(op), _F32) * G + _gamma(n + 2, _F32) * np.abs(op.bias), Y)

    def relu(self, i, l, u, s32, t32):
        """ops[i], a ReLU with input bounds [l, u] and float32 upper slopes
        s32 and intercepts t32, merged with ops[i - 1]'s step where that is
        an affine map."""
        Z = np.maximum(np.abs(l), np.abs(u))
        s32, t = s32.reshape(-1), np.abs(t32.reshape(-1)).astype(np.float64)
        slope = np.where((s32 != 0) & (s32 != 1), Z, 0)  # a product by 0 or 1 is exact
        self._set(i, l.size, _EPS32 * slope + _gamma(l.size + 2, _F32) * t, Z)
        below = self.V.pop(i - 1, None)
        if below is not None and below.size == l.size:
            g = self.g.pop(i - 1)
            grow = 1 + 2 * _gamma(l.size + 2, _F32)
            self.V[i] = (self.V[i] + below + g * t) * grow
            self.g[i] = (self.g[i] + g) * grow
            self.tiny[i] += self.tiny.pop(i - 1)
        elif below is not None:
            self.V[i - 1] = below
        self.V[i] = _up32(self.V[i])

    def start(self, K):
        self.charge = np.zeros(K)

    def _abs(self, A, shape, cols):
        return np.abs(A.reshape(shape), out=kept(self.buffers, ("abs",), shape, _F32, cols))

    def step(self, key, A, const, cols=False, live=None):
        """Charge the step of ops[key] (or "box") on rows A (K, ...; cols:
        (..., K)) with const before it; live: A's columns are those only."""
        V = self.V.get(key)
        if V is None:
            return
        if V.dtype != _F32:  # an affine map's own step (no ReLU above it)
            V = self.V[key] = _up32(V)
        if live is not None:
            V = V[live]
        K = const.shape[0]
        if cols:
            s = V @ self._abs(A, (V.size, K), True)
        else:
            s = self._abs(A, (K, V.size), False) @ V
        self._add(key, s, const, V.size)

    def step_patches(self, key, A, oy, ox, const, shape):
        """step on patches A (K, C, h, w) at origins (oy, ox) of a layer of
        shape (C, H, W)."""
        V = self.V.get(key)
        if V is None:
            return
        if V.dtype != _F32:
            V = self.V[key] = _up32(V)
        V = V.reshape(shape)
        s = np.zeros(const.shape[0], _F32)
        kernel("crown_box_patches", _F32)(self._abs(A, A.shape, False), oy, ox, V, V, s, 1)
        self._add(key, s, const, A[0].size)

    def _add(self, key, s, const, n):
        self.charge += (s.astype(np.float64) * (1 + 2 * _gamma(n + 2, _F32))
                        + self.g[key] * np.abs(const) + self.tiny[key])

    def lower(self, const):
        """The charged lower bounds (float64) of computed ones, const; -inf
        where either is not finite."""
        out = const.astype(np.float64) - self.charge
        return np.where(np.isfinite(out), out, -np.inf)


def _rows(ops, relax, rows, lo, hi, nt=0, buffers=None, post=None):
    """Lower bounds of ``y_r`` and of ``-y_r`` for the flat rows r of
    ops[-1]'s output: in patches where ops allow it, else whole. post: a
    _Posterior, which charges them."""
    if patchable(ops):
        return backsub_rows(ops, relax, rows, lo, hi, nt, buffers, post)
    last = ops[-1]
    if isinstance(last, Dense):  # e_r through it: its row r, then -e_r
        cols = as_columns(ops, 2 * rows.size)
        if cols:
            A = signed_cols(last.WT(), rows, buffers, ("cols", id(last)), nt)
        else:
            A = signed_rows(last.W, rows, buffers, ("rows", id(last)))
        b = last.bias[rows]
        lb = _backsub(ops[:-1], relax, A, lo, hi, np.concatenate([b, -b]), nt, buffers, cols,
                      post=post)
    else:
        n = int(np.prod(last.out_shape))
        A = np.zeros((2 * rows.size, n), lo.dtype)
        A[np.arange(rows.size), rows] = 1
        A[rows.size + np.arange(rows.size), rows] = -1
        lb = _backsub(ops, relax, A.reshape((-1,) + last.out_shape), lo, hi, None, nt, buffers,
                      post=post)
    return lb[:rows.size], lb[rows.size:]


def _interval(op, c, r, ch):
    """The box (centre c, radius r) through one affine op, widened where
    ch (the _Charge, or None) is given, which goes through op too; and
    ``(|W| Y, Y)``, Y = |c| + r bounding the magnitude of op's input (None
    without ch). Its three radii are one product: the weights are read
    once."""
    if isinstance(op, Reshape):
        if ch is not None:
            ch.F = op.apply(ch.F)
        return op.apply(c), op.apply(r), None
    c2 = op.apply(c)
    if ch is None:
        return c2, op.radius(r), None
    Y = np.abs(c) + r
    r2, rc, rF = op.radius(np.concatenate([r, Y, ch.F]))[:, None]
    g = _gamma(op.fan_in + 2, c.dtype)
    ch.affine(op, rF)
    return c2, r2 + 2 * g * (rc + np.abs(op.bias)) + np.finfo(c.dtype).tiny, (rc, Y)


# Intermediate bounds run in float32 only on values below this magnitude.
NARROW_MAX = 1e30


def narrowed(net, lo, hi):
    """The float32 net that bounds' intermediate rows run on, or None: net
    is float64, its weights are exact in float32, no convolution of it can
    run by F(2, 3) (3 taps wide at column stride 1, whose rounding the
    charge does not model), and the box is below NARROW_MAX."""
    if net.dtype != np.float64 or not (np.abs(lo) < NARROW_MAX).all() & (np.abs(hi) < NARROW_MAX).all():
        return None
    if any(isinstance(op, Conv) and op.w.shape[3] == 3 and op.stride[1] == 1 and op.dilation[1] == 1
           for op in net.ops):
        return None
    return net.exact_in(np.float32)


def bounds(net, lo, hi, *, charge=True):
    """The input bounds ``{i: (l, u)}`` of every ReLU ops[i] of net, flat,
    over the box [lo, hi], their relaxations ``{i: (a, s, t)}``, and the
    rounding charge at the output (None without charge)."""
    dt = net.dtype
    nt = chk.num_threads_arg(net.num_threads)
    lo = np.ascontiguousarray(lo, dt)
    hi = np.ascontiguousarray(hi, dt)
    c = ((lo + hi) / 2).reshape((1,) + net.input_shape)
    r = ((hi - lo) / 2).reshape((1,) + net.input_shape)
    if charge:  # the midpoint's rounding
        r = r + np.finfo(dt).eps * np.abs(c) + np.finfo(dt).tiny
    ch = _Charge(lo, hi, net.input_shape, dt) if charge else None
    # the intermediate rows in float32 where the net allows it, charged a
    # posteriori; the output's in float64 (output_lower)
    narrow = narrowed(net, lo, hi) if charge else None
    if narrow is not None:
        lo32, hi32 = outward32(lo, hi)
        post, relax32 = _Posterior(lo32, hi32, narrow.buffers), {}
    pre, relax = {}, {}
    affine_since_relu = 0
    for i, op in enumerate(net.ops):
        if not isinstance(op, ReLU):
            c, r, G = _interval(op, c, r, ch)
            if narrow is not None and G is not None:
                post.affine(i, op, *G)
            affine_since_relu += not isinstance(op, Reshape)
            continue
        l, u = (c - r).reshape(-1), (c + r).reshape(-1)
        # one affine map from the input: its box is already the exact bound
        if relax or affine_since_relu > 1:
            rows = np.flatnonzero((l < 0) & (u > 0))
            if rows.size:
                if narrow is not None:
                    lower, neg_upper = _rows(narrow.ops[:i], relax32, rows, lo32, hi32, nt,
                                             narrow.buffers, post)
                else:
                    lower, neg_upper = _rows(net.ops[:i], relax, rows, lo, hi, nt, net.buffers)
                    if ch is not None:
                        lower -= ch.of_rows(rows)
                        neg_upper -= ch.of_rows(rows)
                l[rows] = np.maximum(l[rows], lower)
                u[rows] = np.minimum(u[rows], -neg_upper)
        pre[i] = (l, u)
        relax[i] = tuple(v.reshape(op.in_shape) for v in relaxation(l, u))
        if narrow is not None:
            if (np.abs(l) < NARROW_MAX).all() and (np.abs(u) < NARROW_MAX).all():
                relax32[i] = tuple(v.reshape(op.in_shape) for v in relaxation(*outward32(l, u)))
                post.relu(i, l, u, *relax32[i][1:])
            else:
                narrow = None
        lo_out = np.maximum(l, 0).reshape((1,) + op.in_shape)
        hi_out = np.maximum(u, 0).reshape((1,) + op.in_shape)
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
    lb = _backsub(net.ops, relax, A, lo, hi, None, chk.num_threads_arg(net.num_threads),
                  net.buffers, cols, inputs)
    if inputs:
        lb, coef = lb
        corners = np.where(coef > 0, lo, hi)
    lb = lb if ch is None else lb - ch
    return (lb, corners) if inputs else lb

