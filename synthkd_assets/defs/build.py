"""The whole graph executed in this process, pass by pass (defs/passes.py), on an instance it is given: for the
tests, the benchmarks and the DistillKit CLI (scripts/build_synth_distill.py), which build into a throwaway
instance. A build a user runs into their Dagster instance is launched through it instead
(synthkd_assets/launch.py, scripts/build.sh): its runs queued, launched and monitored by Dagster."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Sequence

import dagster as dg

from synthkd_assets.core.buildlock import build_lock
from synthkd_assets.defs.code_versions import with_code_versions
from synthkd_assets.defs.failures import error_message, failed_check_lines
from synthkd_assets.defs.graph import ASSET_CHECKS, ASSETS
from synthkd_assets.defs.ingest import INVENTORY_WARNINGS
from synthkd_assets.defs.jobs import is_whole_job, job_for_steps, smoke_run_tags, steps_selection
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.passes import OUTPUTS, Pass, build_passes
from synthkd_assets.defs.resources import (
    SynthKDBuildConfig,
    SynthKDLayout,
    merged_resource_config,
    resources_run_config,
    synthkd_resources,
)
from synthkd_assets.defs.tags import EPHEMERAL_JOB_NAME


class BuildFailed(RuntimeError):
    """A step or a blocking check failed; the message names the steps, the partition and the reasons."""

    def __init__(self, message: str, steps: Sequence[str] = (), partition: str | None = None):
        super().__init__(message)
        self.steps = tuple(steps)
        self.partition = partition


class BuildProgress:
    """What a build reports as it goes; this one reports nothing. `pass_started` comes before every pass (`keys`:
    the shard partitions of a shard pass, empty otherwise), `shard_done` after each shard of a shard pass (in the
    order they finish), `pass_done` after the pass."""

    def pass_started(self, build_pass: Pass, keys: Sequence[str]) -> None:
        pass

    def shard_done(self, build_pass: Pass, key: str, seconds: float) -> None:
        pass

    def pass_done(self, build_pass: Pass, seconds: float) -> None:
        pass

    def warned(self, build_pass: Pass, warnings: Sequence[str]) -> None:
        """What a pass run in this process warned the user of (the inventory: shards' outputs removed, files
        ignored); called before `pass_done`, only when there is something."""


def all_definitions() -> list:
    """The code location's assets (with their code versions) and checks."""
    return [*with_code_versions(ASSETS), *ASSET_CHECKS]


def materialize_steps(
    instance: dg.DagsterInstance,
    layout: SynthKDLayout,
    selection: Sequence[str],
    partition_key: str | None = None,
    raise_on_error: bool = True,
    build: SynthKDBuildConfig | None = None,
    **kwargs,
) -> dg.ExecuteInProcessResult:
    """Materialize `selection` and run the checks of those assets, in process (`build`: the default config
    when None), as a run of the code location's job of those steps (`job_for_steps`: a pass's job; a subset of
    its assets when `selection` is part of it), or of Dagster's `__ephemeral_asset_job__` for steps no job has.
    Raises BuildFailed (with `raise_on_error`) when a step or an ERROR check failed."""
    job = job_for_steps(selection)
    subset = None if job is None or is_whole_job(job, selection) else [dg.AssetKey(s) for s in selection]
    if job is None:
        job = dg.define_asset_job(EPHEMERAL_JOB_NAME, selection=steps_selection(selection))
    resources = synthkd_resources(layout, build)
    definitions = dg.Definitions(assets=all_definitions(), jobs=[job], resources=resources)
    # the resources' config goes with the run (a caller's own fields win): its re-execution reproduces it
    run_config = dict(kwargs.pop("run_config", None) or {})
    run_config["resources"] = merged_resource_config(resources_run_config(resources), run_config.get("resources"))
    kwargs["tags"] = {**kwargs.get("tags", {}), **smoke_run_tags(run_config)}
    result = definitions.resolve_job_def(job.name).execute_in_process(
        run_config=run_config,
        instance=instance,
        partition_key=partition_key,
        raise_on_error=False,
        asset_selection=subset,
        **kwargs,
    )
    failed_checks = failed_check_lines(result.get_asset_check_evaluations())
    if raise_on_error and (not result.success or failed_checks):
        where = f" (partition {partition_key})" if partition_key else ""
        errors = [error_message(e.step_failure_data.error) for e in result.get_step_failure_events()]
        message = "\n".join([f"{', '.join(selection)}{where} failed: {'; '.join(errors)}", *failed_checks])
        raise BuildFailed(message, selection, partition_key)
    return result


def build_all(
    instance: dg.DagsterInstance,
    layout: SynthKDLayout,
    build: SynthKDBuildConfig | None = None,
    outputs: Iterable[str] = tuple(OUTPUTS),
    progress: BuildProgress | None = None,
    take_lock: bool = True,
    **kwargs,
) -> list[str]:
    """Every pass of `build_passes(outputs)` in order, each shard of a shard pass after the other, in this
    process; returns the shards. Raises BuildFailed at the first failed step or blocking check.

    `outputs` picks the datasets (synth_kd_v1, synth_distill, synth_pool); `progress` hears of each pass and shard;
    `kwargs` go to each run (`run_config`, `tags`). Holds the data root's build lock throughout (BuildLockHeld at
    once when another build of the root runs); `take_lock=False` when the caller holds it."""
    held = build_lock(layout.data_layout().build_lock()) if take_lock else contextlib.nullcontext()
    progress = progress or BuildProgress()
    keys: list[str] = []
    with held:
        for build_pass in build_passes(outputs):
            start = time.monotonic()
            if not build_pass.per_shard:
                progress.pass_started(build_pass, [])
                result = materialize_steps(instance, layout, build_pass.steps, build=build, **kwargs)
                warnings = [
                    warning
                    for event in result.get_asset_materialization_events()
                    for warning in event.materialization.metadata.get(
                        INVENTORY_WARNINGS, dg.JsonMetadataValue([])
                    ).value
                ]
                if warnings:
                    progress.warned(build_pass, warnings)
            else:
                keys = keys or list(instance.get_dynamic_partitions(SYNTH_SHARDS.name))
                progress.pass_started(build_pass, keys)
                for key in keys:
                    shard_start = time.monotonic()
                    materialize_steps(instance, layout, build_pass.steps, key, build=build, **kwargs)
                    progress.shard_done(build_pass, key, time.monotonic() - shard_start)
            progress.pass_done(build_pass, time.monotonic() - start)
    return keys
