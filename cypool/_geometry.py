"""The geometry of windows and convolutions: strides, paddings and
dilations checked, and the output sizes of a pooling, an unpooling and a
convolution, as named tuples the kernels take (CONTRIBUTING.md,
"Argument checks"). The array checks they use are _checks.py's."""
from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from ._checks import as_int, conv_arrays, conv_channels, hashable, pair, unhashable


# Largest stride, padding or dilation accepted: anything larger has no use
# on an array that fits in memory, and would overflow the kernels' integers.
PARAM_LIMIT = 2**31 - 1


def _bounded(values, name: str):
    if any(v > PARAM_LIMIT for v in values):
        raise ValueError(f"{name} must be at most {PARAM_LIMIT}, got {values}")
    return values


def _stride_dilation(stride, dilation):
    """Checked (sh, sw, dh, dw): positive and at most PARAM_LIMIT."""
    sh, sw = _bounded(pair(stride, "stride"), "stride")
    dh, dw = _bounded(pair(dilation, "dilation"), "dilation")
    if sh < 1 or sw < 1:
        raise ValueError(f"stride must be positive, got {(sh, sw)}")
    if dh < 1 or dw < 1:
        raise ValueError(f"dilation must be positive, got {(dh, dw)}")
    return sh, sw, dh, dw


def _padding_pair(padding):
    """Checked (ph, pw): non-negative and at most PARAM_LIMIT."""
    ph, pw = _bounded(pair(padding, "padding"), "padding")
    if ph < 0 or pw < 0:
        raise ValueError(f"padding must be non-negative, got {(ph, pw)}")
    return ph, pw


class Steps(NamedTuple):
    """Checked stride, padding and dilation of a window without its size."""
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int


class Window(NamedTuple):
    """A sliding window: its size, stride, (symmetric) padding and
    dilation, in the order the pooling and vector-convolution kernels take
    them (``*window``)."""
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int


class WindowGeometry(NamedTuple):
    """A window over an input, and the output size it gives: the checked
    geometry of a max pooling (pool_geometry) or a vector convolution
    (vector_conv_args)."""
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    OH: int
    OW: int

    @property
    def window(self) -> Window:
        return Window(*self[:8])

    @property
    def out_hw(self) -> tuple[int, int]:
        return self.OH, self.OW


class ConvGeometry(NamedTuple):
    """The checked geometry of a standard convolution (conv_geometry): its
    padding may differ on either side (padding='same')."""
    sh: int
    sw: int
    dh: int
    dw: int
    ph0: int   # top
    ph1: int   # bottom
    pw0: int   # left
    pw1: int   # right
    OH: int
    OW: int


def step_params(stride, padding, dilation) -> Steps:
    """Checked stride, padding and dilation: positive strides and
    dilations, non-negative padding."""
    sh, sw, dh, dw = _stride_dilation(stride, dilation)
    ph, pw = _padding_pair(padding)
    return Steps(sh, sw, ph, pw, dh, dw)


def window_params(kernel_size, stride, padding):
    """Checked (kh, kw, sh, sw, ph, pw); stride defaults to kernel_size."""
    kh, kw = pair(kernel_size, "kernel_size")
    if kh < 1 or kw < 1:
        raise ValueError(f"kernel_size must be positive, got {(kh, kw)}")
    sh, sw, ph, pw, _, _ = step_params((kh, kw) if stride is None else stride, padding, 1)
    return kh, kw, sh, sw, ph, pw


