"""cypool's kernels as PyTorch operators (cypool.torch), inside torch programs.

* Vector convolution, forward plus backward through autograd, float32:
  ``cypool.torch.vector_conv2d`` against the forum's fast answer (the
  components as a batch of ``F.conv2d``, permuted there and back, the bias
  on component 0), on ERAN ConvSmall's two layers (E = 785, the input box's
  generators) and a CIFAR layer.
* Max pooling with indices, forward plus backward through autograd:
  ``cypool.torch.max_pool2d_with_indices`` against
  ``F.max_pool2d(..., return_indices=True)``.
* A small CNN trained in torch (conv, ReLU, pool, conv, ReLU, pool, dense)
  with cypool's pooling against torch's own, per SGD step at batch 32.
* The operators' cost over calling cypool's numpy function directly, per
  call: ``argmax2d`` without autograd, ``max_pool2d_with_indices`` on a
  tensor that requires grad.

Run: python bench/bench_torch.py [--threads N] [--repeats R] [--quick]
"""
from __future__ import annotations

import sys


from _harness import compare, start, table, torch

import cypool


def seed_answer(x, w, b, stride, padding):
    """The forum's fast answer, batched: components as a batch of F.conv2d."""
    N, C, H, W, E = x.shape
    out = torch.nn.functional.conv2d(x.permute(0, 4, 1, 2, 3).reshape(N * E, C, H, W), w, None, stride,
                                     padding)
    out = out.reshape(N, E, *out.shape[1:]).permute(0, 2, 3, 4, 1)
    first = torch.zeros(E, dtype=x.dtype)
    first[0] = 1
    return out + b.view(-1, 1, 1, 1) * first


def fwd_bwd(f, *inputs):
    def run():
        for t in inputs:
            t.grad = None
        f(*inputs).sum().backward()
    return run


def vector_conv_rows(ct, quick):
    shapes = [("ConvSmall 1: (1, 28, 28, 785) by 16 4x4 s2", (1, 1, 28, 28, 785), (16, 1, 4, 4), 2, 0),
              ("ConvSmall 2: (16, 13, 13, 785) by 32 4x4 s2", (1, 16, 13, 13, 785), (32, 16, 4, 4), 2, 0),
              ("CIFAR: (3, 32, 32, 1025) by 32 3x3 p1", (1, 3, 32, 32, 1025), (32, 3, 3, 3), 1, 1)]
    rows = []
    for name, xs, ws, s, p in shapes[:2] if quick else shapes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(xs, generator=g).requires_grad_()
        w = (torch.randn(ws, generator=g) * 0.1).requires_grad_()
        b = torch.randn(ws[0], generator=g).requires_grad_()
        rows.append((name, compare({
            "cypool": fwd_bwd(lambda x, w, b: ct.vector_conv2d(x, w, b, s, p), x, w, b),
            "forum's permute + F.conv2d": fwd_bwd(lambda x, w, b: seed_answer(x, w, b, s, p), x, w, b),
        }, repeats=REPEATS)))
    return rows


def pool_rows(ct, quick):
    F = torch.nn.functional
    shapes = [("[32, 64, 56, 56] 2x2 s2", (32, 64, 56, 56), 2, 2, 0),
              ("[16, 96, 55, 55] 3x3 s2", (16, 96, 55, 55), 3, 2, 0),
              ("[32, 256, 28, 28] 3x3 s1 p1", (32, 256, 28, 28), 3, 1, 1)]
    rows = []
    for name, xs, k, s, p in shapes[:1] if quick else shapes:
        x = torch.randn(xs).requires_grad_()
        rows.append((name, compare({
            "cypool": fwd_bwd(lambda x: ct.max_pool2d_with_indices(x, k, s, p)[0], x),
            "torch": fwd_bwd(lambda x: F.max_pool2d(x, k, s, p, return_indices=True)[0], x),
        }, repeats=REPEATS)))
    return rows


def cnn_rows(ct):
    nn = torch.nn

    def model(pool):
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), pool(), nn.Conv2d(16, 32, 3, padding=1),
                             nn.ReLU(), pool(), nn.Flatten(), nn.Linear(32 * 7 * 7, 10))

    x = torch.randn(32, 1, 28, 28)
    y = torch.randint(0, 10, (32,))

    def step_of(net):
        opt = torch.optim.SGD(net.parameters(), lr=0.01)

        def step():
            opt.zero_grad()
            nn.functional.cross_entropy(net(x), y).backward()
            opt.step()
        return step

    return [("small CNN, batch 32, one SGD step (28x28, two 2x2 pools)", compare({
        "cypool": step_of(model(lambda: ct.MaxPool2d(2))),
        "torch": step_of(model(lambda: nn.MaxPool2d(2))),
    }, repeats=REPEATS))]


def overhead_rows(ct):
    a = torch.randn(4, 3, 8, 8)
    an = a.numpy()
    xg = torch.randn(4, 3, 8, 8).requires_grad_()
    n = torch.get_num_threads()
    rows = [("argmax2d (4, 3, 8, 8), no autograd", compare({
        "cypool": lambda: ct.argmax2d(a),
        "numpy function": lambda: cypool.argmax2d(an, num_threads=n),
    }, repeats=REPEATS, pause=0)),
        ("max_pool2d_with_indices (4, 3, 8, 8) 2x2, x requires grad", compare({
            "cypool": lambda: ct.max_pool2d_with_indices(xg, 2),
            "numpy function": lambda: cypool.max_pool2d(an, 2, return_indices=True, num_threads=n),
        }, repeats=REPEATS, pause=0))]
    return rows


def overhead_table(rows) -> str:
    lines = ["### The operators' cost over the numpy function, per call (targets: 12 us, 35 us with autograd)",
             "", "| case | operator us | numpy function us | cost us |", "|---|---|---|---|"]
    for case, res in rows:
        op, fn = res["cypool"] * 1e6, res["numpy function"] * 1e6
        lines.append(f"| {case} | {op:.1f} | {fn:.1f} | {op - fn:.1f} |")
    return "\n".join(lines)


REPEATS = 15


def main(argv=None):
    global REPEATS
    args, n, REPEATS = start(__doc__, sys.argv[1:] if argv is None else argv, quick_repeats=3)
    if torch is None:
        print("torch is not installed: nothing to measure (pip install 'cypool[torch]')")
        return
    import cypool.torch as ct

    print()
    print(table("Vector convolution, forward + backward through autograd, float32 (target: >= 3x)",
                vector_conv_rows(ct, args.quick), base="cypool"))
    print()
    print(table("max_pool2d_with_indices, forward + backward through autograd, float32 (target: >= 2x)",
                pool_rows(ct, args.quick), base="cypool"))
    print()
    print(table("Training a small CNN in torch: its pools on cypool or torch's own", cnn_rows(ct), base="cypool"))
    print()
    print(overhead_table(overhead_rows(ct)))


if __name__ == "__main__":
    main()
