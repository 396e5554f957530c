"""The three manifests: each asset gathers what its shards published, calls its builder (core/manifest_builders.py),
writes the result atomically and reports it as metadata."""

from collections.abc import Callable

import dagster as dg

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.harmony_artifact import dataset_config, input_artifact_record, layout_artifact
from synthkd_assets.core.inventory import scan_inputs
from synthkd_assets.core.layout import HARMONY_STAGE, DataLayout
from synthkd_assets.core.manifest_builders import (
    distill_manifest,
    harmony_manifest,
    harmony_shard_entry,
    kd_dataset_files,
    kd_manifest,
    provenance,
    sampling_section,
)
from synthkd_assets.core.quality import STAT_COLUMNS, length_stats, markdown_table
from synthkd_assets.core.report import merge_error_logs
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.defs.assets import synth_distill, synth_harmony, synth_kd_v1, synth_sampling_plan, synth_tokenized
from synthkd_assets.defs.checks import write_gated_manifest
from synthkd_assets.defs.conventions import synthkd_asset
from synthkd_assets.defs.ingest import o200k_tokenizer
from synthkd_assets.defs.metadata import (
    dataset_manifest_metadata,
    drops_by_exercise_table,
    manifest_rows_metadata,
    partitions_hashed_files,
)
from synthkd_assets.defs.passes import HARMONY_MANIFEST, OUTPUTS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.upstream import (
    manifest_shard_records,
    partition_records,
    read_plan,
    recorded_file,
    shard_names,
    stage_files,
    stage_reports,
)
from synthkd_contract.manifest_seal import sha256_files


def manifest_asset(deps: list, group_name: str, kinds: set[str]) -> Callable[[Callable], dg.AssetsDefinition]:
    """A manifest's asset (rewritten after its shards by synth_manifests_automation, defs/conditions.py)."""
    return synthkd_asset("manifest", kinds, deps=deps, group_name=group_name)


