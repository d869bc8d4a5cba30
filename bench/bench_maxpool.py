"""Max pooling with indices: cypool vs PyTorch vs numpy recipes.

Run: python bench/bench_maxpool.py [--threads N] [--repeats R] [--quick] [--as-called]

Forward with indices, backward, and the batch-of-one layer step of an
educational numpy CNN,
each against the peers that are installed. The forward is also compared with
a memory-bandwidth floor: numpy's x.copy() time scaled by the bytes the call
must move, t_copy * (input + output + index bytes) / (2 * input bytes), and
the backward likewise (gradient + index bytes read, input-gradient written).
--as-called also times single forward calls as users make them (after a
numpy matmul, into fresh pages) against the steady state, next to torch,
and cypool writing into buffers a loop reuses (out=).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

import cypool
from _harness import as_called, as_called_table, compare, start, table, torch

SHAPES = [  # (input shape, kernel, stride, padding)
    ((32, 64, 56, 56), 2, 2, 0),
    ((32, 64, 112, 112), 3, 2, 1),
    ((16, 256, 28, 28), 3, 1, 1),
    # late layers: small planes, many channels (VGG, ResNet)
    ((32, 512, 14, 14), 2, 2, 0),
    ((8, 1024, 7, 7), 3, 2, 1),
    ((64, 256, 7, 7), 3, 1, 1),
]
AS_CALLED = [((32, 64, 56, 56), 2, 2, 0), ((32, 512, 14, 14), 2, 2, 0), ((4, 16, 56, 56), 2, 2, 0)]
QUICK_SHAPES = [((4, 16, 56, 56), 2, 2, 0), ((4, 16, 28, 28), 3, 1, 1), ((4, 256, 14, 14), 2, 2, 0)]


def numpy_pool_with_indices(x, k, s, p):
    """The as_strided + argmax recipe numpy users write, made general: -inf padding,
    window view, argmax over the flattened window, flat input indices."""
    N, C, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p, p), (p, p)), constant_values=-np.inf) if p else x
    OH, OW = (H + 2 * p - k) // s + 1, (W + 2 * p - k) // s + 1
    st = xp.strides
    win = as_strided(xp, (N, C, OH, OW, k, k), (st[0], st[1], s * st[2], s * st[3], st[2], st[3]))
    flat = win.reshape(N, C, OH, OW, k * k)
    a = flat.argmax(-1)
    out = np.take_along_axis(flat, a[..., None], -1)[..., 0]
    r = np.arange(OH)[:, None] * s - p + a // k
    c = np.arange(OW)[None, :] * s - p + a % k
    return out, r * W + c


def numpy_backward(g, idx, shape):
    """np.add.at scatter: the usual numpy backward."""
    N, C, H, W = shape
    out = np.zeros((N * C, H * W), g.dtype)
    rows = np.repeat(np.arange(N * C), g.shape[2] * g.shape[3])
    np.add.at(out, (rows, idx.reshape(-1)), g.reshape(-1))
    return out.reshape(shape)


def main(argv=None):
    args, n, reps = start(__doc__, argv, quick_repeats=5)
    rng = np.random.default_rng(0)
    fwd_rows, bwd_rows, floor_rows, called_rows = [], [], [], []
    for shape, k, s, p in (QUICK_SHAPES if args.quick else SHAPES):
        x = rng.standard_normal(shape, dtype=np.float32)
        out, idx = cypool.max_pool2d(x, k, s, p, return_indices=True, num_threads=n)
        g = rng.standard_normal(out.shape, dtype=np.float32)
        fwd = {
            "cypool": lambda: cypool.max_pool2d(x, k, s, p, return_indices=True, num_threads=n),
            "copy": lambda: x.copy(),
        }
        bwd = {"cypool": lambda: cypool.max_pool2d_backward(g, idx, shape, num_threads=n)}
        if torch is not None:
            import torch.nn.functional as F

            tx, tg, ti = torch.from_numpy(x), torch.from_numpy(g), torch.from_numpy(idx)
            fwd["torch"] = lambda: F.max_pool2d(tx, k, s, p, return_indices=True)
            bwd["torch"] = lambda: torch.ops.aten.max_pool2d_with_indices_backward(
                tg, tx, [k, k], [s, s], [p, p], [1, 1], False, ti)
        fwd["numpy"] = lambda: numpy_pool_with_indices(x, k, s, p)
        bwd["numpy"] = lambda: numpy_backward(g, idx, shape)
        r = compare(fwd, reps)
        t_copy = r.pop("copy")
        floor = t_copy * (x.nbytes + out.nbytes + idx.nbytes) / (2 * x.nbytes)
        case = f"{list(shape)} k{k} s{s} p{p}"
        fwd_rows.append((case, r))
        rb = compare(bwd, reps)
        bwd_rows.append((case, rb))
        bfloor = t_copy * (g.nbytes + idx.nbytes + x.nbytes) / (2 * x.nbytes)
        floor_rows.append((case, {"cypool": r["cypool"], "floor": floor, "cypool bwd": rb["cypool"],
                                  "bwd floor": bfloor}))
        if args.as_called and (shape, k, s, p) in AS_CALLED:
            bufs = (np.empty_like(out), np.empty_like(idx))
            called = {"cypool": fwd["cypool"],
                      "cypool, out= reused": lambda: cypool.max_pool2d(
                          x, k, s, p, return_indices=True, out=bufs, num_threads=n)}
            if torch is not None:
                called["torch"] = fwd["torch"]
            called_rows.append((f"{case} forward with indices", as_called(called, reps)))

    # An educational numpy CNN's pool: batch of one through the layer, forward + backward.
    x1 = rng.standard_normal((1, 2, 24, 24))
    layer = cypool.MaxPool2d(2, 2)
    g1 = np.ones((1, 2, 12, 12))

    def cy_step():
        layer.forward(x1)
        return layer.backward(g1)

    step = {"cypool": cy_step}
    if torch is not None:
        import torch.nn.functional as F

        tx1, tg1 = torch.from_numpy(x1), torch.from_numpy(g1)

        def torch_step():
            o, i = F.max_pool2d(tx1, 2, 2, return_indices=True)
            return torch.ops.aten.max_pool2d_with_indices_backward(tg1, tx1, [2, 2], [2, 2], [0, 0], [1, 1], False, i)

        step["torch"] = torch_step

    def numpy_step():
        o, i = numpy_pool_with_indices(x1, 2, 2, 0)
        return numpy_backward(g1, i, x1.shape)

    step["numpy"] = numpy_step
    step_rows = [("(1, 2, 24, 24) k2 s2 float64, MaxPool2d forward+backward", compare(step, max(reps, 25)))]

    print()
    print(table("max_pool2d forward with indices, float32", fwd_rows))
    print()
    print("### forward with indices and backward vs the memory-bandwidth floor (x.copy() scaled by bytes moved)")
    print()
    print("| case | cypool ms | floor ms | cypool / floor | backward ms | floor ms | backward / floor |")
    print("|---|---|---|---|---|---|---|")
    for case, r in floor_rows:
        print(f"| {case} | {r['cypool'] * 1e3:.3f} | {r['floor'] * 1e3:.3f} | {r['cypool'] / r['floor']:.2f}x "
              f"| {r['cypool bwd'] * 1e3:.3f} | {r['bwd floor'] * 1e3:.3f} "
              f"| {r['cypool bwd'] / r['bwd floor']:.2f}x |")
    print()
    print(table("max_pool2d_backward, float32", bwd_rows))
    print()
    print(table("batch of one, as a numpy CNN calls the layer", step_rows))
    if called_rows:
        print()
        print(as_called_table("as called: one call after a numpy matmul, or into fresh pages", called_rows))


if __name__ == "__main__":
    main()
