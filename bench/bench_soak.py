"""Soak: eight Python threads calling a mix of cypool's operations and layers
for a minute while another changes threadpoolctl's OpenMP limit, every
result compared with the same call made alone; then 100,000 mixed calls and
the RSS they add.

Run: python bench/bench_soak.py [--seconds S] [--threads T] [--calls N]

(tests/test_soak.py runs the same code for a few seconds and 20,000 calls, and
at this length with `pytest -m slow`.)
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import soak  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--calls", type=int, default=100_000)
    args = p.parse_args(argv)
    c = soak.concurrency(args.seconds, args.threads)
    print(f"concurrency: {c['calls']} calls from {c['threads']} Python threads in {args.seconds:.0f} s, "
          f"{c['limit changes']} threadpoolctl limit changes; mismatches: {c['mismatches']} "
          f"{c['mismatched'] or ''}; threads still running at the end: {c['hung']}")
    m = soak.leak(args.calls)
    print(f"leaks: {m['calls']} mixed calls in {m['seconds']:.1f} s after a warm-up; RSS growth "
          f"{m['rss growth bytes'] / 2**20:.2f} MiB (limit 5 MiB)")
    if c["mismatches"] or c["hung"] or m["rss growth bytes"] >= 5 * 2**20:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
