#!/usr/bin/env bash
# `make llama` (issue 33; docs/llama.md): the forky root (cached), the model,
# cxltier-llama built inside the root, then one cxltierd per mode (page,
# copy) outside it, serving cxltier-llama over a socket in a folder
# bind-mounted into the root. Writes $BUILD_DIR/llama/summary.json (one object
# per mode), the page run's recorded traffic (llama-page.cxlt) and its replay
# in cxltier-sim (replay.txt).
#
#   BUILD_DIR=build bash tools/llama/run.sh [cxltier-llama options...]
#
# CXLTIER_LLAMA_TAG=-trace names the outputs summary-trace.json and
# replay-trace.txt (make llama-trace: the Mooncake sample, --trace).
#
# Needs root (debootstrap, chroot, mount) and the host's build of cxltierd,
# cxltierctl and cxltier-sim in $BUILD_DIR/bin (the Makefile builds them).
set -euo pipefail

TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD_DIR=${BUILD_DIR:-$TOP/build}
OUT=$BUILD_DIR/llama
ROOT=$OUT/root
WORK=$OUT/work  # seen inside the root as /cxltier/work
BIN=${CXLTIER_BIN:-$BUILD_DIR/bin}  # the host build of cxltierd, cxltierctl, cxltier-sim
JOBS=${JOBS:-1}
# 256 KiB: 8 blocks of 32 KiB, fewer than most turns restore, so whatever
# the policy, restores come from both tiers (the bar below). At 1 MiB the
# default policy `shards` with soon hints served every restore from tier 0
# and left the tier-1 path unchecked (CI, 2026-12-06).
TIER0=${CXLTIER_LLAMA_TIER0:-256KiB}
TAG=${CXLTIER_LLAMA_TAG:-}
SUMMARY=$OUT/summary$TAG.json

die() {
  echo "llama: $*" >&2
  exit 1
}
log() { echo "llama: $*"; }

[ "$(id -u)" -eq 0 ] || die "run as root (chroot, mount)"
for b in cxltierd cxltierctl cxltier-sim; do
  [ -x "$BIN/$b" ] || die "no $BIN/$b: build it first (make llama does)"
done

t0=$SECONDS
# A run killed before its cleanup leaves its mounts: undo them first, since
# root.sh may delete the root, and through a bind mount of the source tree
# that would delete the tree (root.sh refuses a root with anything mounted).
while read -r m; do
  umount "$m" || die "cannot undo a stale mount under the root: $m"
done < <(awk -v r="$(realpath -m "$ROOT")/" 'index($5 "/", r) == 1 { print $5 }' /proc/self/mountinfo | sort -r)
bash "$TOP/tools/llama/root.sh" "$ROOT"
mkdir -p "$WORK/run" "$ROOT/cxltier/src" "$ROOT/cxltier/work"

mounted=()
daemon=
cleanup() {
  if [ -n "$daemon" ]; then
    kill "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount "${mounted[i]}" || true; done
}
trap cleanup EXIT
mount_on() {  # mount_on TARGET mount-args...
  local target=$1
  shift
  mount "$@" "$target"
  mounted+=("$target")
}
mount_on "$ROOT/cxltier/src" --bind "$TOP"
mount -o remount,bind,ro "$ROOT/cxltier/src"  # the root only reads the source
mount_on "$ROOT/cxltier/work" --bind "$WORK"
mount_on "$ROOT/proc" -t proc proc

in_root() { chroot "$ROOT" "$@"; }

if [ ! -f "$WORK/tiny.gguf" ]; then
  log "writing the model (tools/llama/make_model.py, its defaults)"
  in_root python3 /cxltier/src/tools/llama/make_model.py --out /cxltier/work/tiny.gguf
fi
log "building cxltier-llama in the root"
in_root cmake -S /cxltier/src/tools/llama -B /cxltier/work/obj >"$WORK/cmake.log" 2>&1 ||
  { tail -20 "$WORK/cmake.log" >&2; die "cmake (configure) failed in the root"; }
in_root cmake --build /cxltier/work/obj -j "$JOBS" >>"$WORK/cmake.log" 2>&1 ||
  { grep -E -A5 'error' "$WORK/cmake.log" | head -40 >&2; die "cxltier-llama did not build"; }

