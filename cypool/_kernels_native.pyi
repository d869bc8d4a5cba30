# The native variant (CYPOOL_NATIVE=1) has exactly the baseline's functions.
from cypool._kernels_baseline import *
from cypool._kernels_baseline import __test__ as __test__
