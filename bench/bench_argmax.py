"""Feature-map argmax: the benchmark of the question "the (row, col) of the
maximum of every H x W map of [N, C, H, W]", reproduced.

Run: python bench/bench_argmax.py [--threads N] [--repeats R] [--quick] [--plot PATH]

[32, d, 64, 64] float32 (and float64) with d from 5 to 245 in steps of 10:
cypool.argmax2d against numpy reshape/argmax/unravel_index, torch
flatten/argmax/divmod and the question's nested torch.stack baseline (small d
only), a Numba prange argmax (the best answer the question got, written here),
and torch.amax over (2, 3), a reduction that reads the data once: the
bandwidth floor.
"""
from __future__ import annotations

import numpy as np

import cypool
from _harness import (arg_parser, compare, default_threads, machine_line, numba, peers_report,
                      set_threads, table, torch)


def numpy_argmax2d(x):
    N, C, H, W = x.shape
    return np.stack(np.unravel_index(x.reshape(N, C, -1).argmax(-1), (H, W)), -1)


def make_numba_argmax():
    if numba is None:
        return None

    @numba.njit(parallel=True, cache=False)
    def nb(x):
        N, C, H, W = x.shape
        out = np.empty((N, C, 2), np.int64)
        flat = x.reshape(N * C, H * W)
        for p in numba.prange(N * C):
            a = np.argmax(flat[p])
            out[p // C, p % C, 0] = a // W
            out[p // C, p % C, 1] = a % W
        return out

    return nb


def torch_peers(x):
    tx = torch.from_numpy(x)
    W = x.shape[-1]

    def flat_argmax():
        a = tx.flatten(2).argmax(-1)
        return torch.stack((a // W, a % W), -1)

    def nested_stack():  # the question's baseline
        return torch.stack([torch.stack([torch.tensor(divmod(int(tx[n, c].argmax()), W))
                                         for c in range(tx.shape[1])])
                            for n in range(tx.shape[0])])

    return flat_argmax, nested_stack, lambda: tx.amax(dim=(2, 3))


def measure(x, n, reps, nb, with_nested):
    fns = {"cypool": lambda: cypool.argmax2d(x, num_threads=n), "numpy": lambda: numpy_argmax2d(x)}
    if nb is not None:
        fns["numba"] = lambda: nb(x)
    if torch is not None:
        flat, nested, amax = torch_peers(x)
        fns["torch"] = flat
        fns["torch.amax (floor)"] = amax
        if with_nested:
            fns["torch nested stack"] = nested
    return compare(fns, reps)


def main(argv=None):
    p = arg_parser(__doc__.splitlines()[0])
    p.add_argument("--plot", default="bench/results/argmax-latest.png",
                   help="where to save the plot (needs matplotlib); the README shows argmax.png")
    args = p.parse_args(argv)
    n = args.threads or default_threads()
    set_threads(n)
    print(machine_line(n))
    print(peers_report())
    nb = make_numba_argmax()
    rng = np.random.default_rng(0)
    reps = 5 if args.quick else args.repeats

    # Agreement first: every peer gives the same coordinates.
    x = rng.standard_normal((4, 6, 64, 64), dtype=np.float32)
    want = numpy_argmax2d(x)
    assert np.array_equal(cypool.argmax2d(x), want)
    if nb is not None:
        assert np.array_equal(nb(x), want)

    key_rows = []
    for shape in ([(32, 5, 64, 64), (4, 64, 64, 64), (1, 1, 1024, 1024)] if args.quick else
                  [(32, 245, 64, 64), (32, 5, 64, 64), (1, 1, 4096, 4096)]):
        xs = rng.standard_normal(shape, dtype=np.float32)
        key_rows.append((f"{list(shape)} float32", measure(xs, n, reps, nb, False)))
    print()
    print(table("argmax2d, target shapes", key_rows))

    sweep = {}
    ds = range(5, 66 if args.quick else 246, 10 if not args.quick else 30)
    for dtype in (np.float32, np.float64):
        rows = []
        for d in ds:
            xs = rng.standard_normal((32, d, 64, 64)).astype(dtype)
            rows.append((f"d={d}", measure(xs, n, max(3, reps // 3), nb, d <= 25)))
        sweep[np.dtype(dtype).name] = rows
        print()
        print(table(f"argmax sweep: [32, d, 64, 64] {np.dtype(dtype).name}", rows))

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        print("\nmatplotlib not installed: no plot")
        return
    import os

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=False)
    for ax, (dt, rows) in zip(axes, sweep.items()):
        peers = [k for k in rows[-1][1]]
        for peer in peers:
            xs = [int(c[2:]) for c, r in rows if peer in r]
            ys = [r[peer] * 1e3 for c, r in rows if peer in r]
            ax.plot(xs, ys, marker="o", ms=3, label=peer)
        ax.set_title(f"[32, d, 64, 64] {dt}, {n} threads")
        ax.set_xlabel("d")
        ax.set_ylabel("median ms")
        ax.legend(fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(args.plot) or ".", exist_ok=True)
    fig.savefig(args.plot, dpi=110)
    print(f"\nplot saved to {args.plot}")


if __name__ == "__main__":
    main()
