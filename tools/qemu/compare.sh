#!/usr/bin/env bash
# cxltier against the kernel's own tiering, on the same work (docs/comparison.md).
#
#   tools/qemu/compare.sh [--short] [--workload attention|mooncake|llama] [--trace SPEC]
#                         [--attention K=V,...] [--arms "LIST"] [--tuned KNOBS]
#                         [--kernel 6.1|6.12] [--repeat N [--repeat-only "LIST"]] [--resume]
#                         [--access "cpu device"] [--warmup S]
#                         [--out DIR] [--bin DIR] [--cache DIR]
#
# One trace is fitted to a pool and replayed by cxltier-replay in every arm,
# in the cxl QEMU guest (node 1 an emulated CXL Type-3 device, in a lower
# memory tier): no tiering (none), the kernel's NUMA balancing in tiering mode
# with demotion (kernel: its defaults; kernel-tuned: the sweep's best setting,
# --tuned; kernel+KNOBS: any setting, compare_guest.sh's kernel_setting),
# DAMON's migrate_hot and migrate_cold (damon, 6.12), and three cxltierd arms
# (cxltier-touches: LRU told every touch with a flat score, no persistence;
# cxltier-scores: the trace's scores and the default policy with
# persistence; cxltier-hints: those and the trace's scheduler hints). Every
# arm starts with the same free memory on node 0 (a quarter of the pool's
# bytes, above the high watermark), which is cxltierd's tier-0 budget.
# cxltier-sim gives MIN on the same trace at the same capacity.
#
# Workloads: attention (the generated decode workload with hints; its scores
# are the generator's attention weights, close to an oracle) or mooncake (the
# public Mooncake sample, tests/data: touches only, no scores or hints; no
# cxltier-hints arm), llama (a real engine's traffic: cxltier-llama serving
# 40 of the sample's conversations, recorded; each touch's score is the
# attention mass llama.cpp computed, and the hints are its scheduler's;
# replayed at its recorded pace, 20 ms a tick), or --trace SPEC (any
# cxltier-replay trace).
#
# The full run (the default) boots a fresh guest for every arm and repeat,
# so that no arm inherits another's kernel state, and appends each arm's
# result to DIR/results.jsonl as it finishes: --resume keeps DIR's results
# and runs only the arms and repeats missing there (a run stopped for any
# reason goes on where it stopped). --repeat N runs every arm N times, or
# only the arms of --repeat-only after the first. Each arm replays the whole trace, at one
# step per 100 ms at least (50 ms for mooncake), measured after a warm-up
# (--warmup S; the full trace lasts at least 210 s).
# --short is the form the README's test command runs: a small trace, all
# arms in one boot, to check that every arm runs and the invariants hold
# (every kernel arm demoted, every arm had the same room, tier 0 never over
# its budget); it says nothing about who wins.
#
# Results: DIR/report.md (the tables), DIR/results.json (one record per
# kernel, arm, workload and repeat), DIR/comparison-cxl.png (the node-0
# share over time), DIR/*.jsonl (every figure), DIR/console-*.log.
# tools/qemu/compare_all.sh runs every kernel, workload and the tuning sweep.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN="$ROOT/build/bin"
CACHE="$ROOT/build/qemu-cache"
OUT=""
TRACE=""
SHORT=0
WORKLOAD=attention
KERNEL=6.1
ARMS=""
TUNED=""
REPEATS=1
REPEAT_ONLY=""
RESUME=0
ACCESS=""
WARMUP=""
EXTRA=""
while [ $# -gt 0 ]; do
  case "$1" in
    --short) SHORT=1; shift ;;
    --trace) TRACE=$2; WORKLOAD=; shift 2 ;;
    --workload) WORKLOAD=$2; shift 2 ;;
    --attention) EXTRA=$2; shift 2 ;;
    --arms) ARMS=$2; shift 2 ;;
    --tuned) TUNED=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --kernel) KERNEL=$2; shift 2 ;;
    --damon) echo "compare.sh: --damon is now an arm: --arms '... damon ...' (6.12 runs it by default)" >&2; exit 2 ;;
    --repeat) REPEATS=$2; shift 2 ;;
    --repeat-only) REPEAT_ONLY=$2; shift 2 ;;
    --resume) RESUME=1; shift ;;
    --access) ACCESS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    -h|--help) sed -n '2,43p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$REPEATS" in ''|*[!0-9]*|0) echo "compare.sh: --repeat needs a count of 1 or more" >&2; exit 2 ;; esac

