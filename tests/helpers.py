"""Building the graph in tests: the project's own build order, on a real Dagster instance."""

from __future__ import annotations

import random
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import polars as pl

# a run's code-location origin (DAEMON_ORIGIN below): Dagster exports no constructor for one
from dagster._core.remote_origin import GrpcServerCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

from synthkd_assets.core.layout import ROWS_SUFFIX, STAGE_SUFFIX
from synthkd_assets.defs.build import (  # noqa: F401  (re-exported for the tests)
    all_definitions,
    build_all,
    materialize_steps,
)
from synthkd_assets.defs.passes import MANIFEST_STEPS, PLAN_STEPS, SCAN_STEPS, SHARD_STEPS  # noqa: F401
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout, synthkd_resources
from synthkd_dev import REPO_ROOT, SAMPLE_RAW_DIR  # noqa: F401  (re-exported for the tests)

ALL_ASSETS = all_definitions()


def run(
    instance,
    layout: SynthKDLayout,
    selection: list[str],
    partition_key: str | None = None,
    raise_on_error: bool = True,
    build: SynthKDBuildConfig | None = None,
):
    """Materialize `selection` (and the checks of those assets) on `instance`."""
    result = materialize_steps(instance, layout, selection, partition_key, raise_on_error=raise_on_error, build=build)
    if raise_on_error:
        assert result.success
    return result


def build_everything(instance, layout: SynthKDLayout) -> None:
    """What scripts/build.sh does: scan pass per shard, the plan, build pass per shard, manifests, the pool."""
    build_all(instance, layout)


def check_outcomes(result) -> dict[str, bool]:
    return {evaluation.check_name: evaluation.passed for evaluation in result.get_asset_check_evaluations()}


def check_evaluations(instance, layout: SynthKDLayout, asset: str) -> dict:
    """Run every check of `asset` alone (not raising on a failure): check name -> its evaluation."""
    return _run_checks(instance, layout, dg.AssetSelection.checks_for_assets(asset))


def check_evaluation(instance, layout: SynthKDLayout, check: dg.AssetCheckKey) -> dg.AssetCheckEvaluation:
    """Run the one check `check` alone (not raising on a failure): its evaluation."""
    [evaluation] = _run_checks(instance, layout, dg.AssetSelection.checks(check)).values()
    return evaluation


def _run_checks(instance, layout: SynthKDLayout, selection: dg.AssetSelection) -> dict:
    result = dg.materialize(
        ALL_ASSETS, selection=selection, instance=instance, resources=synthkd_resources(layout), raise_on_error=False
    )
    return {evaluation.check_name: evaluation for evaluation in result.get_asset_check_evaluations()}


def location_dependent(root: Path, path: Path) -> bool:
    """The curriculum stage files (absolute prefixes) and the pool manifest (their sha256) of either build."""
    layouts = SynthKDLayout(data_dir=str(root)).data_layout().both_builds()
    for layout in layouts:
        if path.parent == layout.curriculum_dir() and path != layout.curriculum_plan():
            return True
        if path.parent == layout.pool_root() and path.name.startswith(layout.pool_manifest().name):
            return True
    return False


def stage_shard_files(paths, stage: str) -> list[Path]:
    """Every shard output (`<key>.parquet`) of `stage`, sorted: not synth_tokenized's row sizes beside them."""
    return sorted(p for p in paths.stage_dir(stage).glob(f"*{STAGE_SUFFIX}") if not p.name.endswith(ROWS_SUFFIX))


def rows_after_clusters(paths, columns: list[str]):
    """The synth_filtered rows the near-duplicate clusters keep (no cap, not held out): what the plan counts."""
    frames = []
    for filtered in stage_shard_files(paths, "synth_filtered"):
        decisions = pl.read_parquet(
            paths.stage_output("synth_clusters", filtered.stem), columns=["synth_id", "decision"]
        )
        rows = pl.read_parquet(filtered, columns=["synth_id", *columns]).join(decisions, on="synth_id", how="left")
        frames.append(rows.filter(pl.col("decision").is_null()).select(columns))
    return pl.concat(frames)


def pool_published(instance: dg.DagsterInstance) -> dg.AssetCheckEvaluation:
    """The latest `pool_published` evaluation on synth_pool_manifest, from a run or reported without one."""
    key = dg.AssetCheckKey(dg.AssetKey("synth_pool_manifest"), "pool_published")
    [record] = instance.event_log_storage.get_asset_check_execution_history(key, limit=1)
    return record.event.dagster_event.event_specific_data


def write_as_build(path: Path, payload: bytes = b"x") -> Path:
    """A file the build wrote, as its writers write one (core/atomic.py: recorded in the written ledger of the
    output root a `DataLayout` registered), unlike a user's `write_bytes`."""
    from synthkd_assets.core.atomic import atomic_write_bytes

    atomic_write_bytes(path, payload)
    return path


def partial_left_by_killed_writer(final: Path) -> Path:
    """The partial file of `final` a killed writer leaves behind (its lock gone with it)."""
    from synthkd_assets.core.atomic import PartialFile

    partial = PartialFile(final)
    partial.release()
    return partial.path


def long_text(target_bytes: int, words: tuple[str, ...]) -> str:
    """About `target_bytes` of sentences of varied `words` (a run of one character would only exercise the
    tokenizer's limit): one huge row's reasoning, as a user's file might hold it."""
    rng = random.Random(0)
    parts, size = [], 0
    while size < target_bytes:
        sentence = " ".join(rng.choice(words) for _ in range(12)) + f" ({len(parts)}).\n"
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts)


# where a daemon-launched run came from (no public constructor; a run of `dg launch` or `dg.materialize` has none)
DAEMON_ORIGIN = RemoteJobOrigin(
    repository_origin=RemoteRepositoryOrigin(
        code_location_origin=GrpcServerCodeLocationOrigin(host="localhost", port=4000, location_name="synthkd"),
        repository_name="__repository__",
    ),
    job_name="synth_shard_job",
)


def add_failed_run(instance: dg.DagsterInstance, tags: dict[str, str], launched: bool = True) -> str:
    """A failed synth_shard_job run with `tags`, launched from the code location (DAEMON_ORIGIN) or not."""
    run = dg.DagsterRun(
        job_name="synth_shard_job",
        run_id=str(uuid.uuid4()),
        status=dg.DagsterRunStatus.FAILURE,
        tags=tags,
        remote_job_origin=DAEMON_ORIGIN if launched else None,
    )
    return instance.add_run(run).run_id


def run_benchmark(name: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`benchmarks/<name>` with `args`, run as the README says (this interpreter, from the repository root)."""
    return subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmarks" / name), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def quota_rows_of(paths: list[Path]) -> list:
    """Every row `tokenized_quota_rows` reads from these files (QuotaRows), its spill removed."""
    from synthkd_assets.core.quota_rows import tokenized_quota_rows

    with tokenized_quota_rows(paths) as held:
        return held.all_rows()
