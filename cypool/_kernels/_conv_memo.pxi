# Uses: Arr, _as_arr, _direct_forward, _direct_backward from _conv_direct.pxi; Held, _hold,
# _release_all from _common.pxi.
# Repeats of checked convolution calls, recognised in C.
#
# A training loop makes the same small calls over and over: at batch size 1
# a (1, 28, 28) image takes a few microseconds of arithmetic, and checking
# the call again in Python costs as much. cypool/_conv_engine.py checks
# each kind of call once and keeps what the checks gave (the plan and the
# shapes); a call that takes the direct kernels (_conv_direct.pxi) is then
# also remembered here, with only that: the direct kernels' arguments and
# the shapes of the arrays it returns, keyed by what the checks depended on
# (x's and the weight's types, shapes and buffer formats, and the int
# parameters). A later call that matches one in every respect runs from
# here when its bias and grad_output are arrays that the Python checks
# take as they are: one predicate decides that for both paths (_plain,
# which cypool/_checks.py calls as plain_array), so that the paths cannot
# differ. Any other call is left to the Python path (these functions
# return None), which checks it, raises for bad input, or remembers it.
#
# Threads: the slots are shared by every thread of the process. One mutex
# (_memo_lock) guards them: a lookup finds a slot and copies it, with its
# numpy.empty arguments, under the lock; remembering writes a slot under
# it. The kernels then run on the copy, without the lock. With the GIL the
# lock is never contended; on a free-threaded Python it keeps a reader from
# seeing a slot half rewritten.
cimport cython
from cpython.long cimport PyLong_AsLongAndOverflow
from libc.string cimport strcmp
import numpy as _np

cdef object _ndarray = _np.ndarray
cdef object _empty = _np.empty
cdef object _float32 = _np.dtype(_np.float32)
cdef object _float64 = _np.dtype(_np.float64)

cdef enum:
    _MEMO_SLOTS = 32        # calls remembered per family
    # The families: each caller's calls, kept apart.
    _MEMO_CONV2D = 0
    _MEMO_VECTOR_CONV2D = 1
    _FAMILIES = 2

MEMO_CONV2D = _MEMO_CONV2D
MEMO_VECTOR_CONV2D = _MEMO_VECTOR_CONV2D


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


cdef bint _plain(const Py_buffer* v, int nd, const Py_ssize_t* shape, char fmt,
                 bint contiguous) noexcept:
    """Whether v is an array of nd axes of these lengths, of native float32
    ('f') or float64 ('d'), C-contiguous if asked (for one axis: unit
    stride, or a single element): the bias or grad_output that the checks
    pass on as it is."""
    cdef int k
    if v.ndim != nd or _format(v) != fmt or fmt == 0:
        return False
    for k in range(nd):
        if v.shape[k] != shape[k]:
            return False
    return not contiguous or nd != 1 or v.strides[0] == v.itemsize or shape[0] == 1


def plain_array(a, tuple shape, dtype, bint contiguous):
    """Whether a (an exact ndarray) has this shape and dtype (float32 or
    float64), and for one axis unit stride if contiguous: the bias or
    grad_output that the checks take as it is (cypool/_checks.py; the
    repeats recognised here use the same predicate)."""
    cdef Held held
    cdef Py_ssize_t dims[5]
    cdef int k, nd = len(shape)
    cdef char fmt
    if type(a) is not _ndarray or nd > 5:
        return False
    fmt = b'f' if dtype is _float32 else b'd' if dtype is _float64 else 0
    if fmt == 0:
        return False
    for k in range(nd):
        dims[k] = shape[k]
    held.n = 0
    try:
        return _plain(_hold(&held, a, False), nd, dims, fmt, contiguous)
    finally:
        _release_all(&held)


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


cdef object _lookup(int family, x, weight, stride, padding, dilation, num_threads, Held* held,
                    Memo* m):
    """The numpy.empty arguments of the remembered call that this call
    repeats, with the slot copied into m[0]; None if it repeats none. x's
    and the weight's buffers are held.views[0] and [1] when it does."""
    cdef long s, p, d, nt
    cdef int i
    cdef Py_buffer* vx
    cdef Py_buffer* vw
    if not 0 <= family < _FAMILIES:
        raise ValueError(f"no memo family {family}")
    if (type(x) is not _ndarray or type(weight) is not _ndarray
            or not _plain_int(stride, &s) or not _plain_int(padding, &p)
            or not _plain_int(dilation, &d)):
        return None
    # num_threads as _checks.num_threads_arg takes it without a look (the
    # direct kernels are serial); anything else goes the Python way
    if num_threads is not None and not (_plain_int(num_threads, &nt) and nt >= 1):
        return None
    vx = _hold(held, x, False)
    vw = _hold(held, weight, False)
    with _memo_lock:
        i = _find(family, vx, vw, s, p, d)
        if i < 0:
            return None
        m[0] = _memo[family][i]
        return _memo_objects[family][i]