def _out_size(n: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """torch.nn.MaxPool2d's output length along one dimension."""
    span = n + 2 * p - d * (k - 1) - 1
    if span < 0:
        return 0
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1  # the last window would start in the right padding
    return out


def _has_window_in_padding(n: int, out: int, k: int, s: int, p: int, d: int) -> bool:
    for o in range(out):
        start = o * s - p
        if not any(0 <= start + t * d < n for t in range(k)):
            return True
    return False


def pool_geometry(H: int, W: int, kernel_size, stride, padding, dilation,
                  ceil_mode: bool) -> WindowGeometry:
    """Checked geometry of a max pooling (cached per shape and parameters,
    keyed with their types, so that a float or a list is checked as it is;
    plain ints are their own keys)."""
    if (type(kernel_size) is int and (stride is None or type(stride) is int) and type(padding) is int
            and type(dilation) is int):
        return _pool_geometry(H, W, kernel_size, stride, padding, dilation, bool(ceil_mode))
    return _pool_geometry(H, W, hashable(kernel_size), hashable(stride), hashable(padding),
                          hashable(dilation), bool(ceil_mode))


def pool_params(kernel_size, stride, padding, dilation):
    """The checks of a max pooling's parameters that need no input shape:
    (kh, kw, sh, sw, ph, pw, dh, dw)."""
    kh, kw, sh, sw, ph, pw = window_params(kernel_size, stride, padding)
    dh, dw = _bounded(pair(dilation, "dilation"), "dilation")
    if dh < 1 or dw < 1:
        raise ValueError(f"dilation must be positive, got {(dh, dw)}")
    if ph > kh // 2 or pw > kw // 2:
        raise ValueError(
            f"padding must be between 0 and kernel_size // 2 = {(kh // 2, kw // 2)}, got {(ph, pw)}"
        )
    return kh, kw, sh, sw, ph, pw, dh, dw


@lru_cache(maxsize=512)
def _pool_geometry(H: int, W: int, kernel_size, stride, padding, dilation, ceil_mode: bool):
    kernel_size, stride, padding, dilation = (unhashable(k) for k in (kernel_size, stride, padding, dilation))
    kh, kw, sh, sw, ph, pw, dh, dw = pool_params(kernel_size, stride, padding, dilation)
    OH = _out_size(H, kh, sh, ph, dh, ceil_mode)
    OW = _out_size(W, kw, sw, pw, dw, ceil_mode)
    if OH < 1 or OW < 1:
        raise ValueError(
            f"kernel_size {(kh, kw)} with dilation {(dh, dw)} is larger than the padded input "
            f"{(H + 2 * ph, W + 2 * pw)}"
        )
    if _has_window_in_padding(H, OH, kh, sh, ph, dh) or _has_window_in_padding(W, OW, kw, sw, pw, dw):
        raise ValueError(
            "padding/dilation: some pooling window lies wholly in the padding, so it has no "
            "maximum to index; reduce padding or dilation"
        )
    return WindowGeometry(kh, kw, sh, sw, ph, pw, dh, dw, OH, OW)


def unpool_geometry(H: int, W: int, kernel_size, stride, padding, output_size):
    """Checked (OH, OW) of a max unpooling, as torch.nn.MaxUnpool2d sizes it
    (cached as pool_geometry is)."""
    return _unpool_geometry(H, W, hashable(kernel_size), hashable(stride), hashable(padding),
                            hashable(output_size))


@lru_cache(maxsize=512)
def _unpool_geometry(H: int, W: int, kernel_size, stride, padding, output_size):
    kernel_size, stride, padding, output_size = (unhashable(k) for k in (kernel_size, stride, padding,
                                                                            output_size))
    kh, kw, sh, sw, ph, pw = window_params(kernel_size, stride, padding)
    dflt = ((H - 1) * sh - 2 * ph + kh, (W - 1) * sw - 2 * pw + kw)
    if output_size is None:
        size = dflt
    else:
        if not isinstance(output_size, (tuple, list)) or len(output_size) < 2:
            raise TypeError(f"output_size must be a tuple (..., H, W), got {output_size!r}")
        size = (as_int(output_size[-2], "output_size"), as_int(output_size[-1], "output_size"))
        # torch's range: strictly between default - stride and default + stride,
        # so that a ceil_mode pooling of an odd size unpools back to that size.
        for axis, got, d, s in zip(("height", "width"), size, dflt, (sh, sw)):
            if not d - s < got < d + s:
                raise ValueError(
                    f"output_size {size}: the {axis} must be between {d - s + 1} and {d + s - 1} "
                    f"(the default {d}, give or take stride - 1 = {s - 1}) for this kernel, "
                    f"stride and padding"
                )
    if size[0] < 1 or size[1] < 1:
        raise ValueError(f"padding {(ph, pw)} leaves an empty unpooled output {size}")
    return size


def conv_padding(padding, kh: int, kw: int, dh: int, dw: int, sh: int, sw: int):
    """Checked (ph_lo, ph_hi, pw_lo, pw_hi) for an int, a pair, 'valid' or
    'same' (torch's rule: the extra padding of an even kernel goes on the
    bottom and right; only for stride 1)."""
    if isinstance(padding, str):
        if padding == "valid":
            return 0, 0, 0, 0
        if padding == "same":
            if sh != 1 or sw != 1:
                raise ValueError(f"padding='same' needs stride 1, got stride {(sh, sw)}")
            th, tw = dh * (kh - 1), dw * (kw - 1)
            return th // 2, th - th // 2, tw // 2, tw - tw // 2
        raise ValueError(f"padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
    ph, pw = _padding_pair(padding)
    return ph, ph, pw, pw


def conv_params(kh: int, kw: int, stride, padding, dilation):
    """Checked (sh, sw, dh, dw, ph_lo, ph_hi, pw_lo, pw_hi) of a convolution
    with a (kh, kw) kernel: what can be checked without the input."""
    sh, sw, dh, dw = _stride_dilation(stride, dilation)
    return (sh, sw, dh, dw) + conv_padding(padding, kh, kw, dh, dw, sh, sw)


def conv_geometry(H: int, W: int, kh: int, kw: int, stride, padding, dilation) -> ConvGeometry:
    """Checked geometry of a 2-D convolution of an (H, W) plane with a
    (kh, kw) kernel. Not cached: a convolution's checks run once per kind
    of call (cypool._conv_engine.checked)."""
    params = conv_params(kh, kw, stride, padding, dilation)
    sh, sw, dh, dw, ph0, ph1, pw0, pw1 = params
    Hp, Wp = H + ph0 + ph1, W + pw0 + pw1
    if Hp < dh * (kh - 1) + 1 or Wp < dw * (kw - 1) + 1:
        raise ValueError(
            f"weight: kernel {(kh, kw)} with dilation {(dh, dw)} is larger than the padded "
            f"input {(Hp, Wp)}"
        )
    OH = (Hp - dh * (kh - 1) - 1) // sh + 1
    OW = (Wp - dw * (kw - 1) - 1) // sw + 1
    return ConvGeometry(*params, OH, OW)


def vector_conv_args(x, weight, stride, padding, dilation, xname: str = "x"):
    """The vector convolution's arrays and parameters, checked:
    (x as 5-D, weight, batched?, its WindowGeometry)."""
    x, weight = conv_arrays(x, weight, (4, 5), xname)
    batched = x.ndim == 5
    x5 = x if batched else x[None]
    N, C, H, W, E = x5.shape
    O, _, kh, kw = weight.shape
    conv_channels(C, weight.shape, xname)
    sh, sw, ph, pw, dh, dw = step_params(stride, padding, dilation)
    g = conv_geometry(H, W, kh, kw, (sh, sw), (ph, pw), (dh, dw))
    return x5, weight, batched, WindowGeometry(kh, kw, sh, sw, ph, pw, dh, dw, g.OH, g.OW)
