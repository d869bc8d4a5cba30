# The compiled kernels of cypool for the building machine only: the one
# variant a CYPOOL_NATIVE=1 source build makes (-march=native; see setup.py).
# Every variant compiles the same sources; cypool/_backend.py loads this one
# whenever it is there. Directives are set once, in setup.py.
include "_kernels/_common.pxi"
include "_kernels/_pooling.pxi"
include "_kernels/_convolution.pxi"