# Both tiers on node 0 (a one-node machine still runs every move for real);
# a tier 0 far smaller than the KV of all sequences.
cat >"$WORK/llama.toml" <<EOF
[daemon]
tick_ms = 20

[engine]
policy = "default"
tier0_budget = "$TIER0"
block_bytes = "32KiB"

[tiers]
fast_nodes = [0]
slow_nodes = [0]

[metrics]
listen = "127.0.0.1:0"  # any free port: another daemon may hold the default
EOF

start_daemon() {  # start_daemon MODE
  local sock=$WORK/run/cxltier.sock
  rm -rf "$WORK/state-$1" "$sock"
  "$BIN/cxltierd" --config "$WORK/llama.toml" --socket "$sock" --state-dir "$WORK/state-$1" \
    --log-level warn >"$WORK/cxltierd-$1.log" 2>&1 &
  daemon=$!
  local i
  for i in $(seq 100); do
    [ -S "$sock" ] && return 0
    kill -0 "$daemon" 2>/dev/null || { cat "$WORK/cxltierd-$1.log" >&2; die "cxltierd exited"; }
    sleep 0.1
  done
  die "cxltierd did not listen on $sock"
}
stop_daemon() {
  kill "$daemon"
  wait "$daemon" || true
  daemon=
}

for mode in page copy; do
  start_daemon "$mode"
  recorder=
  if [ "$mode" = page ]; then
    "$BIN/cxltierctl" --socket "$WORK/run/cxltier.sock" record --seconds 600 \
      --out "$WORK/llama-page.cxlt" >"$WORK/record.log" 2>&1 &
    recorder=$!
    sleep 0.5
  fi
  log "cxltier-llama --mode $mode"
  rc=0
  in_root /cxltier/work/obj/cxltier-llama --model /cxltier/work/tiny.gguf \
    --socket /cxltier/work/run/cxltier.sock --mode "$mode" --json "/cxltier/work/$mode.json" \
    "$@" || rc=$?
  if [ -n "$recorder" ]; then
    kill -INT "$recorder"
    wait "$recorder" || true
    cat "$WORK/record.log"
  fi
  stop_daemon
  [ "$rc" -eq 0 ] || die "cxltier-llama --mode $mode failed (exit $rc)"
done

python3 - "$WORK/page.json" "$WORK/copy.json" >"$SUMMARY" <<'EOF'
import json, sys
print(json.dumps([json.load(open(p)) for p in sys.argv[1:]], indent=2))
EOF
log "summary: $SUMMARY"
# Issue 33's bar: bit-identical logits, no corrupt block, restores from every tier.
python3 - "$SUMMARY" <<'EOF' || die "summary.json falls short (above)"
import json, sys
bad = []
for m in json.load(open(sys.argv[1])):
    if not m["logits_bit_identical"]: bad.append(m["mode"] + ": logits differ")
    if m["corrupt_blocks"]: bad.append(m["mode"] + ": corrupt blocks")
    if 0 in m["restores_from_tier"]: bad.append(m["mode"] + ": a tier served no restore")
print("\n".join(bad) or "llama: both modes bit-identical, no corrupt block, restores from every tier")
sys.exit(1 if bad else 0)
EOF

# The recording prints two replays: with the daemon's settings, and exactly
# as the daemon ran (its plans and moves). Run both; the first also with LRU
# and LFU and with the hints on and off.
[ -s "$WORK/llama-page.cxlt" ] || die "the recording is empty"
what_if=$(grep -A1 "replay with the daemon's settings" "$WORK/record.log" | tail -1 | sed 's/^ *cxltier-sim //')
exact=$(grep -A1 "replay exactly as the daemon ran it" "$WORK/record.log" | tail -1 | sed 's/^ *cxltier-sim //')
if [ -z "$what_if" ] || [ -z "$exact" ]; then die "cxltierctl record printed no replay command"; fi
log "replaying the page run's recorded traffic in cxltier-sim"
# shellcheck disable=SC2086 # the printed commands are word lists
{
  "$BIN/cxltier-sim" ${what_if/--policy default/--policy default,lru,lfu} --hints both
  "$BIN/cxltier-sim" $exact
} | tee "$OUT/replay$TAG.txt"
log "done in $((SECONDS - t0)) s"
