#!/bin/sh
# Runs inside the QEMU guest (busybox sh), started by tools/qemu/compare.sh:
# the arms it names of the comparison with the kernel's tiering, on the same
# fitted trace. Each arm's result is one line on the console,
# "COMPARE-RESULT <json>".
#
# Usage (in the guest):
#   compare_guest.sh SHAPE TRACE BLOCK_BYTES FAST_FREE STEP_MS ACCESS ARMS [WARMUP_S]
# ACCESS: the access kinds, "cpu device" for both. ARMS: the arms to run, in
# order (compare.sh's --arms): none, kernel, kernel-tuned, kernel+KNOBS (the
# kernel with KNOBS=k=v,... of kernel_setting below; the tuning sweep), damon
# (where the kernel has DAMOS migrate_hot: 6.11 and later), cxltier-touches,
# cxltier-scores, cxltier-hints. WARMUP_S: cxltier-replay's --warmup.
set -e
SHAPE=$1 TRACE=$2 BLOCK=$3 FREE=$4 STEP_MS=$5 ACCESS=$6 ARMS=$7 WARMUP=${8:-0}
WANT_DAMON=false
case " $ARMS " in *" damon "*) WANT_DAMON=true ;; esac
SOCK=/run/cxltierd/cxltierd.sock
DISK=/dev/vda
fail() {
  echo "COMPARE FAIL: $*"
  [ -f /tmp/cxltierd.log ] && tail -n 30 /tmp/cxltierd.log
  dmesg | grep -i -A12 "invoked oom\|out of memory" | tail -n 40
  # Each zone's free memory and watermarks when the OOM killer ran.
  dmesg | grep -E "Node [0-9]+ (DMA|DMA32|Normal|Movable) free:" | tail -n 8
  grep -E "MemFree|Slab|SUnreclaim|KernelStack|PageTables|VmallocUsed|Percpu|Unevictable|Mlocked|AnonPages|Shmem:" /proc/meminfo
  sort -k3 -n -r /proc/slabinfo 2>/dev/null | head -n 5
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
# Pages freed go to per-CPU lists first, which /proc/zoneinfo's free count
# leaves out (the replay's balloon adds them up itself), and 6.12 grows each
# CPU's list on its own (pcp high auto-tuning): in 6.12 cxl guests a balloon
# did not settle (800 KiB short). A large fraction pins every list at its
# minimum, so that freed pages are free pages.
echo 100000 > /proc/sys/vm/percpu_pagelist_high_fraction || fail "percpu_pagelist_high_fraction"
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
# The kernel's tiering knobs, as k=v,... over its defaults (the same in 6.1
# and 6.12): mode (kernel.numa_balancing: 2 is memory tiering), rate
# (numa_balancing_promote_rate_limit_MBps), delay, pmin, pmax (the scanner's
# scan_delay_ms and scan_period_min/max_ms), size (scan_size_mb), hot
# (hot_threshold_ms: a page faulting within this long of its scan is hot), wsf
# (vm.watermark_scale_factor: the gap kswapd keeps free between the low and
# high watermarks, room for promotions), mglru (y or n: the multi-gen LRU).
KERNEL_DEFAULTS="mode=0,rate=65536,delay=1000,pmin=1000,pmax=60000,size=256,hot=1000,wsf=10,mglru=n"
knob() {  # file value: a default is skipped where the kernel lacks the knob
  if [ ! -e "$1" ]; then
    [ "$SOFT" = 1 ] && return 0
    fail "no $1: this kernel has no such knob"
  fi
  echo "$2" > "$1" || fail "cannot write $2 to $1"
}
kernel_setting() {  # k=v,... applied over the defaults
  SETTING=$1
  SOFT=1
  for kv in $(echo "$KERNEL_DEFAULTS,-,$1" | tr , ' '); do
    v=${kv#*=}
    [ "$kv" = - ] && { SOFT=0; continue; }
    case "${kv%%=*}" in
      mode) knob /proc/sys/kernel/numa_balancing "$v" ;;
      rate) knob /proc/sys/kernel/numa_balancing_promote_rate_limit_MBps "$v" ;;
      delay) knob $DBG/scan_delay_ms "$v" ;;
      pmin) knob $DBG/scan_period_min_ms "$v" ;;
      pmax) knob $DBG/scan_period_max_ms "$v" ;;
      size) knob $DBG/scan_size_mb "$v" ;;
      hot) knob $DBG/hot_threshold_ms "$v" ;;
      wsf) knob /proc/sys/vm/watermark_scale_factor "$v" ;;
      mglru) knob /sys/kernel/mm/lru_gen/enabled "$v" ;;
      '') ;;
      *) fail "unknown kernel knob '${kv%%=*}' (mode rate delay pmin pmax size hot wsf mglru)" ;;
    esac
  done
  echo true > /sys/kernel/mm/numa/demotion_enabled
  echo "   kernel knobs: numa_balancing $(cat /proc/sys/kernel/numa_balancing)," \
    "rate $(cat /proc/sys/kernel/numa_balancing_promote_rate_limit_MBps) MB/s," \
    "scan delay $(cat $DBG/scan_delay_ms) period $(cat $DBG/scan_period_min_ms)-$(cat $DBG/scan_period_max_ms) ms" \
    "size $(cat $DBG/scan_size_mb) MiB, hot $(cat $DBG/hot_threshold_ms 2>/dev/null || echo -) ms," \
    "watermark_scale_factor $(cat /proc/sys/vm/watermark_scale_factor), lru_gen $(cat /sys/kernel/mm/lru_gen/enabled 2>/dev/null || echo -)"
}
# kernel-tuned: compare.sh --tuned, the best setting of the sweep
# (compare_all.sh; docs/comparison.md, "Tuning the kernel"), found on another
# seed of the workload than the one reported; else scans ten times as often
# as the default, promoting no faster than cxltierd migrates by default.
KERNEL_TUNED=${KERNEL_TUNED:-mode=2,rate=1024,delay=100,pmin=100,pmax=1000}
# Demotion on in every arm: the CXL node is movable memory, so the kernel's
# own allocations (page tables, slab) have only node 0, and with the pool
# filling node 0's free room and nothing else to reclaim (no swap, a ramfs
# root) they would end in the OOM killer. So reclaim may demote in every arm,
# cxltierd's too (counted: pgdemote); only NUMA balancing's promotion differs.
defaults() { kernel_setting ""; }

