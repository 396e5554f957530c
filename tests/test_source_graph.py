"""Anchor sources in the graph (#21): partitions `<source>/<stem>` beside SYNTH's, the same steps and checks, the
source of every document in every dataset, and the pool's source mix on tokens against an independent count."""

from __future__ import annotations

import io
import itertools
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from synthkd_assets.cli import print_summaries, summary_lines
from synthkd_assets.core import inventory
from synthkd_assets.core.cleanup import orphaned_outputs
from synthkd_assets.core.inventory import scan_inputs, shard_index_from_name
from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.core.quota import QUOTA_SHARE_TOLERANCE, quota_keep
from synthkd_assets.core.source_mix import source_mix_keep
from synthkd_assets.definitions import defs
from synthkd_assets.defs.automation import synth_raw_sensor
from synthkd_assets.defs.metadata import rounded
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout, synthkd_resources
from synthkd_contract import constants, drops, sources
from synthkd_contract.buckets import ctx_bucket, skill_bucket
from synthkd_dev import SAMPLE_RAW_DIR, SAMPLE_SOURCES_DIR
from synthkd_dev.sensor_ticks import tick_synth_raw_sensor
from synthkd_training.stream import StageStream, read_stage_args
from tests.helpers import build_everything, run
from tests.test_bad_input import step_failures
from tests.test_stream import measured_mix, stage_targets

SYNTH_KEYS = [f"synth_{i:03d}" for i in range(1, 7)]  # synth_001 ... synth_006, as SYNTH names its files


def anchor_keys(sources_dir: Path) -> list[str]:
    """The partition keys of a sources directory, by the documented rule: `<source>/<path below it, no suffix>`."""
    keys = []
    for path in sorted(sources_dir.rglob("*")):
        if path.suffix in (".parquet", ".jsonl"):
            source, *rest = path.relative_to(sources_dir).with_suffix("").parts
            keys.append("/".join([source, *rest]))
    return sorted(keys)


@pytest.fixture(scope="module")
def built_mixed(tmp_path_factory):
    """The bundled SYNTH sample and the bundled anchor-source sample built together: (instance, layout, paths)."""
    data_dir = tmp_path_factory.mktemp("mixed")
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(data_dir), sources_dir=str(SAMPLE_SOURCES_DIR))
    with dg.DagsterInstance.ephemeral() as instance:
        build_everything(instance, layout)
        yield instance, layout, layout.data_layout()


# --- discovery -------------------------------------------------------------------------------------------------
def test_sources_are_partitions_beside_synth_with_their_own_shard_numbers(built_mixed):
    instance, _, paths = built_mixed
    keys = anchor_keys(SAMPLE_SOURCES_DIR)
    assert {key.split("/")[0] for key in keys} == set(sources.SOURCE_DATASETS)  # every source is in the sample
    assert sorted(instance.get_dynamic_partitions(SYNTH_SHARDS.name)) == sorted(SYNTH_KEYS + keys)
    numbers = [shard_index_from_name(key) for key in keys]
    assert len(set(numbers)) == len(numbers) and min(numbers) >= sources.ANCHOR_SHARD_INDEX_BASE
    assert [shard_index_from_name(key) for key in SYNTH_KEYS] == list(range(1, 7))  # SYNTH's numbers and keys stay
    for key in keys:  # key-named outputs live under <stage>/<source>/
        assert paths.stage_output("synth_tokenized", key).is_file()


def test_an_unknown_source_directory_is_refused_naming_it(tmp_path):
    (tmp_path / "sources" / "my_dataset").mkdir(parents=True)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path), sources_dir=str(tmp_path / "sources"))
    with pytest.raises(InputFileError, match=r"my_dataset: 'my_dataset' is not a declared source \(one of \["):
        scan_inputs(layout.data_layout())


def test_two_files_of_a_source_on_one_shard_number_are_refused(tmp_path, monkeypatch):
    shutil.copytree(SAMPLE_SOURCES_DIR / "opencodeinstruct", tmp_path / "opencodeinstruct")
    monkeypatch.setattr(sources, "anchor_shard_index", lambda key: sources.ANCHOR_SHARD_INDEX_BASE)
    with pytest.raises(InputFileError, match="anchor shards on the same shard number would overwrite"):
        inventory.source_shard_paths(tmp_path)


