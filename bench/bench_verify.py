"""Certifying trained networks on zonotopes (DeepZ), end to end, three ways.

The verification researcher's whole job: train a network, then for each
correctly classified test image push the L-infinity box of radius eps
around it (clipped to [0, 1]) through the network as one zonotope, and
count the images no point of whose box can change the predicted class.

* ``cypool``: ``cypool.zonotope.Network`` built from the trained cypool
  layers, float64 (the vector convolution, the DeepZ ReLU kernel, numpy's
  BLAS for the dense layers).
* ``cypool float32``: the same network in float32.
* ``torch DeepZ``: a plain PyTorch DeepZ written here, float64, generators
  first (``(1 + n, C, H, W)``): the convolution runs the generators as a
  batch, as the PyTorch zonotopes of MN-BaB and DiffAI do.
* ``ART DeepZ``: the Adversarial Robustness Toolbox's ``PytorchDeepZ``
  (``pip install adversarial-robustness-toolbox``) on the same weights; it
  computes in float32 whatever it is given. Its own input step
  (``pre_process``) fails under numpy 2, so the bench builds the same
  clipped box for it.

Networks, trained here with cypool's own layers on scikit-learn's bundled
digits scaled to 28x28 (nothing is downloaded): ERAN's ConvSmall (Conv 16
4x4 s2, ReLU, Conv 32 4x4 s2, ReLU, Dense 100, ReLU, Dense 10) and a
ConvMed-sized one (the two convolutions padded by 1, Dense 1000).

Run: python bench/bench_verify.py [--threads N] [--quick] [--images K]

VNN-COMP mode (bench/_vnncomp.py): real networks and properties, through
cypool.verify and auto_LiRPA's CROWN; with no folder named, the shared
VNN-COMP 2021 folders beside the checkout, where present:

    python bench/bench_verify.py --vnncomp [DIR ...] [--threads N]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

import cypool
from cypool import zonotope
from _harness import optional, start, torch
from cnn_models import _softmax_xent, load_digits_28

art_deepz = optional("art.estimators.certification.deep_z")
tqdm = getattr(optional("tqdm"), "tqdm", None)

EPS = (0.005, 0.01, 0.02, 0.05)
# Seconds between two peers' calls: the previous peer's thread pool stops
# spinning (the harness's pause, bench/README.md).
PAUSE = 0.02
HERE = os.path.dirname(os.path.abspath(__file__))


# --- the networks, trained with cypool's layers ------------------------------

def conv_small(rng):
    return [cypool.Conv2d(1, 16, 4, stride=2, rng=rng), cypool.ReLU(),
            cypool.Conv2d(16, 32, 4, stride=2, rng=rng), cypool.ReLU(), cypool.Flatten(),
            cypool.Linear(32 * 5 * 5, 100, rng=rng), cypool.ReLU(), cypool.Linear(100, 10, rng=rng)]


def conv_med(rng):
    return [cypool.Conv2d(1, 16, 4, stride=2, padding=1, rng=rng), cypool.ReLU(),
            cypool.Conv2d(16, 32, 4, stride=2, padding=1, rng=rng), cypool.ReLU(), cypool.Flatten(),
            cypool.Linear(32 * 7 * 7, 1000, rng=rng), cypool.ReLU(), cypool.Linear(1000, 10, rng=rng)]


NETWORKS = {"ConvSmall": conv_small, "ConvMed": conv_med}


def forward(layers, x):
    for layer in layers:
        x = layer.forward(x)
    return x


def train(layers, x, y, epochs, lr=0.05, batch=32, seed=0):
    """Plain SGD with momentum 0.9 on softmax cross-entropy, batches of 32."""
    rng = np.random.default_rng(seed)
    params = [(layer, name) for layer in layers for name in ("weight", "bias")
              if getattr(layer, name, None) is not None]
    velocity = {(id(layer), name): 0.0 for layer, name in params}
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for i in range(0, len(y), batch):
            idx = order[i:i + batch]
            _, g = _softmax_xent(forward(layers, x[idx]), y[idx])
            for j, layer in enumerate(reversed(layers)):
                if j == len(layers) - 1 and isinstance(layer, cypool.Conv2d):
                    layer.backward(g, needs_input_grad=False)
                else:
                    g = layer.backward(g)
            for layer, name in params:
                key = (id(layer), name)
                velocity[key] = 0.9 * velocity[key] - lr * getattr(layer, "grad_" + name)
                setattr(layer, name, getattr(layer, name) + velocity[key])


def weights(layers):
    """[(kind, weight, bias, stride, padding)] of a cypool stack, float64."""
    out = []
    for layer in layers:
        if isinstance(layer, cypool.Conv2d):
            out.append(("conv", layer.weight.astype(np.float64), layer.bias.astype(np.float64),
                        layer.stride, layer.padding))
        elif isinstance(layer, cypool.Linear):
            out.append(("linear", layer.weight.astype(np.float64), layer.bias.astype(np.float64)))
        elif isinstance(layer, cypool.ReLU):
            out.append(("relu",))
        else:
            out.append(("flatten",))
    return out


# --- the PyTorch DeepZ peers -------------------------------------------------

def torch_model(spec):
    """torch.nn.Sequential of spec's layers (float64)."""
    nn = torch.nn
    mods = []
    for layer in spec:
        if layer[0] == "conv":
            _, w, b, s, p = layer
            m = nn.Conv2d(w.shape[1], w.shape[0], w.shape[2:], stride=s, padding=p).double()
            m.weight.data, m.bias.data = torch.from_numpy(w), torch.from_numpy(b)
        elif layer[0] == "linear":
            _, w, b = layer
            m = nn.Linear(w.shape[1], w.shape[0]).double()
            m.weight.data, m.bias.data = torch.from_numpy(w), torch.from_numpy(b)
        else:
            m = nn.ReLU() if layer[0] == "relu" else nn.Flatten(0)
        mods.append(m)
    return nn.Sequential(*mods)


