# The max-pool and argmax family, in the order its files depend on each
# other (each file's first line says what it uses). Compiled into the
# variants that run it: not AVX-512's, whose code for these memory-bound
# loops measured slower than AVX2's (setup.py, variants(); _backend.CAPPED).
include "_maxpool_rows.pxi"
include "_maxpool_flat3.pxi"
include "_maxpool_small.pxi"
include "_maxpool_forward.pxi"
include "_maxpool_backward.pxi"
include "_argmax.pxi"
