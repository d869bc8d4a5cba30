"""A VNN-COMP folder of deeper dense nets, for bench_verify.py --vnncomp.

The shared mnistfc folder holds one net of mnistfc's three (256x2); the
others (256x4, 256x6) and ERAN's mnist_relu_9_200 are deeper, where back-
substitution's cost grows with the square of the depth. This writes nets
of those shapes, trained here on scikit-learn's digits (28 x 28, no
download), in ONNX (Gemm and Relu, as mnistfc's), with mnistfc's kind of
property: each of the first ten correctly classified test images, at
L-inf radius 0.005, 0.01 and 0.05 clipped to [0, 1], keeps its class
(these nets are less robust than mnistfc's: the radii give some of each
verdict).

    python bench/make_digits_vnncomp.py OUT_DIR [--images N]
    python bench/bench_verify.py --vnncomp OUT_DIR

Needs scikit-learn and onnx (cypool[onnx]); seeded, so a rerun on the same
machine writes the same files.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from cnn_models import load_digits_28

SHAPES = ((256, 4), (256, 6), (200, 9))  # (width, hidden layers)
EPS = (0.005, 0.01, 0.05)


def train(sizes, x, y, epochs=40, batch=64, lr=1e-3, seed=0):
    """A dense ReLU net of layer sizes, trained by Adam on softmax cross-
    entropy: [(W, b), ...], W (out, in), float32."""
    rng = np.random.default_rng(seed)
    params = [(rng.standard_normal((o, i)) * np.sqrt(2 / i), np.zeros(o))
              for i, o in zip(sizes[:-1], sizes[1:])]
    flat = [p for wb in params for p in wb]
    m = [np.zeros_like(p) for p in flat]
    v = [np.zeros_like(p) for p in flat]
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for s in range(0, len(x), batch):
            idx = order[s:s + batch]
            acts = [x[idx]]
            for k, (W, b) in enumerate(params):
                z = acts[-1] @ W.T + b
                acts.append(np.maximum(z, 0) if k < len(params) - 1 else z)
            p = np.exp(acts[-1] - acts[-1].max(axis=1, keepdims=True))
            g = p / p.sum(axis=1, keepdims=True)
            g[np.arange(len(idx)), y[idx]] -= 1
            g /= len(idx)
            grads = []
            for k in range(len(params) - 1, -1, -1):
                W, _ = params[k]
                grads[:0] = [g.T @ acts[k], g.sum(axis=0)]
                g = (g @ W) * (acts[k] > 0)
            step += 1
            for j, (p_, d) in enumerate(zip(flat, grads)):
                m[j] = 0.9 * m[j] + 0.1 * d
                v[j] = 0.999 * v[j] + 0.001 * d * d
                p_ -= lr * (m[j] / (1 - 0.9 ** step)) / (np.sqrt(v[j] / (1 - 0.999 ** step)) + 1e-8)
    return [(W.astype(np.float32), b.astype(np.float32)) for W, b in params]


def predict(params, x):
    for k, (W, b) in enumerate(params):
        x = x @ W.T + b
        if k < len(params) - 1:
            x = np.maximum(x, 0)
    return x.argmax(axis=1)


def write_onnx(path, params):
    from onnx import TensorProto, helper, numpy_helper, save

    nodes, inits, name = [], [], "input"
    for k, (W, b) in enumerate(params):
        inits += [numpy_helper.from_array(W, f"W{k}"), numpy_helper.from_array(b, f"b{k}")]
        nodes.append(helper.make_node("Gemm", [name, f"W{k}", f"b{k}"], [f"z{k}"], transB=1))
        name = f"z{k}"
        if k < len(params) - 1:
            nodes.append(helper.make_node("Relu", [name], [f"r{k}"]))
            name = f"r{k}"
    n_in, n_out = params[0][0].shape[1], params[-1][0].shape[0]
    graph = helper.make_graph(nodes, "digits",
                              [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, n_in])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, n_out])], inits)
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


def write_vnnlib(path, lo, hi, label, n_classes):
    lines = [f"; digits property with label: {label}.", ""]
    lines += [f"(declare-const X_{i} Real)" for i in range(lo.size)] + [""]
    lines += [f"(declare-const Y_{j} Real)" for j in range(n_classes)] + [""]
    for i in range(lo.size):
        lines += [f"(assert (<= X_{i} {float(hi[i])!r}))", f"(assert (>= X_{i} {float(lo[i])!r}))"]
    lines += ["(assert (or"] + [f"    (and (>= Y_{j} Y_{label}))" for j in range(n_classes) if j != label]
    lines += ["))", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--images", type=int, default=10, help="properties per net and radius")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    x_tr, y_tr, x_te, y_te = load_digits_28()
    x_tr, x_te = x_tr.reshape(len(x_tr), -1), x_te.reshape(len(x_te), -1)
    rows = []
    for width, depth in SHAPES:
        params = train((x_tr.shape[1],) + (width,) * depth + (10,), x_tr, y_tr)
        pred = predict(params, x_te)
        net = f"digits-net_{width}x{depth}.onnx"
        write_onnx(os.path.join(args.out, net), params)
        print(f"{net}: test accuracy {np.mean(pred == y_te):.3f}")
        for k, i in enumerate(np.flatnonzero(pred == y_te)[:args.images]):
            x = x_te[i].astype(np.float64)
            for eps in EPS:
                spec = f"prop_{width}x{depth}_{k}_{eps}.vnnlib"
                write_vnnlib(os.path.join(args.out, spec), np.clip(x - eps, 0, 1), np.clip(x + eps, 0, 1),
                             int(y_te[i]), 10)
                rows.append(f"{net},{spec},120")
    with open(os.path.join(args.out, "instances.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    print(f"{len(rows)} instances in {args.out}")


if __name__ == "__main__":
    main()
