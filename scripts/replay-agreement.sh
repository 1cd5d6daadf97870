#!/usr/bin/env bash
# The runs behind docs/results.md ("Replay agreement"), for any policy: a
# cxltierd set up as record_test's (tick 20 ms, a 64 MiB tier 0 = 32 blocks
# of 2 MiB, both tiers on node 0 so every move is a real move_pages), a
# recorded `cxltier-loadgen --blocks 256 --steps 600` run, and both replays
# cxltierctl record prints: the exact one (--moves recorded) and the what-if
# one (--moves instant). One line per run.
# Usage: bash scripts/replay-agreement.sh [POLICY [RUNS [HOGS]]]
#   POLICY  the daemon's policy (default: default)
#   RUNS    how many runs (default: 1)
#   HOGS    how many `cxltier-sim` loops keep the cores busy meanwhile (default: 0)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
POLICY=${1:-default}
RUNS=${2:-1}
HOGS=${3:-0}
BIN="$BUILD_DIR/bin"
for b in cxltierd cxltierctl cxltier-loadgen cxltier-sim; do
  [ -x "$BIN/$b" ] || build >/dev/null
done

WORK=$(mktemp -d /tmp/cxltier-replay-agreement.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -- "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

for _ in $(seq "$HOGS"); do
  # Its own process group, so that the loop and its simulation stop together.
  setsid bash -c "while true; do '$BIN/cxltier-sim' --workload attention:steps=4000 \
    --policy lru,lfu,ema:0.01,ema:0.15,arc,sieve >/dev/null 2>&1; done" &
  PIDS+=("-$!")
done

for run in $(seq "$RUNS"); do
  d="$WORK/$run"
  mkdir -p "$d"
  cat >"$d/cxltierd.toml" <<EOF
[daemon]
socket = "$d/d.sock"
state_dir = "$d/state"
tick_ms = 20
[tiers]
fast_nodes = [0]
slow_nodes = [0]
[engine]
tier0_budget = "64MiB"
policy = "$POLICY"
EOF
  "$BIN/cxltierd" --config "$d/cxltierd.toml" >"$d/daemon.log" 2>&1 &
  daemon=$!
  for _ in $(seq 100); do [ -S "$d/d.sock" ] && break; sleep 0.1; done
  "$BIN/cxltierctl" --socket "$d/d.sock" record --seconds 3600 --json --out "$d/rec.bin" \
    >"$d/rec.json" 2>&1 &
  ctl=$!
  for _ in $(seq 100); do grep -q "recording for" "$d/daemon.log" && break; sleep 0.1; done
  "$BIN/cxltier-loadgen" --socket "$d/d.sock" --blocks 256 --steps 600 --json >"$d/loadgen.json"
  sleep 1  # the loadgen's release folded, a few ticks more
  kill -INT "$ctl"
  wait "$ctl"
  kill "$daemon"
  wait "$daemon" || true
  load=$(cut -d' ' -f1 /proc/loadavg)
  python3 - "$d/rec.json" "$BIN/cxltier-sim" "$POLICY" "$run" "$load" <<'EOF'
import json, subprocess, sys
rec_path, sim, policy, run, load = sys.argv[1:]
rec = json.load(open(rec_path))
rows = {}
for which in ("replay_exact", "replay"):
    cmd = rec[which].replace("cxltier-sim", sim, 1) + " --json"
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    rows[which] = json.loads(p.stdout)[0] if p.returncode == 0 else p.stderr.strip()
live = 100 * rec["hit_rate"]
exact = rows["replay_exact"]
what_if = rows["replay"]
exact_text = (f"exact {100 * exact['hit_rate']:.2f}% ({exact['hits']} of {rec['hits']} hits)"
              if isinstance(exact, dict) else f"exact: {exact[:160]}")
what_if_text = (f"what-if {100 * what_if['hit_rate']:.2f}% ({100 * what_if['hit_rate'] - live:+.2f})"
                if isinstance(what_if, dict) else f"what-if: {what_if[:160]}")
print(f"run {run} policy {policy} load {load}: live {live:.2f}% ({rec['touches']} touches), "
      f"{exact_text}, {what_if_text}; {rec['ticks']} ticks, {rec['plans']} plans, "
      f"{rec['moves_done']} of {rec['move_outcomes']} moves done")
EOF
done
