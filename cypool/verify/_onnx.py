"""ONNX networks read into the chain of ops that cypool.verify bounds.

The graph must be a chain: every node reads the one running tensor (the
network's input, transformed) and constants. Shape arithmetic on
constants (Shape, Gather, Unsqueeze, Concat, ...: torch's exported
``view(x.size(0), -1)``) is evaluated here.
"""
from __future__ import annotations

import os

import numpy as np

from ._net import Conv, Dense, Elementwise, Net, Reshape, ReLU

__all__ = ["load_onnx"]


def _onnx():
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError:
        raise ImportError("cypool.verify.load_onnx needs the onnx package: "
                          "pip install 'cypool[onnx]'") from None
    return onnx, numpy_helper


class _Graph:
    """The walk through a graph: constants by name, and the running tensor."""

    def __init__(self, onnx, numpy_helper, graph, dtype):
        self.onnx, self.nh, self.dtype = onnx, numpy_helper, dtype
        self.const = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
        inputs = [i for i in graph.input if i.name not in self.const]
        if len(inputs) != 1:
            raise ValueError(f"net: the graph must have one input, got {[i.name for i in inputs]}")
        dims = [d.dim_value if d.HasField("dim_value") else None
                for d in inputs[0].type.tensor_type.shape.dim]
        if not dims or any(d is None or d < 1 for d in dims[1:]) or dims[0] not in (None, 1):
            raise ValueError(f"net: the input must be (batch of 1, fixed sizes...), got {dims}")
        self.data, self.shape = inputs[0].name, tuple(dims[1:])
        self.input_shape = self.shape
        self.ops: list = []

    def attrs(self, node):
        return {a.name: self.onnx.helper.get_attribute_value(a) for a in node.attribute}

    def split(self, node):
        """(the node's data input or None, its constant inputs by position)."""
        data, consts = None, {}
        for k, name in enumerate(node.input):
            if name == "":
                continue
            if name == self.data:
                if data is not None:
                    raise ValueError(f"net: node {node.name!r} ({node.op_type}) reads the running "
                                     f"tensor twice")
                data = k
            elif name in self.const:
                consts[k] = self.const[name]
            else:
                raise ValueError(f"net: node {node.name!r} ({node.op_type}) reads {name!r}, which is "
                                 f"neither a constant nor the running tensor: only chains are "
                                 f"supported (no branches or skip connections)")
        return data, consts

    def push(self, op, out_name):
        self.ops.append(op)
        self.shape = op.out_shape
        self.data = out_name

    def full(self, c):
        """A constant broadcast against the running tensor (with its batch
        axis of 1): full-shape, or a ValueError where it would change it."""
        c = np.asarray(c, np.float64)
        try:
            b = np.broadcast_shapes(c.shape, (1,) + self.shape)
        except ValueError:
            b = None
        if b != (1,) + self.shape:
            raise ValueError(f"a constant of shape {c.shape} does not broadcast to the tensor's "
                             f"{(1,) + self.shape}")
        return np.broadcast_to(c, b)[0].astype(self.dtype)


def _ints(v, n, default):
    return tuple(int(x) for x in v) if v is not None else (default,) * n


def load_onnx(path, *, dtype=np.float64) -> Net:
    """The network of an ONNX file, as cypool.verify bounds it.

    Supported ops: Conv (groups 1), Gemm, MatMul, Add, Sub, Mul, Div (by a
    constant), Relu, Flatten, Reshape, Constant, BatchNormalization (folded
    to an affine map), AveragePool, Identity, Dropout, and constant shape
    arithmetic (Shape, Gather, Unsqueeze, Squeeze, Concat, Cast). The
    graph must be a chain from its one input to its one output. Anything
    else is a ValueError naming the op and the node.

    Parameters
    ----------
    path : str or os.PathLike
    dtype : float64 (default) or float32
        The dtype of the weights and of ``forward``. :func:`check`
        computes in float64 either way (float32 values are exact there).
    """
    onnx, nh = _onnx()
    dt = np.dtype(dtype)
    if dt not in (np.float32, np.float64):
        raise TypeError(f"dtype must be float32 or float64, got {dt}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file path, got {type(path).__name__}")
    try:
        model = onnx.load(os.fspath(path))
    except Exception as e:  # onnx raises DecodeError and others on a file that is not ONNX
        raise ValueError(f"net: {path} is not a readable ONNX model ({type(e).__name__}: {e})") from None
    g = _Graph(onnx, nh, model.graph, dt)
    for node in model.graph.node:
        try:
            _node(g, node)
        except ValueError as e:
            msg = str(e)
            if not msg.startswith("net:"):
                msg = f"net: node {node.name!r} ({node.op_type}): {msg}"
            raise ValueError(msg) from None
    outs = [o.name for o in model.graph.output]
    if outs != [g.data]:
        raise ValueError(f"net: the graph's output {outs} is not the end of the chain ({g.data!r})")
    return Net(_folded(g.ops), g.input_shape, dt)