def torch_deepz(spec):
    """A DeepZ in plain PyTorch, generators first: z (1 + n, ...) float64,
    z[0] the centre. Returns certify(x, eps, label) -> bool."""
    F = torch.nn.functional
    layers = [(kind, *[torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in rest])
              for kind, *rest in spec]

    def relu(z):
        shape = z.shape
        z = z.reshape(shape[0], -1)
        r = z[1:].abs().sum(0)
        lo, up = z[0] - r, z[0] + r
        unstable = (lo < 0) & (up > 0)
        lam = torch.where(unstable, up / (up - lo), (lo >= 0).to(z.dtype))
        mu = torch.where(unstable, -lam * lo / 2, torch.zeros((), dtype=z.dtype))
        idx = unstable.nonzero()[:, 0]
        out = torch.zeros((shape[0] + len(idx), z.shape[1]), dtype=z.dtype)
        torch.mul(z, lam, out=out[:shape[0]])
        out[0] += mu
        out[shape[0] + torch.arange(len(idx)), idx] = mu[idx]
        return out.reshape((-1,) + tuple(shape[1:]))

    def certify(x, eps, label):
        x = torch.from_numpy(np.asarray(x, dtype=np.float64))
        lo, hi = (x - eps).clamp(0, 1), (x + eps).clamp(0, 1)
        half = ((hi - lo) / 2).reshape(-1)
        free = (half > 0).nonzero()[:, 0]
        z = torch.zeros((1 + len(free), x.numel()), dtype=torch.float64)
        z[0] = ((lo + hi) / 2).reshape(-1)
        z[1 + torch.arange(len(free)), free] = half[free]
        z = z.reshape((-1,) + tuple(x.shape))
        for kind, *p in layers:
            if kind == "conv":
                w, b, s, pad = p
                z = F.conv2d(z, w, None, s, pad)
                z[0] += b[:, None, None]
            elif kind == "linear":
                w, b = p
                z = z @ w.T
                z[0] += b
            elif kind == "relu":
                z = relu(z)
            else:
                z = z.reshape(z.shape[0], -1)
        d = z[:, label:label + 1] - z
        m = d[0] - d[1:].abs().sum(0)
        m[label] = float("inf")
        return bool((m > 0).all())

    return certify


