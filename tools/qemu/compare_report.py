#!/usr/bin/env python3
"""The tables and plots of docs/comparison.md, from tools/qemu/compare.sh's output.

  compare_report.py --out DIR --bin BUILD/bin --arms "none kernel ..." [--access cpu] [--workload NAME]

Reads DIR/trace.json, DIR/results.jsonl (one arm per line) and
DIR/budgets.jsonl (the tier-0 budget each shape and access kind gave
cxltierd), runs cxltier-sim for MIN (and the daemon's policies) on DIR/trace.bin
at that capacity, and writes DIR/report.md, DIR/results.json (one record per
kernel, shape, access kind, arm, workload and repeat) and
DIR/comparison-SHAPE.png. Fails, naming what is missing, unless every arm asked
for ran (at least its first repeat) and reported its figures, and the
comparison's invariants held: every arm started with the same free memory on
node 0 (within 2%), every kernel arm with a lower tier to demote to demoted,
and no cxltierd arm held more of the pool on node 0 than its budget.
"""
import argparse
import json
import os
import platform
import subprocess
import sys

ACCESS = ["cpu"]
NEEDED = ["fast_share", "fast_share_retouch", "touched_bytes", "touches", "seconds", "pool_fast_bytes_steady",
          "admitted_fast_share", "series"]
MIB = 1 << 20
# cxltier-sim's default model (llama3-70b) stores 320 KiB a token: its budget
# is in bytes of blocks of the trace's tokens.
SIM_BYTES_PER_TOKEN = 320 << 10
# Every arm starts within 1% of the free memory it asks for (the balloon's
# slack, cxltier-replay's Balloon::Inflate), so within 2% of each other.
START_SLACK = 0.02


def fail(msg):
    print(f"compare_report.py: {msg}", file=sys.stderr)
    sys.exit(1)


def load_lines(path):
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    fail(f"{path}:{n}: not JSON ({e})")
    return out


