#!/usr/bin/env bash
# The whole test suite: install what is missing, build with warnings as errors,
# run every test. Prints one timing line per stage and exits non-zero on failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
t_start=$SECONDS
stage deps ensure_packages
stage build build
stage format-check cmake --build "$BUILD_DIR" --target format-check
stage unit ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$JOBS" --timeout 900
# Runs, and prints, without timing assertions: the machines are shared.
stage bench-smoke "$BUILD_DIR/bin/cxltier-bench" --benchmark_filter=mooncake \
  --benchmark_min_time=0.01
log "all stages passed in $((SECONDS - t_start)) s"