def test_a_shard_in_another_schema_fails_its_step_naming_file_and_column(tmp_path):
    source_dir = tmp_path / "sources" / "ultrachat_200k"
    source_dir.mkdir(parents=True)
    pq.write_table(pq.read_table(SAMPLE_RAW_DIR / "synth_001.parquet").slice(0, 5), source_dir / "train_sft.parquet")
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path), sources_dir=str(tmp_path / "sources"))
    with dg.DagsterInstance.ephemeral() as instance:
        run(instance, layout, ["synth_raw_inventory"])
        failed = run(instance, layout, ["synth_harmony"], "ultrachat_200k/train_sft", raise_on_error=False)
    assert not failed.success
    [message] = step_failures(failed)
    assert f"{source_dir / 'train_sft.parquet'}: not a HuggingFaceH4/ultrachat_200k shard" in message
    assert re.search(r"column 'prompt' is missing \(expected string, actual: absent; has \['synth_id', ", message)
    assert not layout.data_layout().stage_output("synth_harmony", "ultrachat_200k/train_sft").exists()


def test_a_source_shard_changed_after_the_inventory_is_refused_until_rescanned(tmp_path):
    """As for SYNTH (test_bad_input.py): the bytes synth_harmony reads must be the version the inventory reported."""
    source_dir = tmp_path / "sources" / "oasst1"
    source_dir.mkdir(parents=True)
    original = next((SAMPLE_SOURCES_DIR / "oasst1").glob("*.parquet"))
    shard = source_dir / original.name
    table = pq.read_table(original)
    pq.write_table(table, shard)
    key = f"oasst1/{shard.stem}"
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path), sources_dir=str(tmp_path / "sources"))
    with dg.DagsterInstance.ephemeral() as instance:
        run(instance, layout, ["synth_raw_inventory"])
        pq.write_table(table.slice(0, table.num_rows - 1), shard)  # changed after the inventory reported it
        failed = run(instance, layout, ["synth_harmony"], key, raise_on_error=False)
        assert not failed.success
        [message] = step_failures(failed)
        assert f"RawShardChangedError: {shard}: raw shard changed since the inventory scan (scanned sha256 " in message
        assert not layout.data_layout().stage_output("synth_harmony", key).exists()
        run(instance, layout, ["synth_raw_inventory"])
        run(instance, layout, ["synth_harmony"], key)
    assert layout.data_layout().stage_output("synth_harmony", key).is_file()


def test_the_sensor_builds_a_new_source_shard_and_nothing_else(built_mixed, tmp_path):
    instance, layout, paths = built_mixed
    first = tick_synth_raw_sensor(instance, layout, None)
    assert first.run_requests == []  # everything is built from the files as they are
    extra = Path(layout.sources_dir) / "oasst1"
    added = extra / "validation-00000-of-00001.parquet"
    shutil.copy(next(extra.glob("*.parquet")), added)
    try:
        result = tick_synth_raw_sensor(instance, layout, first.cursor)
        assert [(r.job_name, r.partition_key) for r in result.run_requests] == [
            ("synth_shard_job", "oasst1/validation-00000-of-00001")
        ]
    finally:
        added.unlink()


