# The convolution family, in the order its files depend on each other (each
# file's first line says what it uses): the vector convolution and its
# register tiles, the standard convolution on the same tiles, the direct
# stride-1 kernels of small calls and the C memo of their repeats, the
# zonotope passes of certification, and the back-substitution steps of
# cypool.verify. Compiled into every variant.
include "_vconv.pxi"
include "_conv_phases.pxi"
include "_conv.pxi"
include "_conv_backward.pxi"
include "_conv_direct.pxi"
include "_conv_memo.pxi"
include "_zonotope.pxi"
include "_crown.pxi"
