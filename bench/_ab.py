"""Alternating processes of two (or more) source trees, for the A/B benches
(ab_batch1.py, ab_verify.py). Imports nothing heavy: the children time
what they would time alone."""
from __future__ import annotations

import json
import os
import subprocess
import sys


def alternating_runs(script: str, trees: dict, rounds: int, child_args: list) -> dict:
    """{name: [result, ...]}: each round, one process per tree of trees
    ({name: source tree}) in turn, running ``script *child_args --child``
    there with PYTHONPATH set to the tree; a result is the JSON the
    process prints last. Exits with a process's stderr if it fails."""
    runs = {name: [] for name in trees}
    for _ in range(rounds):
        for name, tree in trees.items():
            tree = os.path.abspath(tree)
            out = subprocess.run([sys.executable, os.path.abspath(script), *child_args, "--child"],
                                 cwd=tree, capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONPATH=tree))
            if out.returncode:
                sys.exit(out.stderr)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs
