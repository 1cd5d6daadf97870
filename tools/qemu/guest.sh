#!/usr/bin/env bash
# Builds a QEMU guest from Debian's kernel, busybox and our binaries, boots it
# with a CPU-less second NUMA node (or an emulated CXL Type-3 device, or both:
# the hmat shape has three memory nodes), runs a command inside, and exits with
# that command's status.
#
#   tools/qemu/guest.sh --shape numa|hmat|cxl [--run 'CMD'] [--shell] [--file SRC:DST]...
#                       [--bin DIR] [--cache DIR] [--memory MiB] [--timeout SECONDS]
#                       [--disk FILE] [--append 'KERNEL ARGS'] [--kernel 6.1|6.12]
#
# --disk gives the guest FILE as a virtio disk (/dev/vda): a device that reads
# guest memory by DMA (cxltier-replay --access device). --append adds to the
# kernel's command line (the comparison passes rootfstype=ramfs: a ramfs root
# cannot be reclaimed, so the kernel never demotes our binaries' pages to the
# CXL node, from which QEMU's TCG cannot execute).
#
# --kernel picks the guest's kernel: 6.1 (the default) is Debian 12's, the
# package the host's linux-image-amd64 points to, fetched with `apt-get
# download`; 6.12 is Debian 13 (trixie)'s, the package trixie's
# linux-image-amd64 points to, fetched from deb.debian.org with its index
# (signature and checksums checked; tools/qemu/lib.sh). Either is unpacked
# with `dpkg -x` into the cache and never installed on the host. With 6.12 the
# cxl and hmat shapes boot with pcie_ports=compat and -cpu max,hypervisor=off:
# without them its CXL memdev and region do not come up (docs/testing.md).
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHAPE=numa
BIN="$ROOT/build/bin"
CACHE="$ROOT/build/qemu-cache"
RUN=""
INTERACTIVE=0
MEMORY=2048
TIMEOUT=600
FILES=()
DISK=""
APPEND=""
KERNEL=6.1

die() { echo "guest.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --shape) SHAPE=$2; shift 2 ;;
    --run) RUN=$2; shift 2 ;;
    --shell) INTERACTIVE=1; shift ;;
    --file) FILES+=("$2"); shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --memory) MEMORY=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --disk) DISK=$2; shift 2 ;;
    --append) APPEND=$2; shift 2 ;;
    --kernel) KERNEL=$2; shift 2 ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) die "unknown argument '$1'" ;;
  esac
done
case "$SHAPE" in numa|hmat|cxl) ;; *) die "--shape must be numa, hmat or cxl" ;; esac
[ -n "$RUN" ] || [ "$INTERACTIVE" = 1 ] || die "give --run 'command' or --shell"
[ -z "$DISK" ] || [ -f "$DISK" ] || die "--disk $DISK: no such file"
case "$KERNEL" in 6.1|6.12) ;; *) die "--kernel must be 6.1 or 6.12" ;; esac

need() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  [ "$(id -u)" -eq 0 ] || die "missing Debian packages: ${missing[*]} (apt-get install them)"
  echo "guest.sh: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
}
need qemu-system-x86 busybox-static cpio
# The cxl and hmat shapes have the emulated CXL Type-3 device.
HAS_CXL=0
case "$SHAPE" in cxl|hmat) HAS_CXL=1 ;; esac
[ "$HAS_CXL" = 1 ] && need ndctl daxctl

# ---- the kernel, cached per version ----
source "$ROOT/tools/qemu/lib.sh"
fetch_kernel "$CACHE" "$KERNEL"   # sets VMLINUZ, MODDIR, KVER

# ---- the initramfs ----
STAGE=$(mktemp -d)
# The guest's / (mktemp made it 0700): other users must reach /tmp and /bin.
chmod 755 "$STAGE"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,sbin,dev,proc,sys,tmp,run,etc,root,var/lib,lib/modules}
cp /bin/busybox "$STAGE/bin/busybox"

