import threading
import zlib

import numpy as np
import pytest


class _ThreadGenerator:
    """A numpy Generator per thread, every one from the same seed. Under
    pytest-run-parallel a test's fixtures are made once and shared by the
    threads that run it; this way each thread draws the very numbers a
    serial run draws, and runs the same case."""

    def __init__(self, seed):
        self._seed = seed
        self._local = threading.local()

    def __getattr__(self, name):
        gen = getattr(self._local, "gen", None)
        if gen is None:
            gen = self._local.gen = np.random.default_rng(self._seed)
        return getattr(gen, name)


@pytest.fixture
def rng(request):
    # A different, reproducible stream for every test (and parameter set).
    return _ThreadGenerator(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True)
def uncrowded():
    """Every test starts outside a crowded spell (_backend.threads_for), so
    that a late thread in an earlier test, on a loaded machine, does not
    put its threaded calls on one thread. Tests that assert a team size
    call set_crowded(False) again right before the call."""
    from cypool._testing import set_crowded

    set_crowded(False)


@pytest.fixture
def set_streams(monkeypatch):
    """set_streams(flag): make max_pool2d stream its indices (True) or store
    them plainly (False), whatever the sizes: both ways run every path."""
    import cypool.pooling

    def set_to(flag):
        monkeypatch.setattr(cypool.pooling, "streams", lambda kept, write_once: flag)
    return set_to



try:  # hypothesis profiles for tests/test_fuzz.py
    import os

    from hypothesis import HealthCheck, settings

    settings.register_profile(
        "ci", max_examples=200, derandomize=True, deadline=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    settings.register_profile(
        "long", max_examples=3000, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    settings.load_profile(os.environ.get("CYPOOL_HYPOTHESIS_PROFILE", "ci"))
except ImportError:
    pass