def test_a_sensor_started_without_the_sources_variable_changes_nothing(built_mixed):
    """`dg dev` started in a shell without SYNTHKD_SOURCES_DIR over a build with sources (a new user's trial: the
    sensor took every anchor shard for removed and deleted its outputs): the tick skips, naming the variable and
    the directory to export, and leaves files and partitions as they were; with the variable, nothing to do."""
    instance, layout, paths = built_mixed
    files = {p: p.stat().st_mtime_ns for p in paths.data_root.rglob("*") if p.is_file()}
    partitions = instance.get_dynamic_partitions(SYNTH_SHARDS.name)
    unset = SynthKDLayout(raw_dir=layout.raw_dir, data_dir=layout.data_dir)
    context = dg.build_sensor_context(instance=instance, resources=synthkd_resources(unset), definitions=defs())
    skipped = synth_raw_sensor(context)
    assert isinstance(skipped, dg.SkipReason), skipped
    assert f"Export SYNTHKD_SOURCES_DIR={SAMPLE_SOURCES_DIR} before `dg dev`" in skipped.skip_message
    assert (
        f"holds {len(anchor_keys(SAMPLE_SOURCES_DIR))} anchor-source shards (anthropic_helpfulness/"
        in skipped.skip_message
    )
    assert "nothing was changed" in skipped.skip_message
    assert {p: p.stat().st_mtime_ns for p in paths.data_root.rglob("*") if p.is_file()} == files
    assert instance.get_dynamic_partitions(SYNTH_SHARDS.name) == partitions
    assert tick_synth_raw_sensor(instance, layout, None).run_requests == []


def test_an_empty_sources_directory_changes_nothing(built_mixed, tmp_path):
    """SYNTHKD_SOURCES_DIR set to an existing but empty directory (a download not made yet, a mounted volume
    missing): the inventory and the sensor refuse, naming it and the way to build without the sources, and every
    anchor output stays (they were all removed as shards gone)."""
    instance, layout, paths = built_mixed
    empty = tmp_path / "sources"
    empty.mkdir()
    files = {p: p.stat().st_mtime_ns for p in paths.data_root.rglob("*") if p.is_file()}
    pointed = SynthKDLayout(raw_dir=layout.raw_dir, data_dir=layout.data_dir, sources_dir=str(empty))
    failed = run(instance, pointed, ["synth_raw_inventory"], raise_on_error=False)
    assert not failed.success
    why = f"no anchor sources in {empty}: the directory holds no shard of a declared source"
    assert any(why in failure for failure in step_failures(failed)), step_failures(failed)
    with pytest.raises(InputFileError, match=re.escape(why)):
        tick_synth_raw_sensor(instance, pointed, None)
    assert {p: p.stat().st_mtime_ns for p in paths.data_root.rglob("*") if p.is_file()} == files


# --- the datasets carry the source of every document -------------------------------------------------------------
def test_synth_outputs_are_byte_identical_with_and_without_sources(built_mixed, built_sample):
    """Adding sources leaves SYNTH's own shards of synth_kd_v1 and the DistillKit dataset as they were."""
    _, _, mixed = built_mixed
    _, synth_only, _ = built_sample
    alone = synth_only.data_layout()
    for index in range(1, 7):
        compared = 0
        for kind in constants.SPLITS:
            for path in sorted((alone.megatron_root() / kind).glob(f"shard_{index:02d}_*")):
                assert path.read_bytes() == (mixed.megatron_root() / kind / path.name).read_bytes(), path
                compared += 1
        assert compared >= 6, index  # at least the train trio's .bin and .idx (the sample's valid split is empty)
        assert alone.documents_table(index).read_bytes() == mixed.documents_table(index).read_bytes()
        for split in constants.DISTILL_SPLITS:
            part = alone.distill_root() / split / constants.distill_part_name(index)
            assert part.read_bytes() == (mixed.distill_root() / split / part.name).read_bytes()


def test_every_document_names_its_source(built_mixed):
    _, _, paths = built_mixed
    for key in [*SYNTH_KEYS, *anchor_keys(SAMPLE_SOURCES_DIR)]:
        source, index = sources.partition_source(key), shard_index_from_name(key)
        dataset = sources.source_dataset(source)
        ids = pl.read_parquet(paths.documents_table(index))["synth_id"]
        if source != sources.SYNTH_SOURCE:
            assert ids.str.starts_with(f"{source}:").all(), key
        distill = [
            pl.read_parquet(paths.distill_root() / split / constants.distill_part_name(index))
            for split in constants.DISTILL_SPLITS
        ]
        for frame in distill:
            assert (frame["source"].struct.field("dataset") == dataset).all(), key
            prefix = "pleias_synth:" if source == sources.SYNTH_SOURCE else ""
            assert (frame["id"] == prefix + frame["source"].struct.field("synth_id")).all(), key
        pool = pl.read_parquet(paths.pool_part(index))
        assert (pool["source_dataset"] == dataset).all(), key
    manifest = json.loads(paths.megatron_manifest().read_text())
    assert set(manifest["sources"]) == {sources.SYNTH_SOURCE, *sources.SOURCE_DATASETS}
    assert sum(entry["rows"] for entry in manifest["sources"].values()) == manifest["totals"]["rows_out"]