def memo_remember(int family, x, weight, stride, padding, dilation, tuple out_shape, dtype,
                  tuple direct, bint batched):
    """Remember a call that passed the checks and takes the direct kernels
    with these arguments (direct: the plan's, 6 values). A call that this
    module could not recognise (not plain ndarrays and ints) is not
    remembered."""
    cdef Held held
    cdef int i, k
    cdef long s, p, d
    cdef Memo* m
    cdef Py_buffer* vx
    cdef Py_buffer* vw
    if not 0 <= family < _FAMILIES:
        raise ValueError(f"no memo family {family}")
    if (type(x) is not _ndarray or type(weight) is not _ndarray
            or not _plain_int(stride, &s) or not _plain_int(padding, &p)
            or not _plain_int(dilation, &d) or len(direct) != 6 or len(out_shape) > 5):
        return
    held.n = 0
    try:
        vx = _hold(&held, x, False)
        vw = _hold(&held, weight, False)
        if _format(vx) == 0 or _format(vw) != _format(vx) or vx.ndim > 5 or vw.ndim != 4:
            return
        shapes = (out_shape, tuple(x.shape), tuple(weight.shape), (weight.shape[0],), dtype)
        with _memo_lock:
            if _find(family, vx, vw, s, p, d) >= 0:
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
            m.fmt = _format(vx)
            m.stride, m.padding, m.dilation = s, p, d
            m.batched = batched
            _memo_objects[family][i] = shapes
            m.used = True
    finally:
        _release_all(&held)


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
    cdef Held held
    cdef Arr a[4]
    cdef int failed = 0
    cdef Memo m  # a copy: numpy.empty may run Python code that remembers other calls,
                 # and other threads may rewrite the slot
    held.n = 0
    a[2].shape[0] = 0  # no bias
    try:
        shapes = _lookup(family, x, weight, stride, padding, dilation, num_threads, &held, &m)
        if shapes is None:
            return None
        if bias is not None:
            if type(bias) is not _ndarray:
                return None
            if not _plain(_hold(&held, bias, False), 1, &m.wshape[0], m.fmt, True):
                return None
            _as_arr(&held.views[2], &a[2], True)
        out = _empty(shapes[0], shapes[4])
        _as_arr(_hold(&held, out, True), &a[3], m.batched)
        _as_arr(&held.views[0], &a[0], m.batched)
        _as_arr(&held.views[1], &a[1], True)
        with nogil:
            if m.fmt == b'f':
                failed = _direct_forward(&a[0], &a[1], &a[2], &a[3], m.args[0], m.args[1],
                                         m.args[4], m.args[5], False, <float*>NULL)
            else:
                failed = _direct_forward(&a[0], &a[1], &a[2], &a[3], m.args[0], m.args[1],
                                         m.args[4], m.args[5], False, <double*>NULL)
    finally:
        _release_all(&held)
    if failed:
        raise MemoryError("cypool: out of memory")
    return out


def memo_backward(int family, grad_output, x, weight, stride, padding, dilation,
                  bint needs_input_grad, bint needs_weight_grad, num_threads):
    """(grad_x, grad_weight, grad_bias) of a repeat of a remembered call
    (new arrays; None for a gradient not needed), or None."""
    cdef Held held
    cdef Arr a[6]
    cdef int failed = 0
    cdef Memo m  # a copy, as in memo_forward
    held.n = 0
    try:
        shapes = _lookup(family, x, weight, stride, padding, dilation, num_threads, &held, &m)
        if shapes is None:
            return None
        if type(grad_output) is not _ndarray:
            return None
        if not _plain(_hold(&held, grad_output, False), m.ond, &m.oshape[0], m.fmt, False):
            return None
        _as_arr(&held.views[2], &a[2], m.batched)
        gx = _empty(shapes[1], shapes[4]) if needs_input_grad else None
        gw = _empty(shapes[2], shapes[4]) if needs_weight_grad else None
        gb = _empty(shapes[3], shapes[4])
        if needs_input_grad:
            _as_arr(_hold(&held, gx, True), &a[3], m.batched)
        if needs_weight_grad:
            _as_arr(_hold(&held, gw, True), &a[4], True)
        _as_arr(_hold(&held, gb, True), &a[5], True)
        _as_arr(&held.views[0], &a[0], m.batched)
        _as_arr(&held.views[1], &a[1], True)
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
        _release_all(&held)
    if failed:
        raise MemoryError("cypool: out of memory")
    return gx, gw, gb
