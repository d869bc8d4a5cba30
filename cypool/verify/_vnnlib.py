"""VNN-LIB properties: the SMT-LIB subset of VNN-COMP, read into Specs.

A property declares inputs ``X_i`` and outputs ``Y_j``, bounds every input
by a box, and asserts what a counterexample would satisfy: a disjunction
of conjunctions of linear constraints on the outputs (and, for several
boxes, on the inputs too). The top-level asserts are a conjunction.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from itertools import product

import numpy as np

__all__ = ["Spec", "read_vnnlib"]

_MAX_DISJUNCTS = 4096  # the DNF's size; larger properties are refused, not ground through
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
_VAR = re.compile(r"^([XY])_(\d+)$")
_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_DECLARE = re.compile(r"\(\s*declare-const\s+(([XY])_(\d+))\s+Real\s*\)")
_SIMPLE_BOUND = re.compile(r"\(\s*assert\s*\(\s*(<=|>=)\s+(X_\d+)\s+(" + _NUM + r")\s*\)\s*\)")


@dataclass
class Spec:
    """One input box and the counterexample condition on the outputs.

    ``lower``, ``upper``: the box, flat in the ONNX input's C order.
    ``disjuncts``: a list of ``(A, b)``; an output y is a counterexample
    when, for some disjunct, ``A @ y <= b`` holds row by row. The property
    holds on the box when no point of it maps to a counterexample.
    """
    lower: np.ndarray
    upper: np.ndarray
    disjuncts: list = field(default_factory=list)

    @property
    def n_inputs(self) -> int:
        return self.lower.size

    @property
    def n_outputs(self) -> int:
        return self.disjuncts[0][0].shape[1] if self.disjuncts else 0

    def is_counterexample(self, y) -> bool:
        """Whether output y satisfies some disjunct (exactly, in float64)."""
        y = np.asarray(y, np.float64).reshape(-1)
        return any(bool((A @ y <= b).all()) for A, b in self.disjuncts)


def _tokens(text: str):
    return text.replace("(", " ( ").replace(")", " ) ").split()


def _parse(tokens):
    """The s-expressions of a token list, as nested lists of strings."""
    out, stack = [], []
    for t in tokens:
        if t == "(":
            stack.append([])
        elif t == ")":
            if not stack:
                raise ValueError("spec: unbalanced ')'")
            e = stack.pop()
            (stack[-1] if stack else out).append(e)
        else:
            (stack[-1] if stack else out).append(t)
    if stack:
        raise ValueError("spec: unbalanced '(' (the file ends inside an expression)")
    return out


def _linear(term, names):
    """A term as ({var: coefficient}, constant)."""
    if isinstance(term, str):
        if _NUMBER.match(term):
            return {}, float(term)
        if term not in names:
            raise ValueError(f"spec: {term!r} is not a declared variable or a number")
        return {term: 1.0}, 0.0
    if not term:
        raise ValueError("spec: empty expression")
    op, args = term[0], [_linear(a, names) for a in term[1:]]
    if op in ("+", "-"):
        if op == "-" and len(args) == 1:
            return {k: -v for k, v in args[0][0].items()}, -args[0][1]
        coef, const = dict(args[0][0]), args[0][1]
        for c, k0 in args[1:]:
            s = 1.0 if op == "+" else -1.0
            for k, v in c.items():
                coef[k] = coef.get(k, 0.0) + s * v
            const += s * k0
        return coef, const
    if op == "*":
        coef, const = {}, 1.0
        for c, k0 in args:
            if c and coef:
                raise ValueError("spec: a product of two variables is not linear")
            if c:
                coef = {k: v * const for k, v in c.items()}
                const = 0.0
            else:
                coef = {k: v * k0 for k, v in coef.items()}
                const *= k0
        return coef, const
    raise ValueError(f"spec: unsupported operator {op!r} in a term")


def _dnf(f, names):
    """A formula as a list of conjunctions, each a list of atoms
    ({var: coefficient}, constant) meaning ``sum coef * var + constant <= 0``."""
    if isinstance(f, str) or not f:
        raise ValueError(f"spec: expected a constraint, got {f!r}")
    op = f[0]
    if op == "and":
        parts = [_dnf(g, names) for g in f[1:]]
        out = [[]]
        for p in parts:
            out = [a + b for a, b in product(out, p)]
            if len(out) > _MAX_DISJUNCTS:
                raise ValueError(f"spec: more than {_MAX_DISJUNCTS} disjuncts")
        return out
    if op == "or":
        out = [c for g in f[1:] for c in _dnf(g, names)]
        if len(out) > _MAX_DISJUNCTS:
            raise ValueError(f"spec: more than {_MAX_DISJUNCTS} disjuncts")
        return out
    if op in ("<=", ">=", "<", ">"):
        if len(f) != 3:
            raise ValueError(f"spec: {op} takes two terms, got {len(f) - 1}")
        (ca, ka), (cb, kb) = _linear(f[1], names), _linear(f[2], names)
        if op in (">=", ">"):
            (ca, ka), (cb, kb) = (cb, kb), (ca, ka)
        coef = dict(ca)
        for k, v in cb.items():
            coef[k] = coef.get(k, 0.0) - v
        return [[(coef, ka - kb)]]
    raise ValueError(f"spec: unsupported connective {op!r} (VNN-LIB uses and, or, <=, >=)")


def read_vnnlib(path):
    """The property of a VNN-LIB file.

    Returns
    -------
    Spec, or a list of Specs where the property has several input boxes.

    Raises ValueError, naming what is wrong, for a malformed file, a
    non-linear or unsupported expression, an input left unbounded or with
    an empty box, or a constraint mixing inputs and outputs.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path, got {type(path).__name__}")
    with open(path, encoding="utf-8") as fh:
        text = re.sub(r";[^\n]*", " ", fh.read())
    names: dict[str, tuple[str, int]] = {}
    conj = [[]]
    # the common lines, read by one pattern each: declarations and input bounds
    for m in _DECLARE.finditer(text):
        names[m.group(1)] = (m.group(2), int(m.group(3)))
    simple = [(m.group(2), m.group(1), float(m.group(3))) for m in _SIMPLE_BOUND.finditer(text)]
    exprs = _parse(_tokens(_SIMPLE_BOUND.sub(" ", _DECLARE.sub(" ", text))))
    for e in exprs:
        if not isinstance(e, list) or not e:
            raise ValueError(f"spec: expected a command, got {e!r}")
        if e[0] == "declare-const":
            if len(e) != 3 or not isinstance(e[1], str) or not _VAR.match(e[1]):
                raise ValueError(f"spec: declare X_i or Y_i as Real, got {e!r}")
            m = _VAR.match(e[1])
            names[e[1]] = (m.group(1), int(m.group(2)))
        elif e[0] == "assert":
            if len(e) != 2:
                raise ValueError("spec: assert takes one formula")
            conj = [a + b for a, b in product(conj, _dnf(e[1], names))]
            if len(conj) > _MAX_DISJUNCTS:
                raise ValueError(f"spec: more than {_MAX_DISJUNCTS} disjuncts")
        else:
            raise ValueError(f"spec: unsupported command {e[0]!r}")
    n_x = _count(names, "X")
    n_y = _count(names, "Y")
    base_lo, base_hi = np.full(n_x, -np.inf), np.full(n_x, np.inf)
    for name, op, value in simple:
        if name not in names:
            raise ValueError(f"spec: {name!r} is not a declared variable")
        i = names[name][1]
        if op == "<=":
            base_hi[i] = min(base_hi[i], value)
        else:
            base_lo[i] = max(base_lo[i], value)
    boxes: dict[tuple, Spec] = {}
    for atoms in conj:
        lo, hi = base_lo.copy(), base_hi.copy()
        rows, rhs = [], []
        for coef, const in atoms:
            kinds = {names[k][0] for k, v in coef.items() if v != 0}
            if kinds == {"X"}:
                _bound(coef, const, names, lo, hi)
            elif kinds == {"Y"}:
                row = np.zeros(n_y)
                for k, v in coef.items():
                    row[names[k][1]] += v
                rows.append(row)
                rhs.append(-const)
            elif kinds:
                raise ValueError("spec: a constraint mixes inputs X and outputs Y")
            elif const > 0:  # a constant constraint that is false: no counterexample here
                rows = None
                break
        if rows is None:
            continue
        if not (np.isfinite(lo).all() and np.isfinite(hi).all()):
            missing = np.flatnonzero(~(np.isfinite(lo) & np.isfinite(hi)))
            raise ValueError(f"spec: input X_{missing[0]} has no finite lower and upper bound")
        if (lo > hi).any():
            continue  # an empty box holds no counterexample
        key = (lo.tobytes(), hi.tobytes())
        spec = boxes.setdefault(key, Spec(lo, hi))
        spec.disjuncts.append((np.array(rows).reshape(-1, n_y), np.array(rhs)))
    if not boxes:
        raise ValueError("spec: no input box with a possible counterexample")
    specs = list(boxes.values())
    return specs[0] if len(specs) == 1 else specs


def _count(names, kind):
    idx = sorted(i for k, i in names.values() if k == kind)
    if not idx:
        raise ValueError(f"spec: no {kind}_i is declared")
    if idx != list(range(len(idx))):
        raise ValueError(f"spec: the {kind} variables must be {kind}_0 to {kind}_{len(idx) - 1}")
    return len(idx)


def _bound(coef, const, names, lo, hi):
    """coef . x + const <= 0 on one input: a bound of the box."""
    nz = [(k, v) for k, v in coef.items() if v != 0]
    if len(nz) != 1:
        raise ValueError("spec: an input constraint must bound one X_i by a number")
    k, v = nz[0]
    i = names[k][1]
    if v > 0:
        hi[i] = min(hi[i], -const / v)
    else:
        lo[i] = max(lo[i], -const / v)
