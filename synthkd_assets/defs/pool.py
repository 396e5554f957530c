"""The sequence pool of seed 002: the quota plan over the B x C grid, the pool per shard, its curriculum and
its sampling manifest. Each asset calls its core rule (core/quota.py, core/pool.py, core/curriculum.py,
core/manifest_builders.py) and reports tokens per bucket as metadata."""

from pathlib import Path
from typing import Any

import dagster as dg

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.cleanup import unpublish_pool
from synthkd_assets.core.curriculum import (
    plan_stage,
    remove_other_stages_files,
    scan_pool_prefixes,
    stage_cache_dir,
    stage_stream_report,
    write_stage_files,
)
from synthkd_assets.core.dataset_manifest import write_sealed_manifest
from synthkd_assets.core.inventory import shard_index_from_name
from synthkd_assets.core.layout import POOL_PARTS_SUBDIR, DataLayout
from synthkd_assets.core.manifest_builders import (
    heldout_section,
    pool_dataset_files,
    pool_manifest,
    require_one_quota_plan,
    require_quota_plan,
)
from synthkd_assets.core.pool import PoolShard, write_pool_shard
from synthkd_assets.core.quota import (
    excluded_ids,
    keeps_nothing_reason,
    plan_quota_selection,
    planned_bucket_tokens,
    quota_config,
)
from synthkd_assets.core.quota_rows import tokenized_quota_rows
from synthkd_assets.core.source_mix import (
    BinnedRows,
    reports_by_source,
    source_mix_config,
    source_mix_plan,
    tokenized_row_lengths,
)
from synthkd_assets.core.valuation import valuation_manifest
from synthkd_assets.defs.assets import publish_plan, shard_step, synth_sampled, synth_tokenized
from synthkd_assets.defs.checks import (
    BUCKET_BALANCE_SPEC,
    POOL_CURRENT_SPEC,
    POOL_PUBLISHED_SPEC,
    POOL_TRIO_ALIGNMENT,
    bucket_balance_result,
    pool_current_result,
    pool_published_result,
    pool_trio_alignment_result,
    pool_unpublished_events,
    rows_accounted_result,
    stale_pool_shards,
    write_gated_manifest,
)
from synthkd_assets.defs.conventions import synthkd_asset
from synthkd_assets.defs.ingest import o200k_tokenizer
from synthkd_assets.defs.manifests import dataset_inputs, synth_harmony_manifest
from synthkd_assets.defs.metadata import (
    bucket_grid_metadata,
    bucket_report_metadata,
    content_version,
    dataset_manifest_metadata,
    files_metadata,
    language_exercise_metadata,
    partitions_hashed_files,
    report_metadata,
    skill_share_metadata,
    source_mix_metadata,
    table_definition_metadata,
)
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.upstream import partition_records, read_quota_plan, require_upstream, shard_names, stage_files
from synthkd_contract import sources
from synthkd_contract.manifest_seal import file_record, read_sealed_manifest
from synthkd_contract.schemas import POOL_SCHEMA


