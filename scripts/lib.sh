# Shared helpers for the scripts in this folder. Source it; do not run it.
set -euo pipefail

CXLTIER_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$CXLTIER_ROOT/build}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

# Debian 12 packages the build and the tests need.
CXLTIER_PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang-format clang
  libxxhash-dev nlohmann-json3-dev libcli11-dev libfmt-dev libspdlog-dev
  libgtest-dev libgmock-dev libbenchmark-dev gnuplot-nox
  libhwloc-dev libnuma-dev libboost-dev libtomlplusplus-dev libsystemd-dev
  qemu-system-x86 busybox-static cpio debootstrap ndctl daxctl python3 python3-prometheus-client systemd
  pybind11-dev python3-dev python3-numpy python3-pytest prometheus
)

log() { printf '[cxltier] %s\n' "$*"; }

# ensure_packages: installs whatever in CXLTIER_PACKAGES is missing (needs root).
ensure_packages() {
  local missing=()
  for p in "${CXLTIER_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    log "missing Debian packages: ${missing[*]}"
    log "run as root, or: sudo apt-get install ${missing[*]}"
    return 1
  fi
  log "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# build: configure (once) and build everything into $BUILD_DIR; binaries in $BUILD_DIR/bin.
build() {
  cmake -S "$CXLTIER_ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCXLTIER_WERROR=ON "$@" >/dev/null
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

# cmake_generator GENERATOR DIR: forgets DIR's CMake cache if it was made with
# another generator (CMake refuses to switch one), keeping what DIR holds.
cmake_generator() {
  local cache="$2/CMakeCache.txt"
  if [ -f "$cache" ] && ! grep -qx "CMAKE_GENERATOR:INTERNAL=$1" "$cache"; then
    rm -rf "$cache" "$2/CMakeFiles"
  fi
}

# configure_unity DIR CMAKE_ARGS...: configures DIR with Ninja and unity
# builds of the libraries and tools (never of the tests: tests/CMakeLists.txt
# opts them out, their helpers share short names across files), for the
# trees a run builds whole (the sanitizers', the fuzzers'). Ninja, because
# CMake's Makefiles build the targets named to --target one after another
# (.NOTPARALLEL), each single-file test on one core; unity builds, because
# the files share Boost.Asio, nlohmann/json and fmt, whose instrumented code
# is then generated once per batch of files, not once per file. The ASan
# tree on this 2-core VM: 633 s with Make, 492 s with Ninja, 348 s with both
# (docs/testing.md).
configure_unity() {
  local dir=$1
  shift
  cmake_generator Ninja "$dir"
  cmake -G Ninja -S "$CXLTIER_ROOT" -B "$dir" -DCMAKE_UNITY_BUILD=ON "$@" >/dev/null
}

# stage NAME CMD...: runs CMD and prints one timing line for it.
stage() {
  local name=$1
  shift
  local t0=$SECONDS
  log "stage $name: start"
  if "$@"; then
    log "stage $name: ok in $((SECONDS - t0)) s"
  else
    local rc=$?
    log "stage $name: FAILED (exit $rc) after $((SECONDS - t0)) s"
    return $rc
  fi
}
