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
