"""benchmarks/quota_plan.py --quick runs against a baseline tree and prints its lines: the benchmark the quota
plan's figures in benchmarks/README.md come from stays runnable (its figures are timings, not checked)."""

from __future__ import annotations

from tests.helpers import REPO_ROOT, run_benchmark


def test_quota_plan_benchmark_quick_compares_two_trees():
    done = run_benchmark("quota_plan.py", "--quick", "--anchors", "--baseline-tree", str(REPO_ROOT))
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("quota plan over 200,000 rows in 8 shards")
    assert any(line.startswith("  baseline: ") and "projected to 77.9M rows" in line for line in lines)
    assert any(line.startswith("  this tree: ") and "peak" in line and "source mix" in line for line in lines)
    assert any(line.startswith("  this tree / baseline: time ") for line in lines)
