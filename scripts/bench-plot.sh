#!/usr/bin/env bash
# Draws tick cost against block count from a cxltier-bench summary.
# Usage: bash scripts/bench-plot.sh build/bench-summary.json docs/img/tick-cost.png
set -euo pipefail
SUMMARY=${1:-build/bench-summary.json}
OUT=${2:-docs/img/tick-cost.png}
DATA=$(mktemp)
trap 'rm -f "$DATA"' EXIT
python3 - "$SUMMARY" > "$DATA" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for n in (8192, 65536, 1048576):
    row = [str(n)]
    for pct in (1, 10, 100):
        f = s.get(f"3_tick_us_{n}_blocks_{pct}pct")
        row.append(str(f["value"]) if f else "NaN")
    base = s.get(f"3_tick_us_{n}_blocks_1pct")
    row.append(str(base["baseline"]) if base else "NaN")
    print(" ".join(row))
PY
gnuplot <<GP
set terminal pngcairo size 900,560 noenhanced font 'sans,10'
set output '$OUT'
set title 'cxltierd tick (fold + plan) against block count'
set logscale xy
set xlabel 'blocks'
set ylabel 'microseconds per tick'
set grid
set key top left
plot '$DATA' using 1:2 with linespoints title '1% touched', \
     '$DATA' using 1:3 with linespoints title '10% touched', \
     '$DATA' using 1:4 with linespoints title '100% touched', \
     '$DATA' using 1:5 with linespoints dashtype 2 title 'baseline: one read of the state table'
GP
echo "plot written to $OUT"
