"""What Dagster users look for on assets and checks: descriptions, kinds, owners, tags, the standard table
metadata keys, zero-filled drop counts, and check results that say in words what failed and where."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import dagster as dg

from synthkd_assets.core.problems import Problems, problem_total
from synthkd_assets.definitions import defs
from synthkd_assets.defs.checks import verdict_text
from synthkd_assets.defs.metadata import files_sha256_of
from synthkd_assets.defs.resources import SynthKDLayout, synthkd_resources
from synthkd_contract import constants, drops
from synthkd_contract.manifest_seal import sha256_file
from tests.helpers import ALL_ASSETS, REPO_ROOT, SAMPLE_RAW_DIR, check_evaluations

TABLE_ASSETS = ("synth_harmony", "synth_filtered", "synth_sampled", "synth_tokenized", "synth_kd_v1", "synth_distill")
MANIFESTS = ("synth_harmony_manifest", "synth_kd_v1_manifest", "synth_distill_manifest")


def all_check_specs() -> list[dg.AssetCheckSpec]:
    definitions = defs()
    return [
        spec
        for definition in [*definitions.assets, *definitions.asset_checks]
        if hasattr(definition, "check_specs")
        for spec in definition.check_specs
    ]


def latest(instance: dg.DagsterInstance, asset: str, partition: str | None = None) -> dict:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition] if partition else None),
        limit=1,
    ).records
    assert records, f"{asset} {partition} was never materialized"
    return records[0].asset_materialization.metadata


def test_every_check_has_a_description():
    specs = all_check_specs()
    assert len(specs) == 37
    assert [s.key.to_user_string() for s in specs if not (s.description or "").strip()] == []


def test_placeholders_in_descriptions_are_in_code_spans():
    """The UI renders descriptions as Markdown, where a bare `<pool>` is an HTML tag and vanishes ("per stage,
    /curriculum/.json", a new user read): every `<name>` of an asset or check description is in a code span."""
    descriptions = {spec.key.to_user_string(): spec.description for spec in defs().resolve_all_asset_specs()}
    descriptions |= {spec.key.to_user_string(): spec.description for spec in all_check_specs()}
    bare = {
        key: re.findall(r"<[A-Za-z_][^>]*>", re.sub(r"`[^`]*`", "", text or "")) for key, text in descriptions.items()
    }
    assert {key: found for key, found in bare.items() if found} == {}


def test_every_asset_has_kinds_owners_and_a_pass_tag():
    specs = defs().resolve_all_asset_specs()
    assert {s.key.to_user_string() for s in specs} >= set(TABLE_ASSETS) | set(MANIFESTS)
    for spec in specs:
        assert spec.kinds, spec.key
        assert spec.owners == ["team:synthkd"], spec.key
        assert spec.tags.get("synthkd/pass") in {
            "inventory",
            "scan",
            "plan",
            "build",
            "manifest",
            "quota",
            "pool",
            "pool_manifest",
        }, spec.key
    kinds = {s.key.to_user_string(): s.kinds for s in specs}
    assert (
        "megatron" in kinds["synth_kd_v1"]
        and "parquet" in kinds["synth_harmony"]
        and "python" in kinds["synth_tokenized"]
    )


def test_table_assets_declare_their_column_schema():
    specs = {s.key.to_user_string(): s for s in defs().resolve_all_asset_specs()}

    def columns(asset: str) -> list[str]:
        schema = specs[asset].metadata["dagster/column_schema"]
        assert isinstance(schema, dg.TableSchema), asset
        return [c.name for c in schema.columns]

    assert all(columns(asset) for asset in TABLE_ASSETS)
    assert columns("synth_kd_v1") == ["tokens", "lossmask", "span"]
    assert "input_ids" in columns("synth_distill") and "messages_json" in columns("synth_harmony")


def test_table_materializations_report_row_count_schema_uri_and_every_drop_reason(built_sample):
    instance, layout, data_dir = built_sample
    for asset in TABLE_ASSETS:
        metadata = latest(instance, asset, "synth_002")
        assert metadata["dagster/row_count"].value == metadata["rows_out"].value, asset
        assert metadata["dagster/column_schema"].schema.columns, asset
        uri = metadata["dagster/uri"].value
        assert uri.startswith("file://") and str(data_dir.resolve()) in uri, (asset, uri)
        # one table of the reasons that dropped rows (not a key per reason, mostly 0), adding up to rows_dropped
        assert not [key for key in metadata if key.startswith("dropped_")], asset
        table = drop_table_rows(metadata)
        assert sum(table.values()) == metadata["rows_dropped"].value, asset
        assert metadata["drops_by_reason"].value.startswith(
            f"**Rows dropped by reason, of {metadata['rows_in'].value:,}"
        )
    harmony = latest(instance, "synth_harmony", "synth_002")
    assert harmony["drops_by_reason"].value.endswith(": none")  # nothing dropped: said, no empty table
    assert all(f"sanitized_{key}" in harmony for key in drops.SANITIZED_KEYS)
    tokenized = latest(instance, "synth_tokenized", "synth_002")
    assert all(f"tokens_{span}" in tokenized for span in constants.SPAN_NAMES.values())
    megatron_root = layout.data_layout().megatron_root()
    assert latest(instance, "synth_kd_v1", "synth_002")["dagster/uri"].value == megatron_root.resolve().as_uri()


def test_every_file_a_step_wrote_has_its_own_sha256_in_its_metadata(built_sample):
    """Splits and pool cells reuse file names (train/ and valid/shard_02_tokens.bin): keyed by name alone, the UI
    listed one sha256 per name, another file's. Each key is the file's path under `dagster/uri`; a dataset's
    shard lists its record and documents table too, under the dataset's root whatever splits it wrote.
    On the sample synth_kd_v1's valid split is empty (0.001 of 1153 rows): its shard writes train's trio, record and
    documents; synth_distill's train/ and validation/ parts of a shard share their name."""
    instance, layout, _ = built_sample
    for asset, files_written in (("synth_kd_v1", 8), ("synth_distill", 2), ("synth_pool", None), ("synth_sampled", 1)):
        metadata = latest(instance, asset, "synth_002")
        where = Path(metadata["dagster/uri"].value.removeprefix("file://"))
        base = where.parent if where.is_file() else where
        listed = files_sha256_of(metadata)
        assert files_written is None or len(listed) == files_written, (asset, sorted(listed))
        assert {name: sha256_file(base / name) for name in listed} == listed, asset
        assert sum((base / name).stat().st_size for name in listed) == metadata["bytes_written"].value, asset
    pool = files_sha256_of(latest(instance, "synth_pool", "synth_002"))
    assert len([name for name in pool if name.endswith("_tokens.bin")]) > 1  # one per pool cell the shard fills
    assert "shards/shard_02.json" in pool
    kd = files_sha256_of(latest(instance, "synth_kd_v1", "synth_002"))
    assert {"shards/shard_02.json", "shards/shard_02_documents.parquet"} <= set(kd)
    distill = files_sha256_of(latest(instance, "synth_distill", "synth_002"))
    assert set(distill) == {"train/part-00002.parquet", "validation/part-00002.parquet"}  # one name, two files
    paths = layout.data_layout()
    roots = {
        "synth_kd_v1": paths.megatron_root(),
        "synth_distill": paths.distill_root(),
        "synth_pool": paths.pool_root(),
    }
    for asset, root in roots.items():  # every shard's, one with no valid rows included
        for key in instance.get_dynamic_partitions("synth_shards"):
            assert latest(instance, asset, key)["dagster/uri"].value == root.resolve().as_uri(), (asset, key)


def test_every_materialization_carries_a_data_version_of_its_bytes(built_sample):
    """Staleness follows content: each asset says its own data version (a hash of what it wrote), never
    Dagster's default from code and input versions, which changed when an input did and the output did not."""
    instance, _, _ = built_sample
    for record in instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("synth_sampled")), 100
    ).records:
        assert record.asset_materialization.tags["dagster/data_version_is_user_provided"] == "true"
    for key in instance.get_asset_keys():
        event = instance.get_latest_materialization_event(key)
        if event is not None and key.to_user_string() != "synth_raw":  # external: reported, with the file's sha256
            assert event.asset_materialization.tags.get("dagster/data_version_is_user_provided") == "true", key


