# Sourced by the guest scripts: Debian's current amd64 kernel, fetched with
# `apt-get download` (what linux-image-amd64 points to) and unpacked with
# `dpkg -x` into the cache; never installed on the host.
# fetch_kernel CACHE: sets VMLINUZ (the image) and MODDIR (its modules).
fetch_kernel() {
  local cache=$1 kpkg kver kdir
  mkdir -p "$cache"
  kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [ -z "$kpkg" ]; then
    apt-get update -qq >/dev/null 2>&1 || true
    kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  fi
  [ -n "$kpkg" ] || die "cannot resolve linux-image-amd64 to a kernel package (no apt lists?)"
  kver=${kpkg#linux-image-}
  kdir="$cache/$kpkg"
  if [ ! -f "$kdir/.unpacked" ]; then
    rm -rf "$kdir" && mkdir -p "$kdir/dl"
    ( cd "$kdir/dl" && apt-get download "$kpkg" >/dev/null 2>&1 ) || die "apt-get download $kpkg failed"
    dpkg -x "$kdir"/dl/*.deb "$kdir/root"
    rm -rf "$kdir/dl"
    touch "$kdir/.unpacked"
  fi
  VMLINUZ="$kdir/root/boot/vmlinuz-$kver"
  MODDIR="$kdir/root/lib/modules/$kver"
  [ -f "$VMLINUZ" ] || die "no kernel image in $kdir"
}
