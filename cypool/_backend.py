"""The compiled kernels and how many threads a call gets.

The kernels are built once per instruction-set level (setup.py); at import
the best variant the CPU runs is loaded, as CPUID reports its features
(``_cpu_features``).
The convolution takes it; the max-pool and argmax kernels take the best one
up to AVX2 (``CAPPED``), the AVX-512 variant does not compile them.
``CYPOOL_ISA=baseline`` (or another built level) forces one level, for every
kernel that level compiles.

Every public function goes through here to reach a kernel, so that the
thread policy is the same everywhere:

* ``num_threads=None`` follows OpenMP's default (``OMP_NUM_THREADS`` or a
  threadpoolctl limit);
* a call whose work is small runs on the calling thread alone: waking a
  thread team costs more than a few microseconds of work;
* never more threads than there are independent work items.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import TextIO

import numpy as np

from ._version import __version__

# Instruction-set levels, best first: (name, numpy CPU features it needs).
# x86-64-v3 is AVX, AVX2, BMI1/2, F16C, FMA, LZCNT, MOVBE; older numpy has no
# "X86_V3" key, so the parts are checked instead. x86-64-v4 adds AVX-512
# F, CD, VL, BW and DQ.
_V3 = ("AVX", "AVX2", "F16C", "FMA3", "BMI", "BMI2", "LZCNT", "MOVBE")
LEVELS = (
    # A CYPOOL_NATIVE=1 source build has only this one, made for its machine.
    ("native", ()),
    ("avx512", _V3 + ("AVX512F", "AVX512CD", "AVX512VL", "AVX512BW", "AVX512DQ")),
    ("avx2", _V3),
    ("baseline", ()),
)
# Kernels that run on the best level only up to this one, a forced level
# too: the AVX-512 variant does not compile them (_kernels_avx512.pyx). The
# max-pool and argmax loops are bound by memory and branchless selects, and
# gcc 12's x86-64-v4 code for them was slower than its AVX2 code, while the
# convolution's 16-float register tiles gain from AVX-512
# (bench/results/isa_levels.md).
CAPPED = {
    "max_pool2d_forward": "avx2",
    "max_pool2d_backward": "avx2",
    "max_unpool2d": "avx2",
    "max_unpool2d_backward": "avx2",
    "argmax2d": "avx2",
}
ISA_ENV = "CYPOOL_ISA"


def _numpy_features() -> dict:
    try:
        mod = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # numpy < 2
        mod = importlib.import_module("numpy.core._multiarray_umath")
    return mod.__cpu_features__


def _cpuid_features() -> dict:
    """CPUID's answer, from a variant every CPU of its build runs: the
    portable baseline, or the only variant of a CYPOOL_NATIVE=1 build."""
    for name in ("baseline", "native"):
        if _built(name):
            return load_variant(name).cpu_features()
    return {}


def _cpu_features() -> dict:
    """{feature: bool} for every feature a level needs (numpy's names).

    CPUID and XGETBV decide, where they can be asked (x86-64): they also
    say whether the OS saves AVX and AVX-512 state. numpy is asked as well,
    and a feature it reports absent counts as absent (numpy can be told to
    ignore features, and the tests simulate smaller CPUs that way), but a
    feature numpy does not know never downgrades the choice: numpy 1.x has
    no BMI, BMI2, LZCNT or MOVBE keys, and picking by numpy alone ran the
    baseline kernels on AVX-512 machines. Where CPUID cannot be asked,
    numpy's answer stands."""
    npf = _numpy_features()
    cpu = _cpuid_features()
    feats = {}
    for f in {f for _, need in LEVELS for f in need}:
        feats[f] = (cpu[f] and npf.get(f) is not False) if f in cpu else bool(npf.get(f))
    return feats


def _built(name) -> bool:
    """Whether the variant's module exists, without importing it: a module
    built for a level the CPU lacks may run that level's instructions as it
    is imported (gcc uses AVX-512 moves in the x86-64-v4 module's own
    initialisation), so only a level the CPU runs is ever imported."""
    return importlib.util.find_spec(f"cypool._kernels_{name}") is not None


def load_variant(name: str):
    """The compiled module of variant `name` (only one the CPU runs: see
    _built), its parallel blocks on the process's team (_TEAM)."""
    module = importlib.import_module(f"cypool._kernels_{name}")
    if _TEAM is not None and module not in _ON_TEAM:
        module._use_team(*_TEAM)
        _ON_TEAM.add(module)
    return module


# The thread team every variant module's parallel blocks run on, one per
# process: (table address, affinity moves on, lookout on), set below once
# the chosen module is loaded. CYPOOL_TEAM=libgomp runs them on libgomp's
# team instead of cypool's (_kernels/_team.h); CYPOOL_TEAM_AFFINITY=0 keeps
# cypool's team threads where the scheduler puts them; CYPOOL_TEAM_LOOKOUT=0
# starts no lookout thread.
TEAM_ENV = "CYPOOL_TEAM"
AFFINITY_ENV = "CYPOOL_TEAM_AFFINITY"
LOOKOUT_ENV = "CYPOOL_TEAM_LOOKOUT"
_TEAM = None
_ON_TEAM: set = set()


def missing_features(level: str, feats: dict) -> list:
    """The CPU features (numpy's names) that level needs and feats lacks."""
    return [f for f in dict(LEVELS)[level] if not feats.get(f, False)]


def _choose(feats=None):
    """(name of the chosen level, its module, names of the variants built,
    whether the level was forced), for the CPU features feats (default:
    this CPU's)."""
    built = [name for name, _ in LEVELS if _built(name)]
    if not built:
        raise ImportError("cypool: no compiled kernels found; was the package built?")
    feats = CPU_FEATURES if feats is None else feats
    forced = os.environ.get(ISA_ENV)
    if forced:
        if forced not in built:
            raise ImportError(f"{ISA_ENV}={forced!r}, but this build has only {built}")
        missing = missing_features(forced, feats)
        if missing:  # its code would stop the process with SIGILL
            raise ImportError(f"{ISA_ENV}={forced!r}, but this CPU lacks {', '.join(missing)}")
        return forced, load_variant(forced), built, True
    for name, _ in LEVELS:
        if name in built and not missing_features(name, feats):
            return name, load_variant(name), built, False
    return "baseline", load_variant("baseline"), built, False


CPU_FEATURES = _cpu_features()
ISA, kernels, AVAILABLE_ISAS, _FORCED = _choose()


def _switch(name: str) -> bool:
    """The on/off environment variable name: '1' or unset (or empty) is on,
    '0' off; anything else is refused rather than read as on."""
    value = os.environ.get(name, "1") or "1"
    if value not in ("0", "1"):
        raise ImportError(f"{name}={value!r}: use '0' (off) or '1' (on)")
    return value == "1"


def _team() -> tuple:
    """(table address, affinity on, lookout on) of the process's team, from
    the chosen module and the environment."""
    want = os.environ.get(TEAM_ENV, "cypool") or "cypool"
    if want not in ("cypool", "libgomp"):
        raise ImportError(f"{TEAM_ENV}={want!r}: use 'cypool' or 'libgomp'")
    own, gomp = kernels._team_tables()
    affinity, lookout = _switch(AFFINITY_ENV), _switch(LOOKOUT_ENV)
    if want == "libgomp" and own and not gomp:
        raise ImportError(f"{TEAM_ENV}=libgomp, but libgomp's functions were not found")
    return (gomp if want == "libgomp" else own), affinity, lookout


_TEAM = _team()
for _name in AVAILABLE_ISAS:  # the modules imported so far join it too
    if f"cypool._kernels_{_name}" in sys.modules:
        load_variant(_name)
# The variants built that this CPU runs: the only ones that may be imported.
RUNNABLE_ISAS = [n for n in AVAILABLE_ISAS if not missing_features(n, CPU_FEATURES)]
# Output channels per register tile of the convolutions (the same in every
# variant): weights' channel columns are padded to a multiple of it.
CHANNEL_BLOCK = kernels.channel_block()
_ORDER = [name for name, _ in LEVELS]


def isa_for(name: str) -> str:
    """The instruction-set level whose module runs kernel `name`."""
    cap = CAPPED.get(name)
    if cap is None or _ORDER.index(ISA) >= _ORDER.index(cap):
        return ISA
    # The best level at or below the cap that this CPU runs; a native build
    # has none, and compiles every kernel.
    return next((n for n in _ORDER[_ORDER.index(cap):] if n in RUNNABLE_ISAS), ISA)


def module_for(name: str):
    """The compiled module that runs kernel `name` (see isa_for)."""
    module = load_variant(isa_for(name))
    if module not in _RUN_FROM:
        _RUN_FROM.append(module)
    return module


# The variant modules kernels have run from: the chosen one and, on a CPU
# past a cap (AVX-512), the capped kernels' one too. Each keeps its own
# crowded-spell clock (_omp_shim.h), set by its own kernels' late threads.
_RUN_FROM = [kernels]


def crowded() -> bool:
    """Whether a crowded spell is on in any module kernels run from (see
    team_for). Read from the chosen module alone, a max pool's late thread
    (AVX2 module) never moved an AVX-512 CPU's calls off their team."""
    for m in _RUN_FROM:
        if m.crowded():
            return True
    return False


def every_module() -> list:
    """Every variant module a kernel may run from, loaded now."""
    for name in CAPPED:
        module_for(name)
    return _RUN_FROM


def _last_level_cache() -> int:
    """Bytes of the largest CPU cache (Linux sysfs), or 32 MiB if unknown."""
    best = 0
    folder = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for name in os.listdir(folder):
            with open(os.path.join(folder, name, "size")) as f:
                text = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KM")) * scale)
    except (OSError, ValueError):
        pass
    return best or 32 << 20


LAST_LEVEL_CACHE = _last_level_cache()


def streams(kept: int, write_once: int) -> bool:
    """Whether a call should write its write-once output (max-pool indices,
    read only by the backward pass) with streaming stores, past the caches.

    kept: bytes of the data the call reads and of the outputs the next layer
    reads; write_once: bytes of the write-once output. Streaming pays when
    it is what keeps the rest in the last-level cache: kept fits there, and
    kept plus write_once does not. Below the cache size plain stores win,
    and so they do where nothing stays cached anyway (docs/performance.md).
    """
    return kept <= LAST_LEVEL_CACHE < kept + write_once


# Elements (of input plus output) below which a call runs serially. About
# 20-40 microseconds of single-threaded work on a current x86-64 core.
SERIAL_BELOW = 1 << 16


def parts_for(requested: int, work: int, items: int) -> int:
    """The thread count a kernel call is meant for, outside a crowded spell.

    requested: 0 for OpenMP's default, else the caller's num_threads.
    work: elements the call reads and writes; items: independent work items.
    The kernels that sum per thread (the weight gradients) cut their work
    into this many parts, each summed on its own, whatever team runs them:
    their result is the same for the same thread count, crowded or not.
    """
    if work < SERIAL_BELOW or items <= 1:
        return 1
    n = requested if requested > 0 else kernels.max_threads()
    return max(1, min(n, items))


def team_for(parts: int) -> int:
    """The team that runs a call of `parts` parts now: the calling thread
    alone during a crowded spell. Where the kernels run on libgomp's team
    (builds other than gcc on Linux), a team thread of a recent call started
    late or was held up mid-call, its core taken by other threads (another
    library's spinning pool, another program): libgomp's team waits for such
    a thread at its region's end, for up to a scheduler time slice, where
    the calling thread alone takes at most the serial time. The spell lasts
    10-160 ms (_omp_shim.h; docs/performance.md, "Threads inside real programs").
    cypool's own team (_team.h) runs a late thread's share on the calling
    thread instead, and starts no spells: only cypool._testing.set_crowded
    does."""
    return 1 if parts > 1 and crowded() else parts


def threads_for(requested: int, work: int, items: int) -> int:
    """Thread count for a kernel call (parts_for's, then team_for's)."""
    return team_for(parts_for(requested, work, items))


def work(macs: int, touched: int) -> int:
    """A call's size for threads_for, counting multiply-adds as well as the
    elements touched. A multiply-add costs far less than a memory access
    (16 of them go in one vector instruction): 32 count as one element of
    work, so that a batch-1 call of a small network stays on the calling
    thread (docs/performance.md, Threads)."""
    return macs // 32 + touched


_C_NAMES = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t"}
_specialised: dict = {}


def kernel(name: str, *dtypes: np.dtype):
    """The kernel specialised for these numpy dtypes (its fused types in order).

    Calling the specialisation directly skips Cython's run-time dispatch on
    buffer dtypes, about a microsecond per call: it matters at batch size 1.
    """
    key = (name,) + dtypes if dtypes else name
    fn = _specialised.get(key)
    if fn is None:
        generic = getattr(module_for(name), name)
        if dtypes:
            sig = "|".join(_C_NAMES[d.name] for d in dtypes)
            fn = _specialised[key] = generic.__signatures__[sig]
        else:
            fn = _specialised[key] = generic
    return fn


def padded_columns(a: np.ndarray) -> np.ndarray:
    """a (rows, n) as C-contiguous (rows, n') with zero columns up to a
    multiple of the convolution tiles' channel block: the layout the
    kernels take their weights in."""
    n = a.shape[1]
    npad = -(-n // CHANNEL_BLOCK) * CHANNEL_BLOCK
    if npad == n:
        return np.ascontiguousarray(a)
    out = np.zeros((a.shape[0], npad), dtype=a.dtype)
    out[:, :n] = a
    return out


def _config() -> dict:
    """show_config's answer as a dict (mode="dicts")."""
    import platform
    import sysconfig

    has_omp, omp_version, nthreads = kernels.openmp_info()
    forced = os.environ.get(ISA_ENV)
    gil = getattr(sys, "_is_gil_enabled", None)
    return {
        "cypool": {"version": __version__},
        "kernels": {
            "variant": ISA,
            "chosen_by": f"{ISA_ENV}={forced}" if forced else "CPU features",
            "capped": {name: isa_for(name) for name in CAPPED if isa_for(name) != ISA},
            "built": list(AVAILABLE_ISAS),
            "runnable": list(RUNNABLE_ISAS),
            "not_used": {name: missing_features(name, CPU_FEATURES)
                         for name in _ORDER[:_ORDER.index(ISA)]
                         if name in AVAILABLE_ISAS and missing_features(name, CPU_FEATURES)},
        },
        "openmp": {"found": has_omp, "version": omp_version,
                   "default_threads": nthreads if has_omp else 1,
                   "team": ("none" if not has_omp else
                            "cypool's own" if kernels.team_counts() is not None else "libgomp's"),
                   "team_chosen_by": (f"{TEAM_ENV}={os.environ[TEAM_ENV]}"
                                      if os.environ.get(TEAM_ENV) else "default"),
                   "team_affinity_moves": _TEAM[1],
                   "team_lookout": _TEAM[2]},
        "python": {"version": platform.python_version(),
                   "implementation": platform.python_implementation(),
                   "free_threaded_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
                   "gil_enabled": True if gil is None else bool(gil())},
        "numpy": {"version": np.__version__},
        "machine": {"architecture": platform.machine(), "system": platform.system(),
                    "cpu_features": dict(sorted(CPU_FEATURES.items()))},
    }


def show_config(mode: str = "stdout", *, file: TextIO | None = None) -> dict | None:
    """The kernel variant in use and why, the variants built, the OpenMP
    runtime and the default thread count, the Python and numpy versions.

    mode="stdout" prints them (to file, default sys.stdout) and returns
    None; mode="dicts" returns them as a dict of dicts, as numpy's
    show_config does, for a script or a bug report to read."""
    if not isinstance(mode, str):
        raise TypeError(f"mode must be 'stdout' or 'dicts', not {type(mode).__name__}")
    if mode not in ("stdout", "dicts"):
        raise ValueError(f"mode must be 'stdout' or 'dicts', not {mode!r}")
    cfg = _config()
    if mode == "dicts":
        return cfg
    out = file or sys.stdout
    k, omp, py = cfg["kernels"], cfg["openmp"], cfg["python"]
    how = f"forced by {ISA_ENV}" if k["chosen_by"] != "CPU features" else "chosen from CPU features"
    print(f"cypool kernels: {k['variant']} ({how})", file=out)
    capped = sorted(set(k["capped"].values()))
    if capped:
        print(f"max-pool and argmax kernels: {', '.join(capped)} (faster there than {k['variant']})",
              file=out)
    print(f"variants built: {', '.join(k['built'])}", file=out)
    for name, missing in k["not_used"].items():
        print(f"{name} built but not used: this CPU lacks {', '.join(missing)}", file=out)
    if omp["found"]:
        moves = ("" if omp["team_affinity_moves"] else ", no affinity moves") + (
            "" if omp["team_lookout"] else ", no lookout")
        print(f"OpenMP: yes (_OPENMP {omp['version']}); default threads: {omp['default_threads']}; "
              f"thread team: {omp['team']} ({omp['team_chosen_by']}{moves})", file=out)
    else:
        print("OpenMP: no (serial build); default threads: 1", file=out)
    threading = ("free-threaded build, GIL " + ("on" if py["gil_enabled"] else "off")
                 if py["free_threaded_build"] else "GIL build")
    print(f"cypool {cfg['cypool']['version']}; Python {py['version']} ({py['implementation']}, {threading}); "
          f"numpy {cfg['numpy']['version']}; {cfg['machine']['architecture']}", file=out)
    return None
