"""check(net, spec): falsify by attack, prove by bounds, or say unknown."""
from __future__ import annotations

import functools
import numbers
import time
from dataclasses import dataclass

import numpy as np

from .. import _checks as chk
from ._crown import bounds, output_lower
from ._net import Net
from ._vnnlib import Spec

__all__ = ["Result", "check", "attack"]

# The attack after the bounds starts from the minimising corners of at most
# this many rows, those of least lower bound: twice the points it goes on
# with, since a trace of all 9 of a CIFAR net's rows cost more than its steps.
GUIDED_STARTS = 4


@dataclass
class Result:
    """The verdict of :func:`check`.

    ``status``: ``"holds"`` (no input of the box is a counterexample:
    proved, rounding charged), ``"violated"`` (``counterexample`` is an
    ``(x, y)`` with x in the box and y the network's float64 output there,
    satisfying the counterexample condition), or ``"unknown"`` (neither;
    ``timed_out`` says whether the time ran out first). ``lower``: per
    disjunct, the lower bounds of its rows ``A @ y - b`` (the property
    holds where each disjunct has one above 0). ``time``: seconds.
    """
    status: str
    counterexample: tuple | None = None
    lower: list | None = None
    time: float = 0.0
    timed_out: bool = False


class _Rows:
    """A spec's disjuncts stacked: every row ``A_j``, ``b_j`` and its
    disjunct, for :meth:`violations` on a batch in one product."""

    def __init__(self, disjuncts):
        # a disjunct of no rows holds of every output: the row 0 . y <= 0
        n = disjuncts[0][0].shape[1]
        disjuncts = [(A, b) if len(A) else (np.zeros((1, n)), np.zeros(1)) for A, b in disjuncts]
        self.A = np.concatenate([A for A, _ in disjuncts])
        self.b = np.concatenate([b for _, b in disjuncts])
        sizes = [len(A) for A, _ in disjuncts]
        self.starts = np.cumsum([0] + sizes[:-1])
        self.group = np.repeat(np.arange(len(sizes)), sizes)

    def violations(self, Y):
        """Per point, the least over disjuncts of the largest ``A y - b``
        (<= 0: a counterexample) and the row that attains it."""
        V = Y @ self.A.T - self.b  # (N, rows)
        worst = np.maximum.reduceat(V, self.starts, axis=1)  # (N, disjuncts)
        d = np.argmin(worst, axis=1)
        j = np.argmax(np.where(self.group == d[:, None], V, -np.inf), axis=1)
        return worst[np.arange(len(V)), d], self.A[j]


def _checked_specs(net, spec):
    """spec as a list of (Spec, its _Rows), each checked against net."""
    if not isinstance(net, Net):
        raise TypeError(f"net must be a network from load_onnx, got {type(net).__name__}")
    specs = spec if isinstance(spec, (list, tuple)) else [spec]
    if not specs or not all(isinstance(s, Spec) for s in specs):
        raise TypeError("spec must be a Spec from read_vnnlib, or a non-empty list of them")
    out = []
    for s in specs:
        if s.n_inputs != net.n_inputs:
            raise ValueError(f"spec has {s.n_inputs} inputs but the net takes {net.n_inputs}")
        if s.n_outputs != net.n_outputs:
            raise ValueError(f"spec constrains {s.n_outputs} outputs but the net has {net.n_outputs}")
        if not np.isfinite(s.lower).all() & np.isfinite(s.upper).all():
            raise ValueError("spec's input bounds must be finite")
        rows = _Rows(s.disjuncts)
        if not np.isfinite(rows.A).all() & np.isfinite(rows.b).all():
            raise ValueError("spec's output constraints must be finite")
        out.append((s, rows))
    return out


def _count(name, v, least):
    if chk.as_int(v, name) < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {v!r}")


def _number(name, v, ok, what):
    """v, a real number (no bool, no NaN) for which ok(v) holds, else a
    ValueError saying it must be what."""
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real) or v != v or not ok(v):
        raise ValueError(f"{name} must be {what}, got {v!r}")


def attack(net: Net, spec: Spec, *, steps=10, points=8, seed=0, deadline=None, patience=3,
           min_gain=0.0):
    """A counterexample ``(x, y)`` found by projected gradient descent on the
    violation (from the box's centre, corners and random points), confirmed
    by the float64 forward pass of that point alone; or None. It stops
    early once ``patience`` steps in a row have not lowered the least
    violation by more than ``min_gain`` (in [0, 1)) of its size, or at
    ``deadline`` (a ``time.perf_counter()`` value)."""
    if isinstance(spec, (list, tuple)):
        raise TypeError("spec must be one Spec (attack each box of a list on its own)")
    (_, rows), = _checked_specs(net, spec)
    _count("steps", steps, 0)
    _count("points", points, 1)
    _count("patience", patience, 1)
    _number("min_gain", min_gain, lambda v: 0 <= v < 1, "a number in [0, 1)")
    if deadline is not None:
        _number("deadline", deadline, lambda v: True, "a time.perf_counter() value or None")
    return _attack(net, spec, rows, _starts(spec, points, seed), steps, deadline, patience, min_gain)


