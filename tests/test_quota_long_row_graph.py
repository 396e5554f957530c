"""The attack on the pool's mix, as a user makes it: one 2 MB reasoning row added to a raw shard of the sample, then
`build_all` (what ./scripts/build.sh runs). Drawn row by row at the grid's rates, that one row decided B1's share
(60.6% target: 15.9% achieved in the attack); selected by hash-ordered token budgets, every skill share of the
pool is within a point of its target, the blocking check `pool_mix_within_tolerance` passes and the pool verifies.
The oracle is the pool's own parts: tokens summed per skill bucket with polars, against the plan's targets.
"""

from __future__ import annotations

import shutil

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_assets.defs.build import build_all
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract.manifest_seal import verify_manifest
from tests.helpers import SAMPLE_RAW_DIR, long_text

LONG_ID = "rag_long_reasoning_0001"
WORDS = ("aqueduct", "pressure", "gradient", "masonry", "arch", "channel", "siphon", "reservoir", "flow", "stone")


def long_reasoning(target_bytes: int) -> str:
    return long_text(target_bytes, WORDS)


def test_one_2mb_reasoning_row_keeps_every_skill_share_within_a_point(tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(SAMPLE_RAW_DIR, raw)
    shard = raw / "synth_005.parquet"
    table = pq.read_table(shard)
    row = table.slice(table.column("exercise").to_pylist().index("rag"), 1).to_pylist()[0]
    row.update(synth_id=LONG_ID, synthetic_reasoning=long_reasoning(2_000_000))
    pq.write_table(pa.concat_tables([table, pa.Table.from_pylist([row], schema=table.schema)]), shard)

    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        build_all(instance, layout)  # raises on a failed step or blocking check
    paths = layout.data_layout()
    tokenized = pl.read_parquet(paths.stage_output("synth_tokenized", "synth_005"), columns=["synth_id", "tokens"])
    long_tokens = tokenized.filter(pl.col("synth_id") == LONG_ID)["tokens"].list.len().to_list()
    assert long_tokens and long_tokens[0] > 300_000  # the row reached the pool's input

    parts = pl.read_parquet(paths.pool_root() / "parts" / "*.parquet", columns=["skill_bucket", "sequence_tokens"])
    kept = dict(parts.group_by("skill_bucket").agg(pl.col("sequence_tokens").sum()).iter_rows())
    total = sum(kept.values())
    manifest = verify_manifest(paths.pool_root())  # every blocking check passed on it
    targets = manifest["quota"]["targets"]["shares"]
    for bucket, target in targets.items():
        assert abs(kept.get(bucket, 0) / total - target) <= 0.01, (bucket, kept, targets)
