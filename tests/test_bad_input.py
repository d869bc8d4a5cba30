"""Bad input is refused with ValueError/TypeError naming the parameter."""
import os

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
    (dict(output_size=(4, 6)), ValueError, "output_size"),
    (dict(output_size=(6, 2**63)), ValueError, "output_size"),
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
    with pytest.raises(ValueError, match="padding must be between 0 and kernel_size // 2"):
        cypool.MaxPool2d(2, padding=2)
    with pytest.raises(ValueError, match="dilation must be positive"):
        cypool.MaxPool2d(2, dilation=0)


CX = np.zeros((1, 2, 6, 6), np.float32)
CW = np.zeros((3, 2, 3, 3), np.float32)


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(x=np.zeros((6, 6), np.float32)), ValueError, "x"),
    (dict(x=np.zeros((1, 1, 2, 6, 6), np.float32)), ValueError, "x"),
    (dict(x=np.zeros((1, 2, 0, 6), np.float32)), ValueError, "x"),
    (dict(x=np.zeros((1, 2, 6, 6), np.int32)), TypeError, "x"),
    (dict(x=np.zeros((1, 2, 6, 6), np.float16)), TypeError, "x"),
    (dict(x=np.zeros((1, 2, 6, 6), np.float64)), TypeError, "weight"),
    (dict(weight=np.zeros((3, 3, 3, 3), np.float32)), ValueError, "channels"),
    (dict(weight=np.zeros((3, 2, 3), np.float32)), ValueError, "weight"),
    (dict(weight=np.zeros((3, 2, 7, 3), np.float32)), ValueError, "weight"),
    (dict(weight=np.zeros((3, 2, 3, 3), np.float32), dilation=3), ValueError, "weight"),
    (dict(bias=np.zeros(2, np.float32)), ValueError, "bias"),
    (dict(bias=np.zeros((3, 1), np.float32)), ValueError, "bias"),
    (dict(bias=np.zeros(3, np.float64)), TypeError, "bias"),
    (dict(stride=0), ValueError, "stride"),
    (dict(stride=(1, -2)), ValueError, "stride"),
    (dict(stride=2**63), ValueError, "stride"),
    (dict(stride=1.0), TypeError, "stride"),
    (dict(dilation=0), ValueError, "dilation"),
    (dict(dilation=2**40), ValueError, "dilation"),
    (dict(padding=-1), ValueError, "padding"),
    (dict(padding=2**63), ValueError, "padding"),
    (dict(padding="full"), ValueError, "padding"),
    (dict(padding="same", stride=2), ValueError, "padding"),
    (dict(padding=(1, 1, 1)), ValueError, "padding"),
    (dict(stride=[[1], [1]]), TypeError, "stride"),    # unhashable: no cache key, checked
    (dict(padding={1: 2}), TypeError, "padding"),
    (dict(dilation=[1, [2]]), TypeError, "dilation"),
    (dict(num_threads=0), ValueError, "num_threads"),
    (dict(num_threads=-(2**64)), ValueError, "num_threads"),
])
def test_conv2d_rejects(kwargs, exc, name):
    cypool.conv2d(CX, CW, stride=1, padding=0, dilation=1)  # cached: must not let 1.0 through
    args = dict(x=CX, weight=CW)
    args.update(kwargs)
    with pytest.raises(exc, match=name):
        cypool.conv2d(args.pop("x"), args.pop("weight"), **args)


@pytest.mark.parametrize("g, exc, name", [
    (np.zeros((1, 3, 4, 3), np.float32), ValueError, "grad_output"),
    (np.zeros((1, 2, 4, 4), np.float32), ValueError, "grad_output"),
    (np.zeros((3, 4, 4), np.float32), ValueError, "grad_output"),
    (np.zeros((1, 3, 4, 4), np.float64), TypeError, "grad_output"),
])
def test_conv2d_backward_rejects(g, exc, name):
    with pytest.raises(exc, match=name):
        cypool.conv2d_backward(g, CX, CW)


