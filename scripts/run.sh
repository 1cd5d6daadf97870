#!/usr/bin/env bash
# The main job: install what is missing, build, start cxltierd with the demo
# configuration, drive it with cxltier-loadgen, show what it did, stop it.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
stage deps ensure_packages
stage build build
BIN="$BUILD_DIR/bin"
DEMO=$(mktemp -d /tmp/cxltier-demo.XXXXXX)
SOCK="$DEMO/cxltierd.sock"
"$BIN/cxltierd" --config "$CXLTIER_ROOT/scripts/demo.toml" --socket "$SOCK" \
  --state-dir "$DEMO/state" >"$DEMO/cxltierd.log" 2>&1 &
DAEMON=$!
# The trap keeps the script's status: a daemon already stopped is no failure.
cleanup() {
  local rc=$?
  kill "$DAEMON" 2>/dev/null || true
  wait "$DAEMON" 2>/dev/null || true
  rm -rf "$DEMO"
  exit "$rc"
}
trap cleanup EXIT
# Its socket, up to 60 s while it lives (a loaded machine may be slow to start it).
for _ in $(seq 600); do [ -S "$SOCK" ] || ! kill -0 "$DAEMON" 2>/dev/null && break; sleep 0.1; done

echo
echo "== cxltier plan for the default model"
"$BIN/cxltierctl" plan --model llama3-70b --context 128k | sed -n '1,16p'
echo
echo "== cxltierd (log: first lines)"
sed -n '1,4p' "$DEMO/cxltierd.log"
echo
echo "== cxltier-loadgen: 256 blocks of 2 MiB in a memfd pool, attention workload, 64 MiB tier 0"
"$BIN/cxltier-loadgen" --socket "$SOCK" --blocks 256 --block-bytes 2MiB --steps 400 --step-ms 5 &
LOADGEN=$!
# Tier 0's budget holds from admission (docs/operations.md): sample status
# while the loadgen runs, and say the peak against the stated bound (budget
# plus one tick's moves).
sample_tier0() {
  while kill -0 "$LOADGEN" 2>/dev/null; do
    "$BIN/cxltierctl" --socket "$SOCK" status --json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
s = json.load(sys.stdin)
if s.get("block_bytes"):
    t0, bb = s["tiers"][0], s["block_bytes"]
    print(t0["blocks"], t0["budget_bytes"] // bb, -(-s["migrations"]["budget_bytes_per_tick"] // bb))
' 2>/dev/null || true
    sleep 0.1
  done >"$DEMO/tier0-samples.txt"
}
sample_tier0 &
SAMPLER=$!
# Wait for it to fill its pool and connect (up to 60 s), then let it run a moment.
# Until its blocks are admitted and touched (it writes its pool first).
for _ in $(seq 600); do
  "$BIN/cxltierctl" --socket "$SOCK" status --json 2>/dev/null |
    /usr/bin/python3 -c 'import json, sys; s = json.load(sys.stdin); sys.exit(not (s.get("blocks", 0) and s["touches"]))' 2>/dev/null && break
  sleep 0.1
done
sleep 1
echo
echo "== cxltierctl status (while it runs)"
"$BIN/cxltierctl" --socket "$SOCK" status
echo
echo "== cxltierctl blocks (hottest three)"
"$BIN/cxltierctl" --socket "$SOCK" blocks | sed -n '1,4p'
echo
echo "== metrics (Prometheus text format, a few of them)"
ENDPOINT=$("$BIN/cxltierctl" --socket "$SOCK" status --json | sed -nE 's/.*"metrics_endpoint": "([^"]+)".*/\1/p')
/usr/bin/python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())" \
  "http://$ENDPOINT/metrics" | grep -E '^cxltier_(tier_blocks|hit_ratio|promotions_total|demotions_total|tick_duration_seconds_count)'
wait $LOADGEN
wait $SAMPLER
echo
echo "== tier 0 against its budget, sampled every 100 ms while the loadgen ran"
awk '{ n++; if ($1 > peak) peak = $1; budget = $2; tick = $3 }
  END { if (!n) { print "no samples"; exit 1 }
        printf "%d samples: tier 0 peaked at %d blocks; bound: budget %d + one tick'"'"'s moves %d = %d blocks: %s\n",
          n, peak, budget, tick, budget + tick, peak <= budget + tick ? "held" : "EXCEEDED" }' \
  "$DEMO/tier0-samples.txt"
echo
kill -TERM $DAEMON
daemon_rc=0
wait $DAEMON || daemon_rc=$?
echo "== cxltierd stopped with status $daemon_rc (log: last lines)"
tail -n 3 "$DEMO/cxltierd.log"
[ "$daemon_rc" -eq 0 ]
