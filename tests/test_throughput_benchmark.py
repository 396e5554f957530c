"""benchmarks/throughput.py's scaled shard is what its line 5 says it is: `scale` times the rows for every step,
the copies distinct prompts (well under the near-duplicate threshold) rather than copies the cap would drop."""

from __future__ import annotations

import sys

import pyarrow.parquet as pq

from synthkd_contract.near_dup import JACCARD_THRESHOLD
from synthkd_dev.make_sample_data import signature_shingles
from tests.helpers import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import throughput  # noqa: E402


def test_the_scaled_shard_is_distinct_examples_with_the_same_seed_texts(tmp_path):
    throughput.make_shard(tmp_path / "one.parquet", 30)
    throughput.make_shard(tmp_path / "scaled.parquet", 30, scale=4)
    one, rows = (
        pq.read_table(tmp_path / "one.parquet").to_pylist(),
        pq.read_table(tmp_path / "scaled.parquet").to_pylist(),
    )
    assert len(rows) == 4 * len(one) and len({r["synth_id"] for r in rows}) == len(rows)
    assert rows[: len(one)] == one  # copy 0: the 1x rows themselves
    for copy in range(1, 4):
        for original, row in zip(one, rows[copy * len(one) : (copy + 1) * len(one)]):
            assert row["query_seed_text"] == original["query_seed_text"]
            x, y = (signature_shingles(r["query"], r["synthetic_answer"]) for r in (original, row))
            assert len(x & y) / len(x | y) < JACCARD_THRESHOLD - 0.2