def art_certifier(spec):
    """ART's PytorchDeepZ on spec's weights: certify(x, eps, label) -> bool,
    as ART's own examples call it (pre_process, then certify)."""
    mods = [m for m in torch_model(spec).float() if not isinstance(m, torch.nn.Flatten)]

    class Net(torch.nn.Module):  # ART converts the children and infers the flatten
        def __init__(self):
            super().__init__()
            for i, m in enumerate(mods):
                self.add_module(str(i), m)

        def forward(self, x):
            for m in mods:
                if isinstance(m, torch.nn.Linear) and x.ndim > 2:
                    x = x.reshape(x.shape[0], -1)
                x = m(x)
            return x

    model = Net()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        devnull = open(os.devnull, "w")
        old, sys.stdout = sys.stdout, devnull  # ART prints where it infers the flatten
        try:
            cert = art_deepz.PytorchDeepZ(model=model, loss=torch.nn.CrossEntropyLoss(),
                                          input_shape=(1, 28, 28), nb_classes=10, clip_values=(0.0, 1.0),
                                          device_type="cpu")
        finally:
            sys.stdout = old
            devnull.close()

    def certify(x, eps, label):
        # ART's own pre_process (its clip to [0, 1]) fails under numpy 2
        # (it assigns a 1-element array to a scalar); the same box is built
        # here: centre the clipped box's midpoint, one generator per pixel.
        lo, hi = np.clip(x - eps, 0, 1), np.clip(x + eps, 0, 1)
        cent = ((lo + hi) / 2).astype(np.float32)
        eps_bound = np.diag(((hi - lo) / 2).astype(np.float32).ravel()).reshape((x.size,) + x.shape)
        return bool(cert.certify(cent=cent[None], eps=eps_bound, prediction=label))

    return certify


# --- the measurements --------------------------------------------------------

def layer_split(net, xs, labels, eps):
    """Median seconds per layer type of one certification (cypool), over
    the images xs (Network.certify's times)."""
    per = {}
    for x, label in zip(xs, labels):
        times = {}
        net.certify(x, eps, int(label), times=times)
        for k, v in times.items():
            per.setdefault(k.replace("Vector", "").replace("2d", ""), []).append(v)
    return {k: statistics.median(v) for k, v in per.items()}


_RSS_PROBE = """
import numpy as np, sys
sys.path.insert(0, {here!r})
from cypool import zonotope
d = np.load({path!r}, allow_pickle=True)
net = zonotope.Network.from_layers(list(d["layers"]), num_threads={n})
from _rss import status
x, eps, label = d["x"], float(d["eps"]), int(d["label"])
base = status("VmRSS")
net.certify(x, eps, label)
peak = status("VmHWM") - base
z = zonotope.from_box(x, eps)
big = z.nbytes
for layer in net.layers:
    z = layer.forward(z)
    big = max(big, z.nbytes)
print(peak, big)
"""


def memory(spec, x, eps, label, n):
    """(extra peak RSS of one certification, its largest zonotope), bytes,
    in a fresh process (None where /proc is unavailable)."""
    layers = [({"weight": a[1], "bias": a[2], "stride": a[3], "padding": a[4]} if a[0] == "conv" else
               {"weight": a[1], "bias": a[2]} if a[0] == "linear" else a[0]) for a in spec]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "net.npz")
        holder = np.empty(len(layers), dtype=object)
        holder[:] = layers
        np.savez(path, layers=holder, x=x, eps=eps, label=label)
        res = subprocess.run([sys.executable, "-c", _RSS_PROBE.format(here=HERE, path=path, n=n)],
                             capture_output=True, text=True)
    if res.returncode:
        return None
    peak, big = (int(v) for v in res.stdout.split())
    return peak, big


