"""Forcing the kernels' paths, for tests and A/B benches only.

``force`` overrides cypool._select's choices on the calling thread alone;
the thread team's switches below act on the whole process, as the team is
shared. Nothing here is public API.
"""
from __future__ import annotations

import contextlib

from . import _backend
from . import _conv_engine
from . import _select
from ._select import ConvAlgo, VectorAlgo, WeightGradAlgo

_FAMILIES = {"conv": ConvAlgo, "weight_grad": WeightGradAlgo, "vector_forward": VectorAlgo,
             "vector_backward": VectorAlgo}

@contextlib.contextmanager
def force(*, ov_band: int | None = None, **choices):
    """Within the block, this thread's calls take the given choices where
    the call allows them (else the rule's): ``conv``, ``weight_grad``,
    ``vector_forward``, ``vector_backward``, each an enum member of
    cypool._select or its name in lower case (``conv="winograd"``);
    ``ov_band``: the bytes of padded rows LANES fills at a time. Plans are
    not cached while forced, and the caches are cleared on entry, so that
    no plan made before runs inside."""
    want = {}
    for family, value in choices.items():
        if family not in _FAMILIES:
            raise TypeError(f"force: unknown family {family!r}")
        enum = _FAMILIES[family]
        want[family] = enum[value.upper()] if isinstance(value, str) else enum(value)
    if ov_band is not None:
        want["ov_band"] = int(ov_band)
    outer = getattr(_select._forced, "choices", {})
    _select._forced.choices = {**outer, **want}
    _conv_engine.forget()
    try:
        yield
    finally:
        _select._forced.choices = outer
        _conv_engine.forget()


def last_conv_algo() -> ConvAlgo:
    """The algorithm of this thread's last pass through conv2d's forward
    kernel (the forward, or a stride-1 input gradient; not the direct
    kernels)."""
    return ConvAlgo(_backend.module_for("conv2d_forward")._last_conv_path())


def set_claiming(on: bool) -> None:
    """Process-wide: parallel kernels claim their work a block at a time
    (True, the default) or split it in static shares (False)."""
    for m in _backend.every_module():
        m._set_claiming(on)


def set_crowded(on: bool) -> None:
    """Process-wide: start (True) or end (False) a crowded spell in every
    module kernels run from (_backend.team_for)."""
    for m in _backend.every_module():
        m._set_crowded(on)