def test_multi_turn_rows_supervise_only_the_last_reply_in_the_distill_dataset(built_mixed, encoding):
    """A multi-turn row (several user turns) is -100 through its whole history, earlier assistant replies
    included: its labels start after the last user turn, at the reply being distilled."""
    _, _, paths = built_mixed
    user_turn = encoding.encode("<|start|>user", allowed_special="all")
    multi = 0
    for key in anchor_keys(SAMPLE_SOURCES_DIR):
        index = shard_index_from_name(key)
        for split in constants.DISTILL_SPLITS:
            frame = pl.read_parquet(paths.distill_root() / split / constants.distill_part_name(index))
            for row in frame.select("input_ids", "labels", "spans").iter_rows(named=True):
                ids, labels = np.asarray(row["input_ids"]), np.asarray(row["labels"])
                users = np.flatnonzero((ids[:-1] == user_turn[0]) & (ids[1:] == user_turn[1]))
                start = row["spans"]["assistant_token_start"]
                assert (labels[:start] == -100).all() and (labels[start:] != -100).any()
                assert start > users[-1]
                multi += len(users) > 1
    assert multi >= 10  # ultrachat, oasst1 and anthropic conversations with history


# --- the source mix on tokens -----------------------------------------------------------------------------------
def test_quota_plan_reports_the_source_mix_and_the_pool_meets_it_exactly(built_mixed):
    """Independently of the pool step: every tokenized row run through the keep rules (SYNTH: its cell's quota rate
    and the quota's excluded ids, then SYNTH's mix rate; an anchor: its source's rate and the mix's excluded ids)
    gives each source's kept tokens; the plan states exactly those, the pool kept exactly those, and every group's
    share is within the tolerance of its target (docs/sources.md "The source mix on tokens")."""
    _, _, paths = built_mixed
    plan = json.loads(paths.quota_plan().read_text())
    mix = plan["source_mix"]
    quota_out = {e["synth_id"] for e in plan["excluded"]}
    mix_out = {e["synth_id"] for e in mix["excluded"]}
    expected = Counter()
    for key in [*SYNTH_KEYS, *anchor_keys(SAMPLE_SOURCES_DIR)]:
        source = sources.partition_source(key)
        frame = pl.read_parquet(paths.stage_output("synth_tokenized", key), columns=["synth_id", "exercise", "tokens"])
        for synth_id, exercise, tokens in frame.iter_rows():
            length = len(tokens)
            kept = source_mix_keep(synth_id, source, mix["rates"], mix_out)
            if source == sources.SYNTH_SOURCE:
                cell = skill_bucket(exercise), ctx_bucket(length)
                kept = kept and quota_keep(synth_id, *cell, plan["rates"], quota_out)
            expected[source] += length if kept else 0
    manifest = json.loads(paths.pool_manifest().read_text())
    achieved = {s: e["achieved_tokens"] for s, e in manifest["source_mix"]["sources"].items()}
    for source, entry in mix["sources"].items():
        assert entry["expected_tokens"] == expected[source] == achieved[source], source
    for group, entry in mix["groups"].items():
        assert abs(entry["expected_share"] - entry["target_share"]) <= QUOTA_SHARE_TOLERANCE, group
    assert mix["share_misses"] == []
    assert any(i["group"] == "personality" for i in mix["infeasible"]) and not mix["feasible"]
    deepcoder = mix["sources"]["deepcoder"]
    assert deepcoder["expected_tokens"] <= mix["targets"]["source_caps"]["deepcoder"] * mix["kept_total"] + 1e-6
    assert achieved["deepcoder"] == deepcoder["expected_tokens"] > 0  # exact, not in expectation
    # every row the mix drops is counted by reason in the pool's reports
    dropped = sum(r["report"]["dropped"].get("over_source_share", 0) for r in manifest["shards"])
    assert dropped > 0 and manifest["totals"]["dropped"]["over_source_share"] == dropped


