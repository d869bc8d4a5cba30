"""cypool's own thread team against libgomp's, built from the same source.

Run: python bench/bench_teams.py [--libgomp DIR] [--base DIR] [--rounds R] [--calls K] [--quick]

Both builds run every shape of the pooling, argmax and convolution benches
in processes of their own, alternating (own, libgomp, own, ...), R rounds.
Each process times K calls of each shape in each mode, each call right
after its prelude (and 0.2 s before each mode, so that the last mode's
library threads have gone to sleep):

* back to back: the same call again;
* after numpy: about 1 ms of single-threaded numpy work (elementwise);
* after BLAS: a 384 x 384 float32 numpy product (OpenBLAS's threads);
* after torch: a torch.amax over 6.4 MB on the same thread count;
* after Numba: a Numba prange loop over 1M floats, same thread count.

A mode whose peer is not installed is left out. The table gives, per
shape and mode, the median over rounds of each process's median call for
each team, the ratio own / libgomp, and the worst mode. --libgomp DIR
names a tree already built with CFLAGS=-DCYPOOL_LIBGOMP_TEAM; without it
the working tree's tracked files are copied to build/libgomp-team and
built there (a minute or two), and so is the own team's build: a copy in
build/own-team, so that both are the same source. --base DIR adds a third
build with cypool's team (another revision, built in place: the A/B
against the last landed commit) to the alternation, and a second table:
per mode, the median and range over the shapes of own / base.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ["back to back", "after numpy", "after BLAS", "after torch", "after Numba"]


def cases(quick: bool) -> list:
    """(name, setup(np) -> call) for every shape of the benches."""
    import numpy as np
    import cypool

    rng = np.random.default_rng(0)
    out = []

    def arr(shape, dtype=np.float32):
        return rng.standard_normal(shape).astype(dtype)

    argmax = [(32, 5, 64, 64), (8, 512, 7, 7), (64, 128, 28, 28), (32, 245, 64, 64),
              (1, 1, 4096, 4096)]
    pools = [((4, 512, 14, 14), 2, 2, 0), ((16, 96, 55, 55), 3, 2, 0), ((64, 512, 7, 7), 2, 2, 0),
             ((32, 64, 56, 56), 2, 2, 0), ((16, 256, 28, 28), 3, 1, 1), ((32, 512, 14, 14), 2, 2, 0),
             ((8, 1024, 7, 7), 3, 2, 1), ((64, 256, 7, 7), 3, 1, 1), ((32, 64, 112, 112), 3, 2, 1)]
    backward = [((32, 64, 56, 56), 2, 2, 0), ((16, 256, 28, 28), 3, 1, 1), ((8, 1024, 7, 7), 3, 2, 1)]
    convs = [((64, 6, 14, 14), (16, 6, 5, 5), 1, 0), ((32, 256, 14, 14), (64, 256, 1, 1), 1, 0),
             ((8, 3, 224, 224), (64, 3, 7, 7), 2, 3), ((32, 128, 28, 28), (128, 128, 3, 3), 1, 1),
             ((32, 64, 56, 56), (64, 64, 3, 3), 1, 1)]
    vconvs = [((1, 28, 28, 785), (16, 1, 4, 4), 2, 0), ((16, 13, 13, 1000), (32, 16, 4, 4), 2, 0),
              ((16, 32, 32, 8), (32, 16, 3, 3), 1, 1)]
    if quick:
        argmax, pools, backward = argmax[:2], pools[:3], backward[:1]
        convs, vconvs = convs[:2], vconvs[:1]
    for s in argmax:
        x = arr(s)
        out.append((f"argmax2d {list(s)}", lambda x=x: cypool.argmax2d(x)))
    for s, k, st, p in pools:
        x = arr(s)
        out.append((f"max_pool2d {list(s)} k{k} s{st} p{p}, indices",
                    lambda x=x, k=k, st=st, p=p: cypool.max_pool2d(x, k, st, p, return_indices=True)))
    for s, k, st, p in backward:
        x = arr(s)
        y, idx = cypool.max_pool2d(x, k, st, p, return_indices=True)
        g = arr(y.shape)
        out.append((f"max_pool2d_backward {list(s)} k{k} s{st} p{p}",
                    lambda g=g, idx=idx, s=s: cypool.max_pool2d_backward(g, idx, s)))
    for xs, ws, st, p in convs:
        x, w = arr(xs), arr(ws)
        out.append((f"conv2d {list(xs)} by {list(ws)} s{st} p{p}",
                    lambda x=x, w=w, st=st, p=p: cypool.conv2d(x, w, None, st, p)))
    for xs, ws, st, p in vconvs:
        x, w = arr(xs), arr(ws)
        out.append((f"vector_conv2d {list(xs)} by {list(ws)} s{st} p{p}",
                    lambda x=x, w=w, st=st, p=p: cypool.vector_conv2d(x, w, None, st, p)))
    return out


def preludes(threads: int) -> dict:
    """mode -> a function run right before each timed call."""
    import numpy as np

    a = np.ones(1 << 18, np.float32)
    b = np.ones_like(a)
    m = np.ones((384, 384), np.float32)
    res = {"back to back": lambda: None}

    def numpy_work():
        for _ in range(8):
            np.multiply(a, 1.0001, out=b)
            np.add(b, a, out=b)

    res["after numpy"] = numpy_work
    res["after BLAS"] = lambda: m @ m
    try:
        import torch

        torch.set_num_threads(threads)
        t = torch.ones(8, 200, 1000)
        res["after torch"] = lambda: torch.amax(t, dim=(1, 2))
    except ImportError:
        pass
    try:
        import numba

        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))

        @numba.njit(parallel=True, cache=False)
        def scale(v):
            s = 0.0
            for i in numba.prange(v.shape[0]):
                s += v[i] * 1.0001
            return s

        v = np.ones(1 << 20, np.float32)
        scale(v)
        res["after Numba"] = lambda: scale(v)
    except ImportError:
        pass
    return res


def child(calls: int, quick: bool, threads: int) -> None:
    """Time every case in every mode; print {case: {mode: median s}} as JSON."""
    import cypool
    from cypool._backend import kernels

    own = kernels.team_counts() is not None
    pre = preludes(threads)
    result = {"team": "own" if own else "libgomp", "times": {}}
    for name, call in cases(quick):
        for _ in range(3):
            call()
        row = {}
        for mode in MODES:
            if mode not in pre:
                continue
            p = pre[mode]
            time.sleep(0.2)  # the last mode's library threads asleep (OpenBLAS spins 0.1 s)
            p()
            call()
            times = []
            for _ in range(calls):
                p()
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            row[mode] = statistics.median(times)
        result["times"][name] = row
    result["file"] = cypool.__file__
    print(json.dumps(result))


def build(tree: str, libgomp: bool) -> None:
    """Copy the working tree's tracked and untracked, not ignored files to
    tree and build the kernels there in place."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        src = os.path.join(ROOT, f)
        if not os.path.isfile(src):
            continue
        dst = os.path.join(tree, f)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if not os.path.exists(dst) or os.path.getmtime(dst) < os.path.getmtime(src):
            shutil.copy2(src, dst)
    env = dict(os.environ)
    if libgomp:
        env["CFLAGS"] = (env.get("CFLAGS", "") + " -DCYPOOL_LIBGOMP_TEAM").strip()
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tree,
                   env=env, check=True, stdout=subprocess.DEVNULL)


