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
from concurrent.futures import ThreadPoolExecutor
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
    """Compile source to exe, under ASan and UBSan where gcc has them (at
    -O1, as their authors advise); return gcc's errors, or None."""
    for opt, extra in (("-O1", ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]),
                       ("-O2", [])):
        r = subprocess.run([cc, opt, *extra, "-std=c99", f"-I{HEADER_DIR}", *flags, str(source),
                            "-o", str(exe), "-lm"], capture_output=True, text=True, env=_env())
        if r.returncode == 0:
            return None
    return f"{source.name} did not compile with {flags}:\n{r.stderr[-2000:]}"


def _cases(items):
    """The (test, width name) pairs of this file's collected tests."""
    return {(it.callspec.params["test"], it.callspec.params["name"]) for it in items
            if getattr(it, "originalname", None) == "test_tiles_match_a_plain_loop"}


@pytest.fixture(scope="module")
def programs(request, tmp_path_factory):
    """Every collected case's test program, compiled in parallel, one gcc a
    CPU (the compiles are most of this file's time): (test, width name) ->
    (executable, gcc's errors or None)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("needs a C compiler on x86-64")
    folder = tmp_path_factory.mktemp("kernel_headers")
    flags = {w[0]: w[1] for w in WIDTHS}
    runnable = {w[0] for w in WIDTHS if w[2] is None or _backend.CPU_FEATURES.get(w[2])}
    jobs = {}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for test, name in sorted(_cases(request.session.items)):
            source = ROOT / "tests" / "c" / f"{test}.c"
            if name not in runnable or not (HEADER_DIR / SOURCES[test]).exists() \
                    or not source.exists():
                continue
            exe = folder / f"{test}-{name.replace(' ', '_')}"
            jobs[test, name] = (exe, pool.submit(_compile, cc, flags[name], source, exe))
    return {case: (exe, job.result()) for case, (exe, job) in jobs.items()}


@pytest.mark.parametrize("test", SOURCES)
@pytest.mark.parametrize("name,flags,feature", WIDTHS, ids=[w[0] for w in WIDTHS])
def test_tiles_match_a_plain_loop(programs, test, name, flags, feature):
    if feature is not None and not _backend.CPU_FEATURES.get(feature):
        pytest.skip(f"this CPU lacks {feature}")
    if (test, name) not in programs:
        pytest.skip(f"needs the source tree (cypool/_kernels/{SOURCES[test]})")
    exe, error = programs[test, name]
    if error is not None:
        pytest.fail(error)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert ": ok (0 bad)" in r.stdout
