"""Layer classes in a small numpy CNN, train/eval behaviour."""
import numpy as np
import pytest

import cypool
import reference as ref


def numeric_grad(f, x, eps):
    """Central finite differences of the scalar function f at x."""
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        g[i] = (f(xp) - f(xm)) / (2 * eps)
    return g


def test_maxpool_layer_train_eval(rng):
    x = ref.random_values(rng, (2, 3, 8, 8), np.float32, ties=True)
    layer = cypool.MaxPool2d(2)
    out = layer(x)
    assert layer.indices is not None and layer.indices.shape == out.shape
    g = rng.standard_normal(out.shape).astype(np.float32)
    np.testing.assert_allclose(layer.backward(g), ref.max_pool2d_backward(g, layer.indices, x.shape))
    layer.eval()
    assert layer.indices is None
    np.testing.assert_array_equal(layer(x), out)
    assert layer.indices is None
    layer.train()
    layer(x)
    assert layer.indices is not None


def test_batch_one_training_step_like_seed_000(rng):
    # An educational numpy CNN: conv -> relu -> MaxPooling2D((2, 24, 24), 2) at batch size 1.
    pool = cypool.MaxPool2d(2, stride=2)
    for _ in range(5):
        a = np.maximum(rng.standard_normal((1, 2, 24, 24)), 0)  # ReLU output: many tied zeros
        out = pool.forward(a)
        assert out.shape == (1, 2, 12, 12)
        g = rng.standard_normal(out.shape)
        gi = pool.backward(g)
        np.testing.assert_allclose(gi, ref.max_pool2d_backward(g, pool.indices, a.shape))
        # unbatched input in that library's (depth, H, W) layout
        out3 = pool.forward(a[0])
        np.testing.assert_array_equal(out3, out[0])
        assert pool.backward(g[0]).shape == (2, 24, 24)


def test_maxpool_gradient_is_the_derivative(rng):
    # Finite differences on distinct values: d sum(w * pool(x)) / dx.
    x = rng.permutation(np.arange(2 * 7 * 9, dtype=np.float64)).reshape(1, 2, 7, 9) / 10
    layer = cypool.MaxPool2d(3, stride=2, padding=1)
    w = rng.standard_normal(layer(x).shape)
    analytic = layer.backward(w)
    numeric = numeric_grad(lambda v: (layer(v) * w).sum(), x, 1e-4)
    np.testing.assert_allclose(analytic, numeric, atol=1e-6)


def test_unpool_layer_backward_is_exact_gradient(rng):
    x = rng.standard_normal((1, 2, 3, 3))
    idx = rng.integers(0, 16, size=x.shape)  # repeats: only the last writer has a gradient
    layer = cypool.MaxUnpool2d(2, stride=1, padding=0)
    out = layer(x, idx)
    w = rng.standard_normal(out.shape)
    analytic = layer.backward(w)
    numeric = numeric_grad(lambda v: (layer(v, idx) * w).sum(), x, 1e-6)
    np.testing.assert_allclose(analytic, numeric, atol=1e-6)
    with pytest.raises(ValueError, match="grad_output"):
        layer.backward(w[..., :1])


def test_pool_unpool_roundtrip_layers(rng):
    x = ref.random_values(rng, (1, 4, 10, 10), np.float32)
    pool, unpool = cypool.MaxPool2d(2), cypool.MaxUnpool2d(2)
    y = pool(x)
    z = unpool(y, pool.indices, output_size=x.shape)
    assert z.shape == x.shape
    g = unpool.backward(np.ones_like(z))
    np.testing.assert_array_equal(g, np.ones_like(y))
    assert pool.backward(g).sum() == y.size
