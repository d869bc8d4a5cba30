"""Time single rows of the suite again, cypool alone, in this interpreter.

Run: python bench/recheck_rows.py [--repeats R]

For checking a wheel-versus-native gap that the three-run comparison
(compare_runs.py) shows on a few rows: run this alternately with the two
builds' interpreters, several processes each, and compare the medians:

    for i in 1 2 3 4; do wheel-venv/bin/python bench/recheck_rows.py
                         native-venv/bin/python bench/recheck_rows.py; done

The rows are those comparisons put above 10%: the max-pool backward
[32, 64, 112, 112] k3 s2 p1 and the ConvBig 2 convolution backward (c0e8be1),
then the max-pool backward [16, 256, 28, 28] k3 s1 p1 and the float64
argmax of [32, 25, 64, 64] (the seed 002 sweep at d = 25). Same harness,
pauses and warm-up as in the suite.
"""
from __future__ import annotations

import sys

import numpy as np

import cypool
from _harness import compare, start


def main(argv=None):
    args, n, reps = start(__doc__, argv, quick_repeats=3)
    rng = np.random.default_rng(0)
    rows = []
    for shape, k, s, p in [((32, 64, 112, 112), 3, 2, 1), ((16, 256, 28, 28), 3, 1, 1)]:
        x = rng.standard_normal(shape, dtype=np.float32)
        out, idx = cypool.max_pool2d(x, k, s, p, return_indices=True)
        r = compare({"cypool": lambda: cypool.max_pool2d_backward(out, idx, shape, num_threads=n)}, reps)
        rows.append((f"max_pool2d_backward {list(shape)} k{k} s{s} p{p}", r["cypool"]))
    xc = rng.standard_normal((32, 32, 32, 512), dtype=np.float32)
    w = (rng.standard_normal((32, 32, 4, 4)) / 8).astype(np.float32)
    g = rng.standard_normal(cypool.vector_conv2d(xc, w, None, 2, 1).shape, dtype=np.float32)
    r = compare({"cypool": lambda: cypool.vector_conv2d_backward(g, xc, w, 2, 1, num_threads=n)},
                reps, pause=0.15)
    rows.append(("vector_conv2d_backward ConvBig 2", r["cypool"]))
    xa = rng.standard_normal((32, 25, 64, 64))
    r = compare({"cypool": lambda: cypool.argmax2d(xa, num_threads=n)}, reps)
    rows.append(("argmax2d [32, 25, 64, 64] float64", r["cypool"]))
    print(f"{sys.prefix}: " + "; ".join(f"{name} {t * 1e3:.3f} ms" for name, t in rows))


if __name__ == "__main__":
    main()
