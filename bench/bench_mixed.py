"""cypool's kernels inside a mixed program, against their own steady state.

Run: python bench/bench_mixed.py [--threads N] [--repeats R] [--quick] [--static-ab]

Real programs do not call one kernel in a loop. A numpy CNN runs a BLAS
product for its dense layer between cypool's layers; a verification script
runs torch for the network and cypool for the zonotopes. Each of those
libraries leaves threads behind: OpenBLAS's spin for about 0.1 s after a
product, torch's OpenMP team spins after its region. On a 2-core machine
those threads hold a core that the next kernel's thread team needs.

For each operation and each peer (cypool, and torch's kernel for the same
job where torch is installed), every round runs a burst of five timed calls
after one of these preludes, in a random order, the peers in turn:

* steady: three untimed calls of the same kernel (its best case, outside
  a crowded spell: see cypool._backend.threads_for);
* after matmul: one 768 x 768 float32 numpy product;
* after the other library: three calls of the other peer's kernel (torch's
  for cypool, cypool's for torch; without torch installed, a matmul);
* after the other, paused: the same, then a 150 ms sleep (the script of the
  report that the strided convolution stalled at 8 ms a call after torch).

It prints, per condition, the median over rounds of each burst's median
call, and as a multiple of the peer's steady state; the median over rounds
of the first call after the pause alone (a program that calls a kernel
now and then meets it at every call); the worst burst median after the
pause (the report's script, whose stalls this condition reproduces); and
the worst burst median of any condition. A second table gives the same
medians as milliseconds lost against the steady state. --static-ab adds
cypool with its work split in equal static shares (the old threading),
interleaved in the same rounds, to show what claiming blocks of work buys
(docs/performance.md).
"""
from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import cypool
from cypool._testing import set_claiming, set_crowded
from _harness import start, torch

BURST = 5
PAUSE = 0.15
CONDITIONS = ["steady", "after matmul", "after the other library", "after the other, paused"]
FIRST = "first call after the pause"


