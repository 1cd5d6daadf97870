#!/usr/bin/env bash
# Regenerates the measurements behind docs/results.md: every command is printed
# before its output, so each table can be rerun on its own.
# Usage: bash scripts/results.sh > results.txt   (about a minute on 2 cores)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SIM="$BUILD_DIR/bin/cxltier-sim"
MOONCAKE="$CXLTIER_ROOT/tests/data/mooncake_synthetic_trace.jsonl"
[ -x "$SIM" ] || build >/dev/null

run() {
  echo '```'
  echo "\$ cxltier-sim $*"
  "$SIM" "$@"
  echo '```'
  echo
}

echo "## The seeds' experiment (32 GiB; LFU, EMA 0.01, EMA 0.15; reset vs persist)"
run --workload attention --budget 32GiB --policy lfu,ema:0.01,ema:0.15 --persist both --jobs 2
run --trace "mooncake:$MOONCAKE" --budget 32GiB --policy lfu,ema:0.01,ema:0.15 --persist both --jobs 2

echo "## Every policy across budgets"
run --workload attention --budget 8GiB,16GiB,32GiB,64GiB,128GiB \
  --policy lru,lfu,ema:0.01,ema:0.15,arc,s3fifo,sieve,tinylfu,min --persist both --jobs 2
run --trace "mooncake:$MOONCAKE" --budget 8GiB,32GiB,128GiB,512GiB,2TiB \
  --policy lru,lfu,ema:0.01,ema:0.15,arc,s3fifo,sieve,tinylfu,min --persist both --jobs 2

echo "## Seeds of the attention workload (LFU and EMA, 32 GiB)"
for seed in 1 2 3 4 5; do
  run --workload "attention:seed=$seed" --budget 32GiB --policy lfu,ema:0.01,ema:0.15 --persist both --jobs 2
done

echo "## Which parameters make persistence matter (one at a time, 32 GiB)"
for p in pause_steps=100 pause_steps=5000 sessions=8 sessions=64 drift=0 drift=0.02 \
  heavy_alpha=0.8 heavy_alpha=3 release_on_pause=0.5 turns=1 topk=256; do
  run --workload "attention:$p" --budget 32GiB --policy lfu,ema:0.01,ema:0.15 --persist both --jobs 2
done

echo "## EMA: how the effect depends on alpha (32 GiB)"
run --workload attention --budget 32GiB --policy ema:0.001,ema:0.003,ema:0.01,ema:0.03,ema:0.15 --persist both --jobs 2

echo "## Tick mode (the daemon's semantics)"
run --workload attention --budget 32GiB --policy lru,lfu,ema:0.01,ema:0.15 --persist both \
  --mode tick --tick-steps 8 --migrate-per-tick 2GiB --hysteresis 2 --jobs 2

echo "## Three tiers (16 GiB tier 0, 32 GiB tier 1, the rest in tier 2)"
run --workload attention --tiers 16GiB,32GiB \
  --policy lru,lfu,ema:0.01,ema:0.15,arc,s3fifo,sieve,tinylfu,default,min --persist persist --jobs 2
run --workload attention --tiers 16GiB,32GiB --policy lru,lfu,ema:0.01,ema:0.15,default --persist persist \
  --mode tick --tick-steps 8 --migrate-per-tick 2GiB --hysteresis 2 --jobs 2
