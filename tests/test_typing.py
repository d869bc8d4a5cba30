"""The .pyi stubs of the compiled modules match them (mypy.stubtest), and
the package type-checks."""
import os
import subprocess
import sys

import pytest

from cypool import _backend
from helpers import cypool_subprocess_env


def test_stubtest_compiled_modules(tmp_path):
    # one stubtest run for every module: mypy's analysis of numpy, most of
    # each run's time, is then made once
    pytest.importorskip("mypy")
    modules = [f"cypool._kernels_{isa}" for isa in _backend.RUNNABLE_ISAS]
    res = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", *modules],
        capture_output=True, text=True, cwd=tmp_path, env=cypool_subprocess_env(),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"no issues found in {len(modules)} module" in res.stdout, res.stdout


def test_stubs_and_marker_are_installed():
    pkg = os.path.dirname(_backend.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    for isa in _backend.AVAILABLE_ISAS:
        assert os.path.exists(os.path.join(pkg, f"_kernels_{isa}.pyi"))