def test_a_stages_stream_holds_the_source_groups_mix_within_one_point(built_mixed):
    """With anchor sources in the pool, every window of P2's stream drawn and looked up in the pool's parts and
    trios: tokens by source group (and skill and ctx bucket) within 1 point of the stage's targets."""
    curriculum = built_mixed[2].curriculum_dir()
    stream = StageStream.from_args(read_stage_args(curriculum / "P2.args"), create_attention_mask=False)
    measured = measured_mix(stream, curriculum.parent)
    targets = stage_targets(curriculum / "P2.json", curriculum.parent)
    assert len([g for g, share in targets["source_group"].items() if share > 0.01]) >= 3  # several groups to hold
    for dimension, tokens in measured.items():
        total = sum(tokens.values())
        for name in set(tokens) | set(targets[dimension]):
            assert abs(tokens[name] / total - targets[dimension][name]) * 100 <= 1.0, (dimension, name)


def test_the_source_mix_is_plotted_in_the_ui_metadata(built_mixed):
    instance, _, _ = built_mixed
    plan_event = instance.get_latest_materialization_event(dg.AssetKey("synth_quota_plan"))
    metadata = plan_event.asset_materialization.metadata
    for group in ("synth", "math", "code", "chat", "personality"):
        assert f"source_share_target_{group}" in metadata and f"source_share_expected_{group}" in metadata
    pool = instance.get_latest_materialization_event(dg.AssetKey("synth_pool_manifest")).asset_materialization
    assert "source_share_achieved_math" in pool.metadata and "source_mix_achieved" in pool.metadata


