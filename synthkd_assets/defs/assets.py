"""The per-shard steps and the sampling plan: each asset calls its core rule and reports what it did."""

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.build_summary import plan_keeps
from synthkd_assets.core.distill_io import rows_valid_for, write_distill_shard
from synthkd_assets.core.filters import quality_drop_reasons
from synthkd_assets.core.harmony_artifact import find_range, harmonize_artifact_range
from synthkd_assets.core.inventory import (
    layout_artifact_ranges,
    no_input_file_message,
    scan_inputs,
    shard_index_from_name,
)
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.manifest_builders import kd_shard_record, sampling_plan
from synthkd_assets.core.megatron_io import trio_files
from synthkd_assets.core.memory import return_freed_heap
from synthkd_assets.core.near_dup import (
    ClustersTooOld,
    clusters_rule,
    heldout_matches,
    ids_unseen_by_clusters,
    signed_row_for_row,
    summary_heldout_prompts,
    synth_ids_rule,
)
from synthkd_assets.core.render import FastRenderer
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.round_trip import RoundTripChecker
from synthkd_assets.core.sampling import sampling_rule
from synthkd_assets.core.sources import source_adapter
from synthkd_assets.core.sources.base import harmonize_source_shard
from synthkd_assets.core.stages import (
    RowRule,
    TokenizeStep,
    first_reason,
    harmonize_shard,
    keep_everything,
    select_rows_shard,
    write_megatron_shard,
)
from synthkd_assets.core.steps import run_step
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.core.tokenizer import load_harmony_encoding, load_tiktoken_o200k
from synthkd_assets.defs.checks import (
    DISTILL_ROWS_VALID,
    HARMONY_ROUND_TRIP,
    NEAR_DUP_CONTROLLED_SPEC,
    ROWS_ACCOUNTED,
    SHARD_NOT_EMPTY_SPEC,
    TRIO_ALIGNMENT,
    distill_rows_result,
    harmony_round_trip_result,
    near_dup_controlled_result,
    pool_current_event,
    rows_accounted_result,
    shard_check_spec,
    shard_not_empty_result,
    trio_alignment_result,
)
from synthkd_assets.defs.conventions import synthkd_asset
from synthkd_assets.defs.ingest import latest_raw_versions, o200k_tokenizer, synth_raw
from synthkd_assets.defs.metadata import (
    ROWS_VALID_FOR,
    TRIO_ALIGNED,
    bucket_report_metadata,
    content_version,
    current_sha256,
    files_metadata,
    heldout_matched_record,
    latest_partition_materialization,
    mix_metadata,
    report_metadata,
    table_definition_metadata,
)
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.upstream import (
    partition_records,
    read_clusters,
    read_plan,
    require_current_clusters,
    require_upstream,
    shard_names,
    shard_stage_reports,
    stage_files,
)
from synthkd_contract import constants, drops, sources
from synthkd_contract.harmony_artifact import is_artifact_key
from synthkd_contract.schemas import (
    DISTILL_SCHEMA,
    HARMONY_SCHEMA,
    TOKENIZED_SCHEMA,
    TRIO_COLUMN_DESCRIPTIONS,
    TRIO_SCHEMA,
)


def shard_step(
    deps: list,
    kinds: set[str],
    build_pass: str,
    group_name: str,
    schema: dict,
    checks: tuple = (),
    warnings: tuple[dg.AssetCheckSpec, ...] = (),
):
    """A per-shard step's asset: partitioned by raw shard, checked for rows accounted (and `checks`, blocking;
    `warnings`, WARN specs) in its step, its column schema known before anything is built."""

    def decorate(step: Callable) -> dg.AssetsDefinition:
        specs = [shard_check_spec(name, step.__name__) for name in (ROWS_ACCOUNTED, *checks)] + list(warnings)
        return synthkd_asset(
            build_pass,
            kinds,
            partitions_def=SYNTH_SHARDS,
            deps=deps,
            check_specs=specs,
            group_name=group_name,
            metadata=schema,
        )(step)

    return decorate


