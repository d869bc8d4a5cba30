"""cypool's benchmark suite: every bench, on generated data (and
scikit-learn's bundled digits for the CNN and the certified networks), against the peers that are
installed (PyTorch, numpy recipes, Numba), and the cost of running on Dask.

Run: python bench/run_all.py [--threads N] [--repeats R] [--quick]

Each bench mirrors one part of the public API and prints markdown tables of
medians and ratios, measured interleaved in one run on one thread count.
Each runs in a process of its own: on a 2-core machine the thread pools a
previous bench's peers left behind (OpenBLAS, torch's and Numba's OpenMP)
would otherwise distort the next bench.
"""
import os
import subprocess
import sys

BENCHES = ["bench_cnn.py", "bench_conv.py", "bench_maxpool.py", "bench_argmax.py", "bench_vector_conv.py",
           "bench_verify.py", "bench_mixed.py", "bench_dask.py", "bench_torch.py"]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    here = os.path.dirname(os.path.abspath(__file__))
    failed = []
    for name in BENCHES:
        print(f"\n## {name[:-3]}\n", flush=True)
        res = subprocess.run([sys.executable, os.path.join(here, name), *argv])
        if res.returncode:
            failed.append(name)
    if failed:
        raise SystemExit(f"benches failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