def run_child(tree: str, args) -> dict:
    cmd = [sys.executable, os.path.join(tree, "bench", "bench_teams.py"), "--child", "--calls", str(args.calls),
           "--threads", str(args.threads)] + (["--quick"] if args.quick else [])
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--libgomp", default=None, help="a tree built with -DCYPOOL_LIBGOMP_TEAM")
    p.add_argument("--own", default=None, help="a tree built with cypool's own team")
    p.add_argument("--base", default=None, help="another revision's tree, built in place, to A/B against")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.calls, args.quick, args.threads)
        return
    trees = {"own": args.own and os.path.abspath(args.own),
             "libgomp": args.libgomp and os.path.abspath(args.libgomp)}
    for team in trees:
        if trees[team] is None:
            trees[team] = os.path.join(ROOT, "build", f"{team}-team")
            print(f"building {team} team in {trees[team]} ...", file=sys.stderr)
            build(trees[team], team == "libgomp")
    if args.base:
        trees["base"] = os.path.abspath(args.base)
    runs = {team: [] for team in trees}
    for r in range(args.rounds):
        for team in trees:
            res = run_child(trees[team], args)
            want = "own" if team == "base" else team
            assert res["team"] == want, f"{trees[team]} runs {res['team']}'s team"
            assert res["file"].startswith(os.path.abspath(trees[team])), res["file"]
            runs[team].append(res["times"])
    first = runs["own"][0]
    modes = [m for m in MODES if m in next(iter(first.values()))]
    print(f"cypool's own team against libgomp's, same source; {args.threads} threads, "
          f"{args.rounds} rounds of alternating processes, medians of {args.calls} calls")
    print()
    print("| call | " + " | ".join(f"{m}: own / libgomp us" for m in modes) + " | worst mode |")
    print("|---|" + "---|" * len(modes) + "---|")
    worst_all = 0.0
    for name in first:
        cells, worst = [], (0.0, "")
        for m in modes:
            own = statistics.median(run[name][m] for run in runs["own"])
            gomp = statistics.median(run[name][m] for run in runs["libgomp"])
            ratio = own / gomp
            worst = max(worst, (ratio, m))
            cells.append(f"{own * 1e6:.0f} / {gomp * 1e6:.0f} ({ratio:.2f}x)")
        worst_all = max(worst_all, worst[0])
        print(f"| {name} | " + " | ".join(cells) + f" | {worst[1]} {worst[0]:.2f}x |")
    print()
    print(f"worst ratio of any row and mode: {worst_all:.2f}x (target: at most 1.05x)")
    if "base" in runs:
        print()
        print(f"{trees['own']} against {trees['base']}, own / base over the {len(first)} shapes")
        print()
        print("| mode | median | range |")
        print("|---|---|---|")
        for m in modes:
            ratios = [statistics.median(run[name][m] for run in runs["own"])
                      / statistics.median(run[name][m] for run in runs["base"]) for name in first]
            print(f"| {m} | {statistics.median(ratios):.2f}x | {min(ratios):.2f}-{max(ratios):.2f}x |")


if __name__ == "__main__":
    main()
