# Sourced by systemd_guest_test.sh inside the systemd guest
# (tools/qemu/systemd-guest.sh), after its own checks, in the same boot (say,
# fail and T0 are its): cxltierd's container image (deploy/container) under
# podman, as on a real host: systemd PID 1, cgroup v2, rootful podman 4.3
# with crun and the overlay storage driver, no network, no registry.
#   - the image builds with deploy/container/build.sh from the guest's own
#     debootstrapped root (its tar, /var/tmp/cxltier-base.tar, taken on the
#     build host before anything else went in) and the .deb;
#   - the daemon's container starts as uid 990 with CAP_SYS_NICE only, and
#     its socket, on a host-path volume, answers;
#   - a loadgen in a second container (another uid, no capabilities) connects
#     over the shared socket and its blocks move, placement checked against
#     the kernel;
#   - `podman stop` (SIGTERM) ends it cleanly with the block states saved in
#     the state volume, and a restarted container gives them back.
# docs/deploy.md ("How the image is tested") has the figures of a run.
IMG=localhost/cxltier:test
HOSTDIR=/srv/cxltier
CSOCK=$HOSTDIR/run/cxltierd.sock
SECCOMP=$HOSTDIR/seccomp.json
# The daemon's container: non-root, one capability, read-only root, the two
# volumes and a configuration file from the host.
daemon_run() {
  podman run -d --name cxltierd --network none --read-only \
    --user 990:990 --cap-drop=all --cap-add=sys_nice \
    --security-opt no-new-privileges --security-opt seccomp=$SECCOMP \
    -v $HOSTDIR/run:/run/cxltierd -v $HOSTDIR/state:/var/lib/cxltierd \
    -v $HOSTDIR/cxltierd.toml:/etc/cxltier/cxltierd.toml:ro "$IMG"
}
# A client's container: another uid in the socket's group, no capabilities.
client_run() {
  podman run --rm --network none --read-only --user 1000:1000 --group-add 990 --cap-drop=all \
    --security-opt no-new-privileges --security-opt seccomp=$SECCOMP \
    -v $HOSTDIR/run:/run/cxltierd --entrypoint cxltier-loadgen "$IMG" \
    --socket /run/cxltierd/cxltierd.sock --blocks 48 --block-bytes 1MiB --step-ms 2 "$@"
}
clog() { podman logs cxltierd 2>&1 | sed 's/^/systemd-guest:   /'; }
wait_socket() {  # the daemon's socket answers (up to 120 s by the clock: each podman call takes a second or so under TCG)
  end=$(( $(date +%s) + 120 ))
  until [ -S $CSOCK ] && cxltierctl --socket $CSOCK status >/dev/null 2>&1; do
    [ "$(date +%s)" -lt $end ] || { clog; return 1; }
    [ "$(podman inspect -f '{{.State.Running}}' cxltierd 2>/dev/null)" = true ] || { clog; return 1; }
    sleep 0.2
  done
}

systemctl disable --now cxltierd.socket cxltierd.service >/dev/null 2>&1 || fail "stop the unit's daemon"
t=$(date +%s)
# Rootful podman, no D-Bus in this root: cgroupfs (cgroup v2 all the same),
# events and logs to files, netavark (a CNI file in containers-common would
# otherwise pick CNI, which is not installed). The overlay storage driver:
# the guest's /init loads the kernel's overlay module (podman 4.3 takes
# overlay on this tmpfs root as on a real host's ext4 or xfs); the test fails
# if podman falls back to vfs, which copies every layer.
mkdir -p /etc/containers
printf '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n[containers]\nlog_driver = "k8s-file"\n[network]\nnetwork_backend = "netavark"\n' > /etc/containers/containers.conf
printf '[storage]\ndriver = "overlay"\nrunroot = "/run/containers/storage"\ngraphroot = "/var/lib/containers/storage"\n' > /etc/containers/storage.conf
engine=$(podman info -f 'podman {{.Version.Version}}: {{.Host.OCIRuntime.Name}} {{.Host.NetworkBackend}} {{.Store.GraphDriverName}} on {{index .Store.GraphStatus "Backing Filesystem"}}, cgroup {{.Host.CgroupsVersion}}') ||
  fail "podman info"