def _folded(ops):
    """ops with each elementwise map folded into the dense layer or
    convolution right before it (a convolution only where the scale is
    one number a channel): fewer layers to bound, the same function."""
    out = []
    for op in ops:
        prev = out[-1] if out else None
        if isinstance(op, Elementwise) and isinstance(prev, Dense):
            prev.W = prev.W * op.scale[:, None]
            prev.bias = prev.bias * op.scale + op.bias
            prev._absW = None
            continue
        if isinstance(op, Elementwise) and isinstance(prev, Conv):
            per = op.scale.reshape(op.scale.shape[0], -1)
            if (per == per[:, :1]).all():
                prev.w = prev.w * per[:, 0].reshape(-1, 1, 1, 1)
                prev.bias = prev.bias * op.scale + op.bias
                prev._absw = None
                continue
        out.append(op)
    return out


_CONST_OPS = {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Cast", "Constant"}


def _const_node(g, node, consts):
    """Evaluate a node of constants (shape arithmetic)."""
    a, op = g.attrs(node), node.op_type
    ins = [consts[k] for k in sorted(consts)]
    if op == "Constant":
        if "value" not in a:
            raise ValueError("only Constant's 'value' attribute is supported")
        out = g.nh.to_array(a["value"])
    elif op == "Gather":
        out = np.take(ins[0], ins[1], axis=a.get("axis", 0))
    elif op == "Unsqueeze":
        axes = a.get("axes", ins[1].tolist() if len(ins) > 1 else None)
        out = ins[0]
        for ax in sorted(int(x) for x in axes):
            out = np.expand_dims(out, ax)
    elif op == "Squeeze":
        axes = a.get("axes", ins[1].tolist() if len(ins) > 1 else None)
        out = np.squeeze(ins[0], axis=None if axes is None else tuple(int(x) for x in axes))
    elif op == "Concat":
        out = np.concatenate([np.atleast_1d(i) for i in ins], axis=a.get("axis", 0))
    elif op == "Cast":
        out = ins[0]
    else:
        raise ValueError(f"unsupported op {op}")
    g.const[node.output[0]] = np.asarray(out)


def _node(g, node):
    op = node.op_type
    data, consts = g.split(node)
    a = g.attrs(node)
    out = node.output[0]
    if op == "Shape" and data is not None:
        g.const[out] = np.array((1,) + g.shape, np.int64)
        return
    if data is None:
        if op in _CONST_OPS or op in ("Add", "Sub", "Mul", "Div"):
            if op in _CONST_OPS:
                return _const_node(g, node, consts)
            x, y = (consts[k] for k in sorted(consts))
            g.const[out] = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
                            "Div": np.divide}[op](x, y)
            return
        raise ValueError(f"unsupported op {op} on constants")
    if op in ("Identity", "Dropout"):
        g.data = out
        return
    if op == "Relu":
        return g.push(ReLU(g.shape), out)
    if op == "Flatten":
        axis = a.get("axis", 1)
        if axis != 1:
            raise ValueError(f"Flatten axis {axis}: only axis 1 (keep the batch) is supported")
        return g.push(Reshape(g.shape, (int(np.prod(g.shape)),)), out)
    if op == "Reshape":
        shape = [int(s) for s in consts[1]]
        if shape[0] not in (1, -1, 0):
            raise ValueError(f"Reshape to {shape} changes the batch axis")
        rest = [g.shape[i - 1] if s == 0 else s for i, s in enumerate(shape) if i > 0]
        if rest.count(-1) > 1:
            raise ValueError(f"Reshape to {shape} has two -1 sizes")
        n = int(np.prod(g.shape))
        if -1 in rest:
            known = int(np.prod([s for s in rest if s != -1]))
            rest[rest.index(-1)] = n // known if known and n % known == 0 else -2
        if int(np.prod(rest)) != n or min(rest, default=1) < 1:
            raise ValueError(f"Reshape of {g.shape} to {shape}: the sizes do not match")
        return g.push(Reshape(g.shape, tuple(rest)), out)
    if op in ("Gemm", "MatMul"):
        return _dense(g, node, op, data, consts, a, out)
    if op in ("Add", "Sub", "Mul", "Div"):
        (k, c), = consts.items()
        c = g.full(c)
        one, zero = np.ones(g.shape, g.dtype), np.zeros(g.shape, g.dtype)
        if op == "Add":
            return g.push(Elementwise(one, c), out)
        if op == "Sub":
            return g.push(Elementwise(one, -c) if data == 0 else Elementwise(-one, c), out)
        if op == "Mul":
            return g.push(Elementwise(c, zero), out)
        if data != 0:
            raise ValueError("a constant divided by the running tensor is not affine")
        if (c == 0).any():
            raise ValueError("division by zero")
        return g.push(Elementwise((1 / c.astype(np.float64)).astype(g.dtype), zero), out)
    if op == "Conv":
        return _conv(g, node, consts, a, out)
    if op == "BatchNormalization":
        if len(g.shape) < 1:
            raise ValueError("BatchNormalization needs a channel axis")
        scale, bias, mean, var = (np.asarray(consts[k], np.float64) for k in (1, 2, 3, 4))
        s = scale / np.sqrt(var + a.get("epsilon", 1e-5))
        per = (-1,) + (1,) * (len(g.shape) - 1)
        full = np.ones(g.shape)
        return g.push(Elementwise((full * s.reshape(per)).astype(g.dtype),
                                  (full * (bias - mean * s).reshape(per)).astype(g.dtype)), out)
    if op == "AveragePool":
        return _avg_pool(g, a, out)
    raise ValueError(f"unsupported op {op}")