@manifest_asset([synth_harmony], "synth", {"json"})
def synth_harmony_manifest(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """data/synth_harmony/manifest.json: schema, system message, and per-shard source/output hashes and counts."""
    paths = layout.data_layout(build.smoke)
    shards = scan_inputs(paths)
    names = [shard.name for shard in shards]
    reports = partition_records(HARMONY_STAGE, manifest_shard_records(paths, HARMONY_MANIFEST, names)[HARMONY_STAGE])
    outputs = [stage_files(paths, "synth_harmony", shard.name)[0] for shard in shards]
    entries = [
        harmony_shard_entry(
            shard.name,
            shard.path,
            reports[shard.name],
            {"path": paths.recorded(out), "bytes": out.stat().st_size, "sha256": digest},
        )
        for shard, out, digest in zip(shards, outputs, sha256_files(outputs))  # a thread a core
    ]
    found = layout_artifact(paths)
    artifact = None if found is None else {"path": paths.recorded(found.manifest_path), "sha256": found.manifest_sha256}
    manifest = harmony_manifest(system_message_dict(), entries, artifact)
    digest = mf.write_manifest(paths.harmony_manifest(), manifest)
    rows = manifest_rows_metadata(manifest["rows_in"], manifest["rows_out"], manifest["dropped"])
    return dg.MaterializeResult(
        metadata={"shards": len(entries), **rows, "manifest_sha256": digest}, data_version=dg.DataVersion(digest)
    )


def dataset_inputs(
    paths: DataLayout, build: SynthKDBuildConfig, config: dict, names: list[str]
) -> tuple[dict, dict, dict]:
    """What both dataset manifests are built from besides their own records: provenance, the sampling section
    and every stage report ({stage: {shard: report}})."""
    reports = stage_reports(paths, names)
    plan, plan_sha = read_plan(paths, build.targets())
    sampling = sampling_section(plan, plan_sha, reports["synth_filtered"], reports["synth_sampled"])
    tokenizer = recorded_file(paths, paths.tokenizer_file())
    harmony = recorded_file(paths, paths.harmony_manifest())
    # seed 000: the input artifact's manifest, verified against its files
    found = layout_artifact(paths)
    artifact = input_artifact_record(paths, found).get("input_artifact")
    config = dataset_config(config, found)
    return provenance(mf.git_state(), config, tokenizer, harmony, artifact), sampling, reports


def dataset_records(paths: DataLayout, dataset: dg.AssetsDefinition, names: list[str]) -> list[dict]:
    """The shard records of `dataset` (synth_kd_v1, synth_distill) its manifest lists, in shard order."""
    name = dataset.key.to_user_string()
    return list(partition_records(name, manifest_shard_records(paths, OUTPUTS[name], names)[name]).values())


DATASET_DEPS = [synth_harmony_manifest, o200k_tokenizer, synth_sampling_plan]


@manifest_asset([synth_kd_v1, *DATASET_DEPS], "megatron", {"megatron", "json"})
def synth_kd_v1_manifest(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """data/megatron/synth_kd_v1/manifest.json: git SHA, config hash, tokenizer pin, input manifest hash, split
    rule, sampling plan and achieved mix, shard inventory with bytes/sha256/counts, tokens per span and drops by
    reason. Reports (metadata only) analysis / final tokens per conversation of synth_tokenized, per language and
    exercise, with the overall figures plotted (docs/contract.md#checks distribution checks)."""
    paths = layout.data_layout(build.smoke)
    root, names = paths.megatron_root(), shard_names(paths)
    records = dataset_records(paths, synth_kd_v1, names)
    origin, sampling, reports = dataset_inputs(paths, build, build.kd_config(), names)
    manifest = kd_manifest(root.name, origin, sampling, reports, records, kd_dataset_files(root, records))
    digest = write_gated_manifest(context, paths, manifest)
    totals = manifest["totals"]
    tokenized = partitions_hashed_files(context.instance, synth_tokenized.key, names)
    lengths = length_stats([stage_files(paths, "synth_tokenized", n)[0] for n in names], tokenized)
    return dg.MaterializeResult(
        metadata={
            **dataset_manifest_metadata(manifest, digest, root),
            **{f"sequences_{k}": v for k, v in totals["sequences"].items()},
            **{f"tokens_{k}": v for k, v in totals["span_tokens"].items()},
            "span_lengths": dg.MetadataValue.md(markdown_table(lengths)),
            "filter_drops_by_exercise": drops_by_exercise_table(reports["synth_filtered"].values(), "synth_filtered"),
            **{k: lengths.overall[k] for k in STAT_COLUMNS if lengths.overall[k] is not None},
        },
        data_version=dg.DataVersion(digest),
    )


@manifest_asset([synth_distill, *DATASET_DEPS], "distill", {"parquet", "json"})
def synth_distill_manifest(
    context: dg.AssetExecutionContext, layout: SynthKDLayout, build: SynthKDBuildConfig
) -> dg.MaterializeResult:
    """`<distill root>/manifest.json`: config and hash, git SHA, tokenizer pin, input manifest hash, sampling plan
    with the before / expected / achieved mix, split rule, token-length stats (min/p50/p90/p99/max per split),
    drops by reason, every part's bytes and sha256; plus the Harmony render-failure log."""
    paths = layout.data_layout(build.smoke)
    root, names = paths.distill_root(), shard_names(paths)
    records = dataset_records(paths, synth_distill, names)
    origin, sampling, reports = dataset_inputs(paths, build, build.distill_config(), names)
    # the Harmony render failures synth_tokenized dropped (its first 1000 per shard), gathered into one log
    render_failures = [paths.error_log("synth_tokenized", n) for n in names]
    logged = merge_error_logs(render_failures, paths.encoding_errors_log_path())
    errors = {"path": paths.recorded(paths.encoding_errors_log_path()), "records": logged}
    manifest = distill_manifest(
        paths.distill_name(),
        paths.recorded(root),
        origin,
        sampling,
        reports,
        records,
        build.max_seq_len,
        build.distill_valid_fraction,
        errors,
    )
    digest = write_gated_manifest(context, paths, manifest)
    lengths = manifest["token_lengths"]
    return dg.MaterializeResult(
        metadata={
            **dataset_manifest_metadata(manifest, digest, root),
            **{f"rows_{k}": v for k, v in manifest["totals"]["rows_per_split"].items()},
            **{f"{split}_len_{k}": v for split, stats in lengths.items() for k, v in stats.items() if v is not None},
            "encoding_errors_logged": logged,
        },
        data_version=dg.DataVersion(digest),
    )
