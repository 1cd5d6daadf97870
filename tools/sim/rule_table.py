#!/usr/bin/env python3
"""Prints rule.py's rows (its --json file) as docs/results.md's tables: one
line per row and budget, the attention seeds folded into their mean.

    tools/sim/rule.py --policy default --seeds 6-10 --json rows.json
    tools/sim/rule_table.py rows.json

Columns: the policy under test's hit rate and the best other's (means over
the seeds; the best other named as it was on most seeds), the gap on the
worst seed and its mean, and the seeds on which the row holds. Budgets are
named as rule.py was asked for them (32 GiB, or 5% of the distinct blocks).
--compare OTHER.json adds another run's hit rate and mean gap, row by row.
"""
import argparse
import collections
import json
import re


def label(row, budget):
    """'attention seed=6', '8GiB' -> 'attention defaults, 8 GiB' (and so on)."""
    name = re.sub(r"\s*seed=\d+", "", row).strip()
    size = re.sub(r"([0-9.]+)([KMGT]iB)", r"\1 \2", budget)
    if name == "attention":
        return f"attention defaults, {size}"
    if name == "attention tick":
        return f"tick mode, {size}"
    if name.startswith("attention "):
        return f"`{name[len('attention '):]}`, {size}"
    return f"{name}, {size}"


def fold(rows, names=None):
    """Rows of the policy under test (persist or reset as rule.py ran it),
    grouped by label in rule.py's order. Rows written before rule.py kept
    the budget asked for: named by `names` (rule.py's --shares list) when
    their row has as many budgets, else by their size in GiB."""
    sizes = collections.defaultdict(list)  # by row (with its seed): its budgets, ascending
    for r in rows:
        if r["budget_gib"] not in sizes[r["row"]]:
            sizes[r["row"]].append(r["budget_gib"])
    groups = collections.OrderedDict()
    for r in rows:
        budget = r.get("budget")
        if budget is None:
            mine = sizes[r["row"]]
            budget = (names[mine.index(r["budget_gib"])] if names and len(mine) == len(names)
                      else f'{r["budget_gib"]:g}GiB')
        groups.setdefault((label(r["row"], budget), r["persist"]), []).append(r)
    return groups


def mean(xs):
    return sum(xs) / len(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", help="rule.py --json output")
    ap.add_argument("--compare", help="another rule.py --json output, same rows")
    ap.add_argument("--shares", action="store_true",
                    help="name the budgets of rows from an older rule.py, which did not "
                         "record them, as rule.py --shares asks for them")
    args = ap.parse_args()
    names = ["1%", "5%", "10%", "25%", "50%"] if args.shares else None
    groups = fold(json.load(open(args.rows)), names)
    other = fold(json.load(open(args.compare)), names) if args.compare else {}
    head = "| row | policy | best other (which, most seeds) | gap, worst seed | gap, mean | rows within the margin |"
    rule = "|---|---|---|---|---|---|"
    if other:
        head += " other run | its gap, mean |"
        rule += "---|---|"
    print(head)
    print(rule)
    held = total = 0
    printed = []
    for key, rs in groups.items():
        name, _ = key
        which = collections.Counter(r["best"] for r in rs).most_common(1)[0][0]
        gaps = [r["gap"] for r in rs]
        ok = sum(1 for r in rs if r["ok"])
        held += ok
        total += len(rs)
        line = (f"| {name} | {mean([r['hit_rate'] for r in rs]):.2f} | "
                f"{mean([r['best_hit_rate'] for r in rs]):.2f} ({which}) | {min(gaps):+.2f} | "
                f"{mean(gaps) if len(rs) > 1 else float('nan'):+.2f} | {ok}/{len(rs)} |")
        line = line.replace("| +nan |", "|  |")
        if other:
            # The same rows in the same order (one rule.py job list), whatever
            # each run named its budgets.
            o = list(other.values())[len(printed)] if len(printed) < len(other) else None
            printed.append(key)
            line += (f" {mean([r['hit_rate'] for r in o]):.2f} | {mean([r['gap'] for r in o]):+.2f} |"
                     if o else "  |  |")
        print(line)
    print(f"\n{held} of {total} rows hold.")


if __name__ == "__main__":
    main()
