"""Bad input is refused with ValueError/TypeError naming the parameter."""
import numpy as np
import pytest

import cypool

X = np.zeros((1, 2, 6, 6), dtype=np.float32)


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(x=np.zeros((6, 6), np.float32)), ValueError, "x"),
    (dict(x=np.zeros((1, 1, 1, 6, 6), np.float32)), ValueError, "x"),
    (dict(x=np.zeros((1, 0, 6, 6), np.float32)), ValueError, "x"),
    (dict(x=np.zeros((1, 2, 6, 6), bool)), TypeError, "x"),
    (dict(x=np.zeros((1, 2, 6, 6), complex)), TypeError, "x"),
    (dict(x=np.zeros((1, 2, 6, 6), object)), TypeError, "x"),
    (dict(x=np.zeros((1, 2, 6, 6), np.uint64)), TypeError, "x"),
    (dict(x="not an array"), TypeError, "x"),
    (dict(kernel_size=0), ValueError, "kernel_size"),
    (dict(kernel_size=-2), ValueError, "kernel_size"),
    (dict(kernel_size=2.5), TypeError, "kernel_size"),
    (dict(kernel_size=True), TypeError, "kernel_size"),
    (dict(kernel_size=(2, 2, 2)), ValueError, "kernel_size"),
    (dict(kernel_size=7), ValueError, "kernel_size"),
    (dict(kernel_size=4, dilation=2), ValueError, "kernel_size"),
    (dict(stride=0), ValueError, "stride"),
    (dict(stride=(1, -1)), ValueError, "stride"),
    (dict(dilation=0), ValueError, "dilation"),
    (dict(padding=-1), ValueError, "padding"),
    (dict(padding=2), ValueError, "padding"),
    (dict(kernel_size=(1, 2), padding=(0, 1), dilation=(1, 2), x=np.zeros((1, 1, 3, 1), np.float32)),
     ValueError, "padding"),
    (dict(index_dtype=np.int16, return_indices=True), TypeError, "index_dtype"),
    (dict(index_dtype="nonsense", return_indices=True), TypeError, "index_dtype"),
    (dict(num_threads=0), ValueError, "num_threads"),
    (dict(num_threads=1.5), TypeError, "num_threads"),
])
def test_max_pool2d_rejects(kwargs, exc, name):
    args = dict(x=X, kernel_size=2)
    args.update(kwargs)
    with pytest.raises(exc, match=name):
        cypool.max_pool2d(args.pop("x"), **args)


def test_int32_indices_refused_for_huge_planes():
    # A broadcast view: 2**31 elements per plane without the memory.
    big = np.broadcast_to(np.zeros(1, np.int8), (1, 1, 2**16, 2**15))
    with pytest.raises(ValueError, match="index_dtype"):
        cypool.max_pool2d(big, 2, return_indices=True, index_dtype=np.int32)


G = np.ones((1, 2, 3, 3), np.float32)
I = np.zeros((1, 2, 3, 3), np.int64)


@pytest.mark.parametrize("args, exc, name", [
    ((G, I[..., :2], (1, 2, 6, 6)), ValueError, "indices"),
    ((G, I.astype(np.float32), (1, 2, 6, 6)), TypeError, "indices"),
    ((G, I, (1, 2, 6)), ValueError, "input_shape"),
    ((G, I, (1, 3, 6, 6)), ValueError, "input_shape"),
    ((G, I, (1, 2, 1, 1)), ValueError, "input_shape"),
    ((G, I, (1, 2, 0, 6)), ValueError, "input_shape"),
    ((G, I, "1,2,6,6"), TypeError, "input_shape"),
    ((G.astype(bool), I, (1, 2, 6, 6)), TypeError, "grad_output"),
    ((G[0, 0], I[0, 0], (6, 6)), ValueError, "grad_output"),
])
def test_backward_rejects(args, exc, name):
    with pytest.raises(exc, match=name):
        cypool.max_pool2d_backward(*args)


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(indices=I[..., :2]), ValueError, "indices"),
    (dict(kernel_size=0), ValueError, "kernel_size"),
    (dict(stride=0), ValueError, "stride"),
    (dict(padding=-1), ValueError, "padding"),
    (dict(output_size=(9, 9)), ValueError, "output_size"),
    (dict(output_size=5), TypeError, "output_size"),
    (dict(kernel_size=1, padding=3), ValueError, "padding"),
])
def test_unpool_rejects(kwargs, exc, name):
    args = dict(x=G, indices=I, kernel_size=2)
    args.update(kwargs)
    with pytest.raises(exc, match=name):
        cypool.max_unpool2d(args.pop("x"), args.pop("indices"), **args)


def test_layer_backward_before_forward():
    with pytest.raises(RuntimeError, match="forward"):
        cypool.MaxPool2d(2).backward(G)
    layer = cypool.MaxPool2d(2).eval()
    layer(X)
    with pytest.raises(RuntimeError, match="training"):
        layer.backward(G)


def test_layer_rejects_bad_parameters_at_construction():
    with pytest.raises(TypeError, match="kernel_size"):
        cypool.MaxPool2d("2")
    with pytest.raises(ValueError, match="num_threads"):
        cypool.MaxPool2d(2, num_threads=-1)
