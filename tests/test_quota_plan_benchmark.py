"""benchmarks/quota_plan.py --quick runs against a baseline tree and prints its lines: the benchmark the quota
plan's figures in benchmarks/README.md come from stays runnable (its figures are timings, not checked)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_quota_plan_benchmark_quick_compares_two_trees():
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / "quota_plan.py"), "--quick", "--baseline-tree", str(REPO_ROOT)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("quota plan over 200,000 rows in 8 shards")
    assert any(line.startswith("  baseline: ") and "projected to 77.9M rows" in line for line in lines)
    assert any(line.startswith("  this tree: ") and "peak" in line for line in lines)
    assert any(line.startswith("  this tree / baseline: time ") for line in lines)