case "$engine" in *": crun netavark overlay on "*) ;; *) fail "podman is not crun, netavark and overlay: $engine" ;; esac
say "$engine"
tag=$(bash /root/container/build.sh --deb /root/cxltier.deb --base-tar /var/tmp/cxltier-base.tar --tag $IMG 2>/tmp/build.log) ||
  { sed 's/^/systemd-guest:   /' /tmp/build.log; fail "build.sh (the image)"; }
[ "$tag" = $IMG ] || fail "build.sh printed '$tag', not $IMG"
rm -f /var/tmp/cxltier-base.tar  # memory: the root is a tmpfs
say "image: $(grep -o 'imported (.*' /tmp/build.log), $(grep -o 'built in .*' /tmp/build.log)"

mkdir -p $HOSTDIR/run $HOSTDIR/state
python3 /root/container/seccomp.py > $SECCOMP || fail "seccomp.py"
chown 990:990 $HOSTDIR/run $HOSTDIR/state
chmod 0755 $HOSTDIR/run
chmod 0700 $HOSTDIR/state
cat > $HOSTDIR/cxltierd.toml <<CONF
[daemon]
tick_ms = 50
[engine]
tier0_budget = "24MiB"
hysteresis_ticks = 1
[migration]
rate_mib_s = 4096
CONF
daemon_run >/dev/null || fail "podman run of the daemon's image"
wait_socket || fail "the container's daemon did not answer on $CSOCK"
cpid=$(podman inspect -f '{{.State.Pid}}' cxltierd)
# CAP_SYS_NICE is bit 23: 0x800000, effective and nothing else.
caps=$(sed -n 's/^CapEff:\t//p' /proc/$cpid/status)
[ "$caps" = 0000000000800000 ] || fail "the daemon's effective capabilities are $caps, not CAP_SYS_NICE alone"
[ "$(stat -c %u /proc/$cpid)" = 990 ] || fail "the daemon runs as uid $(stat -c %u /proc/$cpid), not 990"
podman logs cxltierd 2>&1 | grep -q "no CAP_SYS_NICE" && { clog; fail "the daemon says it has no CAP_SYS_NICE"; }
say "container up in $(( $(date +%s) - t ))s: uid 990, CapEff $caps, socket $(stat -c '%a %u:%g' $CSOCK); $(podman logs cxltierd 2>&1 | grep -o 'topology.*' | head -1)"

out=$(client_run --steps 300 --until-moves 1 --seconds 300 --expect-moves --expect-slow-tier \
  --check-placement --expect-kernel-migrations --json 2>&1) ||
  { echo "$out" | sed 's/^/systemd-guest:   /'; clog; fail "loadgen in a second container"; }
say "loadgen container: $(echo "$out" | tr -d ' \n' | grep -o '"promotions":[0-9]*,\|"demotions":[0-9]*,\|"corrupt_blocks":[0-9]*,\|"placement_mismatches":[0-9]*,' | tr -d '\n')"

podman stop -t 60 cxltierd >/dev/null || fail "podman stop"
rc=$(podman inspect -f '{{.State.ExitCode}}' cxltierd)
[ "$rc" = 0 ] || { clog; fail "the daemon exited $rc on podman stop (not a clean SIGTERM stop)"; }
podman logs cxltierd 2>&1 | grep -q "signal 15: stopping" || { clog; fail "no SIGTERM stop in the daemon's log"; }
[ -s $HOSTDIR/state/ghosts.bin ] || fail "no checkpoint in the state volume after podman stop"
[ ! -e $CSOCK ] || fail "the socket is left behind after podman stop"
say "podman stop: exit 0, $(stat -c %s $HOSTDIR/state/ghosts.bin) bytes of block states in the state volume"

podman start cxltierd >/dev/null || fail "podman start"
wait_socket || fail "the restarted container did not answer"
podman logs cxltierd 2>&1 | grep -q "loaded [1-9][0-9]* ghosts" || { clog; fail "the restarted daemon loaded no block states"; }
out=$(client_run --steps 100 --expect-restored --json 2>&1) ||
  { echo "$out" | sed 's/^/systemd-guest:   /'; clog; fail "block states not restored to a client container"; }
say "restart restored: $(podman logs cxltierd 2>&1 | grep -o 'loaded [0-9]* ghosts' | tail -1); $(echo "$out" | tr -d ' \n' | grep -o '"restored":[0-9]*')"
podman stop -t 60 cxltierd >/dev/null && podman rm cxltierd >/dev/null || fail "the last podman stop"
say "container checks passed in $(( $(date +%s) - t ))s"
