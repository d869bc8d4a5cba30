"""The convolution engine behind conv2d, vector_conv2d and cypool.dask.

* **Checked calls**: a call's checks run once for each kind of call (its
  arrays' shapes and dtype, its parameters); what they give, the geometry
  and the plan of kernel passes, is kept in one cache (``checked``). A
  repeated small call that takes the direct kernels is recognised before
  that, in C (the kernels' memo, _kernels/_conv_memo.pxi), which holds the
  same plan and shapes; ``forget`` clears both. Whether a bias or
  grad_output is taken as it is, one predicate decides for both paths
  (the kernels' ``plain_array``).
* **The plan** of a standard convolution: its kernel passes (forward, input
  gradient, weight gradient), how each is cut into chunks and threads, and
  whether a call takes the direct kernels.
* **The passes**, for arrays already checked against their plan, and the
  two direct kernels' wrappers.
* **The vector convolution's passes**: by the E-vectorised tiles, or at
  small E by the standard convolution's kernels on flattened rows or
  component images.

A training loop at batch size 1 makes the same calls 60,000 times an epoch
on tiny images, so a call does little more than look its kind up and run
the kernel.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from . import _backend
from . import _checks as chk
from . import _geometry as geo
from ._select import (ConvAlgo, VectorAlgo, WeightGradAlgo, forced, forcing, select_conv,
                      select_vector_backward, select_vector_forward, select_weight_grad)
from ._backend import (SERIAL_BELOW, kernel, padded_columns, parts_for, team_for, threads_for,
                       work)

# Longest chunk of an image's output positions one work item computes: its
# slice of the padded image (C rows of about this length) stays in L2.
_CHUNK_MAX = 768
# Chunks are whole multiples of every build's E block (3 vectors of 2 to 16
# values), so that only an image's last chunk has a partial block.
_CHUNK_STEP = 48
# Bytes of padded rows ConvAlgo.LANES fills a band at a time: with the
# weights they stay in L2 while the band's rows of outputs run.
_OV_BAND = 128 * 1024


# -- checked calls ------------------------------------------------------------

# The families of calls the C memo keeps apart (constants of the kernels).
CONV2D = _backend.kernels.MEMO_CONV2D
VECTOR_CONV2D = _backend.kernels.MEMO_VECTOR_CONV2D

# (family, call_key) -> (dtype, batched?, what the family's checks gave)
_calls: dict = {}
_CALLS_MAX = 512


def checked(family: int, check, x, weight, stride, padding, dilation):
    """check(x, weight, stride, padding, dilation), which returns (x with its
    batch axis, weight, batched?, what the checks gave), run once for each
    kind of call (chk.call_key): a training loop repeats its calls. Returns
    (x checked, without a batch axis it lacked, weight, batched?, what the
    checks gave). A thread that forces a choice (cypool._testing) neither
    reads nor fills the cache."""
    key = None if forcing() else chk.call_key(x, weight, stride, padding, dilation)
    if key is not None:
        hit = _calls.get((family, key))
        dt = x.dtype
        if hit is not None and hit[0] is dt and weight.dtype is dt:
            return x, weight, hit[1], hit[2]
    xb, weight, batched, result = check(x, weight, stride, padding, dilation)
    if key is not None and len(_calls) < _CALLS_MAX and weight.dtype is x.dtype:
        _calls[family, key] = (x.dtype, batched, result)
    return (xb if batched else xb[0]), weight, batched, result


def remember(family: int, x, weight, stride, padding, dilation, out_shape: tuple, dtype,
             direct: tuple, batched: bool) -> None:
    """Let the C memo run repeats of this checked call (direct kernels only)."""
    if forcing():
        return
    kernel("memo_remember")(family, x, weight, stride, padding, dilation, out_shape, dtype,
                            tuple(direct), batched)


def forget() -> None:
    """Forget every checked call, in Python and in the memo of every variant
    this CPU runs (for tests that change a rule)."""
    _calls.clear()
    for isa in _backend.RUNNABLE_ISAS:
        _backend.load_variant(isa).memo_forget()


# -- the plan of a standard convolution ---------------------------------------

class Pass(NamedTuple):
    """One kernel pass: its geometry arguments, the length L of an image's
    virtual output, its size for the thread policy, (for a call too small
    for a thread team) its chunk length on one thread, else 0, and the
    algorithm's arguments: for conv2d_forward (algo, LANES' band bytes),
    for the weight gradient (dots,)."""
    args: tuple
    L: int
    macs: int
    touched: int
    serial_chunk: int
    algo: tuple = ()


class Direct(NamedTuple):
    """The direct kernels' arguments (_kernels/_conv_direct.pxi): the
    forward's and the input gradient's padding on top and left, and the
    dilation."""
    top: int
    left: int
    itop: int
    ileft: int
    dh: int
    dw: int


class Plan(NamedTuple):
    out_shape: tuple   # (N, O, OH, OW)
    forward: Pass      # conv2d_forward(x, w, False, ...)
    input_grad: Pass   # conv2d_forward(grad_out, w, True, ...)
    weight_grad: Pass  # conv2d_weight_grad(grad_out, x, ...)
    col2im: tuple      # for a strided convolution: conv2d_input_grad_col2im's geometry
    direct: tuple      # a Direct for a small stride-1 convolution, else ()


def plan(xshape: tuple, wshape: tuple, stride, padding, dilation, dtype, xname: str = "x",
         winograd: bool = True) -> Plan:
    """Checked geometry of a convolution of x (N, C, H, W) by weight
    (O, C, kh, kw) of dtype, the arguments of its kernel passes and their
    algorithms (cypool._select); ValueError for bad parameters, as conv2d
    raises. winograd=False: LANES where the choice is WINOGRAD, so that
    every output is a direct sum (cypool.verify's rounding charge bounds
    a direct sum's error only)."""
    N, C, H, W = xshape
    O, _, kh, kw = wshape
    chk.conv_channels(C, wshape, xname)
    g = geo.conv_geometry(H, W, kh, kw, stride, padding, dilation)
    sh, sw, dh, dw = g.sh, g.sw, g.dh, g.dw
    Hp, Wp = H + g.ph0 + g.ph1, W + g.pw0 + g.pw1
    macs = N * O * g.OH * g.OW * C * kh * kw
    touched = N * C * H * W + N * O * g.OH * g.OW
    L = (g.OH - 1) * (-(-Wp // sw)) + g.OW
    forward = _pass((1, 1, g.ph0, g.pw0, Hp, Wp, sh, sw, dh, dw), L, macs, touched, N)
    # The input gradient: the forward kernel on grad_output upsampled by the
    # stride and padded by the kernel's reach, the kernel flipped.
    rh, rw = dh * (kh - 1), dw * (kw - 1)
    input_grad = _pass((sh, sw, rh - g.ph0, rw - g.pw0, H + rh, W + rw, 1, 1, dh, dw),
                       (H - 1) * (W + rw) + W, macs, touched, N)
    weight_grad = _pass((g.ph0, g.pw0, Hp, Wp, kh, kw, sh, sw, dh, dw), L, macs, touched, N)
    col2im = (g.ph0, g.pw0, sh, sw, dh, dw) if sh * sw > 1 else ()
    small = bool(forward.serial_chunk and input_grad.serial_chunk and weight_grad.serial_chunk)
    itemsize = np.dtype(dtype).itemsize
    stride1 = sh == sw == 1
    band = forced("ov_band") or _OV_BAND

    def direct_sums(algo):
        return ConvAlgo.LANES if algo == ConvAlgo.WINOGRAD and not winograd else algo

    algo = direct_sums(select_conv(C, O, kh, kw, g.OW, Wp, sw, dw, itemsize, stride1=stride1,
                                   small=small))
    forward = forward._replace(algo=(int(algo), band))
    if algo == ConvAlgo.DIRECT:
        direct = Direct(g.ph0, g.pw0, rh - g.ph0, rw - g.pw0, dh, dw)
    else:
        direct = ()
        ialgo = direct_sums(select_conv(O, C, kh, kw, W, W + rw, 1, dw, itemsize,
                                        stride1=stride1, small=False))
        input_grad = input_grad._replace(algo=(int(ialgo), band))
    weight_grad = weight_grad._replace(algo=(select_weight_grad(O) == WeightGradAlgo.DOTS,))
    return Plan((N, O, g.OH, g.OW), forward, input_grad, weight_grad, col2im, direct)


def _chunk(L: int, N: int, threads: int) -> int:
    """Chunk length of an image's L virtual outputs: at most _CHUNK_MAX, and
    enough chunks that every thread gets work."""
    G = max(-(-L // _CHUNK_MAX), -(-threads // N))
    ce = -(-L // G)
    return -(-ce // _CHUNK_STEP) * _CHUNK_STEP


def _pass(args: tuple, L: int, macs: int, touched: int, N: int) -> Pass:
    serial = work(macs, touched) < SERIAL_BELOW  # threads_for gives such a call one thread
    return Pass(args, L, macs, touched, _chunk(L, N, 1) if serial else 0)


def _threads_and_chunk(p: Pass, nt: int, N: int, count=threads_for) -> tuple[int, int]:
    """Threads for a pass (count's answer: threads_for, or parts_for), and
    its chunk length."""
    if p.serial_chunk:
        return 1, p.serial_chunk
    threads = count(nt, work(p.macs, p.touched), N * (p.L // _CHUNK_STEP + 1))
    return threads, _chunk(p.L, N, threads)


# -- the passes ---------------------------------------------------------------
# For arrays already checked against their plan. The direct kernels take
# arrays with any strides, as they are: batched (N, C, H, W) or one image
# (C, H, W), and vector images with E = 1 too, (N, C, H, W, 1) or
# (C, H, W, 1).

def direct_forward(res, x, weight, bias, d: Direct, batched: bool = True) -> None:
    """res = the convolution of x plus bias (an empty array for none)."""
    kernel("conv2d_direct")(x, weight, bias, res, d.top, d.left, d.dh, d.dw, False, batched)


def grads_like(x, weight, needs_input_grad: bool, needs_weight_grad: bool):
    """New (grad_x, grad_weight, grad_bias) arrays for a backward pass to
    fill; None for a gradient not needed."""
    dt = x.dtype
    return (np.empty(x.shape, dt) if needs_input_grad else None,
            np.empty(weight.shape, dt) if needs_weight_grad else None,
            np.empty(weight.shape[0], dt))


def checked_grad_x_out(grad_x_out, g, xc, weight, needs_input_grad: bool,
                       needs_weight_grad: bool) -> np.ndarray:
    """A backward call's grad_x_out, checked against its other arrays."""
    if not needs_input_grad:
        raise ValueError("grad_x_out needs needs_input_grad=True")
    gx = chk.out_arg(grad_x_out, xc.shape, xc.dtype, "grad_x_out")
    chk.no_overlap(gx, g, "grad_x_out", "grad_output")
    chk.no_overlap(gx, weight, "grad_x_out", "weight")
    if needs_weight_grad:  # x is read for the weight gradient
        chk.no_overlap(gx, xc, "grad_x_out", "x")
    return gx


def direct_backward(g, x, weight, gx, gw, gb, d: Direct, batched: bool = True) -> None:
    """gx like x, gw (O, C, kh, kw) or (O, C*kh*kw) and gb (O,), C-contiguous,
    = the gradients; None for one not wanted (x too, without gw)."""
    kernel("conv2d_direct_backward")(g, x, weight, gx, gw, gb, *d, batched)


def forward_into(res, x4, weight, bias, p: Plan, nt: int) -> None:
    """res (N, O, OH, OW), any strides = the convolution of x4 (N, C, H, W),
    any strides, plus bias (an empty array for none)."""
    if p.direct:
        direct_forward(res, x4, weight, bias, p.direct)
        return
    threads, ce = _threads_and_chunk(p.forward, nt, x4.shape[0])
    kernel("conv2d_forward", x4.dtype)(x4, weight, False, bias, res, *p.forward.args, ce,
                                       *p.forward.algo, threads)


def input_grad_into(gx, g4, weight, p: Plan, nt: int) -> None:
    """gx (N, C, H, W), any strides = the input gradient for grad_output g4
    (N, O, OH, OW), any strides."""
    dt, N = g4.dtype, g4.shape[0]
    if p.direct:
        direct_backward(g4, None, weight, gx, None, None, p.direct)
    elif p.col2im:
        # Strided: columns added into place, rather than a transposed
        # convolution over an output gradient with zeros between its
        # elements (3 of every 4 multiply-adds wasted at stride 2).
        threads = threads_for(nt, work(p.input_grad.macs, p.input_grad.touched), N)
        res = gx if gx.flags.c_contiguous else np.empty(gx.shape, dt)
        kernel("conv2d_input_grad_col2im", dt)(chk.contiguous(g4, dt), weight, res, *p.col2im,
                                                _CHUNK_MAX, threads)
        if res is not gx:
            gx[...] = res
    else:
        threads, ce = _threads_and_chunk(p.input_grad, nt, N)
        kernel("conv2d_forward", dt)(g4, weight, True, chk.no_bias(dt), gx, *p.input_grad.args,
                                     ce, *p.input_grad.algo, threads)


def weight_grad_into(gw, gb, gc, x4, weight, p: Plan, nt: int) -> None:
    """gw (O, C*kh*kw) and gb (O,), C-contiguous = the weight and bias
    gradients for the C-contiguous grad_output gc and x4 (any strides)."""
    if p.direct:
        direct_backward(gc, x4, weight, None, gw, gb, p.direct)
        return
    # Summed in parts, one a thread outside a crowded spell; the parts and
    # the chunks, not the team, fix the result (_backend.parts_for).
    parts, ce = _threads_and_chunk(p.weight_grad, nt, x4.shape[0], parts_for)
    # The chunk's im2col rows (ce x K values) stay in L2.
    ce = min(ce, max(_CHUNK_STEP, (1 << 17) // gw.shape[1] // _CHUNK_STEP * _CHUNK_STEP))
    kernel("conv2d_weight_grad", x4.dtype)(gc, x4, gw, gb, *p.weight_grad.args, ce,
                                           *p.weight_grad.algo, parts, team_for(parts))


# -- the vector convolution ---------------------------------------------------

# Bytes of tap vectors to keep in L2 while neighbouring pixels reuse them.
_L2_BUDGET = 512 * 1024


class VectorCall(NamedTuple):
    """What the checks of a vector convolution call give."""
    geom: geo.WindowGeometry
    out_shape: tuple   # the output's shape, as x is batched or not
    forward: VectorAlgo
    backward: VectorAlgo
    plan: object       # at small E, the Plan of the component images; else None
    flat: object       # where the forward or backward runs on flattened rows, their Plan; else None
    direct: tuple      # at E = 1, a call small enough for the direct kernels
                       # (which take (N, C, H, W, 1) arrays as they are): its
                       # Direct; else ()


def vector_checks(x, weight, stride, padding, dilation):
    """geo.vector_conv_args, the forward's and backward's algorithms, and
    the plans of conv2d's kernels they run on, for checked()."""
    x5, weight, batched, geom = geo.vector_conv_args(x, weight, stride, padding, dilation)
    N, E = x5.shape[0], x5.shape[4]
    fwd = select_vector_forward(E, geom.sh, geom.sw, weight.shape[0])
    bwd = select_vector_backward(E, geom.sh, geom.sw)
    # Each plan only where a pass runs on it.
    p = small_e_plan(x5, weight, geom) if VectorAlgo.IMAGES in (fwd, bwd) else None
    flat = flat_plan(x5, weight, geom) if VectorAlgo.ROWS in (fwd, bwd) else None
    direct = p.direct if p is not None and E == 1 else ()
    out_shape = (N, weight.shape[0], geom.OH, geom.OW, E)
    return x5, weight, batched, VectorCall(geom, out_shape if batched else out_shape[1:], fwd,
                                           bwd, p, flat, direct)


# At small E the convolution (forward, or backward) can run as a standard
# NCHW convolution (VectorAlgo.ROWS or IMAGES), which vectorises along
# output positions, where the E-vectorised tiles leave most of a vector
# empty; cypool._select chooses.

def flat_plan(x5, weight, geom: geo.WindowGeometry) -> Plan:
    """At column stride 1 a vector image (C, H, W, E), C-contiguous, is
    the NCHW image (C, H, W * E): output (ow, e) of a row is position
    ow * E + e, and tap (c, i, j) reads position ow * E + e + j * dw * E.
    So the vector convolution is a standard one of the flattened rows,
    with the columns' padding and dilation times E, and its output
    (O, OH, OW, E) is the flattened (O, OH, OW * E): no component images,
    no strided reads or writes."""
    N, C, H, W, E = x5.shape
    return plan((N, C, H, W * E), weight.shape, (geom.sh, 1), (geom.ph, geom.pw * E),
                (geom.dh, geom.dw * E), x5.dtype)


def component_images(a5: np.ndarray):
    """The NCHW batches conv2d's kernels run on, as views of a
    (N, C, H, W, E) array: at E = 1 the whole batch, (N, C, H, W), in one
    call; otherwise image n as E images (E, C, H, W), one call an image."""
    if a5.shape[4] == 1:
        return (a5[..., 0],)
    return [a5[n].transpose(3, 0, 1, 2) for n in range(a5.shape[0])]


def small_e_plan(x5, weight, geom: geo.WindowGeometry) -> Plan:
    N, C, H, W, E = x5.shape
    return plan((N if E == 1 else E, C, H, W), weight.shape, (geom.sh, geom.sw),
                (geom.ph, geom.pw), (geom.dh, geom.dw), x5.dtype)


def _e_chunk(E: int, rows: int, row_vectors: int, itemsize: int) -> int:
    """Length of the E chunks swept over all pixels: the vectors that `rows`
    consecutive pixel rows read (row_vectors each) fit in _L2_BUDGET; a
    multiple of 48 (of every variant's E block: 3 vectors of 2 to 8
    values), whole E when it fits anyway."""
    per = max(1, rows * row_vectors * itemsize)
    ec = max(48, (_L2_BUDGET // per) // 48 * 48)
    return E if ec >= E else ec


def vector_forward_into(res, x5, weight, b, call: VectorCall, nt: int) -> None:
    """res (N, O, OH, OW, E), C-contiguous = the vector convolution of x5
    plus b (an empty array for none) on component 0."""
    E, O = x5.shape[4], weight.shape[0]
    geom = call.geom
    if call.forward == VectorAlgo.ROWS:
        N, C, H, W, _ = x5.shape
        p = call.flat if call.flat is not None else flat_plan(x5, weight, geom)
        xf = chk.contiguous(x5, x5.dtype).reshape(N, C, H, W * E)
        forward_into(res.reshape(N, O, geom.OH, geom.OW * E), xf, weight, chk.no_bias(x5.dtype),
                     p, nt)
        if b.size:
            res[..., 0] += b[:, None, None]
    elif call.forward == VectorAlgo.IMAGES:
        # conv2d's bias goes to every component image: at E = 1, that is
        # component 0; otherwise it is added to component 0 afterwards.
        kb = b if E == 1 else chk.no_bias(x5.dtype)
        p = call.plan if call.plan is not None else small_e_plan(x5, weight, geom)
        for ri, xi in zip(component_images(res), component_images(x5)):
            forward_into(ri, xi, weight, kb, p, nt)
        if b.size and E > 1:
            res[..., 0] += b[:, None, None]
    else:
        tiles_forward(x5, weight, b, res, geom.window, nt)


def tiles_forward(x5, weight, b, out, window: geo.Window, nt: int, skip_zero_taps: bool = False) -> None:
    """out (N, O, OH, OW, E), its last axis contiguous (the rest may be a
    view's) = the convolution of x5 by the E-vectorised tiles.
    skip_zero_taps: leave out the input vectors that are all zero in a
    chunk of E (a zonotope's dead neurons), where every weight is finite:
    the same sums (bit for bit with gcc 12; gcc 16's build differs in the
    last bit at the last component of E, for a reason not yet found)."""
    N, C, H, W, E = x5.shape
    O, _, kh, kw = weight.shape
    dt = x5.dtype
    xc = chk.contiguous(x5, dt)
    wt = padded_columns(weight.reshape(O, C * kh * kw).T)  # (K, O padded): one row per tap
    # Multiply-adds count too (_backend.work): a strided call over 16 to 32
    # components can touch few elements and still be worth a team.
    macs = out.size * C * kh * kw
    # The kernel splits the pixels among threads, or E where there are
    # fewer pixels than threads (a 1 x 1 convolution of one pixel, say).
    items = max(N * out.shape[2] * out.shape[3], -(-E // 48))
    threads = threads_for(nt, work(macs, xc.size + out.size), items)
    ec = _e_chunk(E, kh, C * W, dt.itemsize)  # a row of outputs reads kh input rows of C*W vectors
    b = padded_columns(b[None, :])[0] if b.size else b
    skip = skip_zero_taps and bool(np.isfinite(weight).all())
    kernel("vector_conv2d_forward", dt)(xc, wt, b, out, *window, ec, skip, threads)


def vector_backward(g, xc, weight, batched: bool, call: VectorCall, needs_input_grad: bool,
                    needs_weight_grad: bool, nt: int, algo=None, gx=None):
    """(grad_x, grad_w, grad_bias) of a checked vector convolution call, by
    algo (None: the call's), grad_x written into gx (like xc) where given.
    cypool.dask passes the choice of the whole array to each of its E
    chunks, so that the input gradient of every chunk is the one the
    whole array gets, bit for bit."""
    dt = xc.dtype
    geom = call.geom
    kh, kw, sh, sw, ph, pw, dh, dw = geom.window
    N, C, H, W, E = xc.shape if batched else (1, *xc.shape)
    O = weight.shape[0]
    x5 = xc if batched else xc[None]
    g5 = chk.contiguous(g if batched else g[None], dt)
    gx5 = None
    if needs_input_grad:
        gx5 = np.empty(x5.shape, dt) if gx is None else (gx if batched else gx[None])
    grad_x = grad_w = None
    if algo is None:
        algo = call.backward
    if algo == VectorAlgo.ROWS:
        p = call.flat if call.flat is not None else flat_plan(x5, weight, geom)
        return _rows_backward(g5, x5, weight, p, batched, needs_input_grad, needs_weight_grad, nt,
                              gx5)
    if algo == VectorAlgo.IMAGES:
        p = call.plan if call.plan is not None else small_e_plan(x5, weight, geom)
        return _small_e_backward(g5, x5, weight, p, batched, needs_input_grad, needs_weight_grad,
                                 nt, gx5)
    grad_bias = g5[..., 0].sum(axis=(0, 2, 3))
    touched = g5.size + x5.size
    if needs_input_grad:
        vector_input_grad_into(gx5, g5, weight, geom, nt)
        grad_x = gx5 if batched else gx5[0]
    if needs_weight_grad:
        x5c = chk.contiguous(x5, dt)
        # Summed in parts, one a thread outside a crowded spell: the parts,
        # not the team, fix the result (_backend.parts_for).
        parts = parts_for(nt, touched, N * geom.OH * geom.OW)
        partial = np.zeros((parts, O, C * kh * kw), dtype=dt)
        kernel("vector_conv2d_weight_grad", dt)(g5, x5c, partial, *geom.window, team_for(parts))
        grad_w = partial[0]
        for s in range(1, parts):  # in part order: deterministic
            grad_w = grad_w + partial[s]
        grad_w = grad_w.reshape(weight.shape)
    return grad_x, grad_w, grad_bias


def vector_input_grad_into(gx5, g5, weight, geom: geo.WindowGeometry, nt: int,
                           skip_zero_taps: bool = False) -> None:
    """The vector convolution's input gradient by the E-vectorised tiles,
    from g5 (N, O, OH, OW, E) into gx5 (N, C, H, W, E), both C-contiguous
    in weight's dtype, geom checked. skip_zero_taps: leave out the rows of
    g5 that are all zero in an E chunk (the coefficients of a back-
    substitution's dead ReLUs), where weight is finite."""
    dt = gx5.dtype
    N, C, H, W, E = gx5.shape
    O = weight.shape[0]
    kh, kw, sh, sw, ph, pw, dh, dw = geom.window
    w2 = padded_columns(weight.transpose(2, 3, 0, 1).reshape(kh * kw * O, C))
    threads = threads_for(nt, g5.size + gx5.size, N * H * W)
    ec = _e_chunk(E, -(-kh // sh), O * geom.OW, dt.itemsize)  # input rows reach ceil(kh/sh) output rows
    skip = skip_zero_taps and bool(np.isfinite(weight).all())
    kernel("vector_conv2d_input_grad", dt)(g5, w2, gx5, sh, sw, ph, pw, dh, dw, kh, kw, ec, skip,
                                           threads)


def _rows_backward(g5, x5, weight, p: Plan, batched, needs_input_grad, needs_weight_grad, nt, gx):
    """(grad_x, grad_w, grad_bias) of a small-E convolution at column
    stride 1, by conv2d's kernels on the flattened rows (flat_plan), the
    whole batch at once. The input gradient runs the
    same sums as the component images' (the same bits with gcc 12; where
    one way takes the direct kernels and the other the phase tiles, a
    newer gcc contracts them differently); the weight gradient sums the
    positions in another grouping. gx: x5's shape, for the input gradient."""
    N, C, H, W, E = x5.shape
    O, OH, OW = g5.shape[1:4]
    gf = g5.reshape(N, O, OH, OW * E)
    grad_x = grad_w = None
    if needs_input_grad:
        input_grad_into(gx.reshape(N, C, H, W * E), gf, weight, p, nt)
        grad_x = gx if batched else gx[0]
    if needs_weight_grad:
        gw = np.empty((O, weight[0].size), dtype=x5.dtype)
        gb = np.empty(O, dtype=x5.dtype)  # conv2d's: summed over all E components
        weight_grad_into(gw, gb, gf, chk.contiguous(x5, x5.dtype).reshape(N, C, H, W * E),
                         weight, p, nt)
        grad_w = gw.reshape(weight.shape)
    return grad_x, grad_w, g5[..., 0].sum(axis=(0, 2, 3))


def _small_e_backward(g5, x5, weight, p: Plan, batched, needs_input_grad, needs_weight_grad, nt,
                      gx):
    """(grad_x, grad_w, grad_bias) of a small-E convolution, by conv2d's
    kernels on the component images, the weight gradients of successive
    calls added in image order. At E = 1, conv2d's bias gradient (the sum
    over the one component image) is grad_bias. gx: x5's shape, for the
    input gradient."""
    E = x5.shape[4]
    grad_x = grad_w = grad_bias = None
    if needs_input_grad:
        for gxi, gi in zip(component_images(gx), component_images(g5)):
            input_grad_into(gxi, gi, weight, p, nt)
        grad_x = gx if batched else gx[0]
    if needs_weight_grad:
        O = weight.shape[0]
        gb = np.empty(O, dtype=x5.dtype)  # conv2d's: summed over all E components
        for gi, xi in zip(component_images(g5), component_images(x5)):
            gw = np.empty((O, weight[0].size), dtype=x5.dtype)
            weight_grad_into(gw, gb, chk.contiguous(gi, x5.dtype), xi, weight, p, nt)
            grad_w = gw if grad_w is None else grad_w + gw
        if E == 1:
            grad_bias = gb
        grad_w = grad_w.reshape(weight.shape)
    if grad_bias is None:
        grad_bias = g5[..., 0].sum(axis=(0, 2, 3))
    return grad_x, grad_w, grad_bias