def test_every_check_of_the_mixed_build_passes(built_mixed):
    instance, _, _ = built_mixed
    outcomes = Counter()
    for run_record in instance.get_runs():
        for entry in instance.all_logs(run_record.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
            evaluation = entry.dagster_event.event_specific_data
            outcomes[evaluation.passed or evaluation.severity == dg.AssetCheckSeverity.WARN] += 1
    assert outcomes[True] > 0 and outcomes[False] == 0, outcomes


def test_a_shard_whose_rows_are_all_dropped_warns_naming_why(built_mixed):
    """Empty is not healthy: the bundled deepcoder shard whose every row lacks a reference answer writes no
    document; its synth_kd_v1 partition shows a WARN naming the input's rows and each step's drops; the others
    pass."""
    instance, _, _ = built_mixed
    verdicts = {}
    for run_record in instance.get_runs():
        for entry in instance.all_logs(run_record.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
            evaluation = entry.dagster_event.event_specific_data
            if evaluation.check_name == "shard_not_empty":
                verdicts[evaluation.partition] = evaluation
    empty = "deepcoder/primeintellect/train-00000-of-00001"
    assert set(verdicts) == set(SYNTH_KEYS + anchor_keys(SAMPLE_SOURCES_DIR))
    warned = verdicts.pop(empty)
    assert not warned.passed and warned.severity == dg.AssetCheckSeverity.WARN
    assert re.search(
        rf"no row written, all \d+ input rows were dropped: "
        rf"synth_harmony dropped \d+ \({drops.DROP_NO_REFERENCE_ANSWER} \d+\)",
        warned.description,
    ), warned.description
    assert all(verdict.passed for verdict in verdicts.values())


def test_the_pools_bucket_balance_counts_the_anchors_tokens_as_planned(built_mixed):
    """With anchor sources the pool's buckets hold the anchors' tokens on top of SYNTH's: the source mix's, so
    bucket_balance reads them as planned, not as something to act on."""
    instance, _, _ = built_mixed
    key = dg.AssetCheckKey(dg.AssetKey("synth_pool_manifest"), "bucket_balance")
    evaluation = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key].event
    verdict = evaluation.dagster_event.event_specific_data
    assert verdict.metadata["verdict"].value in ("balanced", "expected"), verdict.description


def test_the_build_summary_names_every_source_and_the_mix(built_mixed):
    """What build.sh prints after a build with sources: tokens per source of each dataset, the pool's groups with
    target -> achieved shares and why the mix cannot be met (personality has no source)."""
    _, _, paths = built_mixed
    kd = "\n".join(summary_lines(json.loads(paths.megatron_manifest().read_text())))
    assert re.search(r"tokens per source: .*oasst1=\d+ \(\d+\.\d%\).*synth=\d+ \(\d+\.\d%\)", kd)
    pool = "\n".join(summary_lines(json.loads(paths.pool_manifest().read_text())))
    assert re.search(r"tokens per source group \(target share -> achieved\): .*math=\d+ \(8\.2% -> \d+\.\d%\)", pool)
    assert "source mix: no tokens in category personality" in pool
    assert re.search(
        r"capped sources \(achieved share of the pool's tokens\): deepcoder=\d+ \(0\.\d\d% <= cap 0\.50%\)", pool
    )
    assert "tokens per skill bucket (SYNTH's quota target -> achieved, all sources)" in pool
    # every row in that is not written is explained, by reason (the pool's quota and source-mix drops included)
    manifest = json.loads(paths.pool_manifest().read_text())
    [drops_line] = [line for line in pool.splitlines() if line.startswith("drops by reason: ")]
    counted = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", drops_line)}
    assert counted == manifest["totals"]["dropped"] and {"over_quota", "over_source_share"} <= set(counted)
    assert manifest["totals"]["rows_in"] == manifest["totals"]["rows_out"] + sum(counted.values())


def test_the_build_summary_opens_with_the_filters_per_exercise_and_the_sampling_plan(built_mixed):
    """What build.sh prints before the datasets' summaries: the quality filters' rows in and drops per exercise
    over every shard (SYNTH's and the anchor sources'), each reason summing to the manifests' totals, then what
    the sampling plan the build wrote keeps."""
    instance, _, paths = built_mixed
    manifests = [paths.megatron_manifest(), paths.distill_manifest(), paths.pool_manifest()]
    out = io.StringIO()
    print_summaries(manifests, out, paths)
    lines = out.getvalue().splitlines()
    kd = json.loads(paths.megatron_manifest().read_text())
    filtered = [json.loads(paths.stage_report("synth_filtered", r["partition"]).read_text()) for r in kd["shards"]]
    rows_in = sum(report["rows_in"] for report in filtered)
    assert lines[0].startswith(f"quality filters (synth_filtered): {rows_in} rows in, ")
    assert lines[0].endswith("; per exercise:")
    exercises = list(itertools.takewhile(lambda line: line.startswith("  "), lines[1:]))
    per_exercise = [re.fullmatch(r"  (.+): (\d+) in, (\d+) dropped \([\d.]+%\): (.*)", line) for line in exercises]
    assert all(per_exercise), exercises
    assert {m[1] for m in per_exercise} >= {"memorization", "mcq"} and len(per_exercise) > 2  # the anchors' too
    assert sum(int(m[2]) for m in per_exercise) == rows_in
    by_reason = Counter()
    for m in per_exercise:
        reasons = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m[4])}
        assert list(reasons) == list(drops.DROP_REASONS_BY_STEP["synth_filtered"])
        assert sum(reasons.values()) == int(m[3])
        by_reason.update(reasons)
    assert dict(by_reason) == {r: kd["totals"]["dropped"].get(r, 0) for r in by_reason}
    plan = json.loads(paths.sampling_plan().read_text())
    rate, kept, seen = plan["rates"]["memorization"], plan["expected_after"]["rows"], plan["before"]["rows"]
    after = len(exercises) + 1
    assert lines[after].startswith(
        f"sampling plan (synth_sampling_plan): memorization keep rate {rate:.4g}, rows kept {kept:.0f} / {seen:.0f} ("
    )
    assert lines[after + 1].startswith("  mix before -> after sampling: memorization ")
    assert lines[after + 2].startswith(f"{kd['dataset']}: ")  # then each dataset's summary

    # and in the UI: a table per shard on synth_filtered, one over every shard on the manifest, the plan's share kept
    def metadata(asset: str, partition: str | None = None) -> dict:
        records = dg.AssetRecordsFilter(dg.AssetKey(asset), asset_partitions=[partition] if partition else None)
        [record] = instance.fetch_materializations(records, limit=1).records
        return record.asset_materialization.metadata

    table = metadata("synth_filtered", kd["shards"][0]["partition"])["drops_by_exercise"].value
    assert table.startswith("**Rows in and dropped per exercise, by this step's reasons**\n\n| exercise | rows in |")
    assert "| `memorization` |" in table
    manifest_table = metadata("synth_kd_v1_manifest")["filter_drops_by_exercise"].value
    assert manifest_table.splitlines()[-1].startswith(f"| all | {rows_in} | ")
    assert metadata("synth_sampling_plan")["rows_kept_share"].value == rounded(kept / seen)  # as the UI shows it


