"""The attack on the source mix, as a user makes it: one ~10 MB line appended to a math source's JSONL file of the
bundled anchor sample (a valid nvidia/Nemotron-Math-v2 row whose assistant reasoning is huge), then `build_all`
(what ./scripts/build.sh runs). Drawn at its category's one keep rate, that line decided math's share (the issue:
8.7% target, 0% achieved; here, the line hashing below that rate, 83% against 8.2%); selected by hash-ordered token
budgets, the line is excluded by id, math holds its share within a point, the blocking checks pass and the pool
verifies. The oracle is the pool's own parts: tokens summed per source group with polars, against the plan's targets.
The in-memory twin is tests/test_quota_selection.py::test_one_10mb_anchor_line_no_longer_takes_math_to_zero.
"""

from __future__ import annotations

import json
import shutil

import dagster as dg
import polars as pl

from synthkd_assets.core.quota import QUOTA_SHARE_TOLERANCE
from synthkd_assets.defs.build import build_all
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract import drops, sources
from synthkd_contract.manifest_seal import verify_manifest
from synthkd_contract.splits import stable_unit_interval
from synthkd_dev import SAMPLE_RAW_DIR, SAMPLE_SOURCES_DIR
from tests.helpers import long_text

# the row's own id: its id names it among the source's rows (synth_id `<source>:<uuid>-<sha256 of its content>`).
# This one hashes first in the mix's order (below any rate the mix gives math), so the old rule, one rate for the
# whole category, would have kept it: the row is met by the selection, not merely left beyond its threshold.
LONG_UUID = "10mb-line-0048"
WORDS = ("integer", "modulo", "divisor", "prime", "residue", "lemma", "bound", "sum", "square", "parity")


def long_reasoning(target_bytes: int) -> str:
    return long_text(target_bytes, WORDS)


def test_one_10mb_math_jsonl_line_is_excluded_and_math_keeps_its_share(tmp_path):
    sources_dir = tmp_path / "sources"
    shutil.copytree(SAMPLE_SOURCES_DIR, sources_dir)
    shard = sources_dir / "nemotron_math_v2" / "medium.jsonl"
    row = json.loads(shard.read_text().splitlines()[0])  # a real row of the source: user turn, then the reasoning
    assert [m["role"] for m in row["messages"]] == ["user", "assistant"] and row["messages"][1]["reasoning_content"]
    row["uuid"] = LONG_UUID
    row["messages"][1]["reasoning_content"] = long_reasoning(10_000_000)
    line = json.dumps(row)
    assert len(line) > 10_000_000
    with shard.open("a") as out:
        out.write(line + "\n")

    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path / "data"), sources_dir=str(sources_dir))
    with dg.DagsterInstance.ephemeral() as instance:
        build_all(instance, layout)  # raises on a failed step or blocking check (pool_mix_within_tolerance among them)
    paths = layout.data_layout()
    key = "nemotron_math_v2/medium"
    tokenized = pl.read_parquet(paths.stage_output("synth_tokenized", key), columns=["synth_id", "tokens"])
    [(long_id, long_tokens)] = (
        tokenized.filter(pl.col("synth_id").str.starts_with(f"nemotron_math_v2:{LONG_UUID}-"))
        .select("synth_id", pl.col("tokens").list.len())
        .rows()
    )
    assert long_tokens > 1_000_000  # the line reached the plan's input whole

    # the plan: the line holds most of math's tokens, is met first in hash order and excluded by id as oversized
    mix = json.loads(paths.quota_plan().read_text())["source_mix"]
    math_group = mix["groups"]["math"]
    assert long_tokens > math_group["available_tokens"] / 2
    assert (
        stable_unit_interval(sources.SOURCE_MIX_SALT, long_id)
        < math_group["expected_tokens"] / math_group["available_tokens"]
    )  # one rate for the category (the old rule) would have kept it
    [entry] = [e for e in mix["excluded"] if e["synth_id"] == long_id]
    assert entry["source"] == "nemotron_math_v2" and entry["group"] == "math" and entry["tokens"] == long_tokens
    assert entry["why"].startswith("oversized")
    assert mix["share_misses"] == []

    # the pool: the line is dropped and counted, by reason, in the pool's error log of its shard
    logged = [json.loads(line) for line in paths.error_log("synth_pool", key).read_text().splitlines()]
    assert [e["reason"] for e in logged if e["synth_id"] == long_id] == [drops.DROP_OVER_SOURCE_SHARE]
    manifest = verify_manifest(paths.pool_root())  # every blocking check passed on it
    report = next(r["report"] for r in manifest["shards"] if r["partition"] == key)
    assert report["dropped"][drops.DROP_OVER_SOURCE_SHARE] == sum(
        e["reason"] == drops.DROP_OVER_SOURCE_SHARE for e in logged
    )

    # the oracle: tokens per source group summed from the pool's parts, math within a point of its target
    parts = pl.read_parquet(
        paths.pool_root() / "parts" / "*.parquet", columns=["id", "source_dataset", "sequence_tokens"]
    )
    assert not parts["id"].str.contains(LONG_UUID, literal=True).any()
    group_of = {sources.source_dataset(s): g for g, e in mix["groups"].items() for s in e.get("sources", [g])}
    kept = dict(
        parts.group_by(pl.col("source_dataset").replace_strict(group_of))
        .agg(pl.col("sequence_tokens").sum())
        .iter_rows()
    )
    total = sum(kept.values())
    groups = manifest["source_mix"]["groups"]
    for group in ("synth", "math", "code", "chat"):
        assert groups[group]["achieved_tokens"] == kept[group], (group, kept, groups)
        assert abs(kept[group] / total - groups[group]["target_share"]) <= QUOTA_SHARE_TOLERANCE, (group, kept)
    assert kept["math"] < long_tokens / 10  # the line is not among them
