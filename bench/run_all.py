"""cypool's benchmark suite: every bench, on generated data, against the
peers that are installed (PyTorch, numpy recipes, Numba).

Run: python bench/run_all.py [--threads N] [--repeats R] [--quick]

Each bench mirrors one part of the public API and prints markdown tables of
medians and ratios, measured interleaved in one run on one thread count.
"""
import sys

import bench_argmax
import bench_maxpool
import bench_vector_conv

BENCHES = [bench_maxpool, bench_argmax, bench_vector_conv]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    for mod in BENCHES:
        print(f"\n## {mod.__name__}\n")
        sys.stdout.flush()
        mod.main(argv)


if __name__ == "__main__":
    main()
