"""Argument checking for every public function: the one place it happens.

Release builds of the kernels run without bounds checks, so everything a
kernel relies on (shapes, parameters, dtypes, contiguity) is established here
first. Errors are ValueError or TypeError and name the offending parameter.
Geometry computations are cached: a layer called in a training loop with the
same shapes pays for them once.
"""
from __future__ import annotations

import operator
from typing import Callable

import numpy as np

from ._backend import kernels as _kernels

# dtypes the kernels are compiled for, and how other real dtypes reach them
# (exactly: max and argmax of a widened integer or float16 are unchanged).
KERNEL_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64))
FLOAT_DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.float64))
_WIDEN: dict[np.dtype, np.dtype] = {
    np.dtype(np.float16): np.dtype(np.float32),
    np.dtype(np.int8): np.dtype(np.int32),
    np.dtype(np.int16): np.dtype(np.int32),
    np.dtype(np.uint8): np.dtype(np.int32),
    np.dtype(np.uint16): np.dtype(np.int32),
    np.dtype(np.uint32): np.dtype(np.int64),
}
_COMPUTE: dict[np.dtype, np.dtype] = {**{d: d for d in KERNEL_DTYPES}, **_WIDEN}
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
_INDEX_ARGS: dict[object, np.dtype] = {np.int64: INDEX_DTYPES[1], np.int32: INDEX_DTYPES[0]}
INT32_LIMIT = 2**31
_INT32_MAX = INT32_LIMIT - 1


def as_int(value, name: str) -> int:
    """value as a Python int; bools and non-integers are a TypeError."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, not bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None


def pair(value, name: str) -> tuple[int, int]:
    """An int or an (h, w) pair as a tuple of two ints."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2:
            raise ValueError(f"{name} must be an int or a pair (h, w), got {value!r}")
        return as_int(value[0], name), as_int(value[1], name)
    v = as_int(value, name)
    return v, v


def num_threads_arg(num_threads) -> int:
    """0 for None (OpenMP's default), else a positive int."""
    if num_threads is None:
        return 0
    if type(num_threads) is int and num_threads >= 1:
        return num_threads
    n = as_int(num_threads, "num_threads")
    if n < 1:
        raise ValueError(f"num_threads must be None or at least 1, got {n}")
    return n


def kernel_dtype(dtype: np.dtype, name: str, floating_only: bool = False) -> np.dtype:
    """The dtype the kernels compute in for an array of this dtype."""
    kd = _COMPUTE.get(dtype)
    if kd is not None:
        if floating_only and (kd not in FLOAT_DTYPES or dtype != kd):
            raise TypeError(f"{name} must be float32 or float64, got {dtype}")
        return kd
    raise TypeError(
        f"{name} has unsupported dtype {dtype}: use float32 or float64"
        + ("" if floating_only else " (integer types up to 32 bits, int64 and float16 are also accepted)")
    )


def array(x, name: str, ndims: tuple[int, ...], floating_only: bool = False):
    """(x as an ndarray of an accepted dtype and rank with no empty dimension,
    the dtype the kernels compute it in)."""
    if not isinstance(x, np.ndarray):
        if hasattr(x, "__array__") or isinstance(x, (list, tuple)):
            x = np.asarray(x)
        else:
            raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
    kd = kernel_dtype(x.dtype, name, floating_only)
    if x.ndim not in ndims:
        run = len(ndims) > 2 and ndims == tuple(range(ndims[0], ndims[-1] + 1))
        want = f"{ndims[0]} to {ndims[-1]}" if run else " or ".join(str(n) for n in ndims)
        raise ValueError(f"{name} must have {want} dimensions, got shape {x.shape}")
    if 0 in x.shape:
        raise ValueError(f"{name} must not have an empty dimension, got shape {x.shape}")
    return x, kd


def contiguous(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A C-contiguous array of dtype; no copy when x already is one."""
    if x.dtype == dtype and x.flags.c_contiguous:
        return x
    return np.ascontiguousarray(x, dtype=dtype)


def index_dtype_arg(index_dtype, plane_size: int) -> np.dtype:
    try:
        dt = _INDEX_ARGS.get(index_dtype) or np.dtype(index_dtype)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"index_dtype must be np.int32 or np.int64, got {index_dtype!r}") from None
    if dt not in INDEX_DTYPES:
        raise TypeError(f"index_dtype must be np.int32 or np.int64, got {dt}")
    if dt == INDEX_DTYPES[0] and plane_size > _INT32_MAX:
        raise ValueError(
            f"index_dtype=int32 cannot index planes of {plane_size} elements (2**31 or more); use np.int64"
        )
    return dt


def index_array(indices, name: str = "indices") -> np.ndarray:
    """indices as an int32/int64 ndarray (other integer dtypes are widened)."""
    if not isinstance(indices, np.ndarray):
        indices = np.asarray(indices)
    if indices.dtype in INDEX_DTYPES:
        return indices
    if indices.dtype.kind in "iu" and indices.dtype != np.uint64:
        return indices.astype(np.int64)
    raise TypeError(f"{name} must be an integer array (int32 or int64), got {indices.dtype}")


def shape_arg(shape, name: str, ndim: int) -> tuple[int, ...]:
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of ints, got {type(shape).__name__}")
    try:
        shape = tuple(map(operator.index, shape))
    except TypeError:
        raise TypeError(f"{name} must be a tuple of ints, got {shape!r}") from None
    if len(shape) != ndim:
        raise ValueError(f"{name} must have {ndim} entries to match grad_output, got {shape}")
    if any(s < 1 for s in shape):
        raise ValueError(f"{name} must be positive, got {shape}")
    return shape


def hashable(v):
    """A parameter (int, pair or string) as an exact key for the geometry
    caches: with its types, so that 2.0 does not hit the entry of 2 (and
    escape the check that refuses it), and lists as tuples."""
    if isinstance(v, np.ndarray):
        v = tuple(v.tolist())
    if isinstance(v, (list, tuple)):
        return tuple((type(e), e) for e in v)
    return type(v), v  # None too: (NoneType, None)


def unhashable(key):
    """The parameter that hashable() made key of (a plain int, or None, is
    its own key)."""
    if key is None or type(key) is int:
        return key
    if not key or isinstance(key[0], tuple):
        return tuple(e for _, e in key)
    return key[1]


def out_arg(out, shape: tuple, dtype: np.dtype, name: str = "out") -> np.ndarray:
    """out= as numpy means it: an array of exactly this shape and dtype,
    written in place; it must be C-contiguous and writable here."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"{name} must have shape {shape}, got {out.shape}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {dtype}, got {out.dtype}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError(f"{name} must be a writable, C-contiguous array")
    return out


def conv_arrays(x, weight, ndims: tuple, xname: str = "x"):
    """(x, weight) of a convolution, checked: float32 or float64, the same
    dtype, x of a rank in ndims and weight (O, C, kh, kw) with x's C
    channels (x's channel axis is its fourth from the end when batched
    images are (N, C, H, W, ...))."""
    x, _ = array(x, xname, ndims, floating_only=True)
    weight, _ = array(weight, "weight", (4,), floating_only=True)
    if weight.dtype != x.dtype:
        raise TypeError(f"weight dtype {weight.dtype} must match {xname} dtype {x.dtype}")
    return x, weight


def conv_channels(C: int, wshape: tuple, xname: str = "x") -> None:
    if wshape[1] != C:
        raise ValueError(f"weight has {wshape[1]} input channels but {xname} has {C} (weight shape {wshape})")


_NO_BIAS = {d: np.empty(0, d) for d in FLOAT_DTYPES}



# plain_array(a, shape, dtype, contiguous): whether a bias or grad_output is
# taken as it is. The compiled kernels' predicate, shared with their memo of
# repeated calls (_kernels/_conv_memo.pxi), so that a repeat and a checked
# call take the same arrays as they are.
plain_array: Callable[[object, tuple, np.dtype, bool], bool] = _kernels.plain_array


def no_bias(dtype: np.dtype) -> np.ndarray:
    """The empty array the convolution kernels take for 'no bias'."""
    return _NO_BIAS[dtype]


def bias_arg(bias, O: int, dtype: np.dtype) -> np.ndarray:
    """bias as a C-contiguous (O,) array of dtype, or no_bias() for None."""
    if bias is None:
        return _NO_BIAS[dtype]
    if plain_array(bias, (O,), dtype, True):
        return bias
    b, _ = array(bias, "bias", (1,), floating_only=True)
    if b.dtype != dtype:
        raise TypeError(f"bias dtype {b.dtype} must match x dtype {dtype}")
    if b.shape != (O,):
        raise ValueError(f"bias must have shape ({O},) for {O} output channels, got {b.shape}")
    return contiguous(b, dtype)


def grad_output_arg(grad_output, dtype: np.dtype, want: tuple) -> np.ndarray:
    """grad_output of a convolution: of x's dtype and the output's shape."""
    if plain_array(grad_output, want, dtype, False):
        return grad_output
    g, _ = array(grad_output, "grad_output", (len(want),), floating_only=True)
    if g.dtype != dtype:
        raise TypeError(f"grad_output dtype {g.dtype} must match x dtype {dtype}")
    if g.shape != want:
        raise ValueError(f"grad_output must have shape {want} for this x and weight, got {g.shape}")
    return g


def call_key(x, weight, stride, padding, dilation):
    """A convolution call's key in the cache of checked calls
    (cypool._conv_engine.checked): its arrays' shapes and dtype, and its
    parameters exactly (hashable()); None for arrays that are not plain
    ndarrays, or parameters that cannot be a key. With the dtype's number:
    a hit also needs the very dtype objects that passed (numpy's own for
    each type)."""
    if type(x) is not np.ndarray or type(weight) is not np.ndarray:
        return None
    if type(stride) is int and type(padding) is int and type(dilation) is int:
        return x.shape, weight.shape, x.dtype.num, stride, padding, dilation
    key = (x.shape, weight.shape, x.dtype.num, hashable(stride), hashable(padding),
           hashable(dilation))
    try:
        hash(key)
    except TypeError:  # a parameter no check accepts (a dict, nested lists): not kept
        return None
    return key


def same_shape(a_shape: tuple, b_shape: tuple, a_name: str, b_name: str) -> None:
    """a_shape must equal b_shape (the names say which arrays differ)."""
    if tuple(a_shape) != tuple(b_shape):
        raise ValueError(f"{a_name} shape {tuple(a_shape)} must be {b_name} {tuple(b_shape)}")


def pool_backward_shapes(grad_output_shape: tuple, input_shape: tuple) -> None:
    """A max pool's grad_output and input_shape: the same leading
    dimensions, and an output a pooling of that input can produce."""
    if input_shape[:-2] != grad_output_shape[:-2]:
        raise ValueError(f"input_shape {input_shape} and grad_output {grad_output_shape} "
                         "differ in their leading dimensions")
    (H, W), (OH, OW) = input_shape[-2:], grad_output_shape[-2:]
    if OH > H + 1 or OW > W + 1:
        raise ValueError(f"input_shape {input_shape} cannot have produced an output of {(OH, OW)}: "
                         "max pooling gives at most (H + 1, W + 1)")


def unpool_backward_shapes(grad_output_shape: tuple, indices_shape: tuple, x_shape: tuple) -> None:
    """max_unpool2d_backward's shapes: indices like x, grad_output with x's
    leading dimensions."""
    if indices_shape != x_shape:
        raise ValueError(f"indices shape {indices_shape} must be x_shape {x_shape}")
    if grad_output_shape[:-2] != x_shape[:-2]:
        raise ValueError(f"grad_output shape {grad_output_shape} does not match x_shape {x_shape}")


def unpool_indices_in_range(ix: np.ndarray, OH: int, OW: int) -> None:
    """Every unpooling index in [0, OH * OW), the positions of an (OH, OW)
    grad_output."""
    if ix.size and (ix.min() < 0 or ix.max() >= OH * OW):
        raise ValueError(f"indices must lie in [0, {OH * OW}) for a grad_output of {OH} x {OW}")


def conv_layer_args(in_channels, out_channels, kernel_size, dtype):
    """A convolution layer's sizes and dtype: (in, out, kh, kw, dtype)."""
    cin = as_int(in_channels, "in_channels")
    cout = as_int(out_channels, "out_channels")
    if cin < 1 or cout < 1:
        raise ValueError(f"in_channels and out_channels must be positive, got {cin}, {cout}")
    kh, kw = pair(kernel_size, "kernel_size")
    if kh < 1 or kw < 1:
        raise ValueError(f"kernel_size must be positive, got {(kh, kw)}")
    return cin, cout, kh, kw, float_dtype_arg(dtype)


def float_dtype_arg(dtype, name: str = "dtype") -> np.dtype:
    """A dtype argument that must be float32 or float64."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name} must be float32 or float64, got {dtype!r}") from None
    if dt not in FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got {dt}")
    return dt


def dense_input(x, weight: np.ndarray, name: str = "x") -> np.ndarray:
    """x of a dense layer: (D,) or (N, D), weight's dtype and D features."""
    x, _ = array(x, name, (1, 2), floating_only=True)
    if x.dtype != weight.dtype:
        raise TypeError(f"{name} dtype {x.dtype} must match the weight's dtype {weight.dtype}")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name} has {x.shape[-1]} features but the layer takes {weight.shape[1]} "
                         f"(x shape {x.shape})")
    return x


def same_shape_grad(grad_output, want: tuple, dtype, name: str = "grad_output") -> np.ndarray:
    """A layer's grad_output: an array of the forward output's shape (and
    of dtype, unless dtype is None)."""
    g, _ = array(grad_output, name, (len(want),), floating_only=dtype is not None)
    if dtype is not None and g.dtype != dtype:
        raise TypeError(f"{name} dtype {g.dtype} must match the forward's dtype {dtype}")
    if g.shape != want:
        raise ValueError(f"{name} must have shape {want}, got {g.shape}")
    return g


def no_overlap(out: np.ndarray, x: np.ndarray, name: str = "out", xname: str = "x") -> None:
    """An out= array must not share memory with the input it is computed
    from (or with another output)."""
    if np.may_share_memory(out, x):
        raise ValueError(f"{name} must not overlap {xname}")
