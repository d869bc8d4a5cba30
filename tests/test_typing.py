"""The .pyi stubs of the compiled modules match them (mypy.stubtest), and
the package type-checks."""
import os
import subprocess
import sys

import pytest

from cypool import _backend


@pytest.mark.parametrize("isa", _backend.RUNNABLE_ISAS)
def test_stubtest_compiled_modules(isa, tmp_path):
    pytest.importorskip("mypy")
    # Run from an empty folder, and see the cypool the tests import: the
    # installed one, or an in-place build's source tree.
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(_backend.__file__)))
    if os.path.basename(root) not in ("site-packages", "dist-packages"):
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    res = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", f"cypool._kernels_{isa}"],
        capture_output=True, text=True, cwd=tmp_path, env=env,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_stubs_and_marker_are_installed():
    pkg = os.path.dirname(_backend.__file__)
    assert os.path.exists(os.path.join(pkg, "py.typed"))
    for isa in _backend.AVAILABLE_ISAS:
        assert os.path.exists(os.path.join(pkg, f"_kernels_{isa}.pyi"))
