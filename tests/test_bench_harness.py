"""The bench harness gives every peer its own speed: after Numba's omp
layer launches, OpenMP nesting is off again in every libgomp the process
holds (Numba turns it on, and torch's float64 convolutions then
oversubscribe the cores when they share cypool's libgomp)."""
import json
import os
import subprocess
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "bench")

PROBE = """
import ctypes, json, sys
sys.path.insert(0, {bench!r})
import cypool  # first, as the benches import it: its libgomp is the one torch binds
import _harness
import numba
numba.set_num_threads(1)  # launches the layer, which turns nesting on
before = {{p: ctypes.CDLL(p).omp_get_max_active_levels() for p in _harness._loaded_libgomps()}}
_harness.set_threads(1)
after = {{p: ctypes.CDLL(p).omp_get_max_active_levels() for p in _harness._loaded_libgomps()}}
print(json.dumps([numba.threading_layer(), before, after]))
"""


def test_numba_nesting_is_undone():
    pytest.importorskip("numba", reason="numba (cypool[bench]) not installed")
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/maps")
    out = subprocess.run([sys.executable, "-c", PROBE.format(bench=BENCH)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    layer, before, after = json.loads(out.stdout.strip().splitlines()[-1])
    if layer != "omp":
        pytest.skip(f"Numba runs its {layer} layer here, which does not touch OpenMP")
    assert after and all(v == 1 for v in after.values()), after
    assert any(v > 1 for v in before.values()), before  # the probe saw what it undoes
