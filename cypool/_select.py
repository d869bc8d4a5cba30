"""One place chooses each family's algorithm.

Each ``select_*`` function takes a call's geometry and returns an enum
member. The convolution engine calls them once per plan and keeps the
answer in the cached plan; the kernels carry the choice out and decide
nothing but data-dependent fallbacks (named below). Tests check the rules
by calling these functions, and force a path with ``cypool._testing.force``,
which sets this module's per-thread overrides.

The rules' thresholds were measured both ways; docs/performance.md has the
measurements.
"""
from __future__ import annotations

import enum
import threading

from . import _backend

# The thread's forced choices (cypool._testing.force): {family: member}.
_forced = threading.local()


def forced(family: str):
    """The member forced for family on this thread, or None."""
    return getattr(_forced, "choices", {}).get(family)


def forcing() -> bool:
    """Whether this thread forces any choice: plans are then neither cached
    nor taken from a cache."""
    return bool(getattr(_forced, "choices", None))


class ConvAlgo(enum.IntEnum):
    """How a pass of conv2d's forward kernel runs: the forward, or the
    input gradient of a stride-1 convolution (the same kernel, transposed).
    The values are the kernels' (_kernels/_conv.pxi)."""
    #: _conv_direct.h: one zero-padded copy of each image, every pass on
    #: the calling thread. Set-up costs nothing, so small calls take it.
    DIRECT = 0
    #: Register tiles over the virtual output (each image's rows Wq wide,
    #: the columns past OW computed and dropped); taps read where they lie.
    VIRTUAL = 1
    #: VIRTUAL, with each block of taps copied first (a 1x1 convolution's
    #: taps do not overlap, so the copy is no larger than what it reads).
    VIRTUAL_COPIED = 2
    #: Tiles over the real positions only, gathered from their rows.
    GRID = 3
    #: Output channels in the vector lanes (_conv_ovec.h).
    LANES = 4
    #: LANES with rows three taps wide by F(2, 3) (_conv_winograd.h). The
    #: kernel falls back to LANES where a weight is not finite, and runs a
    #: row the direct way where its transformed sums overflow.
    WINOGRAD = 5


class WeightGradAlgo(enum.IntEnum):
    """How conv2d's weight gradient runs (_kernels/_conv_backward.pxi)."""
    #: The forward's tiles on each chunk's im2col rows.
    TILES = 0
    #: Dot products of grad_output with the tap vectors, no gathering. The
    #: kernel takes TILES for an image with inf or NaN, whose values past a
    #: row's end would not add exact zeros.
    DOTS = 1


class VectorAlgo(enum.IntEnum):
    """How a pass of the vector convolution (C, H, W, E) runs."""
    #: The E-vectorised tiles (_kernels/_vconv.pxi).
    TILES = 0
    #: conv2d's kernels on each image's E component images (strided views).
    IMAGES = 1
    #: conv2d's kernels on rows flattened to W * E values (column stride 1).
    ROWS = 2


# Output channels a weight gradient takes DOTS for: with few channels the
# im2col rows cost more to gather than the multiply-adds they feed.
DOTS_MAX_O = 8


def _conv_module():
    return _backend.module_for("conv2d_forward")


def _lanes_pay(O: int, OW: int, Wq: int, K: int, L: int, vbytes: int) -> bool:
    """LANES over the virtual output: with 32 vector registers where the
    channels fill whole vectors and a tenth of the columns or more are
    dropped, rows are 16 outputs or fewer, or there are 256 taps or more;
    with 16 registers, where the channels fill pairs of vectors and a
    quarter or more is dropped, or there are 256 taps or more."""
    if vbytes == 64:
        return O % L == 0 and ((Wq - OW) * 10 >= Wq or OW <= 16 or K >= 256)
    return O % (2 * L) == 0 and ((Wq - OW) * 4 >= Wq or K >= 256)


def _winograd_pays(K1: int, OW: int, vbytes: int) -> bool:
    """F(2, 3) over LANES' direct sums, with K1 (channel, kernel row) pairs:
    AVX2's narrower tiles gain only on long rows of many pairs."""
    if vbytes == 32:
        return K1 >= 128 and OW >= 28
    return K1 >= 16 and OW >= 13


