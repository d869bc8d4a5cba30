# Every kernel family, in the order they depend on each other. Each
# _kernels_<level>.pyx includes this file once: the same sources compiled
# for every instruction-set level (setup.py, variants()).
include "_common.pxi"
include "_maxpool_rows.pxi"
include "_maxpool_flat3.pxi"
include "_maxpool_small.pxi"
include "_maxpool_forward.pxi"
include "_maxpool_backward.pxi"
include "_argmax.pxi"
include "_vconv.pxi"
include "_conv.pxi"
include "_conv_direct.pxi"
include "_conv_memo.pxi"
include "_zonotope.pxi"
