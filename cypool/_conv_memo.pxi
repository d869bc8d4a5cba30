# Repeats of checked convolution calls, recognised in C.
#
# A training loop makes the same small calls over and over: at batch size 1
# a (1, 28, 28) image takes a few microseconds of arithmetic, and checking
# the call again in Python (its shapes, dtypes, parameters, bias, thread
# count; the output's shape) costs as much. cypool/conv.py and
# cypool/vector_conv.py check a call once, the Python way; a call that
# takes the direct kernels (_conv_direct.pxi) is then remembered here, by
# what its checks depended on: x's and the weight's types, shapes and
# buffer formats, and the int parameters. A later call that matches one in
# every respect, with a bias and grad_output that match the remembered
# shapes and format, runs from here; any other call is left to the Python
# path (these functions return None), which checks it, raises for bad
# input, or remembers it. Nothing is decided here that the Python checks
# did not decide for the same arguments.
#
# Threads: the slots are shared by every thread of the process. One mutex
# (_memo_lock) guards them: a lookup finds a slot and copies it, with its
# numpy.empty arguments, under the lock; remembering writes a slot under
# it. The kernels then run on the copy, without the lock. With the GIL the
# lock is never contended; on a free-threaded Python it keeps a reader from
# seeing a slot half rewritten.
cimport cython
from cpython.buffer cimport PyBUF_FORMAT
from cpython.long cimport PyLong_AsLongAndOverflow
from libc.string cimport strcmp
import numpy as _np

cdef object _ndarray = _np.ndarray
cdef object _empty = _np.empty

cdef enum:
    _MEMO_SLOTS = 32        # calls remembered per family (conv2d, vector_conv2d)
    _FAMILIES = 2


cdef struct Memo:
    bint used
    int xnd, ond                  # ranks of x and of the output
    Py_ssize_t xshape[5]
    Py_ssize_t wshape[4]
    Py_ssize_t oshape[5]
    char fmt                      # numpy's buffer format: 'f' or 'd'
    long stride, padding, dilation
    Py_ssize_t args[6]            # the direct kernels' (top, left, itop, ileft, dh, dw)
    bint batched


cdef Memo _memo[_FAMILIES][_MEMO_SLOTS]
cdef int _memo_next[_FAMILIES]
# Per slot: (output shape, x's shape, weight's shape, (O,), dtype), the
# arguments of numpy.empty for the arrays a call returns.
_memo_objects = [[None] * _MEMO_SLOTS for _ in range(_FAMILIES)]
cdef cython.pymutex _memo_lock


cdef bint _plain_int(object v, long* out):
    """v is an int (not bool, not a subclass) that fits a C long."""
    cdef int overflow = 0
    if type(v) is not int:
        return False
    out[0] = PyLong_AsLongAndOverflow(v, &overflow)
    return overflow == 0


cdef char _format(const Py_buffer* v):
    """'f' or 'd' for a buffer of native float32 or float64, else 0."""
    if v.format != NULL and (strcmp(v.format, "f") == 0 or strcmp(v.format, "d") == 0):
        return v.format[0]
    return 0


cdef int _find(int family, const Py_buffer* x, const Py_buffer* w, long s, long p,
               long d) noexcept:
    """The slot of the remembered call that x, w and the parameters repeat,
    or -1."""
    cdef int i, k
    cdef const Memo* m
    cdef char fmt = _format(x)
    if fmt == 0 or _format(w) != fmt or w.ndim != 4:
        return -1
    for i in range(_MEMO_SLOTS):
        m = &_memo[family][i]
        if (not m.used or m.xnd != x.ndim or m.fmt != fmt or m.stride != s or m.padding != p
                or m.dilation != d):
            continue
        for k in range(x.ndim):
            if m.xshape[k] != x.shape[k]:
                break
        else:
            for k in range(4):
                if m.wshape[k] != w.shape[k]:
                    break
            else:
                return i
    return -1


cdef bint _is_shape(const Py_buffer* v, int nd, const Py_ssize_t* shape, char fmt):
    cdef int k
    if v.ndim != nd or _format(v) != fmt:
        return False
    for k in range(nd):
        if v.shape[k] != shape[k]:
            return False
    return True


