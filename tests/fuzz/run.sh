#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan+UBSan) and runs each for a
# bounded time from its seed corpus, after replaying every saved regression.
# Usage: tests/fuzz/run.sh [SECONDS_PER_TARGET] (default 30; env BUILD_DIR, JOBS).
# A crash leaves its input in $BUILD_DIR-fuzz/crashes/<target>/ and fails the run;
# copy it to tests/fuzz/regressions/<target>/ once fixed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$ROOT/build}
FUZZ_DIR="$BUILD_DIR-fuzz"
JOBS=${JOBS:-2}
SECONDS_PER_TARGET=${1:-30}
TARGETS=(fuzz_wire fuzz_fold fuzz_config fuzz_trace fuzz_hostile)

# Ninja and unity builds of the libraries, as the sanitizer trees
# (configure_unity in scripts/lib.sh).
source "$ROOT/scripts/lib.sh"
CC=clang CXX=clang++ configure_unity "$FUZZ_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCXLTIER_SANITIZE=fuzzer -DBUILD_TESTING=OFF
cmake --build "$FUZZ_DIR" -j "$JOBS" --target "${TARGETS[@]}" >/dev/null

# One target: its saved regressions, then SECONDS_PER_TARGET of fuzzing.
# Returns non-zero on a failure; its lines are printed whole.
fuzz_one() {
  local t=$1
  local reg="$ROOT/tests/fuzz/regressions/$t"
  if [ -d "$reg" ] && [ -n "$(ls -A "$reg")" ]; then
    if ! "$FUZZ_DIR/bin/$t" "$reg"/* >"$FUZZ_DIR/$t-regressions.log" 2>&1; then
      echo "fuzz: $t fails a saved regression:"; tail -30 "$FUZZ_DIR/$t-regressions.log"
      return 1
    fi
  fi
  local work="$FUZZ_DIR/corpus/$t" crashes="$FUZZ_DIR/crashes/$t"
  rm -rf "$work" && mkdir -p "$work" "$crashes"
  cp "$ROOT/tests/fuzz/corpus/$t"/* "$work"/
  if "$FUZZ_DIR/bin/$t" -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 \
    -artifact_prefix="$crashes/" -timeout=10 -rss_limit_mb=2048 "$work" \
    >"$FUZZ_DIR/$t.log" 2>&1; then
    local runs
    runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$FUZZ_DIR/$t.log")
    echo "fuzz: $t: ${runs:-?} inputs in ${SECONDS_PER_TARGET} s, no crash (corpus $(ls "$work" | wc -l) inputs)"
  else
    echo "fuzz: $t FOUND A CRASH (inputs in $crashes):"; grep -E "ERROR|SUMMARY|runtime error" "$FUZZ_DIR/$t.log" | head -10
    return 1
  fi
}

# $JOBS targets at a time (each fuzzes on one core).
status=0 running=0
for t in "${TARGETS[@]}"; do
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || status=1
    running=$((running - 1))
  fi
  fuzz_one "$t" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || status=1
  running=$((running - 1))
done
exit $status