# kswapd gives a node up after 16 runs that reclaim nothing (kswapd_failures)
# and is not woken again until some reclaim there succeeds; here (no swap, a
# ramfs root, the balloon locked) sizing the balloon can do that. Asking the
# root cgroup to reclaim before an arm did not help: node 0 had nothing to
# reclaim then, and it failed in every arm. cxltier-replay revives kswapd at
# the end of the warm-up instead, through the pool's cgroup, whose pages are on
# node 0 by then, and records it ("kswapd" in its result).
mkdir -p /sys/fs/cgroup
[ -f /sys/fs/cgroup/memory.reclaim ] || mount -t cgroup2 none /sys/fs/cgroup || fail "mount cgroup2"
[ -f /sys/fs/cgroup/memory.reclaim ] || fail "no memory.reclaim in the root cgroup"
# Two memory cgroups: fixed, for this shell and what it starts (the replay's
# own memory, its balloon, cxltierd), and pool, where the replay moves before
# it maps the pool (--cgroup). DAMON's cold scheme leaves fixed's pages alone
# (a memcg filter): mlock keeps the balloon from reclaim, not from
# migration, and migrate_cold moved 294 MB of it to node 1 in one run,
# freeing node 0 for the pool (2026-12-05). The replay checks at the end
# that its balloon is all still on node 0 (balloon_off_node_bytes).
echo +memory > /sys/fs/cgroup/cgroup.subtree_control || fail "no memory controller"
mkdir -p /sys/fs/cgroup/fixed /sys/fs/cgroup/pool
echo $$ > /sys/fs/cgroup/fixed/cgroup.procs || fail "cannot join /sys/fs/cgroup/fixed"

start_daemon() {  # policy budget_bytes persist
  policy_line=""
  [ "$1" != default ] && policy_line="policy = \"$1\""
  cat > /etc/cxltierd.toml <<CONF
[daemon]
socket = "$SOCK"
state_dir = "/var/lib/cxltierd"
[engine]
$policy_line
tier0_budget = $2
persist = $3
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
  # What went wrong in the daemon, if anything (a mover that stalled, moves
  # that failed): its warnings and errors, the last 30, on the console.
  grep -E '^[0-9-]+ [0-9:.]+ (warning|error|critical) ' /tmp/cxltierd.log | tail -n 30 | sed 's/^/   cxltierd: /' || true
}

