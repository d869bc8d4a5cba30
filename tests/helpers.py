"""Helpers shared by the tests (fixtures live in conftest.py)."""
import os

import numpy as np
import pytest


def torch_or_skip():
    return pytest.importorskip("torch", reason="PyTorch not installed: cross-check skipped")


def cypool_subprocess_env(drop=()):
    """Environment for a Python subprocess, run from an empty folder, that
    imports the cypool these tests import: the installed one, or an in-place
    build's source tree (put on PYTHONPATH). drop: variables to leave out."""
    from cypool import _backend

    env = {k: v for k, v in os.environ.items() if k not in drop}
    root = os.path.dirname(os.path.dirname(os.path.abspath(_backend.__file__)))
    if os.path.basename(root) not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def pool_kernel(mod, planes, geometry, *, index_dtype=np.int64, scalar_only=False,
                stream_indices=False, num_threads=1):
    """(out, indices) of kernel module mod's max_pool2d_forward on (P, H, W)
    planes, called directly on fresh outputs; geometry is what
    cypool._geometry.pool_geometry returns."""
    kh, kw, sh, sw, ph, pw, dh, dw, OH, OW = geometry
    out = np.empty((planes.shape[0], OH, OW), planes.dtype)
    idx = np.empty(out.shape, index_dtype)
    mod.max_pool2d_forward(planes, out, idx, with_indices=True, scalar_only=scalar_only,
                           stream_indices=stream_indices, kh=kh, kw=kw, sh=sh, sw=sw,
                           ph=ph, pw=pw, dh=dh, dw=dw, num_threads=num_threads)
    return out, idx
