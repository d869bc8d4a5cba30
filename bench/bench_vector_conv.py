"""Vector-pixel convolution: cypool vs the accepted PyTorch answer vs numpy im2col.

Run: python bench/bench_vector_conv.py [--threads N] [--repeats R] [--quick]

Shapes of the zonotope networks of neural-network verification (MNIST
ConvSmall, CIFAR ConvBig) and one with small E. Peers: the accepted PyTorch
answer to the vector-pixel question (permute to (E, C, H, W), F.conv2d with
E as the batch, bias on slice 0, permute back and make it contiguous) and
its autograd backward, when torch is installed; numpy as_strided im2col +
matrix product. Also the extra peak memory of a first call beyond its
output, as peak RSS (VmHWM) in a fresh process, which sees the kernels' own
mallocs; and a sweep of small E (a few components per pixel).

For a fair numpy peer, unset OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE in the
shell that runs this (they force an older OpenBLAS kernel on some CPUs).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

import cypool
from _harness import as_called, as_called_table, compare, conv_memory_row, memory_table, start, table, torch

SHAPES = [  # name, (C, H, W, E), O, k, s, p
    ("MNIST ConvSmall 1", (1, 28, 28, 785), 16, 4, 2, 0),
    ("MNIST ConvSmall 2", (16, 13, 13, 1000), 32, 4, 2, 0),
    ("CIFAR ConvBig 1", (3, 32, 32, 3073), 32, 3, 1, 1),
    ("CIFAR ConvBig 2", (32, 32, 32, 512), 32, 4, 2, 1),
    ("small E", (16, 32, 32, 8), 32, 3, 1, 1),
]
QUICK = [("MNIST ConvSmall 1", (1, 28, 28, 785), 16, 4, 2, 0), ("small E", (16, 16, 16, 8), 8, 3, 1, 1)]
# The small-E sweep: a few components per pixel (few error terms, or a
# standard convolution's batch).
SWEEP_E = (1, 2, 4, 8, 16, 32)
SWEEP = [
    ("ConvSmall 1", (1, 28, 28), 16, 4, 2, 0),
    ("ConvSmall 2", (16, 13, 13), 32, 4, 2, 0),
    ("small E", (16, 32, 32), 32, 3, 1, 1),
    ("(1, 28, 28) * (2, 1, 5, 5)", (1, 28, 28), 2, 5, 1, 0),
]


def numpy_im2col(x, w, b, s, p):
    """as_strided im2col view reshaped to (C*kh*kw, OH*OW*E), times the weights."""
    C, H, W, E = x.shape
    O, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (p, p), (p, p), (0, 0))) if p else x
    OH, OW = (H + 2 * p - kh) // s + 1, (W + 2 * p - kw) // s + 1
    st = xp.strides
    cols = as_strided(xp, (C, kh, kw, OH, OW, E), (st[0], st[1], st[2], s * st[1], s * st[2], st[3]))
    out = (w.reshape(O, -1) @ cols.reshape(C * kh * kw, OH * OW * E)).reshape(O, OH, OW, E)
    out[..., 0] += b[:, None, None]
    return out


def torch_permute_conv(tx, tw, tb, s, p):
    """The accepted PyTorch answer to the vector-pixel question, with the
    result made contiguous."""
    import torch.nn.functional as F

    out = F.conv2d(tx.permute(3, 0, 1, 2), tw, None, s, p)
    out[0] += tb.view(-1, 1, 1)
    return out.permute(1, 2, 3, 0).contiguous()


def peers(x, w, b, g, s, p, n):
    """(forward, backward) peer dicts for compare(): cypool, numpy im2col
    (forward) and, when installed, torch's permute-and-conv with autograd."""
    fwd = {"cypool": lambda: cypool.vector_conv2d(x, w, b, s, p, num_threads=n),
           "numpy im2col": lambda: numpy_im2col(x, w, b, s, p)}
    bwd = {"cypool": lambda: cypool.vector_conv2d_backward(g, x, w, s, p, num_threads=n)}
    if torch is not None:
        tx, tw, tb, tg = (torch.from_numpy(a) for a in (x, w, b, g))
        fwd["torch (permute + conv)"] = lambda: torch_permute_conv(tx, tw, tb, s, p)
        txg, twg = tx.clone().requires_grad_(True), tw.clone().requires_grad_(True)
        bwd["torch autograd"] = lambda: torch.autograd.grad(torch_permute_conv(txg, twg, tb, s, p), (txg, twg), tg)
    return fwd, bwd


