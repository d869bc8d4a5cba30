"""cypool.dask: what running on Dask costs against the in-memory functions.

Run: python bench/bench_dask.py [--threads N] [--repeats R] [--quick] [--no-cluster]

Two jobs of about 1 GiB (64 MiB with --quick), in 64 MiB chunks (4 MiB):
* argmax2d over a stack of feature maps, [64, 64, 256, 256] float32,
  chunked along the first axis (and in 128 MiB chunks);
* vector_conv2d of [1, 16, 32, 32, E] float32 zonotope images, E = 16384
  generators, chunked along E, 16 -> 16 channels, 3x3, padding 1;
each timed interleaved as
* the in-memory function on N threads (cypool's own OpenMP);
* Dask's threaded scheduler, N worker threads, one cypool thread per task:
  computed into one numpy array (dask copies the chunks' results into
  it), and persisted, the result kept in its chunks as a pipeline passes
  it to its next step;
* a distributed.LocalCluster of N worker processes of one thread each,
  on the loopback interface: the input persisted on the workers first, the
  result persisted there too (as a cluster job keeps it), so the time is
  the computation and the scheduling, not shipping a gigabyte to the client.

Then the per-task overhead: a small array (one chunk, then 64 chunks) on
the threaded scheduler against the in-memory call.
"""
from __future__ import annotations

import itertools
import sys
from functools import partial

import numpy as np

import cypool
from _harness import compare, fmt_ms, optional, start

da = optional("dask.array")
distributed = optional("distributed")


def argmax_case(rng, quick, cdask, per_chunk=1):
    shape, chunks = ((16, 64, 128, 128), (per_chunk, 64, 128, 128)) if quick else \
        ((64, 64, 256, 256), (4 * per_chunk, 64, 256, 256))
    x = rng.standard_normal(shape, dtype=np.float32)
    return (f"argmax2d {list(shape)} float32, {x.nbytes / 2**20:.0f} MiB in "
            f"{np.prod(chunks) * 4 / 2**20:.0f} MiB chunks", x, chunks,
            lambda a, nt: cypool.argmax2d(a, num_threads=nt),
            lambda X: cdask.argmax2d(X))


def conv_case(rng, quick, cdask):
    E, ec = (1024, 64) if quick else (16384, 1024)
    x = rng.standard_normal((1, 16, 32, 32, E), dtype=np.float32)
    w = (rng.standard_normal((16, 16, 3, 3)) / 12).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    return (f"vector_conv2d [1, 16, 32, 32, {E}] float32, {x.nbytes / 2**20:.0f} MiB in "
            f"{16 * 32 * 32 * ec * 4 / 2**20:.0f} MiB chunks (E)", x, (1, 16, 32, 32, ec),
            lambda a, nt: cypool.vector_conv2d(a, w, b, padding=1, num_threads=nt),
            lambda X: cdask.vector_conv2d(X, w, b, padding=1))


def _same(block):
    return block


def check(got, want):
    got, want = (tuple(v) if isinstance(v, tuple) else (v,) for v in (got, want))
    assert all(np.array_equal(g, w) for g, w in zip(got, want)), "cypool.dask disagrees with memory"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    no_cluster = "--no-cluster" in argv
    args, n, reps = start(__doc__, [a for a in argv if a != "--no-cluster"], 3)
    if da is None:
        print("dask not installed (pip install 'cypool[dask]'): nothing to measure")
        return
    import dask

    import cypool.dask as cdask

    reps = min(reps, 3 if args.quick else 5)
    rng = np.random.default_rng(0)
    client = None
    if distributed is not None and not no_cluster:
        cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                           host="127.0.0.1", dashboard_address=None,
                                           silence_logs=50)
        client = distributed.Client(cluster)
    print()
    print("| job | in memory ms | dask threads ms | / memory | threads, kept in chunks ms | / memory "
          "| 2-process cluster ms | / memory |")
    print("|---|---|---|---|---|---|---|---|")
    for make in (argmax_case, partial(argmax_case, per_chunk=2), conv_case):
        title, x, chunks, in_memory, lazy = make(rng, args.quick, cdask)
        X = da.from_array(x, chunks=chunks)
        check(dask.compute(lazy(X), scheduler="threads")[0], in_memory(x, n))
        fns = {
            "memory": lambda: in_memory(x, n),
            "threads": lambda: dask.compute(lazy(X), scheduler="threads", num_workers=n),
            "threads kept": lambda: lazy(X).persist(scheduler="threads", num_workers=n),
        }
        if client is not None:
            # made on the workers (the same sizes, other values): shipping the
            # gigabyte from here would be most of the time, and not the job
            Xc = client.persist(da.random.default_rng(1).standard_normal(
                x.shape, dtype=x.dtype, chunks=chunks))
            distributed.wait(Xc)

            call_number = itertools.count()

            def on_cluster():
                # keys of its own (a result still in memory would be reused)
                r = client.persist(lazy(Xc).map_blocks(_same, dtype=Xc.dtype,
                                                       token=f"c{next(call_number)}"))
                distributed.wait(r)
                del r
            fns["cluster"] = on_cluster
        res = compare(fns, reps, pause=0.2)
        cl = (f"{fmt_ms(res['cluster']).strip()} | {res['cluster'] / res['memory']:.2f}x"
              if "cluster" in res else "- | -")
        cells = " | ".join(f"{fmt_ms(res[k]).strip()} | {res[k] / res['memory']:.2f}x"
                           for k in ("threads", "threads kept"))
        print(f"| {title} | {fmt_ms(res['memory']).strip()} | {cells} | {cl} |", flush=True)
        del X, x, fns
        if client is not None:
            del Xc
    if client is not None:
        client.close()
        cluster.close()

    print()
    print("### per-task overhead, threaded scheduler (small arrays)")
    print()
    print("| job | chunks | in memory ms | dask ms (graph built and computed) | added ms |")
    print("|---|---|---|---|---|")
    x = rng.standard_normal((8, 16, 32, 32), dtype=np.float32)
    added = {}
    for chunks in ((8, 16, 32, 32), (1, 2, 32, 32)):
        X = da.from_array(x, chunks=chunks)
        res = compare({"memory": lambda: cypool.argmax2d(x, num_threads=1),
                       "dask": lambda: dask.compute(cdask.argmax2d(X), scheduler="threads",
                                                    num_workers=n)}, reps * 3)
        added[X.npartitions] = res["dask"] - res["memory"]
        print(f"| argmax2d {list(x.shape)} | {X.npartitions} | {fmt_ms(res['memory']).strip()} "
              f"| {fmt_ms(res['dask']).strip()} | {fmt_ms(added[X.npartitions]).strip()} |")
    (one, a1), (many, a2) = sorted(added.items())
    print(f"\nper job: {a1 * 1e3:.2f} ms; per further chunk: {(a2 - a1) / (many - one) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
