"""The small CNN of an educational numpy library, three ways, and its data.

The network (a numpy CNN trained on MNIST at batch size 1, as its author
wrote it):

    Conv(1->2, 5x5) / ReLU / MaxPool 2x2 / Conv(2->2, 5x5) / ReLU /
    Flatten / Dense(128->10) / Softmax, cross-entropy loss, plain SGD.

* ``NumpyNet``: numpy as that author wrote it: strided-view (as_strided)
  convolutions, an as_strided + argmax max pool that keeps the index of
  each maximum, and a loop backward for the pool.
* ``CypoolNet``: the same numpy network with cypool's ``Conv2d`` and
  ``MaxPool2d`` swapped in; everything else stays numpy.
* ``torch_net``: PyTorch eager, ``nn.Sequential`` and ``optim.SGD``.

All three start from the same weights (``init_weights``) and take the same
samples in the same order. Data: scikit-learn's bundled handwritten digits
(8x8, scaled to 28x28), or MNIST's IDX files from a folder the user has;
nothing is downloaded.
"""
from __future__ import annotations

import gzip
import os

import numpy as np
from numpy.lib.stride_tricks import as_strided

import cypool

SHAPES = dict(conv1=(2, 1, 5, 5), conv2=(2, 2, 5, 5), dense=(10, 2 * 8 * 8))


def init_weights(seed=0, dtype=np.float32) -> dict:
    """Initial weights and biases, drawn like torch's defaults (uniform in
    +-1/sqrt(fan_in)), shared by the three networks."""
    rng = np.random.default_rng(seed)
    w = {}
    for name, shape in SHAPES.items():
        bound = 1 / np.sqrt(np.prod(shape[1:]))
        w[name + ".weight"] = rng.uniform(-bound, bound, size=shape).astype(dtype)
        w[name + ".bias"] = rng.uniform(-bound, bound, size=shape[0]).astype(dtype)
    return w


def _softmax_xent(z, y):
    """(loss, dloss/dz) of softmax + cross-entropy for logits z (..., 10),
    labels y."""
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    s = e.sum(axis=-1, keepdims=True)
    p = e / s
    idx = (np.arange(z.shape[0]), y) if z.ndim == 2 else y
    loss = -(z[idx] - np.log(s[..., 0]))
    p[idx] -= 1
    if z.ndim == 2:  # mean over the batch, as torch's cross_entropy
        return float(loss.mean()), p / z.shape[0]
    return float(loss), p


class _Net:
    """The numpy part of the network, shared by the numpy and the cypool
    versions: ReLU, the dense layer, softmax cross-entropy and SGD.
    Subclasses give conv1, conv2 and pool (forward and backward) and
    _conv_backward, which also takes the SGD step of a convolution.

    ``step(x, y, lr)`` trains on one sample ``x`` (1, 28, 28) or a batch
    (N, 1, 28, 28) and returns the loss; ``predict(x)`` returns classes.
    """

    def logits(self, x):
        a1 = self.conv1.forward(x)
        r1 = np.maximum(a1, 0)
        p1 = self.pool.forward(r1)
        a2 = self.conv2.forward(p1)
        r2 = np.maximum(a2, 0)
        f = r2.reshape(r2.shape[0], -1) if x.ndim == 4 else r2.reshape(-1)
        return a1, a2, f, f @ self.W.T + self.b

    def step(self, x, y, lr):
        a1, a2, f, z = self.logits(x)
        loss, dz = _softmax_xent(z, y)
        df = dz @ self.W
        if x.ndim == 4:
            dW, db = dz.T @ f, dz.sum(axis=0)
        else:
            dW, db = np.outer(dz, f), dz
        self.W -= lr * dW
        self.b -= lr * db
        dr2 = df.reshape(a2.shape)
        dr2 *= a2 > 0
        dp1 = self._conv_backward(self.conv2, dr2, lr, True)
        dr1 = self.pool.backward(dp1)
        dr1 *= a1 > 0
        self._conv_backward(self.conv1, dr1, lr, False)
        return loss

    def predict(self, x):
        return self.logits(x)[3].argmax(axis=-1)


class CypoolNet(_Net):
    """The numpy network with cypool's Conv2d and MaxPool2d swapped in."""

    def __init__(self, weights: dict, num_threads=None):
        dt = weights["conv1.weight"].dtype
        self.conv1 = cypool.Conv2d(1, 2, 5, dtype=dt, num_threads=num_threads)
        self.conv2 = cypool.Conv2d(2, 2, 5, dtype=dt, num_threads=num_threads)
        self.pool = cypool.MaxPool2d(2, stride=2, num_threads=num_threads)
        for name in ("conv1", "conv2"):
            layer = getattr(self, name)
            layer.weight = weights[name + ".weight"].copy()
            layer.bias = weights[name + ".bias"].copy()
        self.W = weights["dense.weight"].copy()
        self.b = weights["dense.bias"].copy()

    @staticmethod
    def _conv_backward(layer, g, lr, input_grad):
        gx = layer.backward(g, needs_input_grad=input_grad)
        layer.weight -= lr * layer.grad_weight
        layer.bias -= lr * layer.grad_bias
        return gx

    def predict(self, x):
        layers = (self.conv1, self.conv2, self.pool)
        for layer in layers:  # nothing kept for a backward
            layer.eval()
        try:
            return super().predict(x)
        finally:
            for layer in layers:
                layer.train()