def test_a_build_runs_pass_tag_is_the_tag_of_the_assets_it_materializes(built_sample):
    """Filtering runs by `synthkd/pass=manifest` finds the manifests' runs: a run's tag and its assets' agree (the
    build's runs were tagged `manifests` / `pool_manifests`, which no asset carries)."""
    instance, _, _ = built_sample
    asset_pass = {spec.key: spec.tags["synthkd/pass"] for spec in defs().resolve_all_asset_specs()}
    seen = set()
    for run in instance.get_runs():
        tag = run.tags.get("synthkd/pass")
        events = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        planned = {asset_pass[event.dagster_event.asset_key] for event in events}
        assert tag is not None and planned == {tag}, (tag, planned)
        seen.add(tag)
    assert {"manifest", "pool_manifest", "scan", "build"} <= seen


def drop_table_rows(metadata) -> dict[str, int]:
    """reason -> rows of a materialization's drops_by_reason table."""
    rows = re.findall(r"^\| `([a-z0-9_]+)` \| ([0-9,]+) \|", metadata["drops_by_reason"].value, flags=re.MULTILINE)
    return {reason: int(count.replace(",", "")) for reason, count in rows}


def test_every_drop_reason_seen_is_registered(built_sample):
    """The registry is complete: no step reports a reason it does not list (its table row would have no meaning)."""
    instance, _, _ = built_sample
    for asset in TABLE_ASSETS:
        for key in ("synth_001", "synth_002", "synth_003", "synth_004", "synth_005"):
            reported = set(drop_table_rows(latest(instance, asset, key)))
            assert reported <= set(drops.DROP_REASONS_BY_STEP[asset]), asset


