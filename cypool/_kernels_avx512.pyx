# The compiled kernels of cypool, built once per instruction-set level:
# this is the "avx512" variant (see setup.py, variants()). It compiles the
# convolution family only: the max-pool and argmax kernels run from the
# AVX2 variant on an AVX-512 CPU, faster there (cypool/_backend.py, CAPPED),
# and leaving them out shortens the build. Directives are set once, in
# setup.py.
include "_kernels/_common.pxi"
include "_kernels/_convolution.pxi"
