#!/usr/bin/env bash
# Builds cxltierd's OCI image with podman, pulling nothing from an image
# registry: a Debian 12 root made with debootstrap (minbase, plus what the
# .deb depends on), imported as the base image, then the Containerfile
# installs the .deb into it.
#
#   deploy/container/build.sh --deb FILE [--tag NAME] [--base-tar FILE] [--mirror URL]
#   deploy/container/build.sh --deb FILE --save-base FILE [--mirror URL]
#
#   --deb        the package (bash scripts/package.sh builds it)
#   --tag        the image's name (default localhost/cxltier:VERSION, VERSION the .deb's)
#   --base-tar   a tar of the base root, made before with --save-base, instead
#                of debootstrapping one now
#   --save-base  only debootstrap the base root and write its tar to FILE
#                (podman not needed): the QEMU systemd test makes its guest's
#                root from it and builds the image in the guest with --base-tar
#   --mirror     the Debian mirror for debootstrap (default http://deb.debian.org/debian)
#
# Needs root (debootstrap; podman's rootful storage is what the host's
# container runtime runs from), podman and python3. docs/deploy.md ("Image").
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEB="" TAG="" BASE_TAR="" SAVE_BASE="" MIRROR=${CXLTIER_DEBIAN_MIRROR:-http://deb.debian.org/debian}
die() { echo "build.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --deb) DEB=${2:-}; shift 2 ;;
    --tag) TAG=${2:-}; shift 2 ;;
    --base-tar) BASE_TAR=${2:-}; shift 2 ;;
    --save-base) SAVE_BASE=${2:-}; shift 2 ;;
    --mirror) MIRROR=${2:-}; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
done
[ -f "$DEB" ] || die "give --deb with the package (bash scripts/package.sh builds it)"
[ -z "$BASE_TAR" ] || [ -f "$BASE_TAR" ] || die "--base-tar $BASE_TAR: no such file"
[ -z "$BASE_TAR" ] || [ -z "$SAVE_BASE" ] || die "--base-tar and --save-base do not go together"
[ -n "$SAVE_BASE" ] || command -v podman >/dev/null || die "podman is not installed (apt-get install podman)"
[ "$(id -u)" -eq 0 ] || die "run as root (debootstrap, and the rootful image store)"
VERSION=$(dpkg-deb -f "$DEB" Version)
TAG=${TAG:-localhost/cxltier:$VERSION}
BASE=localhost/cxltier-base:bookworm
WORK=$(mktemp -d /var/tmp/cxltier-image.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
t0=$SECONDS

# What `apt-get install --no-install-recommends` would add with the .deb (the
# customary way to fill an image): its Depends, a virtual package (such as
# libspdlog1.10-fmt9) named by what provides it. Its Recommends (python3 and
# python3-numpy, for the Python module) stay out: the daemon and the tools
# need neither. libcap2-bin: setcap, for the daemon's file capability
# (Containerfile).
base_packages() {
  local d p pkgs=(libcap2-bin)
  for d in $(dpkg-deb -f "$DEB" Depends | sed -E 's/^[A-Za-z]+: //' | tr ',' '\n' |
    sed -E 's/\(.*\)//; s/\|.*//; s/ //g'); do
    p=$d
    if [ -z "$(apt-cache show --no-all-versions "$d" 2>/dev/null)" ]; then
      p=$(apt-cache showpkg "$d" | awk '/^Reverse Provides:/ { getline; print $1; exit }')
    fi
    [ -n "$p" ] || die "no Debian package provides $d (apt-get update?)"
    pkgs+=("$p")
  done
  printf '%s\n' "${pkgs[@]}" | sort -u | paste -sd,
}

if [ -z "$BASE_TAR" ]; then
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  include=$(base_packages)
  echo "build.sh: debootstrap bookworm (minbase + $include)" >&2
  debootstrap --variant=minbase --include="$include" bookworm "$WORK/root" "$MIRROR" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
  rm -rf "$WORK"/root/usr/share/{doc,man,info,locale} "$WORK"/root/var/cache/apt/* "$WORK"/root/var/lib/apt/lists/*
  BASE_TAR=${SAVE_BASE:-$WORK/base.tar}
  tar -C "$WORK/root" -cf "$BASE_TAR.tmp" .
  mv "$BASE_TAR.tmp" "$BASE_TAR"
  rm -rf "$WORK/root"
  echo "build.sh: base root debootstrapped in $((SECONDS - t0)) s ($(du -h "$BASE_TAR" | cut -f1))" >&2
  [ -z "$SAVE_BASE" ] || exit 0
fi
podman import --quiet "$BASE_TAR" "$BASE" >/dev/null || die "podman import of the base failed"
echo "build.sh: base image $BASE imported ($((SECONDS - t0)) s)" >&2

t1=$SECONDS
mkdir -p "$WORK/context"
cp "$HERE/Containerfile" "$WORK/context/"
cp "$DEB" "$WORK/context/cxltier.deb"
# No network while building: the base and the .deb are all there is. One
# layer on the base (--layers=false): the steps are one install.
podman build --quiet --layers=false --network none --build-arg BASE="$BASE" -t "$TAG" "$WORK/context" >/dev/null ||
  die "podman build failed"
echo "build.sh: image $TAG built in $((SECONDS - t1)) s, $((SECONDS - t0)) s in all ($(podman image inspect -f '{{.Size}}' "$TAG") bytes)" >&2
echo "$TAG"
