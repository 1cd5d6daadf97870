#!/usr/bin/python3
"""Scrapes cxltierd's /metrics and validates it with a real parser
(python3-prometheus-client). Usage: check_metrics.py HOST:PORT [--per-uid]
--per-uid: the daemon runs with [metrics] per_uid = true, so the cxltier_user_*
series must be there; without it they must not be.
Prints one line per failed check and exits 1 on any."""
import sys
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

base = "http://" + sys.argv[1]
per_uid = "--per-uid" in sys.argv[2:]
failed = []
with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
    ctype = r.headers.get("Content-Type", "")
    text = r.read().decode()
if not ctype.startswith("text/plain; version=0.0.4"):
    failed.append("content type " + ctype)
families = {f.name: f for f in text_string_to_metric_families(text)}
want = {
    "cxltier_tier_blocks": "gauge", "cxltier_tier_bytes": "gauge",
    "cxltier_tier0_budget_bytes": "gauge", "cxltier_tier_budget_bytes": "gauge",
    "cxltier_touches": "counter",
    "cxltier_hits": "counter", "cxltier_hit_ratio": "gauge",
    "cxltier_promotions": "counter", "cxltier_demotions": "counter",
    "cxltier_promoted_bytes": "counter", "cxltier_demoted_bytes": "counter",
    "cxltier_migration_failed_moves": "counter", "cxltier_migration_failures": "counter",
    "cxltier_pages_wrong_node": "counter", "cxltier_tick_duration_seconds": "histogram",
    "cxltier_clients": "gauge", "cxltier_ghosts": "gauge",
    "cxltier_observations": "counter", "process_resident_memory_bytes": "gauge",
    "cxltier_hint_requests": "counter", "cxltier_hints": "counter",
    "cxltier_hint_prefetched_blocks": "counter", "cxltier_hint_displaced_blocks": "counter",
    "cxltier_tick_interval_seconds": "gauge", "cxltier_tick_overruns": "counter",
    "cxltier_lease_oldest_wait_seconds": "gauge", "cxltier_lease_timeout_seconds": "gauge",
    "cxltier_lease_timeouts": "counter", "cxltier_migration_enabled": "gauge",
    "cxltier_quota_evictions": "counter",
    "cxltier_released_held_blocks": "gauge", "cxltier_released_moved": "counter",
    # The daemon under test runs the default policy, shards.
    "cxltier_policy_leader_info": "gauge", "cxltier_policy_switches": "counter",
}
user_families = {
    "cxltier_user_tier_bytes": "gauge", "cxltier_user_tier_cap_bytes": "gauge",
    "cxltier_user_guarantee_bytes": "gauge", "cxltier_user_quota_evictions": "counter",
}
if per_uid:
    want.update(user_families)
else:
    for name in user_families:
        if name in families:
            failed.append("%s is served without [metrics] per_uid" % name)
for name, kind in want.items():
    f = families.get(name)
    if f is None:
        failed.append("missing family " + name)
    elif f.type != kind:
        failed.append("%s is a %s, not a %s" % (name, f.type, kind))
def value(name, **labels):
    for f in families.values():
        for s in f.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None
if (value("cxltier_touches_total") or 0) <= 0:
    failed.append("no touches counted")
if (value("cxltier_tick_duration_seconds_count") or 0) <= 0:
    failed.append("no ticks in the histogram")
if value("cxltier_tick_duration_seconds_bucket", le="+Inf") != value("cxltier_tick_duration_seconds_count"):
    failed.append("+Inf bucket differs from the count")
if (value("cxltier_tier_blocks", tier="0") or 0) + (value("cxltier_tier_blocks", tier="1") or 0) <= 0:
    failed.append("no blocks in any tier")
# Tier 0's budget is in both forms; the last tier (which holds the rest) has none.
if value("cxltier_tier_budget_bytes", tier="0") != value("cxltier_tier0_budget_bytes"):
    failed.append("cxltier_tier_budget_bytes{tier=0} differs from cxltier_tier0_budget_bytes")
last = max(int(s.labels["tier"]) for s in families["cxltier_tier_bytes"].samples)
if value("cxltier_tier_budget_bytes", tier=str(last)) is not None:
    failed.append("the last tier (%d) has a budget sample" % last)
# Each user's bytes per tier add up to the tier's (every block has a user).
for tier in ("0", "1") if per_uid else ():
    users = sum(s.value for s in families["cxltier_user_tier_bytes"].samples
                if s.labels.get("tier") == tier) if "cxltier_user_tier_bytes" in families else -1
    if users != value("cxltier_tier_bytes", tier=tier):
        failed.append("tier %s: users' bytes %s, the tier's %s" % (tier, users, value("cxltier_tier_bytes", tier=tier)))
# The default policy follows one of its candidates: one sample, value 1.
leaders = families["cxltier_policy_leader_info"].samples if "cxltier_policy_leader_info" in families else []
candidates = ("arc", "lfu", "ema:0.05", "ema:0.01", "lru", "s3fifo", "sieve", "tinylfu")
if len(leaders) != 1 or leaders[0].value != 1 or leaders[0].labels.get("leader") not in candidates:
    failed.append("cxltier_policy_leader_info: %s" % [(x.labels, x.value) for x in leaders])
for path, method, code in (("/nothing", "GET", 404), ("/metrics", "POST", 405)):
    try:
        urllib.request.urlopen(urllib.request.Request(base + path, method=method, data=b"" if method == "POST" else None), timeout=10)
        failed.append("%s %s answered 200" % (method, path))
    except urllib.error.HTTPError as e:
        if e.code != code:
            failed.append("%s %s answered %d, not %d" % (method, path, e.code, code))
for line in failed:
    print("check_metrics: " + line)
print("check_metrics: %d families parsed, %d checks failed" % (len(families), len(failed)))
sys.exit(1 if failed else 0)
