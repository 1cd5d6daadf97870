#!/usr/bin/env python3
"""Checks the placement rule of docs/results.md ("the default is never worse"):
on every workload row and budget, a policy's hit rate is above the best other
online policy's, or within a margin of it.

    tools/sim/rule.py --sim build/bin/cxltier-sim --policy default --seeds 1-5

Rows: the attention workload (per seed) at 8, 16, 32, 64 and 128 GiB; every
parameter row of docs/results.md at 32 GiB; tick mode at 32 GiB; the Mooncake
sample at 8 GiB to 2 TiB (one trace, no seeds), the excerpt of the Mooncake arXiv
trace (tests/data/README.md) and each --trace at the same.
With --shares the attention, Mooncake and --trace rows use 1, 5, 10, 25 and
50% of each trace's distinct blocks instead. "Other online policies" are
lru, lfu, ema:0.01, ema:0.15, arc, s3fifo, sieve and tinylfu, each with persist
and reset. The policy under test is checked in both modes; --persist picks one.
Also checks that for every policy persist >= reset - margin on every row.
Prints one line per row and a closing summary; exits 1 if a row fails.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

OTHERS = ["lru", "lfu", "ema:0.01", "ema:0.15", "arc", "s3fifo", "sieve", "tinylfu"]
BUDGETS = ["8GiB", "16GiB", "32GiB", "64GiB", "128GiB"]
MOONCAKE_BUDGETS = ["8GiB", "32GiB", "128GiB", "512GiB", "2TiB"]
SHARES = ["1%", "5%", "10%", "25%", "50%"]  # --shares: of each trace's distinct blocks
PARAMS = ["pause_steps=100", "pause_steps=5000", "sessions=8", "sessions=64", "drift=0",
          "drift=0.02", "heavy_alpha=0.8", "heavy_alpha=3", "release_on_pause=0.5", "turns=1",
          "topk=256"]
TICK = ["--mode", "tick", "--tick-steps", "8", "--migrate-per-tick", "2GiB", "--hysteresis", "2"]


def seeds_of(text):
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def run(sim, source, budgets, policies, extra=()):
    cmd = [sim, *source, "--budget", ",".join(budgets), "--policy", ",".join(policies),
           "--persist", "both", "--json", *extra]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", default="build/bin/cxltier-sim")
    ap.add_argument("--policy", default="default", help="the policy under test")
    ap.add_argument("--seeds", default="1-5", help="attention seeds, e.g. 1-5 or 6-10")
    ap.add_argument("--persist", default="persist", choices=["persist", "reset", "both"],
                    help="the mode of the policy under test")
    ap.add_argument("--margin", type=float, default=0.5, help="points")
    ap.add_argument("--mooncake", default=os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "data", "mooncake_synthetic_trace.jsonl"))
    ap.add_argument("--excerpt", default=os.path.join(
        os.path.dirname(__file__), "..", "..", "tests", "data", "mooncake_arxiv_excerpt.jsonl"),
        help="the second public trace (tests/data/README.md); '' leaves it out")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="also write every row to this file")
    ap.add_argument("--raw", help="also write every simulation's result to this file")
    ap.add_argument("--shares", action="store_true",
                    help="budgets as shares of each trace's distinct blocks (%s) instead of "
                         "sizes, for the attention and trace rows" % ",".join(SHARES).replace(
                             "%", "%%"))
    ap.add_argument("--trace", action="append", default=[],
                    help="another trace to check (a cxltier-sim --trace spec); repeatable")
    args = ap.parse_args()
    budgets = SHARES if args.shares else BUDGETS
    trace_budgets = SHARES if args.shares else MOONCAKE_BUDGETS

    jobs = []  # (row name, source, budgets, extra)
    for seed in seeds_of(args.seeds):
        jobs.append((f"attention seed={seed}", ["--workload", f"attention:seed={seed}"], budgets,
                     []))
        for p in PARAMS:
            jobs.append((f"attention {p} seed={seed}",
                         ["--workload", f"attention:{p},seed={seed}"], ["32GiB"], []))
        jobs.append((f"attention tick seed={seed}", ["--workload", f"attention:seed={seed}"],
                     ["32GiB"], TICK))
    jobs.append(("mooncake", ["--trace", "mooncake:" + args.mooncake], trace_budgets, []))
    if args.excerpt:
        jobs.append(("mooncake arxiv excerpt", ["--trace", "mooncake:" + args.excerpt],
                     trace_budgets, []))
    for spec in args.trace:
        jobs.append((os.path.basename(spec), ["--trace", spec], trace_budgets, []))

    policies = OTHERS + [args.policy]
    modes = {"persist": [True], "reset": [False], "both": [True, False]}[args.persist]
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda j: run(args.sim, j[1], j[2], policies, j[3]), jobs))

    if args.raw:
        with open(args.raw, "w") as f:
            json.dump([{"row": j[0], "results": r} for j, r in zip(jobs, results)], f)
    rows, failed, gaps = [], 0, []
    for (name, _, budgets, _), res in zip(jobs, results):
        sizes = sorted({r["budget_bytes"] for r in res})
        assert len(sizes) == len(budgets), (name, sizes, budgets)  # both ascending
        for asked, b in zip(budgets, sizes):
            at = [r for r in res if r["budget_bytes"] == b]
            others = [r for r in at if r["policy"] in OTHERS]
            best = max(others, key=lambda r: r["hit_rate"])
            for persist in modes:
                mine = next(r for r in at if r["policy"] not in OTHERS and r["persist"] == persist)
                gap = 100 * (mine["hit_rate"] - best["hit_rate"])
                ok = gap >= -args.margin
                failed += not ok
                gaps.append(gap)
                row = {"row": name, "budget": asked, "budget_gib": b / 2**30, "persist": persist,
                       "best": f'{best["policy"]} {"persist" if best["persist"] else "reset"}',
                       "best_hit_rate": 100 * best["hit_rate"],
                       "hit_rate": 100 * mine["hit_rate"], "gap": gap, "ok": ok}
                rows.append(row)
                print(f'{"ok  " if ok else "FAIL"} {name:<38} {row["budget_gib"]:>7.0f} GiB '
                      f'{"persist" if persist else "reset  "} {row["hit_rate"]:6.2f}% '
                      f'best {row["best"]:<18} {row["best_hit_rate"]:6.2f}%  {gap:+6.2f}')
    print(f"rule: {len(rows) - failed} of {len(rows)} rows within {args.margin} points of the "
          f"best other policy (gap min {min(gaps):+.2f}, mean {sum(gaps) / len(gaps):+.2f})")
    # The second rule: for every policy, persist >= reset - margin on every row.
    effects = {}
    for (name, _, _, _), res in zip(jobs, results):
        for r in res:
            if not r["persist"]:
                continue
            twin = next(x for x in res if x["policy"] == r["policy"] and not x["persist"]
                        and x["budget_bytes"] == r["budget_bytes"])
            e = 100 * (r["hit_rate"] - twin["hit_rate"])
            where = f'{name} {r["budget_bytes"] / 2**30:.0f} GiB'
            if r["policy"] not in effects or e < effects[r["policy"]][0]:
                effects[r["policy"]] = (e, where)
    for policy, (e, where) in effects.items():
        ok = e >= -args.margin
        failed += not ok
        print(f'{"ok  " if ok else "FAIL"} persist - reset of {policy:<10} at least {e:+6.2f} '
              f'(at {where})')
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
