#!/usr/bin/env python3
"""The landing room (docs/policies.md) against none: the default policy in tick
mode with landing 0 and 3 (the daemon's default), on traces it was not chosen
on: the attention workload's seeds 6 to 10 (the comparison's parameters; seed
2 chose it), the Mooncake sample and cxltier-llama's recording, at five
budgets (shares of each trace's distinct blocks), with a migration budget of
10 blocks a tick and with none. Prints docs/results.md's table.

    python3 tools/sim/landing.py [--sim build/bin/cxltier-sim]
"""
import argparse
import json
import os
import subprocess

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
# tools/qemu/compare.sh's full attention workload.
ATTENTION = ("steps=2100,sessions=8,batch=4,context_min=4096,context_max=8192,topk=16,"
             "turn_tokens=64,pause_steps=60,user_tokens=128,turns=4,shared_prefix_blocks=16,"
             "release_on_pause=0.3,hints=1")
SHARES = "1%,5%,10%,25%,50%"


def run(sim, src, landing, migrate):
    cmd = [sim, *src, "--budget", SHARES, "--block-bytes", "16384", "--mode", "tick",
           "--tick-steps", "1", "--migrate-per-tick", migrate, "--hysteresis", "2",
           "--landing", str(landing), "--policy", "default", "--persist", "persist",
           "--hints", "off", "--json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", default=os.path.join(ROOT, "build", "bin", "cxltier-sim"))
    a = ap.parse_args()
    sources = [(f"attention, seed {s}", ["--workload", f"attention:seed={s},{ATTENTION}"])
               for s in range(6, 11)]
    sources += [("Mooncake sample", ["--trace", "mooncake:" + os.path.join(
                    ROOT, "tests", "data", "mooncake_synthetic_trace.jsonl")]),
                ("llama recording*", ["--trace", "bin:" + os.path.join(
                    ROOT, "tests", "data", "llama_mooncake40.cxlt")])]
    print("| trace | moves a tick | " + " | ".join(SHARES.split(",")) + " |")
    print("|---|---|" + "---|" * len(SHARES.split(",")))
    for migrate, label in [("160KiB", "10 blocks"), ("0", "any")]:
        for name, src in sources:
            without, withroom = run(a.sim, src, 0, migrate), run(a.sim, src, 3, migrate)
            cells = [f"{x['hit_rate'] * 100:.1f} → {y['hit_rate'] * 100:.1f}"
                     for x, y in zip(without, withroom)]
            print(f"| {name} | {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
