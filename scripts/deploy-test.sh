#!/usr/bin/env bash
# deploy/ checked for real (docs/deploy.md, docs/testing.md stage `deploy`):
# the alert rules (promtool check and unit tests), a real Prometheus (Debian's
# binary, its own config, storage and free port: independent of any
# prometheus service the package started) scraping a real cxltierd driven by
# cxltier-loadgen, the rules evaluated by it, the Grafana dashboard's queries
# run against it, and the Kubernetes manifests decoded by Debian's kubectl
# offline. Needs the build (build/bin). Exits non-zero on any failure.
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BIN="$BUILD_DIR/bin"
DEPLOY="$CXLTIER_ROOT/deploy"
CHECKS="$CXLTIER_ROOT/tests/deploy"
PY=/usr/bin/python3
VERSION=$(sed -nE 's/^project\(cxltier VERSION ([0-9.]+).*/\1/p' "$CXLTIER_ROOT/CMakeLists.txt")
# The name deploy/container/build.sh gives the image it builds.
IMAGE="localhost/cxltier:$VERSION"
WORK=$(mktemp -d /tmp/cxltier-deploy.XXXXXX)
PIDS=()
cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
fail() {
  log "deploy: $*"
  for f in "$WORK"/*.log; do [ -f "$f" ] && { echo "== $f (last lines)"; tail -n 20 "$f"; }; done
  exit 1
}

# --- The rules: syntax, unit tests, and that the tests can fail.
promtool check rules "$DEPLOY/prometheus/cxltier-rules.yml" || fail "promtool check rules"
(cd "$DEPLOY/prometheus" && promtool test rules cxltier-rules.test.yml) || fail "promtool test rules"
promtool check config "$DEPLOY/prometheus/prometheus.yml" || fail "promtool check config"
mkdir "$WORK/broken-rules"
sed 's/expr: up{job="cxltierd"} == 0/expr: up{job="cxltierd"} == 2/' \
  "$DEPLOY/prometheus/cxltier-rules.yml" >"$WORK/broken-rules/cxltier-rules.yml"
cp "$DEPLOY/prometheus/cxltier-rules.test.yml" "$WORK/broken-rules/"
if (cd "$WORK/broken-rules" && promtool test rules cxltier-rules.test.yml >/dev/null 2>&1); then
  fail "the rules' unit tests pass with CxltierdDown broken"
fi
log "deploy: rules checked, unit tests pass (and fail with an alert broken)"

# --- Kubernetes: Debian's kubectl (kubernetes-client 1.20), unpacked into the
# build cache, never installed (its /usr/bin/kubectl would conflict with
# other kubectl packages). It needs no cluster for what it does here.
KUBE_CACHE="$BUILD_DIR/qemu-cache/kubernetes-client"
KUBECTL="$KUBE_CACHE/usr/bin/kubectl"
if [ ! -x "$KUBECTL" ]; then
  mkdir -p "$KUBE_CACHE/deb"
  (cd "$KUBE_CACHE/deb" && { apt-get download kubernetes-client 2>/dev/null ||
    { apt-get update -qq && apt-get download kubernetes-client; }; }) || fail "apt-get download kubernetes-client"
  dpkg -x "$KUBE_CACHE"/deb/kubernetes-client_*.deb "$KUBE_CACHE" || fail "dpkg -x kubernetes-client"
fi
kubectl_() { env -u KUBECONFIG HOME="$WORK" "$KUBECTL" "$@"; }
check_kubernetes() {  # DIR: the manifests' folder
  kubectl_ kustomize "$1" >"$WORK/k8s.yaml" &&
    kubectl_ annotate --local -f "$WORK/k8s.yaml" cxltier.io/checked=yes -o json >"$WORK/k8s.json" &&
    kubectl_ set image --local -f "$1/daemonset.yaml" "*=cxltier/decode-check:0" -o json >"$WORK/k8s-typed.json" &&
    $PY "$CHECKS/check_kubernetes.py" "$WORK/k8s.json" "$WORK/k8s-typed.json" "$IMAGE" \
      "$WORK/k8s.toml"
}
check_kubernetes "$DEPLOY/kubernetes" || fail "kubernetes manifests"
# The ConfigMap's configuration (written out by the check), validated by the daemon itself.
"$BIN/cxltierd" --config "$WORK/k8s.toml" --print-config >/dev/null || fail "the ConfigMap's cxltierd.toml"
# A misspelled field must fail the check.
cp -r "$DEPLOY/kubernetes" "$WORK/broken-k8s"
sed -i 's/runAsNonRoot: true/runAsNonRot: true/' "$WORK/broken-k8s/daemonset.yaml"
if check_kubernetes "$WORK/broken-k8s" >/dev/null 2>&1; then
  fail "the kubernetes check passes a misspelled field"
fi
log "deploy: kubernetes manifests decoded by kubectl $("$KUBECTL" version --client --short 2>/dev/null | sed 's/.*: //'), image $IMAGE"

# --- A real cxltierd with a client moving blocks (both tiers on node 0, as
# scripts/demo.toml: every migration syscall runs on a one-node machine).
cat >"$WORK/cxltierd.toml" <<TOML
[daemon]
tick_ms = 50
[engine]
tier0_budget = "4MiB"
[tiers]
fast_nodes = [0]
slow_nodes = [0]
[metrics]
listen = "127.0.0.1:0"
per_uid = true  # the dashboard's per-user panels
TOML
SOCK="$WORK/cxltierd.sock"
"$BIN/cxltierd" --config "$WORK/cxltierd.toml" --socket "$SOCK" --state-dir "$WORK/state" \
  >"$WORK/cxltierd.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || fail "cxltierd did not listen within 60 s"
# Runs until the end of the test (killed by the trap).
"$BIN/cxltier-loadgen" --socket "$SOCK" --blocks 64 --block-bytes 256KiB --steps 1000000 \
  --step-ms 5 >"$WORK/loadgen.log" 2>&1 &
PIDS+=($!)
ENDPOINT=$("$BIN/cxltierctl" --socket "$SOCK" status --json |
  sed -nE 's/.*"metrics_endpoint": "([^"]+)".*/\1/p')
[ -n "$ENDPOINT" ] || fail "no metrics endpoint in cxltierctl status"

# --- Debian's prometheus, on a free loopback port of its own.
PORT=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$WORK/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $DEPLOY/prometheus/cxltier-rules.yml
scrape_configs:
  - job_name: cxltierd
    static_configs:
      - targets: ["$ENDPOINT"]
YML
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PORT" --log.level=warn >"$WORK/prometheus.log" 2>&1 &
PIDS+=($!)
$PY "$CHECKS/check_prometheus.py" "http://127.0.0.1:$PORT" "$ENDPOINT" \
  "$DEPLOY/prometheus/cxltier-rules.yml" "$DEPLOY/grafana/cxltier-dashboard.json" ||
  fail "prometheus scrape check"
# A dashboard naming a series the daemon does not export must fail the check.
sed 's/cxltier_pending_moves{/cxltier_no_such_series{/' "$DEPLOY/grafana/cxltier-dashboard.json" \
  >"$WORK/broken-dashboard.json"
if $PY "$CHECKS/check_prometheus.py" "http://127.0.0.1:$PORT" "$ENDPOINT" \
  "$DEPLOY/prometheus/cxltier-rules.yml" "$WORK/broken-dashboard.json" >"$WORK/broken.out" 2>&1; then
  fail "the dashboard check passes a series the daemon does not export"
fi
grep -q "cxltier_no_such_series is not a series" "$WORK/broken.out" || fail "$(cat "$WORK/broken.out")"
log "deploy: prometheus $(prometheus --version 2>&1 | sed -nE 's/^prometheus, version ([^ ]+).*/\1/p') scraped cxltierd; the dashboard's queries check"
