#!/bin/sh
# Runs inside the systemd guest (tools/qemu/systemd-guest.sh) as a boot
# service: installs our .deb, then checks socket activation, the journal,
# migration under the unit's sandbox, the watchdog, that a stop saves
# block states that a start restores, and the Python module and its example;
# then, in the same boot, the container image under podman
# (container_guest_test.sh). Every line it prints starts with
# "systemd-guest:"; the last one says CXLTIER-SYSTEMD-EXIT and the result.
SOCK=/run/cxltierd/cxltierd.sock
T0=$(date +%s)
say() { echo "systemd-guest: [$(( $(date +%s) - T0 ))s] $*"; }
finish() {
  echo "systemd-guest: CXLTIER-SYSTEMD-EXIT $1"
  sync
  systemctl poweroff --force --force
}
fail() {
  say "FAIL: $*"
  journalctl -u cxltierd --no-pager -n 30 | sed 's/^/systemd-guest:   /'
  finish 1
  exit 1
}
# Every wait is for an event, bounded generously (TCG is slow, and slower still
# on a loaded host): it ends as soon as the event happens.
wait_active() {  # wait_active STATE: the service reaches it (up to 120 s)
  i=0
  while [ "$(systemctl is-active cxltierd.service)" != "$1" ]; do
    i=$((i + 1)); [ $i -lt 600 ] || return 1; sleep 0.2
  done
}
wait_journal() {  # wait_journal GREP-ARGS...: the unit's journal has a match (up to 60 s)
  i=0
  until journalctl -u cxltierd --no-pager -o cat | grep -q "$@"; do
    i=$((i + 1)); [ $i -lt 300 ] || return 1; sleep 0.2
  done
}
loadgen() { cxltier-loadgen --socket $SOCK --blocks 48 --block-bytes 1MiB --step-ms 2 "$@"; }

say "systemd $(systemctl --version | head -1 | cut -d' ' -f2) is PID 1; nodes: $(ls -d /sys/devices/system/node/node* | wc -l)"
dpkg -i /root/cxltier.deb >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; fail "dpkg -i"; }
getent passwd cxltier >/dev/null || fail "the package did not create user cxltier"
getent group cxltier-admin >/dev/null || fail "the package did not create group cxltier-admin"
say "installed $(dpkg-query -W -f='${Package} ${Version}' cxltier)"

# A small tier 0 so that blocks must move; a short watchdog to keep the test quick.
cat > /etc/cxltier/cxltierd.toml <<CONF
[daemon]
tick_ms = 50
[engine]
tier0_budget = "24MiB"
hysteresis_ticks = 1
[migration]
rate_mib_s = 4096
CONF
mkdir -p /etc/systemd/system/cxltierd.service.d
printf '[Service]\nWatchdogSec=4s\n' > /etc/systemd/system/cxltierd.service.d/test.conf
systemctl daemon-reload
systemctl enable --now cxltierd.socket >/dev/null 2>&1 || fail "enable cxltierd.socket"
[ "$(systemctl is-active cxltierd.service)" = inactive ] || fail "the daemon ran before any client"
[ "$(stat -c '%a %G' $SOCK)" = "660 cxltier" ] || fail "socket mode/group: $(stat -c '%a %G' $SOCK)"
say "socket listening, daemon not started"

cxltierctl --socket $SOCK status >/dev/null || fail "first connection"
wait_active active || fail "the first connection did not start the daemon"
say "first connection started the daemon: $(systemctl is-active cxltierd.service)"
wait_journal "topology" || fail "no topology line in the journal"
say "journal: $(journalctl -u cxltierd --no-pager -o cat | grep -m1 topology)"
systemctl show -p StatusText --value cxltierd.service | grep -q clients || fail "no STATUS from sd_notify"

# 300 steps at least, then on until blocks came back as well as went (a
# fixed-length run under TCG once only demoted); up to 300 s.
out=$(loadgen --steps 300 --until-moves 1 --seconds 300 --expect-moves --expect-slow-tier --check-placement --expect-kernel-migrations --json 2>&1) ||
  { echo "$out" | sed 's/^/systemd-guest:   /'; fail "loadgen under the sandbox"; }