@pytest.mark.parametrize("kwargs, exc, name", [
    (dict(in_channels=0), ValueError, "in_channels"),
    (dict(out_channels=2**70), None, None),
    (dict(kernel_size=0), ValueError, "kernel_size"),
    (dict(stride=0), ValueError, "stride"),
    (dict(padding=-1), ValueError, "padding"),
    (dict(padding="same", stride=2), ValueError, "padding"),
    (dict(dilation=(1, 0)), ValueError, "dilation"),
    (dict(dtype=np.int32), TypeError, "dtype"),
    (dict(num_threads=-1), ValueError, "num_threads"),
])
def test_conv2d_layer_checks_parameters_when_built(kwargs, exc, name):
    args = dict(in_channels=2, out_channels=3, kernel_size=3)
    args.update(kwargs)
    if exc is None:  # too large to allocate: numpy's own MemoryError/ValueError
        with pytest.raises((MemoryError, ValueError)):
            cypool.Conv2d(**args)
        return
    with pytest.raises(exc, match=name):
        cypool.Conv2d(**args)


def test_conv2d_layer_backward_before_forward():
    with pytest.raises(RuntimeError, match="forward"):
        cypool.Conv2d(2, 3, 3).backward(np.zeros((1, 3, 4, 4), np.float32))


def test_conv2d_huge_thread_count_is_a_correct_result():
    np.testing.assert_array_equal(cypool.conv2d(CX, CW, num_threads=2**64), cypool.conv2d(CX, CW))


@pytest.mark.parametrize("args, exc, name", [
    ((np.ones((1, 2, 6, 6), np.float32), I, (1, 2, 3)), ValueError, "x_shape"),
    ((np.ones((1, 2, 6, 6), np.float32), I, (1, 2, 4, 4)), ValueError, "indices"),
    ((np.ones((1, 3, 6, 6), np.float32), I, (1, 2, 3, 3)), ValueError, "grad_output"),
    ((np.ones((1, 2, 6, 6), np.float32), I + 36, (1, 2, 3, 3)), ValueError, "indices"),
    ((np.ones((1, 2, 6, 6), np.float32), I - 1, (1, 2, 3, 3)), ValueError, "indices"),
    ((np.ones((1, 2, 6, 6), np.float32), I.astype(np.float32), (1, 2, 3, 3)), TypeError, "indices"),
])
def test_unpool_backward_rejects(args, exc, name):
    with pytest.raises(exc, match=name):
        cypool.max_unpool2d_backward(*args)


@pytest.mark.parametrize("value", [2**31, 2**32 + 1, -2**31, -1])
@pytest.mark.parametrize("index_dtype", [np.int64, np.int32])
def test_indices_at_and_past_2_31_are_refused_by_backward_and_unpool(value, index_dtype):
    if index_dtype == np.int32 and not -2**31 <= value < 2**31:
        return  # not representable
    x = np.arange(16.0).reshape(1, 1, 4, 4)
    out, idx = cypool.max_pool2d(x, 2, return_indices=True, index_dtype=index_dtype)
    idx[0, 0, 1, 1] = value
    with pytest.raises(ValueError, match="indices"):
        cypool.max_pool2d_backward(np.ones_like(out), idx, x.shape)
    with pytest.raises(ValueError, match="indices"):
        cypool.max_unpool2d(out, idx, 2)


@pytest.mark.skipif(os.environ.get("CYPOOL_BIG_TESTS") != "1",
                    reason="needs 9 GB of memory: set CYPOOL_BIG_TESTS=1")
def test_a_plane_of_more_than_2_31_elements():
    # Real data this time (8.6 GB of float32): int64 indices and argmax
    # coordinates past 2**31, and int32 refused.
    H, W = 2**16, 2**15 + 3
    c = 2**15 - 1  # inside the last pooling window
    x = np.zeros((1, 1, H, W), np.float32)
    x[0, 0, H - 3, c] = 1.0
    assert (H - 3) * W + c > 2**31
    assert cypool.argmax2d(x).tolist() == [[[H - 3, c]]]
    out, idx = cypool.max_pool2d(x, (256, 2048), return_indices=True)
    assert out.max() == 1.0
    assert idx[0, 0, -1, -1] == (H - 3) * W + c
    assert idx[0, 0, -1, 0] == (H - 256) * W  # all zeros: the window's first element
    with pytest.raises(ValueError, match="index_dtype"):
        cypool.max_pool2d(x, 2, return_indices=True, index_dtype=np.int32)
