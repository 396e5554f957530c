"""The sequence pool on the built sample, against independent oracles: every pool row agrees with synth_tokenized
(ids, lengths, spans, messages), the rows kept are exactly those the salted hash keeps at the plan's rates,
the per-cell trios hold exactly the pool's conversations, the sampling manifest adds up, and the UI gets the
bucket metadata and the WARN check."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid

import dagster as dg
import numpy as np
import polars as pl
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset
from openai_harmony import Conversation, Message

from synthkd_assets.defs.checks import stale_pool_shards
from synthkd_assets.defs.metadata import rounded
from synthkd_assets.defs.passes import POOL_MANIFEST_STEPS, POOL_STEPS, QUOTA_STEPS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_contract.buckets import SKILL_BUCKETS
from synthkd_contract.manifest_seal import verify_manifest
from synthkd_contract.schemas import POOL_NULL_COLUMNS, POOL_SCHEMA
from tests.helpers import SAMPLE_RAW_DIR, pool_published, run, stage_shard_files

# the contract restated by hand (an oracle must not import what it checks)
SKILL = {
    "memorization": "B1",
    "rag": "B1",
    "mcq": "B1",
    "cooking": "B1",
    "unknown": "B1",
    "math exercise": "B2",
    "math mcq": "B2",
    "editing": "B4",
    "constrained writing": "B4",
    "creative writing": "B4",
}
NAMESPACE = uuid.uuid5(uuid.NAMESPACE_DNS, "synth_pool_v1.synthkd")


def ctx_of(length: int) -> str:
    return "C1" if length <= 2048 else "C2" if length <= 8192 else "C3" if length <= 32768 else "C4"


def unit(salt: str, key: str) -> float:
    return int.from_bytes(hashlib.sha256(f"{salt}:{key}".encode()).digest()[:8], "big") / 2**64


@pytest.fixture(scope="module")
def pool(built_sample):
    instance, layout, data_dir = built_sample
    paths = layout.data_layout()
    parts = sorted((paths.pool_root() / "parts").glob("*.parquet"))
    return instance, paths, pl.read_parquet(parts), parts


def tokenized(paths) -> pl.DataFrame:
    return pl.read_parquet(stage_shard_files(paths, "synth_tokenized"))


def test_pool_rows_agree_with_synth_tokenized_and_the_harmony_render(pool, encoding):
    _, paths, rows, parts = pool
    for part in parts:
        assert pl.read_parquet_schema(part) == pl.from_arrow(POOL_SCHEMA.empty_table()).schema
    assert rows.height > 0
    # every one of real SYNTH's nine exercise labels went through the whole build into its bucket
    assert set(rows["source_subset"]) == set(SKILL) - {"unknown"}
    source = {r["synth_id"]: r for r in tokenized(paths).iter_rows(named=True)}
    sampled = pl.read_parquet(sorted(paths.stage_dir("synth_sampled").glob("*.parquet")))
    messages = dict(zip(sampled["synth_id"], sampled["messages_json"]))
    for row in rows.iter_rows(named=True):
        synth_id = row["source_example_id"]
        tokens = np.asarray(source[synth_id]["tokens"])
        assert row["id"] == str(uuid.uuid5(NAMESPACE, f"PleIAs/SYNTH:{synth_id}"))
        assert row["source_dataset"] == "PleIAs/SYNTH" and row["source_subset"] == source[synth_id]["exercise"]
        assert row["skill_bucket"] == SKILL[row["source_subset"]] and row["ctx_bucket"] == ctx_of(len(tokens))
        assert row["sequence_tokens"] == len(tokens) and row["messages"] == messages[synth_id]
        assert row["sampling_weight"] == 1.0 and all(row[c] is None for c in POOL_NULL_COLUMNS)
        # per-message renders by openai-harmony: the prompt is system + user, each span one assistant message
        conversation = json.loads(row["messages"])["messages"]
        prompt = [m for m in conversation if m["role"] != "assistant"]
        rendered = encoding.render_conversation(Conversation.from_messages([Message.from_dict(m) for m in prompt]))
        assert row["prompt_tokens_est"] == len(rendered) and list(tokens[: len(rendered)]) == rendered
        for channel, spans in (("analysis", row["analysis_span"]), ("final", row["final_span"])):
            wanted = [m for m in conversation if m["role"] == "assistant" and m.get("channel") == channel]
            assert len(spans) == len(wanted), (synth_id, channel)
            for span, message in zip(spans, wanted):
                alone = encoding.render(Message.from_dict(message))
                # the training render ends the last message with <|return|> where a lone render has <|end|>
                assert span["end"] - span["start"] == len(alone)
                assert list(tokens[span["start"] : span["end"] - 1]) == alone[:-1]
    # the last token is the EOD, after the final span
    assert all(r["final_span"][-1]["end"] == r["sequence_tokens"] - 1 for r in rows.iter_rows(named=True))


def test_the_pool_keeps_exactly_what_the_salted_hash_keeps_at_the_plans_rates(pool):
    _, paths, rows, _ = pool
    plan = json.loads(paths.quota_plan().read_text())
    everything = tokenized(paths)
    expected = {
        r["synth_id"]
        for r in everything.iter_rows(named=True)
        if unit("synthkd/pool/quota", r["synth_id"]) < plan["rates"][SKILL[r["exercise"]]][ctx_of(len(r["tokens"]))]
        and r["synth_id"] not in {e["synth_id"] for e in plan["excluded"]}
    }
    assert set(rows["source_example_id"]) == expected
    # the plan states the kept tokens exactly, and every kept skill share is within the tolerance of its target
    kept = {b: sum(n for s, n in zip(rows["skill_bucket"], rows["sequence_tokens"]) if s == b) for b in SKILL_BUCKETS}
    assert kept == plan["skill_tokens"]["expected"]
    assert plan["share_misses"] == []
    assert rows["id"].n_unique() == rows.height
    # downsampling only: the scarcest bucket relative to its target keeps everything
    assert max(rate for cells in plan["rates"].values() for rate in cells.values()) == 1.0
    assert plan["infeasible"] == [
        {"bucket": "B3", "target": 0.175, "reason": plan["infeasible"][0]["reason"]}
    ]  # SYNTH has no code exercise: reported, never hidden


def test_the_cell_trios_hold_exactly_the_pools_conversations(pool):
    _, paths, rows, _ = pool
    source = {r["synth_id"]: r for r in tokenized(paths).iter_rows(named=True)}
    trio_root = paths.pool_trio_root()
    seen = []
    for prefix in sorted(trio_root.glob("*/*/shard_*_tokens.idx")):
        split, cell = prefix.parent.parent.name, prefix.parent.name
        tokens = IndexedDataset(str(prefix)[: -len(".idx")])
        span = IndexedDataset(str(prefix)[: -len("_tokens.idx")] + "_span")
        for i in range(len(tokens)):
            seen.append((split, cell, tuple(tokens[i]), tuple(span[i])))
    assert len(seen) == rows.height
    valid = {s for s in rows["source_example_id"] if unit("synth_kd_v1/split", s) < 0.001}
    wanted = sorted(
        (
            "valid" if r["source_example_id"] in valid else "train",
            f"{r['skill_bucket']}_{r['ctx_bucket']}",
            tuple(source[r["source_example_id"]]["tokens"]),
            tuple(source[r["source_example_id"]]["span_id"]),
        )
        for r in rows.iter_rows(named=True)
    )
    assert sorted(seen) == wanted


def test_the_sampling_manifest_adds_up_and_the_curriculum_files_exist(pool):
    _, paths, rows, _ = pool
    manifest = verify_manifest(paths.pool_root())
    quota = manifest["quota"]
    achieved = {b: sum(cells.values()) for b, cells in quota["achieved"]["tokens"].items()}
    assert sum(achieved.values()) == rows["sequence_tokens"].sum()
    for skill, group in rows.group_by("skill_bucket"):
        assert achieved[skill[0]] == group["sequence_tokens"].sum()
    assert manifest["totals"]["rows_out"] == rows.height
    assert manifest["config"]["quota"]["targets"]["skill_mix"] == {"B1": 0.5, "B2": 0.175, "B3": 0.175, "B4": 0.15}
    stages = {stage["stage"]: stage for stage in manifest["curriculum"]}
    assert stages["P1"]["feasible"] and stages["P1"]["expected_sequences"] == 146485
    assert not stages["P3"]["feasible"] and stages["P3"]["per_split_data_args"] is None  # no C3 in the sample
    for stage in manifest["curriculum"]:
        args = paths.curriculum_dir() / f"{stage['stage']}.json"
        assert args.is_file() == bool(stage["per_split_data_args"])
        if args.is_file():
            blend = json.loads(args.read_text())
            for prefix in blend["train"][1::2]:
                assert IndexedDataset(prefix).sequence_lengths.sum() > 0


def test_a_stage_taken_out_of_the_curriculum_leaves_no_file_behind(built_sample, own_instance, tmp_path):
    """The curriculum configured as one stage S1: P1's and P2's files go (their blends would outlive the pool
    they name), and the sealed pool manifest lists exactly the curriculum files on disk."""
    copy = tmp_path / "data"
    shutil.copytree(built_sample[2], copy)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy))
    paths = layout.data_layout()
    s1 = {"stage": "S1", "ctx_mix": {"C1": 1.0}, "tokens": 1_000_000, "seq_length": 4096}
    run(own_instance, layout, POOL_MANIFEST_STEPS, build=SynthKDBuildConfig(curriculum=[s1]))
    assert sorted(p.name for p in paths.curriculum_dir().iterdir()) == ["S1.args", "S1.json", "plan.json"]
    event = own_instance.get_latest_materialization_event(dg.AssetKey("synth_curriculum"))
    removed = event.asset_materialization.metadata["stage_files_removed"].value
    assert removed == ["P1.args", "P1.json", "P2.args", "P2.json"]
    listed = {f["path"] for f in verify_manifest(paths.pool_root())["files"] if f["path"].startswith("curriculum/")}
    assert listed == {"curriculum/S1.args", "curriculum/S1.json", "curriculum/plan.json"}


def test_a_skill_mix_that_keeps_nothing_fails_the_quota_plan(built_sample, own_instance, tmp_path):
    """The sample has no code (B3): a mix of B3 alone would build an empty pool; the plan step refuses it by
    name and the plan on disk stays the last good one."""
    copy = tmp_path / "data"
    shutil.copytree(built_sample[2], copy)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy))
    plan = layout.data_layout().quota_plan()
    before = plan.read_bytes()
    result = run(
        own_instance, layout, QUOTA_STEPS, build=SynthKDBuildConfig(skill_mix={"B3": 1.0}), raise_on_error=False
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = str(failure.step_failure_data.error)  # with its cause, the ValueError
    assert "skill_mix {'B3': 1.0} keeps nothing: the buckets it gives a share (B3) hold no tokens" in message
    assert plan.read_bytes() == before


def test_a_pool_relaunched_for_one_shard_under_a_new_plan_is_unpublished_until_every_shard_follows(
    built_sample, own_instance, tmp_path
):
    """A new quota plan, then one shard's pool relaunched: the manifest and every curriculum blend go at once (the
    Megatron-LM arguments would blend two plans' rows); the curriculum refuses, writing nothing, and the pool
    manifest too, naming a shard still made under the old plan; once every shard follows, both are back and
    verify."""
    copy = tmp_path / "data"
    shutil.copytree(built_sample[2], copy)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy))
    paths = layout.data_layout()
    mix = SynthKDBuildConfig(skill_mix={"B1": 0.4, "B2": 0.3, "B3": 0.1, "B4": 0.2})
    run(own_instance, layout, QUOTA_STEPS, build=mix)
    run(own_instance, layout, POOL_STEPS, "synth_001", build=mix)
    assert not paths.pool_manifest().exists() and [p.name for p in paths.curriculum_dir().iterdir()] == ["plan.json"]
    event = own_instance.get_latest_materialization_event(dg.AssetKey("synth_pool"))
    assert "synth_pool_v1/manifest.json" in str(event.asset_materialization.metadata["pool_unpublished_files"].value)
    published = pool_published(own_instance)  # what the UI shows on synth_pool_manifest: not the last green run
    assert not published.passed and "unpublished: synth_pool rewrites shard synth_001's part" in published.description
    for step in POOL_MANIFEST_STEPS:
        failed = run(own_instance, layout, [step], build=mix, raise_on_error=False)
        assert not failed.success
        [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
        assert "synth_pool partition 'synth_002' was made with quota plan" in str(failure.step_failure_data.error)
    assert not paths.pool_manifest().exists() and [p.name for p in paths.curriculum_dir().iterdir()] == ["plan.json"]
    for shard in [f"synth_{i:03d}" for i in range(1, 7)]:  # every shard of the sample, synth_001 ... synth_006
        run(own_instance, layout, POOL_STEPS, shard, build=mix)
    run(own_instance, layout, POOL_MANIFEST_STEPS, build=mix)
    assert pool_published(own_instance).passed
    manifest = verify_manifest(paths.pool_root())
    assert manifest["config"]["quota"]["targets"]["skill_mix"] == mix.skill_mix
    assert {f["path"] for f in manifest["files"]} >= {"curriculum/P1.args", "curriculum/P1.json"}


def test_bucket_tokens_are_plotted_and_the_balance_check_warns(pool):
    instance, _, rows, _ = pool
    tokenized_event = instance.get_latest_materialization_event(dg.AssetKey("synth_tokenized"))
    metadata = tokenized_event.asset_materialization.metadata
    assert {f"tokens_kept_skill_{b}" for b in ("B1", "B2", "B3", "B4")} <= set(metadata)
    assert {f"tokens_kept_ctx_{c}" for c in ("C1", "C2", "C3", "C4")} <= set(metadata)
    assert any(key.startswith("tokens_language_") for key in metadata)
    # pool-wide, in the manifest's metadata: the pool's rows summed by language and by exercise
    manifest_event = instance.get_latest_materialization_event(dg.AssetKey("synth_pool_manifest"))
    pool_metadata = manifest_event.asset_materialization.metadata
    for column, prefix in (("language", "tokens_language_"), ("source_subset", "tokens_exercise_")):
        plotted = {key.removeprefix(prefix): m.value for key, m in pool_metadata.items() if key.startswith(prefix)}
        summed = rows.group_by(column).agg(pl.col("sequence_tokens").sum())
        assert plotted == dict(summed.iter_rows()) and plotted
    # the pool's own skill mix on tokens, target vs achieved, recomputed from its rows; the 001 sampling's mix is
    # labelled as the rows the quota drew from ("sampled"), never as the pool's achieved mix
    tokens = dict(rows.group_by("skill_bucket").agg(pl.col("sequence_tokens").sum()).iter_rows())
    for bucket in ("B1", "B2", "B3", "B4"):
        share = tokens.get(bucket, 0) / sum(tokens.values())
        assert pool_metadata[f"skill_share_achieved_{bucket}"].value == rounded(share)  # as the UI shows it
        assert f"| {bucket} |" in pool_metadata["skill_mix_target_achieved"].value
    assert pool_metadata["skill_share_target_B3"].value == 0.0 and not pool_metadata["skill_mix_feasible"].value
    # the target is SYNTH's and achieved all sources': said so, as with anchor sources B3 holds code tokens
    assert "target share (SYNTH's tokens) | achieved share (the pool's tokens, all sources)" in (
        pool_metadata["skill_mix_target_achieved"].value
    )
    infeasible = [record.data for record in pool_metadata["skill_mix_infeasible"].records]  # a table in the UI
    assert infeasible and all(entry["reason"].startswith("SYNTH's rows: no tokens in") for entry in infeasible)
    assert "memorization_share_sampled" in pool_metadata and "memorization_share_achieved" not in pool_metadata
    assert "| | before | expected after | sampled |" in pool_metadata["mix_before_after"].value
    check = instance.event_log_storage.get_latest_asset_check_execution_by_key(
        [dg.AssetCheckKey(dg.AssetKey("synth_pool_manifest"), "bucket_balance")]
    )[dg.AssetCheckKey(dg.AssetKey("synth_pool_manifest"), "bucket_balance")]
    evaluation = check.event.dagster_event.event_specific_data
    assert evaluation.severity == dg.AssetCheckSeverity.WARN and not evaluation.passed
    # the default skill_mix is unbalanced by design and B3 has no SYNTH exercise: said, as no action needed
    assert evaluation.description.startswith("expected, no action needed: ")
    assert "B3 empty: a target the corpus cannot meet" in evaluation.description
    assert evaluation.metadata["verdict"].value == "expected"
    smallest = rows.group_by("skill_bucket").agg(pl.col("sequence_tokens").sum()).sort("sequence_tokens")[0]
    assert f"smallest bucket {smallest['skill_bucket'][0]} ({smallest['sequence_tokens'][0]:,} tokens)" in (
        evaluation.description
    )


def _tokenized_version(instance: dg.DagsterInstance, shard: str, version: str) -> None:
    """A synth_tokenized materialization of `shard` with data version `version`, as a rebuild records one."""
    event = dg.AssetMaterialization("synth_tokenized", partition=shard, tags={"dagster/data_version": version})
    instance.report_runless_asset_event(event)


def pool_current(instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    key = dg.AssetCheckKey(dg.AssetKey("synth_pool_manifest"), "pool_current")
    [record] = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
    return record.event.dagster_event.event_specific_data


def test_a_shard_rebuilt_after_its_pool_part_warns_on_the_pool_manifest_until_the_pool_follows(
    built_sample, own_instance, tmp_path
):
    """A pool part older than its shard's synth_tokenized (the raw sensor rebuilt a changed shard: the pool is left
    to the pool pass) is what the pool manifest's `pool_current` warning says, reported by the run that rebuilt
    the shard, with the launch that repairs it; a rebuild with the same bytes is no change; the pool pass and
    its manifest make it pass again."""
    copy = tmp_path / "data"
    shutil.copytree(built_sample[2], copy)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy))
    shards = [f"synth_{i:03d}" for i in range(1, 7)]
    _tokenized_version(own_instance, "synth_002", "before")
    run(own_instance, layout, POOL_STEPS, "synth_002")
    run(own_instance, layout, POOL_MANIFEST_STEPS)
    assert pool_current(own_instance).passed and stale_pool_shards(own_instance, shards) == []
    _tokenized_version(own_instance, "synth_002", "before")  # rebuilt, same bytes: the part is still current
    assert stale_pool_shards(own_instance, shards) == []
    _tokenized_version(own_instance, "synth_002", "after")  # rebuilt with other bytes
    assert stale_pool_shards(own_instance, shards) == ["synth_002"]
    # the build pass's run of the shard says so on synth_pool_manifest (the graph's and asset page's check badge)
    run(own_instance, layout, ["synth_kd_v1"], "synth_002")
    warned = pool_current(own_instance)
    assert not warned.passed and warned.severity == dg.AssetCheckSeverity.WARN
    assert warned.description.startswith("needs action: the pool synth_pool_v1 predates the rebuild of 1 shard(s)")
    assert "Jobs > synth_pool_job > Materialize all, partition 'synth_002'" in warned.description
    assert warned.metadata["summary"].value == warned.description  # what the run's page shows
    # another shard rebuilt: the warning names both
    _tokenized_version(own_instance, "synth_004", "after")
    run(own_instance, layout, ["synth_kd_v1"], "synth_004")
    assert pool_current(own_instance).metadata["stale_shards"].value == ["synth_002", "synth_004"]
    for shard in ("synth_002", "synth_004"):
        run(own_instance, layout, POOL_STEPS, shard)
    run(own_instance, layout, POOL_MANIFEST_STEPS)
    assert pool_current(own_instance).passed
