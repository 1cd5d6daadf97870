#!/usr/bin/env bash
# Builds cxltierd's OCI image with podman, pulling nothing from an image
# registry: a Debian 12 root made with debootstrap (minbase, plus what the
# .deb depends on and recommends), imported as the base image, then the
# Containerfile installs the .deb into it.
#
#   deploy/container/build.sh --deb FILE [--tag NAME] [--base-tar FILE] [--mirror URL]
#
#   --deb       the package (bash scripts/package.sh builds it)
#   --tag       the image's name (default localhost/cxltier:VERSION, VERSION the .deb's)
#   --base-tar  a tar of a Debian 12 root to use instead of debootstrapping one
#               (the QEMU systemd test passes the guest's own debootstrapped root)
#   --mirror    the Debian mirror for debootstrap (default http://deb.debian.org/debian)
#
# Needs root (debootstrap; podman's rootful storage is what the host's
# container runtime runs from), podman and python3. docs/deploy.md ("Image").
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEB="" TAG="" BASE_TAR="" MIRROR=${CXLTIER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
die() { echo "build.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --deb) DEB=${2:-}; shift 2 ;;
    --tag) TAG=${2:-}; shift 2 ;;
    --base-tar) BASE_TAR=${2:-}; shift 2 ;;
    --mirror) MIRROR=${2:-}; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
done
[ -f "$DEB" ] || die "give --deb with the package (bash scripts/package.sh builds it)"
[ -z "$BASE_TAR" ] || [ -f "$BASE_TAR" ] || die "--base-tar $BASE_TAR: no such file"
command -v podman >/dev/null || die "podman is not installed (apt-get install podman)"
[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap, and the rootful image store)"
VERSION=$(dpkg-deb -f "$DEB" Version)
TAG=${TAG:-localhost/cxltier:$VERSION}
BASE=localhost/cxltier-base:bookworm
WORK=$(mktemp -d /var/tmp/cxltier-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
t0=$SECONDS

if [ -z "$BASE_TAR" ]; then
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  # What apt would install with the .deb: its Depends and Recommends (a
  # virtual package, such as libspdlog1.10-fmt9, named by what provides it).
  pkgs=()
  for d in $(dpkg-deb -f "$DEB" Depends Recommends | sed -E 's/^[A-Za-z]+: //' | tr ',' '\n' |
    sed -E 's/\(.*\)//; s/\|.*//; s/ //g'); do
    if [ -z "$(apt-cache show --no-all-versions "$d" 2>/dev/null)" ]; then
      d=$(apt-cache showpkg "$d" | awk '/^Reverse Provides:/ { getline; print $1; exit }')
    fi
    [ -n "$d" ] && pkgs+=("$d")
  done
  # libcap2-bin: setcap, for the daemon's file capability (Containerfile).
  pkgs+=(libcap2-bin)
  include=$(printf '%s\n' "${pkgs[@]}" | sort -u | paste -sd,)
  echo "build.sh: debootstrap bookworm (minbase + $include)" >&2
  debootstrap --variant=minbase --include="$include" bookworm "$WORK/root" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
  rm -rf "$WORK"/root/usr/share/{doc,man,info,locale} "$WORK"/root/var/cache/apt/* "$WORK"/root/var/lib/apt/lists/*
  BASE_TAR="$WORK/base.tar"
  tar -C "$WORK/root" -cf "$BASE_TAR" .
  rm -rf "$WORK/root"
fi
podman import --quiet "$BASE_TAR" "$BASE" >/dev/null || die "podman import of the base failed"
echo "build.sh: base image $BASE imported ($((SECONDS - t0)) s)" >&2

mkdir -p "$WORK/context"
cp "$HERE/Containerfile" "$WORK/context/"
cp "$DEB" "$WORK/context/cxltier.deb"
# No network while building: the base and the .deb are all there is. One
# layer on the base (--layers=false): the steps are one install.
podman build --quiet --layers=false --network none --build-arg BASE="$BASE" -t "$TAG" "$WORK/context" >/dev/null ||
  die "podman build failed"
echo "build.sh: image $TAG built in $((SECONDS - t0)) s ($(podman image inspect -f '{{.Size}}' "$TAG") bytes)" >&2
echo "$TAG"
