"""benchmarks/candidate_pairs.py --quick runs against a baseline tree and prints its lines: the benchmark the
candidate pairs' figures in benchmarks/README.md come from stays runnable (its figures are timings, not checked)."""

from __future__ import annotations

from tests.helpers import REPO_ROOT, run_benchmark


def test_candidate_pairs_benchmark_quick_compares_two_trees():
    done = run_benchmark("candidate_pairs.py", "--quick", "--baseline-tree", str(REPO_ROOT))
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("candidate pairs over 200,000 rows in 16 files")
    assert any(line.startswith("  baseline: ") and "B a row" in line for line in lines)
    assert any(line.startswith("  this tree / baseline: time ") for line in lines)