def progress(it, desc, total):
    if tqdm is None:
        return it
    return tqdm(it, desc=desc, total=total, leave=False, file=sys.stderr)


def run_network(name, layers, x_te, y_te, images, eps_list, n, peers_on):
    """Certify the first `images` correctly classified test images at each
    eps with every peer, interleaved image by image; returns the table rows."""
    spec = weights(layers)
    net = zonotope.Network.from_layers(layers, num_threads=n)
    preds = np.array([int(np.argmax(net.predict(x.astype(np.float64)))) for x in x_te])
    correct = np.flatnonzero(preds == y_te)[:images]
    accuracy = float((preds == y_te).mean())
    net32 = zonotope.Network.from_layers(layers, dtype=np.float32, num_threads=n)
    peers = {"cypool": lambda x, e, lab: net.certify(x, e, lab),
             "cypool float32": lambda x, e, lab: net32.certify(x, e, lab)}
    if torch is not None and "torch" in peers_on:
        peers["torch DeepZ"] = torch_deepz(spec)
    if torch is not None and art_deepz is not None and "art" in peers_on:
        peers["ART DeepZ"] = art_certifier(spec)
    rows = []
    for eps in eps_list:
        times = {p: [] for p in peers}
        verified = {p: 0 for p in peers}
        disagree = 0
        for i in progress(correct, f"{name} eps={eps}", len(correct)):
            x = x_te[i].astype(np.float64)
            got = {}
            for p, fn in peers.items():
                time.sleep(PAUSE)  # the previous peer's threads asleep
                t = time.perf_counter()
                got[p] = fn(x, eps, int(y_te[i]))
                times[p].append(time.perf_counter() - t)
                verified[p] += got[p]
            if "torch DeepZ" in got and got["torch DeepZ"] != got["cypool"]:
                disagree += 1
        if disagree:
            raise SystemExit(f"{name} eps={eps}: cypool and the float64 torch DeepZ disagree on "
                             f"{disagree} images")
        rows.append((eps, verified, {p: statistics.median(v) for p, v in times.items()}))
    return accuracy, len(correct), rows, spec, net, x_te[correct].astype(np.float64), y_te[correct]


def table(name, accuracy, count, rows):
    peers = list(rows[0][1])
    others = [p for p in peers if p != "cypool"]
    lines = [f"### {name} (test accuracy {accuracy:.1%}; the first {count} correctly classified test "
             f"images)", "",
             "| eps | " + " | ".join(f"{p} verified" for p in peers) + " | "
             + " | ".join(f"{p} ms/image" for p in peers) + " | "
             + " | ".join(f"{p} / cypool" for p in others) + " |",
             "|" + "---|" * (1 + 2 * len(peers) + len(others))]
    for eps, verified, times in rows:
        lines.append(f"| {eps} | " + " | ".join(str(verified[p]) for p in peers) + " | "
                     + " | ".join(f"{times[p] * 1e3:.2f}" for p in peers) + " | "
                     + " | ".join(f"{times[p] / times['cypool']:.2f}x" for p in others) + " |")
    if "ART DeepZ" in peers:
        lines += ["", "ART DeepZ / cypool float32 (both float32): " + ", ".join(
            f"{times['ART DeepZ'] / times['cypool float32']:.2f}x at eps {eps}" for eps, _, times in rows)]
    return "\n".join(lines)


