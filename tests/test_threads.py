"""Thread control: num_threads, OMP defaults, threadpoolctl, and calls from
several Python threads at once."""
import threading

import numpy as np
import pytest

import cypool
from cypool._backend import kernels, module_for
import reference as ref

BIG = (4, 16, 64, 64)  # large enough to run in parallel


def openmp_built():
    return kernels.openmp_info()[0]


def test_num_threads_is_what_the_kernel_runs_on(rng):
    if not openmp_built():
        pytest.skip("serial build")
    x = rng.standard_normal(BIG).astype(np.float32)
    pool = module_for("max_pool2d_forward")
    cypool.max_pool2d(x, 2, num_threads=2)
    assert pool.last_team_size() == 2
    cypool.max_pool2d(x, 2, num_threads=1)
    assert pool.last_team_size() == 1
    cypool.argmax2d(x, num_threads=2)
    assert module_for("argmax2d").last_team_size() == 2
    conv = module_for("vector_conv2d_forward")
    xv = rng.standard_normal((2, 20, 20, 64)).astype(np.float32)
    wv = rng.standard_normal((8, 2, 3, 3)).astype(np.float32)
    cypool.vector_conv2d(xv, wv, num_threads=2)
    assert conv.last_team_size() == 2
    cypool.vector_conv2d(xv, wv, num_threads=1)
    assert conv.last_team_size() == 1


def test_small_calls_stay_on_one_thread(rng):
    x = rng.standard_normal((1, 2, 24, 24))
    cypool.max_pool2d(x, 2, num_threads=2)
    assert module_for("max_pool2d_forward").last_team_size() == 1


def test_threadpoolctl_limit_is_obeyed(rng):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    if not openmp_built():
        pytest.skip("serial build")
    x = rng.standard_normal(BIG).astype(np.float32)
    with threadpoolctl.threadpool_limits(limits=1, user_api="openmp"):
        assert kernels.max_threads() == 1
        cypool.max_pool2d(x, 2)
        assert module_for("max_pool2d_forward").last_team_size() == 1
        cypool.argmax2d(x)
        assert module_for("argmax2d").last_team_size() == 1
    with threadpoolctl.threadpool_limits(limits=2, user_api="openmp"):
        cypool.max_pool2d(x, 2)
        assert module_for("max_pool2d_forward").last_team_size() == 2


def test_concurrent_calls_from_python_threads_match_serial(rng):
    # Kernels release the GIL; eight threads at once must give serial results.
    inputs = [ref.random_values(rng, (2, 8, 40, 40), np.float32, ties=True, specials=True)
              for _ in range(8)]

    def work(x):
        out, idx = cypool.max_pool2d(x, 3, 2, 1, return_indices=True)
        g = cypool.max_pool2d_backward(np.ones_like(out), idx, x.shape)
        return out, idx, g, cypool.argmax2d(x)

    expected = [work(x) for x in inputs]
    results = [None] * len(inputs)
    barrier = threading.Barrier(len(inputs))

    def run(i):
        barrier.wait()
        for _ in range(5):
            results[i] = work(inputs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
