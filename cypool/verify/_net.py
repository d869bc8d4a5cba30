"""The networks cypool.verify bounds: a chain of affine maps and ReLUs.

Every affine op maps a batch ``(N, *in_shape)`` to ``(N, *out_shape)``
(``apply``), has a full-shape ``bias``, and a transposed linear part
(``T``): what back-substitution pushes bound coefficients through, K
rows ``(K, *out_shape)`` to ``(K, *in_shape)``; ``T_cols`` does it with
the rows as the last axis, ``(*out_shape, K)`` to ``(*in_shape, K)``.
"""
from __future__ import annotations

import copy
import math
import threading

import numpy as np

from .. import _checks as chk
from .. import _conv_engine as engine
from .. import _geometry as geo
from .._backend import kernel, threads_for
from .._select import VectorAlgo, select_vector_backward
from ..vector_conv import vector_conv2d_backward

__all__ = ["Dense", "Conv", "Elementwise", "Reshape", "ReLU", "Net", "Buffers"]


# Rows up to which a product by a large matrix runs row by row: OpenBLAS's
# gemm packs the whole matrix for 2 or 3 rows (2 by oval21's 1024 x 100
# layer: 96 us, against 34 us for two gemv; 3 rows by 256 x 256: 74
# against 37 us); at 4 it is about even, and by a small matrix gemm wins.
FEW_ROWS, FEW_ROWS_MIN_SIZE = 3, 32768


def product(A, B, out=None):
    """A @ B; row by row where A is 2-D with 2 to FEW_ROWS rows and B is
    large."""
    if A.ndim == 2 and 1 < A.shape[0] <= FEW_ROWS and B.size >= FEW_ROWS_MIN_SIZE:
        if out is None:
            out = np.empty((A.shape[0], B.shape[1]), np.result_type(A, B))
        for k in range(A.shape[0]):
            np.matmul(A[k], B, out=out[k])
        return out
    return np.matmul(A, B, out=out)