def _dense(g, node, op, data, consts, a, out):
    if len(g.shape) != 1:
        raise ValueError(f"{op} of a tensor of shape {(1,) + g.shape}: flatten it first")
    if op == "Gemm":
        if data != 0 or a.get("transA", 0):
            raise ValueError("only Gemm(A=the running tensor, B, C) without transA is supported")
        B = np.asarray(consts[1], np.float64)
        W = (B if a.get("transB", 0) else B.T) * a.get("alpha", 1.0)
        c = np.asarray(consts.get(2, 0.0), np.float64) * a.get("beta", 1.0)
    else:
        if data != 0:
            raise ValueError("only MatMul(the running tensor, a constant) is supported")
        W, c = np.asarray(consts[1], np.float64).T, 0.0
    if W.ndim != 2 or W.shape[1] != g.shape[0]:
        raise ValueError(f"weight of shape {W.shape} does not take {g.shape[0]} features")
    b = np.broadcast_to(c, (1, W.shape[0]))[0] if np.ndim(c) else np.full(W.shape[0], float(c))
    g.push(Dense(W.astype(g.dtype), b.astype(g.dtype)), out)


def _conv(g, node, consts, a, out):
    if len(g.shape) != 3:
        raise ValueError(f"Conv of a tensor of shape {(1,) + g.shape}: only 2-D images are supported")
    w = np.asarray(consts[1])
    if a.get("group", 1) != 1:
        raise ValueError(f"group {a['group']}: only groups=1 is supported")
    if w.ndim != 4 or w.shape[1] != g.shape[0]:
        raise ValueError(f"weight of shape {w.shape} does not take {g.shape[0]} channels")
    if a.get("auto_pad", b"NOTSET") not in (b"NOTSET", b"VALID", "NOTSET", "VALID"):
        raise ValueError(f"auto_pad {a['auto_pad']!r} is not supported")
    pads = _ints(a.get("pads"), 4, 0)
    b = consts.get(2, np.zeros(w.shape[0]))
    op = Conv(w.astype(g.dtype), np.asarray(b).astype(g.dtype), g.shape, _ints(a.get("strides"), 2, 1),
              pads, _ints(a.get("dilations"), 2, 1))
    g.push(op, out)


def _avg_pool(g, a, out):
    """Average pooling as a convolution with one channel per channel, and
    where count_include_pad is 0, a per-position correction of the divisor."""
    if len(g.shape) != 3:
        raise ValueError("AveragePool: only 2-D images are supported")
    if a.get("ceil_mode", 0):
        raise ValueError("AveragePool with ceil_mode=1 is not supported")
    kh, kw = _ints(a.get("kernel_shape"), 2, 1)
    pads = _ints(a.get("pads"), 4, 0)
    C = g.shape[0]
    w = np.zeros((C, C, kh, kw), g.dtype)
    w[np.arange(C), np.arange(C)] = 1.0 / (kh * kw)
    conv = Conv(w, np.zeros(C, g.dtype), g.shape, _ints(a.get("strides"), 2, 1), pads, (1, 1))
    g.push(conv, out)
    if not a.get("count_include_pad", 0) and any(pads):
        ones = Conv(np.ones((1, 1, kh, kw)), np.zeros(1), (1,) + g.ops[-1].in_shape[1:], conv.stride,
                    pads, (1, 1))
        count = ones.apply(np.ones((1, 1) + conv.in_shape[1:]))[0]  # the window's pixels inside
        scale = np.broadcast_to((kh * kw) / count, conv.out_shape).astype(g.dtype)
        g.push(Elementwise(scale, np.zeros(conv.out_shape, g.dtype)), out)
