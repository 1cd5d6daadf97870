# Sourced by the guest scripts (guest.sh, systemd-guest.sh).

# fetch_kernel CACHE: Debian's current amd64 kernel, fetched with `apt-get
# download` (what linux-image-amd64 points to) and unpacked with `dpkg -x`
# into the cache, never installed on the host. Sets VMLINUZ (the image) and
# MODDIR (its modules).
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

# finish_guest NAME LOG MARKER START: says how long the guest ran and exits
# with the status the guest printed after MARKER on its console (3, with the
# console's tail, when it printed none).
finish_guest() {
  local name=$1 log=$2 marker=$3 start=$4 rc
  rc=$(sed -n "s/.*$marker \([0-9]*\).*/\1/p" "$log" | tail -n 1)
  echo "$name ran for $((SECONDS - start)) s" >&2
  if [ -z "$rc" ]; then
    echo "$name reported no result; console tail:" >&2
    tail -n 40 "$log" >&2
    exit 3
  fi
  exit "$rc"
}

# module_paths MODDIR NAME...: the .ko files of the named modules and of every
# module they need (each .ko's own .modinfo depends=), dependencies first, one
# per line, each once; a module built into the kernel prints nothing.
module_paths() {
  local moddir=$1
  shift
  declare -A seen=()
  visit() {
    local name=$1 path dep
    [ -n "${seen[$name]:-}" ] && return 0
    seen[$name]=1
    path=$(find "$moddir" -name "$name.ko" -print -quit)
    [ -n "$path" ] || return 0
    for dep in $(strings -a "$path" | sed -n 's/^depends=//p' | tr ',' ' '); do visit "$dep"; done
    echo "$path"
  }
  local m
  for m in "$@"; do visit "$m"; done
}
