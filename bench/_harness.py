"""Timing harness shared by the benchmarks.

The machines this runs on are noisy, so every comparison is:
* interleaved: each repeat times every peer once, in turn (after a pause
  and untimed calls of the same peer, at least WARM_UP_AFTER_PAUSE seconds
  of them), so that drift and neighbours' load hit all peers alike;
* a median over the repeats;
* reported as ratios to cypool, measured in the same run on the same thread
  count (torch.set_num_threads, numba.set_num_threads and cypool's
  num_threads are all set to --threads).
"""
from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time


def optional(name):
    """The module, or None when it is not installed (or fails to import)."""
    try:
        return importlib.import_module(name)
    except Exception:
        return None


torch = optional("torch")
numba = optional("numba")


def default_threads() -> int:
    from cypool._backend import kernels

    return kernels.max_threads()


def set_threads(n: int) -> None:
    """Give every installed peer n threads."""
    if torch is not None:
        torch.set_num_threads(n)
    if numba is not None:
        try:
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
        except Exception:
            pass
        else:
            _undo_numba_nesting()


def _loaded_libgomps():
    """Paths of the libgomp copies this process has loaded (Linux)."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "libgomp" in line.rsplit("/", 1)[-1]})
    except OSError:
        return []


def _undo_numba_nesting() -> None:
    """Turn OpenMP nesting back off after Numba's omp layer turned it on.

    Numba's launch sets max-active-levels to 255 in the libgomp it binds. A
    development build of cypool loads the system libgomp before torch, so
    torch then binds the same copy, and its nested regions (a float64
    convolution's gemm inside its batch loop) oversubscribe the cores:
    27-46x slower. Installed wheels carry their own libgomp and never see it.
    """
    import ctypes

    try:
        if numba.threading_layer() != "omp":
            return
    except Exception:
        return
    for path in _loaded_libgomps():
        try:
            ctypes.CDLL(path).omp_set_max_active_levels(1)
        except (OSError, AttributeError):
            pass


def peers_report() -> str:
    have = ["numpy"] + [n for n, m in [("torch", torch), ("numba", numba)] if m is not None]
    miss = [n for n, m in [("torch", torch), ("numba", numba)] if m is None]
    line = "peers measured: " + ", ".join(have)
    if miss:
        line += "; missing (not measured): " + ", ".join(miss)
    return line


WARM_UP = 5e-3
WARM_UP_AFTER_PAUSE = 20e-3


def compare(fns: dict, repeats: int = 15, pause: float = 0.02) -> dict:
    """Median seconds per call of each fn, timed interleaved.

    In every repeat each fn is called untimed and then timed, so that it
    meets the allocator and caches in its own steady state rather than in
    the state the previous peer left: measured here, a large output allocated
    right after another peer freed its buffers costs page faults worth up to
    10x a small convolution, for whichever peer comes second. A repeat that
    is very short times several calls (about 2 ms of them) and divides; it
    also makes as many untimed calls first, so that a previous peer's OpenMP
    pool, which spins for about a millisecond after its call, has gone to
    sleep: without that, the 26 us [32, 5, 64, 64] argmax measured 53 us in
    one run, its two threads sharing the two cores with torch.amax's.

    The untimed calls also last at least WARM_UP seconds: measured here,
    after the pause a call of about a millisecond runs 20-30% slow for its
    first few calls (x.copy() of 12.8 MB as much as the max pool), so one
    untimed call left a 1 ms peer timed while still warming up, and its
    0.4 ms peer, with four untimed calls, timed warm.

    After a pause the first calls are slower still: measured here, the
    0.3 ms ConvSmall 1 convolution took about 7 ms and then 4 ms for the
    first two calls after the 150 ms pause in some processes (its second
    OpenMP thread, asleep, returning only after a scheduler tick or two),
    which a 5 ms warm-up left in the timed call: cypool's median read 4.0 ms
    in three of five suite runs. So after a pause every peer warms up for
    WARM_UP_AFTER_PAUSE. Every peer pauses: before, only peers whose first
    call took a millisecond or more did, and that cold first call (3-6 ms
    for a 0.3 ms convolution) decided it, so which peers paused depended on
    first-call costs.

    pause: seconds to sleep before each peer's untimed calls, so that the
    previous peer's thread pool has stopped spinning. On a 2-core machine a
    pool that busy-waits after its call (torch's and Numba's OpenMP, and
    OpenBLAS for about 0.1 s after a matrix product) takes a core from the
    next peer: measured here, the [32, 245, 64, 64] argmax took 6.4 ms right
    after torch.amax and 3.4 ms with a 20 ms pause (or OMP_WAIT_POLICY=PASSIVE).
    """
    inner = {}
    for name, fn in fns.items():
        fn()  # cold: first-call costs (thread pool start, caches) are not its size
        el = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            fn()
            el = min(el, time.perf_counter() - t)
        inner[name] = max(1, int(2e-3 / max(el, 1e-7))) if el < 2e-3 else 1
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            n = inner[name]
            if pause:
                time.sleep(pause)
            # Untimed: as long as the timed block, and at least WARM_UP
            # (WARM_UP_AFTER_PAUSE after a pause).
            least = WARM_UP_AFTER_PAUSE if pause else WARM_UP
            t, k = time.perf_counter(), 0
            while k < n or time.perf_counter() - t < least:
                fn()
                k += 1
            t = time.perf_counter()
            for _ in range(n):
                fn()
            times[name].append((time.perf_counter() - t) / n)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _release_heap() -> None:
    """Give the C heap's free memory back to the OS (glibc), so that the next
    large output is fresh pages that fault on first touch."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def as_called(fns: dict, repeats: int = 7) -> dict:
    """How each fn fares called the way users call it, against its steady
    state (compare()): {name: {condition: median seconds}}, conditions
    * "steady": compare()'s warmed, paused, interleaved best case;
    * "after matmul": one call right after a 768x768 float32 numpy matrix
      product, whose OpenBLAS threads then spin for about 0.1 s on the
      same cores;
    * "fresh output": one call, its threads awake, right after the heap's
      free memory went back to the OS, so its output's pages fault in.
    Interleaved: each repeat runs every fn in each condition in turn.
    """
    import numpy as np

    a = np.random.default_rng(0).standard_normal((768, 768), dtype=np.float32)
    steady = compare(fns, repeats)
    res = {name: {"steady": [steady[name]], "after matmul": [], "fresh output": []} for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            time.sleep(0.3)
            fn()  # its own buffers and threads as a loop leaves them
            a @ a
            t = time.perf_counter()
            fn()
            res[name]["after matmul"].append(time.perf_counter() - t)
            time.sleep(0.3)  # the BLAS threads asleep
            for _ in range(3):
                fn()
            junk = np.ones(2**24)  # 128 MiB through the heap, then back to the OS
            del junk
            _release_heap()
            t = time.perf_counter()
            fn()
            res[name]["fresh output"].append(time.perf_counter() - t)
    return {name: {c: statistics.median(v) for c, v in conds.items()} for name, conds in res.items()}


def as_called_table(title: str, rows: list) -> str:
    """Markdown: per case and peer, the steady time and each condition's
    time as a multiple of it (the slowdown users see)."""
    lines = [f"### {title}", "", "| case | peer | steady ms | after a numpy matmul | into fresh pages |",
             "|---|---|---|---|---|"]
    for case, res in rows:
        for peer, r in res.items():
            st = r["steady"]
            lines.append(f"| {case} | {peer} | {fmt_ms(st).strip()} | "
                         f"{fmt_ms(r['after matmul']).strip()} ms ({r['after matmul'] / st:.2f}x) | "
                         f"{fmt_ms(r['fresh output']).strip()} ms ({r['fresh output'] / st:.2f}x) |")
    return "\n".join(lines)


def fmt_ms(s: float) -> str:
    return f"{s * 1e3:9.3f}"


def table(title: str, rows: list[tuple[str, dict]], base: str = "cypool") -> str:
    """Markdown table: one row per case, median ms per peer and peer/cypool ratios."""
    peers = []
    for _, res in rows:
        for k in res:
            if k not in peers:
                peers.append(k)
    others = [p for p in peers if p != base]
    head = "| case | " + " | ".join(f"{p} ms" for p in peers) + " | " + " | ".join(
        f"{p} / {base}" for p in others) + " |"
    sep = "|" + "---|" * (1 + len(peers) + len(others))
    lines = [f"### {title}", "", head, sep]
    for case, res in rows:
        cells = [fmt_ms(res[p]).strip() if p in res else "-" for p in peers]
        ratios = [f"{res[p] / res[base]:.2f}x" if p in res and base in res else "-" for p in others]
        lines.append(f"| {case} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def arg_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--threads", type=int, default=None,
                   help="threads for cypool and every peer (default: OpenMP's default)")
    p.add_argument("--repeats", type=int, default=15, help="interleaved repeats per case (median)")
    p.add_argument("--quick", action="store_true", help="fewer repeats and smaller shapes, for smoke tests")
    p.add_argument("--as-called", action="store_true",
                   help="also time single calls after a numpy matmul and into fresh pages, "
                        "against the steady state (benches that call kernels directly)")
    return p


def machine_line(threads: int) -> str:
    import numpy as np

    import cypool

    tv = f", torch {torch.__version__}" if torch is not None else ""
    from cypool._backend import ISA

    return (f"cypool {cypool.__version__} ({ISA} kernels), numpy {np.__version__}{tv}; "
            f"{threads} thread(s) for every peer; {os.cpu_count()} CPUs visible")


def start(doc: str, argv, quick_repeats: int):
    """Parse the common options, give every peer the thread count and print
    the run's header. Returns (args, threads, repeats)."""
    args = arg_parser(doc.splitlines()[0]).parse_args(argv)
    n = args.threads or default_threads()
    set_threads(n)
    print(machine_line(n))
    print(peers_report())
    return args, n, (quick_repeats if args.quick else args.repeats)


_RSS_PROBE = """
import sys
import numpy as np
sys.path.insert(0, {here!r})
{setup}
from _rss import status
base = status("VmRSS")
out = {call}
print(status("VmHWM") - base - out.nbytes)
"""


def peak_rss_extra(setup: str, call: str):
    """Peak RSS (VmHWM) that the first evaluation of `call` adds beyond the
    array it returns, in a fresh process after `setup` (code that makes the
    inputs): a kernel's own malloc counts, which tracemalloc does not see,
    and no earlier call has left buffers in the heap. Bytes, or None where
    Linux's /proc is unavailable."""
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    code = _RSS_PROBE.format(here=here, setup=setup, call=call)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if res.returncode:
        return None
    return max(0, int(res.stdout.split()[-1]))


def memory_row(case: str, setup: str, cy_call: str, np_call: str, out_bytes: int,
               limit: float) -> str:
    """A markdown row: output MiB, the extra peak RSS of cypool's and
    numpy's first call (peak_rss_extra), and whether cypool's is within
    limit bytes."""
    cy, npm = peak_rss_extra(setup, cy_call), peak_rss_extra(setup, np_call)
    fmt = (lambda v: "n/a" if v is None else f"{v / 2**20:.2f}")
    ok = "n/a" if cy is None else ("yes" if cy <= limit else "NO")
    return f"| {case} | {out_bytes / 2**20:.1f} | {fmt(cy)} | {fmt(npm)} | {ok} |"


def conv_memory_row(bench: str, fn: str, case: str, x_shape: tuple, w_shape: tuple,
                    s: int, p: int, n: int, out_bytes: int, limit: float) -> str:
    """memory_row for a float32 convolution: cypool.<fn>(x, w, b, s, p)
    against <bench>.numpy_im2col on the same random arrays."""
    setup = (f"import {bench}, cypool\nrng = np.random.default_rng(0)\n"
             f"x = rng.standard_normal({x_shape}, dtype=np.float32)\n"
             f"w = rng.standard_normal({w_shape}).astype(np.float32)\n"
             f"b = rng.standard_normal({w_shape[0]}).astype(np.float32)")
    return memory_row(case, setup, f"cypool.{fn}(x, w, b, {s}, {p}, num_threads={n})",
                      f"{bench}.numpy_im2col(x, w, b, {s}, {p})", out_bytes, limit)


def memory_table(what: str, limit: str, rows: list) -> str:
    """The markdown table of memory_row rows: the extra peak RSS of a first
    call of what beyond its output, cypool's against limit."""
    return "\n".join([
        f"### extra peak memory of a first {what} beyond its output (peak RSS, VmHWM, fresh process)",
        "",
        f"| case | output MiB | cypool MiB | numpy im2col MiB | cypool within {limit} |",
        "|---|---|---|---|---|",
        *rows])
