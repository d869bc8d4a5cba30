"""Every instruction-set variant of the kernels that this build has gives
the same results (the tests elsewhere run the variant chosen at import;
CI also runs them all with CYPOOL_ISA=baseline)."""
import importlib
import json
import os
import platform
import subprocess
import sys

import numpy as np
import pytest

import cypool
from cypool import _backend
import reference as ref
from helpers import cypool_subprocess_env, pool_kernel


def test_chosen_variant_is_one_that_was_built():
    assert _backend.ISA in _backend.AVAILABLE_ISAS
    # Every portable build has the baseline; a CYPOOL_NATIVE=1 build has
    # only its native variant.
    assert "baseline" in _backend.AVAILABLE_ISAS or _backend.AVAILABLE_ISAS == ["native"]


def test_show_config_reports_the_choice(capsys):
    cypool.show_config()
    out = capsys.readouterr().out
    assert f"cypool kernels: {_backend.ISA}" in out and "OpenMP" in out
    assert f"numpy {np.__version__}" in out and platform.python_version() in out
    team = cypool.show_config(mode="dicts")["openmp"]["team"]
    assert team == "none" or f"thread team: {team}" in out  # the README says it prints the team


def test_show_config_dicts_say_what_the_text_says(capsys):
    cfg = cypool.show_config(mode="dicts")
    assert capsys.readouterr().out == ""
    k = cfg["kernels"]
    assert k["variant"] == _backend.ISA and k["built"] == _backend.AVAILABLE_ISAS
    assert set(k["runnable"]) <= set(k["built"]) and k["variant"] in k["runnable"]
    assert k["chosen_by"] == ("CPU features" if not _backend._FORCED
                              else f"CYPOOL_ISA={os.environ['CYPOOL_ISA']}")
    for name, isa in k["capped"].items():
        assert isa == _backend.isa_for(name) != _backend.ISA
    has_omp, version, threads = _backend.kernels.openmp_info()
    own = _backend.kernels.team_counts() is not None
    assert cfg["openmp"] == {"found": has_omp, "version": version,
                             "default_threads": threads if has_omp else 1,
                             "team": ("none" if not has_omp else "cypool's own" if own
                                      else "libgomp's"),
                             "team_chosen_by": (f"CYPOOL_TEAM={os.environ['CYPOOL_TEAM']}"
                                                if os.environ.get("CYPOOL_TEAM") else "default"),
                             "team_affinity_moves": os.environ.get("CYPOOL_TEAM_AFFINITY") != "0",
                             "team_lookout": os.environ.get("CYPOOL_TEAM_LOOKOUT") != "0"}
    assert cfg["python"]["version"] == platform.python_version()
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    assert cfg["python"]["gil_enabled"] is gil
    assert cfg["numpy"]["version"] == np.__version__
    assert cfg["cypool"]["version"] == cypool.__version__
    assert cfg["machine"]["architecture"] == platform.machine()
    assert cfg["machine"]["cpu_features"] == _backend.CPU_FEATURES
    json.dumps(cfg)  # plain data, for a bug report


@pytest.mark.parametrize("mode, error", [("dict", ValueError), ("", ValueError), (1, TypeError),
                                         (None, TypeError)])
def test_show_config_refuses_an_unknown_mode(mode, error):
    with pytest.raises(error, match="mode"):
        cypool.show_config(mode)


@pytest.mark.parametrize("isa", [isa for isa in _backend.RUNNABLE_ISAS
                                 if hasattr(_backend.load_variant(isa), "max_pool2d_forward")])
def test_variant_matches_reference(rng, isa):
    mod = importlib.import_module(f"cypool._kernels_{isa}")
    for shape, (k, s, p) in [((2, 3, 13, 17), (2, 2, 0)), ((2, 3, 13, 17), (3, 1, 1)),
                             ((1, 4, 20, 9), (3, 2, 1)), ((2, 2, 11, 12), (4, 3, 2))]:
        for dtype in (np.float32, np.float64):
            x = ref.random_values(rng, shape, dtype, ties=True, specials=True)
            geometry = cypool._geometry.pool_geometry(shape[2], shape[3], k, s, p, 1, False)
            planes = np.ascontiguousarray(x).reshape(-1, *shape[2:])
            out, idx = pool_kernel(mod, planes, geometry, num_threads=2)
            rout, ridx = ref.max_pool2d(x, k, s, p)
            np.testing.assert_array_equal(out.reshape(rout.shape), rout)
            np.testing.assert_array_equal(idx.reshape(ridx.shape), ridx)
            maps = planes.reshape(planes.shape[0], -1)
            vals = np.empty(maps.shape[0], x.dtype)
            coords = np.empty((maps.shape[0], 2), np.int64)
            mod.argmax2d(maps, vals, coords, W=shape[3], segments=1, num_threads=2)
            flat = maps.argmax(-1)
            np.testing.assert_array_equal(coords[:, 0] * shape[3] + coords[:, 1], flat)


