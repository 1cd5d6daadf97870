#!/usr/bin/env bash
# cxltier against the kernel's own tiering, on the same work (docs/comparison.md).
#
#   tools/qemu/compare.sh [--short] [--shapes "cxl numa"] [--trace SPEC] [--out DIR]
#                         [--bin DIR] [--cache DIR] [--kernel 6.1|6.12]
#
# One trace (the attention workload with scheduler hints, or --trace FILE) is
# fitted to the pool and replayed by cxltier-replay in every arm, in QEMU
# guests: no tiering, the kernel's (NUMA balancing mode 2 with demotion, at
# the default and at one tuned setting), and three cxltierd arms (touches
# only: LRU, flat scores, no persistence; the trace's scores: the default
# policy; and those with the trace's hints); for CPU loads and for device
# reads (O_DIRECT writes to a virtio disk). Every arm starts with the same
# free memory on node 0 (a quarter of the pool's bytes, above the high watermark),
# which is cxltierd's tier-0 budget. cxltier-sim gives MIN on the same trace
# at the same capacity. Results: DIR/report.md (the tables),
# DIR/results.json (one record per kernel, arm, workload and repeat),
# DIR/comparison-*.png (the fast-tier share over time), DIR/*.jsonl (every
# figure). --short is the form the README's test command runs: a small
# trace in the cxl guest, to check that every arm runs and the invariants
# hold (every kernel arm demoted, every arm had the same room, tier 0 never
# over its budget); it says nothing about who wins.
# --kernel is guest.sh's: the guests' kernel (6.1, Debian 12's, by default).
# --damon adds a DAMON arm (DAMOS migrate_hot and migrate_cold) on kernels
# that have them (6.11 and later: --kernel 6.12); one run so far.
# --repeat N runs every guest N times (a fresh boot each), and the report
# gives each arm's mean and range over them.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN="$ROOT/build/bin"
CACHE="$ROOT/build/qemu-cache"
OUT=""
SHAPES=""
TRACE=""
SHORT=0
WORKLOAD=
KERNEL=6.1
DAMON_ARM=
REPEATS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --short) SHORT=1; shift ;;
    --shapes) SHAPES=$2; shift 2 ;;
    --trace) TRACE=$2; shift 2 ;;
    --workload) WORKLOAD=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --kernel) KERNEL=$2; shift 2 ;;
    --damon) DAMON_ARM=damon; shift ;;
    --repeat) REPEATS=$2; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "compare.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

# The two sizes. A locked balloon leaves a quarter of the pool's bytes of node 0
# free above its high watermark (FREE, set below from the fitted trace). The
# full run paces every arm at one step per STEP_MS at least (a decode step of
# a serving engine): the kernel's scanner and cxltierd's ticks run on wall
# time, so an arm that ran faster would get fewer scans or ticks per step of
# the same work.
if [ "$SHORT" = 1 ]; then
  ATTENTION="steps=120,sessions=4,batch=2,context_min=4096,context_max=8192,topk=8,turn_tokens=16,pause_steps=15,user_tokens=64,turns=4,shared_prefix_blocks=8,release_on_pause=0.5,hints=1"
  BLOCK=65536 STEP_MS=100 MEMORY=768 TIMEOUT=1800 ACCESS=cpu
  SHAPES=${SHAPES:-cxl}
  OUT=${OUT:-$ROOT/build/compare-short}
else
  ATTENTION="steps=400,sessions=8,batch=4,context_min=4096,context_max=8192,topk=16,turn_tokens=64,pause_steps=60,user_tokens=128,turns=4,shared_prefix_blocks=16,release_on_pause=0.3,hints=1"
  BLOCK=16384 STEP_MS=50 MEMORY=1024 TIMEOUT=7200 ACCESS="cpu device"
  SHAPES=${SHAPES:-cxl numa}
  OUT=${OUT:-$ROOT/build/compare}
fi
for b in cxltier-replay cxltier-sim cxltierd; do
  [ -x "$BIN/$b" ] || { echo "compare.sh: $BIN/$b not built (bash scripts/run.sh builds it)" >&2; exit 2; }
done
mkdir -p "$OUT" "$CACHE"
rm -f "$OUT"/*.jsonl "$OUT"/console-*.log

# The trace every arm replays (and cxltier-sim is given): the workload's
# blocks fitted to a pool of the blocks it keeps live at most.
if [ -n "$TRACE" ]; then src=(--trace "$TRACE"); else src=(--attention "$ATTENTION"); fi
"$BIN/cxltier-replay" "${src[@]}" --block-bytes $BLOCK --write-trace "$OUT/trace.bin" > "$OUT/trace.json"
echo "compare.sh: trace $(cat "$OUT/trace.json")"
pool_blocks=$(sed -n 's/.*"pool_blocks":\([0-9]*\).*/\1/p' "$OUT/trace.json")
FREE=$((pool_blocks * BLOCK / 4))
[ -n "$WORKLOAD" ] || { [ -n "$TRACE" ] && WORKLOAD=$(basename "${TRACE#*:}") || WORKLOAD=attention; }
DISK="$CACHE/compare-disk.raw"
rm -f "$DISK" && truncate -s 64M "$DISK"

case "$REPEATS" in ''|*[!0-9]*|0) echo "compare.sh: --repeat needs a count of 1 or more" >&2; exit 2 ;; esac
for rep in $(seq 0 $((REPEATS - 1))); do
for shape in $SHAPES; do
  start=$SECONDS
  rc=0
  log="$OUT/console-$shape-$rep.log"
  bash "$ROOT/tools/qemu/guest.sh" --shape "$shape" --memory $MEMORY --bin "$BIN" --cache "$CACHE" \
    --kernel "$KERNEL" --disk "$DISK" --timeout $TIMEOUT --append rootfstype=ramfs \
    --file "$OUT/trace.bin:/root/trace.bin" \
    --file "$ROOT/tools/qemu/compare_guest.sh:/bin/compare_guest.sh" \
    --run "sh /bin/compare_guest.sh $shape /root/trace.bin $BLOCK $FREE $STEP_MS '$ACCESS' $DAMON_ARM" \
    > "$log" 2>&1 || rc=$?
  # Each line, tagged with its repeat.
  for kind in RESULT:results BUDGET:budgets DAMON:damon; do
    grep -a "^COMPARE-${kind%%:*} " "$log" | cut -d' ' -f2- | sed "s/^{/{\"repeat\":$rep,/" \
      >> "$OUT/${kind#*:}.jsonl" || true
  done
  grep -a '^== \|^   \|FAIL' "$log" || true
  echo "compare.sh: the $shape guest (run $((rep + 1)) of $REPEATS) ran for $((SECONDS - start)) s"
  if [ $rc -ne 0 ]; then
    echo "compare.sh: the $shape guest failed (exit $rc); console tail:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
done
done
python3 "$ROOT/tools/qemu/compare_report.py" --out "$OUT" --bin "$BIN" --shapes "$SHAPES" \
  --access "$ACCESS" --workload "$WORKLOAD"
