"""Every instruction-set variant of the kernels that this build has gives
the same results (the tests elsewhere run the variant chosen at import;
CI also runs them all with CYPOOL_ISA=baseline)."""
import importlib

import numpy as np
import pytest

import cypool
from cypool import _backend
import reference as ref


def test_chosen_variant_is_one_that_was_built():
    assert _backend.ISA in _backend.AVAILABLE_ISAS
    assert "baseline" in _backend.AVAILABLE_ISAS


def test_show_config_reports_the_choice(capsys):
    cypool.show_config()
    out = capsys.readouterr().out
    assert f"cypool kernels: {_backend.ISA}" in out and "OpenMP" in out


@pytest.mark.parametrize("isa", _backend.AVAILABLE_ISAS)
def test_variant_matches_reference(rng, isa):
    mod = importlib.import_module(f"cypool._kernels_{isa}")
    for shape, (k, s, p) in [((2, 3, 13, 17), (2, 2, 0)), ((2, 3, 13, 17), (3, 1, 1)),
                             ((1, 4, 20, 9), (3, 2, 1)), ((2, 2, 11, 12), (4, 3, 2))]:
        for dtype in (np.float32, np.float64):
            x = ref.random_values(rng, shape, dtype, ties=True, specials=True)
            kh, kw, sh, sw, ph, pw, dh, dw, OH, OW = cypool._checks.pool_geometry(
                shape[2], shape[3], k, s, p, 1, False)
            planes = np.ascontiguousarray(x).reshape(-1, *shape[2:])
            out = np.empty((planes.shape[0], OH, OW), x.dtype)
            idx = np.empty(out.shape, np.int64)
            mod.max_pool2d_forward(planes, out, idx, True, False, kh, kw, sh, sw, ph, pw, dh, dw, 2)
            rout, ridx = ref.max_pool2d(x, k, s, p)
            np.testing.assert_array_equal(out.reshape(rout.shape), rout)
            np.testing.assert_array_equal(idx.reshape(ridx.shape), ridx)
            maps = planes.reshape(planes.shape[0], -1)
            vals = np.empty(maps.shape[0], x.dtype)
            coords = np.empty((maps.shape[0], 2), np.int64)
            mod.argmax2d(maps, vals, coords, shape[3], 1, 2)
            flat = maps.argmax(-1)
            np.testing.assert_array_equal(coords[:, 0] * shape[3] + coords[:, 1], flat)
