"""Time single rows of the suite again, cypool alone, in this interpreter.

Run: python bench/recheck_rows.py [--repeats R]

For checking a wheel-versus-native gap that the three-run comparison
(compare_runs.py) shows on a few rows: run this alternately with the two
builds' interpreters, several processes each, and compare the medians:

    for i in 1 2 3 4; do wheel-venv/bin/python bench/recheck_rows.py
                         native-venv/bin/python bench/recheck_rows.py; done

The rows are the two the last comparison put above 10%: the max-pool
backward [32, 64, 112, 112] k3 s2 p1 and the ConvBig 2 convolution
backward. Same harness, pauses and warm-up as in the suite.
"""
from __future__ import annotations

import sys

import numpy as np

import cypool
from _harness import compare, start


def main(argv=None):
    args, n, reps = start(__doc__, argv, quick_repeats=3)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64, 112, 112), dtype=np.float32)
    out, idx = cypool.max_pool2d(x, 3, 2, 1, return_indices=True)
    xc = rng.standard_normal((32, 32, 32, 512), dtype=np.float32)
    w = (rng.standard_normal((32, 32, 4, 4)) / 8).astype(np.float32)
    g = rng.standard_normal(cypool.vector_conv2d(xc, w, None, 2, 1).shape, dtype=np.float32)
    pool = compare({"cypool": lambda: cypool.max_pool2d_backward(out, idx, x.shape, num_threads=n)}, reps)
    conv = compare({"cypool": lambda: cypool.vector_conv2d_backward(g, xc, w, 2, 1, num_threads=n)},
                   reps, pause=0.15)
    print(f"{sys.prefix}: max_pool2d_backward [32, 64, 112, 112] k3 s2 p1 {pool['cypool'] * 1e3:.3f} ms; "
          f"vector_conv2d_backward ConvBig 2 {conv['cypool'] * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
