#!/usr/bin/env bash
# The test suite under AddressSanitizer and UndefinedBehaviorSanitizer:
# builds cypool with CYPOOL_SANITIZE=address,undefined into a fresh virtual
# environment and runs pytest there with the ASan runtime preloaded (Python
# itself is not instrumented), once per instruction-set variant this CPU
# runs. Any report fails the run:
#   * ASan stops at the first error (halt_on_error, the default);
#   * UBSan checks are built non-recoverable (-fno-sanitize-recover), and
#     UBSAN_OPTIONS=halt_on_error=1 too;
#   * leak detection is on, with allocation stacks cut to their top frames
#     (unwound by frame pointers, which the kernels keep) and tools/lsan.supp
#     suppressing those in CPython and numpy, so a leak whose allocation is
#     in cypool's kernels is reported, on the calling thread or a team
#     thread, and CPython's own do not drown it.
# torch and dask are not installed there: their cross-checks skip.
#
# Usage: tools/sanitize.sh [pytest arguments]   (e.g. -x "$PWD/tests/test_maxpool.py")
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
VENV="${CYPOOL_SANITIZE_VENV:-/tmp/cypool-sanitize}"
rm -rf "$VENV"
python3 -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
CYPOOL_SANITIZE=address,undefined python -m pip install --quiet ".[test]" --no-deps
python -m pip install --quiet numpy pytest hypothesis threadpoolctl

ASAN_LIB="$(gcc -print-file-name=libasan.so)"
export LD_PRELOAD="$ASAN_LIB"
# (fast_unwind_on_malloc: the slow unwinder made the kernel tests 2.3-2.8
# times longer)
export ASAN_OPTIONS="detect_leaks=1:malloc_context_size=6:fast_unwind_on_malloc=1:abort_on_error=0:halt_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/tools/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
# First a negative control: an out-of-bounds write through a kernel called
# with a too-short output (what the Python checks exist to prevent) must be
# reported, or the instrumentation is not live and a clean run means nothing.
if (cd "$VENV" && python - > "$VENV/control.txt" 2>&1 <<'PY'
import numpy as np
import cypool._backend as b
maps = np.zeros((64, 16), np.float32)
short = np.empty(8, np.float32)  # one value per map is 64
b.kernel("argmax2d", np.dtype(np.float32), np.dtype(np.int64))(maps, short, np.empty((64, 2), np.int64), 4, 1, 1)
PY
); then
  echo "sanitize: the deliberate overflow was not reported: the build is not instrumented" >&2
  exit 1
fi
grep -q "heap-buffer-overflow" "$VENV/control.txt"
echo "negative control: ASan reported the deliberate overflow"
# And a leak: a block allocated three calls deep on a thread of its own, as
# a kernel's on a team thread, and dropped, must be reported through the
# suppressions.
cat > "$VENV/leak.c" <<'C'
#include <pthread.h>
#include <stdlib.h>
static void *volatile sink;
__attribute__((noinline)) static void *allocate(size_t n) { return malloc(n); }
__attribute__((noinline)) static void *work(void *n) { sink = allocate((size_t)n); sink = 0; return 0; }
void leak_on_a_thread(size_t n) { pthread_t t; pthread_create(&t, 0, work, (void *)n); pthread_join(t, 0); }
C
# (gcc itself not under the preloaded runtime: its own leaks would fail it)
env -u LD_PRELOAD gcc -O1 -fno-omit-frame-pointer -fsanitize=address -shared -fPIC "$VENV/leak.c" \
  -o "$VENV/libleak.so" -lpthread
if (cd "$VENV" && python -c "import ctypes, cypool; ctypes.CDLL('./libleak.so').leak_on_a_thread(ctypes.c_size_t(4321))" \
    > "$VENV/leak.txt" 2>&1); then
  echo "sanitize: the deliberate leak was not reported: leak detection is off or suppressed" >&2
  exit 1
fi
grep -q "Direct leak of 4321 byte" "$VENV/leak.txt"
echo "negative control: LeakSanitizer reported the deliberate leak"
# (run from outside the checkout, so the sanitized install is what imports)
isas=$(cd "$VENV" && python -c "import cypool._backend as b; print(' '.join(b.RUNNABLE_ISAS))")
for isa in $isas; do
  echo "== sanitized tests, $isa kernels"
  # from the venv's folder: the checkout, with its in-place build if any, is
  # not on sys.path, so the sanitized install is what the tests import
  (cd "$VENV" && CYPOOL_ISA="$isa" python -m pytest -q -p no:cacheprovider --rootdir="$REPO" \
     -c "$REPO/pyproject.toml" "${@:-$REPO/tests}")
done