run_arm() {  # name access [replay flags...]; ARM_FREE: its --fast-free
  name=$1 access=$2
  shift 2
  echo "== arm $name, $access reads ($(date +%T))"
  out=/tmp/arm-$name-$access.json
  cxltier-replay --trace "bin:$TRACE" --block-bytes "$BLOCK" --fast-free "$ARM_FREE" \
    --access "$access" --device "$DISK" --device-io $DEVICE_IO --step-ms "$STEP_MS" --arm "$name" \
    --warmup "$WARMUP" --cgroup /sys/fs/cgroup/pool --json "$out" "$@" ||
    fail "arm $name ($access)"
  echo "COMPARE-RESULT {\"shape\":\"$SHAPE\",\"kernel\":\"$(uname -r)\",\"lower_tier\":$LOWER_TIER,\"kernel_setting\":\"$SETTING\",\"result\":$(cat "$out")}"
}

# DAMON-based tiering (6.11 and later: DAMOS migrate_hot and migrate_cold,
# through sysfs as the kernel's admin guide describes): two kdamonds on
# physical addresses, one watching node 1 that moves what is accessed to node
# 0 (at most 100 MiB a second, the tuned kernel arm's order), one watching
# node 0 that moves what has not been accessed for 2 s to node 1. 6.12 has no
# node-memory quota goals (those came later), so the cold scheme demotes by
# age alone. Set up only when the damon arm is asked for; that arm fails
# where the kernel has no migrate_hot.
DAMON=/sys/kernel/mm/damon/admin
node_range() {  # node: "start end" of its physical memory blocks
  bs=$(printf '%d' "0x$(cat /sys/devices/system/memory/block_size_bytes)")
  lo="" hi=""
  for m in /sys/devices/system/node/node$1/memory[0-9]*; do
    k=${m##*memory}
    [ -z "$lo" ] || [ "$k" -lt "$lo" ] && lo=$k
    [ -z "$hi" ] || [ "$k" -gt "$hi" ] && hi=$k
  done
  echo "$((lo * bs)) $(((hi + 1) * bs))"
}
damon_scheme() {  # kdamond watched_node action target_node nr_accesses_min nr_accesses_max age_min quota_bytes
  c=$DAMON/kdamonds/$1/contexts/0
  echo 1 > $DAMON/kdamonds/$1/contexts/nr_contexts
  echo paddr > $c/operations
  echo 1 > $c/targets/nr_targets
  echo 1 > $c/targets/0/regions/nr_regions
  set -- "$1" "$2" "$3" "$4" "$5" "$6" "$7" $(node_range $2) "$8"
  echo "${8}" > $c/targets/0/regions/0/start
  echo "${9}" > $c/targets/0/regions/0/end
  echo "   kdamond $1: node $2 [$(printf '%#x' "${8}"), $(printf '%#x' "${9}")), $3 to node $4"
  echo 1 > $c/schemes/nr_schemes
  sc=$c/schemes/0
  echo "$3" > $sc/action
  echo "$4" > $sc/target_nid
  # Every range of the pattern: the sysfs defaults are 0 to 0, which no
  # region of any size matches.
  echo 0 > $sc/access_pattern/sz/min
  echo $((1 << 40)) > $sc/access_pattern/sz/max
  echo "$5" > $sc/access_pattern/nr_accesses/min
  echo "$6" > $sc/access_pattern/nr_accesses/max
  echo "$7" > $sc/access_pattern/age/min
  echo 4294967295 > $sc/access_pattern/age/max
  echo "${10}" > $sc/quotas/bytes
  echo 1000 > $sc/quotas/reset_interval_ms
  # The fixed cgroup's pages (the balloon, the replay's own) are not the
  # workload's: out of every scheme.
  echo 1 > $sc/filters/nr_filters
  echo memcg > $sc/filters/0/type
  echo /fixed > $sc/filters/0/memcg_path
  echo Y > $sc/filters/0/matching
}
HAVE_DAMON=false
if [ "$WANT_DAMON" = true ] && [ -f $DAMON/kdamonds/nr_kdamonds ] && [ "$LOWER_TIER" = true ]; then
  echo 2 > $DAMON/kdamonds/nr_kdamonds
  echo 1 > $DAMON/kdamonds/0/contexts/nr_contexts
  echo 1 > $DAMON/kdamonds/0/contexts/0/schemes/nr_schemes
  if echo migrate_hot > $DAMON/kdamonds/0/contexts/0/schemes/0/action 2>/dev/null; then
    HAVE_DAMON=true
    # Aggregation every 100 ms (the default): nr_accesses counts up to 20 of
    # its 5 ms samples; age is in aggregation intervals.
    damon_scheme 0 1 migrate_hot 0 1 20 0 $((100 << 20))
    # No quota on the cold side: a quota goes to the coldest regions first,
    # which are the balloon's locked pages (that migrate_cold cannot move),
    # and with 100 MiB a second it never reached a pool page (2026-12-05).
    damon_scheme 1 0 migrate_cold 1 0 0 20 0
  fi
fi
echo "   DAMON migrate_hot and migrate_cold: $HAVE_DAMON"
damon_stats() {  # "hot_bytes cold_bytes" applied so far; each scheme's stats on the console
  for k in 0 1; do
    st=$DAMON/kdamonds/$k/contexts/0/schemes/0/stats
    echo "   kdamond $k ($(cat $DAMON/kdamonds/$k/contexts/0/schemes/0/action)): tried $(cat $st/nr_tried) ($(cat $st/sz_tried) B), applied $(cat $st/nr_applied) ($(cat $st/sz_applied) B), quota exceeded $(cat $st/qt_exceeds)" >&2
  done
  echo "$(cat $DAMON/kdamonds/0/contexts/0/schemes/0/stats/sz_applied) $(cat $DAMON/kdamonds/1/contexts/0/schemes/0/stats/sz_applied)"
}

# The same landing room for every arm: the balloon leaves FREE bytes of node
# 0 free above its high watermark at the start of each, and cxltierd's tier-0
# budget is those bytes (in whole blocks). The kernel may also run node 0
# down into its watermarks before kswapd demotes; cxltierd does not reclaim.
ARM_FREE=$FREE
budget=$((FREE / BLOCK * BLOCK))
[ "$budget" -gt 0 ] || fail "FREE ($FREE) is less than a block"
for access in $ACCESS; do
  echo "COMPARE-BUDGET {\"shape\":\"$SHAPE\",\"access\":\"$access\",\"tier0_budget\":$budget}"
  for arm in $ARMS; do
    defaults
    case "$arm" in
      none) run_arm none "$access" ;;
      kernel) kernel_setting mode=2; run_arm kernel "$access" ;;
      kernel-tuned) kernel_setting "mode=2,$KERNEL_TUNED"; run_arm kernel-tuned "$access" ;;
      kernel+*) kernel_setting "mode=2,${arm#kernel+}"; run_arm "$arm" "$access" ;;
      damon)
        [ "$HAVE_DAMON" = true ] || fail "arm damon: this kernel has no DAMOS migrate_hot (6.11 and later: --kernel 6.12)"
        for k in 0 1; do echo on > $DAMON/kdamonds/$k/state || fail "kdamond $k did not start"; done
        run_arm damon "$access"
        for k in 0 1; do echo update_schemes_stats > $DAMON/kdamonds/$k/state; done
        set -- $(damon_stats)
        for k in 0 1; do echo off > $DAMON/kdamonds/$k/state; done
        echo "COMPARE-DAMON {\"shape\":\"$SHAPE\",\"access\":\"$access\",\"promoted_bytes\":$1,\"demoted_bytes\":$2}" ;;
      # What the information buys (issue 34): (a) every touch, nothing more:
      # LRU, one flat score per touch, no state kept across re-admissions;
      # (b) the trace's scores and the default policy with persistence; (c)
      # (b) and the trace's scheduler hints.
      cxltier-touches)
        start_daemon lru $budget false
        run_arm cxltier-touches "$access" --socket "$SOCK" --daemon-pid $DAEMON --scores flat
        stop_daemon ;;
      cxltier-scores)
        start_daemon default $budget true
        run_arm cxltier-scores "$access" --socket "$SOCK" --daemon-pid $DAEMON
        stop_daemon ;;
      cxltier-hints)
        start_daemon default $budget true
        run_arm cxltier-hints "$access" --socket "$SOCK" --daemon-pid $DAEMON --hints
        stop_daemon ;;
      *) fail "unknown arm '$arm'" ;;
    esac
  done
done
echo "COMPARE DONE ($SHAPE)"