# The sizes. The run paces every arm at one step per STEP_MS at least (a
# decode step of a serving engine): the kernel's scanner and cxltierd's ticks
# run on wall time, so an arm that ran faster would get fewer scans or ticks
# per step of the same work.
POOL=()
if [ "$SHORT" = 1 ]; then
  ATTENTION="steps=120,sessions=4,batch=2,context_min=4096,context_max=8192,topk=8,turn_tokens=16,pause_steps=15,user_tokens=64,turns=4,shared_prefix_blocks=8,release_on_pause=0.5,hints=1"
  BLOCK=65536 STEP_MS=100 MEMORY=768 TIMEOUT=1800
  ACCESS=${ACCESS:-cpu} WARMUP_S=0
  OUT=${OUT:-$ROOT/build/compare-short}
else
  # 2,100 steps of at least 100 ms: 210 s an arm, 180 s after the warm-up.
  ATTENTION="steps=2100,sessions=8,batch=4,context_min=4096,context_max=8192,topk=16,turn_tokens=64,pause_steps=60,user_tokens=128,turns=4,shared_prefix_blocks=16,release_on_pause=0.3,hints=1"
  BLOCK=16384 STEP_MS=100 MEMORY=1024 TIMEOUT=5400
  ACCESS=${ACCESS:-cpu} WARMUP_S=30
  OUT=${OUT:-$ROOT/build/compare}
fi
[ -n "$EXTRA" ] && ATTENTION="$ATTENTION,$EXTRA"
if [ "$SHORT" = 1 ] && { [ -n "$TRACE" ] || [ "$WORKLOAD" != attention ]; }; then
  echo "compare.sh: --short replays its own small attention trace only" >&2
  exit 2
fi
case "$WORKLOAD" in
  attention|'') ;;
  mooncake)
    # 3,993 requests, a step each: 200 s at 50 ms. The sample's 43,924 blocks
    # do not fit the guest: a pool of 4,096 (64 MiB), the least recently
    # touched block released when a new one needs room.
    TRACE="mooncake:$ROOT/tests/data/mooncake_synthetic_trace.jsonl"
    [ "$SHORT" = 1 ] || STEP_MS=50 WARMUP_S=20
    POOL=(--pool-blocks 4096) ;;
  llama)
    # 12,387 ticks of 20 ms: 248 s; every one of its 2,087 blocks stays live.
    TRACE="bin:$ROOT/tests/data/llama_mooncake40.cxlt"
    [ "$SHORT" = 1 ] || STEP_MS=20 ;;
  *) echo "compare.sh: unknown --workload '$WORKLOAD' (attention, mooncake, llama; or --trace SPEC)" >&2; exit 2 ;;
esac
[ -n "$WORKLOAD" ] || WORKLOAD=$(basename "${TRACE#*:}")
WARMUP=${WARMUP:-$WARMUP_S}
if [ -z "$ARMS" ]; then
  ARMS="none kernel kernel-tuned"
  [ "$KERNEL" = 6.12 ] && ARMS="$ARMS damon"
  ARMS="$ARMS cxltier-touches cxltier-scores"
  [ "$WORKLOAD" = mooncake ] || ARMS="$ARMS cxltier-hints"
fi
for b in cxltier-replay cxltier-sim cxltierd; do
  [ -x "$BIN/$b" ] || { echo "compare.sh: $BIN/$b not built (bash scripts/run.sh builds it)" >&2; exit 2; }
done
mkdir -p "$OUT" "$CACHE"
# Recorded with every result: the code each arm ran.
COMMIT=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)
[ "$RESUME" = 1 ] || rm -f "$OUT"/*.jsonl "$OUT"/console-*.log

# The trace every arm replays (and cxltier-sim is given): the workload's
# blocks fitted to a pool. With --resume it must be the trace the kept
# results came from.
if [ -n "$TRACE" ]; then src=(--trace "$TRACE"); else src=(--attention "$ATTENTION"); fi
"$BIN/cxltier-replay" "${src[@]}" "${POOL[@]}" --block-bytes $BLOCK --write-trace "$OUT/trace-new.bin" > "$OUT/trace-new.json"
# What else the kept results depend on: a resumed run must not mix settings.
PARAMS="kernel=$KERNEL block=$BLOCK step_ms=$STEP_MS warmup=$WARMUP access=$ACCESS memory=$MEMORY tuned=$TUNED"
if [ "$RESUME" = 1 ] && [ -s "$OUT/results.jsonl" ]; then
  if [ -f "$OUT/trace.bin" ] && ! cmp -s "$OUT/trace.bin" "$OUT/trace-new.bin"; then
    echo "compare.sh: --resume: $OUT holds results of another trace; use another --out or no --resume" >&2
    exit 2
  fi
  if [ -f "$OUT/params" ] && [ "$(cat "$OUT/params")" != "$PARAMS" ]; then
    echo "compare.sh: --resume: $OUT holds results run with '$(cat "$OUT/params")', not '$PARAMS'" >&2
    exit 2
  fi
fi
echo "$PARAMS" > "$OUT/params"
mv "$OUT/trace-new.bin" "$OUT/trace.bin"
mv "$OUT/trace-new.json" "$OUT/trace.json"
echo "compare.sh: $WORKLOAD trace $(cat "$OUT/trace.json")"
pool_blocks=$(sed -n 's/.*"pool_blocks":\([0-9]*\).*/\1/p' "$OUT/trace.json")
FREE=$((pool_blocks * BLOCK / 4))
DISK="$CACHE/compare-disk.raw"
[ -f "$DISK" ] || truncate -s 64M "$DISK"

