"""Thread control: num_threads, OMP defaults, threadpoolctl, and calls from
several Python threads at once."""
import os
import platform
import threading

import numpy as np
import pytest

import cypool
from cypool import _backend
from cypool._backend import kernels, module_for
from cypool._testing import set_claiming, set_crowded
import reference as ref

BIG = (4, 16, 64, 64)  # large enough to run in parallel


def openmp_built():
    return kernels.openmp_info()[0]


# The kernel each public function runs, where it may run from another
# variant module than the chosen one (_backend.CAPPED): each module records
# the team of its own kernels.
_KERNEL_OF = {cypool.max_pool2d: "max_pool2d_forward", cypool.argmax2d: "argmax2d"}


def team_of(fn, *args, **kw):
    """The team size fn(*args, **kw) ran on, called outside a crowded spell
    (a late thread in the call before, on a loaded machine, would put it on
    one thread), and its result."""
    set_crowded(False)
    res = fn(*args, **kw)
    return module_for(_KERNEL_OF.get(fn, "conv2d_forward")).last_team_size(), res


@pytest.mark.thread_unsafe(reason="asserts the team a call ran on: calls on other threads start crowded spells, process-wide")
def test_num_threads_is_what_the_kernel_runs_on(rng):
    if not openmp_built():
        pytest.skip("serial build")
    x = rng.standard_normal(BIG).astype(np.float32)
    assert team_of(cypool.max_pool2d, x, 2, num_threads=2)[0] == 2
    assert team_of(cypool.max_pool2d, x, 2, num_threads=1)[0] == 1
    assert team_of(cypool.argmax2d, x, num_threads=2)[0] == 2
    xv = rng.standard_normal((2, 20, 20, 64)).astype(np.float32)
    wv = rng.standard_normal((8, 2, 3, 3)).astype(np.float32)
    assert team_of(cypool.vector_conv2d, xv, wv, num_threads=2)[0] == 2
    assert team_of(cypool.vector_conv2d, xv, wv, num_threads=1)[0] == 1


def _threaded_case(rng):
    """An image batch big enough for a team, and a 3x3 weight for it;
    skips a serial build."""
    if not openmp_built():
        pytest.skip("serial build")
    return (rng.standard_normal(BIG).astype(np.float32),
            rng.standard_normal((8, 16, 3, 3)).astype(np.float32))


@pytest.mark.thread_unsafe(reason="asserts the team a call ran on: calls on other threads start crowded spells, process-wide")
def test_a_crowded_spell_runs_calls_on_the_calling_thread(rng):
    # After a team thread started late (its core taken by another
    # library's spinning threads), threaded calls run serial for a while,
    # with the same results; once the spell ends they use the team again.
    x, w = _threaded_case(rng)
    calls = [("max_pool2d_forward", lambda: cypool.max_pool2d(x, 2, return_indices=True, num_threads=2)),
             ("argmax2d", lambda: cypool.argmax2d(x, num_threads=2)),
             ("conv2d_forward", lambda: cypool.conv2d(x, w, None, 2, 1, num_threads=2))]
    for name, call in calls:
        set_crowded(False)
        expected = call()
        assert module_for(name).last_team_size() == 2
        set_crowded(True)
        assert _backend.crowded()
        got = call()
        assert module_for(name).last_team_size() == 1
        got, expected = ((got, expected) if isinstance(got, tuple) else ((got,), (expected,)))
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)
    set_crowded(False)
    assert not _backend.crowded()


@pytest.mark.thread_unsafe(reason="asserts the team a call ran on: calls on other threads start crowded spells, process-wide")
def test_a_spell_in_the_capped_kernels_module_counts(rng):
    # On an AVX-512 CPU the max-pool and argmax kernels run from the AVX2
    # module, whose late threads start spells in that module's clock: the
    # calls after them must see it too, or each waits for a thread that
    # does not run (a scheduler slice a call after a numpy product).
    x, w = _threaded_case(rng)
    assert team_of(cypool.max_pool2d, x, 2, num_threads=2)[0] == 2
    module_for("max_pool2d_forward")._set_crowded(True)  # that module alone
    try:
        assert _backend.crowded()
        cypool.max_pool2d(x, 2, num_threads=2)
        assert module_for("max_pool2d_forward").last_team_size() == 1
        cypool.conv2d(x, w, None, 2, 1, num_threads=2)
        assert module_for("conv2d_forward").last_team_size() == 1
    finally:
        set_crowded(False)


