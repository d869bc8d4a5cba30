"""The educational CNN of bench/cnn_models.py: cypool's layers in a numpy
network learn exactly what PyTorch's network learns, the numpy-only network
agrees too, and the MNIST loader reads IDX files."""
import gzip
import os
import sys

import numpy as np
import pytest

from helpers import torch_or_skip

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import cnn_models as m  # noqa: E402


def random_digits(rng, n):
    """Images with a class-dependent bright square, so that there is
    something to learn, and their labels."""
    y = rng.integers(0, 10, size=n)
    x = rng.random((n, 1, 28, 28)) * 0.3
    for i, c in enumerate(y):
        r, col = 2 + 2 * (c // 5) * 5, 2 + 5 * (c % 5)
        x[i, 0, r:r + 6, col:col + 5] += 0.7
    return x, y


@pytest.mark.parametrize("batch", [1, 4])
def test_cypool_network_follows_torch_step_by_step(batch):
    torch = torch_or_skip()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    w = m.init_weights(3, np.float64)
    net = m.CypoolNet(w)
    _, _, tstep, _ = m.torch_net(w, lr=0.05)
    x, y = random_digits(rng, 120 * batch)
    diffs = []
    for i in range(120):
        sl = i if batch == 1 else slice(i * batch, (i + 1) * batch)
        diffs.append(abs(net.step(x[sl], y[sl], 0.05) - tstep(x[sl], y[sl])))
    assert max(diffs) < 1e-8, max(diffs)


def test_numpy_network_agrees_with_cypool_network():
    rng = np.random.default_rng(1)
    w = m.init_weights(4, np.float64)
    a, b = m.NumpyNet(w), m.CypoolNet(w)
    x, y = random_digits(rng, 60)
    for i in range(60):
        assert abs(a.step(x[i], y[i], 0.05) - b.step(x[i], y[i], 0.05)) < 1e-10
    np.testing.assert_allclose(a.conv1.w, b.conv1.weight, rtol=1e-10, atol=1e-12)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))


def test_numpy_parts_net_times_the_same_numpy_work():
    """The bound bench_cnn.py prints stands only if the free layers hand
    the numpy parts arrays of the real layers' shapes and dtype."""
    rng = np.random.default_rng(1)
    w = m.init_weights(0)
    real, parts = m.CypoolNet(w), m.NumpyPartsNet(w)
    x = rng.random((1, 28, 28)).astype(np.float32)
    for name, inp in (("conv1", x), ("pool", None), ("conv2", None)):
        real_layer, free = getattr(real, name), getattr(parts, name)
        if inp is None:
            inp = last
        out = real_layer.forward(inp)
        assert free.out.shape == out.shape and free.out.dtype == out.dtype
        assert free.grad_in.shape == inp.shape and free.grad_in.dtype == inp.dtype
        last = np.maximum(out, 0)
    assert np.isfinite(parts.step(x, 3, 0.01))


def test_cypool_network_learns_the_digits():
    pytest.importorskip("sklearn", reason="scikit-learn (a bench extra) not installed")
    xtr, ytr, xte, yte = m.load_digits_28()
    net = m.CypoolNet(m.init_weights(0))
    order = np.random.default_rng(2)
    for _ in range(3):
        for i in order.permutation(len(ytr)):
            net.step(xtr[i], ytr[i], 0.01)
    assert (net.predict(xte) == yte).mean() >= 0.9


def write_idx(path, a, code):
    dims = b"".join(int(d).to_bytes(4, "big") for d in a.shape)
    data = bytes([0, 0, code, a.ndim]) + dims + a.astype(a.dtype.newbyteorder(">")).tobytes()
    with (gzip.open if path.endswith(".gz") else open)(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_loader_reads_idx_files(tmp_path, gz):
    rng = np.random.default_rng(5)
    ext = ".gz" if gz else ""
    parts = {}
    for part, n in (("train", 7), ("t10k", 3)):
        imgs = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx(str(tmp_path / f"{part}-images-idx3-ubyte{ext}"), imgs, 0x08)
        write_idx(str(tmp_path / f"{part}-labels-idx1-ubyte{ext}"), labels, 0x08)
        parts[part] = (imgs, labels)
    xtr, ytr, xte, yte = m.load_mnist(str(tmp_path))
    assert xtr.shape == (7, 1, 28, 28) and xtr.dtype == np.float32
    np.testing.assert_allclose(xtr[:, 0], parts["train"][0] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(ytr, parts["train"][1])
    np.testing.assert_array_equal(yte, parts["t10k"][1])
    assert xte.shape == (3, 1, 28, 28)


def test_idx_reader_refuses_bad_files(tmp_path):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\x01\x02\x03")
    with pytest.raises(ValueError, match="IDX"):
        m.read_idx(str(bad))
    short = tmp_path / "short"
    short.write_bytes(bytes([0, 0, 8, 1]) + (10).to_bytes(4, "big") + b"\x00" * 5)
    with pytest.raises(ValueError, match="values"):
        m.read_idx(str(short))
    with pytest.raises(FileNotFoundError):
        m.load_mnist(str(tmp_path))
    write_idx(str(tmp_path / "f.idx"), np.arange(6, dtype=np.float32).reshape(2, 3), 0x0D)
    np.testing.assert_array_equal(m.read_idx(str(tmp_path / "f.idx")), np.arange(6).reshape(2, 3))
