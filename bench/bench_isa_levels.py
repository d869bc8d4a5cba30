"""cypool against itself: every instruction-set level this build has and this CPU runs.

Run: python bench/bench_isa_levels.py [--threads N] [--repeats R] [--quick]

The public functions on the target shapes of the other benches, each timed
with every kernel forced to one level (baseline, avx2, avx512), interleaved
in one run. This is the measurement behind cypool/_backend.py's choice: the
convolution runs on the best level, the max-pool and argmax kernels on the
best one up to AVX2 (CAPPED; the AVX-512 build no longer compiles them, so
its column is empty for them). Each case names the level its kernel gets by
default; ratios are each level's time over the best level's.
"""
from __future__ import annotations

import numpy as np

import cypool
from cypool import _backend
from _harness import compare, start, table
from bench_maxpool import QUICK_SHAPES as POOL_QUICK, SHAPES as POOL_SHAPES
from bench_vector_conv import QUICK as CONV_QUICK, SHAPES as CONV_SHAPES

ARGMAX_SHAPES = [(32, 245, 64, 64), (32, 5, 64, 64), (1, 1, 4096, 4096)]
ARGMAX_QUICK = [(4, 16, 64, 64)]


def runnable_levels():
    """Built levels this CPU runs, best first."""
    return list(_backend.RUNNABLE_ISAS)


def at_level(level, fn):
    """fn with every kernel taken from the `level` build (own kernel cache)."""
    cache: dict = {}

    def run():
        saved = _backend.isa_for, _backend._specialised
        _backend.isa_for, _backend._specialised = (lambda name: level), cache
        try:
            return fn()
        finally:
            _backend.isa_for, _backend._specialised = saved

    return run


def timed_by_level(levels, reps, case, fn, kernel_name):
    """(case naming its default level, median seconds per level), timed now:
    fn refers to the caller's loop variables."""
    # (the AVX-512 build has no max-pool or argmax kernels: _backend.CAPPED)
    levels = [lv for lv in levels if hasattr(_backend.load_variant(lv), kernel_name)]
    res = compare({lv: at_level(lv, fn) for lv in levels}, reps)
    return f"{case} [default {_backend.isa_for(kernel_name)}]", res


def main(argv=None):
    args, n, reps = start(__doc__, argv, quick_repeats=3)
    levels = runnable_levels()
    print(f"levels timed: {', '.join(levels)}")
    rng = np.random.default_rng(0)
    rows = []
    for shape, k, s, p in (POOL_QUICK if args.quick else POOL_SHAPES):
        x = rng.standard_normal(shape, dtype=np.float32)
        out, idx = cypool.max_pool2d(x, k, s, p, return_indices=True)
        rows.append(timed_by_level(
            levels, reps, f"max_pool2d fwd {list(shape)} k{k} s{s} p{p}",
            lambda: cypool.max_pool2d(x, k, s, p, return_indices=True, num_threads=n),
            "max_pool2d_forward"))
        rows.append(timed_by_level(
            levels, reps, f"max_pool2d_backward {list(shape)} k{k} s{s} p{p}",
            lambda: cypool.max_pool2d_backward(out, idx, shape, num_threads=n),
            "max_pool2d_backward"))
    for shape in (ARGMAX_QUICK if args.quick else ARGMAX_SHAPES):
        x = rng.standard_normal(shape, dtype=np.float32)
        rows.append(timed_by_level(
            levels, reps, f"argmax2d {list(shape)}",
            lambda: cypool.argmax2d(x, num_threads=n), "argmax2d"))
    for name, (C, H, W, E), O, k, s, p in (CONV_QUICK if args.quick else CONV_SHAPES):
        x = rng.standard_normal((C, H, W, E), dtype=np.float32)
        w = (rng.standard_normal((O, C, k, k)) / np.sqrt(C * k * k)).astype(np.float32)
        b = rng.standard_normal(O).astype(np.float32)
        g = rng.standard_normal(cypool.vector_conv2d(x, w, b, s, p).shape, dtype=np.float32)
        rows.append(timed_by_level(
            levels, reps, f"vector_conv2d {name} E={E}",
            lambda: cypool.vector_conv2d(x, w, b, s, p, num_threads=n), "vector_conv2d_forward"))
        rows.append(timed_by_level(
            levels, reps, f"vector_conv2d_backward {name} E={E}",
            lambda: cypool.vector_conv2d_backward(g, x, w, s, p, num_threads=n),
            "vector_conv2d_forward"))
    base = levels[0]
    print()
    print(table(f"median ms per level; ratios are level / {base}", rows, base=base))


if __name__ == "__main__":
    main()