def cases(quick: bool, n: int):
    """(name, {peer: fn}) for each operation."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4 if quick else 16, 32, 32, 32), dtype=np.float32)
    w = rng.standard_normal((64, 32, 3, 3), dtype=np.float32)
    pool = rng.standard_normal((8 if quick else 32, 64, 56, 56), dtype=np.float32)
    zx = rng.standard_normal((1, 28, 28, 785), dtype=np.float32)
    zw = rng.standard_normal((16, 1, 4, 4), dtype=np.float32)
    zb = rng.standard_normal(16, dtype=np.float32)
    out = [
        ("conv2d 3x3 stride 2", {"cypool": lambda: cypool.conv2d(x, w, None, 2, 1, num_threads=n)}),
        ("conv2d 3x3 stride 1", {"cypool": lambda: cypool.conv2d(x, w, None, 1, 1, num_threads=n)}),
        ("max_pool2d k2 with indices", {"cypool": lambda: cypool.max_pool2d(pool, 2, return_indices=True, num_threads=n)}),
        ("argmax2d", {"cypool": lambda: cypool.argmax2d(pool, num_threads=n)}),
        ("vector_conv2d ConvSmall 1", {"cypool": lambda: cypool.vector_conv2d(zx, zw, zb, 2, 0, num_threads=n)}),
    ]
    # The backward passes and the small-plane pool: kernels that split
    # static shares before they claimed their work too.
    pout, pidx = cypool.max_pool2d(pool, 2, return_indices=True)
    pg = rng.standard_normal(pout.shape, dtype=np.float32)
    small = rng.standard_normal((8 if quick else 32, 256, 7, 7), dtype=np.float32)
    cg = rng.standard_normal((x.shape[0], 64, 16, 16), dtype=np.float32)
    out += [
        ("max_pool2d_backward k2", {"cypool": lambda: cypool.max_pool2d_backward(pg, pidx, pool.shape, num_threads=n)}),
        ("max_unpool2d k2", {"cypool": lambda: cypool.max_unpool2d(pout, pidx, 2, num_threads=n)}),
        ("max_pool2d 3x3 s1 p1, 7x7 planes", {"cypool": lambda: cypool.max_pool2d(small, 3, 1, 1, return_indices=True, num_threads=n)}),
        ("conv2d input grad, stride 2", {"cypool": lambda: cypool.conv2d_backward(cg, x, w, 2, 1, needs_weight_grad=False, num_threads=n)}),
    ]
    if torch is not None:
        import torch.nn.functional as F

        tx, tw, tp = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(pool)
        tzx, tzw, tzb = torch.from_numpy(zx), torch.from_numpy(zw), torch.from_numpy(zb)
        W = pool.shape[-1]

        def t_argmax():
            a = tp.flatten(2).argmax(-1)
            return torch.stack((a // W, a % W), -1)

        def t_vconv():
            o = F.conv2d(tzx.permute(3, 0, 1, 2), tzw, None, 2, 0)
            o[0] += tzb.view(-1, 1, 1)
            return o.permute(1, 2, 3, 0).contiguous()

        tpout, tpidx = F.max_pool2d(tp, 2, return_indices=True)
        tpg, tsmall, tcg = torch.from_numpy(pg), torch.from_numpy(small), torch.from_numpy(cg)
        torch_fns = [lambda: F.conv2d(tx, tw, None, 2, 1), lambda: F.conv2d(tx, tw, None, 1, 1),
                     lambda: F.max_pool2d(tp, 2, return_indices=True), t_argmax, t_vconv,
                     lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                         tpg, tp, [2, 2], [2, 2], [0, 0], [1, 1], False, tpidx),
                     lambda: F.max_unpool2d(tpout, tpidx, 2),
                     lambda: F.max_pool2d(tsmall, 3, 1, 1, return_indices=True),
                     lambda: torch.nn.grad.conv2d_input(tx.shape, tw, tcg, stride=2, padding=1)]
        for (_, peers), fn in zip(out, torch_fns):
            peers["torch"] = fn
    return out


def static_shares(fn):
    """fn as cypool ran before it claimed work: the kernels' work split in
    equal static shares, and never a crowded spell (a late team thread does
    not make the next calls serial)."""
    def run():
        set_claiming(False)
        set_crowded(False)
        try:
            return fn()
        finally:
            set_claiming(True)
            set_crowded(False)
    return run


def measure(peers: dict, rounds: int, a: np.ndarray, rng) -> dict:
    """{peer: {condition: [burst medians]}}, the conditions and peers in a
    random order each round."""
    res = {p: {c: [] for c in CONDITIONS + [FIRST]} for p in peers}
    others = {p: [fn for q, fn in peers.items() if q.startswith("torch") != p.startswith("torch")]
              for p in peers}
    for fn in peers.values():  # first-call costs (thread pools, caches)
        fn()
    for _ in range(rounds):
        for c in rng.permutation(CONDITIONS):
            for p in rng.permutation(list(peers)):
                fn = peers[p]
                time.sleep(0.02)
                if c == "steady":
                    # The best case: outside a crowded spell that an
                    # earlier condition's late thread began.
                    set_crowded(False)
                    for _ in range(3):
                        fn()
                elif c == "after matmul":
                    a @ a
                else:
                    other = others[p] or [lambda: a @ a]
                    for _ in range(3):
                        other[0]()
                    if c == "after the other, paused":
                        time.sleep(PAUSE)
                ts = []
                for _ in range(BURST):
                    t = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t)
                res[p][c].append(statistics.median(ts))
                if c == "after the other, paused":
                    res[p][FIRST].append(ts[0])
    return res


def report(rows) -> str:
    head = ("| operation | peer | steady ms | " + " | ".join(CONDITIONS[1:] + [FIRST])
            + " | worst burst after the pause | worst burst |")
    lines = ["### Burst medians against the steady state (median over rounds)", "", head,
             "|" + "---|" * (len(CONDITIONS) + 5)]
    for name, res in rows:
        for p, conds in res.items():
            st = statistics.median(conds["steady"])
            cells = []
            for c in CONDITIONS[1:] + [FIRST]:
                m = statistics.median(conds[c])
                cells.append(f"{m * 1e3:.2f} ({m / st:.2f}x)")
            paused = max(conds["after the other, paused"])
            worst = max(max(conds[c]) for c in CONDITIONS)
            lines.append(f"| {name} | {p} | {st * 1e3:.2f} | " + " | ".join(cells)
                         + f" | {paused / st:.2f}x | {worst / st:.2f}x |")
    return "\n".join(lines)


def report_lost(rows) -> str:
    """The same medians as time lost against the peer's steady state: a
    ratio makes a fixed cost (a CPU taken by another library's thread, a
    cache refilled after a pause) look larger on a shorter kernel."""
    head = "| operation | peer | " + " | ".join(CONDITIONS[1:] + [FIRST]) + " |"
    lines = ["### Milliseconds lost against the steady state (median over rounds)", "", head,
             "|" + "---|" * (len(CONDITIONS) + 2)]
    for name, res in rows:
        for p, conds in res.items():
            st = statistics.median(conds["steady"])
            cells = [f"{(statistics.median(conds[c]) - st) * 1e3:+.2f}" for c in CONDITIONS[1:] + [FIRST]]
            lines.append(f"| {name} | {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    static_ab = "--static-ab" in argv
    argv = [v for v in argv if v != "--static-ab"]
    args, n, repeats = start(__doc__, argv, quick_repeats=3)
    rounds = repeats if args.quick else max(repeats, 20)
    a = np.random.default_rng(1).standard_normal((768, 768), dtype=np.float32)
    rng = np.random.default_rng(2)
    rows = []
    for name, peers in cases(args.quick, n):
        if static_ab:
            peers["cypool, static shares"] = static_shares(peers["cypool"])
        rows.append((name, measure(peers, rounds, a, rng)))
    print(f"{rounds} rounds of {BURST}-call bursts per condition and peer\n")
    print(report(rows))
    print()
    print(report_lost(rows))


if __name__ == "__main__":
    main()
