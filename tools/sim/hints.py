#!/usr/bin/env python3
"""Measures what scheduler hints buy on the attention workload (docs/results.md,
"Scheduler hints"): at each budget, the best online policy without hints, the
default policy with hints, and MIN, and the share of the gap between the first
and MIN that hints close.

    tools/sim/hints.py --sim build/bin/cxltier-sim --seeds 6-10

The workload is `attention:seed=S,hints=1,hint_lead=L`; every policy runs with
and without its hints (`--hints both`), persist and reset. "Best without hints"
is the best of lru, lfu, ema:0.01, ema:0.15, arc, s3fifo, sieve, tinylfu and
the default, persist or reset, on the same trace with its hints ignored. Also
prints tick mode at 32 GiB and, with --leads, the default at 32 GiB for other
lead times. Prints markdown tables; means over the seeds.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
from statistics import mean

from rule import BUDGETS, OTHERS, TICK, seeds_of  # rule.py, beside this file


def run(sim, workload, budgets, policies, extra=()):
    cmd = [sim, "--workload", workload, "--budget", ",".join(budgets), "--policy",
           ",".join(policies), "--persist", "both", "--hints", "both", "--json", *extra]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def summarise(res, policy):
    """Per budget: best without hints (rate, name), `policy` with hints, MIN."""
    out = {}
    for b in sorted({r["budget_bytes"] for r in res}):
        at = [r for r in res if r["budget_bytes"] == b]
        without = [r for r in at if not r["hints"] and r["policy"] != "min"]
        best = max(without, key=lambda r: r["hit_rate"])
        hinted = next(r for r in at if r["policy"] == policy and r["hints"] and r["persist"])
        best_hinted = max((r for r in at if r["hints"] and r["policy"] != "min"),
                          key=lambda r: r["hit_rate"])
        mn = next(r for r in at if r["policy"] == "min")
        out[b] = {
            "best": 100 * best["hit_rate"],
            "best_name": f'{best["policy"]} {"persist" if best["persist"] else "reset"}',
            "hinted": 100 * hinted["hit_rate"],
            "best_hinted": 100 * best_hinted["hit_rate"],
            "best_hinted_name": best_hinted["policy"],
            "min": 100 * mn["hit_rate"],
            "prefetched": hinted["hint_prefetched"],
            "prefetch_hits": hinted["hint_prefetch_hits"],
            "displaced": hinted["hint_displaced"],
        }
    return out


def closed(s):
    gap = s["min"] - s["best"]
    return 100 * (s["hinted"] - s["best"]) / gap if gap > 0 else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", default="build/bin/cxltier-sim")
    ap.add_argument("--policy", default="default", help="the policy given the hints")
    ap.add_argument("--seeds", default="6-10")
    ap.add_argument("--lead", type=int, default=8, help="hint_lead of the workload")
    ap.add_argument("--leads", default="", help="other lead times to show at 32 GiB, e.g. 0,32")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    policies = OTHERS + [args.policy, "min"]
    seeds = seeds_of(args.seeds)

    jobs = []
    for s in seeds:
        w = f"attention:seed={s},hints=1,hint_lead={args.lead}"
        jobs.append(("demand", s, w, BUDGETS, []))
        jobs.append(("tick", s, w, ["32GiB"], TICK))
        for lead in filter(None, args.leads.split(",")):
            jobs.append((f"lead {lead}", s, f"attention:seed={s},hints=1,hint_lead={lead}",
                         ["32GiB"], []))
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: run(args.sim, j[2], j[3], policies, j[4]), jobs))
    table = {}  # (kind, budget) -> [summary per seed]
    for (kind, _, _, _, _), res in zip(jobs, results):
        for b, s in summarise(res, args.policy).items():
            table.setdefault((kind, b), []).append(s)

    print(f"seeds {args.seeds}, hint_lead={args.lead}, {args.policy} with hints; "
          "means over the seeds")
    print()
    print("| row | best without hints (which, most seeds) | with hints | MIN | gap closed "
          "(mean) | gap closed (worst seed) | best with hints |")
    print("|---|---|---|---|---|---|---|")
    for (kind, b), ss in table.items():
        names = [s["best_name"] for s in ss]
        name = max(set(names), key=names.count)
        shares = [closed(s) for s in ss]
        row = f"{kind}, {b / 2**30:.0f} GiB" if kind != "demand" else f"{b / 2**30:.0f} GiB"
        print(f'| {row} | {mean(s["best"] for s in ss):.2f} ({name}) | '
              f'{mean(s["hinted"] for s in ss):.2f} | {mean(s["min"] for s in ss):.2f} | '
              f'{mean(shares):.0f}% | {min(shares):.0f}% | '
              f'{mean(s["best_hinted"] for s in ss):.2f} |')
    print()
    print("| row | blocks placed by soon hints | of those, hit at their next touch | "
          "blocks of idle or done groups displaced first |")
    print("|---|---|---|---|")
    for (kind, b), ss in table.items():
        row = f"{kind}, {b / 2**30:.0f} GiB" if kind != "demand" else f"{b / 2**30:.0f} GiB"
        pf = mean(s["prefetched"] for s in ss)
        hits = mean(s["prefetch_hits"] for s in ss)
        print(f'| {row} | {pf:.0f} | {hits:.0f} ({100 * hits / pf if pf else 0:.0f}%) | '
              f'{mean(s["displaced"] for s in ss):.0f} |')
    return 0


if __name__ == "__main__":
    sys.exit(main())