say "loadgen under the sandbox: $(echo "$out" | tr -d ' \n' | grep -o '"promotions":[0-9]*,\|"demotions":[0-9]*,\|"corrupt_blocks":[0-9]*,\|"placement_mismatches":[0-9]*,' | tr -d '\n')"

# The watchdog: a stopped daemon stops pinging and is restarted.
PID=$(systemctl show -p MainPID --value cxltierd.service)
kill -STOP "$PID"
i=0  # WatchdogSec=4s; up to 120 s
while [ "$(systemctl show -p MainPID --value cxltierd.service)" = "$PID" ] ||
  [ "$(systemctl is-active cxltierd.service)" != active ]; do
  i=$((i + 1)); [ $i -lt 600 ] || fail "the watchdog did not restart a SIGSTOPped daemon"; sleep 0.2
done
i=0  # systemd's "Watchdog timeout" line, up to 60 s
until journalctl -u cxltierd --no-pager | grep -qi watchdog; do
  i=$((i + 1)); [ $i -lt 300 ] || fail "no watchdog line in the journal"; sleep 0.2
done
say "watchdog: SIGSTOPped pid $PID was killed and replaced by $(systemctl show -p MainPID --value cxltierd.service)"

# Stop saves block states; start restores them to the next client.
loadgen --steps 200 --seed 7 >/dev/null || fail "loadgen before stop"
systemctl stop cxltierd.service || fail "stop"
[ -s /var/lib/cxltierd/ghosts.bin ] || fail "no checkpoint after stop"
say "stop saved $(stat -c %s /var/lib/cxltierd/ghosts.bin) bytes of block states"
systemctl start cxltierd.service || fail "start"
wait_active active || fail "start"
wait_journal "loaded [1-9][0-9]* ghosts" || fail "start loaded no ghosts"
out=$(loadgen --steps 100 --seed 7 --expect-restored --json 2>&1) ||
  { echo "$out" | sed 's/^/systemd-guest:   /'; fail "ghosts not restored"; }
say "start restored: $(journalctl -u cxltierd --no-pager -o cat | grep -o 'loaded [0-9]* ghosts' | tail -1); $(echo "$out" | tr -d ' \n' | grep -o '"restored":[0-9]*')"
# The Python module from the package, with Debian's python3 and numpy: it
# imports, and the example engine decodes against the unit's daemon with its
# logits bit-identical to an all-DRAM run (the smallest sensible run: TCG is
# slow). Its blocks are 16 KiB and the loadgen's were 1 MiB: the first hello
# sets the size, and a restarted daemon has had none (a switch right after a
# loadgen could meet its last moves still in flight).
# NPY_DISABLE_CPU_FEATURES=AVX2: numpy 1.24's AVX2 kernels crash under this
# emulator (QEMU 7.2's TCG): np.maximum over 512 float32s is a SIGSEGV in the
# guest, fine with AVX2 off; on a real CPU numpy needs no such setting.
export NPY_DISABLE_CPU_FEATURES=AVX2
python3 -c 'import cxltier' || fail "python3 -c 'import cxltier'"
systemctl restart cxltierd.service || fail "restart for the example"
wait_active active || fail "restart for the example"
out=$(python3 /usr/share/doc/cxltier/examples/kv_engine.py --socket $SOCK --sequences 2 \
  --shared-prefix 16 --prompt 16 --turns 2 --steps-per-turn 4 --capacity 16 --json 2>&1) ||
  { echo "$out" | sed 's/^/systemd-guest:   /'; fail "the example engine (kv_engine.py)"; }
echo "$out" | tail -1 | grep -q '"logits_bit_identical": true' ||
  { echo "$out" | sed 's/^/systemd-guest:   /'; fail "the example's logits are not bit-identical"; }
say "python: import cxltier from $(python3 -c 'import cxltier, os; print(os.path.dirname(cxltier.__file__))'); kv_engine.py: $(echo "$out" | tail -1 | tr -d ' ' | grep -o '"tokens_decoded":[0-9]*\|"blocks_stored":[0-9]*\|"logits_bit_identical":[a-z]*' | paste -sd,)"
say "systemd checks passed"
# The container image under podman, in this same boot (a second boot would
# cost as much again under TCG): tests/e2e/container_guest_test.sh.
. /root/container_guest_test.sh
say "all checks passed"
finish 0