def quota_plan_of(paths: DataLayout, build: SynthKDBuildConfig, instance: dg.DagsterInstance) -> dict:
    """The quota plan the configured targets give over every shard's synth_tokenized report: the skill grid
    (SYNTH's), and with anchor sources the source mix on top. What synth_quota_plan writes, and what the pool
    manifest checks the plan in force against. Each shard's row sizes are trusted by the sha256 its tokenize step
    recorded in `instance` while the shard's stat is unchanged (`current_row_sizes`), not by hashing it again."""
    names = shard_names(paths)
    reports = partition_records("synth_tokenized", {n: stage_files(paths, "synth_tokenized", n)[1] for n in names})
    by_source = reports_by_source(reports)
    files = {s: [stage_files(paths, "synth_tokenized", n)[0] for n in parts] for s, parts in by_source.items()}
    hashed = partitions_hashed_files(instance, synth_tokenized.key, by_source.get(sources.SYNTH_SOURCE, []))
    with tokenized_quota_rows(files.get(sources.SYNTH_SOURCE, []), build.exercise_table(), hashed) as rows:
        selected = plan_quota_selection(rows, build.quota_targets())  # docs/pool.md "How the quota selects rows"
        plan = {**selected, "shards": sorted(reports)}
        if keeps_nothing_reason(plan) is None and set(by_source) - {sources.SYNTH_SOURCE}:
            # anchor sources: the source mix on top (a SYNTH-only plan has none), every source's rows selected exactly
            rows_of = {s: tokenized_row_lengths(found) for s, found in files.items() if s != sources.SYNTH_SOURCE}
            # SYNTH's kept rows by source-mix hash bin: as many as the corpus keeps, one file's rows at a time
            with rows.kept(plan["rates"], excluded_ids(plan), sources.SOURCE_MIX_SALT, one_bucket=True) as kept:
                rows_of[sources.SYNTH_SOURCE] = BinnedRows(kept)
                plan["source_mix"] = source_mix_plan(plan, by_source, build.source_mix_targets(), rows_of)
    return plan


QUOTA_INPUTS_FINGERPRINT = "quota_inputs_fingerprint"  # synth_quota_plan's metadata: what its plan was made from


def quota_inputs_fingerprint(paths: DataLayout, build: SynthKDBuildConfig) -> str | None:
    """`mf.inputs_fingerprint` of what `quota_plan_of` reads (every shard's synth_tokenized file, report and row
    sizes) and the settings it applies; None while one of those files is missing (`quota_plan_of` says which)."""
    files = [path for name in shard_names(paths) for path in stage_files(paths, "synth_tokenized", name)]
    files += [rows for name in shard_names(paths) if (rows := paths.stage_rows("synth_tokenized", name)).is_file()]
    config = {
        "quota": quota_config(build.quota_targets(), build.exercise_table()),
        "source_mix": source_mix_config(build.source_mix_targets()),
    }
    try:
        return mf.inputs_fingerprint(files, config)
    except FileNotFoundError:
        return None


def require_current_quota_plan(
    context: dg.AssetExecutionContext, paths: DataLayout, build: SynthKDBuildConfig, plan: dict, plan_sha: str
) -> None:
    """ManifestInputError unless `plan` (sha256 `plan_sha`) is the one the configured targets give over the current
    shards (`require_quota_plan`). It is, without reading the shards again, when synth_quota_plan's latest
    materialization wrote these bytes from inputs of the same fingerprint; otherwise it is computed afresh and
    compared (docs/contract.md "What each consumer verifies")."""
    event = context.instance.get_latest_materialization_event(synth_quota_plan.key)
    recorded = event.asset_materialization.metadata if event and event.asset_materialization else {}
    made_from, wrote = recorded.get(QUOTA_INPUTS_FINGERPRINT), recorded.get("plan_sha256")
    if made_from is not None and wrote is not None and wrote.value == plan_sha:
        if made_from.value == quota_inputs_fingerprint(paths, build):
            context.log.info(f"quota plan {plan_sha[:12]}: the one synth_quota_plan wrote, from these inputs")
            return
    require_quota_plan(plan, quota_plan_of(paths, build, context.instance), paths.quota_plan())


