import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    # A different, reproducible stream for every test (and parameter set).
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch not installed: cross-check skipped")