def test_manifests_report_rows_in_out_and_every_drop_reason(built_sample):
    instance, _, _ = built_sample
    every_reason = {r for reasons in drops.DROP_REASONS_BY_STEP.values() for r in reasons}
    for asset in MANIFESTS:
        metadata = latest(instance, asset)
        assert metadata["rows_in"].value == 3149, asset
        assert set(drop_table_rows(metadata)) <= every_reason, asset
        assert sum(drop_table_rows(metadata).values()) == metadata["rows_dropped"].value, asset
        assert metadata["rows_in"].value == metadata["rows_out"].value + metadata["rows_dropped"].value, asset
    # the one-sided language rule samples no English row out of the sample: a reason with no row is not listed
    assert "sampled_out_english" not in drop_table_rows(latest(instance, "synth_kd_v1_manifest"))


def test_per_shard_check_results_name_their_partition(built_sample, own_instance, tmp_path):
    instance, (_, _, data_dir) = own_instance, built_sample
    shutil.copytree(data_dir, tmp_path / "data")
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path / "data"))
    result = dg.materialize(
        ALL_ASSETS,
        selection=dg.AssetSelection.assets("synth_kd_v1") | dg.AssetSelection.checks_for_assets("synth_kd_v1"),
        partition_key="synth_003",
        instance=instance,
        resources=synthkd_resources(layout),
    )
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evaluations) == {"rows_accounted", "trio_alignment", "shard_not_empty"}
    for evaluation in evaluations.values():
        assert evaluation.passed
        assert evaluation.metadata["partition"].value == "synth_003"
        assert evaluation.description.startswith("partition synth_003: passed")
    assert "train/shard_03 (" in evaluations["trio_alignment"].description