class Dense:
    """y = W x + b on flat vectors."""

    def __init__(self, W, b):
        self.W, self.bias = W, b
        self.in_shape, self.out_shape = (W.shape[1],), (W.shape[0],)
        self._absW = self._WT = None
        self._memos = {}

    def apply(self, X):
        out = product(X, self.W.T)
        out += self.bias
        return out

    def absW(self):
        if self._absW is None:
            self._absW = np.abs(self.W)
        return self._absW

    def WT(self):
        """W's transpose, C-contiguous."""
        if self._WT is None:
            self._WT = np.ascontiguousarray(self.W.T)
        return self._WT

    def T(self, A, buffers=None, live=None, live_in=None):
        """A @ W; live: the outputs the ReLU above left alive (the others'
        coefficients are 0), A's columns then being theirs only (as
        crown_relu_live writes them); live_in: the inputs the ReLU below
        leaves alive, the only columns written (the others' coefficients
        it would zero)."""
        if live_in is None:
            out = kept(buffers, ("T", id(self)), (A.shape[0], self.W.shape[1]), A.dtype)
            W = self.W if live is None else self._live_rows(live)
        else:
            out = kept(buffers, ("Tlive", id(self)), (A.shape[0] * live_in.size,),
                       A.dtype).reshape(A.shape[0], live_in.size)
            W = self._live_block(live, live_in)
        return product(A, W, out)

    def _memo(self, name, key, make):
        """make(), kept under name for the next call with the same key (a
        tuple of arrays or None): every row a bounds call pushes through
        this layer comes with the same live sets and box."""
        old = self._memos.get(name)
        if old is None or not all(_same(a, b) for a, b in zip(old[0], key)):
            old = self._memos[name] = (tuple(None if k is None else k.copy() for k in key), make())
        return old[1]

    def _live_rows(self, live):
        """W's rows live."""
        return self._memo("rows", (live,), lambda: np.take(self.W, live, axis=0))

    def _live_block(self, live, live_in):
        """W's block of rows live (None: all) and columns live_in."""
        return self._memo("block", (live, live_in), lambda: np.take(
            self.W if live is None else self._live_rows(live), live_in, axis=1))

    def single(self, live, lo, hi):
        """What a float32 product of rows through W's rows live (None: all)
        into the box [lo, hi] needs (see _crown._box_f32): ``(W32, wmid,
        nrad, rad, v, tiny)``, W32 those rows rounded to float32, wmid
        their float64 product with the box's centre, ``rad`` a radius
        about that centre that holds the box (rounded up) and nrad its
        negative, ``v = 1.01 (gamma_{m+3} |W| rad + gamma_{n+m+2} |W|
        |mid|)`` (float32's gamma, then float64's; W is m x n), and tiny
        float32's underflow."""
        return self._memo("single", (live, lo, hi), lambda: self._single(live, lo, hi))

    def _single(self, live, lo, hi):
        W = self.W if live is None else self._live_rows(live)
        eps = np.finfo(np.float64).eps
        mid = (lo + hi) / 2
        rad = np.maximum(hi - mid, mid - lo) * (1 + 4 * eps) + np.finfo(np.float64).tiny
        absW = np.abs(W)
        m, n = W.shape
        g32 = _gamma(m + 3, np.float32)
        g64 = _gamma(n + m + 2, np.float64)  # A (W mid): W mid's n terms, then m
        wrad = absW @ rad
        v = 1.01 * (g32 * wrad + g64 * (absW @ np.abs(mid)))
        tiny = np.ldexp(1.0, -149) * (wrad.sum() + m * rad.sum())
        return W.astype(np.float32), W @ mid, -rad, rad, v, tiny

    def T_cols(self, A, buffers=None, live=None):
        """T with the rows as A's last axis: W.T @ A; live as in T, but A
        has every output's row and the live ones are taken here."""
        out = kept(buffers, ("Tc", id(self)), (self.W.shape[1], A.shape[1]), A.dtype, True)
        W = self.W
        if live is not None:
            A, W = A[live], self._live_rows(live)
        return np.matmul(W.T, A, out=out)

    def radius(self, R):
        """|W| R: the radius of the image of a box of radius R."""
        return product(R, self.absW().T)

    @property
    def fan_in(self):
        return self.W.shape[1]