@pytest.mark.thread_unsafe(reason="set_claiming switches every thread's kernels, process-wide")
@pytest.mark.parametrize("claiming", [True, False])
def test_claimed_and_static_shares_give_the_reference(rng, claiming):
    # The kernels claim blocks of work; the A/B switch splits it in equal
    # static shares. Both must cover every item exactly once: odd counts
    # of items, more threads than items in a block, and non-contiguous
    # inputs (copied by the checks) included.
    if not openmp_built():
        pytest.skip("serial build")
    x = ref.random_values(rng, (3, 37, 29, 31), np.float32, ties=True, specials=True)[:, :, ::1, :]
    w = rng.standard_normal((5, 37, 3, 3)).astype(np.float32)
    xs = rng.standard_normal((3, 37, 29, 31)).astype(np.float32)[:, :, ::2]
    xv = rng.standard_normal((2, 3, 17, 19, 40))
    wv = rng.standard_normal((4, 3, 3, 3))
    set_claiming(claiming)
    try:
        out, idx = cypool.max_pool2d(x, 3, 2, 1, return_indices=True, num_threads=2)
        am = cypool.argmax2d(x, num_threads=2)
        co = cypool.conv2d(xs, w, None, 2, 1, num_threads=2)
        vo = cypool.vector_conv2d(xv, wv, None, 1, 1, num_threads=2)
        vg = cypool.vector_conv2d_backward(np.ones_like(vo), xv, wv, 1, 1, num_threads=2)[0]
    finally:
        set_claiming(True)
    r_out, r_idx = ref.max_pool2d(x, 3, 2, 1)
    np.testing.assert_array_equal(out, r_out)
    np.testing.assert_array_equal(idx, r_idx)
    W = x.shape[-1]
    flat = x.reshape(x.shape[0], x.shape[1], -1)
    expected = [[divmod(ref.first_max_position(m), W) for m in plane] for plane in flat]
    np.testing.assert_array_equal(am, np.array(expected))
    one, pad = (1, 1), ((1, 1), (1, 1))
    np.testing.assert_allclose(co, ref.conv2d(xs, w, np.zeros(5), (2, 2), pad, one),
                               rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(vo, ref.vector_conv2d(xv, wv, np.zeros(4), one, one, one),
                               rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(vg, ref.vector_conv2d_backward(np.ones_like(vo), xv, wv, one, one,
                                                              one)[0], rtol=1e-10, atol=1e-9)


def test_small_calls_stay_on_one_thread(rng):
    x = rng.standard_normal((1, 2, 24, 24))
    cypool.max_pool2d(x, 2, num_threads=2)
    assert module_for("max_pool2d_forward").last_team_size() == 1


@pytest.mark.thread_unsafe(reason="threadpoolctl limits are process-wide")
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
        assert team_of(cypool.max_pool2d, x, 2)[0] == 2


@pytest.mark.thread_unsafe(reason="starts 8 threads of its own")
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


@pytest.mark.thread_unsafe(reason="asserts the team a call ran on: calls on other threads start crowded spells, process-wide")
def test_each_python_thread_sees_its_own_team_size(rng):
    # last_team_size() answers for the calling thread: a serial call on
    # another thread in between does not change it.
    if not openmp_built():
        pytest.skip("serial build")
    x = rng.standard_normal(BIG).astype(np.float32)
    small = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    seen = {}
    parallel_done, serial_done = threading.Event(), threading.Event()

    def parallel():
        seen["parallel"] = team_of(cypool.max_pool2d, x, 2, num_threads=2)[0]
        parallel_done.set()
        serial_done.wait(10)
        seen["parallel after"] = module_for("max_pool2d_forward").last_team_size()

    def serial():
        parallel_done.wait(10)
        cypool.max_pool2d(small, 2, num_threads=2)
        seen["serial"] = module_for("max_pool2d_forward").last_team_size()
        serial_done.set()

    threads = [threading.Thread(target=parallel), threading.Thread(target=serial)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"parallel": 2, "serial": 1, "parallel after": 2}


@pytest.mark.thread_unsafe(reason="starts and ends crowded spells, process-wide")
def test_weight_grads_are_the_same_in_a_crowded_spell(rng):
    # The weight gradients are summed in parts, one per thread asked for:
    # the calling thread alone (a crowded spell) gives the team's bits.
    if not openmp_built():
        pytest.skip("serial build")
    x = rng.standard_normal((8, 16, 32, 32)).astype(np.float32)
    w = rng.standard_normal((16, 16, 3, 3)).astype(np.float32)
    g1 = rng.standard_normal((8, 16, 32, 32)).astype(np.float32)
    g2 = rng.standard_normal((8, 16, 16, 16)).astype(np.float32)
    xv = rng.standard_normal((2, 4, 16, 16, 33)).astype(np.float32)
    wv = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    gv = rng.standard_normal((2, 8, 16, 16, 33)).astype(np.float32)
    calls = [lambda: cypool.conv2d_backward(g1, x, w, 1, 1, needs_input_grad=False, num_threads=2),
             lambda: cypool.conv2d_backward(g2, x, w, 2, 1, needs_input_grad=False, num_threads=2),
             lambda: cypool.vector_conv2d_backward(gv, xv, wv, padding=1, needs_input_grad=False,
                                                   num_threads=2)]
    for call in calls:
        size, team = team_of(call)
        assert size == 2
        set_crowded(True)
        alone = call()
        assert kernels.last_team_size() == 1
        set_crowded(False)
        for a, b in zip(team, alone):
            if a is not None:
                np.testing.assert_array_equal(a, b)


@pytest.mark.thread_unsafe(reason="counts the regions of the module's one team")
def test_parallel_calls_run_on_cypools_own_team(rng):
    # gcc builds on Linux run the parallel blocks on cypool's own team
    # (_team.h): each parallel call opens one region on it, team threads
    # take part, and a call on one thread opens none.
    if not openmp_built():
        pytest.skip("serial build")
    mod = module_for("max_pool2d_forward")
    if mod.team_counts() is None:
        if (os.environ.get("CYPOOL_TEAM") == "libgomp"
                or os.environ.get("CYPOOL_EXPECT_LIBGOMP_TEAM") == "1"):  # CI's -DCYPOOL_LIBGOMP_TEAM leg
            pytest.skip("the parallel blocks run on libgomp's team, as asked")
        if platform.system() == "Linux" and "gcc" in platform.python_compiler().lower():
            pytest.fail("a gcc build on Linux runs its parallel blocks on libgomp's team")
        pytest.skip("the parallel blocks run on libgomp's team in this build")
    x = rng.standard_normal((8, 64, 56, 56)).astype(np.float32)
    want = ref.max_pool2d(x, 2, 2, 0, 1)[0]
    before = mod.team_counts()
    cypool.max_pool2d(x, 2, num_threads=1)
    assert mod.team_counts()["regions"] == before["regions"]
    joined = 0
    for calls in range(1, 201):
        set_crowded(False)
        np.testing.assert_array_equal(cypool.max_pool2d(x, 2, num_threads=2), want)
        now = mod.team_counts()
        opened = now["regions"] - before["regions"]
        assert opened + now["handed"] - before["handed"] == calls  # or handed to libgomp's pool
        # every thread number ran, on a team thread or on the calling thread
        assert now["joined"] + now["stolen"] == before["joined"] + before["stolen"] + opened
        joined = now["joined"] - before["joined"]
        if joined and calls >= 5:
            break
    assert joined > 0, "no team thread took part in 200 parallel calls"
