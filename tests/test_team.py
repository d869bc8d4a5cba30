"""cypool's own thread team (cypool/_kernels/_team.h, tests/c/team.c),
compiled on its own with gcc -fopenmp: every thread number of a parallel
block runs once, a held team thread does not hold the block's end, and
regions from two threads at once or from a forked child come out whole.
Run plain, under AddressSanitizer and UBSan, and under ThreadSanitizer.
And the condition that makes the team sound for the kernels: their
modules need nothing else of libgomp."""
import json
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
    """This environment for a compiled test program: without a preloaded
    sanitizer runtime (tools/sanitize.sh runs the suite so; the program
    brings its own), and ThreadSanitizer allowed to go on
    in the forked child, whose regions start threads of their own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "LSAN_OPTIONS", "UBSAN_OPTIONS", "TSAN_OPTIONS")}
    env["TSAN_OPTIONS"] = "die_after_fork=0 halt_on_error=1"
    return env


def _python_env():
    """The environment for a Python subprocess that imports cypool: this
    one, a preloaded sanitizer runtime included (a sanitized cypool needs
    it)."""
    return dict(os.environ)


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
           f"-I{HEADER_DIR}", str(SOURCE), "-o", str(exe), "-ldl"]
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


_HANDOFF = """
import ctypes, json, time
import numpy as np, cypool
from cypool._backend import module_for
x = np.random.default_rng(0).standard_normal((4, 512, 14, 14)).astype(np.float32)
x[:, :, ::3, ::2] = 7.0  # ties
want = cypool.max_pool2d(x, 2, return_indices=True, num_threads=1)
pool = module_for("max_pool2d_forward")
# The libgomp cypool's modules use, as torch or Numba would share it.
path = [ln.split()[-1] for ln in open("/proc/self/maps") if "libgomp" in ln.split()[-1]][0]
gomp = ctypes.CDLL(path)
nothing = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda p: None)
gomp.GOMP_parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint]
before, handed, tries = pool.team_counts(), 0, 0
while handed < 3 and tries < 2000:  # a busy machine refuses most (/proc/loadavg)
    tries += 1
    time.sleep(0.002)                           # cypool's team threads asleep
    gomp.GOMP_parallel(ctypes.cast(nothing, ctypes.c_void_p), None, 2, 0)  # libgomp's spinning
    got = cypool.max_pool2d(x, 2, return_indices=True, num_threads=2)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    handed = pool.team_counts()["handed"] - before["handed"]
import os
pid = os.fork()  # a child's libgomp has no threads: its calls stay on cypool's team
if pid == 0:
    c0 = pool.team_counts()["handed"]
    for _ in range(20):
        time.sleep(0.002)
        got = cypool.max_pool2d(x, 2, return_indices=True, num_threads=2)
        ok = all(np.array_equal(a, b) for a, b in zip(got, want))
        if not ok or pool.team_counts()["handed"] != c0:
            os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(json.dumps({"handed": handed, "tries": tries, "path": path, "child": status}))
"""


def test_a_region_goes_to_libgomps_spinning_pool(tmp_path):
    # Right after a region of libgomp's (torch's or Numba's, where the
    # runtime is shared), its pool's threads spin: a call whose team
    # threads sleep is handed to them, and comes out the same. A forked
    # child never hands a call to its libgomp.
    import sys
    from cypool._backend import kernels
    if kernels._team_tables()[0] == 0 or platform.system() != "Linux":
        pytest.skip("the parallel blocks run on libgomp's team in this build")
    env = {k: v for k, v in _python_env().items() if k != "CYPOOL_TEAM"}
    r = subprocess.run([sys.executable, "-c", _HANDOFF], capture_output=True, text=True,
                       env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    assert got["handed"] >= 3 and got["child"] == 0, got


_LOOKOUT = """
import json, os, time
import numpy as np, cypool
from cypool._backend import module_for
x = np.random.default_rng(0).standard_normal((32, 5, 64, 64)).astype(np.float32)
x[:, :, 5:9, 7:11] = 9.0  # ties
want = cypool.argmax2d(x, num_threads=1)
mod = module_for("argmax2d")
a = np.ones(1 << 16, np.float32)
before = mod.team_counts()
for _ in range(50):
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:  # single-threaded work: the team threads go to sleep
        np.multiply(a, 1.0, out=a)
    assert np.array_equal(cypool.argmax2d(x, num_threads=2), want)
