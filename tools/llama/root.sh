#!/usr/bin/env bash
# Makes the Debian forky root that llama.cpp's packages live in (issue 33):
# llama.cpp 0.7.0 is packaged only from forky on (llama.cpp-tools,
# libllama-dev, python3-gguf), and programs that link libllama are built and
# run inside this root, because its glibc is newer than bookworm's. A daemon
# outside the root serves them over a Unix socket in a folder bind-mounted
# into it (one kernel: sockets and memfds work across the chroot).
#
#   bash tools/llama/root.sh [DIR]      # default build/llama/root
#
# Cached: DIR/.cxltier-recipe names the suite and the packages; a root with
# the same recipe is kept as it is (about 0.7 GB, 2 to 3 minutes to make).
# Needs root, debootstrap and Debian's archive. Two quirks: bookworm's
# debootstrap has no forky script (sid's is the same recipe), and forky's
# Release files can be past their Valid-Until, so apt inside is told to
# accept them.
set -euo pipefail

ROOT=${1:-build/llama/root}
MIRROR=${CXLTIER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
PACKAGES="llama.cpp-tools libllama-dev python3-gguf python3-numpy g++ cmake pkg-config make libxxhash-dev"
RECIPE="forky minbase: $PACKAGES"

die() {
  echo "root.sh: $*" >&2
  exit 1
}

[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap, chroot)"
if [ -f "$ROOT/.cxltier-recipe" ] && [ "$(cat "$ROOT/.cxltier-recipe")" = "$RECIPE" ]; then
  echo "root.sh: $ROOT is ready (cached)"
  exit 0
fi
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
script=/usr/share/debootstrap/scripts/sid
[ -f "$script" ] || die "no $script: this debootstrap cannot make forky"

t0=$SECONDS
# Never delete through a mount: run.sh bind-mounts the source tree into the
# root, and a run killed before its cleanup leaves it there.
if awk -v r="$(realpath -m "$ROOT")/" 'index($5 "/", r) == 1 { found = 1 } END { exit !found }' \
  /proc/self/mountinfo; then
  die "something is mounted under $ROOT (a killed run of tools/llama/run.sh?): umount it first"
fi
rm -rf "$ROOT"
mkdir -p "$ROOT"
log=$(dirname "$ROOT")/root.log
echo "root.sh: debootstrap forky into $ROOT (log: $log)"
debootstrap --variant=minbase forky "$ROOT" "$MIRROR" "$script" >"$log" 2>&1 ||
  { tail -20 "$log" >&2; die "debootstrap failed"; }
echo 'Acquire::Check-Valid-Until "false";' >"$ROOT/etc/apt/apt.conf.d/99cxltier"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
echo "root.sh: apt-get install $PACKAGES"
chroot "$ROOT" sh -c "apt-get update && DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends $PACKAGES" >>"$log" 2>&1 ||
  { tail -20 "$log" >&2; die "apt-get in the root failed"; }
chroot "$ROOT" apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/*
version=$(chroot "$ROOT" dpkg-query -W -f '${Version}' llama.cpp-tools)
echo "$RECIPE" >"$ROOT/.cxltier-recipe"
echo "root.sh: $ROOT ready in $((SECONDS - t0)) s: llama.cpp $version, $(du -sh "$ROOT" | cut -f1)"
