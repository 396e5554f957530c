"""benchmarks/clustering.py --quick runs against a baseline tree and prints its lines: the benchmark the clustering's
memory figures in benchmarks/README.md come from stays runnable (its figures are timings, not checked); both trees
giving the same clusters is checked by the benchmark itself."""

from __future__ import annotations

from tests.helpers import REPO_ROOT, run_benchmark


def test_clustering_benchmark_quick_compares_two_trees():
    done = run_benchmark("clustering.py", "--quick", "--baseline-tree", str(REPO_ROOT))
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cluster_shards over copies of one file's signatures")
    assert any(line.startswith("  4 copies: 12,000 rows") for line in lines), lines
    assert any(line.startswith("  this tree: ") and "projected to 79,600,000 rows" in line for line in lines)
    assert any(line.startswith("  4 copies, this tree / baseline: time ") for line in lines)
