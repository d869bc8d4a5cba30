# The AVX-512 variant has exactly the baseline's functions.
from cypool._kernels_baseline import *
from cypool._kernels_baseline import __test__ as __test__
