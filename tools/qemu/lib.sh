# Sourced by the guest scripts (guest.sh, systemd-guest.sh).

# fetch_kernel CACHE [6.1|6.12]: the guest's kernel, unpacked with `dpkg -x`
# into CACHE/<package>/ and kept there; never installed on the host. Sets
# VMLINUZ (the image), MODDIR (its modules) and KVER (its release, what the
# guest's `uname -r` prints).
#   6.1 (the default): Debian 12's current amd64 kernel, what the host's
#     linux-image-amd64 points to, fetched with `apt-get download`.
#   6.12: Debian 13 (trixie)'s, fetched by name from deb.debian.org (see
#     fetch_trixie_kernel).
fetch_kernel() {
  local cache=$1 series=${2:-6.1} kpkg kdir
  mkdir -p "$cache"
  case "$series" in
    6.1)
      kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
      if [ -z "$kpkg" ]; then
        apt-get update -qq >/dev/null 2>&1 || true
        kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
      fi
      [ -n "$kpkg" ] || die "cannot resolve linux-image-amd64 to a kernel package (no apt lists?)"
      case "$kpkg" in linux-image-6.1.*) ;; *) die "linux-image-amd64 is $kpkg here, not a 6.1 kernel" ;; esac
      kdir="$cache/$kpkg"
      if [ ! -f "$kdir/.unpacked" ]; then
        rm -rf "$kdir" && mkdir -p "$kdir/dl"
        ( cd "$kdir/dl" && apt-get download "$kpkg" >/dev/null 2>&1 ) || die "apt-get download $kpkg failed"
        dpkg -x "$kdir"/dl/*.deb "$kdir/root"
        rm -rf "$kdir/dl"
        touch "$kdir/.unpacked"
      fi ;;
    6.12)
      fetch_trixie_kernel "$cache"   # sets kpkg
      kdir="$cache/$kpkg" ;;
    *) die "kernel '$series': 6.1 or 6.12" ;;
  esac
  KVER=${kpkg#linux-image-}
  VMLINUZ="$kdir/root/boot/vmlinuz-$KVER"
  MODDIR="$kdir/root/lib/modules/$KVER"
  # Debian 13's packages put it under /usr (merged /usr).
  [ -d "$MODDIR" ] || MODDIR="$kdir/root/usr/lib/modules/$KVER"
  [ -d "$MODDIR" ] || die "no modules for $KVER in $kdir"
  [ -f "$VMLINUZ" ] || die "no kernel image in $kdir"
  echo "${0##*/}: kernel $KVER" >&2
}

