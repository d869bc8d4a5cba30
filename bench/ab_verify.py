"""Two builds' cypool.verify.check on VNN-COMP folders, in alternating
processes: the A/B of a change to the verifier against the last landing.

Run: python bench/ab_verify.py TREE_A TREE_B FOLDER... [--rounds R] [--pause S]

Each tree is a source tree with its kernels built in place (setup.py
build_ext --inplace); each folder holds an instances.csv with its ONNX
networks and VNN-LIB specs. Each round runs one process per tree, in turn
(A, B, A, B, ...); each process checks every instance of every folder
once, on 2 threads, S seconds apart (0.05: after a pause, as a user's
call comes; bench_verify.py --vnncomp pauses 0.2 s and times the peers
too), after one untimed check per network. The table gives, per network
and folder, each round's median ms per instance, and whether both trees
gave the same verdicts.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from _ab import alternating_runs


def child(folders, pause: float) -> None:
    from cypool import verify
    from cypool.verify.__main__ import read_instances

    res = {}
    for folder in folders:
        rows = read_instances(os.path.join(folder, "instances.csv"))
        nets, per = {}, {}
        for net_path, spec_path, _ in rows:
            if net_path not in nets:
                nets[net_path] = verify.load_onnx(net_path).with_threads(2)
                verify.check(nets[net_path], verify.read_vnnlib(spec_path))
        for net_path, spec_path, _ in rows:
            spec = verify.read_vnnlib(spec_path)
            time.sleep(pause)
            t = time.perf_counter()
            status = verify.check(nets[net_path], spec).status
            per.setdefault(os.path.basename(net_path), []).append((time.perf_counter() - t, status))
        name = os.path.basename(os.path.normpath(folder))
        entries = {name: [x for v in per.values() for x in v]}
        if len(per) > 1:
            entries.update({f"{name}: {net}": v for net, v in per.items()})
        for key, v in entries.items():  # median ms, and the verdicts' initials in order
            res[key] = [statistics.median(t for t, _ in v) * 1e3, "".join(s[0] for _, s in v)]
    print(json.dumps(res))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("folders", nargs="+")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--pause", type=float, default=0.05)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    folders = [os.path.abspath(f) for f in args.folders]
    if args.child:
        child(folders, args.pause)
        return
    runs = alternating_runs(__file__, {"a": args.a, "b": args.b}, args.rounds,
                            ["x", "x", *folders, "--pause", str(args.pause)])
    print(f"A = {args.a}, B = {args.b}: {args.rounds} rounds of alternating processes, "
          f"{args.pause} s between checks; median ms per instance, each round")
    print()
    print("| folder | A | B | same verdicts |")
    print("|---|---|---|---|")
    for name in runs["a"][0]:
        a = " / ".join(f"{r[name][0]:.2f}" for r in runs["a"])
        b = " / ".join(f"{r[name][0]:.2f}" for r in runs["b"])
        same = len({r[name][1] for side in runs.values() for r in side}) == 1
        print(f"| {name} | {a} | {b} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
