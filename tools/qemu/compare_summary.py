#!/usr/bin/env python3
"""The comparison's results, every stage at once (tools/qemu/compare_all.sh).

  compare_summary.py --out DIR --bin BUILD/bin

For each stage directory DIR/STAGE with results (DIR/STAGE/results.jsonl, one
arm per line as compare.sh appends them), builds that stage's report and
results.json with compare_report.py for the arms it has so far (a stage still
running, or one whose arms broke an invariant, is reported all the same: its
records say what they broke), then writes DIR/results.json (every record of
every stage, the sweeps' with workload "attention-seed2") and DIR/summary.md
(one table per kernel and workload: each arm's mean over its runs).
"""
import argparse
import glob
import json
import os
import subprocess
import sys

# The order of the tables' rows; any other arm (the sweep's kernel+...) after.
ORDER = ["none", "kernel", "kernel-tuned", "damon", "cxltier-touches", "cxltier-scores",
         "cxltier-hints"]
MIB = 1 << 20


def stage_arms(stage_dir):
    arms = []
    with open(os.path.join(stage_dir, "results.jsonl")) as f:
        for line in f:
            if line.strip():
                arm = json.loads(line)["result"]["arm"]
                if arm not in arms:
                    arms.append(arm)
    return sorted(arms, key=lambda a: (ORDER.index(a) if a in ORDER else len(ORDER), arms.index(a)))


def mean(xs):
    return sum(xs) / len(xs)


def table(recs):
    rows = ["| arm | runs | re-touched bytes on node 0: mean (min to max) | admitted bytes on node 0 | "
            "all MiB migrated | migrated per extra node-0 byte (vs the best kernel arm) | "
            "CPU s: replay / kswapd / cxltierd / kdamond | pool on node 0 at most, MiB (budget) | "
            "invariants broken |",
            "|" + "---|" * 9]
    by_arm = {}
    for r in recs:
        by_arm.setdefault(r["arm"], []).append(r)
    for arm in sorted(by_arm, key=lambda a: (ORDER.index(a) if a in ORDER else len(ORDER), a)):
        rs = by_arm[arm]
        sh = [r["retouched_node0_share"] for r in rs]
        if arm == "min":
            rows.append(f"| min (cxltier-sim, offline) | - | {100 * sh[0]:.1f}% | - | "
                        f"{(rs[0]['promoted_bytes'] + rs[0]['demoted_bytes']) / MIB:.1f} | - | - | - | - |")
            continue
        moved = [r["moved_bytes"] for r in rs if r.get("moved_bytes") is not None]
        extra = [r["moved_per_extra_node0_byte"] for r in rs if r.get("moved_per_extra_node0_byte") is not None]
        c = [r["cpu"] for r in rs]
        broken = sum(len(r.get("violations", [])) for r in rs)
        rows.append(
            f"| {arm} | {len(rs)} | **{100 * mean(sh):.1f}%** ({100 * min(sh):.1f} to {100 * max(sh):.1f}) | "
            f"{100 * mean([r['admitted_node0_share'] for r in rs]):.1f}% | "
            f"{mean(moved) / MIB:.1f} | " + (f"{mean(extra):.1f}" if extra else "-") + " | "
            f"{mean([x['replay_user_s'] + x['replay_system_s'] for x in c]):.0f} / "
            f"{mean([x['kswapd_s'] for x in c]):.1f} / {mean([x['daemon_s'] for x in c]):.0f} / "
            f"{mean([x.get('kdamond_s', 0.0) for x in c]):.0f} | "
            f"{max(r['node0_pool_bytes_max'] for r in rs) / MIB:.2f} ({rs[0]['tier0_budget_bytes'] / MIB:.2f}) | "
            f"{broken or '-'} |")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--bin", required=True)
    a = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    records = []
    for jsonl in sorted(glob.glob(os.path.join(a.out, "*", "results.jsonl"))):
        stage_dir = os.path.dirname(jsonl)
        stage = os.path.basename(stage_dir)
        if os.path.getsize(jsonl) == 0:
            continue
        params = {}
        if os.path.exists(os.path.join(stage_dir, "params")):
            with open(os.path.join(stage_dir, "params")) as f:
                params = dict(kv.split("=", 1) for kv in f.read().split() if "=" in kv)
        workload = "attention"
        if "mooncake" in stage:
            workload = "mooncake"
        elif "llama" in stage:
            workload = "llama"
        r = subprocess.run([sys.executable, os.path.join(here, "compare_report.py"), "--out", stage_dir,
                            "--bin", a.bin, "--arms", " ".join(stage_arms(stage_dir)),
                            "--access", params.get("access", "cpu"), "--workload", workload],
                           capture_output=True, text=True)
        if not os.path.exists(os.path.join(stage_dir, "results.json")):
            print(f"compare_summary.py: {stage}: no report: {r.stderr.strip()}", file=sys.stderr)
            continue
        if r.returncode != 0:
            print(f"compare_summary.py: {stage}: {r.stderr.strip()}", file=sys.stderr)
        with open(os.path.join(stage_dir, "results.json")) as f:
            for rec in json.load(f):
                if stage.startswith("sweep-"):
                    rec["workload"] += "-seed2"
                rec["stage"] = stage
                records.append(rec)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")
    md = []
    groups = {}
    for rec in records:
        groups.setdefault((rec["stage"]), []).append(rec)
    for stage in sorted(groups):
        recs = groups[stage]
        kernel = next((r["kernel"] for r in recs if r["kernel"] != "-"), "?")
        md.append(f"#### {stage}: kernel {kernel}, workload {recs[0]['workload']}")
        md.append("")
        md.extend(table(recs))
        md.append("")
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"compare_summary.py: {len(records)} records in {a.out}/results.json; tables in {a.out}/summary.md")


if __name__ == "__main__":
    main()