def test_capped_kernels_run_at_most_avx2_even_when_forced():
    for name in _backend.CAPPED:
        level = _backend.isa_for(name)
        assert level in _backend.RUNNABLE_ISAS and hasattr(_backend.load_variant(level), name)
        assert level == ("avx2" if _backend.ISA == "avx512" else _backend.ISA)
    assert _backend.isa_for("vector_conv2d_forward") == _backend.ISA


def test_only_the_avx512_variant_leaves_the_pooling_family_out():
    # A family compiles only into the variants that run it (setup.py): the
    # AVX-512 module has the convolution and not the capped kernels.
    for isa in _backend.RUNNABLE_ISAS:
        mod = _backend.load_variant(isa)
        assert hasattr(mod, "conv2d_forward") and hasattr(mod, "zono_relu")
        for name in _backend.CAPPED:
            assert hasattr(mod, name) is (isa != "avx512")


@pytest.mark.parametrize("isa", _backend.RUNNABLE_ISAS)
def test_variant_convolution_matches_reference(rng, isa, monkeypatch):
    # Every tile width of every variant: E from 1 to past three 16-float
    # vectors, with ends of 1, 8 and 16 values; O not a multiple of 4.
    # Stride 1 at E = 1 and small E: conv2d's direct kernels (rows of 3, 13
    # and 21 outputs: every tile width of 4-, 8- and 16-float vectors).
    monkeypatch.setattr(_backend, "isa_for", lambda name: isa)
    monkeypatch.setattr(_backend, "_specialised", {})
    cases = [(E, 6, (2, 1), (1, 1), (1, 2)) for E in (1, 3, 8, 9, 17, 24, 40, 48, 57, 64, 105)]
    cases += [(E, W, (1, 1), (0, 1), (1, 1)) for E in (1, 2) for W in (2, 12, 20)]
    for E, W, *args in cases:
        for dtype in (np.float32, np.float64):
            x = rng.standard_normal((2, 3, 7, W, E)).astype(dtype)
            w = rng.standard_normal((6, 3, 3, 2)).astype(dtype)
            b = rng.standard_normal(6).astype(dtype)
            geo = dict(zip(("stride", "padding", "dilation"), args))
            out = cypool.vector_conv2d(x, w, b, **geo)
            x64, w64 = x.astype(np.float64), w.astype(np.float64)
            tol = dict(rtol=2e-4, atol=2e-4) if dtype == np.float32 else dict(rtol=1e-10, atol=1e-10)
            np.testing.assert_allclose(out, ref.vector_conv2d(x64, w64, b.astype(np.float64), *args), **tol)
            g = rng.standard_normal(out.shape).astype(dtype)
            got = cypool.vector_conv2d_backward(g, x, w, **geo)
            want = ref.vector_conv2d_backward(g.astype(np.float64), x64, w64, *args)
            for a, b_ in zip(got, want):
                np.testing.assert_allclose(a, b_, **tol)


def test_forcing_a_level_the_cpu_lacks_is_refused(monkeypatch):
    # CYPOOL_ISA=avx2 on a CPU without AVX2 must not load code that would
    # stop the process with SIGILL: _choose raises ImportError naming what
    # the CPU lacks, and takes the level when the CPU has it.
    if "avx2" not in _backend.AVAILABLE_ISAS:
        pytest.skip("no AVX2 variant in this build")
    monkeypatch.setenv(_backend.ISA_ENV, "avx2")
    sse_only = {f: False for f in dict(_backend.LEVELS)["avx2"]}
    with pytest.raises(ImportError, match="CYPOOL_ISA=.avx2., but this CPU lacks AVX, AVX2"):
        _backend._choose(sse_only)
    name, _, _, forced = _backend._choose(dict(sse_only, **{f: True for f in sse_only}))
    assert (name, forced) == ("avx2", True)


def test_forced_level_error_names_the_variable(monkeypatch):
    monkeypatch.setenv(_backend.ISA_ENV, "avx512")
    if "avx512" not in _backend.AVAILABLE_ISAS:
        pytest.skip("no AVX-512 variant in this build")
    with pytest.raises(ImportError, match="CYPOOL_ISA=.avx512., but this CPU lacks .*AVX512F"):
        _backend._choose({"AVX2": True})


