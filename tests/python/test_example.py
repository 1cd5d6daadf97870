"""examples/kv_engine.py against a real daemon: it decodes, tiers and matches the DRAM run."""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("mode", ["page", "copy"])
def test_the_example_engine_runs_and_its_logits_match_dram(daemon, mode):
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "kv_engine.py"), "--socket", daemon.socket,
         "--mode", mode, "--json"],
        capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout + out.stderr + daemon.log()
    assert "bit-identical to the all-DRAM run" in out.stdout
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["logits_bit_identical"]
    assert summary["tokens_decoded"] > 0 and summary["prefix_blocks_reused"] > 0
    # The pool outgrows tier 0 (8 blocks): the daemon must have moved blocks.
    assert summary["blocks_stored"] > 8
    assert summary["moves"]["promotions"] + summary["moves"]["demotions"] > 0, summary
    assert 0 < summary["fast_tier_hit_rate"] <= 1
    if mode == "copy":
        assert summary["moves"]["copies"] > 0
    assert "fast-tier hit rate" in out.stdout
