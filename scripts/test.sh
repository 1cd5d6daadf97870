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
stage build build
stage format-check cmake --build "$BUILD_DIR" --target format-check
# Runs and prints, without timing assertions: the machines are shared.
stage bench-smoke "$BUILD_DIR/bin/cxltier-bench" --benchmark_filter=mooncake \
  --benchmark_min_time=0.01 --benchmark_color=false
stage unit unit_tests
log "all stages passed in $((SECONDS - t_start)) s"
# ctest's own summary, as one plain closing line.
sed -nE 's/^[0-9]+% tests passed, ([0-9]+) tests failed out of ([0-9]+)$/\2 \1/p' "$CTEST_LOG" |
  awk '{ printf "tests: %d passed, %d failed\n", $1 - $2, $2 }'
