"""Compare cypool's medians between two saved runs of the benchmark suite.

Run: python bench/compare_runs.py BASE.md OTHER.md

Each file is the output of `python bench/run_all.py`. For every table row
present in both, prints cypool's median in each run and OTHER / BASE. Used to
check the repaired wheel against a -march=native build of the same commit:

    python bench/run_all.py > wheel.md          # in a venv with the wheel
    CYPOOL_NATIVE=1 pip install . && python bench/run_all.py > native.md
    python bench/compare_runs.py native.md wheel.md
"""
from __future__ import annotations

import sys


def cypool_medians(path: str) -> dict:
    """{(table title, case): cypool median ms} from a run_all output."""
    out, title, cols = {}, None, None
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("### "):
            title, cols = line[4:], None
        elif line.startswith("| case |"):
            cols = [c.strip() for c in line.strip("|").split("|")]
        elif line.startswith("| ") and cols and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if "cypool ms" in cols and len(cells) == len(cols):
                try:
                    out[(title, cells[0])] = float(cells[cols.index("cypool ms")])
                except ValueError:
                    pass
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        raise SystemExit(__doc__)
    base, other = cypool_medians(argv[0]), cypool_medians(argv[1])
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
