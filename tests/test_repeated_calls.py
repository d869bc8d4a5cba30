"""Repeats of checked small convolution calls (cypool/_kernels/_conv_memo.pxi): the
kernels remember a call that passed the Python checks and run its repeats
without them. A repeat must give what the checked call gives, and any
call that differs in a way the checks look at (a bias, grad_output or
num_threads they would refuse, another dtype, an array subclass) must get
the Python path's answer or error."""
import numpy as np
import pytest

import cypool
import reference as ref
from cypool import _conv_engine as engine

CASES = [  # (function family, x shape, weight shape): small calls on the direct kernels
    ("conv", (1, 28, 28), (2, 1, 5, 5)),
    ("conv", (2, 3, 9, 10), (5, 3, 3, 3)),
    ("vector", (1, 28, 28, 1), (2, 1, 5, 5)),
    ("vector", (3, 2, 7, 6, 1), (4, 2, 3, 2)),
]


def forward(family):
    return cypool.conv2d if family == "conv" else cypool.vector_conv2d


def backward(family):
    return cypool.conv2d_backward if family == "conv" else cypool.vector_conv2d_backward


@pytest.fixture(autouse=True)
def forget():
    engine.forget()
    yield


@pytest.mark.parametrize("family, xs, ws", CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_repeats_give_the_checked_calls_answer(rng, family, xs, ws, dtype):
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    first = forward(family)(x, w, b, 1, 1)
    g = rng.standard_normal(first.shape).astype(dtype)
    grads = backward(family)(g, x, w, 1, 1)
    for _ in range(3):
        np.testing.assert_array_equal(forward(family)(x, w, b, 1, 1), first)
        nob = forward(family)(x, w, None, 1, 1)  # the bias is added last
        np.testing.assert_array_equal(nob + b.reshape((-1,) + (1,) * (len(ws) - 2 + (family == "vector"))), first)
        for got, want in zip(backward(family)(g, x, w, 1, 1), grads):
            np.testing.assert_array_equal(got, want)
    # Fresh arrays every time, never one handed out before.
    assert forward(family)(x, w, b, 1, 1) is not forward(family)(x, w, b, 1, 1)
    # Views, one gradient at a time, and the reference.
    xv = np.ascontiguousarray(x[..., ::-1])[..., ::-1]
    np.testing.assert_array_equal(forward(family)(xv, w, b, 1, 1), first)
    gx, gw, gb = backward(family)(g, x, w, 1, 1, needs_weight_grad=False)
    assert gw is None
    np.testing.assert_array_equal(gx, grads[0])
    # (summed in another order: within rounding of the sum of |g|)
    scale = np.abs(g).sum() * (1e-6 if dtype == np.float32 else 1e-14)
    np.testing.assert_allclose(gb, grads[2], rtol=0, atol=scale)
    gx, gw, gb = backward(family)(g, x, w, 1, 1, needs_input_grad=False)
    assert gx is None
    np.testing.assert_array_equal(gw, grads[1])


def test_repeat_of_the_seed_matches_the_reference(rng):
    x = rng.standard_normal((1, 28, 28, 1))
    w = rng.standard_normal((2, 1, 5, 5))
    b = rng.standard_normal(2)
    for _ in range(3):
        out = cypool.vector_conv2d(x, w, b)
        np.testing.assert_allclose(out, ref.vector_conv2d(x[None], w, b, (1, 1), (0, 0), (1, 1))[0], rtol=1e-12)
        g = rng.standard_normal(out.shape)
        gx, gw, gb = cypool.vector_conv2d_backward(g, x, w)
        rgx, rgw, rgb = ref.vector_conv2d_backward(g[None], x[None], w, (1, 1), (0, 0), (1, 1))
        for got, want in ((gx, rgx[0]), (gw, rgw), (gb, rgb)):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family, xs, ws", CASES)
def test_a_repeat_with_bad_arguments_gets_the_checks_error(rng, family, xs, ws):
    x = rng.standard_normal(xs).astype(np.float32)
    w = rng.standard_normal(ws).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32)
    out = forward(family)(x, w, b)
    g = rng.standard_normal(out.shape).astype(np.float32)
    backward(family)(g, x, w)  # both remembered now
    with pytest.raises(ValueError, match="bias"):
        forward(family)(x, w, b[:-1] if ws[0] > 1 else np.zeros(2, np.float32))
    with pytest.raises(TypeError, match="bias"):
        forward(family)(x, w, b.astype(np.float64))
    with pytest.raises(ValueError, match="num_threads"):
        forward(family)(x, w, b, num_threads=0)
    with pytest.raises(ValueError, match="num_threads"):
        backward(family)(g, x, w, num_threads=-1)
    with pytest.raises(ValueError, match="grad_output"):
        backward(family)(g[..., :-1], x, w)
    with pytest.raises(TypeError, match="grad_output"):
        backward(family)(g.astype(np.float64), x, w)
    with pytest.raises(TypeError):
        forward(family)(x.astype(">f4"), w.astype(">f4"), b)
    with pytest.raises(TypeError, match="weight"):
        forward(family)(x, w.astype(np.float64), b)
    with pytest.raises(TypeError):
        forward(family)(x, w, b, 1.0)
    # A bias through a strided view, a list and a plain int stride: right
    # answers by the Python path.
    b2 = np.repeat(b, 2)[::2]
    np.testing.assert_array_equal(forward(family)(x, w, b2), out)
    np.testing.assert_array_equal(forward(family)(x, w, list(b)), out)
    np.testing.assert_array_equal(forward(family)(x, w, b, (1, 1)), out)


