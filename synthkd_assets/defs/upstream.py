"""What the assets read of their upstream's output: stage files, reports, records and the sampling plan.
Something missing fails the step with what to materialize first, never with a bare FileNotFoundError."""

from pathlib import Path

import dagster as dg

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.cleanup import STAGE_NAMES
from synthkd_assets.core.inventory import scan_raw_dir
from synthkd_assets.defs.passes import launch_sequence
from synthkd_assets.defs.resources import SynthKDPaths
from synthkd_contract import constants
from synthkd_contract.manifest_seal import sha256_file


def stage_files(paths: SynthKDPaths, stage: str, key: str) -> tuple[Path, Path]:
    """(<stage>/<key>.parquet, <stage>/<key>.report.json) of one stage step's shard."""
    directory = paths.stage_dir(stage)
    return directory / f"{key}.parquet", directory / f"{key}.report.json"


def errors_log(paths: SynthKDPaths, step: str, key: str) -> Path:
    """Where a step's error log of one shard goes (the dropped rows it names)."""
    return paths.errors_dir() / step / f"{key}.jsonl"


def shard_names(paths: SynthKDPaths) -> list[str]:
    """The shards of the raw directory, in partition order: what the manifests list."""
    return [shard.name for shard in scan_raw_dir(paths.raw_root(), paths.raw_hash_cache())]


def require_upstream(paths: SynthKDPaths, asset: str, key: str, *upstream: str) -> None:
    """Fail with the steps to run when an upstream output this partition reads is not there (e.g. a
    `dg launch --assets synth_kd_v1 --partition synth_00` on a fresh data directory)."""
    tokenizer = paths.tokenizer_dir() / constants.TOKENIZER_FILENAME
    files = {name: tokenizer if name == "o200k_tokenizer" else stage_files(paths, name, key)[0] for name in upstream}
    missing = {name: path for name, path in files.items() if not path.is_file()}
    if missing:
        raise dg.Failure(
            f"{asset} partition {key!r} needs {', '.join(missing)} first, not materialized yet "
            f"({', '.join(str(p) for p in missing.values())} missing). Materialize the graph in order:\n  "
            + "\n  ".join(launch_sequence(key))
            + "\nor build every shard with ./scripts/build.sh"
        )


def partition_records(asset_name: str, record_paths: dict[str, Path]) -> dict[str, dict]:
    """The record (or report) each partition of `asset_name` published, by partition; a manifest over a
    partition that was never materialized fails, naming it."""
    for name, record_path in record_paths.items():
        if not record_path.is_file():
            raise dg.Failure(f"{asset_name} partition {name!r} has not been materialized ({record_path} missing)")
    return {name: mf.read_json(record_path) for name, record_path in record_paths.items()}


def stage_reports(paths: SynthKDPaths, names: list[str], stages: tuple[str, ...] = STAGE_NAMES) -> dict[str, dict]:
    """{stage: {shard: report}} of the stage steps, for the manifests' totals and sampling section."""
    return {stage: partition_records(stage, {n: stage_files(paths, stage, n)[1] for n in names}) for stage in stages}


def read_plan(paths: SynthKDPaths) -> tuple[dict, str]:
    """The current sampling plan and its sha256; fails if it is missing or was made for other targets."""
    path = paths.sampling_plan_path()
    if not path.is_file():
        raise dg.Failure(f"no sampling plan at {path}: materialize synth_sampling_plan (after synth_filtered) first")
    plan = mf.read_json(path)
    if plan["targets"] != paths.targets().to_dict():
        raise dg.Failure(
            f"sampling plan {path} was computed for targets {plan['targets']}, not the configured "
            f"{paths.targets().to_dict()}: re-materialize synth_sampling_plan"
        )
    return plan, sha256_file(path)


def recorded_file(paths: SynthKDPaths, path: Path) -> dict[str, str]:
    """{path (as manifests record it), sha256} of a file the manifests point at (tokenizer, input manifest)."""
    return {"path": paths.recorded(path), "sha256": sha256_file(path)}
