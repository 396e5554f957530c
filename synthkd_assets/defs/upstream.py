"""What the assets read of their upstream's output: stage files, reports, records and the sampling plan.
Something missing fails the step with what to materialize first, never with a bare FileNotFoundError."""

from pathlib import Path

import dagster as dg

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.inventory import input_shard_paths, shard_index_from_name
from synthkd_assets.core.layout import HARMONY_STAGE, STAGE_NAMES, DataLayout
from synthkd_assets.core.quota import QuotaTargets
from synthkd_assets.core.sampling import MixTargets
from synthkd_assets.defs.jobs import launch_sequence, repair_action
from synthkd_assets.defs.passes import HARMONY_MANIFEST, MANIFEST_STEPS, OUTPUTS
from synthkd_contract.manifest_seal import sha256_file


def stage_files(paths: DataLayout, stage: str, key: str) -> tuple[Path, Path]:
    """(<stage>/<key>.parquet, <stage>/<key>.report.json) of one stage step's shard."""
    return paths.stage_output(stage, key), paths.stage_report(stage, key)


def shard_names(paths: DataLayout) -> list[str]:
    """The shards of the raw directory (and the anchor sources), in partition order: what the manifests list."""
    return [key for key, _ in input_shard_paths(paths)]


def manifest_shard_records(paths: DataLayout, manifest: str, names: list[str]) -> dict[str, dict[str, Path]]:
    """{step: {shard: record}}: the per-shard records `manifest` (an asset name) is written from, each read
    through `partition_records`: synth_harmony's reports for its manifest; the dataset's own shard records,
    then every stage's reports, for the two dataset manifests. Their automation waits for all of them in the
    full layout (defs/conditions.py), so a shard materialized only by a smoke build, or not yet, never makes
    it request a run that fails for want of them."""
    reports = stage_report_paths(paths, names)
    if manifest == HARMONY_MANIFEST:
        return {HARMONY_STAGE: reports[HARMONY_STAGE]}
    if manifest == OUTPUTS["synth_kd_v1"]:
        return {"synth_kd_v1": {n: paths.shard_record(shard_index_from_name(n)) for n in names}, **reports}
    if manifest == OUTPUTS["synth_distill"]:
        return {"synth_distill": {n: paths.distill_record(n) for n in names}, **reports}
    raise ValueError(f"{manifest!r} is not one of {MANIFEST_STEPS}")


def first_missing_shard_record(paths: DataLayout, manifest: str) -> Path | None:
    """The first record of `manifest_shard_records` not on disk, over every shard of the raw directory (the
    dataset's own records first: what a shard built elsewhere lacks), or None when all are there."""
    records = manifest_shard_records(paths, manifest, shard_names(paths))
    return next((path for by_shard in records.values() for path in by_shard.values() if not path.is_file()), None)


def require_upstream(paths: DataLayout, asset: str, key: str, *upstream: str) -> None:
    """Fail with the steps to run when an upstream output this partition reads is not there (e.g. a
    `dg launch --job synth_build_job --partition synth_00` on a fresh data directory)."""
    tokenizer = paths.tokenizer_file()
    files = {name: tokenizer if name == "o200k_tokenizer" else stage_files(paths, name, key)[0] for name in upstream}
    missing = {name: path for name, path in files.items() if not path.is_file()}
    if missing:
        raise dg.Failure(
            f"{asset} partition {key!r} needs {', '.join(missing)} first, not materialized yet "
            f"({', '.join(str(p) for p in missing.values())} missing). "
            f"Repair: {repair_action(next(iter(missing)), key)}, "
            "then this run again. A fresh data root needs the whole graph in order:\n  "
            + "\n  ".join(launch_sequence(key))
            + "\nor ./scripts/build.sh for every shard"
        )


def partition_records(asset_name: str, record_paths: dict[str, Path]) -> dict[str, dict]:
    """The record (or report) each partition of `asset_name` published, by partition; a manifest over a
    partition that was never materialized fails, naming it."""
    for name, record_path in record_paths.items():
        if not record_path.is_file():
            raise dg.Failure(f"{asset_name} partition {name!r} has not been materialized ({record_path} missing)")
    return {name: mf.read_json(record_path) for name, record_path in record_paths.items()}


def stage_report_paths(paths: DataLayout, names: list[str]) -> dict[str, dict[str, Path]]:
    """{stage: {shard: report path}} of the stage steps."""
    return {stage: {n: stage_files(paths, stage, n)[1] for n in names} for stage in STAGE_NAMES}


def stage_reports(paths: DataLayout, names: list[str]) -> dict[str, dict]:
    """{stage: {shard: report}} of the stage steps, for the manifests' totals and sampling section."""
    return {stage: partition_records(stage, reports) for stage, reports in stage_report_paths(paths, names).items()}


def shard_stage_reports(paths: DataLayout, key: str) -> dict[str, dict]:
    """One shard's report of each stage step, in step order (synth_harmony first: it read the input file)."""
    return {stage: reports[key] for stage, reports in stage_reports(paths, [key]).items()}


def read_clusters(paths: DataLayout) -> tuple[dict, str]:
    """synth_clusters' summary (what its decisions remove, per shard and cell) and its sha256."""
    path = paths.clusters_summary()
    if not path.is_file():
        raise dg.Failure(f"no near-duplicate clusters at {path}: materialize synth_clusters (after synth_signatures)")
    return mf.read_json(path), sha256_file(path)


def require_current_clusters(paths: DataLayout, plan: dict) -> None:
    """The clusters the plan counted after are the ones on disk: a re-clustering without a re-plan (or a plan
    from before the clusters) would sample shards with decisions the plan never counted."""
    path = paths.clusters_summary()
    planned = plan.get("near_dup", {}).get("clusters_sha256")
    current = sha256_file(path) if path.is_file() else None
    if planned is None or planned != current:
        raise dg.Failure(
            f"the sampling plan {paths.sampling_plan()} was computed after clusters {str(planned)[:12]}, but "
            f"{path} is {str(current)[:12]}: re-materialize synth_clusters and synth_sampling_plan (synth_plan_job), "
            "then every shard"
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
    return plan, sha256_file(path)


def read_quota_plan(paths: DataLayout, targets: QuotaTargets) -> tuple[dict, str]:
    """The current quota plan and its sha256; fails if it is missing or was made for other targets."""
    path = paths.quota_plan()
    if not path.is_file():
        raise dg.Failure(f"no quota plan at {path}: materialize synth_quota_plan (after synth_tokenized) first")
    plan = mf.read_json(path)
    made_for = {key: plan["targets"][key] for key in targets.to_dict()}
    if made_for != targets.to_dict():
        raise dg.Failure(
            f"quota plan {path} was computed for {made_for}, not the configured "
            f"{targets.to_dict()}: re-materialize synth_quota_plan"
        )
    return plan, sha256_file(path)


def recorded_file(paths: DataLayout, path: Path) -> dict[str, str]:
    """{path (as manifests record it), sha256} of a file the manifests point at (tokenizer, input manifest)."""
    return {"path": paths.recorded(path), "sha256": sha256_file(path)}
