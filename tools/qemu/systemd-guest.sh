#!/usr/bin/env bash
# A real systemd host in QEMU: a minimal Debian 12 root filesystem
# (debootstrap, cached), booted with systemd as PID 1 from an initramfs, with
# a CPU-less second NUMA node. Our .deb goes in, and tests/e2e/systemd_guest_test.sh
# runs as a boot service and reports on the serial console.
#
#   tools/qemu/systemd-guest.sh --deb FILE [--cache DIR] [--memory MiB] [--timeout SECONDS]
#
# The root filesystem holds systemd and what the .deb depends on and
# recommends (read from its Depends and Recommends, as apt would install them:
# the libraries, python3 and python3-numpy for the module), nothing else; it is
# cached as a compressed cpio keyed by that package list, so later runs skip
# debootstrap.
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
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
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
fetch_kernel "$CACHE"

# ---- the root filesystem: systemd + the .deb's Depends and Recommends, cached ----
deps=(systemd systemd-sysv procps)
for d in $(dpkg-deb -f "$DEB" Depends Recommends | sed -E 's/^[A-Za-z]+: //' | tr ',' '\n' |
  sed -E 's/\(.*\)//; s/\|.*//; s/ //g'); do
  # A virtual package (libspdlog1.10-fmt9) names the real one that provides it.
  if [ -z "$(apt-cache show --no-all-versions "$d" 2>/dev/null)" ]; then
    d=$(apt-cache showpkg "$d" | awk '/^Reverse Provides:/ { getline; print $1; exit }')
  fi
  [ -n "$d" ] && deps+=("$d")
done
KEY=$(printf '%s\n' "${deps[@]}" | sort -u | sha256sum | cut -c1-12)
ROOTFS="$CACHE/systemd-rootfs-$KEY.cpio.gz"
if [ ! -f "$ROOTFS" ]; then
  t0=$SECONDS
  DIR=$(mktemp -d /tmp/cxltier-rootfs.XXXXXX)
  include=$(printf '%s\n' "${deps[@]}" | sort -u | paste -sd,)
  debootstrap --variant=minbase --include="$include" bookworm "$DIR" "$MIRROR" \
    >"$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log"; die "debootstrap failed"; }
  rm -rf "$DIR"/usr/share/{doc,man,info,locale} "$DIR"/var/cache/apt/* "$DIR"/var/lib/apt/lists/*
  echo cxltier-guest > "$DIR/etc/hostname"
  # The serial console is the test's; no login prompts anywhere.
  for u in serial-getty@ttyS0.service getty@tty1.service; do
    ln -sf /dev/null "$DIR/etc/systemd/system/$u"
  done
  ( cd "$DIR" && find . | cpio -o -H newc --quiet | gzip -1 ) > "$ROOTFS.tmp"
  mv "$ROOTFS.tmp" "$ROOTFS"
  rm -rf "$DIR"
  echo "systemd-guest.sh: root filesystem built in $((SECONDS - t0)) s ($(du -h "$ROOTFS" | cut -f1))" >&2
fi

# ---- the overlay: our package, the test and the unit that runs it ----
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/root" "$STAGE/etc/systemd/system/multi-user.target.wants" "$STAGE/cxltier-boot"
cp "$DEB" "$STAGE/root/cxltier.deb"
cp "$ROOT/tests/e2e/systemd_guest_test.sh" "$STAGE/root/systemd_guest_test.sh"
chmod +x "$STAGE/root/systemd_guest_test.sh"
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
exec $B switch_root /newroot /lib/systemd/systemd
INIT
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
