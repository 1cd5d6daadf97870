#!/usr/bin/python3
"""Checks a real Prometheus server scraping a real cxltierd (scripts/deploy-test.sh).

Usage: check_prometheus.py PROMETHEUS_URL DAEMON_METRICS_HOST:PORT RULES_FILE DASHBOARD_JSON

Waits (at most 90 s, polling; no fixed sleep) until Prometheus has scraped the
daemon (`up == 1` through the HTTP API), then checks that every series the
daemon's /metrics serves is in Prometheus, that blocks moved, that Prometheus
loaded and evaluated every rule of RULES_FILE without error, and that every
expression of the dashboard names only series the daemon exports and is
accepted by Prometheus. Prints one line per failed check; exits 1 on any.
"""
import json
import re
import sys
import time
import urllib.parse
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

PROM, DAEMON, RULES, DASHBOARD = sys.argv[1:5]
BOUND_S = 90
failed = []


def api(path, **params):
    url = PROM + "/api/v1/" + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=10) as r:
        body = json.load(r)
    if body.get("status") != "success":
        raise RuntimeError("%s: %s" % (path, body))
    return body["data"]


def query(expr):
    return api("query", query=expr)["result"]


def wait_for(what, check):
    """Polls check() every 0.2 s until it is true, at most BOUND_S seconds."""
    deadline = time.monotonic() + BOUND_S
    last = None
    while time.monotonic() < deadline:
        try:
            if check():
                return True
        except Exception as e:  # Prometheus still starting: connection refused
            last = e
        time.sleep(0.2)
    failed.append("%s: not within %d s%s" % (what, BOUND_S, " (%s)" % last if last else ""))
    return False


def scrape_daemon():
    """(names of the samples the daemon serves now, every name it may serve):
    the second adds the families without samples yet (failures by errno
    before the first one) under their sample names."""
    with urllib.request.urlopen("http://%s/metrics" % DAEMON, timeout=10) as r:
        families = list(text_string_to_metric_families(r.read().decode()))
    served, known = set(), set()
    for f in families:
        served.update(s.name for s in f.samples)
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(f.type, [""])
        known.update(f.name + x for x in suffixes)
    return served, served | known


def stored():
    return {r["metric"]["__name__"]
            for r in query('{job="cxltierd",__name__=~"cxltier_.+|process_.+"}')}


t0 = time.monotonic()
up = wait_for("up{job=\"cxltierd\"} == 1", lambda: any(
    r["value"][1] == "1" for r in query('up{job="cxltierd"}')))
if up:
    print("check_prometheus: scrape up after %.1f s" % (time.monotonic() - t0))
    served, names = scrape_daemon()
    # Every series one scrape of the daemon serves is in Prometheus.
    if wait_for("every served series stored", lambda: served <= stored()):
        print("check_prometheus: all %d metric names the daemon serves are in Prometheus" % len(served))
    else:
        failed.append("served but not in Prometheus: " + ", ".join(sorted(served - stored())))
    # Blocks moved, as Prometheus sees it.
    if wait_for("blocks moved (cxltier_promotions_total + cxltier_demotions_total > 0)", lambda: any(
            float(r["value"][1]) > 0 for r in query(
                'cxltier_promotions_total{job="cxltierd"} + cxltier_demotions_total{job="cxltierd"}'))):
        r = query('cxltier_promotions_total{job="cxltierd"} + cxltier_demotions_total{job="cxltierd"}')
        print("check_prometheus: %s moves so far" % r[0]["value"][1])

    # The rules: loaded, every one evaluated, none with an error.
    with open(RULES) as f:
        want_rules = len(re.findall(r"^\s*- alert: ", f.read(), re.M))

    def rules_ok():
        rules = [r for g in api("rules")["groups"] for r in g["rules"]]
        bad = [r["name"] + ": " + r.get("lastError", "") for r in rules if r.get("health") not in ("ok",)]
        return len(rules) == want_rules and not bad
    if wait_for("%d rules loaded and evaluated with health ok" % want_rules, rules_ok):
        print("check_prometheus: %d rules evaluated, health ok" % want_rules)
    else:
        for g in api("rules")["groups"]:
            for r in g["rules"]:
                if r.get("health") != "ok":
                    failed.append("rule %s: health %s %s" % (r["name"], r.get("health"), r.get("lastError", "")))

    # The dashboard: valid JSON, every panel's expressions name exported series
    # only, and Prometheus accepts them.
    with open(DASHBOARD) as f:
        dash = json.load(f)
    allowed = names | {"up"}
    exprs = 0
    for p in dash["panels"]:
        if p.get("type") == "row":
            continue
        targets = p.get("targets") or []
        if not targets:
            failed.append("panel %r has no query" % p.get("title"))
        for t in targets:
            expr = t["expr"]
            exprs += 1
            used = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{", expr))
            if not used:
                failed.append("panel %r: %r names no series" % (p["title"], expr))
            for n in sorted(used - allowed):
                failed.append("panel %r: %s is not a series cxltierd exports" % (p["title"], n))
            try:
                query(expr.replace("$instance", ".*"))
            except Exception as e:
                failed.append("panel %r: Prometheus refused %r: %s" % (p["title"], expr, e))
    print("check_prometheus: dashboard %r: %d panels, %d expressions checked" % (
        dash.get("title"), sum(p.get("type") != "row" for p in dash["panels"]), exprs))

for line in failed:
    print("check_prometheus: " + line)
print("check_prometheus: %d checks failed" % len(failed))
sys.exit(1 if failed else 0)