def plot(results, path):
    plt = optional("matplotlib.pyplot")
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for name, (_, count, rows) in results.items():
        ax.plot([r[0] for r in rows], [r[1]["cypool"] / count for r in rows], marker="o", label=name)
    ax.set_xscale("log")
    eps = sorted({r[0] for _, _, rows in results.values() for r in rows})
    ax.set_xticks(eps)
    ax.set_xticklabels([f"{e:g}" for e in eps])
    ax.minorticks_off()
    ax.set_xlabel("eps (L-infinity, pixels in [0, 1])")
    ax.set_ylabel("verified fraction (DeepZ)")
    ax.set_ylim(0, 1.02)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def vnncomp_folders(argv):
    """The folders after --vnncomp (taken out of argv), or None."""
    if "--vnncomp" not in argv:
        return None
    k = argv.index("--vnncomp")
    end = k + 1
    while end < len(argv) and not argv[end].startswith("--"):
        end += 1
    folders = argv[k + 1:end]
    del argv[k:end]
    if not folders:
        shared = os.path.join(HERE, "..", "..", "shared", "vnncomp2021")
        folders = sorted(os.path.join(shared, d) for d in os.listdir(shared)) if os.path.isdir(shared) else []
    return folders


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    folders = vnncomp_folders(argv)
    if folders is not None:
        import _vnncomp

        args, n, _ = start(__doc__, argv, quick_repeats=1)
        if _vnncomp.main(folders, n, limit=3 if args.quick else None):
            sys.exit(1)
        return
    images = None
    if "--images" in argv:
        k = argv.index("--images")
        images = int(argv[k + 1])
        del argv[k:k + 2]
    args, n, _ = start(__doc__, argv, quick_repeats=1)
    print("ART DeepZ:", "measured" if art_deepz is not None and torch is not None else
          "not installed (pip install adversarial-robustness-toolbox), not measured")
    x_tr, y_tr, x_te, y_te = load_digits_28()
    plan = {"ConvSmall": (images or (10 if args.quick else 100), 2 if args.quick else 8,
                          EPS[1::2] if args.quick else EPS, ("torch", "art")),
            "ConvMed": (images or (3 if args.quick else 20), 1 if args.quick else 4,
                        EPS[1:2] if args.quick else EPS, ("torch",) if args.quick else ("torch", "art"))}
    results, splits, mems = {}, {}, {}
    for name, (count, epochs, eps_list, peers_on) in plan.items():
        layers = NETWORKS[name](np.random.default_rng(0))
        t = time.perf_counter()
        train(layers, x_tr, y_tr, epochs)
        print(f"{name}: trained {epochs} epochs in {time.perf_counter() - t:.1f} s", flush=True)
        for layer in layers:
            layer.eval()
        accuracy, count, rows, spec, net, xs, ys = run_network(name, layers, x_te, y_te, count, eps_list,
                                                              n, peers_on)
        results[name] = (accuracy, count, rows)
        splits[name] = layer_split(net, xs[:10], ys[:10], eps_list[-1])
        mems[name] = memory(spec, xs[0], eps_list[-1], int(ys[0]), n)
    print()
    for name, (accuracy, count, rows) in results.items():
        print(table(name + ", float64 (cypool float32 and ART: float32)", accuracy, count, rows))
        print()
    print("### cypool's time by layer type, one image at the largest eps (median ms over 10 images;"
          " Conv includes the input box)")
    print()
    kinds = sorted({k for s in splits.values() for k in s})
    print("| network | " + " | ".join(kinds) + " |")
    print("|" + "---|" * (1 + len(kinds)))
    for name, s in splits.items():
        print(f"| {name} | " + " | ".join(f"{s.get(k, 0) * 1e3:.2f}" for k in kinds) + " |")
    print()
    print("### extra peak memory of one certification (peak RSS, VmHWM, fresh process)")
    print()
    print("| network | largest zonotope MiB | extra peak RSS MiB | ratio (target <= 2) |")
    print("|---|---|---|---|")
    for name, m in mems.items():
        if m is None:
            print(f"| {name} | n/a | n/a | n/a |")
        else:
            print(f"| {name} | {m[1] / 2**20:.1f} | {m[0] / 2**20:.1f} | {m[0] / m[1]:.2f} |")
    if not args.quick:
        path = plot(results, os.path.join(HERE, "results", "verify.png"))
        if path:
            print(f"\nplot: {os.path.relpath(path, os.path.dirname(HERE))}")


if __name__ == "__main__":
    main()