class Conv:
    """A 2-D convolution (groups 1) with a full-shape bias ``(O, OH, OW)``;
    pads ``(top, left, bottom, right)``, the part on which both sides agree
    handled by the convolution engine, the rest by an explicit pad. The
    engine's plans are made once per batch size and dtype: the shapes were
    checked when the net was read, so calls skip conv2d's checks (half of
    a small call's time)."""

    def __init__(self, w, b, in_shape, stride, pads, dilation):
        C, H, W = in_shape
        t, left, bot, r = pads
        self.w, self.stride, self.dilation = np.ascontiguousarray(w), stride, dilation
        self.sym = (min(t, bot), min(left, r))
        self.extra = ((t - self.sym[0], bot - self.sym[0]), (left - self.sym[1], r - self.sym[1]))
        self.in_shape = tuple(in_shape)
        (ph, pw), (et, eb), (el, er) = self.sym, *self.extra
        kh, kw = w.shape[2:]
        dh, dw = dilation
        OH = (H + et + eb + 2 * ph - dh * (kh - 1) - 1) // stride[0] + 1
        OW = (W + el + er + 2 * pw - dw * (kw - 1) - 1) // stride[1] + 1
        if OH < 1 or OW < 1:
            raise ValueError(f"the kernel {(kh, kw)} is larger than the padded input {in_shape}")
        self.out_shape = (w.shape[0], OH, OW)
        self._window = geo.WindowGeometry(kh, kw, *stride, ph, pw, dh, dw, OH, OW)
        self.bias = np.broadcast_to(np.asarray(b, w.dtype).reshape(-1, 1, 1), self.out_shape).copy()
        self._absw = None
        self.num_threads = None
        self._plans = {}

    def __getstate__(self):  # a copy or a pickle plans afresh (another CPU may load it)
        return dict(self.__dict__, _plans={})

    def _plan(self, n, dtype):
        """The engine's plan for n images of the padded input, in dtype."""
        key = (n, dtype)
        p = self._plans.get(key)
        if p is None:
            (et, eb), (el, er) = self.extra
            C, H, W = self.in_shape
            p = self._plans[key] = engine.plan((n, C, H + et + eb, W + el + er), self.w.shape,
                                               self.stride, self.sym, self.dilation, dtype,
                                               winograd=False)
        return p

    def _padded(self, X):
        (et, eb), (el, er) = self.extra
        if et or eb or el or er:
            X = np.pad(X, ((0, 0), (0, 0), (et, eb), (el, er)))
        return X

    def _conv(self, X, w):
        X = np.ascontiguousarray(self._padded(X), w.dtype)
        p = self._plan(X.shape[0], w.dtype)
        out = np.empty(p.out_shape, w.dtype)
        engine.forward_into(out, X, w, chk.no_bias(w.dtype), p, chk.num_threads_arg(self.num_threads))
        return out

    def absw(self):
        if self._absw is None:
            self._absw = np.abs(self.w)
        return self._absw

    def apply(self, X):
        out = self._conv(X, self.w)
        out += self.bias
        return out

    def radius(self, R):
        return self._conv(R, self.absw())

    def T(self, A, buffers=None):
        """The transposed map of A; written into a kept array of buffers (a
        Buffers), which the next call with them overwrites, where given."""
        w = self.w
        (et, eb), (el, er) = self.extra
        C, H, W = self.in_shape
        shape = (A.shape[0], C, H + et + eb, W + el + er)
        out = kept(buffers, ("T", id(self)), shape, A.dtype)
        engine.input_grad_into(out, np.ascontiguousarray(A, w.dtype), w,
                               self._plan(A.shape[0], w.dtype), chk.num_threads_arg(self.num_threads))
        return out[:, :, et:et + H, el:el + W]

    def T_cols(self, A, buffers=None):
        """T with the rows as A's last axis: the vector convolution's input
        gradient, E = K. By its E-vectorised tiles (where its own choice is
        them), with the coefficient rows that are all zero left out: a dead
        ReLU's, half of them on oval21's net."""
        (et, eb), (el, er) = self.extra
        C, H, W = self.in_shape
        K = A.shape[-1]
        shape = (C, H + et + eb, W + el + er, K)
        out = kept(buffers, ("Tc", id(self)), shape, A.dtype, True)
        A = np.ascontiguousarray(A, self.w.dtype)
        if select_vector_backward(K, *self.stride) == VectorAlgo.TILES:
            engine.vector_input_grad_into(out[None], A[None], self.w, self._window,
                                          chk.num_threads_arg(self.num_threads), skip_zero_taps=True)
            g = out
        else:
            # never by F(2, 3) (see _plan): from COLUMNS_MIN_ROWS rows, conv2d's
            # kernels see taps K apart (rows of W * K values) or a stride
            g, _, _ = vector_conv2d_backward(A, np.broadcast_to(np.zeros((), A.dtype), shape), self.w,
                                             self.stride, self.sym, self.dilation,
                                             needs_weight_grad=False, grad_x_out=out,
                                             num_threads=self.num_threads)
        return g[:, et:et + H, el:el + W]

    @property
    def fan_in(self):
        return math.prod(self.w.shape[1:])


class Elementwise:
    """y = scale * x + shift, element by element (full-shape arrays)."""

    def __init__(self, scale, shift):
        self.scale, self.bias = scale, shift
        self.in_shape = self.out_shape = scale.shape

    def apply(self, X):
        return X * self.scale + self.bias

    def T(self, A, buffers=None):
        return np.multiply(A, self.scale, out=kept(buffers, ("T", id(self)), A.shape, A.dtype))

    def T_cols(self, A, buffers=None):
        out = kept(buffers, ("Tc", id(self)), A.shape, A.dtype, True)
        return np.multiply(A, self.scale[..., None], out=out)

    def radius(self, R):
        return R * np.abs(self.scale)

    fan_in = 1