# --- numpy as the educational library's author wrote it --------------------

def _windows(x, kh, kw, s=1):
    """As_strided view (..., C, OH, OW, kh, kw) of x (..., C, H, W)."""
    *lead, H, W = x.shape
    OH, OW = (H - kh) // s + 1, (W - kw) // s + 1
    st = x.strides
    return as_strided(x, (*lead, OH, OW, kh, kw), (*st[:-2], st[-2] * s, st[-1] * s, st[-2], st[-1]),
                      writeable=False)


class _StridedConv:
    """'Valid' convolution by a strided view and a tensordot, as the
    educational library does it (its Convolutional layer)."""

    def __init__(self, w, b):
        self.w, self.b = w, b

    def forward(self, x):
        self.x = x
        kh, kw = self.w.shape[2:]
        win = _windows(x, kh, kw)  # ([N,] C, OH, OW, kh, kw)
        if x.ndim == 3:
            out = np.tensordot(self.w, win, axes=([1, 2, 3], [0, 3, 4]))
        else:
            out = np.tensordot(win, self.w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
        return out + self.b[:, None, None]

    def backward(self, g, lr, input_grad=True):
        kh, kw = self.w.shape[2:]
        x = self.x
        OH, OW = g.shape[-2:]
        # Kernel gradient: correlate the input with the output gradient.
        win = _windows(x, OH, OW)  # ([N,] C, kh, kw, OH, OW)
        if x.ndim == 3:
            gw = np.tensordot(g, win, axes=([1, 2], [3, 4]))
            gb = g.sum(axis=(1, 2))
        else:
            gw = np.tensordot(g, win, axes=([0, 2, 3], [0, 4, 5]))
            gb = g.sum(axis=(0, 2, 3))
        gx = None
        if input_grad:  # full convolution of the gradient with the kernel
            pad = [(0, 0)] * (g.ndim - 2) + [(kh - 1, kh - 1), (kw - 1, kw - 1)]
            gp = np.pad(g, pad)
            wf = self.w[:, :, ::-1, ::-1]
            gwin = _windows(gp, kh, kw)  # ([N,] O, H, W, kh, kw)
            if g.ndim == 3:
                gx = np.tensordot(wf, gwin, axes=([0, 2, 3], [0, 3, 4]))
            else:
                gx = np.tensordot(gwin, wf, axes=([1, 4, 5], [0, 2, 3])).transpose(0, 3, 1, 2)
        self.w -= lr * gw
        self.b -= lr * gb
        return gx


class _StridedMaxPool:
    """The author's max pool: as_strided windows, argmax over each flattened
    window, input indices computed from np.indices; backward by loops."""

    def __init__(self, k=2, s=2):
        self.k, self.s = k, s

    def forward(self, x):
        k, s = self.k, self.s
        self.shape = x.shape
        batched = x.ndim == 4
        x4 = x if batched else x[None]
        N, C, H, W = x4.shape
        win = _windows(x4, k, k, s)  # (N, C, OH, OW, k, k)
        OH, OW = win.shape[2:4]
        flat = win.reshape(N, C, OH, OW, k * k)
        am = flat.argmax(axis=-1)
        out = np.take_along_axis(flat, am[..., None], axis=-1)[..., 0]
        rows, cols = np.indices((OH, OW))
        self.ix = rows * s + am // k  # input row of each maximum
        self.iy = cols * s + am % k   # input column
        return out if batched else out[0]

    def backward(self, g):
        batched = g.ndim == 4
        g4 = g if batched else g[None]
        gx = np.zeros(self.shape if batched else (1,) + self.shape, dtype=g.dtype)
        N, C, OH, OW = g4.shape
        for n in range(N):
            for c in range(C):
                for i in range(OH):
                    for j in range(OW):
                        gx[n, c, self.ix[n, c, i, j], self.iy[n, c, i, j]] += g4[n, c, i, j]
        return gx if batched else gx[0]


class NumpyNet(_Net):
    """The network in numpy as the educational library's author wrote it."""

    def __init__(self, weights: dict):
        self.conv1 = _StridedConv(weights["conv1.weight"].copy(), weights["conv1.bias"].copy())
        self.conv2 = _StridedConv(weights["conv2.weight"].copy(), weights["conv2.bias"].copy())
        self.pool = _StridedMaxPool()
        self.W = weights["dense.weight"].copy()
        self.b = weights["dense.bias"].copy()

    @staticmethod
    def _conv_backward(layer, g, lr, input_grad):
        return layer.backward(g, lr, input_grad)  # the library's layers step themselves


class _FreeLayer:
    """A stand-in for a convolution or a pool that costs nothing: it
    returns arrays of the right shapes, made once."""

    def __init__(self, out_shape, in_shape, dtype):
        rng = np.random.default_rng(0)
        self.out = rng.standard_normal(out_shape).astype(dtype)
        self.grad_in = rng.standard_normal(in_shape).astype(dtype)

    def forward(self, x):
        return self.out

    def backward(self, g, needs_input_grad=True):
        return self.grad_in


class NumpyPartsNet(_Net):
    """The network's numpy parts alone (ReLU, dense, softmax cross-entropy,
    SGD), with convolutions and pool that cost nothing. Its time per
    sample is what (b) would take with infinitely fast layers: the bound
    on how much faster than (a) swapping layers can make the network.
    (It learns nothing; it is only timed.)"""

    def __init__(self, weights: dict):
        dt = weights["conv1.weight"].dtype
        self.conv1 = _FreeLayer((2, 24, 24), (1, 28, 28), dt)
        self.pool = _FreeLayer((2, 12, 12), (2, 24, 24), dt)
        self.conv2 = _FreeLayer((2, 8, 8), (2, 12, 12), dt)
        self.W = weights["dense.weight"].copy()
        self.b = weights["dense.bias"].copy()

    @staticmethod
    def _conv_backward(layer, g, lr, input_grad):
        return layer.backward(g)


# --- PyTorch ---------------------------------------------------------------

def torch_net(weights: dict, lr: float):
    """(model, optimizer, step, predict) of the network in PyTorch eager."""
    import torch
    from torch import nn

    dt = torch.float64 if weights["conv1.weight"].dtype == np.float64 else torch.float32
    model = nn.Sequential(nn.Conv2d(1, 2, 5), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(2, 2, 5),
                          nn.ReLU(), nn.Flatten(), nn.Linear(128, 10)).to(dt)
    with torch.no_grad():
        for (i, name) in ((0, "conv1"), (3, "conv2"), (6, "dense")):
            model[i].weight.copy_(torch.from_numpy(weights[name + ".weight"]))
            model[i].bias.copy_(torch.from_numpy(weights[name + ".bias"]))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss()

    def step(x, y):
        xt = torch.from_numpy(x if x.ndim == 4 else x[None])
        yt = torch.as_tensor(np.atleast_1d(y))
        opt.zero_grad()
        loss = loss_fn(model(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()

    def predict(x):
        with torch.no_grad():
            return model(torch.from_numpy(x)).argmax(dim=-1).numpy()

    return model, opt, step, predict


# --- data ------------------------------------------------------------------

def _resize_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) bilinear interpolation weights, pixel centres aligned."""
    pos = (np.arange(n_out) + 0.5) * n_in / n_out - 0.5
    lo = np.clip(np.floor(pos).astype(int), 0, n_in - 1)
    hi = np.clip(lo + 1, 0, n_in - 1)
    t = np.clip(pos - lo, 0, 1)
    m = np.zeros((n_out, n_in))
    m[np.arange(n_out), lo] += 1 - t
    m[np.arange(n_out), hi] += t
    return m


def load_digits_28(test_fraction=0.2, seed=0, dtype=np.float32):
    """scikit-learn's bundled handwritten digits (1,797 images of 8x8, no
    download), scaled to 28x28 in [0, 1] and split at random into
    (x_train, y_train, x_test, y_test); x is (n, 1, 28, 28)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    r = _resize_matrix(8, 28)
    imgs = np.einsum("ij,njk,lk->nil", r, d.images / 16.0, r)
    x = np.clip(imgs, 0, 1)[:, None].astype(dtype)
    y = d.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    te, tr = order[:n_test], order[n_test:]
    return x[tr], y[tr], x[te], y[te]


def read_idx(path: str) -> np.ndarray:
    """An IDX file (MNIST's format), gzipped or raw, as a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file")
    types = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if data[2] not in types:
        raise ValueError(f"{path}: unknown IDX element type {data[2]:#x}")
    ndim = data[3]
    dims = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dt = np.dtype(types[data[2]])
    body = np.frombuffer(data, dtype=dt, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise ValueError(f"{path}: {body.size} values for shape {dims}")
    return body.reshape(dims).astype(dt.newbyteorder("="))


def load_mnist(folder: str, dtype=np.float32):
    """MNIST from its four IDX files in folder (``train-images-idx3-ubyte``
    and so on, each possibly ``.gz``): (x_train, y_train, x_test, y_test),
    x (n, 1, 28, 28) in [0, 1]."""
    def find(stem):
        for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
            p = os.path.join(folder, name)
            if os.path.exists(p):
                return p
        raise FileNotFoundError(f"{folder}: no {stem}[.gz]")

    out = []
    for part in ("train", "t10k"):
        x = read_idx(find(f"{part}-images-idx3-ubyte"))
        y = read_idx(find(f"{part}-labels-idx1-ubyte"))
        if x.ndim != 3 or y.ndim != 1 or len(x) != len(y):
            raise ValueError(f"{folder}: {part} images {x.shape} and labels {y.shape} do not match")
        out += [(x[:, None] / 255.0).astype(dtype), y.astype(np.int64)]
    return tuple(out)
