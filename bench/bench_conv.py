"""Standard convolution: cypool vs PyTorch vs numpy im2col + BLAS.

Run: python bench/bench_conv.py [--threads N] [--repeats R] [--quick]

* The educational CNN's two convolutions at batch size 1, forward and
  backward per call, through the layers as a training loop calls them:
  cypool.Conv2d, torch.nn.Conv2d with autograd (the first layer's input
  needs no gradient), and the strided-view numpy layer of the educational
  library (bench/cnn_models.py).
* Batch shapes of VGG/ResNet layers and LeNet-5's second convolution,
  forward: cypool.conv2d,
  torch.nn.functional.conv2d (oneDNN) and numpy im2col + matrix product
  (CS231n's approach; the matrix product runs on numpy's OpenBLAS); and
  the backward (input and weight gradients) against torch autograd.
* The extra peak memory of a forward call beyond its output, as peak RSS
  (VmHWM) in a fresh process: it sees a kernel's malloc, which tracemalloc
  does not.

For a fair numpy peer, unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE in the
shell that runs this (they force an older OpenBLAS kernel on some CPUs); the
header names the kernel OpenBLAS runs.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

import cnn_models
import cypool
from _harness import compare, conv_memory_row, memory_table, optional, start, table, torch

SEED_CONVS = [  # name, input (C, H, W), weight, needs input grad
    ("conv 1", (1, 28, 28), (2, 1, 5, 5), False),
    ("conv 2", (2, 12, 12), (2, 2, 5, 5), True),
]
BATCH = [  # x shape, weight shape, stride, padding
    ((32, 64, 56, 56), (64, 64, 3, 3), 1, 1),
    ((32, 128, 28, 28), (128, 128, 3, 3), 1, 1),
    ((8, 3, 224, 224), (64, 3, 7, 7), 2, 3),
    ((32, 256, 14, 14), (64, 256, 1, 1), 1, 0),
    ((64, 6, 14, 14), (16, 6, 5, 5), 1, 0),  # LeNet-5's second convolution, batch 64
]
QUICK_BATCH = [((4, 16, 28, 28), (16, 16, 3, 3), 1, 1), ((2, 3, 64, 64), (8, 3, 7, 7), 2, 3)]


def numpy_im2col(x, w, b, s, p):
    """CS231n's convolution: the columns of every receptive field as a
    (C*kh*kw, N*OH*OW) matrix, times the (O, C*kh*kw) weights."""
    N, C, H, W = x.shape
    O, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p))) if p else x
    OH, OW = (H + 2 * p - kh) // s + 1, (W + 2 * p - kw) // s + 1
    st = xp.strides
    win = as_strided(xp, (C, kh, kw, N, OH, OW), (st[1], st[2], st[3], st[0], s * st[2], s * st[3]))
    cols = win.reshape(C * kh * kw, N * OH * OW)
    out = (w.reshape(O, -1) @ cols + b[:, None]).reshape(O, N, OH, OW)
    return np.ascontiguousarray(out.transpose(1, 0, 2, 3))


def seed_rows(n, reps):
    """Forward + backward of each seed convolution, per call, as layers."""
    rng = np.random.default_rng(0)
    rows = []
    for name, xs, ws, input_grad in SEED_CONVS:
        x = rng.random(xs, dtype=np.float32)
        w = cnn_models.init_weights(0)
        layer = cypool.Conv2d(ws[1], ws[0], ws[2], num_threads=n, rng=0)
        g = np.ones((ws[0], xs[1] - ws[2] + 1, xs[2] - ws[3] + 1), np.float32)

        def cy():
            layer(x)
            return layer.backward(g, needs_input_grad=input_grad)

        strided = cnn_models._StridedConv(layer.weight.copy(), layer.bias.copy())

        def np_layer():
            strided.forward(x)
            return strided.backward(g, 0.0, input_grad)

        fns = {"cypool": cy, "numpy strided (educational)": np_layer}
        if torch is not None:
            tconv = torch.nn.Conv2d(ws[1], ws[0], ws[2])
            tx = torch.from_numpy(x)[None].requires_grad_(input_grad)
            tg = torch.from_numpy(g)[None]

            def tc():
                out = tconv(tx)
                out.backward(tg)
            fns["torch"] = tc
        rows.append((f"{name}: {xs} with weight {ws}, forward + backward", compare(fns, reps, pause=0.02)))
    return rows


def main(argv=None):
    args, n, reps = start(__doc__, argv, quick_repeats=3)
    tl = optional("threadpoolctl")
    if tl is not None:
        info = [i for i in tl.threadpool_info() if i.get("user_api") == "blas"]
        if info:
            print(f"numpy's BLAS: {info[0].get('internal_api')} {info[0].get('version')}, "
                  f"kernel {info[0].get('architecture')}, {info[0].get('num_threads')} threads")
    print()
    print(table("Conv2d layer at batch size 1, forward + backward per call, float32", seed_rows(n, max(5, reps))))
    rng = np.random.default_rng(0)
    fwd_rows, bwd_rows, mem_lines = [], [], []
    for xs, ws, s, p in (QUICK_BATCH if args.quick else BATCH):
        x = rng.standard_normal(xs, dtype=np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
        b = rng.standard_normal(ws[0]).astype(np.float32)
        out = cypool.conv2d(x, w, b, s, p, num_threads=n)
        assert np.allclose(out, numpy_im2col(x, w, b, s, p), rtol=1e-3, atol=1e-3), "cypool and numpy disagree"
        g = rng.standard_normal(out.shape, dtype=np.float32)
        fwd = {"cypool": lambda: cypool.conv2d(x, w, b, s, p, num_threads=n),
               "numpy im2col + BLAS": lambda: numpy_im2col(x, w, b, s, p)}
        bwd = {"cypool": lambda: cypool.conv2d_backward(g, x, w, s, p, num_threads=n)}
        if torch is not None:
            import torch.nn.functional as F

            tx, tw, tb, tg = (torch.from_numpy(a) for a in (x, w, b, g))
            fwd["torch"] = lambda: F.conv2d(tx, tw, tb, s, p)
            txg, twg = tx.clone().requires_grad_(True), tw.clone().requires_grad_(True)
            bwd["torch autograd"] = lambda: torch.autograd.grad(F.conv2d(txg, twg, None, s, p), (txg, twg), tg)
        flops = 2 * out.size * np.prod(ws[1:])
        case = f"{xs} * {ws} s{s} p{p} ({flops / 1e9:.2g} GFLOP)"
        # numpy's matrix product leaves OpenBLAS threads spinning for ~0.1 s.
        res = compare(fwd, reps, pause=0.15)
        fwd_rows.append((case + f", cypool {flops / res['cypool'] / 1e9:.0f} GFLOP/s", res))
        bwd_rows.append((case, compare(bwd, max(3, reps // 3), pause=0.15)))
        mem_lines.append(conv_memory_row("bench_conv", "conv2d", case, xs, ws, s, p, n, out.nbytes,
                                         max(0.25 * out.nbytes, 8 * 2**20)))
    print()
    print(table("conv2d forward, float32", fwd_rows))
    print()
    print(table("conv2d_backward (input and weight gradients), float32", bwd_rows))
    print()
    print(memory_table("forward call", "max(25% of output, 8 MiB)", mem_lines))


if __name__ == "__main__":
    main()
