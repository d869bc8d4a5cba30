"""Helpers shared by the tests (fixtures live in conftest.py)."""
import os

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