@pytest.mark.parametrize("family, xs, ws", CASES)
def test_one_predicate_takes_a_bias_or_grad_output_as_it_is(rng, family, xs, ws):
    # The memo runs a repeat exactly when the Python checks would take its
    # bias and grad_output as they are (_checks.plain_array, the kernels'
    # own predicate); any other is left to the Python path, which converts
    # it or raises.
    from cypool import _backend, _checks

    x = rng.standard_normal(xs)
    w = rng.standard_normal(ws)
    O, dt = ws[0], x.dtype
    out = forward(family)(x, w)
    g = rng.standard_normal(out.shape)
    backward(family)(g, x, w)  # both remembered now
    fam = engine.CONV2D if family == "conv" else engine.VECTOR_CONV2D
    memo_forward, memo_backward = _backend.kernel("memo_forward"), _backend.kernel("memo_backward")
    b = rng.standard_normal(O)
    biases = [b, np.repeat(b, 2)[::2], b[::-1], b.astype(np.float32), b.astype(">f8"), list(b),
              b[:-1], b.reshape(1, O), b.view(np.matrix).reshape(-1)]
    for bias in biases:
        plain = _checks.plain_array(bias, (O,), dt, True)
        assert (memo_forward(fam, x, w, bias, 1, 0, 1, None) is not None) is plain
    assert _checks.plain_array(b, (O,), dt, True) and not _checks.plain_array(b[::-1], (O,), dt, True)
    grads = [g, g[..., ::-1], np.asfortranarray(g), g.astype(np.float32), g.astype(">f8"),
             g[..., :-1], g[None]]
    for go in grads:
        plain = _checks.plain_array(go, out.shape, dt, False)
        assert (memo_backward(fam, go, x, w, 1, 0, 1, True, True, None) is not None) is plain
    assert _checks.plain_array(g[..., ::-1], out.shape, dt, False)  # any strides


def test_an_array_subclass_is_checked_the_python_way(rng):
    class Sub(np.ndarray):
        pass

    x = rng.standard_normal((1, 12, 12)).astype(np.float32)
    w = rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
    want = cypool.conv2d(x, w)
    cypool.conv2d(x, w)
    np.testing.assert_array_equal(cypool.conv2d(x.view(Sub), w), want)


def test_more_calls_than_the_memo_holds(rng):
    # 40 shapes in turn, twice: slots are reused; every answer stays right.
    cases = []
    for H in range(6, 46):
        x = rng.standard_normal((1, 1, H, 7)).astype(np.float32)
        w = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
        cases.append((x, w, ref.conv2d(x.astype(np.float64), w.astype(np.float64), None, (1, 1),
                                       ((0, 0), (0, 0)), (1, 1))))
    for _ in range(2):
        for x, w, want in cases:
            np.testing.assert_allclose(cypool.conv2d(x, w), want, rtol=1e-4, atol=1e-4)


@pytest.mark.thread_unsafe(reason="starts 4 threads of its own")
def test_repeats_from_many_threads_while_the_memo_turns_over(rng):
    # Four threads repeat calls of more shapes than the memo has slots, so
    # slots are rewritten while other threads look them up: every call must
    # still give its own checked answer (on a free-threaded Python the slots
    # are read and written truly at once; _conv_memo.pxi's lock).
    import threading

    shapes = [((1, 1 + k % 3, 6 + k % 7, 7 + k // 7), (2, 1 + k % 3, 3, 2)) for k in range(40)]
    calls = []
    for xs, ws in shapes:
        x = rng.standard_normal(xs)
        w = rng.standard_normal(ws)
        calls.append((x, w, ref.conv2d(x, w, None, (1, 1), ((1, 1), (1, 1)), (1, 1))))
    failures = []
    barrier = threading.Barrier(4)

    def run(offset):
        barrier.wait()
        for r in range(3):
            for k in range(len(calls)):
                x, w, want = calls[(k + offset) % len(calls)]
                got = cypool.conv2d(x, w, None, 1, 1)
                if got.shape != want.shape or not np.allclose(got, want, rtol=1e-10, atol=1e-10):
                    failures.append((offset, k))

    threads = [threading.Thread(target=run, args=(i * 10,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
