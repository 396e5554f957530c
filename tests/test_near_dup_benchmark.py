"""benchmarks/near_dup.py --quick runs and prints every section of its table: the benchmark the README's
"Near-duplicate control" figures come from stays runnable (its figures are not checked: they are timings)."""

from __future__ import annotations

from tests.helpers import run_benchmark


def test_near_dup_benchmark_quick_prints_its_table():
    done = run_benchmark("near_dup.py", "--quick")
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    for start in ("1. MinHash library", "   rensa vs datasketch:", "   Jaccard vs exact", "2. signatures_shard"):
        assert any(line.startswith(start) for line in lines), start
    for start in ("3. clustering", "4. projection", "   clustering peak RSS, worst case"):
        assert any(line.startswith(start) for line in lines), start
    assert "signatures/s" in done.stdout and "s per million rows" in done.stdout and "GiB" in done.stdout