def simulate(binary, trace, blocks, sim_block, policies):
    # --hints off: the arms compared with these rows send no hints.
    cmd = [binary, "--trace", f"bin:{trace}", "--policy", ",".join(policies), "--persist", "persist",
           "--budget", str(blocks * sim_block), "--hints", "off", "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return {row["policy"]: row for row in json.loads(r.stdout)}


def pool_node0_max(r):
    # The most of the pool on node 0 at any point of an arm's series.
    return max(p["pool_fast_bytes"] for p in r["series"])


def fmt_ratio(x):
    return "-" if x is None else f"{x:.1f}"


def pct(x):
    return f"{100 * x:.1f}%"


def mib(b):
    return f"{b / MIB:.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--arms", required=True)
    ap.add_argument("--access", default="cpu")
    ap.add_argument("--workload", default="attention")
    a = ap.parse_args()
    wanted = a.arms.split()
    global ACCESS
    ACCESS = a.access.split()
    with open(os.path.join(a.out, "trace.json")) as f:
        trace = json.load(f)
    results = {}
    lower_tier = {}
    kernel = {}
    setting = {}
    commit = {}
    # compare.sh --repeat N: each record carries its repeat (0 to N - 1).
    for line in load_lines(os.path.join(a.out, "results.jsonl")):
        r = line["result"]
        results[(line["shape"], r["access"], r["arm"], line.get("repeat", 0))] = r
        lower_tier[line["shape"]] = line.get("lower_tier")
        kernel[line["shape"]] = line.get("kernel", "?")
        key = (line["shape"], r["access"], r["arm"], line.get("repeat", 0))
        setting[key] = line.get("kernel_setting", "")
        commit[key] = line.get("commit", "")
    shapes = sorted({key[0] for key in results}) or fail("no arm reported anything")
    if len(set(kernel.values())) > 1:
        fail(f"results of more than one kernel in {a.out}: {sorted(set(kernel.values()))}")
    budgets = {(b["shape"], b["access"]): b["tier0_budget"]
               for b in load_lines(os.path.join(a.out, "budgets.jsonl"))}
    # DAMON's own migrations (its schemes' sz_applied), for the kernels that
    # have its migrate_hot and migrate_cold (6.11 and later).
    damon = {(d["shape"], d["access"], d.get("repeat", 0)): d
             for d in load_lines(os.path.join(a.out, "damon.jsonl"))}

    def arms(shape, access):
        return wanted

    def damon_moves(shape, access, rp):
        # DAMON's migrations over the measured window (the replay reads its
        # schemes' stats at the warm-up's end and at the end), else over the
        # whole arm (the guest's COMPARE-DAMON line, older runs).
        schemes = results[(shape, access, "damon", rp)]["kernel"].get("damon_schemes")
        if schemes:
            return (sum(x["applied_bytes"] for x in schemes if x["action"] == "migrate_hot"),
                    sum(x["applied_bytes"] for x in schemes if x["action"] == "migrate_cold"))
        d = damon.get((shape, access, rp))
        return (d["promoted_bytes"], d["demoted_bytes"]) if d else (None, None)

    def runs(shape, access, arm):
        # The repeats of an arm that ran (--repeat N: 0 to N - 1; the full
        # run's later repeats may cover only the headline arms).
        return sorted(k[3] for k in results if k[:3] == (shape, access, arm))

    # The comparison's invariants: an arm that breaks one is still reported
    # (its records carry the breach), and the report then exits 1.
    violations = {}

    for shape in shapes:
        for access in ACCESS:
            if (shape, access) not in budgets:
                fail(f"no tier-0 budget for {shape}/{access}: the kernel arm did not finish")
            for arm in arms(shape, access):
                if 0 not in runs(shape, access, arm):
                    fail(f"arm {arm} ({shape}, {access} reads) reported nothing")
            for arm, rp in [(arm, rp) for arm in arms(shape, access) for rp in runs(shape, access, arm)]:
                r = results[(shape, access, arm, rp)]

                def violate(msg, key=(shape, access, arm, rp)):
                    violations.setdefault(key, []).append(msg + (f" (run {rp + 1})" if rp else ""))
                missing = [k for k in NEEDED if k not in r]
                if missing:
                    fail(f"arm {arm} ({shape}, {access}) lacks {', '.join(missing)}")
                if r["touches"] == 0 or not r["series"]:
                    fail(f"arm {arm} ({shape}, {access}) touched nothing")
                if arm.startswith("cxltier") and "daemon" not in r:
                    fail(f"arm {arm} ({shape}, {access}) has no daemon counters")
                # Blocks admitted before they are written land in tier 0
                # while its budget has room (the replay admits, then writes).
                if arm.startswith("cxltier") and not r["admitted_fast_share"] > 0:
                    violate(f"arm {arm} ({shape}, {access}): no admission landed on node 0, "
                         f"though tier 0 had a budget of {budgets[(shape, access)]} bytes")
                # Tier 0's budget bounds what the pool holds on node 0, from
                # admission on: at every point of the series, within two
                # blocks (a promotion may land just before its paired
                # demotion leaves; the sample is not atomic with the mover).
                if arm.startswith("cxltier"):
                    top = pool_node0_max(r)
                    bound = budgets[(shape, access)] + 2 * r["block_bytes"]
                    if top > bound:
                        violate(f"arm {arm} ({shape}, {access}): the pool held {top} bytes on node 0, "
                             f"over tier 0's budget of {budgets[(shape, access)]} bytes plus two "
                             f"blocks")
                if r.get("balloon_off_node_bytes", 0) > 0:
                    violate(f"arm {arm} ({shape}, {access}): {r['balloon_off_node_bytes']} bytes of the "
                            f"balloon left node 0 during the run (more room for the pool there)")
                if r.get("stopped_early"):
                    violate(f"arm {arm} ({shape}, {access}) stopped before the end of the trace")
                # The same landing room: every arm started with the same
                # memory of node 0 free above its high watermark.
                want = r["fast_free_target"]
                got = r["fast_above_high_at_start"]
                if want // r["block_bytes"] * r["block_bytes"] != budgets[(shape, access)]:
                    violate(f"arm {arm} ({shape}, {access}): asked for {want} bytes free on node 0, "
                         f"not tier 0's budget of {budgets[(shape, access)]}")
                if abs(got - want) > START_SLACK * want:
                    violate(f"arm {arm} ({shape}, {access}): node 0 had {got} bytes free above its "
                         f"high watermark at the start, not {want} (within 2%)")
                # The kernel at work: with a lower tier, every kernel arm
                # demoted (kswapd or direct reclaim) and promoted candidates.
                if arm.startswith("kernel") and lower_tier.get(shape):
                    k = r["kernel"]
                    if k["pgdemote_kswapd"] + k["pgdemote_direct"] == 0:
                        violate(f"arm {arm} ({shape}, {access}): the kernel demoted nothing "
                             f"(pgdemote_kswapd and pgdemote_direct 0)")
                if arm == "damon":
                    hot, cold = damon_moves(shape, access, rp)
                    if cold is None:
                        violate(f"arm damon ({shape}, {access}): no DAMON scheme stats")
                    elif cold == 0:
                        violate(f"arm damon ({shape}, {access}): migrate_cold moved nothing")

    trace_bin = os.path.join(a.out, "trace.bin")
    sim_bin = os.path.join(a.bin, "cxltier-sim")
    sim_block = SIM_BYTES_PER_TOKEN * trace["block_tokens"]
    md = []
    records = []
    md.append(f"Trace: {trace['touches']:,} touches of {trace['keys']:,} blocks "
              f"({trace['admissions']:,} admissions, {trace['readmissions']:,} of them "
              f"re-admissions), pool {trace['pool_blocks']:,} blocks.")
    md.append(f"Host: {platform.node()}, {platform.machine()}, Linux {platform.release()}, "
              f"{os.cpu_count()} CPUs.")
    md.append("")
    for shape in shapes:
        any_r = results[(shape, ACCESS[0], wanted[0], 0)]
        block = any_r["block_bytes"]
        md.append(f"### {shape} guest (kernel {kernel[shape]}): pool {mib(any_r['pool_bytes'])} MiB of "
                  f"{block // 1024} KiB blocks; the balloon leaves node 0 "
                  f"{mib(any_r['fast_free_target'])} MiB free above its high watermark "
                  f"({mib(any_r['fast_high_watermark'])} MiB)")
        md.append("")
        if lower_tier.get(shape) is False:
            md.append("Node 1 is in node 0's memory tier here (a CPU-less DRAM node, in 6.1): "
                      "the kernel has no tier to demote to, and NUMA balancing's tiering mode "
                      "leaves pages on top-tier nodes alone, so its arms run as first touch.")
            md.append("")
        for access in ACCESS:
            budget = budgets[(shape, access)]
            blocks = budget // block
            # cxltier-sim's rows: MIN, LRU and the default policy the
            # cxltier-scores arm ran (or the daemon's default).
            policy = (results[(shape, access, "cxltier-scores", 0)]["daemon"].get("policy")
                      if "cxltier-scores" in wanted else None) or "default"
            sim_policies = list(dict.fromkeys(["min", "lru", policy]))
            sim = simulate(sim_bin, trace_bin, blocks, sim_block, sim_policies)
            md.append(f"**{access} reads**; the same landing room: every arm starts with "
                      f"{mib(budget)} MiB ({blocks} blocks) of node 0 free above its high "
                      f"watermark, cxltierd's tier-0 budget (the kernel may also use the "
                      f"watermarks' room before kswapd demotes)")
            md.append("")
            def moves(arm, rp):
                # (promoted, demoted) by the arm's mover, and every byte
                # migrated in the arm: the mover's and the kernel's own
                # (reclaim demotes in every arm).
                r = results[(shape, access, arm, rp)]
                k = r["kernel"]
                if arm.startswith("cxltier"):
                    prom, dem = r["daemon"]["promoted_bytes"], r["daemon"]["demoted_bytes"]
                elif arm == "damon":
                    prom, dem = damon_moves(shape, access, rp)
                    if prom is None:
                        return 0, 0, None
                else:
                    return k["promoted_bytes"], k["demoted_bytes"], k["promoted_bytes"] + k["demoted_bytes"]
                return prom, dem, prom + dem + k["promoted_bytes"] + k["demoted_bytes"]

            # The cost of a node-0 hit: bytes migrated per byte of re-touched
            # reads that an arm found on node 0 beyond the best kernel arm's.
            kernel_arms = [arm for arm in arms(shape, access)
                           if arm.startswith("kernel") and not violations.get((shape, access, arm, 0))]
            best = max(kernel_arms, default=None,
                       key=lambda arm: results[(shape, access, arm, 0)]["fast_share_retouch"])

            def per_extra_hit(arm, rp):
                # Each arm measures its own window (the warm-up is in
                # seconds), so the best kernel arm's figures are scaled to
                # this arm's re-touched bytes.
                r = results[(shape, access, arm, rp)]
                if best is None or arm == best or "retouched_bytes" not in r:
                    return None
                b = results[(shape, access, best, 0)]
                extra = (r["fast_share_retouch"] - b["fast_share_retouch"]) * r["retouched_bytes"]
                if extra <= 0 or not b["retouched_bytes"] or moves(arm, rp)[2] is None:
                    return None
                scale = r["retouched_bytes"] / b["retouched_bytes"]
                return (moves(arm, rp)[2] - moves(best, 0)[2] * scale) / extra

            md.append(f"| arm | re-touched bytes on node 0 | re-touched, runs: mean "
                      f"(min to max) | all touched bytes on node 0 | "
                      "admitted bytes written on node 0 | "
                      "promoted / demoted MiB (the arm's mover) | all MiB migrated | "
                      f"migrated per extra node-0 byte vs {best or '-'} | hint faults | "
                      "promotion candidates / successes | replay CPU user / sys s | "
                      "kswapd s | cxltierd s | kdamond s | client calls s | "
                      "read ms a step (emulated) | pool on node 0, 2nd half / max, MiB | run s |")
            md.append("|" + "---|" * 18)
            for arm, rp in [(arm, rp) for arm in arms(shape, access) for rp in runs(shape, access, arm)]:
                r = results[(shape, access, arm, rp)]
                k, c = r["kernel"], r["cpu"]
                prom, dem, moved = moves(arm, rp)
                name = f"{arm} ({r['daemon'].get('policy', '?')})" if arm.startswith("cxltier") else arm
                records.append({
                    "kernel": kernel[shape], "shape": shape, "access": access, "arm": arm,
                    "workload": a.workload, "repeat": rp, "seconds": r["seconds"],
                    "kernel_setting": setting[(shape, access, arm, rp)],
                    "commit": commit[(shape, access, arm, rp)],
                    "measured_seconds": r.get("measured_s", r["seconds"]),
                    "node0_free_bytes_start": r["fast_above_high_at_start"],
                    "tier0_budget_bytes": budget,
                    "retouched_node0_share": r["fast_share_retouch"],
                    "touched_node0_share": r["fast_share"],
                    "admitted_node0_share": r["admitted_fast_share"],
                    "node0_pool_bytes_max": pool_node0_max(r),
                    "promoted_bytes": prom, "demoted_bytes": dem, "moved_bytes": moved,
                    "retouched_bytes": r.get("retouched_bytes"),
                    "retouched_node0_bytes": r.get("retouched_fast_bytes"),
                    "best_kernel_arm": best,
                    "moved_per_extra_node0_byte": per_extra_hit(arm, rp),
                    "pgdemote": k["pgdemote_kswapd"] + k["pgdemote_direct"],
                    "pgpromote_candidate": k["pgpromote_candidate"],
                    "pgpromote_success": k["pgpromote_success"],
                    # kswapd had given node 0 up by the end of the warm-up
                    # and the replay revived it (cxltier-replay, "kswapd");
                    # null in runs from before the replay checked.
                    "kswapd_revived": r.get("kswapd", {}).get("revived"),
                    "kswapd_gave_up_at_end": r.get("kswapd", {}).get("gave_up_at_end"),
                    # Every CPU second of the run: the replay (the workload
                    # and, in its system time, the kernel's hint faults and
                    # migrations), cxltierd, kswapd and kdamond.
                    "cpu_seconds": c["replay_user_s"] + c["replay_system_s"] + c["daemon_s"] +
                    c["kswapd_s"] + c.get("kdamond_s", 0.0),
                    "cpu": c,
                    "read_us_per_step_emulated": r.get("read_us_per_step"),
                    "violations": violations.get((shape, access, arm, rp), []),
                })
                if rp != 0:
                    continue  # the table's row is the first run's; the spread is all runs'
                shares = [results[(shape, access, arm, q)]["fast_share_retouch"]
                          for q in runs(shape, access, arm)]
                md.append(f"| {name} | **{pct(r['fast_share_retouch'])}** | "
                          f"{len(shares)}: {pct(sum(shares) / len(shares))} ({pct(min(shares))} to "
                          f"{pct(max(shares))}) | "
                          f"{pct(r['fast_share'])} | {pct(r['admitted_fast_share'])} | "
                          f"{mib(prom)} / {mib(dem)} | {mib(moved) if moved is not None else '-'} | "
                          f"{fmt_ratio(records[-1]['moved_per_extra_node0_byte'])} | "
                          f"{k['numa_hint_faults']:,} | "
                          f"{k['pgpromote_candidate']:,} / {k['pgpromote_success']:,} | "
                          f"{c['replay_user_s']:.1f} / "
                          f"{c['replay_system_s']:.1f} | {c['kswapd_s']:.1f} | "
                          f"{c['daemon_s']:.1f} | {c.get('kdamond_s', 0.0):.1f} | "
                          f"{c['client_calls_s']:.2f} | {r.get('read_us_per_step', 0) / 1000:.1f} | "
                          f"{mib(r['pool_fast_bytes_steady'])} / "
                          f"{mib(records[-1]['node0_pool_bytes_max'])} | {r['seconds']:.0f} |")
            for p in sim_policies:
                row = sim[p]
                # The simulator counts an admission's first touch in no tier.
                retouch = row["hits"] / max(1, row["touches"] - row["admits"])
                if p == "min":
                    records.append({
                        "kernel": "-", "shape": shape, "access": access, "arm": "min",
                        "workload": a.workload, "repeat": 0, "seconds": 0,
                        "simulated": True, "node0_free_bytes_start": budget,
                        "tier0_budget_bytes": budget, "retouched_node0_share": retouch,
                        "promoted_bytes": row["promoted_bytes"] * block // sim_block,
                        "demoted_bytes": row["demoted_bytes"] * block // sim_block,
                        "cpu_seconds": 0,
                    })
                sp = row['promoted_bytes'] * block // sim_block
                sd = row['demoted_bytes'] * block // sim_block
                md.append(f"| cxltier-sim {p} (demand) | {pct(retouch)} | - | - | - | "
                          f"{mib(sp)} / {mib(sd)} | {mib(sp + sd)} | " + "- | " * 9 +
                          f"{mib(blocks * block)} | - |")
            md.append("")
        md.append(f"![fast-tier share over time, {shape} guest](img/comparison-{shape}.png)")
        md.append("")
        plot(a.out, shape, results, arms, budgets)
    broken = [m for msgs in violations.values() for m in msgs]
    if broken:
        md.append("**Invariants broken** (these arms' records carry them):")
        md.append("")
        md.extend(f"- {m}" for m in broken)
        md.append("")
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")
    report = "\n".join(md) + "\n"
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(report)
    print(report)
    if broken:
        fail(f"{len(broken)} invariant(s) broken: " + "; ".join(broken))


