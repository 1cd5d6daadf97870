#!/bin/sh
# Runs inside the QEMU guest (busybox sh), started by tools/qemu/compare.sh:
# every arm of the comparison with the kernel's tiering, for both access
# kinds, on the same fitted trace. Each arm's result is one line on the
# console, "COMPARE-RESULT <json>".
#
# Usage (in the guest): compare_guest.sh SHAPE TRACE BLOCK_BYTES FAST_FREE STEP_MS
set -e
SHAPE=$1 TRACE=$2 BLOCK=$3 FREE=$4 STEP_MS=$5
SOCK=/run/cxltierd/cxltierd.sock
DISK=/dev/vda
RATE_MIB_S=1024  # the daemon's default migration rate; the tuned kernel promotes no faster
fail() {
  echo "COMPARE FAIL: $*"
  [ -f /tmp/cxltierd.log ] && tail -n 30 /tmp/cxltierd.log
  dmesg | grep -i -A12 "invoked oom\|out of memory" | tail -n 40
  exit 1
}
mkdir -p /run/cxltierd /var/lib/cxltierd
mount -t debugfs none /sys/kernel/debug 2>/dev/null || true
[ -b "$DISK" ] || fail "no $DISK (guest.sh --disk)"
# QEMU 7.2 lets a device reach its emulated CXL memory only through one bounce
# buffer of a page: the device writes go a page at a time there.
DEVICE_IO=0
[ "$SHAPE" = cxl ] && DEVICE_IO=4096

if [ "$SHAPE" = cxl ]; then
  # The emulated Type-3 device as system RAM, movable (daxctl's default): node
  # 1, in a lower memory tier than node 0, which is what the kernel demotes
  # to. Movable, so that only user pages go there: with --no-movable the
  # kernel puts its own page tables and slab there when node 0 runs low, and
  # QEMU 7.2's TCG hangs walking page tables in its emulated CXL memory.
  cxl create-region -m -t pmem -d decoder0.0 -w 1 mem0 >/tmp/region.json || fail "cxl create-region"
  ndctl create-namespace -m devdax -r region0 >/tmp/ns.json || fail "ndctl create-namespace"
  daxctl reconfigure-device --mode=system-ram dax0.0 >/tmp/dax.json || fail "daxctl reconfigure-device"
fi
# Watermarks to the guest's size: khugepaged raises min_free_kbytes to tens of
# MiB on any machine, as much as the whole KV pool here (a host's hundreds of
# GiB make them a rounding error). 4 MiB, and the low-to-high gap 1 MiB.
echo 4096 > /proc/sys/vm/min_free_kbytes
# Per-cpu page lists: pages on them are not counted free in /proc/zoneinfo,
# which the replay's balloon reads, and 6.12 grows each CPU's list on its own
# (pcp high auto-tuning). In two 6.12 cxl guests a balloon did not settle
# within 5 s (the kernel-tuned cpu arm's 800 KiB under the 1 MiB it was to
# leave free, cxltier-lru's 630 KiB under 2.8 MiB); with a large fraction,
# which pins every list at its minimum, both 6.12 runs since passed. 6.1 is
# left as it was (its balloons settle).
case "$(uname -r)" in
  6.1.*) ;;
  *) echo 100000 > /proc/sys/vm/percpu_pagelist_high_fraction || fail "percpu_pagelist_high_fraction" ;;
esac
echo "== $SHAPE guest: kernel $(uname -r), nodes $(cat /sys/devices/system/node/online), percpu_pagelist_high_fraction $(cat /proc/sys/vm/percpu_pagelist_high_fraction)"
for t in /sys/devices/virtual/memory_tiering/memory_tier*; do
  [ -d "$t" ] && echo "   $(basename "$t"): nodes $(cat "$t/nodelist")"
done
echo "   demotion targets: $(cat /sys/kernel/mm/numa/demotion_enabled 2>/dev/null || echo '?') (demotion_enabled)"

# Whether node 1 is in a lower memory tier than node 0: in 6.1 only memory
# onlined by kmem (the CXL device) is; a CPU-less DRAM node shares node 0's
# tier, so there is nothing to demote to and mode 2 leaves its pages alone.
LOWER_TIER=false
for t in /sys/devices/virtual/memory_tiering/memory_tier*; do
  [ "$(cat "$t/nodelist" 2>/dev/null)" = 1 ] && LOWER_TIER=true
