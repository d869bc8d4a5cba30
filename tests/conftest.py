import zlib

import numpy as np
import pytest


@pytest.fixture
def rng(request):
    # A different, reproducible stream for every test (and parameter set).
    seed = zlib.crc32(request.node.nodeid.encode())
    return np.random.default_rng(seed)


@pytest.fixture
def set_streams(monkeypatch):
    """set_streams(flag): make max_pool2d stream its indices (True) or store
    them plainly (False), whatever the sizes: both ways run every path."""
    import cypool.pooling

    def set_to(flag):
        monkeypatch.setattr(cypool.pooling, "streams", lambda kept, write_once: flag)
    return set_to