def _grid_pays(O: int, OW: int, Wq: int, unit: int) -> bool:
    """GRID over VIRTUAL: the skipped columns save about 3 O cycles a tap and
    block, the gather costs about 20: with 64 channels or more, where
    (Wq - OW) * O >= 8 Wq, on rows of whole 32-byte copy units or of three
    units or more."""
    return (O >= 64 and (OW % unit == 0 or OW >= 3 * unit)
            and (Wq - OW) * O >= 8 * Wq)


def select_conv(cin: int, cout: int, kh: int, kw: int, out_w: int, padded_w: int, sw: int,
                dw: int, itemsize: int, *, stride1: bool, small: bool) -> ConvAlgo:
    """The algorithm of one pass of conv2d's forward kernel: cin input and
    cout output channels of the pass, a kh x kw kernel, rows of out_w
    outputs over padded_w padded columns at column stride sw and dilation
    dw, values of itemsize bytes. stride1: the convolution's stride is 1;
    small: every pass of the call is small enough for the calling thread
    alone. DIRECT is the whole call's choice: every pass, or none."""
    m = _conv_module()
    L = m.VECTOR_BYTES // itemsize
    K = cin * kh * kw
    Wq = -(-padded_w // sw)  # a phase plane's columns
    lanes_ok = sw <= 2
    wino_ok = lanes_ok and kw == 3 and dw == 1 and sw == 1 and out_w >= 2
    grid_ok = cout > _backend.CHANNEL_BLOCK and Wq > out_w
    want = forced("conv")
    if want is not None:
        ok = {ConvAlgo.DIRECT: stride1,
              ConvAlgo.VIRTUAL: True, ConvAlgo.VIRTUAL_COPIED: True, ConvAlgo.GRID: grid_ok,
              ConvAlgo.LANES: lanes_ok, ConvAlgo.WINOGRAD: wino_ok}
        if ok[want]:
            return want
    if stride1 and small:
        return ConvAlgo.DIRECT
    if m.OVEC_TILES and lanes_ok and _lanes_pay(cout, out_w, Wq, K, L, m.VECTOR_BYTES):
        if wino_ok and _winograd_pays(cin * kh, out_w, m.VECTOR_BYTES):
            return ConvAlgo.WINOGRAD
        return ConvAlgo.LANES
    if grid_ok and _grid_pays(cout, out_w, Wq, 32 // itemsize):
        return ConvAlgo.GRID
    return ConvAlgo.VIRTUAL_COPIED if kh * kw == 1 else ConvAlgo.VIRTUAL


def select_weight_grad(cout: int) -> WeightGradAlgo:
    """The weight gradient's algorithm for cout output channels."""
    want = forced("weight_grad")
    if want is not None:
        return want
    return WeightGradAlgo.DOTS if cout <= DOTS_MAX_O else WeightGradAlgo.TILES


def select_vector_forward(E: int, sh: int, sw: int, O: int) -> VectorAlgo:
    """The vector convolution's forward: ROWS at column stride 1 and
    2 <= E <= 16 (0.43-0.79x IMAGES' time at E = 4 to 16); IMAGES below
    E = 16 but for a strided call at E = 8, whose set-up outweighs its
    arithmetic, and at E = 16, stride 1, for fewer output channels than a
    tile holds; else TILES."""
    want = forced("vector_forward")
    if want is not None and (want != VectorAlgo.ROWS or sw == 1):
        return want
    if sw == 1 and 2 <= E <= 16:
        return VectorAlgo.ROWS
    if sh == sw == 1:
        small = E < 16 or (E == 16 and O < _backend.CHANNEL_BLOCK)
    else:
        small = E < 16 and E % 8 != 0
    return VectorAlgo.IMAGES if small else VectorAlgo.TILES


def select_vector_backward(E: int, sh: int, sw: int) -> VectorAlgo:
    """The vector convolution's backward: conv2d's kernels up to E = 20, and
    up to E = 32 at stride 1; on flattened rows at column stride 1 and
    E >= 2 (0.47-0.80x the component images' time), else on the component
    images; the E-vectorised tiles above."""
    want = forced("vector_backward")
    if want is not None and (want != VectorAlgo.ROWS or sw == 1):
        return want
    if not (E <= 20 or (E <= 32 and sh == sw == 1)):
        return VectorAlgo.TILES
    return VectorAlgo.ROWS if sw == 1 and E > 1 else VectorAlgo.IMAGES
