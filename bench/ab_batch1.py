"""Two builds' batch-1 paths, in alternating processes: the educational CNN's
training step and the Conv2d layer's forward + backward as it calls them.

Run: python bench/ab_batch1.py TREE_A TREE_B [--rounds R] [--steps K]

Each tree is a source tree with its kernels built in place (setup.py
build_ext --inplace). Each round runs one process per tree, in turn
(A, B, A, B, ...); each process times K training steps of
bench/cnn_models.CypoolNet on the digits shapes and K calls of each seed
convolution layer, and reports medians. The table gives the median over
rounds for each tree and B / A.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from _ab import alternating_runs

HERE = os.path.dirname(os.path.abspath(__file__))


def child(steps: int) -> None:
    import numpy as np
    import cypool

    sys.path.insert(0, HERE)
    import cnn_models

    rng = np.random.default_rng(0)
    res = {}
    net = cnn_models.CypoolNet(cnn_models.init_weights(0))
    xs = rng.random((64, 1, 28, 28)).astype(np.float32)
    ys = rng.integers(0, 10, 64)
    for i in range(200):
        net.step(xs[i % 64], ys[i % 64], 0.0)
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        net.step(xs[i % 64], ys[i % 64], 0.0)
        times.append(time.perf_counter() - t0)
    res["CNN training step, batch 1"] = statistics.median(times)
    for name, xshape, (o, c, k), input_grad in [
            ("Conv2d (1, 28, 28) by (2, 1, 5, 5), fwd + bwd", (1, 28, 28), (2, 1, 5), False),
            ("Conv2d (2, 12, 12) by (2, 2, 5, 5), fwd + bwd", (2, 12, 12), (2, 2, 5), True)]:
        layer = cypool.Conv2d(c, o, k, rng=0)
        x = rng.random(xshape).astype(np.float32)
        g = np.ones((o, xshape[1] - k + 1, xshape[2] - k + 1), np.float32)
        for _ in range(200):
            layer(x)
            layer.backward(g, needs_input_grad=input_grad)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            layer(x)
            layer.backward(g, needs_input_grad=input_grad)
            times.append(time.perf_counter() - t0)
        res[name] = statistics.median(times)
    print(json.dumps(res))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.steps)
        return
    runs = alternating_runs(__file__, {"a": args.a, "b": args.b}, args.rounds,
                            ["x", "x", "--steps", str(args.steps)])
    print(f"A = {args.a}, B = {args.b}: {args.rounds} rounds of alternating processes, "
          f"medians of {args.steps} calls")
    print()
    print("| call | A us | B us | B / A |")
    print("|---|---|---|---|")
    for name in runs["a"][0]:
        a = statistics.median(r[name] for r in runs["a"])
        b = statistics.median(r[name] for r in runs["b"])
        print(f"| {name} | {a * 1e6:.1f} | {b * 1e6:.1f} | {b / a:.3f} |")


if __name__ == "__main__":
    main()