# copy_with_libs FILE DEST: the file and every library ldd finds, at the same paths.
copy_with_libs() {
  local file=$1 dest=$2
  mkdir -p "$STAGE$(dirname "$dest")"
  cp -L "$file" "$STAGE$dest"
  { ldd "$file" 2>/dev/null || true; } | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' |
    while read -r lib; do
      [ -e "$STAGE$lib" ] && continue
      mkdir -p "$STAGE$(dirname "$lib")"
      cp -L "$lib" "$STAGE$lib"
    done
}
for b in cxltierd cxltier-loadgen cxltierctl cxltier-replay; do
  [ -x "$BIN/$b" ] || die "$BIN/$b not built"
  copy_with_libs "$BIN/$b" "/bin/$b"
done
for f in "${FILES[@]}"; do
  copy_with_libs "${f%%:*}" "${f#*:}"
done

# Modules and their dependencies, in load order.
mods=()
if [ "$HAS_CXL" = 1 ]; then
  for t in cxl daxctl ndctl; do copy_with_libs "$(command -v $t)" "/bin/$t"; done
  mods+=(cxl_acpi cxl_pci cxl_port cxl_mem cxl_pmem libnvdimm nd_pmem dax_pmem device_dax kmem)
fi
[ -z "$DISK" ] || mods+=(virtio_pci virtio_blk)
MODULES=""
for path in $(module_paths "$MODDIR" "${mods[@]}"); do
  name=$(basename "$path") && name=${name%%.ko*}
  module_cat "$path" > "$STAGE/lib/modules/$name.ko"
  MODULES+=" $name"
done

cat > "$STAGE/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /run
mkdir -p /var/lib /tmp  # the initramfs root is writable; a tmpfs on /tmp would hide libraries copied under /tmp
for m in $MODULES; do insmod /lib/modules/\$m.ko 2>/dev/null || echo "insmod \$m failed"; done
echo CXLTIER-GUEST-START
cd /root
if [ "$INTERACTIVE" = 1 ]; then
  setsid cttyhack sh
  rc=0
else
  sh -c '$(printf "%s" "$RUN" | sed "s/'/'\\\\''/g")'
  rc=\$?
fi
echo "CXLTIER-GUEST-EXIT \$rc"
sync
poweroff -f
INIT
chmod +x "$STAGE/init"
INITRD="$CACHE/initrd-$SHAPE.gz"
( cd "$STAGE" && find . | cpio -o -H newc --quiet | gzip -1 ) > "$INITRD"

# ---- the machine ----
HALF=$((MEMORY / 2))
CPU=max
if [ "$KERNEL" = 6.12 ] && [ "$HAS_CXL" = 1 ]; then
  # 6.12 only (6.1 boots as before). Without pcie_ports=compat the PCIe port
  # services claim the CXL root ports and no memdev comes up (`cxl list -M`
  # is empty); with it but with the hypervisor CPUID bit, committing the
  # region fails ("Failed to synchronize CPU cache state": 6.12 will not
  # invalidate CPU caches for a region in a guest). Seen 2026-12-05.
  CPU=max,hypervisor=off
  APPEND="pcie_ports=compat $APPEND"
fi
echo "guest.sh: the $SHAPE guest, kernel $KVER, -cpu $CPU" >&2
ARGS=(-accel tcg -cpu "$CPU" -smp 2 -nographic -no-reboot -m "${MEMORY}M"
      -kernel "$VMLINUZ" -initrd "$INITRD"
      -append "console=ttyS0 panic=-1 loglevel=3 memhp_default_state=offline $APPEND")
case "$SHAPE" in
  numa)
    ARGS+=(-machine q35
           -object memory-backend-ram,id=m0,size=${HALF}M -object memory-backend-ram,id=m1,size=${HALF}M
           -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,memdev=m1
           -numa dist,src=0,dst=1,val=20) ;;
  hmat)
    # Three memory nodes: node 0 with the CPUs, node 1 CPU-less at 150 ns in
    # HMAT, and the CXL device below, onlined in the guest as node 2.
    ARGS+=(-machine q35,hmat=on,cxl=on
           -object memory-backend-ram,id=m0,size=${HALF}M -object memory-backend-ram,id=m1,size=${HALF}M
           -numa node,nodeid=0,cpus=0-1,memdev=m0 -numa node,nodeid=1,memdev=m1,initiator=0
           -numa dist,src=0,dst=1,val=20
           -numa hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-latency,latency=10
           -numa hmat-lb,initiator=0,target=0,hierarchy=memory,data-type=access-bandwidth,bandwidth=20G
           -numa hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-latency,latency=150
           -numa hmat-lb,initiator=0,target=1,hierarchy=memory,data-type=access-bandwidth,bandwidth=5G) ;;
  cxl)
    ARGS+=(-machine q35,cxl=on
           -object memory-backend-ram,id=m0,size=${MEMORY}M -numa node,nodeid=0,cpus=0-1,memdev=m0) ;;
