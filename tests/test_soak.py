"""Concurrency, soak and leaks: short versions in every run, the full ones
(a minute of 8 threads, 100,000 calls) marked slow: `pytest -m slow`.
bench/bench_soak.py runs the full ones and prints the figures."""
import gc
import os
import weakref

import numpy as np
import pytest

import cypool
import soak


@pytest.mark.parametrize("seconds", [4, pytest.param(60, marks=pytest.mark.slow)])
def test_threads_calling_at_once_get_the_serial_results(seconds):
    pytest.importorskip("threadpoolctl")
    res = soak.concurrency(seconds, threads=8)
    assert res["hung"] == 0, res
    assert res["mismatches"] == 0, res
    assert res["calls"] > 100 and res["limit changes"] > 10, res


@pytest.mark.skipif(soak.rss() == 0, reason="no /proc: RSS unavailable")
@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="under ASan freed memory waits in quarantine: LeakSanitizer checks leaks there")
@pytest.mark.parametrize("calls", [20_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_mixed_calls_do_not_grow_memory(calls):
    res = soak.leak(calls)
    assert res["rss growth bytes"] < 5 * 2**20, res


@pytest.mark.parametrize("make", [
    lambda: (cypool.MaxPool2d(2), np.ones((1, 2, 6, 6))),
    lambda: (cypool.MaxUnpool2d(2), None),
    lambda: (cypool.GlobalMaxPool2d(), np.ones((1, 2, 6, 6))),
    lambda: (cypool.Conv2d(2, 3, 3, rng=0), np.ones((1, 2, 6, 6), np.float32)),
    lambda: (cypool.VectorConv2d(2, 3, 3, rng=0), np.ones((2, 6, 6, 4), np.float32)),
])
def test_layers_and_their_kept_arrays_are_freed_when_dropped(make):
    layer, x = make()
    kept = []
    if x is not None:
        y = layer(x)
        layer.backward(np.ones_like(y))
        kept = [weakref.ref(v) for v in vars(layer).values() if isinstance(v, np.ndarray) and v is not x]
        del y
    ref = weakref.ref(layer)
    del layer
    gc.collect()
    assert ref() is None
    assert all(r() is None for r in kept)
