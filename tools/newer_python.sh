#!/usr/bin/env bash
# The test suite on a CPython newer than pyenv has on this machine (3.14 by
# default), from Debian's packages, in one command: an amd64 Debian
# unstable root filesystem with that Python and gcc (debootstrap, a few
# minutes the first time), cypool's wheel built there with the variants of
# a normal build, installed beside numpy's wheel for that Python, and the
# suite run, inside the root filesystem (chroot).
#
# Usage: tools/newer_python.sh [pytest arguments]   (as root)
# Environment: CYPOOL_NEWER_PYTHON (default 3.14); CYPOOL_NEWER_DIR
# (default /var/tmp/cypool-python<version>, outside the checkout: the root
# filesystem has /proc mounted while this runs) holds the root filesystem
# and wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV="${CYPOOL_NEWER_PYTHON:-3.14}"
DIR="$(realpath -m "${CYPOOL_NEWER_DIR:-/var/tmp/cypool-python$PYV}")"
ROOT="$DIR/rootfs"
mkdir -p "$DIR"
command -v debootstrap > /dev/null || {
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap
}

if [ ! -x "$ROOT/usr/bin/python$PYV" ]; then
  echo "== Debian unstable root filesystem with Python $PYV"
  rm -rf "$ROOT"
  debootstrap --variant=minbase --include="python$PYV,python$PYV-dev,python$PYV-venv,gcc,libc6-dev,libgomp1" \
    sid "$ROOT" http://deb.debian.org/debian
fi
[ -e "$ROOT/proc/self" ] || mount -t proc proc "$ROOT/proc"
trap 'umount "$ROOT/proc" 2> /dev/null || true' EXIT
if [ ! -x "$ROOT/opt/venv/bin/pytest" ]; then
  # Wheels for that Python fetched by the host's pip (it knows this
  # machine's index and certificates), installed inside from that folder.
  rm -rf "$DIR/wheels"
  python3 -m pip download --quiet --only-binary=:all: --python-version "$PYV" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$DIR/wheels" \
    numpy pytest pytest-run-parallel hypothesis threadpoolctl mypy \
    "Cython>=3.1" "setuptools>=77" wheel
  rm -rf "$ROOT/tmp/wheels"
  cp -r "$DIR/wheels" "$ROOT/tmp/wheels"
  chroot "$ROOT" "/usr/bin/python$PYV" -m venv /opt/venv
  chroot "$ROOT" /bin/sh -c 'PIP_FIND_LINKS= /opt/venv/bin/python -m pip install --quiet \
    --no-index --find-links /tmp/wheels numpy pytest pytest-run-parallel hypothesis \
    threadpoolctl mypy "Cython>=3.1" "setuptools>=77" wheel'
fi

echo "== cypool built with Python $PYV"
# The sources as git sees them (tracked, and new files not ignored).
rm -rf "$ROOT/src"
mkdir -p "$ROOT/src"
git ls-files -co --exclude-standard | tar -c -T - | tar -x -C "$ROOT/src"
chroot "$ROOT" /bin/sh -c 'cd /src && PIP_FIND_LINKS= /opt/venv/bin/python -m pip wheel --quiet \
  --no-index --no-deps --no-build-isolation -w /tmp/dist . > /tmp/build.log 2>&1 \
  || { tail -30 /tmp/build.log; exit 1; }'
chroot "$ROOT" /bin/sh -c 'PIP_FIND_LINKS= /opt/venv/bin/python -m pip install --quiet --no-index \
  --no-deps --force-reinstall /tmp/dist/cypool-*.whl'
# The package sources leave, so that the installed wheel is what imports.
rm -rf "$ROOT/src/cypool"
chroot "$ROOT" /bin/sh -c 'cd /tmp && /opt/venv/bin/python -c "import cypool; cypool.show_config()"'
chroot "$ROOT" /bin/sh -c "cd /src && /opt/venv/bin/pytest -q -p no:cacheprovider $*"
