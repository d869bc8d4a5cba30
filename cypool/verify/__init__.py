"""Verify real networks: ONNX networks and VNN-LIB properties in, verdicts out.

::

    from cypool import verify
    net = verify.load_onnx("mnist-net_256x2.onnx")
    spec = verify.read_vnnlib("prop_0_0.03.vnnlib")
    res = verify.check(net, spec, timeout=60)
    res.status          # "holds", "violated" or "unknown"

``check`` first runs the box's centre and a corner, then bounds the
network by back-substitution (CROWN's relaxation, rounding charged: a
"holds" survives floating-point rounding), then attacks what the bounds
leave open (projected gradient descent from the corners where the
bounds' linear functions are least): every "violated" carries a
counterexample confirmed by the network's own float64 forward pass. The
command line, in VNN-COMP's form: ``python -m cypool.verify NET.onnx
SPEC.vnnlib [--timeout S] [--out RESULT]``, or a whole ``instances.csv``.
"""
from ._check import Result, attack, check
from ._net import Net
from ._onnx import load_onnx
from ._vnnlib import Spec, read_vnnlib

__all__ = ["load_onnx", "read_vnnlib", "check", "attack", "Spec", "Result", "Net"]
