# The compiled kernels of cypool, built once per instruction-set level:
# this is the "avx2" variant (see setup.py, variants()). Every variant compiles
# the same sources; cypool/_backend.py imports the best one the CPU runs.
# Directives are set once, in setup.py.
include "_kernels.pxi"
