"""benchmarks/curriculum.py on the sample's build: a pool of copies holds the built pool's rows that many times,
and the curriculum's stage files and stream reports run on it (the benchmark the curriculum's memory figures in
benchmarks/README.md come from stays runnable; its figures are timings, not checked)."""

from __future__ import annotations

import re

import pyarrow.parquet as pq

from tests.helpers import run_benchmark


def test_curriculum_benchmark_runs_on_copies_of_a_built_pool(built_sample):
    data_dir = built_sample[2]
    pool = data_dir / "pool" / "synth_pool_v1"
    before = {path: path.stat().st_mtime_ns for path in pool.rglob("*") if path.is_file()}
    shards = len(list((pool / "shards").glob("shard_*.json")))
    rows = sum(pq.ParquetFile(part).metadata.num_rows for part in (pool / "parts").glob("*.parquet"))
    done = run_benchmark("curriculum.py", "--data", str(data_dir), "--copies", "1", "3")
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("synth_curriculum's stage files and stream reports")
    for copies, line in zip((1, 3), lines[1:3], strict=True):
        found = re.match(r"  (\d+) pool shards, ([\d,]+) pool rows: ", line)
        assert found, line
        assert int(found.group(1)) == copies * shards and int(found.group(2).replace(",", "")) == copies * rows
    assert lines[3].startswith("  the line through both: ") and "at 500 shards" in lines[3]
    # the copies are links the benchmark only reads: the built pool is as it was, and nothing was left beside it
    assert {path: path.stat().st_mtime_ns for path in pool.rglob("*") if path.is_file()} == before
    assert not list(data_dir.parent.glob("curriculum_*"))
