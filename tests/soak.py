"""Concurrency, soak and leak runs, shared by tests/test_soak.py (short) and
bench/bench_soak.py (a minute, 100,000 calls).

* concurrency(seconds, threads): `threads` Python threads call a random mix
  of operations and layers on random shapes for `seconds`, while another
  thread keeps changing threadpoolctl's OpenMP limit; every result is
  compared with the result of the same call made alone beforehand.
* leak(calls): RSS (VmRSS) before and after `calls` mixed calls, after a
  warm-up.
"""
from __future__ import annotations

import os
import random
import threading
import time

import numpy as np

import cypool


def _cases(seed=0):
    """[(name, fn)]: calls with fixed inputs and explicit thread counts (the
    weight gradients' summation order depends on the thread count)."""
    rng = np.random.default_rng(seed)
    cases = []
    for nt in (1, 2):
        for shape, k, s, p in [((2, 8, 12, 12), 2, 2, 0), ((1, 20, 7, 7), 3, 2, 1), ((3, 5, 30, 30), 3, 1, 1)]:
            x = rng.standard_normal(shape, dtype=np.float32)
            x[0, 0, 0, :3] = x[0, 0, 1, 0]  # ties
            out, idx = cypool.max_pool2d(x, k, s, p, return_indices=True)
            g = rng.standard_normal(out.shape, dtype=np.float32)
            cases.append((f"max_pool2d {shape} nt{nt}",
                          lambda x=x, k=k, s=s, p=p, nt=nt: cypool.max_pool2d(
                              x, k, s, p, return_indices=True, num_threads=nt)))
            cases.append((f"max_pool2d_backward {shape} nt{nt}",
                          lambda g=g, idx=idx, shape=shape, nt=nt: cypool.max_pool2d_backward(
                              g, idx, shape, num_threads=nt)))
        x = rng.standard_normal((4, 6, 33, 17))
        cases.append((f"argmax2d nt{nt}", lambda x=x, nt=nt: cypool.argmax2d(x, return_values=True,
                                                                             num_threads=nt)))
        x = rng.standard_normal((2, 3, 16, 16), dtype=np.float32)
        w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
        g = rng.standard_normal((2, 4, 16, 16), dtype=np.float32)
        cases.append((f"conv2d nt{nt}", lambda x=x, w=w, nt=nt: cypool.conv2d(x, w, None, 1, 1, num_threads=nt)))
        cases.append((f"conv2d_backward nt{nt}",
                      lambda g=g, x=x, w=w, nt=nt: cypool.conv2d_backward(g, x, w, 1, 1, num_threads=nt)))
        z = rng.standard_normal((3, 10, 10, 24))
        wz = rng.standard_normal((5, 3, 3, 3))
        gz = rng.standard_normal((5, 8, 8, 24))
        cases.append((f"vector_conv2d nt{nt}", lambda z=z, wz=wz, nt=nt: cypool.vector_conv2d(
            z, wz, np.ones(5), num_threads=nt)))
        cases.append((f"vector_conv2d_backward nt{nt}", lambda gz=gz, z=z, wz=wz, nt=nt:
                      cypool.vector_conv2d_backward(gz, z, wz, num_threads=nt)))

    def layer_step(seed=seed):
        r = np.random.default_rng(seed)
        conv = cypool.Conv2d(2, 4, 3, padding=1, rng=1)
        pool = cypool.MaxPool2d(2)
        x = r.standard_normal((1, 2, 10, 10), dtype=np.float32)
        y = pool(conv(x))
        gx = conv.backward(pool.backward(np.ones_like(y)))
        return y, gx, conv.grad_weight
    cases.append(("Conv2d + MaxPool2d layers", layer_step))
    return cases


def _flat(res):
    return [a for a in (res if isinstance(res, tuple) else (res,)) if a is not None]


def _equal(a, b):
    fa, fb = _flat(a), _flat(b)
    return len(fa) == len(fb) and all(x.shape == y.shape and np.array_equal(x, y, equal_nan=True)
                                      for x, y in zip(fa, fb))


def concurrency(seconds: float = 60.0, threads: int = 8, seed: int = 0) -> dict:
    """Run the mix; returns {"calls", "mismatches", "threads", "limit changes", "hung"}."""
    from threadpoolctl import threadpool_limits

    cases = _cases(seed)
    expected = {name: fn() for name, fn in cases}
    stop = time.monotonic() + seconds
    counts = [0] * threads
    bad: list = []
    changes = [0]

    def worker(i):
        r = random.Random(seed * 1000 + i)
        while time.monotonic() < stop:
            name, fn = r.choice(cases)
            if not _equal(fn(), expected[name]):
                bad.append(name)
            counts[i] += 1

    def limiter():
        r = random.Random(seed)
        while time.monotonic() < stop:
            with threadpool_limits(limits=r.choice([1, 2, 4]), user_api="openmp"):
                time.sleep(0.01)
            changes[0] += 1

    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    pool.append(threading.Thread(target=limiter, daemon=True))
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=seconds + 60)
    hung = sum(t.is_alive() for t in pool)
    return {"calls": sum(counts), "mismatches": len(bad), "mismatched": sorted(set(bad)),
            "threads": threads, "limit changes": changes[0], "hung": hung}


def rss() -> int:
    """Resident set size in bytes (VmRSS), or 0 without /proc."""
    try:
        with open(f"/proc/{os.getpid()}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def leak(calls: int = 100_000, seed: int = 0) -> dict:
    """RSS growth over `calls` mixed calls after a warm-up of 2,000."""
    cases = _cases(seed)
    r = random.Random(seed)
    for _ in range(2000):
        r.choice(cases)[1]()
    before = rss()
    t = time.perf_counter()
    for _ in range(calls):
        r.choice(cases)[1]()
    return {"calls": calls, "rss growth bytes": rss() - before, "seconds": time.perf_counter() - t}
