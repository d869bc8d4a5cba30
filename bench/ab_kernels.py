"""A/B timing of two builds of a kernel, interleaved in one process.

Run: python bench/ab_kernels.py BASE [NEW] [--op maxpool|backward|argmax]
     [--shape 16,256,28,28] [--kernel 3] [--stride 1] [--padding 1]
     [--index-dtype int64] [--threads 2] [--rounds 9]

BASE and NEW are git revisions of this repository (NEW defaults to the
working tree). Each side's cypool/ sources are compiled here as the "avx2"
variant, with the C flags of the working tree's setup.py
(compile_args("avx2")) and its own revision's Cython directives, into a
module of its own name (Python can't load two builds under one name).
--op maxpool (the default) calls max_pool2d_forward directly on preallocated
outputs, with the indices' streaming stores on (max_pool2d turns them on
only where the input and output fit in the last-level cache and the
indices on top would not: cypool._backend.streams), so no allocation or
page fault is timed; --op backward calls max_pool2d_backward with the
indices of one forward pass, into a preallocated gradient; --op argmax
calls argmax2d on the (N*C, H*W) maps, one segment a map. After checking
that both
give the same outputs and indices, each round times every side in turn
(a warm-up, then five timings of about 2 ms of calls); the best of the five
is that round's time. Prints, per side, the best and the median round in ns
per plane (map), and NEW / BASE.

This is a developer's tool for a kernel change: it needs git, Cython and gcc,
and measures one path on this machine. The suite (run_all.py) measures the
installed package against its peers.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cflags() -> list:
    """The C flags setup.py compiles the avx2 variant with."""
    os.environ.pop("CYPOOL_NATIVE", None)  # the portable variants, not -march=native
    spec = importlib.util.spec_from_file_location("cypool_setup", os.path.join(ROOT, "setup.py"))
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)  # defines the build functions; setup() runs only as __main__
    return setup_py.compile_args("avx2")


def sources(rev: str | None, dest: str) -> str:
    """cypool/ and setup.py of revision rev (None: the working tree) in dest."""
    if rev is None:
        shutil.copytree(os.path.join(ROOT, "cypool"), os.path.join(dest, "cypool"))
        shutil.copy(os.path.join(ROOT, "setup.py"), dest)
    else:
        archive = subprocess.run(["git", "-C", ROOT, "archive", rev, "cypool", "setup.py"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)
    return dest


def directives(setup_py: str) -> dict:
    """The DIRECTIVES dict of a setup.py, read without running it."""
    for node in ast.parse(open(setup_py).read()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DIRECTIVES"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit(f"no DIRECTIVES in {setup_py}")


def build(rev: str | None, name: str, out_dir: str) -> None:
    """Compile revision rev's kernels as module `name` in out_dir."""
    src = sources(rev, tempfile.mkdtemp(prefix=f"cypool-ab-{name}-"))
    pkg = os.path.join(src, "cypool")
    with open(os.path.join(pkg, "_kernels_avx2.pyx")) as f:
        text = f.read()
    pyx = os.path.join(pkg, f"{name}.pyx")
    with open(pyx, "w") as f:
        f.write(text)
    flags = [f"-X{k}={v}" for k, v in directives(os.path.join(src, "setup.py")).items()
             if k != "language_level"]
    c_file = os.path.join(pkg, f"{name}.c")
    subprocess.run([sys.executable, "-m", "cython", "-3", *flags, pyx, "-o", c_file],
                   check=True, capture_output=True)
    so = os.path.join(out_dir, name + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = os.environ.get("CC", "gcc")
    # (kernel sources sit in cypool/_kernels/ now, in cypool/ before)
    subprocess.run([cc, "-shared", "-fPIC", *cflags(),
                    "-I" + sysconfig.get_paths()["include"], "-I" + pkg,
                    "-I" + os.path.join(pkg, "_kernels"), c_file, "-o", so], check=True)
    shutil.rmtree(src, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("new", nargs="?")
    ap.add_argument("--op", default="maxpool", choices=["maxpool", "backward", "argmax"])
    ap.add_argument("--shape", default="16,256,28,28")
    ap.add_argument("--kernel", type=int, default=3)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--padding", type=int, default=1)
    ap.add_argument("--index-dtype", default="int64", choices=["int32", "int64"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args(argv)
    shape = tuple(int(v) for v in args.shape.split(","))
    k, s, p = args.kernel, args.stride, args.padding

    out_dir = tempfile.mkdtemp(prefix="cypool-ab-")
    sys.path.insert(0, out_dir)
    sides = {"base": args.base, "new": args.new}
    mods = {}
    for tag, rev in sides.items():
        build(rev, f"_ab_{tag}", out_dir)
        mods[tag] = importlib.import_module(f"_ab_{tag}")

    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    planes = x.reshape(-1, shape[-2], shape[-1])
    P, H, W = planes.shape
    OH, OW = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    bufs = {tag: (np.empty((P, OH, OW), np.float32), np.empty((P, OH, OW), args.index_dtype))
            for tag in mods}

    if args.op == "argmax":
        maps = planes.reshape(P, H * W)
        bufs = {tag: (np.empty(P, np.float32), np.empty((P, 2), args.index_dtype))
                for tag in mods}

    if args.op == "backward":
        # The indices of a forward pass, and a gradient to scatter at them.
        out, idx = bufs["base"]
        mods["base"].max_pool2d_forward(planes, out, idx, with_indices=True, scalar_only=False,
                                        stream_indices=False, kh=k, kw=k, sh=s, sw=s, ph=p,
                                        pw=p, dh=1, dw=1, num_threads=args.threads)
        grad_out = np.random.default_rng(1).standard_normal((P, OH * OW), dtype=np.float32)
        flat_idx = idx.reshape(P, OH * OW)
        bufs = {tag: (np.empty((P, H * W), np.float32), flat_idx) for tag in mods}

    def call(tag):
        out, idx = bufs[tag]
        if args.op == "backward":
            bad = mods[tag].max_pool2d_backward(grad_out, idx, out, OW, W, args.threads)
            assert bad == 0
            return
        if args.op == "argmax":
            mods[tag].argmax2d(maps, out, idx, W=W, segments=1, num_threads=args.threads)
            return
        mods[tag].max_pool2d_forward(planes, out, idx, with_indices=True, scalar_only=False,
                                     stream_indices=True, kh=k, kw=k, sh=s, sw=s, ph=p, pw=p,
                                     dh=1, dw=1, num_threads=args.threads)

    for tag in mods:
        call(tag)
    if not (np.array_equal(bufs["base"][0], bufs["new"][0])
            and np.array_equal(bufs["base"][1], bufs["new"][1])):
        raise SystemExit("the two builds disagree")
    t = time.perf_counter()
    call("base")
    inner = max(1, int(2e-3 / max(time.perf_counter() - t, 1e-6)))
    rounds = {tag: [] for tag in mods}
    for _ in range(args.rounds):
        for tag in mods:
            for _ in range(inner):
                call(tag)
            best = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(inner):
                    call(tag)
                best = min(best, (time.perf_counter() - t) / inner)
            rounds[tag].append(best / P * 1e9)
    label = {"base": args.base, "new": args.new or "working tree"}
    for tag, v in rounds.items():
        print(f"{label[tag]:>14}: best {min(v):.1f}, median {np.median(v):.1f} ns a plane")
    print(f"new / base: best {min(rounds['new']) / min(rounds['base']):.3f}, "
          f"median {np.median(rounds['new']) / np.median(rounds['base']):.3f}")
    shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
