#!/usr/bin/env bash
# The whole comparison with the kernel's tiering (docs/comparison.md): what
# `make compare` runs. Hours on 2 cores under TCG; resumable: every stage
# keeps its results in DIR/STAGE, and a second call runs only what is missing.
#
#   tools/qemu/compare_all.sh [--out DIR] [--bin DIR] [--cache DIR] [--stages "LIST"]
#                             [--from RUNS]
#
# Stages, in order (a stage that fails is reported at the end; the others run):
#   sweep-6.12, sweep-6.1  the kernel's tiering knobs swept on another seed of
#                          the attention workload (seed 2, 900 steps) than the
#                          one reported: each kernel's best setting becomes its
#                          kernel-tuned arm below (tune on one set, report on
#                          another)
#   6.12-attention         every arm on the attention workload (seed 1)
#   6.12-mooncake          every arm on the public Mooncake sample
#   6.12-llama             every arm on cxltier-llama's recording (tests/data):
#                          the scores are a real engine's attention masses
#   6.12-attention-repeats two more runs of the headline arms of 6.12-attention:
#                          kernel-tuned, damon, cxltier-touches and
#                          cxltier-scores
#   6.12-llama-repeats     the same for 6.12-llama
#   6.1-attention          every arm but damon (6.1 has no DAMOS migrate_hot),
#                          the headline arms three times
#   6.1-mooncake           every arm but damon on the Mooncake sample, once
#                          (cxltierd's 6.12 guest oopsed on this workload)
# --from RUNS (docs/comparison-runs: what the run that docs/comparison.md
# reports has kept so far) seeds DIR with those results, so that the run goes
# on where that one stopped, on another machine too; `--from ''` starts anew.
# DIR/results.json: every stage's records (the sweep's with workload
# "attention-seed2"), with the git commit each arm ran; DIR/summary.md: a
# table per stage (tools/qemu/compare_summary.py, which also takes a run
# still going); DIR/tuned-K.txt: the setting each sweep chose.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN="$ROOT/build/bin"
CACHE="$ROOT/build/qemu-cache"
OUT="$ROOT/build/compare"
FROM="$ROOT/docs/comparison-runs"
STAGES="sweep-6.12 6.12-attention 6.12-mooncake 6.12-llama 6.12-attention-repeats 6.12-llama-repeats sweep-6.1 6.1-attention 6.1-mooncake"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --stages) STAGES=$2; shift 2 ;;
    --from) FROM=$2; shift 2 ;;
    -h|--help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "compare_all.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
# Seed each stage that has no results here yet from RUNS.
if [ -n "$FROM" ] && [ -d "$FROM" ]; then
  for d in "$FROM"/*/; do
    stage=$(basename "$d")
    [ -s "$OUT/$stage/results.jsonl" ] && continue
    mkdir -p "$OUT/$stage"
    cp "$d"/*.jsonl "$d"/params "$OUT/$stage/" 2>/dev/null || true
    echo "compare_all.sh: $stage seeded from $d"
  done
  cp -n "$FROM"/tuned-*.txt "$OUT/" 2>/dev/null || true
fi
# The headline arms (run three times): the best kernel arm, DAMON, and
# cxltierd told touches only (a) and given the trace's scores (b).
HEADLINE="kernel-tuned damon cxltier-touches cxltier-scores"
# The sweep: the kernel's defaults, and settings around the scan rate that
# tracks a 100 ms decode step: the promotion rate limit (cxltierd's default
# migration rate, or none), the hot threshold, the scan size, kswapd's
# watermark gap (room for promotions) and the multi-gen LRU.
FAST="delay=100,pmin=100,pmax=1000"
SWEEP="kernel kernel+$FAST kernel+rate=1024,$FAST kernel+rate=1024,$FAST,hot=5000
  kernel+rate=1024,$FAST,size=1024 kernel+rate=1024,$FAST,wsf=100
  kernel+rate=1024,$FAST,hot=5000,size=1024,wsf=100 kernel+rate=1024,$FAST,mglru=y"

FAILED=""
compare() {  # directory, then compare.sh's arguments ($stage is the stage's name)
  local dir=$1
  shift
  echo "compare_all.sh: [$(date +%T)] stage $stage"
  bash "$ROOT/tools/qemu/compare.sh" --resume --bin "$BIN" --cache "$CACHE" --out "$OUT/$dir" "$@" ||
    FAILED="$FAILED $stage"
}
tuned() {  # kernel: the setting its sweep found best (re-touched share on node 0)
  python3 - "$OUT/sweep-$1/results.json" <<'EOF'
import json, sys
# Of the kernel arms that kept the comparison's invariants (demoted, started
# with the same room), the best re-touched share on node 0.
recs = [r for r in json.load(open(sys.argv[1]))
        if r["arm"].startswith("kernel") and not r.get("violations")]
if not recs:
    sys.exit(f"{sys.argv[1]}: no kernel arm of the sweep kept the invariants")
best = max(recs, key=lambda r: r["retouched_node0_share"])
print(best["kernel_setting"])
EOF
}
have_tuned() {  # kernel: T is its sweep's setting; false (and the stage failed) without one
  T=$(cat "$OUT/tuned-$1.txt" 2>/dev/null || true)
  [ -n "$T" ] && return 0
  echo "compare_all.sh: no tuned setting for $1 (stage sweep-$1 first): skipping $stage" >&2
  FAILED="$FAILED $stage"
  return 1
}
for stage in $STAGES; do
  case "$stage" in
    sweep-6.12|sweep-6.1)
      k=${stage#sweep-}
      compare "$stage" --kernel "$k" --attention seed=2,steps=900 --warmup 15 --arms "$(echo $SWEEP)"
      tuned "$k" > "$OUT/tuned-$k.txt" || { rm -f "$OUT/tuned-$k.txt"; FAILED="$FAILED $stage"; } ;;
    6.12-attention) have_tuned 6.12 && compare "$stage" --kernel 6.12 --tuned "$T" ;;
    6.12-mooncake) have_tuned 6.12 && compare "$stage" --kernel 6.12 --workload mooncake --tuned "$T" ;;
    6.12-llama) have_tuned 6.12 && compare "$stage" --kernel 6.12 --workload llama --tuned "$T" ;;
    6.1-attention)
      have_tuned 6.1 && compare "$stage" --kernel 6.1 --tuned "$T" --repeat 3 --repeat-only "$HEADLINE" ;;
    6.1-mooncake) have_tuned 6.1 && compare "$stage" --kernel 6.1 --workload mooncake --tuned "$T" ;;
    6.12-attention-repeats)
      have_tuned 6.12 && compare 6.12-attention --kernel 6.12 --tuned "$T" --repeat 3 --repeat-only "$HEADLINE" ;;
    6.12-llama-repeats)
      have_tuned 6.12 && compare 6.12-llama --kernel 6.12 --workload llama --tuned "$T" --repeat 3 --repeat-only "$HEADLINE" ;;
    *) echo "compare_all.sh: unknown stage '$stage'" >&2; exit 2 ;;
  esac
done
# Every stage's report and records, and the tables of docs/comparison.md.
python3 "$ROOT/tools/qemu/compare_summary.py" --out "$OUT" --bin "$BIN"
if [ -n "$FAILED" ]; then
  echo "compare_all.sh: failed:$FAILED (each stage's console-*.log and report say why)" >&2
  exit 1
fi
