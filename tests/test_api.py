"""The public modules export what they document: every name a public
module defines (a function, class or constant of its own) is in its
__all__ or starts with an underscore, and every name in __all__ exists."""
import importlib
import types

import pytest

PUBLIC = ["cypool", "cypool.pooling", "cypool.argmax", "cypool.conv", "cypool.vector_conv",
          "cypool.zonotope", "cypool.layers", "cypool.verify"]


@pytest.mark.parametrize("name", PUBLIC + ["cypool.dask", "cypool.torch"])
def test_public_modules_define_only_their_all(name):
    if name in ("cypool.dask", "cypool.torch"):
        pytest.importorskip(name.split(".")[1])
    m = importlib.import_module(name)
    exported = set(m.__all__)
    assert all(hasattr(m, k) for k in exported)
    stray = [k for k, v in vars(m).items()
             if not k.startswith("_") and k not in exported and not isinstance(v, types.ModuleType)
             and getattr(v, "__module__", name) == name]
    assert stray == [], f"{name} defines {stray} outside its __all__"


def _imports():
    """{module: the cypool modules it imports, at any depth of its code}."""
    import ast
    import os

    import cypool

    root = os.path.dirname(cypool.__file__)
    graph = {}
    for folder, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".py"):
                continue
            rel = os.path.relpath(os.path.join(folder, f), os.path.dirname(root))[:-3].replace(os.sep, ".")
            name = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
            package = name if f == "__init__.py" else name.rpartition(".")[0]
            deps = set()
            for node in ast.walk(ast.parse(open(os.path.join(folder, f)).read())):
                if isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        parts = package.split(".")
                        base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
                    targets = [base] + [f"{base}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                else:
                    continue
                deps |= {t for t in targets if t.startswith("cypool")}
            graph[name] = deps
    return {k: {d for d in v if d in graph and d != k} for k, v in graph.items()}


def test_no_import_cycle():
    graph = _imports()
    assert "cypool.zonotope._network" in graph
    state = {}

    def visit(m, path):
        state[m] = "open"
        for d in sorted(graph[m]):
            if d == "cypool" or (m.startswith(d + ".") and d != m):
                continue  # a package importing its own parts, or a part its package's __init__
            if state.get(d) == "open":
                raise AssertionError(" -> ".join(path + [d]))
            if d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
