"""Merge several saved runs of the benchmark suite into one, by medians.

Run: python bench/merge_runs.py RUN1.md RUN2.md RUN3.md > merged.md

Each file is the output of `python bench/run_all.py`. Every "... ms" cell
becomes the median of that cell over the runs, every "a / b" ratio is
recomputed from those medians, and "cypool / floor" likewise; other text is
the first run's. On this noisy 2-core machine a whole run is sometimes
slowed by another tenant (entries 2-4x slower at once); the median of three
runs keeps that out of the tables.
"""
from __future__ import annotations

import statistics
import sys


def parse(path: str):
    """Yield (table title, columns, cells, line) for each line of a run_all
    output; columns and cells are None outside a table's data rows."""
    title, cols = None, None
    for line in open(path):
        line = line.rstrip("\n")
        cells = None
        if line.startswith("### "):
            title, cols = line[4:], None
        elif line.startswith("| case |"):
            cols = [c.strip() for c in line.strip("|").split("|")]
        elif line.startswith("| ") and cols and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) != len(cols):
                cells = None
        yield title, cols, cells, line


def table_rows(path: str) -> dict:
    """{(table title, case): {column: cell}} of a run_all output."""
    return {(title, cells[0]): dict(zip(cols, cells))
            for title, cols, cells, _ in parse(path) if cells}


def _median_ms(runs: list, key, col: str) -> float | None:
    vals = []
    for r in runs:
        try:
            vals.append(float(r[key][col]))
        except (KeyError, ValueError):
            pass
    return statistics.median(vals) if vals else None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        raise SystemExit(__doc__)
    runs = [table_rows(p) for p in argv]
    print(f"<!-- per-cell medians of {len(argv)} runs: {' '.join(argv)} -->")
    for title, cols, cells, line in parse(argv[0]):
        if cells:
            key = (title, cells[0])
            ms = {c: _median_ms(runs, key, c) for c in cols if c.endswith(" ms")}
            new = [cells[0]]
            for c, cell in zip(cols[1:], cells[1:]):
                if c in ms:
                    new.append("-" if ms[c] is None else f"{ms[c]:.3f}")
                elif " / " in c:
                    a, b = (f"{s.strip()} ms" for s in c.split(" / "))
                    ok = ms.get(a) and ms.get(b)
                    new.append(f"{ms[a] / ms[b]:.2f}x" if ok else cell)
                else:
                    new.append(cell)
            line = "| " + " | ".join(new) + " |"
        print(line)


if __name__ == "__main__":
    main()