# fetch_trixie_kernel CACHE: sets kpkg to the package Debian 13's
# linux-image-amd64 depends on (linux-image-6.12.*-amd64) and unpacks it into
# CACHE/$kpkg/root. The chain of trust is apt's: the suite's InRelease is
# checked with gpgv against the host's debian-archive-keyring, the
# Packages.xz against its SHA256 there, the .deb against its SHA256 in
# Packages. Only what is not cached is fetched; with no network, the newest
# 6.12 kernel already in the cache is used (with a warning).
TRIXIE_MIRROR=${TRIXIE_MIRROR:-http://deb.debian.org/debian}
fetch_trixie_kernel() {
  local cache=$1 idx="$1/trixie-index" keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  local sum file sha
  mkdir -p "$idx"
  # stanza PACKAGE: that package's paragraph of the index.
  stanza() { xz -dc "$idx/Packages.xz" | awk -v p="$1" 'BEGIN {RS = ""} {split($0, l, "\n")} l[1] == "Package: " p && !n++'; }
  kpkg=""
  if curl -sSfL --retry 2 -o "$idx/InRelease.new" "$TRIXIE_MIRROR/dists/trixie/InRelease" 2>"$idx/curl.err"; then
    [ -f "$keyring" ] || die "no $keyring (apt-get install debian-archive-keyring) to check trixie's InRelease"
    gpgv --keyring "$keyring" "$idx/InRelease.new" >/dev/null 2>&1 || die "trixie's InRelease: bad signature"
    grep -q '^Codename: trixie$' "$idx/InRelease.new" || die "trixie's InRelease names another codename"
    mv "$idx/InRelease.new" "$idx/InRelease"
    sum=$(awk '/^SHA256:/ {s = 1; next} /^[^ ]/ {s = 0} s && $3 == "main/binary-amd64/Packages.xz" {print $1}' "$idx/InRelease")
    [ -n "$sum" ] || die "trixie's InRelease lists no main/binary-amd64/Packages.xz"
    if ! echo "$sum  $idx/Packages.xz" | sha256sum -c --status 2>/dev/null; then
      curl -sSfL --retry 2 -o "$idx/Packages.xz" "$TRIXIE_MIRROR/dists/trixie/main/binary-amd64/Packages.xz" ||
        die "cannot fetch trixie's Packages.xz"
      echo "$sum  $idx/Packages.xz" | sha256sum -c --status || die "trixie's Packages.xz: SHA256 mismatch"
    fi
    kpkg=$(stanza linux-image-amd64 | sed -n 's/^Depends: \(linux-image-[0-9][^ ,]*\).*/\1/p')
    [ -n "$kpkg" ] || die "trixie's linux-image-amd64 depends on no linux-image-* package"
  else
    kpkg=$(cd "$cache" && ls -d linux-image-6.12.*/.unpacked 2>/dev/null | sort -V | tail -n 1) || true
    kpkg=${kpkg%/.unpacked}
    [ -n "$kpkg" ] || die "cannot reach $TRIXIE_MIRROR ($(cat "$idx/curl.err")) and no 6.12 kernel is cached"
    echo "${0##*/}: cannot reach $TRIXIE_MIRROR; using the cached $kpkg" >&2
  fi
  case "$kpkg" in linux-image-6.12.*-amd64) ;; *) die "trixie's linux-image-amd64 is $kpkg, not a 6.12 kernel" ;; esac
  local kdir="$cache/$kpkg"
  [ -f "$kdir/.unpacked" ] && return 0
  file=$(stanza "$kpkg" | sed -n 's/^Filename: //p')
  sha=$(stanza "$kpkg" | sed -n 's/^SHA256: //p')
  [ -n "$file" ] && [ -n "$sha" ] || die "trixie's index has no Filename/SHA256 for $kpkg"
  rm -rf "$kdir" && mkdir -p "$kdir/dl"
  echo "${0##*/}: fetching $file" >&2
  curl -sSfL --retry 2 -o "$kdir/dl/k.deb" "$TRIXIE_MIRROR/$file" || die "cannot fetch $TRIXIE_MIRROR/$file"
  echo "$sha  $kdir/dl/k.deb" | sha256sum -c --status || die "$file: SHA256 mismatch"
  dpkg -x "$kdir/dl/k.deb" "$kdir/root"
  rm -rf "$kdir/dl"
  touch "$kdir/.unpacked"
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

# module_cat PATH: a module's .ko, decompressed (Debian 12's modules are
# plain .ko, Debian 13's .ko.xz; the guest's busybox insmod is given plain ones).
module_cat() {
  case "$1" in
    *.ko.xz) xz -dc "$1" ;;
    *.ko.zst) zstd -qdc "$1" ;;
    *.ko.gz) gzip -dc "$1" ;;
    *) cat "$1" ;;
  esac
}

# module_paths MODDIR NAME...: the module files (.ko, or .ko.xz, .ko.zst,
# .ko.gz) of the named modules and of every module they need (each module's
# own .modinfo depends=), dependencies first, one per line, each once; a
# module built into the kernel prints nothing.
module_paths() {
  local moddir=$1
  shift
  declare -A seen=()
  visit() {
    local name=$1 path dep
    [ -n "${seen[$name]:-}" ] && return 0
    seen[$name]=1
    path=$(find "$moddir" \( -name "$name.ko" -o -name "$name.ko.xz" -o -name "$name.ko.zst" -o -name "$name.ko.gz" \) -print -quit)
    [ -n "$path" ] || return 0
    for dep in $(module_cat "$path" | strings -a | sed -n 's/^depends=//p' | tr ',' ' '); do visit "$dep"; done
    echo "$path"
  }
  local m
  for m in "$@"; do visit "$m"; done
}
