"""The compiled kernels and how many threads a call gets.

Every public function goes through here to reach a kernel, so that the
thread policy is the same everywhere:

* ``num_threads=None`` follows OpenMP's default (``OMP_NUM_THREADS`` or a
  threadpoolctl limit);
* a call whose work is small runs on the calling thread alone: waking a
  thread team costs more than a few microseconds of work;
* never more threads than there are independent work items.
"""
from __future__ import annotations

from . import _kernels as kernels

# Elements (of input plus output) below which a call runs serially. About
# 20-40 microseconds of single-threaded work on a current x86-64 core.
SERIAL_BELOW = 1 << 16


def threads_for(requested: int, work: int, items: int) -> int:
    """Thread count for a kernel call.

    requested: 0 for OpenMP's default, else the caller's num_threads.
    work: elements the call reads and writes; items: independent work items.
    """
    if work < SERIAL_BELOW or items <= 1:
        return 1
    n = requested if requested > 0 else kernels.max_threads()
    return max(1, min(n, items))


_C_NAMES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t"}
_specialised = {}


def kernel(name: str, *dtypes):
    """The kernel specialised for these numpy dtypes (its fused types in order).

    Calling the specialisation directly skips Cython's run-time dispatch on
    buffer dtypes, about a microsecond per call: it matters at batch size 1.
    """
    key = (name,) + dtypes
    fn = _specialised.get(key)
    if fn is None:
        generic = getattr(kernels, name)
        sig = "|".join(_C_NAMES[d.name] for d in dtypes)
        fn = _specialised[key] = generic.__signatures__[sig]
    return fn