def _starts(spec, points, seed):
    """points start points in spec's box: its centre, then random corners
    (half the rest) and random points."""
    lo, hi = spec.lower, spec.upper
    corners = max(0, min(points - 1, points // 2))
    at_corners, inside = _draws(lo.size, corners, points - 1 - corners, seed)
    X = np.empty((points, lo.size))
    X[0] = (lo + hi) / 2
    X[1:1 + corners] = np.where(at_corners < 0.5, lo, hi)
    X[1 + corners:] = lo + (hi - lo) * inside
    return X


@functools.lru_cache(maxsize=8)
def _draws(n, corners, inside, seed):
    """_starts' uniform draws in [0, 1), (corners, n) then (inside, n), read-
    only: made once, since a generator's seeding took 0.4 ms of a check
    called after a pause."""
    rng = np.random.default_rng(seed)
    out = rng.random((corners, n)), rng.random((inside, n))
    for a in out:
        a.flags.writeable = False
    return out


def _step(k, steps):
    """The k-th step's size, a fraction of the box's width: from 0.25 down
    to 0.02 geometrically."""
    return 0.25 * (0.02 / 0.25) ** (k / max(steps - 1, 1))


def _attack(net, spec, spec_rows, X, steps, deadline, patience, min_gain, keep=None,
            reach=None):
    """PGD from the points X (see attack), spec_rows its _Rows; keep: after
    the first trace, only the keep points of least violation go on. reach:
    also stop once the least violation would still be above 0 after the
    steps left, falling at each as much per unit of step size as at the
    last step ("last"; a rise stops it; after the first step, as much as
    at it), or at each as much as on average since the first ("mean":
    more than its shrinking steps give)."""
    lo, hi = spec.lower, spec.upper
    f64 = net.astype(np.float64)
    width = hi - lo
    best, stale = np.inf, 0
    for k in range(steps + 1):
        Y, masks = f64.trace(X)
        v, rows = spec_rows.violations(Y)
        for i in np.flatnonzero(v <= 0):
            y = f64.forward(X[i])[0]  # the point alone: the output a user's forward gives
            if spec.is_counterexample(y):
                return X[i].copy(), y
        stale = stale + 1 if v.min() >= best - min_gain * abs(best) else 0
        fell = best - v.min()
        best = min(best, v.min())
        if k == 0:
            first = best
        elif reach:  # how far the least violation can still fall
            if reach == "mean":
                left = (first - best) / k * (steps - k)
            elif k == 1:  # the first step (check: from the centre) turns the most ReLUs
                left = fell * (steps - k)
            else:
                left = fell / _step(k - 1, steps) * sum(_step(j, steps) for j in range(k, steps))
            if best - left > 0:
                return None
        if k == steps or stale >= patience or (deadline is not None and time.perf_counter() > deadline):
            return None
        if k == 0 and keep is not None and keep < len(X):
            i = np.argsort(v, kind="stable")[:keep]
            X, masks, rows = X[i], [m[i] for m in masks], rows[i]
        g = f64.backward(masks, rows).reshape(X.shape)
        X = np.clip(X - width * _step(k, steps) * np.sign(g), lo, hi)
    return None


def check(net: Net, spec, *, timeout=None, num_threads=None, attack_steps=10) -> Result:
    """Whether the property of spec holds on net.

    Parameters
    ----------
    net : a network from :func:`load_onnx`
    spec : a :class:`Spec` from :func:`read_vnnlib`, or a list of them
        (several input boxes: holds where it holds on each)
    timeout : seconds or None
        Checked between the steps: past it, ``"unknown"`` with
        ``timed_out``.
    num_threads : int or None
        For cypool's kernels (the convolutions).
    attack_steps : int
        Steps of the attack on what the bounds leave open, from the box
        corners that minimise the bounds' linear functions.
    """
    t0 = time.perf_counter()
    specs = _checked_specs(net, spec)
    _count("attack_steps", attack_steps, 0)
    if timeout is not None:
        _number("timeout", timeout, lambda v: v > 0, "a positive number of seconds or None")
    chk.num_threads_arg(num_threads)
    if num_threads is not None:
        net = net.with_threads(num_threads)
    # bounds in float64 whatever the net's dtype: float32 weights and boxes
    # are exact there, and float32's rounding charge costs every proof
    # (docs/verification.md)
    net = net.astype(np.float64)
    deadline = None if timeout is None else t0 + timeout
    lowers = []
    undecided = []
    for s, rows in specs:
        # from the centre: most counterexamples are found here, in a few
        # steps that each lower the violation by far more than 2%; the attack
        # after the bounds, from the relaxation's worst corners, takes over
        # where the steps left cannot reach 0 at their present pace
        cex = _attack(net, s, rows, _starts(s, 1, 0), 5, None, 2, 0.02, reach="last")
        if cex is not None:
            return Result("violated", cex, time=time.perf_counter() - t0)
        _, relax, charge = bounds(net, s.lower, s.upper)
        lb, corners = output_lower(net, relax, charge, rows.A, s.lower, s.upper, inputs=True)
        margin = lb - rows.b
        lowers.append([m[:len(A)] for m, (A, _) in zip(np.split(margin, rows.starts[1:]), s.disjuncts)])
        if not (np.maximum.reduceat(margin, rows.starts) > 0).all():
            worst = np.argsort(margin, kind="stable")[:GUIDED_STARTS]
            undecided.append((s, rows, corners[worst]))
        if deadline is not None and time.perf_counter() > deadline:
            return Result("unknown", lower=lowers, time=time.perf_counter() - t0, timed_out=True)
    if not undecided:
        return Result("holds", lower=lowers, time=time.perf_counter() - t0)
    for s, rows, corners in undecided:
        # where each row's linear lower bound is least: the relaxation's
        # worst points, traced together; the two most violating go on, while
        # their average pace can reach 0 (their steps shrink: it overstates)
        cex = _attack(net, s, rows, corners, attack_steps, deadline, 2, 0.02, keep=2,
                      reach="mean")
        if cex is not None:
            return Result("violated", cex, lower=lowers, time=time.perf_counter() - t0)
    timed_out = deadline is not None and time.perf_counter() > deadline
    return Result("unknown", lower=lowers, time=time.perf_counter() - t0, timed_out=timed_out)
