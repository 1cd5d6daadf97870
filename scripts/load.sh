#!/usr/bin/env bash
# The load run of docs/security.md: a cxltierd with room for the clients, then
# cxltier-load with CLIENTS clients of BLOCKS blocks each reporting for SECONDS.
# `make load` runs 256 x 1024 for 60 s; the tests run a short one.
# Usage: scripts/load.sh [CLIENTS] [BLOCKS] [SECONDS]   (needs a build)
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
CLIENTS=${1:-256} BLOCKS=${2:-1024} SECONDS_RUN=${3:-60}
BIN="$BUILD_DIR/bin"
DIR=$(mktemp -d /tmp/cxltier-load.XXXXXX)
cat >"$DIR/load.toml" <<TOML
[daemon]
socket = "$DIR/cxltierd.sock"
state_dir = "$DIR/state"
log_level = "warn"
[engine]
tier0_budget = "128MiB"
[tiers]
fast_nodes = [0]
slow_nodes = [0]
[limits]
# Every client is this uid: room for all of them under the per-uid limits too.
max_clients = $((CLIENTS + 8))
max_connections_per_uid = $((CLIENTS + 8))
max_pools_per_uid = $((CLIENTS + 8))
[metrics]
listen = "127.0.0.1:0"
TOML
"$BIN/cxltierd" --config "$DIR/load.toml" >"$DIR/cxltierd.log" 2>&1 &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null; rm -rf "$DIR"' EXIT
# Its socket, up to 60 s while it lives (a loaded machine may be slow to start it).
for _ in $(seq 600); do [ -S "$DIR/cxltierd.sock" ] || ! kill -0 $DAEMON 2>/dev/null && break; sleep 0.1; done
rc=0
"$BIN/cxltier-load" --socket "$DIR/cxltierd.sock" --clients "$CLIENTS" --blocks "$BLOCKS" \
  --seconds "$SECONDS_RUN" --json >"$DIR/load.json" || rc=$?
cat "$DIR/load.json"
if ! kill -0 $DAEMON 2>/dev/null; then
  echo "cxltier-load: the daemon died; its log:"; tail -20 "$DIR/cxltierd.log"; rc=1
fi
if grep -qiE "error|critical" "$DIR/cxltierd.log"; then
  echo "cxltier-load: the daemon logged errors:"; grep -iE "error|critical" "$DIR/cxltierd.log" | head; rc=1
fi
exit $rc
