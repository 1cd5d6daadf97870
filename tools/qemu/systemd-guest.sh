#!/usr/bin/env bash
# A real systemd host in QEMU: a minimal Debian 12 root filesystem
# (debootstrap, cached), booted with systemd as PID 1 from an initramfs, with
# a CPU-less second NUMA node. Our .deb goes in, and
# tests/e2e/systemd_guest_test.sh (then, in the same boot,
# tests/e2e/container_guest_test.sh) runs as a boot service and reports on
# the serial console.
#
#   tools/qemu/systemd-guest.sh --deb FILE [--cache DIR] [--memory MiB] [--timeout SECONDS]
#
# The root filesystem is the container image's base root (debootstrapped by
# deploy/container/build.sh --save-base: minbase and the .deb's Depends) plus
# systemd-sysv, procps, the .deb's Recommends (python3, python3-numpy for the
# module), podman and the base's own tar, nothing else. It is cached as a
# compressed cpio keyed by that recipe, so later runs skip debootstrap and apt.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE="$ROOT/build/qemu-cache"
DEB=""
MEMORY=2048
TIMEOUT=900
MIRROR=${CXLTIER_DEBIAN_MIRROR:-http://deb.debian.org/debian}

die() { echo "systemd-guest.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --deb) DEB=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --memory) MEMORY=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    -h|--help) sed -n "2,16p" "$0"; exit 0 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
[ -f "$DEB" ] || die "give --deb with the package to test (bash scripts/package.sh builds it)"
[ "$(id -u)" -eq 0 ] || die "debootstrap needs root"
for p in qemu-system-x86 debootstrap cpio busybox-static; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" >/dev/null
done
source "$ROOT/tools/qemu/lib.sh"
fetch_kernel "$CACHE"   # sets VMLINUZ, MODDIR

# ---- the root filesystem: the image's base + systemd, python, podman; cached ----
# The base is what deploy/container/build.sh debootstraps for the image
# (minbase, the .deb's Depends, libcap2-bin); its tar, in the root as
# /var/tmp/cxltier-base.tar, is the container test's base image. The guest's
# root is that base plus, with the root's own apt, systemd-sysv and procps,
# the .deb's Recommends (python3 and python3-numpy, for the Python module's
# check) and the container engine (rootful podman 4.3 with crun; netavark,
# which podman's configuration package needs even with --network none;
# catatonit, its init).
extras=(systemd-sysv procps podman crun conmon catatonit netavark)
for d in $(dpkg-deb -f "$DEB" Recommends | sed -E 's/^[A-Za-z]+: //' | tr ',' '\n' |
  sed -E 's/\(.*\)//; s/\|.*//; s/ //g'); do
  extras+=("$d")
done
# The key: the recipe (this list, build.sh, the .deb's fields). Any change
# builds a new root from scratch (and drops the old ones).
KEY=$( { echo recipe-3; printf '%s\n' "${extras[@]}"; dpkg-deb -f "$DEB" Depends Recommends;
  cat "$ROOT/deploy/container/build.sh"; } | sha256sum | cut -c1-12)
ROOTFS="$CACHE/systemd-rootfs-$KEY.cpio.gz"
if [ ! -f "$ROOTFS" ]; then
  t0=$SECONDS
  rm -f "$CACHE"/systemd-rootfs-*.cpio.gz
  DIR=$(mktemp -d /tmp/cxltier-rootfs.XXXXXX)
  BASETAR="$DIR.base.tar"
  bash "$ROOT/deploy/container/build.sh" --deb "$DEB" --mirror "$MIRROR" --save-base "$BASETAR" ||
    die "build.sh --save-base failed"
  t1=$SECONDS
  tar -C "$DIR" -xf "$BASETAR"
  { chroot "$DIR" apt-get update -qq &&
    chroot "$DIR" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${extras[@]}"
  } >"$CACHE/apt-extras.log" 2>&1 || { tail -20 "$CACHE/apt-extras.log"; die "apt-get install ${extras[*]} in the root failed"; }
  rm -rf "$DIR"/usr/share/{doc,man,info,locale} "$DIR"/var/cache/apt/* "$DIR"/var/lib/apt/lists/*
  echo cxltier-guest > "$DIR/etc/hostname"
  # The serial console is the test's; no login prompts anywhere. Podman's
  # units (the API socket, restarting containers at boot) stay off: the test
  # runs podman itself.
  for u in serial-getty@ttyS0.service getty@tty1.service podman.socket podman.service \
    podman-restart.service podman-auto-update.timer; do
    ln -sf /dev/null "$DIR/etc/systemd/system/$u"
  done
  basesize=$(du -h "$BASETAR" | cut -f1)
  mv "$BASETAR" "$DIR/var/tmp/cxltier-base.tar"
  ( cd "$DIR" && find . | cpio -o -H newc --quiet | gzip -1 ) > "$ROOTFS.tmp"
  mv "$ROOTFS.tmp" "$ROOTFS"
  rm -rf "$DIR"
  echo "systemd-guest.sh: root filesystem built in $((SECONDS - t0)) s (base $((t1 - t0)) s, its tar $basesize; the rest $((SECONDS - t1)) s; root $(du -h "$ROOTFS" | cut -f1))" >&2
fi

# ---- the overlay: our package, the test and the unit that runs it ----
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/root" "$STAGE/etc/systemd/system/multi-user.target.wants" "$STAGE/cxltier-boot"
cp "$DEB" "$STAGE/root/cxltier.deb"
cp "$ROOT/tests/e2e/systemd_guest_test.sh" "$STAGE/root/systemd_guest_test.sh"
chmod +x "$STAGE/root/systemd_guest_test.sh"
# The container test (sourced by the systemd test) and the image's recipe.
cp "$ROOT/tests/e2e/container_guest_test.sh" "$STAGE/root/container_guest_test.sh"
mkdir -p "$STAGE/root/container"
cp "$ROOT"/deploy/container/{Containerfile,build.sh,seccomp.py} "$STAGE/root/container/"
cat > "$STAGE/etc/systemd/system/cxltier-e2e.service" <<'UNIT'
[Unit]
Description=cxltier end-to-end test under systemd
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/root/systemd_guest_test.sh
StandardOutput=tty
StandardError=tty
TTYPath=/dev/ttyS0
UNIT
ln -sf ../cxltier-e2e.service "$STAGE/etc/systemd/system/multi-user.target.wants/cxltier-e2e.service"
# systemd's sandboxing (mount namespaces) cannot work on the initramfs's own
# root, which can never be unmounted or pivoted away from: /init copies the
# tree into a tmpfs and switch_roots to systemd there.
cp /bin/busybox "$STAGE/cxltier-boot/busybox"
# The kernel's overlay file system, for podman's overlay storage driver (the
# root holds no kernel modules): /init loads it.
mkdir -p "$STAGE/cxltier-boot/modules"
MODULES=""
for path in $(module_paths "$MODDIR" overlay); do
  cp "$path" "$STAGE/cxltier-boot/modules/"
  MODULES+=" $(basename "$path" .ko)"
done
cat > "$STAGE/init" <<'INIT'
#!/cxltier-boot/busybox sh
B=/cxltier-boot/busybox
$B mkdir -p /newroot
$B mount -t tmpfs -o mode=0755 tmpfs /newroot
for d in bin etc home lib lib64 opt root sbin srv usr var; do
  [ -e /$d ] || [ -L /$d ] && $B cp -a /$d /newroot/
done
$B mkdir -p /newroot/proc /newroot/sys /newroot/dev /newroot/run /newroot/tmp /newroot/mnt
$B chmod 1777 /newroot/tmp
for m in MODULES; do $B insmod /cxltier-boot/modules/$m.ko || echo "init: insmod $m failed"; done
exec $B switch_root /newroot /lib/systemd/systemd
INIT
sed -i "s|for m in MODULES;|for m in$MODULES;|" "$STAGE/init"
chmod +x "$STAGE/init"
OVERLAY="$STAGE/overlay.cpio.gz"
( cd "$STAGE" && find root etc init cxltier-boot | cpio -o -H newc --quiet | gzip -1 ) > "$OVERLAY"
# The kernel unpacks concatenated archives in order: the overlay lands on top.
cat "$ROOTFS" "$OVERLAY" > "$STAGE/initrd.gz"

HALF=$((MEMORY / 2))
LOG="$CACHE/console-systemd.log"
start=$SECONDS
set +e
timeout --kill-after=30 "$TIMEOUT" qemu-system-x86_64 -accel tcg -cpu max -smp 2 -nographic -no-reboot \
  -m "${MEMORY}M" -machine q35 \
  -object memory-backend-ram,id=m0,size=${HALF}M -object memory-backend-ram,id=m1,size=${HALF}M \
  -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,memdev=m1 -numa dist,src=0,dst=1,val=20 \
  -kernel "$VMLINUZ" -initrd "$STAGE/initrd.gz" \
  -append "console=ttyS0 panic=-1 loglevel=3 systemd.show_status=0" \
  </dev/null 2>&1 | tr -d '\r' | tee "$LOG" | grep --line-buffered '^systemd-guest:'
set -e
finish_guest "systemd-guest.sh: the systemd guest" "$LOG" CXLTIER-SYSTEMD-EXIT "$start"