def plot(out, shape, results, arms, budgets):
    # Per access kind, two panels: the re-touched share on node 0, and the
    # pool's bytes on node 0 (with tier 0's budget), over the run.
    data = os.path.join(out, f"share-{shape}.dat")
    index = {}
    with open(data, "w") as f:
        for access in ACCESS:
            for arm in arms(shape, access):
                index[(access, arm)] = len(index)
                f.write(f"# {access} {arm}: step, re-touched % on node 0, pool MiB on node 0\n")
                for p in results[(shape, access, arm, 0)]["series"]:
                    f.write(f"{p['step']} {100 * p['share']:.2f} {p['pool_fast_bytes'] / MIB:.3f}\n")
                f.write("\n\n")
    png = os.path.join(out, f"comparison-{shape}.png")
    lines = []
    for access in ACCESS:
        for col, title, ylabel, yrange in [
                (2, "re-touched bytes found on node 0", "% of re-touched bytes", "set yrange [0:100]\n"),
                (3, "pool bytes on node 0 (dashed: the tier-0 budget)", "MiB", "set yrange [0:*]\n")]:
            series = ", ".join(
                f"'{data}' index {index[(access, arm)]} using 1:{col} with linespoints title '{arm}'"
                for arm in arms(shape, access))
            if col == 3:
                series += f", {budgets[(shape, access)] / MIB:.3f} with lines dashtype 2 lc 'black' title 'budget'"
            lines.append(f"set title '{shape} guest, {access} reads: {title}'\nset ylabel '{ylabel}'\n"
                         f"{yrange}plot {series}\n")
    script = ("set terminal pngcairo size 1400,500 noenhanced font 'sans,10'\n"
              f"set output '{png}'\nset multiplot layout 1,{2 * len(ACCESS)}\n"
              "set xlabel 'workload step'\nset key bottom right\n" + "".join(lines) + "unset multiplot\n")
    r = subprocess.run(["gnuplot"], input=script, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"gnuplot failed: {r.stderr.strip()}")


if __name__ == "__main__":
    main()