esac

if [ "$HAS_CXL" = 1 ]; then
  # QEMU 7.2 has only a persistent memdev for cxl-type3, so: pmem region ->
  # devdax -> kmem. A second, empty root port is needed (see docs/testing.md).
  # Fresh backing files every boot (the boot loop below removes them): stale
  # namespace labels in the LSA would make the guest's namespace creation fail. An SRAT (explicit nodes) is what
  # lets the kernel give the CXL window a node of its own. QEMU 7.2 cannot put
  # the window in HMAT (it is no -numa node), so the guest's kernel knows no
  # latency for it; it puts kmem memory in a lower memory tier.
  ARGS+=(-object memory-backend-file,id=cxl-mem0,share=on,mem-path="$CACHE/cxl-mem0-$SHAPE.raw",size=512M
         -object memory-backend-file,id=cxl-lsa0,share=on,mem-path="$CACHE/cxl-lsa0-$SHAPE.raw",size=256M
         -device pxb-cxl,bus_nr=12,bus=pcie.0,id=cxl.1
         -device cxl-rp,port=0,bus=cxl.1,id=root_port13,chassis=0,slot=2
         -device cxl-rp,port=1,bus=cxl.1,id=root_port14,chassis=0,slot=3
         -device cxl-type3,bus=root_port13,memdev=cxl-mem0,lsa=cxl-lsa0,id=cxl-pmem0
         -M cxl-fmw.0.targets.0=cxl.1,cxl-fmw.0.size=4G)
fi

if [ -n "$DISK" ]; then
  ARGS+=(-drive "file=$DISK,if=none,id=disk0,format=raw,cache=unsafe"
         -device virtio-blk-pci,drive=disk0,bus=pcie.0)
fi

LOG="$CACHE/console-$SHAPE.log"
start=$SECONDS
if [ "$INTERACTIVE" = 1 ]; then
  exec qemu-system-x86_64 "${ARGS[@]}"
fi
# A kernel that panics before our init runs has run none of the guest's work:
# boot it again, twice at most. Seen under TCG with 6.12: an int3 oops in
# sched_clock_cpu while the boot patches its static keys, 4 s in.
for attempt in 1 2 3; do
  if [ "$HAS_CXL" = 1 ]; then rm -f "$CACHE/cxl-mem0-$SHAPE.raw" "$CACHE/cxl-lsa0-$SHAPE.raw"; fi
  set +e
  # Line-buffered all the way: the console log and our output follow the guest
  # as it runs (a block-buffered tr held back up to 4 KiB).
  timeout --kill-after=30 "$TIMEOUT" qemu-system-x86_64 "${ARGS[@]}" </dev/null 2>&1 | stdbuf -oL tr -d '\r' |
    tee "$LOG" | sed -u -n '/CXLTIER-GUEST-START/,$p' | grep --line-buffered -v '^CXLTIER-GUEST-START'
  qemu_rc=${PIPESTATUS[0]}
  set -e
  grep -q '^CXLTIER-GUEST-START' "$LOG" && break
  grep -q 'Kernel panic' "$LOG" || break
  echo "guest.sh: the $SHAPE guest's kernel panicked before init (attempt $attempt of 3):" >&2
  grep -m 3 'Oops\|RIP:\|Kernel panic' "$LOG" >&2 || true
done
finish_guest "guest.sh: the $SHAPE guest (qemu exit $qemu_rc)" "$LOG" CXLTIER-GUEST-EXIT "$start"