cdef object _lookup(int family, x, weight, stride, padding, dilation, num_threads,
                    Py_buffer* v, bint* held, Memo* m):
    """The numpy.empty arguments of the remembered call that this call
    repeats, with the slot copied into m[0]; None if it repeats none. v[0]
    and v[1] hold x's and the weight's buffers where held says so."""
    cdef long s, p, d, nt
    cdef int i
    if not 0 <= family < _FAMILIES:
        raise ValueError(f"no memo family {family}")
    if (type(x) is not _ndarray or type(weight) is not _ndarray
            or not _plain_int(stride, &s) or not _plain_int(padding, &p)
            or not _plain_int(dilation, &d)):
        return None
    if num_threads is not None and not (_plain_int(num_threads, &nt) and nt >= 1):
        return None
    PyObject_GetBuffer(x, &v[0], PyBUF_STRIDES | PyBUF_FORMAT)
    held[0] = True
    PyObject_GetBuffer(weight, &v[1], PyBUF_STRIDES | PyBUF_FORMAT)
    held[1] = True
    with _memo_lock:
        i = _find(family, &v[0], &v[1], s, p, d)
        if i < 0:
            return None
        m[0] = _memo[family][i]
        return _memo_objects[family][i]


cdef void _release(Py_buffer* v, bint* held, int n) noexcept:
    cdef int k
    for k in range(n):
        if held[k]:
            PyBuffer_Release(&v[k])
            held[k] = False


cdef int _take(object a, Py_buffer* v, bint* held, bint writable) except -1:
    PyObject_GetBuffer(a, v, PyBUF_STRIDES | PyBUF_FORMAT
                       | (PyBUF_WRITABLE if writable else 0))
    held[0] = True
    return 0


def memo_remember(int family, x, weight, stride, padding, dilation, tuple out_shape, dtype,
                  tuple direct, bint batched):
    """Remember a call that passed the checks and takes the direct kernels
    with these arguments (direct: conv.plan's). A call that this module
    could not recognise (not plain ndarrays and ints) is not remembered."""
    cdef Py_buffer vx, vw
    cdef int got = 0, i, k
    cdef long s, p, d
    cdef Memo* m
    if not 0 <= family < _FAMILIES:
        raise ValueError(f"no memo family {family}")
    if (type(x) is not _ndarray or type(weight) is not _ndarray
            or not _plain_int(stride, &s) or not _plain_int(padding, &p)
            or not _plain_int(dilation, &d) or len(direct) != 6 or len(out_shape) > 5):
        return
    try:
        PyObject_GetBuffer(x, &vx, PyBUF_STRIDES | PyBUF_FORMAT)
        got += 1
        PyObject_GetBuffer(weight, &vw, PyBUF_STRIDES | PyBUF_FORMAT)
        got += 1
        if _format(&vx) == 0 or _format(&vw) != _format(&vx) or vx.ndim > 5 or vw.ndim != 4:
            return
        shapes = (out_shape, tuple(x.shape), tuple(weight.shape), (weight.shape[0],), dtype)
        with _memo_lock:
            if _find(family, &vx, &vw, s, p, d) >= 0:
                return
            i = _memo_next[family]
            _memo_next[family] = (i + 1) % _MEMO_SLOTS
            m = &_memo[family][i]
            m.used = False  # until it is whole
            m.xnd = vx.ndim
            m.ond = len(out_shape)
            for k in range(vx.ndim):
                m.xshape[k] = vx.shape[k]
            for k in range(4):
                m.wshape[k] = vw.shape[k]
            for k in range(m.ond):
                m.oshape[k] = out_shape[k]
            for k in range(6):
                m.args[k] = direct[k]
            m.fmt = _format(&vx)
            m.stride, m.padding, m.dilation = s, p, d
            m.batched = batched
            _memo_objects[family][i] = shapes
            m.used = True
    finally:
        if got > 1:
            PyBuffer_Release(&vw)
        if got > 0:
            PyBuffer_Release(&vx)


def memo_forget():
    """Forget every remembered call (for tests that change the rules)."""
    cdef int f, i
    with _memo_lock:
        for f in range(_FAMILIES):
            for i in range(_MEMO_SLOTS):
                _memo[f][i].used = False
                _memo_objects[f][i] = None
            _memo_next[f] = 0