def test_a_failed_check_says_what_failed_and_which_file(built_sample, own_instance, tmp_path):
    instance, (_, _, data_dir) = own_instance, built_sample
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy))
    tokens = layout.data_layout().megatron_root() / "train" / "shard_02_tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-8])
    evaluations = check_evaluations(instance, layout, "synth_kd_v1_manifest")
    for name in ("manifest_provenance", "shards_readable_by_megatron"):
        assert not evaluations[name].passed
        text = evaluations[name].description
        assert text.startswith("FAILED, 1 problem: ") and "shard_02" in text and "train" in text, text
    assert "train/shard_02_tokens.bin has" in evaluations["manifest_provenance"].description  # names the file and why
    assert evaluations["no_split_leakage"].description.startswith("passed: no synth_id in both splits")


def test_verdict_text_quotes_the_first_problems_and_counts_the_rest():

    problems = [f"part-0000{i}.parquet (train): row {i} bad" for i in range(8)]
    text = verdict_text(problems, partition="synth_07")
    assert text.startswith("partition synth_07: FAILED, 8 problems: part-00000.parquet (train): row 0 bad;")
    assert "row 4 bad" in text and "row 5 bad" not in text and "(and 3 more" in text
    assert (
        verdict_text([], "3 rows in = 3 out + 0 dropped", "synth_001")
        == "partition synth_001: passed: 3 rows in = 3 out + 0 dropped"
    )
    # a finder that lists a bounded number of lines counts them all: the verdict and problem_count say the total
    listed = Problems(problems[:2] + ["... and 700 more duplicated synth_ids"], total=702)
    assert verdict_text(listed).startswith("FAILED, 702 problems: ") and "(and 697 more" in verdict_text(listed)
    counted = Problems()
    for problem in problems:
        counted.add(problem, limit=3)
    assert counted == problems[:3] and problem_total(counted) == 8
    # adding lines the list way keeps the count: +, +=, append
    assert problem_total(counted + ["another"]) == 9 and problem_total(["a"] + ["b"]) == 2
    counted += ["another"]
    counted.append("one more")
    assert problem_total(counted) == 10 and verdict_text(counted).startswith("FAILED, 10 problems: ")


def test_the_run_tags_we_spell_are_dagsters_own():
    """synthkd_assets/defs/tags.py names Dagster's documented run tags, which Dagster exports no public constant
    for; an upgrade that renames one fails here. (Private imports: dagster._core.storage.tags and
    dagster._core.definitions.materialize hold the only definitions of these names.)"""
    from dagster._core.definitions.materialize import EPHEMERAL_JOB_NAME
    from dagster._core.storage import tags as dagster_tags

    from synthkd_assets.defs import tags

    assert tags.PARTITION_TAG == dagster_tags.PARTITION_NAME_TAG
    assert tags.RUN_KEY_TAG == dagster_tags.RUN_KEY_TAG
    assert tags.MAX_RETRIES_TAG == dagster_tags.MAX_RETRIES_TAG
    assert tags.WILL_RETRY_TAG == dagster_tags.WILL_RETRY_TAG
    assert tags.AUTO_RETRY_RUN_ID_TAG == dagster_tags.AUTO_RETRY_RUN_ID_TAG
    assert tags.RETRY_NUMBER_TAG == dagster_tags.RETRY_NUMBER_TAG
    assert tags.EPHEMERAL_JOB_NAME == EPHEMERAL_JOB_NAME


def test_the_shipped_packages_import_nothing_private_of_dagster():
    found = {
        str(path.relative_to(REPO_ROOT))
        for package in ("synthkd_assets", "synthkd_contract", "synthkd_training")
        for path in (REPO_ROOT / package).rglob("*.py")
        if re.search(r"^\s*(from|import) dagster\._", path.read_text(), re.MULTILINE)
    }
    assert found == set()