done
echo "   node 1 in a lower memory tier than node 0: $LOWER_TIER"
DBG=/sys/kernel/debug/sched/numa_balancing
[ -d "$DBG" ] || fail "no $DBG: the scan-period knobs of the tuned arm are in debugfs"
kernel_knobs() {  # numa_balancing demotion rate_limit scan_delay scan_min scan_max
  echo "$1" > /proc/sys/kernel/numa_balancing
  echo "$2" > /sys/kernel/mm/numa/demotion_enabled
  echo "$3" > /proc/sys/kernel/numa_balancing_promote_rate_limit_MBps
  echo "$4" > $DBG/scan_delay_ms
  echo "$5" > $DBG/scan_period_min_ms
  echo "$6" > $DBG/scan_period_max_ms
}
# The kernel's defaults in 6.1 (rate limit 65536 MB/s, scans after 1 s, every 1 to 60 s).
KERNEL_DEFAULTS="65536 1000 1000 60000"
defaults() { kernel_knobs 0 false $KERNEL_DEFAULTS; }

start_daemon() {  # policy budget_bytes
  policy_line=""
  [ "$1" != default ] && policy_line="policy = \"$1\""
  cat > /etc/cxltierd.toml <<CONF
[daemon]
socket = "$SOCK"
state_dir = "/var/lib/cxltierd"
[engine]
$policy_line
tier0_budget = $2
[metrics]
enabled = false
CONF
  rm -f "$SOCK" /var/lib/cxltierd/*
  cxltierd --config /etc/cxltierd.toml >/tmp/cxltierd.log 2>&1 &
  DAEMON=$!
  i=0
  while [ ! -S "$SOCK" ] && [ $i -lt 1200 ] && kill -0 $DAEMON 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
  [ -S "$SOCK" ] || fail "cxltierd did not start"
}
stop_daemon() {
  kill -TERM $DAEMON
  wait $DAEMON || fail "cxltierd did not exit 0"
}

run_arm() {  # name access [replay flags...]; ARM_FREE: its --fast-free
  name=$1 access=$2
  shift 2
  echo "== arm $name, $access reads ($(date +%T))"
  out=/tmp/arm-$name-$access.json
  cxltier-replay --trace "bin:$TRACE" --block-bytes "$BLOCK" --fast-free "$ARM_FREE" \
    --access "$access" --device "$DISK" --device-io $DEVICE_IO --step-ms "$STEP_MS" --arm "$name" \
    --json "$out" "$@" ||
    fail "arm $name ($access)"
  echo "COMPARE-RESULT {\"shape\":\"$SHAPE\",\"kernel\":\"$(uname -r)\",\"lower_tier\":$LOWER_TIER,\"result\":$(cat "$out")}"
}

for access in cpu device; do
  ARM_FREE=$FREE
  defaults
  run_arm none "$access"
  kernel_knobs 2 true $KERNEL_DEFAULTS
  run_arm kernel "$access"
  # One tuned setting: scans ten times as often, and promotes no faster than
  # cxltierd may migrate (its default rate).
  kernel_knobs 2 true $RATE_MIB_S 100 100 1000
  run_arm kernel-tuned "$access"
  # Equal capacity: cxltierd's tier-0 budget is what the kernel kept of the
  # pool on node 0 in the second half of its default arm. The kernel kept it
  # by running node 0 down into its watermarks (reclaim demotes from there);
  # cxltierd does not reclaim, so its balloon leaves that budget free above
  # the high watermark on top of FREE: every arm has FREE for everything but
  # the pool, and the pool gets the same bytes of node 0.
  budget=$(sed -n 's/.*"pool_fast_bytes_steady":\([0-9]*\).*/\1/p' /tmp/arm-kernel-$access.json)
  budget=$((${budget:-0} / BLOCK * BLOCK))
  [ "$budget" -gt 0 ] || fail "the kernel arm kept less than a block on node 0"
  echo "COMPARE-BUDGET {\"shape\":\"$SHAPE\",\"access\":\"$access\",\"tier0_budget\":$budget}"
  defaults
  ARM_FREE=$((FREE + budget))
  for policy in default lru; do
    start_daemon $policy $budget
    run_arm cxltier-$policy "$access" --socket "$SOCK" --daemon-pid $DAEMON
    stop_daemon
  done
done
echo "COMPARE DONE ($SHAPE)"
