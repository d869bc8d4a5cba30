"""The C register tiles of the vector and standard convolutions
(cypool/_vconv_kernel.h), compiled on their own for every vector width the
wheels build, against a plain loop (tests/c/vconv_tiles.c). The Python
tests run the tiles of the variant this CPU picks; this runs the others
too, the AVX-512 layout included, on any x86-64 CPU."""
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

from cypool import _backend

ROOT = Path(__file__).resolve().parents[1]
HEADER_DIR = ROOT / "cypool"
SOURCE = ROOT / "tests" / "c" / "vconv_tiles.c"

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


def _compile(cc, flags, exe):
    base = [cc, "-O2", "-std=c99", f"-I{HEADER_DIR}", *flags, str(SOURCE), "-o", str(exe), "-lm"]
    for extra in (["-fsanitize=address,undefined", "-fno-sanitize-recover=all"], []):
        r = subprocess.run(base[:2] + extra + base[2:], capture_output=True, text=True, env=_env())
        if r.returncode == 0:
            return
    pytest.fail(f"{SOURCE.name} did not compile with {flags}:\n{r.stderr[-2000:]}")


@pytest.mark.parametrize("name,flags,feature", WIDTHS, ids=[w[0] for w in WIDTHS])
def test_tiles_match_a_plain_loop(tmp_path, name, flags, feature):
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("needs a C compiler on x86-64")
    if not (HEADER_DIR / "_vconv_kernel.h").exists() or not SOURCE.exists():
        pytest.skip("needs the source tree (cypool/_vconv_kernel.h)")
    if feature is not None and not _backend.CPU_FEATURES.get(feature):
        pytest.skip(f"this CPU lacks {feature}")
    exe = tmp_path / "vconv_tiles"
    _compile(cc, flags, exe)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert ": ok (0 bad)" in r.stdout