def stage_result(
    paths: DataLayout,
    report: ShardReport,
    stage: str,
    checks: tuple[dg.AssetCheckResult, ...] = (),
    step: str | None = None,
    hashed: Mapping[Path, str] | None = None,
    **extra,
) -> dg.MaterializeResult:
    """Publish a stage step's report (after its output and error log) and report it as metadata and checks
    (rows accounted, and `checks`); `step` names the drop reasons reported when they are not the stage's, `hashed`
    the sha256 of its output when the step took it as it published it (`files_metadata`)."""
    out_path, report_path = stage_files(paths, stage, report.shard)
    report.write_json(report_path)
    written = files_metadata([out_path], hashed=hashed)
    metadata = {**report_metadata(report.to_dict(), step or stage), **written, **extra}
    return dg.MaterializeResult(
        metadata=metadata,
        data_version=content_version(metadata, report_path),
        check_results=[rows_accounted_result(report), *checks],
    )


@shard_step([synth_raw], {"parquet", "polars"}, "scan", "synth", table_definition_metadata(HARMONY_SCHEMA))
def synth_harmony(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """Each shard's rows as Harmony messages (schema synth_harmony_v1): for SYNTH, system, user (query +
    reference), assistant analysis (when reasoning is non-blank) and final, verbatim; for a row-group range of a
    synth_harmony_v1 artifact, its own messages as written, system and developer included (docs/contract.md); for
    an anchor source's shard, its adapter's conversation (docs/sources.md). NULs removed and counted."""
    paths = layout.data_layout(build.smoke)
    key = context.partition_key
    source = {s.name: s for s in scan_inputs(paths)}.get(key)
    if source is None:
        raise dg.Failure(no_input_file_message(paths, key))
    out_path, errors = stage_files(paths, "synth_harmony", key)[0], paths.error_log("synth_harmony", key)
    system, max_rows = system_message_dict(), build.caps().max_input_rows
    # the bytes must be those the inventory (or the sensor) reported as synth_raw's version, which this run's
    # lineage records as its input; a shard never reported (no inventory yet) is read as it is now
    scanned = latest_raw_versions(context.instance, [key])[key] or source.sha256
    origin = sources.partition_source(key)
    if is_artifact_key(key):  # a row-group range of the synth_harmony_v1 artifact (docs/contract.md)
        artifact_range = find_range(layout_artifact_ranges(paths), key)
        if artifact_range is None:
            raise dg.Failure(f"partition {key!r}: its row groups are no longer in the artifact {paths.harmony_root}")
        table = build.exercise_table()
        report = harmonize_artifact_range(artifact_range, out_path, scanned, max_rows, errors, table)
        step, extra = "artifact_harmony", {"artifact": str(paths.harmony_root)}
    elif origin != sources.SYNTH_SOURCE:  # an anchor source's shard: its adapter (docs/sources.md)
        adapter = source_adapter(origin)
        report = harmonize_source_shard(Path(source.path), out_path, adapter, key, scanned, max_rows, errors)
        step, extra = "source_harmony", {"source": origin, "source_dataset": adapter.spec.dataset}
    else:
        table = build.exercise_table()
        report = harmonize_shard(Path(source.path), out_path, system, key, scanned, max_rows, errors, table)
        step, extra = "synth_harmony", {}
    return stage_result(paths, report, "synth_harmony", step=step, source_sha256=report.source_sha256, **extra)


def select_rows(
    paths: DataLayout,
    key: str,
    source: str,
    stage: str,
    rule: RowRule,
    plan_sha256: str | None = None,
    checks: tuple[dg.AssetCheckResult, ...] = (),
    metadata: Mapping[str, Any] | None = None,
):
    """A row-selection step (filters, sampling): the rows of `source` that `rule` keeps (`metadata`: reported
    with them)."""
    require_upstream(paths, stage, key, source)
    in_path, out_path = stage_files(paths, source, key)[0], stage_files(paths, stage, key)[0]
    report = select_rows_shard(in_path, out_path, key, rule, paths.error_log(stage, key))
    report.plan_sha256 = plan_sha256
    extra = {**({"plan_sha256": plan_sha256} if plan_sha256 else {}), **(metadata or {})}
    return stage_result(paths, report, stage, checks, **extra)


@shard_step([synth_harmony], {"parquet", "polars"}, "scan", "synth", table_definition_metadata(HARMONY_SCHEMA))
def synth_filtered(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """synth_harmony rows that pass the 001 quality filters: blank synthetic_answer, `result:Failed after maximum
    attempts` in constraints, a `result:` number / MCQ letter inconsistent with the answer's first line (each drop
    counted by reason). Its report's exercise x language counts feed the sampling plan (the scan pass)."""
    paths = layout.data_layout(build.smoke)
    return select_rows(paths, context.partition_key, "synth_harmony", "synth_filtered", quality_drop_reasons)


@synthkd_asset("plan", {"json"}, deps=[synth_filtered, dg.AssetKey("synth_clusters")], group_name="synth")
def synth_sampling_plan(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """The 001 sampling plan (data/synth_sampling_plan/plan.json): from every shard's exercise x language counts
    after the filters and the near-duplicate cap / held-out clusters (synth_clusters), keep rates so that
    memorization <= memorization_cap and non-English <= non_english_max (and >= non_english_min when set; in
    expectation), plus global_keep. One salted hash of synth_id per rule.
    Not automated: a re-plan means rebuilding every shard from synth_sampled on. The UI's "Upstream data" /
    "Unsynced" on it after a shard is rebuilt is by design, no action needed: act only to re-plan (synth_plan_job,
    then ./scripts/build.sh)."""
    paths = layout.data_layout(build.smoke)
    names = [n for n in shard_names(paths) if sources.partition_source(n) == sources.SYNTH_SOURCE]  # 001: SYNTH's
    filtered = partition_records("synth_filtered", {n: stage_files(paths, "synth_filtered", n)[1] for n in names})
    clusters, clusters_sha = read_clusters(paths)
    plan = sampling_plan(filtered, build.targets(), clusters, clusters_sha)
    return publish_plan(
        context,
        paths.sampling_plan(),
        plan,
        "sampling plan cannot meet the targets in expectation",
        plan["notes"],
        **{f"rate_{rule}": rate for rule, rate in plan["rates"].items()},
        rows_before=plan["before"]["rows"],
        rows_expected_after=plan["expected_after"]["rows"],
        rows_kept_share=plan_keeps(plan).kept_share,
        **mix_metadata({"before": plan["before"], "expected after": plan["expected_after"]}),
    )


def publish_plan(
    context: dg.AssetExecutionContext,
    path: Path,
    plan: dict,
    warning: str,
    why: object,
    feasible: bool | None = None,
    **metadata,
) -> dg.MaterializeResult:
    """Write a global plan (sampling, quota) atomically; its sha256 is its data version, so the shards built
    under it go stale exactly when it changes. An infeasible plan (`feasible`, default the plan's own) is written
    and said, never hidden."""
    digest = mf.write_manifest(path, plan)
    feasible = plan["feasible"] if feasible is None else feasible
    if not feasible:
        context.log.warning(f"{warning}: {why}")
    return dg.MaterializeResult(
        metadata={
            "plan_sha256": digest,
            "path": dg.MetadataValue.path(str(path)),
            "feasible": feasible,
            "notes": dg.MetadataValue.json(plan["notes"]),
            **metadata,
        },
        data_version=dg.DataVersion(digest),
    )


@shard_step(
    # synth_signatures: its rows are matched against the held-out prompts, so it runs first in a shard's run
    [synth_filtered, dg.AssetKey("synth_signatures"), dg.AssetKey("synth_clusters"), synth_sampling_plan],
    {"parquet", "polars"},
    "build",
    "synth",
    table_definition_metadata(HARMONY_SCHEMA),
    warnings=(NEAR_DUP_CONTROLLED_SPEC,),
)
def synth_sampled(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """synth_filtered rows kept by the near-duplicate clusters (not past their cluster's max_per_cluster, not held
    out) and by the sampling plan: per rule (memorization, english / non_english, global) a salted sha256 of
    synth_id against the plan's rate, so independent of row order and shard layout."""
    paths = layout.data_layout(build.smoke)
    plan, plan_sha = read_plan(paths, build.targets())
    require_current_clusters(paths, plan)
    key = context.partition_key
    # the 001 mixture is SYNTH's: an anchor shard's rows are only capped by the clusters (its mix is the pool's)
    rule = sampling_rule(plan["rates"]) if sources.partition_source(key) == sources.SYNTH_SOURCE else keep_everything
    clusters = stage_files(paths, "synth_clusters", key)[0]
    if clusters.is_file():  # a shard added after the clusters in force is sampled whole, like under the plan
        rule = first_reason(clusters_rule(clusters), rule)
    require_upstream(paths, "synth_sampled", key, "synth_filtered", "synth_signatures")
    filtered, signatures = stage_files(paths, "synth_filtered", key)[0], stage_files(paths, "synth_signatures", key)[0]
    unseen, rows = ids_unseen_by_clusters(filtered, clusters)
    if not signed_row_for_row(filtered, signatures):  # a held-out prompt under a new synth_id would pass unsigned
        raise dg.Failure(
            f"synth_sampled partition {key!r}: {signatures} does not sign the rows of {filtered} (another shard's "
            f"rows, or an older version of them): materialize synth_signatures for {key!r} first"
        )
    # every row whose prompt is a held-out one is held out, whatever its synth_id (docs/near-dup.md "Rebuilds")
    try:
        held, threshold = summary_heldout_prompts(mf.read_json(paths.clusters_summary()), paths.clusters_summary())
    except ClustersTooOld as error:
        raise dg.Failure(str(error)) from None
    matches = heldout_matches(signatures, held, threshold)
    rule = first_reason(synth_ids_rule(matches, drops.DROP_HELDOUT), rule)
    copies = matches - {entry["synth_id"] for entry in held}  # held out here, not by the clusters' decisions
    warning = near_dup_controlled_result(key, len(unseen), rows, len(copies))
    # what validation_sets_not_trained need not match again while the clusters and these signatures stand
    signed = latest_partition_materialization(context.instance, dg.AssetKey("synth_signatures"), key)
    matched = heldout_matched_record(plan["near_dup"]["clusters_sha256"], current_sha256(signed, signatures), matches)
    return select_rows(paths, key, "synth_filtered", "synth_sampled", rule, plan_sha, (warning,), matched)


@shard_step(
    [synth_sampled, o200k_tokenizer],
    {"parquet", "tiktoken"},
    "build",
    "synth",
    table_definition_metadata(TOKENIZED_SCHEMA),
    checks=(HARMONY_ROUND_TRIP,),
)
def synth_tokenized(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """tokens / loss_mask / span_id per conversation (label-aligned masks), by the fast renderer: byte-identical to
    openai-harmony's training render, at tiktoken speed. The written tokens are then parsed back by openai-harmony
    against the messages they came from (harmony_round_trip)."""
    paths = layout.data_layout(build.smoke)
    key = context.partition_key
    require_upstream(paths, "synth_tokenized", key, "synth_sampled", "o200k_tokenizer")
    encoding, vocabulary = load_harmony_encoding(paths.tokenizer_dir()), load_tiktoken_o200k(paths.tokenizer_dir())
    renderer = FastRenderer(encoding, vocabulary, build.encode_threads)
    in_path, out_path = stage_files(paths, "synth_sampled", key)[0], stage_files(paths, "synth_tokenized", key)[0]
    errors = paths.error_log("synth_tokenized", key)
    step = TokenizeStep(in_path, out_path, renderer, build.exercise_table(), RoundTripChecker(encoding, vocabulary))
    report = run_step(step, key, errors)
    round_trip = harmony_round_trip_result(step.round_trip)
    return_freed_heap()  # the round trip's numpy temporaries, a batch at a time (core/memory.py)
    bucket_metadata = bucket_report_metadata(report.to_dict())
    return stage_result(paths, report, "synth_tokenized", (round_trip,), hashed=step.hashed, **bucket_metadata)


@shard_step(
    [synth_tokenized],
    {"megatron", "numpy"},
    "build",
    "megatron",
    table_definition_metadata(TRIO_SCHEMA, TRIO_COLUMN_DESCRIPTIONS),
    checks=(TRIO_ALIGNMENT,),
    warnings=(SHARD_NOT_EMPTY_SPEC,),
)
def synth_kd_v1(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """Megatron IndexedDataset trio (tokens int32 / lossmask uint8 / span uint8) of this shard in train/ and
    valid/, split by a salted sha256 of synth_id."""
    paths = layout.data_layout(build.smoke)
    key, root = context.partition_key, paths.megatron_root()
    shard_index = shard_index_from_name(key)
    require_upstream(paths, "synth_kd_v1", key, "synth_tokenized")
    tokenized = stage_files(paths, "synth_tokenized", key)[0]
    errors = paths.error_log("synth_kd_v1", key)
    report, inventories = write_megatron_shard(tokenized, root, shard_index, key, build.caps(), errors_log=errors)
    mf.write_manifest(paths.shard_record(shard_index), kd_shard_record(key, report, inventories))
    written = [path for split in constants.SPLITS for path in trio_files(root / split, shard_index)]
    records = [paths.shard_record(shard_index), paths.documents_table(shard_index)]
    hashed = {root / f.path: f.sha256 for inventory in inventories for f in inventory.files}  # as they were published
    aligned = trio_alignment_result(root, inventories)
    metadata = {
        **report_metadata(report.to_dict(), "synth_kd_v1"),
        **files_metadata(written, root, records, hashed),
        "dataset_root": dg.MetadataValue.path(str(root)),
    }
    if aligned.passed:  # what shards_readable_by_megatron need not read again
        metadata[TRIO_ALIGNED] = True
    if paths.pool_manifest().is_file():  # a published pool whose part of this shard this run may have outdated
        stale = pool_current_event(context.instance, key, paths.pool_name())
        if stale is not None:
            context.log_event(stale)
    return dg.MaterializeResult(
        metadata=metadata,
        data_version=content_version(metadata, paths.shard_record(shard_index)),
        check_results=[
            rows_accounted_result(report),
            aligned,
            shard_not_empty_result(key, {**shard_stage_reports(paths, key), "synth_kd_v1": report.to_dict()}),
        ],
    )


@shard_step(
    [synth_tokenized],
    {"parquet", "huggingface"},
    "build",
    "distill",
    table_definition_metadata(DISTILL_SCHEMA),
    checks=(DISTILL_ROWS_VALID,),
)
def synth_distill(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """The DistillKit/TRL dataset of seed 001 for this shard: `<root>/{train,validation}/part-XXXXX.parquet` (id,
    source, input_ids, labels, attention_mask, spans) derived from the synth_tokenized arrays that synth_kd_v1
    reads; assistant_token_start asserted against render_conversation_for_completion (core/distill_io.py
    CompletionPrefixes); conversations over
    max_seq_len dropped and counted; split 99/1 by a salted hash of synth_id."""
    paths = layout.data_layout(build.smoke)
    key, root = context.partition_key, paths.distill_root()
    shard_index = shard_index_from_name(key)
    require_upstream(paths, "synth_distill", key, "synth_tokenized", "synth_sampled", "o200k_tokenizer")
    tokenized, sampled = stage_files(paths, "synth_tokenized", key)[0], stage_files(paths, "synth_sampled", key)[0]
    result = write_distill_shard(
        tokenized,
        sampled,
        root,
        shard_index,
        key,
        load_harmony_encoding(paths.tokenizer_dir()),
        build.max_seq_len,
        build.distill_valid_fraction,
        build.caps(),
        paths.error_log(paths.distill_name(), key),
    )
    record_path = paths.distill_records_dir() / f"{key}.json"
    mf.write_manifest(record_path, result.record(key, shard_index, paths.recorded(root)))
    rows_valid = distill_rows_result(result)
    metadata = {
        **report_metadata(result.report.to_dict(), "synth_distill"),
        **files_metadata([root / f["path"] for f in result.files], root),
        **{f"max_len_{split}": max(lengths, default=0) for split, lengths in result.lengths.items()},
        "prefix_rendered_by_openai_harmony": result.prefixes_checked,
        "dataset_root": dg.MetadataValue.path(str(root)),
    }
    if rows_valid.passed:  # what the manifest's row checks need not read again (distill_row_checks)
        metadata[ROWS_VALID_FOR] = rows_valid_for(build.max_seq_len, build.distill_valid_fraction)
    return dg.MaterializeResult(
        metadata=metadata,
        data_version=content_version(metadata, record_path),
        check_results=[rows_accounted_result(result.report), rows_valid],
    )
