#!/usr/bin/python3
"""Checks deploy/kubernetes offline (scripts/deploy-test.sh), from kubectl's output:

Usage: check_kubernetes.py RENDERED.json TYPED_DAEMONSET.json IMAGE TOML_OUT

RENDERED.json: `kubectl kustomize` of the folder, passed through
`kubectl annotate --local -o json` (every field as written). TYPED: the
DaemonSet decoded into Kubernetes' own Go types by `kubectl set image --local
-o json`: a field of the wrong type fails that decode, and a misspelled or
misplaced field is dropped by it, which the comparison here reports. Then the
properties docs/deploy.md promises: no host IPC or PID, non-root, every
capability dropped but SYS_NICE, resources on every container, the liveness
probe on the metrics port the ConfigMap's daemon listens on, host paths for
the socket and state directories the ConfigMap names, the image IMAGE.
Writes the ConfigMap's cxltierd.toml to TOML_OUT (for cxltierd --print-config).
Prints one line per failed check and exits 1 on any."""
import json
import re
import sys

rendered, typed_path, image, toml_out = sys.argv[1:5]
failed = []


def objects(path):
    """The objects of kubectl's -o json: one, a List, or (1.20 with several
    objects) one after another."""
    with open(path) as f:
        text = f.read()
    out, i, dec = [], 0, json.JSONDecoder()
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return out
        doc, i = dec.raw_decode(text, i)
        out += doc["items"] if doc.get("kind") == "List" else [doc]


items = objects(rendered)
typed = objects(typed_path)[0]

by_kind = {i["kind"]: i for i in items}
for kind in ("Namespace", "ConfigMap", "DaemonSet"):
    if kind not in by_kind:
        failed.append("no %s in the manifests" % kind)
if failed:
    print("\n".join("check_kubernetes: " + l for l in failed))
    sys.exit(1)
ds, cm = by_kind["DaemonSet"], by_kind["ConfigMap"]


