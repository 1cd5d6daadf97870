#!/usr/bin/env bash
# Builds the Debian package with CPack and checks it without installing it on
# this machine: its contents, `systemd-analyze verify` of both units (in a
# scratch root holding the package and this machine's systemd units), the
# service's exposure (`systemd-analyze security --offline=true`, at most 2.0),
# and an engine's build against the packaged library (CMake and pkg-config).
# Usage: scripts/package.sh   (needs a build; prints the .deb's path)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
set -euo pipefail
(cd "$BUILD_DIR" && cpack -G DEB >/dev/null)
DEB=$(ls "$BUILD_DIR"/package/cxltier_*_amd64.deb | tail -1)
WORK=$(mktemp -d /tmp/cxltier-package.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
dpkg-deb -x "$DEB" "$WORK/root"
# The library directory: usr/lib, or usr/lib/<multiarch> (GNUInstallDirs under /usr).
LIBDIR=$(cd "$WORK/root" && dirname "$(find usr/lib -name libcxltier.so.1 | head -1)")
for f in usr/sbin/cxltierd usr/bin/cxltierctl usr/bin/cxltier-sim usr/bin/cxltier-loadgen \
  usr/bin/cxltier-load "$LIBDIR/libcxltier.so.1" usr/include/cxltier/client.h \
  "$LIBDIR/pkgconfig/cxltier.pc" "$LIBDIR/cmake/cxltier/cxltierConfig.cmake" \
  usr/lib/systemd/system/cxltierd.service usr/lib/systemd/system/cxltierd.socket \
  usr/lib/sysusers.d/cxltier.conf usr/lib/tmpfiles.d/cxltier.conf etc/cxltier/cxltierd.toml \
  usr/lib/python3/dist-packages/cxltier/__init__.py usr/lib/python3/dist-packages/cxltier/__init__.pyi \
  usr/lib/python3/dist-packages/cxltier/py.typed usr/lib/python3/dist-packages/cxltier/gqa.py \
  usr/lib/python3/dist-packages/cxltier/errors.py usr/share/doc/cxltier/examples/kv_engine.py; do
  [ -e "$WORK/root/$f" ] || { echo "package: $f missing from $DEB"; exit 1; }
done
dpkg-deb -f "$DEB" Depends | grep -q systemd || { echo "package: no Depends on systemd"; exit 1; }
dpkg-deb -e "$DEB" "$WORK/control"
grep -qx /etc/cxltier/cxltierd.toml "$WORK/control/conffiles" || { echo "package: config is not a conffile"; exit 1; }

# verify: the units must load cleanly (any message fails, warnings included).
mkdir -p "$WORK/vroot/usr/lib" "$WORK/vroot/usr/bin"
cp -a /usr/lib/systemd "$WORK/vroot/usr/lib/"
cp -a "$WORK/root/." "$WORK/vroot/"
cp /usr/bin/kill "$WORK/vroot/usr/bin/"
ln -s usr/bin "$WORK/vroot/bin"
out=$(systemd-analyze verify --root="$WORK/vroot" /usr/lib/systemd/system/cxltierd.service \
  /usr/lib/systemd/system/cxltierd.socket 2>&1) || { echo "package: verify failed: $out"; exit 1; }
[ -z "$out" ] || { echo "package: verify complained: $out"; exit 1; }
echo "package: systemd-analyze verify: cxltierd.service and cxltierd.socket clean"

exposure=$(systemd-analyze security --offline=true "$WORK/root/usr/lib/systemd/system/cxltierd.service" 2>/dev/null |
  sed -nE 's/.*Overall exposure level for [^:]*: ([0-9.]+).*/\1/p')
[ -n "$exposure" ] || { echo "package: no exposure figure"; exit 1; }
echo "package: systemd-analyze security exposure of cxltierd.service: $exposure (at most 2.0)"
awk -v e="$exposure" 'BEGIN { exit !(e <= 2.0) }' || { echo "package: exposure $exposure over 2.0"; exit 1; }

# An engine's build against the package: find_package(cxltier) and pkg-config.
cmake -S "$CXLTIER_ROOT/tests/package" -B "$WORK/consumer" -DCMAKE_PREFIX_PATH="$WORK/root/usr" >/dev/null
cmake --build "$WORK/consumer" >/dev/null
export LD_LIBRARY_PATH="$WORK/root/$LIBDIR"
out=$("$WORK/consumer/consumer" || true)  # no daemon there: it must say so
grep -q "connect to /nonexistent" <<<"$out" ||
  { echo "package: the CMake consumer did not run as expected"; exit 1; }
PKG_CONFIG_SYSROOT_DIR="$WORK/root" PKG_CONFIG_LIBDIR="$WORK/root/$LIBDIR/pkgconfig" \
  c++ "$CXLTIER_ROOT/tests/package/consumer.cpp" -o "$WORK/consumer-pc" \
  $(PKG_CONFIG_SYSROOT_DIR="$WORK/root" PKG_CONFIG_LIBDIR="$WORK/root/$LIBDIR/pkgconfig" pkg-config --cflags --libs cxltier)
out=$("$WORK/consumer-pc" || true)
grep -q "connect to /nonexistent" <<<"$out" ||
  { echo "package: the pkg-config consumer did not run as expected"; exit 1; }
echo "package: find_package(cxltier) and pkg-config cxltier builds run"

# The Python module, for Debian's python3: the extension of its ABI, importable
# from the package's dist-packages (and no other copy), errors as cxltier.Error.
PYDIR="$WORK/root/usr/lib/python3/dist-packages"
soabi=$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
[ -e "$PYDIR/cxltier/_cxltier$soabi" ] || { echo "package: cxltier/_cxltier$soabi missing from $DEB"; exit 1; }
dpkg-deb -f "$DEB" Recommends | grep -q python3-numpy || { echo "package: no Recommends on python3-numpy"; exit 1; }
out=$(cd "$WORK" && PYTHONPATH="$PYDIR" PYTHONNOUSERSITE=1 /usr/bin/python3 -c '
import cxltier, sys
assert cxltier.__file__.startswith(sys.argv[1]), cxltier.__file__
try:
    cxltier.Client("/nonexistent/cxltierd.sock")
except cxltier.InternalError as e:
    print("python:", e.code, e)
' "$PYDIR") || { echo "package: the packaged cxltier module does not import: $out"; exit 1; }
grep -q "python: 11 connect to /nonexistent" <<<"$out" ||
  { echo "package: the packaged cxltier module did not run as expected: $out"; exit 1; }
echo "package: import cxltier (Debian's python3) from the package's dist-packages works"
echo "package: $DEB ($(du -h "$DEB" | cut -f1))"