# Import cypool in a fresh process whose numpy reports the CPU without some
# features (numpy's feature dict is patched before cypool reads it), then
# list the kernel modules that were imported and the level chosen.
_LACKING = """
import sys
import numpy as np
try:
    feats = np._core._multiarray_umath.__cpu_features__
except AttributeError:
    feats = np.core._multiarray_umath.__cpu_features__
for f in sys.argv[1:]:
    feats[f] = False
import cypool
from cypool import _backend
x = np.arange(2 * 3 * 8 * 8, dtype=np.float32).reshape(2, 3, 8, 8)
out, idx = cypool.max_pool2d(x, 3, 1, 1, return_indices=True)
assert out.shape == (2, 3, 8, 8)
print(_backend.ISA, sorted(m for m in sys.modules if m.startswith("cypool._kernels_")))
"""


@pytest.mark.parametrize("lacks", [("AVX512F",), ("AVX2", "AVX512F")])
def test_import_never_loads_a_variant_the_cpu_lacks(lacks, tmp_path):
    # Importing the x86-64-v4 module runs AVX-512 instructions (gcc uses
    # them in its initialisation), so on a CPU without them even importing
    # it to see whether it was built stops the process with SIGILL.
    res = subprocess.run([sys.executable, "-c", _LACKING, *lacks], capture_output=True, text=True,
                         env=cypool_subprocess_env(drop=(_backend.ISA_ENV,)), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    isa, loaded = res.stdout.split(" ", 1)
    if _backend.AVAILABLE_ISAS == ["native"]:
        assert isa == "native"
        return
    assert isa == ("avx2" if lacks == ("AVX512F",) and "avx2" in _backend.AVAILABLE_ISAS
                   else "baseline")
    for level in ("avx512", "avx2"):
        if _backend.missing_features(level, {f: f not in lacks for f in dict(_backend.LEVELS)[level]}):
            assert f"cypool._kernels_{level}" not in loaded


# numpy 1.x reports no BMI, BMI2, LZCNT or MOVBE: drop those keys from
# numpy's feature dict before cypool is imported, and print what it chose.
_OLD_NUMPY = """
import numpy as np
try:
    feats = np._core._multiarray_umath.__cpu_features__
except AttributeError:
    feats = np.core._multiarray_umath.__cpu_features__
for f in ("BMI", "BMI2", "LZCNT", "MOVBE"):
    feats.pop(f, None)
from cypool import _backend
print(_backend.ISA)
"""


def test_a_numpy_that_lacks_feature_keys_never_downgrades(tmp_path):
    res = subprocess.run([sys.executable, "-c", _OLD_NUMPY], capture_output=True, text=True,
                         env=cypool_subprocess_env(drop=(_backend.ISA_ENV,)), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    best = next(n for n, _ in _backend.LEVELS
                if n in _backend.AVAILABLE_ISAS and not _backend.missing_features(n, _backend.CPU_FEATURES))
    assert res.stdout.strip() == best


def test_cpuid_agrees_with_numpy_where_numpy_knows():
    cpu = _backend._cpuid_features()
    if not cpu:
        pytest.skip("CPUID cannot be asked here (not x86-64)")
    npf = _backend._numpy_features()
    known = [f for f in cpu if npf.get(f) is not None]
    assert known, "numpy reports none of the features cypool asks CPUID for"
    assert {f: cpu[f] for f in known} == {f: bool(npf[f]) for f in known}
    # The level CPUID allows is the one chosen, unless forced.
    if not _backend._FORCED:
        assert not _backend.missing_features(_backend.ISA, cpu)


def test_show_config_names_what_a_better_level_lacks(monkeypatch, capsys):
    if "avx512" not in _backend.AVAILABLE_ISAS or "avx2" not in _backend.AVAILABLE_ISAS:
        pytest.skip("needs the AVX2 and AVX-512 variants")
    # Every feature present but two, whatever this CPU has.
    feats = dict(dict.fromkeys(_backend.CPU_FEATURES, True), AVX512F=False, AVX512BW=False)
    monkeypatch.setattr(_backend, "CPU_FEATURES", feats)
    monkeypatch.setattr(_backend, "ISA", "avx2")
    cypool.show_config()
    out = capsys.readouterr().out
    assert "avx512 built but not used: this CPU lacks AVX512F, AVX512BW" in out
