#!/bin/sh
# Runs inside the QEMU guest (busybox sh): the daemon discovers the topology
# itself, cxltier-loadgen drives it, and every check asks the kernel.
# Usage (in the guest): guest_test.sh SHAPE
set -e
SHAPE=${1:-numa}
SOCK=/run/cxltierd/cxltierd.sock
mkdir -p /run/cxltierd /var/lib/cxltierd
# Small blocks: the pools' new pages land on the last tier, which in the cxl
# and hmat guests is the emulated CXL device, and under TCG every access to
# it is emulated I/O (a memset there runs at 2 to 4 MiB/s against 730 MiB/s on
# node 0 or 1, in the hmat guest). Page-mode runs use 96 blocks of 256 KiB
# (24 MiB), copy-mode runs blocks of 64 KiB.
BLOCK_KIB=256
BLOCK=${BLOCK_KIB}KiB
COPY_BLOCK=64KiB
# Tier 0's budget (24 blocks); in the three-node hmat guest tier 1's too (the
# CXL node, tier 2, holds the rest), so blocks of the loadgen runs sit in all three.
BUDGET='tier0_budget = "6MiB"'
TIERS=""
if [ "$SHAPE" = hmat ]; then
  BUDGET=""
  TIERS='[tiers]
budgets = ["6MiB", "6MiB"]'
fi
cat > /etc/cxltierd.toml <<CONF
[daemon]
socket = "$SOCK"
state_dir = "/var/lib/cxltierd"
tick_ms = 50
[engine]
policy = "lfu"
$BUDGET
hysteresis_ticks = 1
[migration]
rate_mib_s = 4096
[metrics]
enabled = false
$TIERS
CONF

# Kernel NUMA balancing (on by default) would fight the daemon over address-range
# pools (docs/operations.md), and its hint faults make pages it is sampling read
# as "not present" (-ENOENT) to move_pages, which the placement checks ask.
echo 0 > /proc/sys/kernel/numa_balancing

# Every wait is for an event, bounded generously (TCG is slow, and slower still
# on a loaded host): it ends as soon as the event happens.
start_daemon() {  # [CONFIG]: /etc/cxltierd.toml unless given
  rm -f "$SOCK"
  cxltierd --config "${1:-/etc/cxltierd.toml}" >>/tmp/cxltierd.log 2>&1 &
  DAEMON=$!
  i=0  # up to 120 s, while the daemon is alive
  while [ ! -S "$SOCK" ] && [ $i -lt 1200 ] && kill -0 $DAEMON 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
  [ -S "$SOCK" ] || { echo "E2E FAIL: cxltierd did not start"; cat /tmp/cxltierd.log; exit 1; }
}
fail() { echo "E2E FAIL: $*"; echo "--- cxltierd log"; cat /tmp/cxltierd.log; exit 1; }

# Copy mode: 160 blocks of 64 KiB (10 MiB, over the 6 MiB budget), pools
# pinned, one reader thread (TCG runs every copy and check in software).
COPY_RUN="--pool copy --pin --readers 1 --blocks 160 --block-bytes $COPY_BLOCK --steps 150 \
  --until-moves 1 --seconds 180 --step-ms 2 --seed 7"
# Copy mode's checks: every block whole under every lease, placement as published.
copy_checks() {
  grep -q '"torn_reads": 0,' "$1" || fail "torn reads in $1"
  grep -q '"corrupt_blocks": 0,' "$1" || fail "corrupt blocks in $1"
  grep -q '"reader_failures": 0,' "$1" || fail "reader failures in $1"
  grep -q '"copies": [1-9]' "$1" || fail "no block was copied in $1"
}

# QEMU 7.2's cxl-type3 has only persistent memory: pmem region -> devdax -> kmem.
cxl_as_devdax() {
  echo "== the emulated CXL Type-3 device as device-DAX"
  cxl create-region -m -t pmem -d decoder0.0 -w 1 mem0 >/tmp/region.json || fail "cxl create-region"
  ndctl create-namespace -m devdax -r region0 >/tmp/ns.json || fail "ndctl create-namespace"
  [ -c /dev/dax0.0 ] || fail "no /dev/dax0.0"
}
# Not movable: pinned pages of a movable zone are migrated off it (to node 0).
cxl_as_system_ram() {  # NODE: the node the CXL memory must become
  echo "== bringing it online as system RAM, not movable (pinned pools stay on it)"
  daxctl reconfigure-device --mode=system-ram --no-movable dax0.0 >/tmp/dax.json ||
    fail "daxctl reconfigure-device"
  grep -q "\"target_node\":$1" /tmp/dax.json || fail "the CXL memory did not become node $1"
  [ -n "$(cat /sys/devices/system/node/node$1/cpulist)" ] && fail "the CXL node has CPUs"
  return 0
}