after = mod.team_counts()
look = []
for tid in os.listdir("/proc/self/task"):
    try:
        if open(f"/proc/self/task/{tid}/comm").read().strip() == "cypool-lookout":
            look.append(int(tid))
    except OSError:
        pass
print(json.dumps({"woke": after["lookout"] - before["lookout"], "lookouts": len(look),
                  "idle": [os.sched_getscheduler(t) == os.SCHED_IDLE for t in look]}))
"""


@pytest.mark.thread_unsafe(reason="counts one process's team threads")
@pytest.mark.parametrize("lookout", ["1", "0"])
def test_the_lookout_wakes_the_team_at_idle_priority(tmp_path, lookout):
    # Calls 1 ms apart find the team threads asleep: the lookout, one
    # thread per process spinning at SCHED_IDLE (no CPU taken from any
    # other thread), wakes them, and the results are the same. libgomp's
    # pool sleeps at once (passive), so that no call is handed to it.
    # CYPOOL_TEAM_LOOKOUT=0 starts none, and the calls are still right.
    import sys
    from cypool._backend import kernels
    if kernels._team_tables()[0] == 0 or platform.system() != "Linux":
        pytest.skip("the parallel blocks run on libgomp's team in this build")
    env = {k: v for k, v in _python_env().items() if k != "CYPOOL_TEAM"}
    env["OMP_WAIT_POLICY"] = "passive"
    env["CYPOOL_TEAM_LOOKOUT"] = lookout
    r = subprocess.run([sys.executable, "-c", _LOOKOUT], capture_output=True, text=True,
                       env=env, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    if lookout == "1":
        assert got["lookouts"] == 1 and got["idle"] == [True], got
        assert got["woke"] >= 1, got
    else:
        assert got["lookouts"] == 0 and got["woke"] == 0, got


_PROBE = """
import json
import numpy as np, cypool
from cypool._backend import TEAM_ENV, every_module, kernels, module_for
from cypool._testing import set_crowded
x = np.random.default_rng(0).standard_normal((8, 64, 56, 56)).astype(np.float32)
w = np.ones((8, 64, 3, 3), np.float32)
set_crowded(False)
cypool.max_pool2d(x, 2, num_threads=2)
pool = module_for("max_pool2d_forward")
set_crowded(False)
cypool.conv2d(x, w, padding=1, num_threads=2)
print(json.dumps({"counts": [m.team_counts() for m in every_module()],
                  "sizes": [pool.last_team_size(), kernels.last_team_size()],
                  "openmp": cypool.show_config("dicts")["openmp"]}))
"""


@pytest.mark.parametrize("team", ["cypool", "libgomp"])
def test_one_team_per_process_or_libgomps(team, tmp_path):
    # Every variant module's blocks run on one team: the chosen module's
    # (the max pool's AVX2 module and the convolution's AVX-512 module count
    # the same regions), or libgomp's with CYPOOL_TEAM=libgomp, where the
    # calls still run on two threads. A fresh process: the team is chosen
    # at import.
    import sys
    from cypool._backend import kernels
    if kernels._team_tables()[0] == 0:
        pytest.skip("the parallel blocks run on libgomp's team in this build")
    env = dict(_python_env(), CYPOOL_TEAM=team)
    # (from outside the checkout, so that the installed cypool answers)
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.splitlines()[-1])
    counts, config = got["counts"], got["openmp"]
    assert counts and got["sizes"] == [2, 2], got
    if team == "libgomp":
        assert all(c is None for c in counts), got
        assert config["team"] == "libgomp's" and config["team_chosen_by"] == "CYPOOL_TEAM=libgomp"
    else:
        assert counts[0]["regions"] == 2 and config["team"] == "cypool's own", got
        assert all(c == counts[0] for c in counts), got  # one team, counted once


@pytest.mark.parametrize("name, value", [("CYPOOL_TEAM", "openmp"), ("CYPOOL_TEAM_LOOKOUT", "off"),
                                         ("CYPOOL_TEAM_AFFINITY", "false")])
def test_a_wrong_team_setting_is_refused(tmp_path, name, value):
    import sys
    env = dict(_python_env(), **{name: value})
    r = subprocess.run([sys.executable, "-c", "import cypool"], capture_output=True, text=True,
                       env=env, timeout=300, cwd=tmp_path)
    assert r.returncode != 0 and f"{name}={value!r}" in r.stderr, r.stderr[-2000:]