def test_a_removed_source_shard_leaves_no_output_behind(built_mixed):
    """The cleanup finds every output of an anchor shard no longer present, by key (below <stage>/<source>/) and by
    shard number (trio, documents, DistillKit and pool parts), and nothing of the shards still there."""
    _, _, paths = built_mixed
    keys = [*SYNTH_KEYS, *anchor_keys(SAMPLE_SOURCES_DIR)]
    gone = "oasst1/train-00000-of-00001"
    orphans = set(orphaned_outputs(paths, [k for k in keys if k != gone]))
    index = shard_index_from_name(gone)
    assert paths.stage_output("synth_tokenized", gone) in orphans
    assert paths.error_log("synth_harmony", gone) in orphans or not paths.error_log("synth_harmony", gone).exists()
    assert paths.documents_table(index) in orphans and paths.pool_part(index) in orphans
    assert all(gone in str(p) or f"{index:02d}" in p.name for p in orphans), sorted(orphans)
    assert orphaned_outputs(paths, keys) == []


def test_the_mix_targets_are_set_in_the_build_resource_and_hashed_only_with_sources():
    build = SynthKDBuildConfig(synth_share=0.7, anchor_shares={"math": 0.3}, source_caps={"deepcoder": 0.01})
    targets = build.source_mix_targets()
    assert targets.to_dict() == {
        "synth_share": 0.7,
        "category_shares": {"math": 0.3},
        "source_caps": {"deepcoder": 0.01},
    }
    assert "source_mix" not in build.pool_config()  # a SYNTH-only pool's config hash stays what it was
    assert build.pool_config(with_sources=True)["source_mix"]["targets"] == targets.to_dict()
    with pytest.raises(ValueError, match=re.escape("anchor_shares (category_shares) names ['poetry']")):
        SynthKDBuildConfig(anchor_shares={"poetry": 0.1}).source_mix_targets()


def test_files_a_source_does_not_publish_are_named_not_built(tmp_path):
    """A `.jsonl` in a Parquet source's directory (or `.PARQUET`) is not a shard: the inventory names it in its
    warning and `ignored_files` metadata; a README beside the shards is not data and is not named."""
    source_dir = tmp_path / "sources" / "oasst1"
    shutil.copytree(SAMPLE_SOURCES_DIR / "oasst1", source_dir)
    (source_dir / "extra.jsonl").write_text("{}\n")
    (source_dir / "upper.PARQUET").write_bytes(b"")
    (source_dir / "README.md").write_text("the dataset card")
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path), sources_dir=str(tmp_path / "sources"))
    paths = layout.data_layout()
    assert [s.name for s in scan_inputs(paths) if "/" in s.name] == ["oasst1/train-00000-of-00001"]
    assert inventory.ignored_input_files(paths) == [str(source_dir / "extra.jsonl"), str(source_dir / "upper.PARQUET")]
