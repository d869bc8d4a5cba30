"""cypool's own thread team (cypool/_kernels/_team.h, tests/c/team.c),
compiled on its own with gcc -fopenmp: every thread number of a parallel
block runs once, a held team thread does not hold the block's end, and
regions from two threads at once or from a forked child come out whole.
Run plain, under AddressSanitizer and UBSan, and under ThreadSanitizer.
And the condition that makes the team sound for the kernels: their
modules need nothing else of libgomp."""
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADER_DIR = ROOT / "cypool" / "_kernels"
SOURCE = ROOT / "tests" / "c" / "team.c"

SANITIZERS = {"plain": [], "asan+ubsan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
              "tsan": ["-fsanitize=thread"]}


def _env():
    """This environment without a preloaded sanitizer runtime
    (tools/sanitize.sh runs the suite so); ThreadSanitizer allowed to go on
    in the forked child, whose regions start threads of their own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS")}
    env["TSAN_OPTIONS"] = "die_after_fork=0 halt_on_error=1"
    return env


@pytest.mark.thread_unsafe(reason="times a compiled program on every core")
@pytest.mark.parametrize("sanitizer", SANITIZERS)
def test_team_runs_every_thread_number_once(tmp_path, sanitizer):
    cc = shutil.which("gcc")
    if cc is None or platform.system() != "Linux":
        pytest.skip("needs gcc on Linux (the team is built only there)")
    if not SOURCE.exists() or not (HEADER_DIR / "_team.h").exists():
        pytest.skip("needs the source tree (cypool/_kernels/_team.h)")
    exe = tmp_path / "team"
    cmd = [cc, "-O1", "-g", "-std=c99", "-fopenmp", "-pthread", *SANITIZERS[sanitizer],
           f"-I{HEADER_DIR}", str(SOURCE), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    if r.returncode != 0:
        if sanitizer != "plain":
            pytest.skip(f"gcc cannot build with {sanitizer} here")
        pytest.fail(f"team.c did not compile:\n{r.stderr[-2000:]}")
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, env=_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "team: ok (0 bad)" in r.stdout
    assert "WARNING: ThreadSanitizer" not in r.stderr, r.stderr[-3000:]


def test_kernel_modules_need_nothing_else_of_libgomp():
    # The team runs a parallel block's thread numbers as independent
    # tasks: sound only while no block uses a barrier, a critical section
    # or a worksharing loop. Those would show as undefined GOMP_ symbols;
    # GOMP_parallel and the thread number functions are the module's own.
    from cypool import _backend
    nm = shutil.which("nm")
    if nm is None or platform.system() != "Linux":
        pytest.skip("needs nm on Linux")
    mods = [m for m in _backend.every_module() if m.team_counts() is not None]
    if not mods:
        pytest.skip("the parallel blocks run on libgomp's team in this build")
    for m in mods:
        r = subprocess.run([nm, "-D", "--undefined-only", m.__file__], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        needed = {line.split()[-1].split("@")[0] for line in r.stdout.splitlines() if line.strip()}
        gomp = {s for s in needed if s.startswith("GOMP_")}
        assert not gomp, f"{m.__name__} needs {sorted(gomp)} from libgomp"
        assert not needed & {"omp_get_thread_num", "omp_get_num_threads"}, m.__name__