class Reshape:
    """A new shape of the same C-order values (Flatten, Reshape)."""

    def __init__(self, in_shape, out_shape):
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        self.bias = None

    def apply(self, X):
        return X.reshape((X.shape[0],) + self.out_shape)

    def T(self, A, buffers=None):
        return A.reshape((A.shape[0],) + self.in_shape)

    def T_cols(self, A, buffers=None):
        return A.reshape(self.in_shape + (A.shape[-1],))

    radius = apply

    fan_in = 0


class ReLU:
    def __init__(self, shape):
        self.in_shape = self.out_shape = tuple(shape)

    def apply(self, X):
        return np.maximum(X, 0)


class Buffers:
    """Arrays kept from call to call, one set per thread, for the large
    outputs of back-substitution: a fresh array's pages fault in on its
    first write (on oval21 about 2,700 faults, half the bounds' time)."""

    def __init__(self):
        self._local = threading.local()

    def __reduce__(self):  # a copy or a pickled net starts with none kept
        return (Buffers, ())

    def get(self, key, shape, dtype, last=False):
        """A C-contiguous array of shape, starting on a 64-byte line (the
        column steps ran 1.8x slower on 16-byte-aligned rows): the start
        of the one kept for key, dtype and shape[1:] (last: shape[:-1]),
        which grows as needed."""
        arrays = self._local.__dict__.setdefault("arrays", {})
        dtype = np.dtype(dtype)
        full = (key, tuple(shape[:-1] if last else shape[1:]), last, dtype)
        n = math.prod(shape)
        a = arrays.get(full)
        if a is None or a.size < n:
            raw = np.empty(n * dtype.itemsize + 64, np.uint8)
            skip = -raw.ctypes.data % 64
            a = arrays[full] = raw[skip:skip + n * dtype.itemsize].view(dtype)
        return a[:n].reshape(shape)


def _gamma(n, dtype) -> float:
    """n u / (1 - n u), u the unit roundoff of dtype: Higham's bound on
    the relative error of a sum of n terms."""
    u = np.finfo(dtype).eps / 2
    return n * u / (1 - n * u)


def _same(a, b):
    """Whether a and b are both None or equal arrays."""
    return a is b or (a is not None and b is not None and np.array_equal(a, b))


def kept(buffers, key, shape, dtype, last=False):
    """buffers.get(key, shape, dtype, last); a fresh array where buffers is
    None."""
    return np.empty(shape, dtype) if buffers is None else buffers.get(key, shape, dtype, last)


def signed_rows(M, rows, buffers, key, cols=None):
    """M's rows (along axis 0), then their negatives: the coefficients of
    ``y_r`` and ``-y_r``, into kept(buffers, key, ...); cols: of a 2-D M,
    only these columns."""
    n = len(rows)
    if cols is None:
        A = kept(buffers, key, (2 * n,) + M.shape[1:], M.dtype)
        np.take(M, rows, axis=0, out=A[:n])
    else:  # one kept array whatever the count of columns
        A = kept(buffers, key + ("cols",), (2 * n * cols.size,), M.dtype).reshape(2 * n, cols.size)
        np.take(np.take(M, rows, axis=0), cols, axis=1, out=A[:n])  # (M[np.ix_]: twice as long)
    np.negative(A[:n], out=A[n:])
    return A


def signed_cols(MT, cols, buffers, key, nt=0):
    """MT's columns (MT (n, m), C-contiguous; cols int64 in [0, m)), then
    their negatives: signed_rows of MT's transpose, transposed, into
    kept(buffers, key, ...), in one compiled pass (np.take along the last
    axis and np.negative took 0.5 ms on oval21's dense layer)."""
    A = kept(buffers, key, (MT.shape[0], 2 * len(cols)), MT.dtype, True)
    kernel("crown_signed_cols", MT.dtype)(MT, np.ascontiguousarray(cols, np.int64), A,
                                          threads_for(nt, A.size, MT.shape[0]))
    return A


