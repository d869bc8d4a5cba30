"""The command line, in VNN-COMP's form.

One instance::

    python -m cypool.verify NET.onnx SPEC.vnnlib [--timeout S] [--out RESULT]

A benchmark folder's ``instances.csv`` (rows ``net,spec,timeout``, paths
relative to the file), in order, or one task per instance on a Dask
cluster (``--scheduler ADDRESS``, or ``--local-cluster N`` workers)::

    python -m cypool.verify --instances DIR/instances.csv [--out-dir DIR] [--scheduler A]

The result file holds ``holds``, ``violated`` (then the counterexample as
VNN-COMP writes it: ``((X_0 v) ... (Y_0 v) ...)``), ``unknown`` or
``timeout``. A whole folder prints one CSV line per instance (net, spec,
result, seconds) to standard output.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

from ._check import check
from ._onnx import load_onnx
from ._vnnlib import read_vnnlib

__all__ = ["main", "run_instance", "result_text", "read_instances"]


def result_text(res) -> str:
    """A Result as VNN-COMP's result file."""
    if res.status == "violated":
        x, y = res.counterexample
        lines = [f"(X_{i} {float(v)!r})" for i, v in enumerate(x.reshape(-1))]
        lines += [f"(Y_{i} {float(v)!r})" for i, v in enumerate(y.reshape(-1))]
        return "violated\n(" + "\n ".join(lines) + ")\n"
    return ("timeout" if res.timed_out else res.status) + "\n"


_NETS: dict = {}  # a worker's networks, read once


def run_instance(net_path, spec_path, timeout=None, num_threads=None):
    """(result word, seconds, result file text) of one instance."""
    t0 = time.perf_counter()
    net = _NETS.get(net_path)
    if net is None:
        net = _NETS[net_path] = load_onnx(net_path)
    res = check(net, read_vnnlib(spec_path), timeout=timeout, num_threads=num_threads)
    text = result_text(res)
    return text.split("\n", 1)[0], time.perf_counter() - t0, text


def read_instances(path):
    """The rows (net, spec, timeout) of an instances.csv, paths made absolute."""
    base = os.path.dirname(os.path.abspath(path))
    rows = []
    with open(path, newline="", encoding="utf-8") as fh:
        for k, row in enumerate(csv.reader(fh)):
            if not row or not "".join(row).strip():
                continue
            if len(row) < 2:
                raise ValueError(f"{path}:{k + 1}: expected net,spec[,timeout], got {row}")
            timeout = float(row[2]) if len(row) > 2 and row[2].strip() else None
            rows.append((os.path.join(base, row[0].strip()), os.path.join(base, row[1].strip()),
                         timeout))
    return rows


def _write(path, text):
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m cypool.verify", description=__doc__.split("\n\n")[0])
    p.add_argument("net", nargs="?", help="the ONNX network")
    p.add_argument("spec", nargs="?", help="the VNN-LIB property")
    p.add_argument("--timeout", type=float, default=None, help="seconds (one instance)")
    p.add_argument("--out", help="the result file (one instance)")
    p.add_argument("--threads", type=int, default=None, help="threads for cypool's kernels")
    p.add_argument("--instances", help="an instances.csv to run as a whole")
    p.add_argument("--out-dir", help="with --instances: a result file per instance here")
    p.add_argument("--scheduler", help="with --instances: a Dask scheduler's address")
    p.add_argument("--local-cluster", type=int, metavar="N",
                   help="with --instances: a local Dask cluster of N workers")
    a = p.parse_args(argv)
    if a.instances is None:
        if a.net is None or a.spec is None:
            p.error("give NET.onnx and SPEC.vnnlib, or --instances")
        word, _, text = run_instance(a.net, a.spec, a.timeout, a.threads)
        _write(a.out, text)
        print(word)
        return 0
    rows = read_instances(a.instances)
    if a.out_dir:
        os.makedirs(a.out_dir, exist_ok=True)
    if a.scheduler or a.local_cluster:
        results = _on_dask(rows, a)
    else:
        results = [run_instance(n, s, t, a.threads) for n, s, t in rows]
    out = csv.writer(sys.stdout)
    base = os.path.dirname(os.path.abspath(a.instances))
    for (net, spec, _), (word, secs, text) in zip(rows, results):
        if a.out_dir:
            name = f"{os.path.splitext(os.path.basename(net))[0]}_{os.path.splitext(os.path.basename(spec))[0]}"
            _write(os.path.join(a.out_dir, name + ".txt"), text)
        out.writerow([os.path.relpath(net, base), os.path.relpath(spec, base), word, f"{secs:.4f}"])
    return 0


def _on_dask(rows, a):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ImportError("--scheduler and --local-cluster need dask's distributed: "
                          "pip install 'cypool[dask]'") from None
    if a.scheduler:
        client = Client(a.scheduler)
        cluster = None
    else:
        cluster = LocalCluster(n_workers=a.local_cluster, threads_per_worker=1, processes=True)
        client = Client(cluster)
    try:
        futures = [client.submit(run_instance, n, s, t, a.threads, pure=False) for n, s, t in rows]
        return client.gather(futures)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    sys.exit(main())
