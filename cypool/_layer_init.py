"""Initialisation shared by the numpy layers (cypool.layers) and the
zonotope layers (cypool.zonotope): weights drawn as torch draws them."""
from __future__ import annotations

import numpy as np

from . import _checks as chk


def dense_init(layer, in_features, out_features, bias, dtype, rng):
    """.weight (out, in) and .bias (out,) drawn like torch.nn.Linear's:
    uniform in +-1/sqrt(in_features)."""
    fin = chk.as_int(in_features, "in_features")
    fout = chk.as_int(out_features, "out_features")
    if fin < 1 or fout < 1:
        raise ValueError(f"in_features and out_features must be positive, got {(fin, fout)}")
    dt = chk.float_dtype_arg(dtype)
    gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    bound = 1.0 / np.sqrt(fin)
    layer.weight = gen.uniform(-bound, bound, size=(fout, fin)).astype(dt)
    layer.bias = gen.uniform(-bound, bound, size=fout).astype(dt) if bias else None
    layer.grad_weight = None
    layer.grad_bias = None
