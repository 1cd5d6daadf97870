#!/usr/bin/env bash
# The whole test suite: install what is missing, build with warnings as errors,
# run every test. Prints one timing line per stage and exits non-zero on failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
t_start=$SECONDS
CTEST_LOG="$BUILD_DIR/ctest-last.log"

unit_tests() {
  ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900 | tee "$CTEST_LOG"
  return "${PIPESTATUS[0]}"
}

stage deps ensure_packages
# The llama stage's Debian forky root (downloads and unpacking: minutes, little
# CPU) is made in the background while the other stages run; that stage waits
# for it. Cached under build/llama by its recipe (tools/llama/root.sh).
mkdir -p "$BUILD_DIR/llama"
bash "$CXLTIER_ROOT/tools/llama/root.sh" "$BUILD_DIR/llama/root" >"$BUILD_DIR/llama/root-background.log" 2>&1 &
LLAMA_ROOT=$!
trap 'kill "$LLAMA_ROOT" 2>/dev/null || true' EXIT
stage build build
stage format-check cmake --build "$BUILD_DIR" --target format-check
# Runs and prints, without timing assertions: the machines are shared.
bench_smoke() {
  "$BUILD_DIR/bin/cxltier-bench" --benchmark_filter='mooncake|Ingest|Tick/8192|Seed|Report' \
    --benchmark_min_time=0.01 --summary="$BUILD_DIR/bench-smoke.json" &&
    python3 -m json.tool "$BUILD_DIR/bench-smoke.json" >/dev/null
}
stage bench-smoke bench_smoke
stage unit unit_tests
# The Python module (build/python) against real daemons: pytest with Debian's
# python3, the interpreter the module is built for (tests/python, docs/python.md).
python_tests() {
  PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$BUILD_DIR/python" CXLTIER_BIN="$BUILD_DIR/bin" \
    timeout --kill-after=30 600 /usr/bin/python3 -m pytest -q -p no:cacheprovider "$CXLTIER_ROOT/tests/python"
}
stage python python_tests
# The README's main command, once: it must exit 0 when it worked.
stage main-job bash "$CXLTIER_ROOT/scripts/run.sh"
# deploy/: the alert rules' unit tests, a real Prometheus scraping a real
# cxltierd (rules evaluated, the Grafana dashboard's queries run), the
# Kubernetes manifests decoded by Debian's kubectl offline.
stage deploy bash "$CXLTIER_ROOT/scripts/deploy-test.sh"
# The same tests under ASan+UBSan, and the threaded parts (daemon, mover) under
# TSan; a sanitizer report stops the process, so it fails the test.
sanitized() {
  local kind=$1 dir="$BUILD_DIR-$1"
  shift
  # -g1: line tables only, all a sanitizer's report needs (file and line of
  # every frame); 15% less compile time than -g on daemon.cpp. Ninja and
  # unity builds: configure_unity (scripts/lib.sh) says why.
  configure_unity "$dir" -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 \
    -DCXLTIER_WERROR=ON -DCXLTIER_SANITIZE="$kind" &&
    cmake --build "$dir" -j "$JOBS" --target "$@" cxltierd cxltier-loadgen cxltier-sim cxltierctl >/dev/null ||
    return 1
  # $JOBS at a time, as ctest runs the unit tests; each bounded like ctest's
  # --timeout, so a hung test fails its stage, named, with its output.
  printf '%s\n' "$@" | xargs -P "$JOBS" -I{} bash -c '
    t0=$SECONDS
    if ASAN_OPTIONS=detect_leaks=1 TSAN_OPTIONS=halt_on_error=1 \
      timeout --kill-after=30 900 "$1/bin/$2" --gtest_brief=1 >"$1/$2.log" 2>&1; then
      echo "$3: $2 passed in $((SECONDS - t0)) s"
    else
      rc=$?
      cat "$1/$2.log"
      echo "$3: $2 failed or ran over 900 s (exit $rc)" >&2
      exit 1
    fi' _ "$dir" {} "$kind"
}
# Longest first (their ASan times: hostile 165 s, sim and engine 100 s, daemon
# 55 s), so that the two workers end together.
stage asan-ubsan sanitized address hostile_test sim_test engine_test daemon_test copy_mode_test lease_test service_test quota_test hint_test fault_test wire_test model_test numa_test copy_state_test isolation_test systemd_test
stage tsan sanitized thread daemon_test service_test lease_test copy_mode_test fault_test hint_test
# libFuzzer (clang, ASan+UBSan): saved crashes replayed, then 30 s per target.
stage fuzz env BUILD_DIR="$BUILD_DIR" JOBS="$JOBS" bash "$CXLTIER_ROOT/tests/fuzz/run.sh" 30
# The .deb: contents, units verified, exposure <= 2.0, a consumer build.
stage package bash "$CXLTIER_ROOT/scripts/package.sh"
# 256 clients x 1K blocks reporting for 10 s (`make load`: 60 s).
stage load bash "$CXLTIER_ROOT/scripts/load.sh" 256 1024 10
# End to end in QEMU guests with a CPU-less second NUMA node (docs/testing.md).
GUESTS_PASSED=0
guest() {
  # The numa guest also runs quota_test (two users, a cap and a guarantee,
  # checked against the kernel's placement of two nodes).
  local extra=()
  [ "$1" = numa ] && extra=(--file "$BUILD_DIR/bin/quota_test:/bin/quota_test")
  # The hmat guest replays a recording of three tiers with the simulator.
  [ "$1" = hmat ] && extra=(--file "$BUILD_DIR/bin/cxltier-sim:/bin/cxltier-sim")
  bash "$CXLTIER_ROOT/tools/qemu/guest.sh" --shape "$1" --bin "$BUILD_DIR/bin" "${extra[@]}" \
    --cache "$BUILD_DIR/qemu-cache" --file "$CXLTIER_ROOT/tests/e2e/guest_test.sh:/bin/guest_test.sh" \
    --run "sh /bin/guest_test.sh $1" && GUESTS_PASSED=$((GUESTS_PASSED + 1))
}
stage e2e-numa guest numa
stage e2e-hmat guest hmat
stage e2e-cxl guest cxl
# The comparison with the kernel's own tiering, short: every arm runs in one
# boot of the cxl guest, its figures parse and the comparison's invariants
# hold (`make compare` is the full run).
compare_short() {
  bash "$CXLTIER_ROOT/tools/qemu/compare.sh" --short --bin "$BUILD_DIR/bin" \
    --cache "$BUILD_DIR/qemu-cache" --out "$BUILD_DIR/compare-short" && GUESTS_PASSED=$((GUESTS_PASSED + 1))
}
stage compare-short compare_short
# A real systemd host: debootstrapped Debian 12 (cached), systemd as PID 1, our
# .deb installed with dpkg -i, socket activation, sandboxed migration, watchdog.
systemd_guest() {
  bash "$CXLTIER_ROOT/tools/qemu/systemd-guest.sh" --cache "$BUILD_DIR/qemu-cache" \
    --deb "$(ls "$BUILD_DIR"/package/cxltier_*_amd64.deb | tail -1)" && GUESTS_PASSED=$((GUESTS_PASSED + 1))
}
stage e2e-systemd systemd_guest
# llama.cpp (Debian forky's, in a debootstrapped root cached in build/llama)
# served by cxltierd in page and copy mode: bit-identical logits, every block
# hash-checked, restores from both tiers (`make llama`; docs/llama.md).
llama() {
  local rc=0
  wait "$LLAMA_ROOT" || rc=$?
  cat "$BUILD_DIR/llama/root-background.log"
  [ "$rc" -eq 0 ] || return "$rc"
  env BUILD_DIR="$BUILD_DIR" bash "$CXLTIER_ROOT/tools/llama/run.sh"
}
stage llama llama
log "all stages passed in $((SECONDS - t_start)) s"
# ctest's summary plus the guests, as one plain closing line.
sed -nE 's/^[0-9]+% tests passed, ([0-9]+) tests failed out of ([0-9]+)$/\2 \1/p' "$CTEST_LOG" |
  awk -v g="$GUESTS_PASSED" '{ printf "tests: %d passed, %d failed\n", $1 - $2 + g, $2 }'