def leaves(x, path=()):
    """(path, value) of every leaf; a path is a tuple of keys and indexes."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, path + (i,))
    else:
        yield path, x


MISSING = object()


def at(x, path):
    for k in path:
        if isinstance(k, int):
            if not isinstance(x, list) or k >= len(x):
                return MISSING
        elif not isinstance(x, dict) or k not in x:
            return MISSING
        x = x[k]
    return x


def show(path):
    return "".join("[%d]" % k if isinstance(k, int) else "." + k for k in path)


# Every field as written survives the typed decode (the annotation the
# rendering added and the image the decode set aside). Go's omitempty drops
# zero values (false, 0): those need not come back.
for path, v in leaves(ds):
    if path[:2] == ("metadata", "annotations") or path[-1] == "image":
        continue
    got = at(typed, path)
    if got is MISSING:
        if v not in (False, 0, "", None):
            failed.append("DaemonSet field %s is not a Kubernetes field (dropped by the typed decode)" % show(path))
    elif got != v:
        failed.append("DaemonSet field %s: written %r, decoded %r" % (show(path), v, got))

spec = ds["spec"]["template"]["spec"]
toml = cm["data"]["cxltierd.toml"]
with open(toml_out, "w") as f:
    f.write(toml)


def toml_str(section, key):
    m = re.search(r"^\[%s\]$(.*?)(?=^\[|\Z)" % re.escape(section), toml, re.M | re.S)
    if not m:
        return None
    k = re.search(r'^%s\s*=\s*"([^"]*)"' % re.escape(key), m.group(1), re.M)
    return k.group(1) if k else None


for key in ("hostIPC", "hostPID", "hostNetwork"):
    if spec.get(key):
        failed.append("spec.%s is true" % key)
psc = spec.get("securityContext", {})
seccomp = psc.get("seccompProfile", {})
if seccomp.get("type") not in ("Localhost", "RuntimeDefault"):
    failed.append("the pod's seccomp profile is %r, not Localhost or RuntimeDefault" % seccomp)
if not psc.get("runAsNonRoot") or not psc.get("runAsUser"):
    failed.append("the pod does not run as a non-root user (runAsNonRoot, runAsUser)")
containers = spec.get("containers", [])
daemon = [c for c in containers if c["name"] == "cxltierd"]
if len(daemon) != 1:
    failed.append("no container named cxltierd")
    daemon = [{}]
d = daemon[0]
for c in containers + spec.get("initContainers", []):
    sc = c.get("securityContext", {})
    caps = sc.get("capabilities", {})
    if caps.get("drop") != ["ALL"]:
        failed.append("container %s does not drop ALL capabilities" % c["name"])
    allowed = {"cxltierd": ["SYS_NICE"], "host-dirs": ["CHOWN"]}.get(c["name"], [])
    if caps.get("add", []) != allowed:
        failed.append("container %s adds %s, not %s" % (c["name"], caps.get("add"), allowed))
    if sc.get("privileged"):
        failed.append("container %s is privileged" % c["name"])
    if not sc.get("readOnlyRootFilesystem"):
        failed.append("container %s has a writable root filesystem" % c["name"])
    r = c.get("resources", {})
    for kind in ("requests", "limits"):
        if not {"cpu", "memory"} <= set(r.get(kind, {})):
            failed.append("container %s has no cpu and memory %s" % (c["name"], kind))
    if c.get("image") != image:
        failed.append("container %s runs %s, not %s" % (c["name"], c.get("image"), image))
if d.get("securityContext", {}).get("runAsNonRoot") is not True:
    failed.append("container cxltierd does not say runAsNonRoot")

# The liveness probe asks the metrics endpoint the ConfigMap's daemon serves.
listen = toml_str("metrics", "listen") or ""
port = int(listen.rsplit(":", 1)[1]) if ":" in listen else None
if listen.startswith("127.") or listen.startswith("[::1]"):
    failed.append("metrics listen %s is loopback: the kubelet's probe cannot reach it" % listen)
ports = {p.get("name"): p["containerPort"] for p in d.get("ports", [])}
probe = d.get("readinessProbe", {}).get("httpGet", {})
probe_port = ports.get(probe.get("port"), probe.get("port"))
if probe.get("path") != "/metrics" or probe_port != port:
    failed.append("readiness probe %s is not GET /metrics on the metrics port %s" % (probe, port))
# Liveness asks the daemon over its Unix socket (the ConfigMap's), not the
# metrics port, which anyone on the pod network can hold busy.
live = d.get("livenessProbe", {}).get("exec", {}).get("command", [])
sock = toml_str("daemon", "socket")
if live[:1] != ["/usr/bin/cxltierctl"] or live[-1:] != ["status"] or sock not in live:
    failed.append("liveness probe %s is not cxltierctl status over the socket %s" % (live, sock))
# cxltierctl gives up on its own before the probe does (its default is 30 s).
probe_timeout = d.get("livenessProbe", {}).get("timeoutSeconds", 1)
ctl_timeout = float(live[live.index("--timeout") + 1]) if "--timeout" in live[:-1] else 30.0
if not 0 < ctl_timeout < probe_timeout:
    failed.append("liveness probe's cxltierctl --timeout %g is not within its timeoutSeconds %d: "
                  "a wedged daemon leaves probe processes hanging" % (ctl_timeout, probe_timeout))

# Host paths for the socket's folder and the state folder, mounted where the
# ConfigMap puts them.
vols = {v["name"]: v for v in spec.get("volumes", [])}
mounts = {m["mountPath"]: m["name"] for m in d.get("volumeMounts", [])}
for what, path in (("socket", (toml_str("daemon", "socket") or "").rsplit("/", 1)[0]),
                   ("state_dir", toml_str("daemon", "state_dir"))):
    vol = vols.get(mounts.get(path))
    if not path or not vol or "hostPath" not in vol:
        failed.append("daemon.%s (%s) is not on a hostPath volume" % (what, path))
cfg = vols.get(mounts.get("/etc/cxltier"), {})
if cfg.get("configMap", {}).get("name") != cm["metadata"]["name"]:
    failed.append("/etc/cxltier is not the ConfigMap %s" % cm["metadata"]["name"])
if d.get("command", [])[-1:] != ["/etc/cxltier/cxltierd.toml"]:
    failed.append("cxltierd does not read /etc/cxltier/cxltierd.toml")

for line in failed:
    print("check_kubernetes: " + line)
print("check_kubernetes: %d objects, %d checks failed" % (len(items), len(failed)))
sys.exit(1 if failed else 0)
