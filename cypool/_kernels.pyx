# The compiled kernels of cypool, one module so that each instruction-set
# variant is a single extension. Directives are set once, in setup.py.
include "_common.pxi"
include "_maxpool.pxi"
include "_argmax.pxi"