class Net:
    """A network as cypool.verify bounds it: ``ops`` in order, from an
    input of ``input_shape`` (without the batch axis) to a flat output.

    ``forward(x)`` runs a batch ``(N, *input_shape)`` (or flat ``(N,
    n_inputs)``) in the net's dtype; ``gradient(x, g)`` is the gradient of
    ``sum(g * forward(x))`` with respect to x, also in two halves
    (``trace``, then ``backward``) for a caller that wants the outputs too.
    """

    def __init__(self, ops, input_shape, dtype):
        self.ops = list(ops)
        self.input_shape = tuple(input_shape)
        self.dtype = np.dtype(dtype)
        self.n_inputs = int(np.prod(self.input_shape))
        self.n_outputs = int(np.prod(self.ops[-1].out_shape)) if self.ops else self.n_inputs
        self.num_threads = None
        self.buffers = Buffers()
        self._casts = {}  # made once each: their kept buffers last from call to call
        self._threaded = {}

    def _batch(self, x):
        x = np.asarray(x, self.dtype)
        return x.reshape((-1,) + self.input_shape)

    def forward(self, x) -> np.ndarray:
        """The outputs ``(N, n_outputs)`` of the inputs x."""
        X = self._batch(x)
        for op in self.ops:
            X = op.apply(X)
        return X.reshape(X.shape[0], -1)

    def gradient(self, x, g) -> np.ndarray:
        """d sum(g * forward(x)) / dx, shaped as x."""
        _, masks = self.trace(x)
        return self.backward(masks, g).reshape(np.shape(x))

    def trace(self, x):
        """``(forward(x), masks)``: the outputs and each ReLU's ``input > 0``,
        for :meth:`backward`."""
        X = self._batch(x)
        masks = []
        for op in self.ops:
            if isinstance(op, ReLU):
                masks.append(X > 0)
            X = op.apply(X)
        return X.reshape(X.shape[0], -1), masks

    def backward(self, masks, g) -> np.ndarray:
        """d sum(g * forward(x)) / dx ``(N, *input_shape)``, from the masks
        of x's :meth:`trace` and g ``(N, n_outputs)``."""
        G = np.asarray(g, self.dtype).reshape((-1,) + self.ops[-1].out_shape)
        k = len(masks)
        for op in reversed(self.ops):
            if isinstance(op, ReLU):
                k -= 1
                G = G * masks[k]
            else:
                G = op.T(G)
        return G

    def with_threads(self, num_threads) -> "Net":
        """The same network, its convolutions on num_threads threads, and
        the bounds' compiled steps too where it has a convolution
        (_crown.step_threads); made once for each num_threads, kept."""
        n = chk.num_threads_arg(num_threads)  # 0: OpenMP's default
        if n not in self._threaded:
            self._threaded[n] = self._on_threads(num_threads)
        return self._threaded[n]

    def _on_threads(self, num_threads) -> "Net":
        ops = [copy.copy(op) for op in self.ops]
        for op in ops:
            if isinstance(op, Conv):
                op.num_threads = num_threads
        net = Net(ops, self.input_shape, self.dtype)
        net.num_threads = num_threads
        return net

    def astype(self, dtype) -> "Net":
        """The same network with its weights in dtype (made once, kept)."""
        dtype = np.dtype(dtype)
        if dtype == self.dtype:
            return self
        if dtype not in self._casts:
            self._casts[dtype] = self._cast(dtype)
        return self._casts[dtype]

    def _cast(self, dtype) -> "Net":
        ops = []
        for op in self.ops:
            op = copy.copy(op)
            for k, v in vars(op).items():
                if isinstance(v, np.ndarray) and v.dtype.kind == "f":
                    setattr(op, k, v.astype(dtype))
            for k in ("_absW", "_WT", "_absw"):
                if hasattr(op, k):
                    setattr(op, k, None)
            if hasattr(op, "_memos"):
                op._memos = {}
            ops.append(op)
        net = Net(ops, self.input_shape, dtype)
        net.num_threads = self.num_threads
        return net

    def __repr__(self):
        inner = ", ".join(f"{type(op).__name__}{op.in_shape}->{op.out_shape}" for op in self.ops)
        return f"Net({inner})"
