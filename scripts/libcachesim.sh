#!/usr/bin/env bash
# Our baselines next to libCacheSim's, on the Mooncake sample (docs/policies.md,
# "Checked against libCacheSim"). libCacheSim is not a Debian package: clone it
# yourself (https://github.com/1a1a11a/libCacheSim; the figures pinned in
# tests/sim/sim_test.cpp are from commit aa0fc40) and install its build
# dependencies (apt-get install libglib2.0-dev libzstd-dev).
# Usage: bash scripts/libcachesim.sh LIBCACHESIM_SOURCE_DIR
# Prints one line per policy and budget: libCacheSim's miss ratio, ours, and
# whether they agree to cachesim's four printed digits.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
SRC=${1:?usage: scripts/libcachesim.sh LIBCACHESIM_SOURCE_DIR}
[ -f "$SRC/libCacheSim/cache/eviction/S3FIFO.c" ] || { echo "libcachesim.sh: $SRC is not a libCacheSim source tree" >&2; exit 2; }
SIM="$BUILD_DIR/bin/cxltier-sim"
[ -x "$SIM" ] || build >/dev/null
WORK="$BUILD_DIR/libcachesim"
mkdir -p "$WORK/build"
if [ ! -x "$WORK/build/bin/cachesim" ]; then
  cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$WORK/build" -j "$JOBS" --target cachesim >/dev/null
fi

# One request per block touch, in trace order; ids shifted by one (libCacheSim
# reserves id 0).
python3 - "$CXLTIER_ROOT/tests/data/mooncake_synthetic_trace.jsonl" "$WORK/mooncake.txt" <<'EOF'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        if line.strip():
            for h in json.loads(line)["hash_ids"]:
                out.write(f"{h + 1}\n")
EOF

BLOCKS="51 204 819 3276 13107"  # 8 GiB, 32 GiB, 128 GiB, 512 GiB, 2 TiB of 160 MiB blocks
printf '%-9s %7s %12s %12s %s\n' policy blocks libcachesim ours agree
for pair in LRU:lru LFU:lfu ARC:arc Sieve:sieve S3FIFO:s3fifo WTinyLFU:tinylfu; do
  theirs_name=${pair%%:*} ours_name=${pair##*:}
  ours_json=$("$SIM" --trace "mooncake:$CXLTIER_ROOT/tests/data/mooncake_synthetic_trace.jsonl" \
    --budget "$(for b in $BLOCKS; do printf '%sMiB,' $((b * 160)); done | sed 's/,$//')" \
    --policy "$ours_name" --persist reset --json)
  for b in $BLOCKS; do
    theirs=$(cd "$WORK" && ./build/bin/cachesim mooncake.txt txt "$theirs_name" "$b" \
      --ignore-obj-size 1 2>&1 | sed -nE 's/.*miss ratio ([0-9.]+),.*/\1/p' | tail -1)
    ours=$(python3 -c "import json,sys
rows = [r for r in json.loads(sys.argv[1]) if r['capacity_blocks'] == int(sys.argv[2])]
print('%.4f' % (1 - rows[0]['hits'] / rows[0]['touches']))" "$ours_json" "$b")
    printf '%-9s %7s %12s %12s %s\n' "$ours_name" "$b" "$theirs" "$ours" \
      "$([ "$theirs" = "$ours" ] && echo yes || echo NO)"
  done
done