def memo_forward(int family, x, weight, bias, stride, padding, dilation, num_threads):
    """The output of a repeat of a remembered call (a new array), or None."""
    cdef Py_buffer v[4]
    cdef bint held[4]
    cdef Arr a[4]
    cdef int failed = 0
    cdef bint has_bias = bias is not None
    cdef Memo m  # a copy: numpy.empty may run Python code that remembers other calls,
                 # and other threads may rewrite the slot
    held[:] = [False, False, False, False]
    a[2].shape[0] = 0  # no bias
    try:
        shapes = _lookup(family, x, weight, stride, padding, dilation, num_threads, v, held, &m)
        if shapes is None:
            return None
        if has_bias:
            if type(bias) is not _ndarray:
                return None
            _take(bias, &v[2], &held[2], False)
            if (not _is_shape(&v[2], 1, &m.wshape[0], m.fmt)
                    or (v[2].strides[0] != v[2].itemsize and m.wshape[0] > 1)):
                return None
            _as_arr(&v[2], &a[2], True)
        out = _empty(shapes[0], shapes[4])
        _take(out, &v[3], &held[3], True)
        _as_arr(&v[0], &a[0], m.batched)
        _as_arr(&v[1], &a[1], True)
        _as_arr(&v[3], &a[3], m.batched)
        with nogil:
            if m.fmt == b'f':
                failed = _direct_forward(&a[0], &a[1], &a[2], &a[3], m.args[0], m.args[1],
                                         m.args[4], m.args[5], False, <float*>NULL)
            else:
                failed = _direct_forward(&a[0], &a[1], &a[2], &a[3], m.args[0], m.args[1],
                                         m.args[4], m.args[5], False, <double*>NULL)
    finally:
        _release(v, held, 4)
    if failed:
        raise MemoryError("cypool: out of memory")
    return out


def memo_backward(int family, grad_output, x, weight, stride, padding, dilation,
                  bint needs_input_grad, bint needs_weight_grad, num_threads):
    """(grad_x, grad_weight, grad_bias) of a repeat of a remembered call
    (new arrays; None for a gradient not needed), or None."""
    cdef Py_buffer v[6]
    cdef bint held[6]
    cdef Arr a[6]
    cdef int failed = 0
    cdef Memo m  # a copy, as in memo_forward
    held[:] = [False, False, False, False, False, False]
    try:
        shapes = _lookup(family, x, weight, stride, padding, dilation, num_threads, v, held, &m)
        if shapes is None or type(grad_output) is not _ndarray:
            return None
        _take(grad_output, &v[2], &held[2], False)
        if not _is_shape(&v[2], m.ond, &m.oshape[0], m.fmt):
            return None
        gx = _empty(shapes[1], shapes[4]) if needs_input_grad else None
        gw = _empty(shapes[2], shapes[4]) if needs_weight_grad else None
        gb = _empty(shapes[3], shapes[4])
        if needs_input_grad:
            _take(gx, &v[3], &held[3], True)
            _as_arr(&v[3], &a[3], m.batched)
        if needs_weight_grad:
            _take(gw, &v[4], &held[4], True)
            _as_arr(&v[4], &a[4], True)
        _take(gb, &v[5], &held[5], True)
        _as_arr(&v[5], &a[5], True)
        _as_arr(&v[0], &a[0], m.batched)
        _as_arr(&v[1], &a[1], True)
        _as_arr(&v[2], &a[2], m.batched)
        with nogil:
            if m.fmt == b'f':
                failed = _direct_backward(&a[2], &a[0], &a[1],
                                          &a[3] if needs_input_grad else NULL,
                                          &a[4] if needs_weight_grad else NULL, &a[5],
                                          m.args[0], m.args[1], m.args[2], m.args[3],
                                          m.args[4], m.args[5], <float*>NULL)
            else:
                failed = _direct_backward(&a[2], &a[0], &a[1],
                                          &a[3] if needs_input_grad else NULL,
                                          &a[4] if needs_weight_grad else NULL, &a[5],
                                          m.args[0], m.args[1], m.args[2], m.args[3],
                                          m.args[4], m.args[5], <double*>NULL)
    finally:
        _release(v, held, 6)
    if failed:
        raise MemoryError("cypool: out of memory")
    return gx, gw, gb