@synthkd_asset("quota", {"json"}, deps=[synth_tokenized], group_name="pool")
def synth_quota_plan(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """The B x C quota grid (docs/pool.md#the-quota-grid-on-tokens) on tokens (004): from every SYNTH shard's tokens per
    (skill bucket, ctx bucket) after the 001 selection, keep rates per cell that make the pool's skill mix the
    configured one (or, with balance_tokens, truncate every bucket to the smallest), downsampling only; a bucket the
    data leaves empty is reported as infeasible. With anchor sources, the source mix on top: a keep rate per source so
    that SYNTH and each anchor category hold their token shares under the caps (docs/sources.md). Salted hashes of
    synth_id; not automated, like the sampling plan: its "Upstream data" / "Unsynced" in the UI after a shard is
    rebuilt is by design, no action needed unless you mean to re-plan (synth_quota_job, then the pool pass)."""
    paths = layout.data_layout(build.smoke)
    made_from = quota_inputs_fingerprint(paths, build)  # taken first: a shard rebuilt while reading shows later
    plan = quota_plan_of(paths, build, context.instance)
    if reason := keeps_nothing_reason(plan):
        raise ValueError(f"invalid quota targets: {reason}")
    mix_metadata = source_mix_metadata(plan["source_mix"]) if "source_mix" in plan else {}
    return publish_plan(
        context,
        paths.quota_plan(),
        plan,
        "quota plan cannot meet the skill mix or the source mix",
        plan["infeasible"] + plan.get("source_mix", {}).get("infeasible", []),
        plan["feasible"] and plan.get("source_mix", {}).get("feasible", True),
        **mix_metadata,
        infeasible=dg.MetadataValue.json(plan["infeasible"]),
        **bucket_grid_metadata(plan["available"]["tokens"], "available"),
        **bucket_grid_metadata(plan["expected"]["tokens"], "expected"),
        **{f"rate_{b}": next(iter(cells.values())) for b, cells in plan["rates"].items()},
        **({QUOTA_INPUTS_FINGERPRINT: made_from} if made_from is not None else {}),
    )


@shard_step(
    [synth_tokenized, synth_sampled, dg.AssetKey("synth_clusters"), synth_quota_plan],
    {"parquet", "megatron"},
    "pool",
    "pool",
    table_definition_metadata(POOL_SCHEMA),
    checks=(POOL_TRIO_ALIGNMENT,),
)
def synth_pool(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """The sequence pool (docs/pool.md#what-the-pool-holds) of this shard: every conversation the quota grid keeps, as
    one Parquet row (UUID, source, skill and ctx bucket, Harmony messages, exact prompt tokens, analysis / final token
    ranges, sampling_weight, cluster_id and near_dup_hash from synth_clusters; scorer columns null) and as Megatron
    trios per (split, B_C cell) for curriculum blends; rows over quota dropped and counted."""
    paths = layout.data_layout(build.smoke)
    key = context.partition_key
    shard_index = shard_index_from_name(key)
    require_upstream(paths, "synth_pool", key, "synth_tokenized", "synth_sampled")
    plan, plan_sha = read_quota_plan(paths, build.quota_targets())
    tokenized, sampled = stage_files(paths, "synth_tokenized", key)[0], stage_files(paths, "synth_sampled", key)[0]
    part, trio_root = paths.pool_part(shard_index), paths.pool_trio_root()
    clusters = stage_files(paths, "synth_clusters", key)[0]
    shard = PoolShard(
        tokenized,
        sampled,
        part,
        trio_root,
        shard_index,
        key,
        plan["rates"],
        build.caps(),
        clusters if clusters.is_file() else None,
        plan["source_mix"]["rates"] if "source_mix" in plan else None,
        build.exercise_table(),
        excluded_ids(plan),
        excluded_ids(plan.get("source_mix", {})),
    )
    if "source_mix" not in plan and sources.partition_source(key) != sources.SYNTH_SOURCE:
        raise dg.Failure(
            f"synth_pool partition {key!r} is an anchor source's shard, and the quota plan in force was made without "
            "anchor sources (no source mix): re-materialize synth_quota_plan, then every synth_pool shard"
        )
    unpublished = unpublish_pool(paths)  # the manifest and blends would describe rows this run replaces
    for event in pool_unpublished_events(paths, unpublished, f"synth_pool rewrites shard {key}'s part"):
        context.instance.report_runless_asset_event(event)
    result = write_pool_shard(shard, paths.error_log("synth_pool", key))
    result.report.plan_sha256 = plan_sha
    record = result.record(key, shard_index, file_record(paths.pool_root(), part))
    mf.write_manifest(paths.pool_record(shard_index), record)
    report = result.report.to_dict()
    written = [part, *(trio_root / f["path"] for t in record["trios"] for f in t["files"])]
    metadata = {
        **report_metadata(report, "synth_pool"),
        **bucket_report_metadata(report),
        **files_metadata(written, paths.pool_root(), [paths.pool_record(shard_index)]),
        "quota_plan_sha256": plan_sha,
        "pool_unpublished_files": dg.MetadataValue.json(sorted(paths.recorded(path) for path in unpublished)),
        "dataset_root": dg.MetadataValue.path(str(paths.pool_root())),
    }
    return dg.MaterializeResult(
        metadata=metadata,
        data_version=content_version(metadata, paths.pool_record(shard_index)),
        check_results=[rows_accounted_result(result.report), pool_trio_alignment_result(trio_root, result.inventories)],
    )


def pool_shard_records(paths: DataLayout, names: list[str]) -> dict[str, dict]:
    """Each shard's synth_pool record (its part, trios and report, with the quota plan it was made under), by
    partition; fails naming a shard whose pool was never built."""
    return partition_records("synth_pool", {n: paths.pool_record(shard_index_from_name(n)) for n in names})


@synthkd_asset("pool_manifest", {"megatron", "json"}, deps=[synth_pool], group_name="pool")
def synth_curriculum(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """Curriculum blends (docs/pool.md#curriculum) over the pool's per-cell trios: per stage,
    `<pool>/curriculum/<stage>.json` (Megatron-LM --per-split-data-args-path) and `<stage>.args` (the arguments of a
    stock Megatron-LM run: that file,
    --seq-length, --train-samples), weights reproducing the stage's ctx shares on tokens; a stage whose buckets
    hold no tokens writes nothing and says why, and the epochs each stage needs are reported. The files of a stage
    taken out of the configuration are removed. Fails, writing nothing, unless every shard's pool part was made
    under the current quota plan, and that plan is the one the configured targets give."""
    paths = layout.data_layout(build.smoke)
    records = pool_shard_records(paths, shard_names(paths))
    plan, plan_sha = read_quota_plan(paths, build.quota_targets())
    require_current_quota_plan(context, paths, build, plan, plan_sha)  # no blend of a hand-edited plan
    require_one_quota_plan(records.values(), plan_sha)
    prefixes = scan_pool_prefixes(paths.pool_trio_root())
    plans = [plan_stage(stage, prefixes) for stage in build.curriculum_stages()]
    removed = remove_other_stages_files(paths.curriculum_dir(), [plan["stage"] for plan in plans])
    written = []
    parts_read: dict[Path, Any] = {}  # each pool part read once for every stage's report
    for plan in plans:
        files = write_stage_files(
            plan, paths.curriculum_dir(), paths.pool_trio_root(), stage_cache_dir(paths.pool_name())
        )
        plan["stream"] = stage_stream_report(files[0], plan, parts_read) if files else None
        written += files
    mf.write_manifest(paths.curriculum_plan(), {"stages": plans})
    metadata = {
        "stages_written": [plan["stage"] for plan in plans if plan["per_split_data_args"]],
        "stage_files_removed": sorted(path.name for path in removed),  # of stages no longer configured
    }
    for plan in plans:
        name = plan["stage"]
        metadata[f"{name}_feasible"] = plan["feasible"]
        metadata[f"{name}_expected_sequences"] = plan["expected_sequences"]
        for ctx, entry in plan["ctx"].items():
            if entry["share"]:
                metadata[f"{name}_{ctx}_epochs_needed"] = entry["epochs_needed"]
        if plan["reason"]:
            metadata[f"{name}_reason"] = plan["reason"]
        if plan["stream"]:
            for key in ("max_deviation_pp", "real_token_fraction", "long_conversations"):
                metadata[f"{name}_stream_{key}"] = plan["stream"][key]
    metadata.update(files_metadata(written))
    return dg.MaterializeResult(metadata=metadata, data_version=content_version(metadata, paths.curriculum_plan()))


@synthkd_asset(
    "pool_manifest",
    {"json"},
    deps=[
        synth_pool,
        synth_curriculum,
        synth_quota_plan,
        synth_harmony_manifest,
        o200k_tokenizer,
        dg.AssetKey("synth_valuation_features"),  # sealed here too: defs/valuation.py depends on synth_pool
    ],
    group_name="pool",
    check_specs=[BUCKET_BALANCE_SPEC, POOL_PUBLISHED_SPEC, POOL_CURRENT_SPEC],
)
def synth_pool_manifest(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """`<pool>/manifest.json`, the sampling manifest (docs/pool.md#reports): provenance and config hash, the 001 plan,
    the quota grid with targets vs expected vs achieved tokens and rows per cell, balancing, the curriculum schedule and
    its epochs, the validation sets of its plan, every shard's part and trios with bytes / sha256, and drops by
    reason; fails unless the quota plan is the one the configured targets give and the validation sets were held
    out of the clusters the plan counted after. Seals the valuation features of the parts beside it."""
    paths = layout.data_layout(build.smoke)
    names = shard_names(paths)
    records = pool_shard_records(paths, names)
    with_sources = any(sources.partition_source(n) != sources.SYNTH_SOURCE for n in names)
    origin, sampling, reports = dataset_inputs(paths, build, build.pool_config(with_sources), names)
    plan, plan_sha = read_quota_plan(paths, build.quota_targets())
    require_current_quota_plan(context, paths, build, plan, plan_sha)
    curriculum = mf.read_json(paths.curriculum_plan())
    records = list(records.values())
    files = pool_dataset_files(paths.pool_root(), paths.pool_trio_root(), records)
    validation = read_sealed_manifest(paths.validation_manifest())[0]
    heldout = heldout_section(paths.pool_root(), paths.validation_root(), validation, sampling)
    manifest = pool_manifest(
        paths.pool_name(), origin, sampling, reports, records, plan, plan_sha, curriculum, files, heldout
    )
    digest = write_gated_manifest(context, paths, manifest)
    valuation_root = paths.valuation_root()
    if valuation_root.is_dir():  # the features of these parts, sealed for the scorer (docs/pool.md)
        parts = [f for f in manifest["files"] if f["path"].startswith(f"{POOL_PARTS_SUBDIR}/")]
        features = valuation_manifest(valuation_root.name, valuation_root, paths.pool_root(), parts)
        write_sealed_manifest(paths.valuation_manifest(), features)
    quota = manifest["quota"]
    achieved = quota["achieved"]["tokens"]
    anchors = (
        r["report"].get("bucket_tokens", {})  # none in a part that kept no row
        for r in records
        if sources.partition_source(r["partition"]) != sources.SYNTH_SOURCE
    )
    planned = planned_bucket_tokens(quota["expected"]["tokens"], anchors)
    mix = source_mix_metadata(manifest["source_mix"], "achieved") if "source_mix" in manifest else {}
    return dg.MaterializeResult(
        metadata={
            **dataset_manifest_metadata(manifest, digest, paths.pool_root(), achieved="sampled"),
            **mix,
            **skill_share_metadata(manifest["quota"]),
            **bucket_grid_metadata(achieved, "achieved"),
            **language_exercise_metadata(record["report"] for record in records),
        },
        data_version=dg.DataVersion(digest),
        check_results=[
            bucket_balance_result(achieved, planned, quota["infeasible"]),
            pool_published_result(digest),
            pool_current_result(stale_pool_shards(context.instance, names), paths.pool_name()),
        ],
    )