done_already() {  # repeat arm: whether DIR/results.jsonl holds it, for every access kind
  local a
  for a in $ACCESS; do
    grep -F "\"repeat\":$1," "$OUT/results.jsonl" 2>/dev/null | grep -F "\"arm\":\"$2\"" |
      grep -qF "\"access\":\"$a\"" || return 1
  done
}
boot() {  # repeat "arms" log
  local rep=$1 arms=$2 log=$3 start=$SECONDS rc=0
  bash "$ROOT/tools/qemu/guest.sh" --shape cxl --memory $MEMORY --bin "$BIN" --cache "$CACHE" \
    --kernel "$KERNEL" --disk "$DISK" --timeout $TIMEOUT --append rootfstype=ramfs \
    --file "$OUT/trace.bin:/root/trace.bin" \
    --file "$ROOT/tools/qemu/compare_guest.sh:/bin/compare_guest.sh" \
    --run "KERNEL_TUNED='$TUNED' sh /bin/compare_guest.sh cxl /root/trace.bin $BLOCK $FREE $STEP_MS '$ACCESS' '$arms' $WARMUP" \
    > "$log" 2>&1 || rc=$?
  # Each line, tagged with its repeat, appended as soon as the guest is done;
  # in the full run only when it exited 0 (an arm torn down badly runs again
  # on --resume).
  if [ $rc -ne 0 ] && [ "$SHORT" = 0 ]; then kinds=""; else kinds="RESULT:results BUDGET:budgets DAMON:damon"; fi
  for kind in $kinds; do
    grep -a "^COMPARE-${kind%%:*} " "$log" | cut -d' ' -f2- | sed "s/^{/{\"repeat\":$rep,\"commit\":\"$COMMIT\",/" \
      >> "$OUT/${kind#*:}.jsonl" || true
  done
  grep -a '^== \|^   \|FAIL' "$log" || true
  echo "compare.sh: [$(date +%T)] $KERNEL $WORKLOAD run $((rep + 1)) of $REPEATS, arms '$arms': $((SECONDS - start)) s"
  if [ $rc -ne 0 ]; then
    echo "compare.sh: the guest failed (exit $rc); console tail:" >&2
    tail -n 30 "$log" >&2
    # The full run goes on with the other arms (each its own guest); the
    # failed one is left out of the report, and the run exits 1.
    [ "$SHORT" = 1 ] && exit 1
    FAILED_ARMS="$FAILED_ARMS $2"
  fi
}
FAILED_ARMS=""
for rep in $(seq 0 $((REPEATS - 1))); do
  if [ "$SHORT" = 1 ]; then
    boot "$rep" "$ARMS" "$OUT/console-cxl-$rep.log"
    continue
  fi
  for arm in $ARMS; do
    if [ "$rep" -gt 0 ] && [ -n "$REPEAT_ONLY" ] && [[ " $REPEAT_ONLY " != *" $arm "* ]]; then
      continue
    fi
    if done_already "$rep" "$arm"; then
      echo "compare.sh: $arm, run $((rep + 1)): in $OUT already"
      continue
    fi
    boot "$rep" "$arm" "$OUT/console-$(echo "$arm" | tr -c 'A-Za-z0-9.\n-' _)-$rep.log"
  done
done
REPORTED=""
for arm in $ARMS; do done_already 0 "$arm" && REPORTED="$REPORTED $arm"; done
python3 "$ROOT/tools/qemu/compare_report.py" --out "$OUT" --bin "$BIN" --arms "$REPORTED" \
  --access "$ACCESS" --workload "$WORKLOAD"
if [ -n "$FAILED_ARMS" ]; then
  echo "compare.sh: these arms' guests failed (console-ARM-REPEAT.log says why):$FAILED_ARMS" >&2
  exit 1
fi
