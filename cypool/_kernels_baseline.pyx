# The compiled kernels of cypool, built once per instruction-set level:
# this is the "baseline" variant (see setup.py, variants()). It compiles every
# kernel family (the AVX-512 variant all but pooling); cypool/_backend.py
# imports the best variant the CPU runs. Directives are set once, in
# setup.py.
include "_kernels/_common.pxi"
include "_kernels/_pooling.pxi"
include "_kernels/_convolution.pxi"
