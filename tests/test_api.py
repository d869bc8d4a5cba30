"""The public modules export what they document: every name a public
module defines (a function, class or constant of its own) is in its
__all__ or starts with an underscore, and every name in __all__ exists."""
import importlib
import types

import pytest

PUBLIC = ["cypool", "cypool.pooling", "cypool.argmax", "cypool.conv", "cypool.vector_conv",
          "cypool.zonotope", "cypool.layers", "cypool.verify"]


@pytest.mark.parametrize("name", PUBLIC + ["cypool.dask"])
def test_public_modules_define_only_their_all(name):
    if name == "cypool.dask":
        pytest.importorskip("dask")
    m = importlib.import_module(name)
    exported = set(m.__all__)
    assert all(hasattr(m, k) for k in exported)
    stray = [k for k, v in vars(m).items()
             if not k.startswith("_") and k not in exported and not isinstance(v, types.ModuleType)
             and getattr(v, "__module__", name) == name]
    assert stray == [], f"{name} defines {stray} outside its __all__"