# The hmat guest's tiers 1 and 2 follow the kernel's memory tiers, and the
# kernels differ. 6.1 puts node 1 in node 0's DRAM memory tier (4) and the
# kmem CXL node 2 in a lower one (22): tier 1 is node 1, tier 2 node 2. 6.12
# gives node 1 a memory tier of its own from its HMAT figures (270: 150 ns and
# 5 GiB/s against node 0's 10 ns and 20 GiB/s), below the CXL node's 22 (it
# has no figures): tier 1 is node 2, tier 2 node 1.
MID=1 LOW=2 NODE1_KTIER=4
if [ "$SHAPE" = hmat ]; then
  case "$(uname -r)" in
    6.1.*) ;;
    6.12.*) MID=2 LOW=1 NODE1_KTIER=270 ;;
    *) fail "no hmat expectations for kernel $(uname -r) (6.1 or 6.12)" ;;
  esac
  cxl_as_devdax
  cxl_as_system_ram 2
fi

if [ "$SHAPE" = cxl ]; then
  cxl_as_devdax
  echo "== copy mode, tier 1 the device-DAX device (never onlined), tier 0 pinned"
  start_daemon
  # No writers here: under TCG each access to the emulated device is slow, a
  # copy to it spans ticks, and a writer's rewrite cancels it (one CI run saw
  # 707 copies dropped and no demotion in 180 s). Writers over copies run in
  # the copy-mode run below, on this guest's CXL node as system RAM.
  cxltier-loadgen --socket "$SOCK" $COPY_RUN --writers 0 --devdax /dev/dax0.0 \
    --check-placement --expect-moves --json > /tmp/lg-devdax.json ||
    { cat /tmp/lg-devdax.json; fail "loadgen (copy, devdax)"; }
  cat /tmp/lg-devdax.json
  copy_checks /tmp/lg-devdax.json
  grep -q "tier 1 pool 0 (device-DAX" /tmp/cxltierd.log || fail "the daemon did not map the device"
  # Two owners of the same device-DAX bytes would be handed the same places:
  # while one connection holds a tier pool there, another's is refused (busy).
  # The holder touches its few blocks until it is stopped (at most 100 s);
  # its pool is waited for, bounded.
  mapped=$(grep -c "(device-DAX" /tmp/cxltierd.log)
  cxltier-loadgen --socket "$SOCK" --pool copy --blocks 8 --block-bytes $COPY_BLOCK \
    --steps 20000 --step-ms 5 --seconds 100 --writers 0 --readers 0 --devdax /dev/dax0.0 \
    > /tmp/lg-dax-holder.out 2>&1 &
  HOLDER=$!
  for _ in $(seq 1 1200); do
    [ "$(grep -c "(device-DAX" /tmp/cxltierd.log)" -gt "$mapped" ] && break
    kill -0 $HOLDER 2>/dev/null || break
    sleep 0.1
  done
  [ "$(grep -c "(device-DAX" /tmp/cxltierd.log)" -gt "$mapped" ] ||
    { cat /tmp/lg-dax-holder.out; fail "the holder's device-DAX pool was never made"; }
  second=0
  cxltier-loadgen --socket "$SOCK" --pool copy --blocks 8 --block-bytes $COPY_BLOCK --steps 1 \
    --writers 0 --readers 0 --devdax /dev/dax0.0 > /tmp/lg-dax-second.out 2>&1 || second=$?
  kill -0 $HOLDER 2>/dev/null ||
    { cat /tmp/lg-dax-holder.out; fail "the device-DAX holder left before the check ended"; }
  [ "$second" -ne 0 ] ||
    { cat /tmp/lg-dax-second.out; fail "a second tier pool over the same device-DAX bytes was made"; }
  grep -q "are a tier pool of a connection of this daemon" /tmp/lg-dax-second.out ||
    { cat /tmp/lg-dax-second.out; fail "the second device-DAX pool was refused for another reason"; }
  echo "a second owner of the device-DAX bytes was refused: $(tail -1 /tmp/lg-dax-second.out)"
  kill -TERM $HOLDER
  wait $HOLDER || true
  # Across a daemon restart the client hands the next daemon the device it
  # made its pool with (its fd), never the path opened again: the path here
  # names another device (/dev/zero) by then, and the reconnect must still
  # take the same bytes back (its region kept for it: DevdaxReservations),
  # with a reader's leases whole throughout.
  echo "== device-DAX across a daemon restart, the pool's path pointed elsewhere"
  ln -sfn /dev/dax0.0 /tmp/dax-link
  wait_mapped() {  # until the daemon's log shows more device-DAX pools than $1 (120 s)
    for _ in $(seq 1 1200); do
      [ "$(grep -c "(device-DAX" /tmp/cxltierd.log)" -gt "$1" ] && return 0
      kill -0 $LG 2>/dev/null || return 1
      sleep 0.1
    done
    return 1
  }
  # The holder's region may still be busy for a moment (its disconnect, a
  # copy in flight under TCG): a start refused "busy" is tried again, bounded.
  made=0
  for _ in $(seq 1 60); do
    mapped=$(grep -c "(device-DAX" /tmp/cxltierd.log)
    cxltier-loadgen --socket "$SOCK" --pool copy --blocks 8 --block-bytes $COPY_BLOCK \
      --steps 20000 --step-ms 5 --until-signal --seconds 300 --writers 0 --readers 1 \
      --reconnect --devdax /tmp/dax-link --json > /tmp/lg-dax-restart.json \
      2> /tmp/lg-dax-restart.err &
    LG=$!
    if wait_mapped "$mapped"; then made=1; break; fi
    kill -TERM $LG 2>/dev/null || true  # it runs until a signal, if it runs
    wait $LG || true
    grep -q "busy" /tmp/lg-dax-restart.err || break
    sleep 1
  done
  [ "$made" = 1 ] || { cat /tmp/lg-dax-restart.err; fail "the restart check's pool was never made"; }
  ln -sfn /dev/zero /tmp/dax-link
  kill -TERM $DAEMON
  wait $DAEMON || fail "cxltierd did not exit 0 on SIGTERM"
  mapped=$(grep -c "(device-DAX" /tmp/cxltierd.log)
  start_daemon
  wait_mapped "$mapped" ||
    { cat /tmp/lg-dax-restart.err; fail "the device-DAX pool was not handed to the restarted daemon"; }
  kill -USR1 $LG 2>/dev/null || true  # if it is gone already, its exit status says why
  wait $LG || { cat /tmp/lg-dax-restart.json /tmp/lg-dax-restart.err; fail "loadgen (device-DAX restart)"; }
  grep -q '"reconnects": [1-9]' /tmp/lg-dax-restart.json ||
    { cat /tmp/lg-dax-restart.json; fail "no reconnect in the device-DAX restart check"; }
  grep -q '"torn_reads": 0,' /tmp/lg-dax-restart.json || fail "torn reads across the restart"
  grep -q '"corrupt_blocks": 0,' /tmp/lg-dax-restart.json || fail "corrupt blocks across the restart"
  grep -q '"reader_failures": 0,' /tmp/lg-dax-restart.json || fail "reader failures across the restart"
  echo "the device-DAX pool came back through its fd after a restart"
  kill -TERM $DAEMON
  wait $DAEMON || fail "cxltierd did not exit 0 on SIGTERM"
  cxl_as_system_ram 1
fi

# Tier 0's budget bounds placement from admission (docs/operations.md): a
# memfd pool's new pages land in the last tier, and only the planner puts a
# block in tier 0. So under the loadgen's admitting workload (96 blocks,
# written after the pool is registered, against a 16-block tier 0) every
# sample of `status --json` has tier 0 at most its budget plus one tick's
# moves. A daemon of its own: a slow migration rate makes one tick's moves a
# few blocks, far fewer than the working set.
budget_bound() {
  b_tick_ms=50 b_rate_mib_s=16 b_budget_mib=4 b_block=$((BLOCK_KIB * 1024))
  cat > /etc/cxltierd-bound.toml <<CONF
[daemon]
socket = "$SOCK"
state_dir = "/var/lib/cxltierd-bound"
tick_ms = $b_tick_ms
[engine]
policy = "lfu"
tier0_budget = "${b_budget_mib}MiB"
hysteresis_ticks = 1
[migration]
rate_mib_s = $b_rate_mib_s
[metrics]
enabled = false
CONF
  mkdir -p /var/lib/cxltierd-bound
  start_daemon /etc/cxltierd-bound.toml
  # From the config: the planner's bytes per tick are the larger of two
  # blocks and rate x tick (MigrateBytesPerTick); in blocks, rounded up.
  per_tick_bytes=$((b_rate_mib_s * 1048576 / 1000 * b_tick_ms))
  [ $per_tick_bytes -ge $((2 * b_block)) ] || per_tick_bytes=$((2 * b_block))
  per_tick=$(((per_tick_bytes + b_block - 1) / b_block))
  budget_blocks=$((b_budget_mib * 1048576 / b_block))
  bound=$((budget_blocks + per_tick))
  status_json() { cxltierctl --socket "$SOCK" status --json | tr -d ' \n'; }
  j=$(status_json)
  # The daemon agrees with the config (block size is set by the first client).
  echo "$j" | grep -q "\"budget_bytes\":$((b_budget_mib * 1048576))," ||
    fail "tier 0's budget is not ${b_budget_mib} MiB: $j"
  echo "== tier 0 bound: ${budget_blocks} blocks of budget + ${per_tick} moves a tick = ${bound} blocks"
  cxltier-loadgen --socket "$SOCK" --pool memfd --blocks 96 --block-bytes $BLOCK --steps 300 \
    --step-ms 2 --seed 7 --check-placement --json > /tmp/lg-bound.json 2>&1 &
  LG=$!
  samples=0 max0=0 maxheld=0 maxall=0 per_tick_checked=0
  : > /tmp/bound-samples.txt
  while kill -0 $LG 2>/dev/null; do
    j=$(status_json) || continue
    # Keys come sorted: the first tier's blocks, and the top level's.
    t0=$(echo "$j" | sed -n 's/.*"tiers":\[{"blocks":\([0-9]*\),"budget_bytes".*/\1/p')
    all=$(echo "$j" | sed -n 's/^{"block_bytes":[0-9]*,"blocks":\([0-9]*\),.*/\1/p')
    [ -n "$t0" ] && [ -n "$all" ] || continue
    # Released blocks' pages still counted in tier 0 (none before the first hello).
    held=$(echo "$j" | sed -n 's/.*"released_pages":{[^}]*"held_blocks":\([0-9]*\).*/\1/p')
    samples=$((samples + 1))
    echo "$samples tier0=$t0 held=${held:-0} all=$all" >> /tmp/bound-samples.txt
    [ "$t0" -le "$max0" ] || max0=$t0
    [ $((t0 + ${held:-0})) -le "$maxheld" ] || maxheld=$((t0 + ${held:-0}))
    [ "$all" -le "$maxall" ] || maxall=$all
    # The engine (and its bytes per tick) exists once the first client said hello.
    if echo "$j" | grep -q "\"block_bytes\":$b_block,"; then
      # The pace (PlanPace) keeps each plan's budget at or below this cap.
      echo "$j" | grep -q "\"max_budget_bytes_per_tick\":$per_tick_bytes[,}]" ||
        fail "the planner's bytes per tick are not at most ${per_tick_bytes}: $j"
      now=$(echo "$j" | sed -n 's/.*"budget_bytes_per_tick":\([0-9]*\).*/\1/p')
      [ -n "$now" ] && [ "$now" -le $per_tick_bytes ] ||
        fail "the paced budget ($now) is over its cap ${per_tick_bytes}: $j"
      per_tick_checked=1
    fi
  done
  wait $LG || { cat /tmp/lg-bound.json; fail "loadgen (tier 0 bound)"; }
  echo "tier 0 bound: $samples samples, tier 0 peaked at $max0 blocks (with released blocks' pages: $maxheld; bound $bound), all blocks at $maxall"
  [ $samples -ge 20 ] || { cat /tmp/bound-samples.txt; fail "only $samples status samples"; }
  [ $per_tick_checked = 1 ] || fail "no sample had the engine's block size ($b_block): bytes per tick unchecked"
  # Not vacuous: more blocks were live than the bound, and tier 0 was used.
  [ $maxall -gt $bound ] || fail "the workload never held more than $bound blocks ($maxall)"
  [ $max0 -gt 0 ] || fail "tier 0 never held a block"
  [ $max0 -le $bound ] || { cat /tmp/bound-samples.txt; fail "tier 0 held $max0 blocks, over its budget of $budget_blocks plus one tick's $per_tick moves"; }
  [ $maxheld -le $bound ] || { cat /tmp/bound-samples.txt; fail "tier 0 held $maxheld blocks' worth with released blocks' pages, over its budget of $budget_blocks plus one tick's $per_tick moves"; }
  grep -q "new pages on tier 1 (nodes 1)" /tmp/cxltierd.log || fail "the pool's new pages were not steered to tier 1"
  # Blocks released from tier 0 left their pages there: counted until a new
  # block took them (reused) or they were moved down (moved). The loadgen
  # releases and reuses pool blocks, so some were.
  rp=$(status_json | sed -n 's/.*"released_pages":{\([^}]*\)}.*/\1/p')
  echo "released blocks' pages: $rp"
  reused=$(echo "$rp" | sed -n 's/.*"reused":\([0-9]*\).*/\1/p')
  moved=$(echo "$rp" | sed -n 's/.*"moved":\([0-9]*\).*/\1/p')
  [ -n "$reused" ] && [ -n "$moved" ] && [ $((reused + moved)) -gt 0 ] ||
    fail "no released block's pages were reused or moved down: $rp"
  kill -TERM $DAEMON
  wait $DAEMON || fail "cxltierd did not exit 0 on SIGTERM"
}
[ "$SHAPE" = cxl ] && budget_bound

echo "== $SHAPE guest: kernel $(uname -r), nodes $(cat /sys/devices/system/node/online), node 1 CPUs: '$(cat /sys/devices/system/node/node1/cpulist 2>/dev/null)'"
start_daemon
grep -q "tiers: auto" /tmp/cxltierd.log || fail "the daemon did not pick tiers itself"
cxltierctl --socket "$SOCK" tiers | tee /tmp/tiers.txt
grep -q '^tier 0 (nodes 0)' /tmp/tiers.txt || fail "tier 0 is not node 0 alone"
grep -q "^tier 1 (nodes $MID)" /tmp/tiers.txt || fail "node $MID is not the slow tier"
if [ "$SHAPE" = cxl ]; then
  # In 6.1 only the kmem-onlined CXL node lands in a lower memory tier.
  t0=$(cat /sys/devices/virtual/memory_tiering/memory_tier*/nodelist | grep -n '^0$' | cut -d: -f1)
  t1=$(cat /sys/devices/virtual/memory_tiering/memory_tier*/nodelist | grep -n '^1$' | cut -d: -f1)
  [ -n "$t1" ] && [ "$t0" != "$t1" ] || fail "node 1 is not in a memory tier of its own"
  grep -q '"kernel_memory_tier":4,"memory_bytes":[0-9]*,"node":0' /tmp/tiers.txt || fail "tier of node 0"
fi
if [ "$SHAPE" = hmat ]; then
  # node 1 is slower in the HMAT table the guest was built with (150 ns against 10 ns).
  grep -q '"node":1,"read_bandwidth_mib_s":5120,"read_latency_ns":150' /tmp/tiers.txt ||
    fail "the daemon did not read node 1's HMAT latency and bandwidth"
  # Three tiers, in the kernel's memory-tier order (above): node 0 (CPUs),
  # then node 1 and the kmem CXL node 2 in the order of their kernel tiers.
  for t in /sys/devices/virtual/memory_tiering/memory_tier*; do echo "$t: $(cat $t/nodelist)"; done
  grep -q '"kernel_memory_tier":4,"memory_bytes":[0-9]*,"node":0' /tmp/tiers.txt || fail "kernel tier of node 0"
  grep -q "\"kernel_memory_tier\":$NODE1_KTIER,\"memory_bytes\":[0-9]*,\"node\":1," /tmp/tiers.txt ||
    fail "node 1 is not in kernel memory tier $NODE1_KTIER on $(uname -r)"
  grep -q "tiers: auto: .* in 2 tiers by kernel memory tier" /tmp/cxltierd.log ||
    fail "the daemon did not find two tiers below tier 0"
  grep -q "node 0: .* tier 0, read latency 10 ns" /tmp/cxltierd.log || fail "node 0 is not tier 0"
  if [ $MID = 1 ]; then t1=1 t2=2; else t1=2 t2=1; fi  # the daemon's tiers of nodes 1 and 2
  grep -q "node 1: .* tier $t1, read latency 150 ns" /tmp/cxltierd.log || fail "node 1 is not tier $t1"
  grep -q "node 2: .* 0 CPUs, tier $t2, kernel memory_tier" /tmp/cxltierd.log || fail "the CXL node 2 is not tier $t2"
  grep -q "^tier 2 (nodes $LOW): 0 blocks, 0 B" /tmp/tiers.txt ||
    fail "cxltierctl tiers does not show tier 2 (node $LOW, no budget: it holds the rest)"
  # Blocks in all three tiers, each where the kernel says it is.
  CHECKS_HMAT="--expect-tiers 3"
fi

CHECKS="--check-placement --expect-moves --expect-slow-tier --expect-kernel-migrations"
for pool in memfd range; do
  echo "== loadgen, $pool pool"
  # 300 steps at least, then on until blocks were both demoted and promoted (up to 180 s).
  cxltier-loadgen --socket "$SOCK" --pool $pool --blocks 96 --block-bytes $BLOCK --steps 300 \
    --until-moves 1 --seconds 180 --step-ms 2 --seed 7 $CHECKS ${CHECKS_HMAT:-} --json > /tmp/lg-$pool.json ||
    { cat /tmp/lg-$pool.json; fail "loadgen ($pool)"; }
  cat /tmp/lg-$pool.json
done

if [ "$SHAPE" = hmat ]; then
  # A recording on three tiers replays on three: the command cxltierctl
  # prints names every tier's budget, and the admits keep their tier.
  echo "== record a loadgen run on three tiers, replay it with the printed command"
  # Stopped by SIGINT below; --seconds bounds it should the signal come early.
  cxltierctl --socket "$SOCK" record --seconds 120 --json --out /tmp/rec.bin > /tmp/rec.json 2>&1 &
  REC=$!
  i=0  # the daemon says it is recording (up to 60 s)
  until grep -q "recording for" /tmp/cxltierd.log; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the recording did not start"; sleep 0.2
  done
  cxltier-loadgen --socket "$SOCK" --pool range --blocks 96 --block-bytes $BLOCK --steps 300 \
    --step-ms 2 --seed 11 > /tmp/lg-rec.txt 2>&1 || { cat /tmp/lg-rec.txt; fail "loadgen (recorded)"; }
  kill -INT $REC
  wait $REC || { cat /tmp/rec.json; fail "cxltierctl record"; }
  cat /tmp/rec.json
  replay=$(tr -d '\n' < /tmp/rec.json | grep -o '"replay": *"[^"]*"' | sed 's/^"replay": *"//; s/"$//')
  case "$replay" in
    "cxltier-sim "*" --tiers 6291456,6291456 "*) ;;
    *) fail "the replay command does not name both budgeted tiers: '$replay'" ;;
  esac
  # The printed command quotes the trace's path ('bin:/tmp/rec.bin'): eval it.
  eval "$replay --json" > /tmp/replay.json 2>&1 || { cat /tmp/replay.json; fail "the replay"; }
  # Three tiers, hits in tier 0 (which tiers below it serve depends on the run).
  hits=$(tr -d ' \n' < /tmp/replay.json | grep -o '"tier_hits":\[[1-9][0-9]*,[0-9][0-9]*,[0-9][0-9]*\]') ||
    { cat /tmp/replay.json; fail "the replay has no hits for three tiers"; }
  echo "replayed on three tiers: $hits; live $(tr -d ' \n' < /tmp/rec.json | grep -o '"hit_rate":[0-9.]*')"
fi

if [ "$SHAPE" = hmat ]; then
  # Copy mode on three tiers: a pool per tier (6 MiB, 6 MiB, the rest on
  # the CXL node), 240 blocks of 64 KiB so that tier 2 holds some, every
  # pool's pages where the kernel says, blocks live in all three.
  echo "== copy mode on three tiers: a pool per tier, pinned, moved by copy"
  cxltier-loadgen --socket "$SOCK" --pool copy --pin --readers 1 --blocks 240 --block-bytes $COPY_BLOCK \
    --steps 150 --until-moves 1 --seconds 240 --step-ms 2 --seed 7 \
    --check-placement --expect-moves --expect-tiers 3 --json > /tmp/lg-copy3.json ||
    { cat /tmp/lg-copy3.json; fail "loadgen (copy, three tiers)"; }
  cat /tmp/lg-copy3.json
  copy_checks /tmp/lg-copy3.json
  grep -q "tier 2 pool .*(memfd" /tmp/cxltierd.log || fail "no tier 2 pool in the daemon's log"
  grep -q '"pool_pages_off_node_after_pin": 0,' /tmp/lg-copy3.json || fail "pinning moved pool pages"
fi

if [ "$SHAPE" != hmat ]; then
  echo "== copy mode: a pool per tier, pinned with io_uring fixed buffers, moved by copy"
  cxltier-loadgen --socket "$SOCK" $COPY_RUN \
    --check-placement --expect-moves --expect-slow-tier --json > /tmp/lg-copy.json ||
    { cat /tmp/lg-copy.json; fail "loadgen (copy, pinned)"; }
  cat /tmp/lg-copy.json
  copy_checks /tmp/lg-copy.json
  grep -q '"pool_pages_off_node_after_pin": 0,' /tmp/lg-copy.json || fail "pinning moved pool pages"
  echo "== page mode, the pool pinned: the daemon says so and names copy mode"
  cxltier-loadgen --socket "$SOCK" --pool range --pin --blocks 96 --block-bytes $BLOCK --steps 60 \
    --step-ms 2 --seed 7 --expect-pinned --json > /tmp/lg-pinned.json ||
    { cat /tmp/lg-pinned.json; fail "loadgen (page mode, pinned)"; }
  grep -q "looks pinned.*Use copy mode" /tmp/cxltierd.log || fail "no pinned-pool warning in the log"
fi

echo "== SIGTERM, restart: ghosts come back"
kill -TERM $DAEMON
wait $DAEMON || fail "cxltierd did not exit 0 on SIGTERM"
grep -q "stopped" /tmp/cxltierd.log || fail "no clean stop in the log"
start_daemon
grep -q "loaded [1-9][0-9]* ghosts" /tmp/cxltierd.log || fail "no ghosts loaded after restart"
cxltier-loadgen --socket "$SOCK" --pool memfd --blocks 96 --block-bytes $BLOCK --steps 150 \
  --step-ms 2 --seed 7 --expect-restored --check-placement --json > /tmp/lg-restart.json ||
  { cat /tmp/lg-restart.json; fail "loadgen after restart"; }
grep '"restored"' /tmp/lg-restart.json
cxltierctl --socket "$SOCK" status
kill -TERM $DAEMON
wait $DAEMON || true

# Quotas with two real uids (tests/integration/quota_test.cpp; its own
# daemons), here where the two tiers are two nodes: the kernel's page
# placement is checked against the cap and the guarantee at every sample.
if [ "$SHAPE" = numa ] && [ -x /bin/quota_test ]; then
  echo "== quotas: two users contend for tier 0, checked against the kernel's placement"
  echo 0 > /proc/sys/kernel/numa_balancing
  CXLTIERD=/bin/cxltierd CXLTIERCTL=/bin/cxltierctl /bin/quota_test --gtest_brief=1 \
    > /tmp/quota_test.log 2>&1 ||
    { grep -v "info client [0-9]* (" /tmp/quota_test.log | tail -80; fail "quota_test"; }
  grep -q "the kernel's placement is checked" /tmp/quota_test.log ||
    fail "quota_test did not check the kernel's placement (no second node?)"
  grep -E "phase|figures|no guarantee" /tmp/quota_test.log
fi
echo "E2E PASS ($SHAPE)"
