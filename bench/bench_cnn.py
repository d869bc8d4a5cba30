"""A numpy CNN trained end to end: numpy as written, with cypool's layers, and PyTorch.

Run: python bench/bench_cnn.py [--epochs E] [--batch B] [--lr LR] [--mnist DIR]
                               [--threads N] [--plot FILE] [--quick]

The network of an educational numpy library (Conv 1->2 5x5 / ReLU / MaxPool
2x2 / Conv 2->2 5x5 / ReLU / Flatten / Dense 128->10 / softmax
cross-entropy), trained with plain SGD three ways from the same initial
weights on the same samples in the same order (bench/cnn_models.py):

  (a) numpy as its author wrote it: strided-view convolutions, an
      as_strided + argmax max pool that keeps its indices, a loop backward;
  (b) the same numpy network with cypool.Conv2d and cypool.MaxPool2d
      swapped in (the rest stays numpy);
  (c) PyTorch eager (nn.Sequential + optim.SGD), when installed, on the
      faster of 1 and 2 threads at batch size 1 (a short trial decides).

The epochs are interleaved: each epoch runs (a), (b) and (c) in turn, so
that the machine's drift hits all three alike; the time per sample is the
median over epochs. Data: scikit-learn's bundled handwritten digits (1,797
images of 8x8, scaled to 28x28; 80/20 split) by default, or MNIST's IDX
files from --mnist DIR (nothing is downloaded). A progress bar shows while
training (tqdm when installed), and a plot of the loss and accuracy curves
is saved (matplotlib when installed).

With --batch B > 1 the three train on mini-batches. numpy's BLAS threads
(the dense layer) and cypool's OpenMP threads then alternate: --fight
also times (b) with OpenBLAS limited to one thread by threadpoolctl, to show
whether they contend.

At batch size 1 (with (a)), a last table times (a), (b) and the network's
numpy parts alone, with convolutions and pool that cost nothing
(cnn_models.NumpyPartsNet): how much faster than (a) any layers swapped
into (b) could make it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

import cnn_models as m
from _harness import machine_line, optional, peers_report, torch

tqdm = optional("tqdm")


def progress(it, total, desc):
    """A progress bar on a terminal: tqdm when installed, else a plain
    percentage; nothing when stderr is not a terminal (a log, CI)."""
    if not sys.stderr.isatty():
        return it
    if tqdm is not None:
        return tqdm.tqdm(it, total=total, desc=desc, leave=False, mininterval=0.5)

    def plain():
        step = max(1, total // 100)
        for i, v in enumerate(it):
            if i % step == 0:
                print(f"\r  {desc}: {100 * i // total}%", end="", file=sys.stderr, flush=True)
            yield v
        print("\r" + " " * (len(desc) + 10) + "\r", end="", file=sys.stderr, flush=True)
    return plain()


def batches(n, batch, rng):
    order = rng.permutation(n)
    if batch == 1:
        return [int(i) for i in order]
    return [order[i:i + batch] for i in range(0, n - batch + 1, batch)]


def run_epoch(step, x, y, plan, desc):
    """Train over the epoch's samples (indices or index arrays): (seconds,
    mean loss)."""
    total = 0.0
    t = time.perf_counter()
    for idx in progress(plan, len(plan), desc):
        total += step(x[idx], y[idx])
    return time.perf_counter() - t, total / len(plan)


def accuracy(predict, x, y, chunk=512):
    hits = 0
    for i in range(0, len(y), chunk):
        hits += int((predict(x[i:i + chunk]) == y[i:i + chunk]).sum())
    return hits / len(y)


def torch_threads_trial(weights, lr, x, y, batch):
    """The faster of 1 and 2 torch threads on 300 training steps."""
    best, best_t = 1, float("inf")
    for n in (1, 2):
        torch.set_num_threads(n)
        _, _, step, _ = m.torch_net(weights, lr)
        plan = batches(len(y), batch, np.random.default_rng(1))[:300]
        for idx in plan[:30]:
            step(x[idx], y[idx])
        t = time.perf_counter()
        for idx in plan:
            step(x[idx], y[idx])
        el = time.perf_counter() - t
        if el < best_t:
            best, best_t = n, el
    torch.set_num_threads(best)
    return best


def floor_report(weights, x, y, lr, n=1000, rounds=7):
    """Times (a), (b) and the numpy parts alone (m.NumpyPartsNet) on the
    same n samples, interleaved, and prints the bound on (a) / (b)."""
    nets = {"(a) numpy": m.NumpyNet(weights), "(b) numpy + cypool": m.CypoolNet(weights),
            "numpy parts alone": m.NumpyPartsNet(weights)}
    times = {name: [] for name in nets}
    n = min(n, len(y))
    for _ in range(rounds):
        for name, net in nets.items():
            t = time.perf_counter()
            for i in range(n):
                net.step(x[i], y[i], lr)
            times[name].append((time.perf_counter() - t) / n)
    med = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    a, b, parts = med["(a) numpy"], med["(b) numpy + cypool"], med["numpy parts alone"]
    print()
    print(f"### What stays numpy, batch 1 (median of {rounds} rounds of {n} steps)")
    print()
    print("| network | us per sample | (a) / it |")
    print("|---|---|---|")
    for name, v in med.items():
        print(f"| {name} | {v:.1f} | {a / v:.2f}x |")
    print(f"\nWith conv and pool free, (b) could be at most {a / parts:.1f}x faster than (a); "
          f"cypool's layers take {b - parts:.1f} us of (b)'s {b:.1f} us.")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=None, help="epochs (default: 5 on digits, 1 on MNIST)")
    p.add_argument("--batch", type=int, default=1, help="mini-batch size (default 1)")
    p.add_argument("--lr", type=float, default=None, help="SGD learning rate (default 0.01 x batch)")
    p.add_argument("--mnist", metavar="DIR", help="train on MNIST's IDX files in DIR")
    p.add_argument("--threads", type=int, default=None, help="threads for cypool (default: OpenMP's)")
    p.add_argument("--plot", default=None, help="where to save the curves (default bench/results/cnn.png)")
    p.add_argument("--no-numpy", action="store_true", help="skip (a), the slow numpy network")
    p.add_argument("--fight", action="store_true", help="also time (b) with OpenBLAS on one thread")
    p.add_argument("--quick", action="store_true", help="one short epoch, for smoke tests")
    p.add_argument("--repeats", type=int, default=None, help=argparse.SUPPRESS)  # run_all's option
    args = p.parse_args(argv)

    if args.mnist:
        xtr, ytr, xte, yte = m.load_mnist(args.mnist)
        data = f"MNIST from {args.mnist}"
    else:
        xtr, ytr, xte, yte = m.load_digits_28()
        data = "scikit-learn digits scaled to 28x28"
    epochs = args.epochs or (1 if args.quick or args.mnist else 5)
    if args.quick:
        xtr, ytr = xtr[:300], ytr[:300]
    batch = args.batch
    lr = args.lr or 0.01 * batch
    from cypool._backend import kernels
    n_threads = args.threads or kernels.max_threads()
    print(machine_line(n_threads))
    print(peers_report())
    print(f"data: {data}: {len(ytr)} training and {len(yte)} test images; batch {batch}, "
          f"SGD lr {lr}, {epochs} epoch(s)")

    weights = m.init_weights(0)
    ways = {}  # name: (step(x, y) -> loss, predict(x) -> classes)
    if not args.no_numpy:
        net_a = m.NumpyNet(weights)
        ways["(a) numpy"] = (lambda x, y: net_a.step(x, y, lr), net_a.predict)
    net_b = m.CypoolNet(weights, num_threads=args.threads)
    ways["(b) numpy + cypool"] = (lambda x, y: net_b.step(x, y, lr), net_b.predict)
    tl = optional("threadpoolctl")
    if args.fight and tl is not None:
        net_f = m.CypoolNet(weights, num_threads=args.threads)

        def step_f(x, y):
            with tl.threadpool_limits(1, user_api="blas"):
                return net_f.step(x, y, lr)
        ways["(b) with BLAS on 1 thread"] = (step_f, net_f.predict)
    torch_note = ""
    if torch is not None:
        nt = torch_threads_trial(weights, lr, xtr, ytr, batch)
        torch_note = f" (torch on {nt} thread{'s' if nt > 1 else ''}, the faster of 1 and 2)"
        _, _, tstep, tpredict = m.torch_net(weights, lr)
        ways["(c) torch"] = (tstep, tpredict)

    curves = {name: {"loss": [], "acc": [], "sec": []} for name in ways}
    rng = np.random.default_rng(2)
    for ep in range(epochs):
        plan = batches(len(ytr), batch, rng)
        for name in ways:
            sec, loss = run_epoch(ways[name][0], xtr, ytr, plan, f"epoch {ep + 1} {name}")
            acc = accuracy(ways[name][1], xte, yte)
            c = curves[name]
            c["loss"].append(loss)
            c["acc"].append(acc)
            c["sec"].append(sec)
            print(f"epoch {ep + 1} {name}: {sec / len(plan) * 1e6 / batch:.1f} us/sample, "
                  f"loss {loss:.4f}, test accuracy {acc:.3f}", flush=True)

    base = "(b) numpy + cypool"
    n_samples = len(plan) * batch
    per = {name: statistics.median(c["sec"]) / n_samples for name, c in curves.items()}
    print()
    print(f"### Training the educational CNN, batch {batch}{torch_note}")
    print()
    print("| network | us per sample | s per epoch | s per 60,000-image MNIST epoch | final loss | "
          "test accuracy | time / (b) |")
    print("|---|---|---|---|---|---|---|")
    for name, c in curves.items():
        print(f"| {name} | {per[name] * 1e6:.1f} | {per[name] * n_samples:.2f} | {per[name] * 60000:.1f} | "
              f"{c['loss'][-1]:.4f} | {c['acc'][-1]:.3f} | {per[name] / per[base]:.2f}x |")
    if batch == 1 and not args.no_numpy:
        floor_report(weights, xtr, ytr, lr, rounds=3 if args.quick else 7)
    plot = args.plot or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results",
                                     f"cnn-latest{'' if batch == 1 else f'-batch{batch}'}.png")
    plt = optional("matplotlib.pyplot")
    if plt is not None and not args.quick:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
        for name, c in curves.items():
            ep = np.arange(1, epochs + 1)
            ax1.plot(ep, c["loss"], marker="o", label=name)
            ax2.plot(ep, c["acc"], marker="o", label=name)
        ax1.set(xlabel="epoch", ylabel="mean training loss", title="training loss")
        ax2.set(xlabel="epoch", ylabel="test accuracy", title="test accuracy")
        ax1.legend()
        fig.suptitle(f"{data}, batch {batch}, SGD lr {lr}: the three networks agree")
        fig.tight_layout()
        fig.savefig(plot, dpi=100)
        print(f"\ncurves saved to {plot}")


if __name__ == "__main__":
    main()
