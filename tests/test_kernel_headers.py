"""The C register tiles of the vector and standard convolutions
(cypool/_kernels/_conv_tiles.h, tests/c/vconv_tiles.c) and the direct stride-1
kernels (cypool/_kernels/_conv_direct.h, tests/c/conv_direct.c) and the tap-major
weight copy (cypool/_kernels/_tap_major.h, tests/c/tap_major.c), compiled on their
own for every vector width the wheels build, against plain loops. The
Python tests run the kernels of the variant this CPU picks; this runs the
others too, the AVX-512 layout included, on any x86-64 CPU."""
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from cypool import _backend

ROOT = Path(__file__).resolve().parents[1]
HEADER_DIR = ROOT / "cypool" / "_kernels"
SOURCES = {"vconv_tiles": "_conv_tiles.h", "conv_direct": "_conv_direct.h",  # test: header
           "conv_ovec": "_conv_ovec.h", "conv_winograd": "_conv_winograd.h",
           "tap_major": "_tap_major.h"}

# (name, extra flags, CPU feature needed to run it): gcc lowers the 64-byte
# vectors of the AVX-512 layout to the instructions it is allowed.
WIDTHS = [("sse2", [], None), ("avx2", ["-mavx2", "-mfma"], "AVX2"),
          ("avx512 layout", ["-D__AVX512F__", "-Wno-psabi"], None)]


def _env():
    """This environment without a preloaded sanitizer runtime
    (tools/sanitize.sh runs the suite so): gcc and the test program
    bring their own."""
    return {k: v for k, v in os.environ.items()
            if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS")}


def _compile(cc, flags, source, exe):
    base = [cc, "-O2", "-std=c99", f"-I{HEADER_DIR}", *flags, str(source), "-o", str(exe), "-lm"]
    for extra in (["-fsanitize=address,undefined", "-fno-sanitize-recover=all"], []):
        r = subprocess.run(base[:2] + extra + base[2:], capture_output=True, text=True, env=_env())
        if r.returncode == 0:
            return
    pytest.fail(f"{source.name} did not compile with {flags}:\n{r.stderr[-2000:]}")


@pytest.mark.parametrize("test", SOURCES)
@pytest.mark.parametrize("name,flags,feature", WIDTHS, ids=[w[0] for w in WIDTHS])
def test_tiles_match_a_plain_loop(tmp_path, test, name, flags, feature):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("needs a C compiler on x86-64")
    source = ROOT / "tests" / "c" / f"{test}.c"
    if not (HEADER_DIR / SOURCES[test]).exists() or not source.exists():
        pytest.skip(f"needs the source tree (cypool/_kernels/{SOURCES[test]})")
    if feature is not None and not _backend.CPU_FEATURES.get(feature):
        pytest.skip(f"this CPU lacks {feature}")
    exe = tmp_path / test
    _compile(cc, flags, source, exe)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert ": ok (0 bad)" in r.stdout