def sweep(n, reps, quick):
    """Forward and backward rows of the small-E sweep."""
    rng = np.random.default_rng(1)
    fwd_rows, bwd_rows = [], []
    for name, (C, H, W), O, k, s, p in (SWEEP[:1] if quick else SWEEP):
        for E in (SWEEP_E[:2] if quick else SWEEP_E):
            x = rng.standard_normal((C, H, W, E), dtype=np.float32)
            w = (rng.standard_normal((O, C, k, k)) / np.sqrt(C * k * k)).astype(np.float32)
            b = rng.standard_normal(O).astype(np.float32)
            out = cypool.vector_conv2d(x, w, b, s, p, num_threads=n)
            g = rng.standard_normal(out.shape, dtype=np.float32)
            fwd, bwd = peers(x, w, b, g, s, p, n)
            case = f"{name} O={O} k{k} s{s} p{p}, E = {E}"
            # numpy's matrix product leaves OpenBLAS threads spinning for ~0.1 s.
            fwd_rows.append((case, compare(fwd, reps, pause=0.15)))
            bwd_rows.append((case, compare(bwd, reps, pause=0.15)))
    return fwd_rows, bwd_rows


def main(argv=None):
    args, n, reps = start(__doc__, argv, quick_repeats=3)
    rng = np.random.default_rng(0)
    fwd_rows, bwd_rows, mem_lines, called_rows = [], [], [], []
    for name, (C, H, W, E), O, k, s, p in (QUICK if args.quick else SHAPES):
        x = rng.standard_normal((C, H, W, E), dtype=np.float32)
        w = (rng.standard_normal((O, C, k, k)) / np.sqrt(C * k * k)).astype(np.float32)
        b = rng.standard_normal(O).astype(np.float32)
        out = cypool.vector_conv2d(x, w, b, s, p, num_threads=n)
        g = rng.standard_normal(out.shape, dtype=np.float32)
        ref = numpy_im2col(x, w, b, s, p)
        assert np.allclose(out, ref, rtol=1e-3, atol=1e-3), "cypool and numpy disagree"
        fwd, bwd = peers(x, w, b, g, s, p, n)
        case = f"{name} {(C, H, W, E)} O={O} k{k} s{s} p{p}"
        # numpy's matrix product leaves OpenBLAS threads spinning for ~0.1 s.
        fwd_rows.append((case, compare(fwd, reps, pause=0.15)))
        bwd_rows.append((case, compare(bwd, max(3, reps // 2), pause=0.15)))
        if args.as_called and name.startswith("MNIST"):
            buf = np.empty_like(out)
            called = {"cypool": fwd["cypool"],
                      "cypool, out= reused": lambda: cypool.vector_conv2d(x, w, b, s, p, out=buf,
                                                                          num_threads=n)}
            if torch is not None:
                called["torch (permute + conv)"] = fwd["torch (permute + conv)"]
            called_rows.append((f"{case} forward", as_called(called, reps)))
        mem_lines.append(conv_memory_row("bench_vector_conv", "vector_conv2d", case, (C, H, W, E),
                                         (O, C, k, k), s, p, n, out.nbytes,
                                         max(0.1 * out.nbytes, 4 * 2**20)))
    print()
    print(table("vector_conv2d forward, float32", fwd_rows))
    print()
    print(table("vector_conv2d_backward (input and weight gradients), float32", bwd_rows))
    print()
    if called_rows:
        print(as_called_table("as called: one call after a numpy matmul, or into fresh pages", called_rows))
        print()
    sf, sb = sweep(n, max(3, reps // 2), args.quick)
    print()
    print(table("vector_conv2d forward at small E, float32", sf))
    print()
    print(table("vector_conv2d_backward at small E (input and weight gradients), float32", sb))
    seed = [(f, b) for (case, f), (_, b) in zip(sf, sb) if case.startswith("(1, 28, 28)") and case.endswith("E = 1")]
    for f, b in seed:  # a training step's two calls at batch size 1
        print(f"\nE = 1, (1, 28, 28, 1) by (2, 1, 5, 5): forward + backward {1e6 * (f['cypool'] + b['cypool']):.1f} us "
              f"(forward {1e6 * f['cypool']:.1f} us, backward {1e6 * b['cypool']:.1f} us)")
    print()
    print(memory_table("call", "max(10% of output, 4 MiB)", mem_lines))


if __name__ == "__main__":
    main()
