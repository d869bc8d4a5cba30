"""Compare cypool's medians between two saved runs of the benchmark suite.

Run: python bench/compare_runs.py BASE.md[,BASE2.md,...] OTHER.md[,OTHER2.md,...]

Each file is the output of `python bench/run_all.py`. For every table row
present on both sides, prints cypool's median on each side and OTHER / BASE.
A side given as several comma-separated runs uses, per row, the median of
their medians: on this noisy 2-core machine a single entry under a
millisecond moves by 10-30% between runs, so alternate the two builds'
runs and give each side three. Used to check the repaired wheel against a
-march=native build of the same commit:

    python bench/run_all.py > wheel1.md         # in a venv with the wheel
    python bench/run_all.py > native1.md        # in a venv with CYPOOL_NATIVE=1 pip install .
    ... (wheel2, native2, wheel3, native3)
    python bench/compare_runs.py native1.md,native2.md,native3.md wheel1.md,wheel2.md,wheel3.md
"""
from __future__ import annotations

import statistics
import sys

from merge_runs import table_rows


def cypool_medians(path: str) -> dict:
    """{(table title, case): cypool median ms} from a run_all output."""
    out = {}
    for key, row in table_rows(path).items():
        try:
            out[key] = float(row["cypool ms"])
        except (KeyError, ValueError):
            pass
    return out


def side(paths: str) -> dict:
    """{row: median over the comma-separated runs that have it}."""
    runs = [cypool_medians(p) for p in paths.split(",")]
    keys = [k for k in runs[0] if all(k in r for r in runs)]
    return {k: statistics.median(r[k] for r in runs) for k in keys}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise SystemExit(__doc__)
    base, other = side(argv[0]), side(argv[1])
    worst = 0.0
    print(f"| table | case | {argv[0]} ms | {argv[1]} ms | ratio |")
    print("|---|---|---|---|---|")
    for key in base:
        if key in other:
            r = other[key] / base[key]
            worst = max(worst, r)
            print(f"| {key[0]} | {key[1]} | {base[key]:.3f} | {other[key]:.3f} | {r:.2f}x |")
    print(f"\nlargest ratio {argv[1]} / {argv[0]}: {worst:.2f}x")


if __name__ == "__main__":
    main()
