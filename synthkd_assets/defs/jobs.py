"""The code location's jobs: one per build pass (defs/passes.py), which the build's runs are runs of, and the
shard job the sensor and the schedule request.

A build runs each pass as a run of that pass's job, so the UI names its runs (`synth_build_job`, not
`__ephemeral_asset_job__`), opens their job, and can re-execute them: the job is in the code location.
"""

import functools
import re
from pathlib import Path

import dagster as dg
from dagster._core.definitions.repository_definition.valid_definitions import SINGLETON_REPOSITORY_NAME
from dagster._core.definitions.unresolved_asset_job_definition import UnresolvedAssetJobDefinition
from dagster._core.remote_origin import RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.storage.tags import REPOSITORY_LABEL_TAG
from dagster._core.workspace.load import location_origins_from_yaml_paths

from synthkd_assets.defs.conventions import SMOKE_RUN_TAGS, pass_tags
from synthkd_assets.defs.passes import (
    BUILD_STEPS,
    INVENTORY_STEPS,
    MANIFEST_STEPS,
    PLAN_STEPS,
    POOL_MANIFEST_STEPS,
    POOL_STEPS,
    QUOTA_STEPS,
    SCAN_STEPS,
    SHARD_STEPS,
    build_passes,
)
from synthkd_assets.defs.resources import BUILD_KEY
from synthkd_assets.defs.tags import MAX_RETRIES_TAG, WILL_RETRY_TAG

_JOB_STEPS: dict[str, tuple[str, ...]] = {}  # each job's assets, by job name (steps_job fills it)


def steps_job(
    name: str, steps: list[str], description: str, build_pass: str | None = None
) -> UnresolvedAssetJobDefinition:
    """A job of the assets `steps` and their checks (the selection a build's run of those steps has too); the
    job of `build_pass` tags its runs with it, however they are launched (a build, the UI, `dg launch --job`)."""
    _JOB_STEPS[name] = tuple(steps)
    return dg.define_asset_job(
        name,
        selection=steps_selection(steps),
        description=description,
        run_tags=pass_tags(build_pass) if build_pass else None,
    )


def steps_selection(steps: list[str] | tuple[str, ...]) -> dg.AssetSelection:
    return dg.AssetSelection.assets(*steps) | dg.AssetSelection.checks_for_assets(*steps)


synth_inventory_job = steps_job(
    "synth_inventory_job",
    INVENTORY_STEPS,
    "The inventory pass: the pinned o200k tokenizer, and one synth_shards partition per raw shard file (and per "
    "anchor-source shard), each reported with its sha256 as synth_raw's data version.",
    "inventory",
)
synth_scan_job = steps_job(
    "synth_scan_job",
    SCAN_STEPS,
    "The scan pass of one shard: Harmony, the 001 quality filters (whose exercise x language counts "
    "the sampling plan is computed from) and the prompts' MinHash signatures. Backfill it over all partitions, "
    "then run synth_plan_job.",
    "scan",
)
synth_plan_job = steps_job(
    "synth_plan_job",
    PLAN_STEPS,
    "Recompute the near-duplicate clusters, then the sampling plan from every shard's counts after "
    "them, then the validation sets. A new plan changes which rows every shard keeps: backfill synth_shard_job "
    "over all partitions afterwards (the manifests refuse a mix of plans).",
    "plan",
)
synth_build_job = steps_job(
    "synth_build_job",
    BUILD_STEPS,
    "The build pass of one scanned shard under the plan in force: sampled, tokens/masks, the Megatron trio and "
    "the DistillKit parts (synth_shard_job also scans it again first).",
    "build",
)
synth_shard_job = steps_job(
    "synth_shard_job",
    SHARD_STEPS,
    "One raw shard through Harmony, the filters, the current sampling plan, tokens/masks, the Megatron "
    "trio and the DistillKit parts. Backfill it over all partitions to build every shard; the manifests follow "
    "(eager automation, or synth_manifests_job). Needs a sampling plan (synth_plan_job).",
)
synth_manifests_job = steps_job(
    "synth_manifests_job",
    MANIFEST_STEPS,
    "Rewrite data/synth_harmony/manifest.json and the synth_kd_v1 and DistillKit manifests from all "
    "shards, then run their checks.",
    "manifest",
)
synth_quota_job = steps_job(
    "synth_quota_job",
    QUOTA_STEPS,
    "The pool's quota plan over every shard's tokens (a new one means rebuilding every shard's pool: "
    "synth_pool_job over all partitions, then synth_pool_manifest_job).",
    "quota",
)
synth_pool_job = steps_job(
    "synth_pool_job",
    POOL_STEPS,
    "One shard's part of the sequence pool under the quota plan, and its valuation features.",
    "pool",
)
synth_pool_manifest_job = steps_job(
    "synth_pool_manifest_job",
    POOL_MANIFEST_STEPS,
    "The pool's curriculum stages and its sealed sampling manifest, once every shard's pool part is built.",
    "pool_manifest",
)

# the job of each build pass (defs/passes.py `build_passes`), by pass name
PASS_JOBS = {
    "inventory": synth_inventory_job,
    "scan": synth_scan_job,
    "plan": synth_plan_job,
    "build": synth_build_job,
    "manifest": synth_manifests_job,
    "quota": synth_quota_job,
    "pool": synth_pool_job,
    "pool_manifest": synth_pool_manifest_job,
}
JOBS = [*PASS_JOBS.values(), synth_shard_job]  # the passes' order, then the sensor's

# what each pass must wait for, said beside its command
_PASS_NOTES = {
    "scan": "every shard, before the plan",
    "manifest": "once every shard is built",
    "pool_manifest": "once every shard's pool is built",
}


def launch_sequence(partition: str = "<shard>") -> list[str]:
    """A whole build as `dg launch --job` commands, one per pass, for one shard partition (the working form of
    the card's `dagster asset materialize --select synth_kd_v1`): what the README shows and upstream failures
    suggest."""
    commands = []
    for build_pass in build_passes():
        command = f"dg launch --job {PASS_JOBS[build_pass.name].name}"
        command += f" --partition {partition}" if build_pass.per_shard else ""
        note = _PASS_NOTES.get(build_pass.name)
        commands.append(f"{command}   # {note}" if note else command)
    return commands


def job_for_steps(steps: list[str] | tuple[str, ...]) -> UnresolvedAssetJobDefinition | None:
    """The smallest job of the code location whose assets include every one of `steps` (a pass's job, of which
    a build without synth_distill runs a subset), or None when no job has them all."""
    covering = [job for job in JOBS if set(steps) <= set(_JOB_STEPS[job.name])]
    return min(covering, key=lambda job: len(_JOB_STEPS[job.name])) if covering else None


def is_whole_job(job: UnresolvedAssetJobDefinition, steps: list[str] | tuple[str, ...]) -> bool:
    """Whether `steps` are all of `job`'s assets (else a run of it selects them: the UI re-executes that subset)."""
    return set(steps) == set(_JOB_STEPS[job.name])


# no automatic retry by the daemon (deploy/*/dagster.yaml `run_retries`) for a run of a build: its runs are
# in-process runs of the build's own processes (or of build.sh's `dg launch` calls), which the build runs again
# itself (and fails when killed)
NO_RUN_RETRIES_TAGS = {MAX_RETRIES_TAG: "0"}

WORKSPACE_YAML = Path(__file__).resolve().parents[2] / "workspace.yaml"  # `dg dev`'s and the daemon's location


@functools.cache
def code_location_repository() -> RemoteRepositoryOrigin:
    """The code location's repository as `dg dev`, `dagster dev -w workspace.yaml` and the daemon load it (the
    location synthkd)."""
    (location,) = location_origins_from_yaml_paths([str(WORKSPACE_YAML)])
    return RemoteRepositoryOrigin(location, SINGLETON_REPOSITORY_NAME)


def code_location_run_tags(job_name: str) -> dict[str, str]:
    """The tag by which the UI lists a run of `job_name` under the code location (Dagster's repository label;
    none for a job the code location does not have)."""
    return {REPOSITORY_LABEL_TAG: code_location_repository().get_label()} if job_name in _JOB_STEPS else {}


def record_code_location_origin(instance: dg.DagsterInstance, run_id: str) -> None:
    """Give the in-process run `run_id` of one of the code location's jobs (finished, or failed by the build
    after its process died) the origin a run launched from that code location has (Dagster's own
    `replace_job_origin`), so that the UI re-executes it there: its "Re-execute" looks the job up by the parent
    run's origin, which an in-process run lacks. The run's record is rewritten from this read of it: called
    only when nothing else writes to the run."""
    run = instance.get_run_by_id(run_id)
    if run is not None and run.job_name in _JOB_STEPS:
        origin = RemoteJobOrigin(code_location_repository(), run.job_name)
        instance.run_storage.replace_job_origin(run, origin)


def smoke_run_tags(run_config: dict) -> dict[str, str]:
    """SMOKE_RUN_TAGS for a run whose config sets the `build` resource's `smoke` (a build's own run, or one of
    `build.sh --smoke`'s `dg launch` calls), else none."""
    smoke = run_config.get("resources", {}).get(BUILD_KEY, {}).get("config", {}).get("smoke")
    return dict(SMOKE_RUN_TAGS) if smoke else {}


def adopt_launched_run(instance: dg.DagsterInstance, run_id: str) -> str | None:
    """Give a finished run of one of the code location's jobs that `dg launch --job` executed in its own process
    (build.sh's cluster route) what a run launched from the code location has: its repository tag and origin, so
    that the UI lists it there and re-executes it; and a build run's "no automatic retry". Returns why nothing
    was changed (None: adopted): an unknown run, a run of another job, one still in progress (its record is
    rewritten from one read of it) or one that has an origin already (launched by the daemon or the UI, whose
    retries are not the build's to cancel)."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        return "no such run"
    if run.job_name not in _JOB_STEPS:
        return f"a run of {run.job_name}, not of a job of the code location"
    if not run.is_finished:
        return f"still {run.status.value}"
    if run.remote_job_origin is not None:
        return "it has an origin already (launched from a code location)"
    # a build's run is never retried by the daemon, which could now relaunch it: a failed one is marked so first
    # (until its origin is recorded the daemon cannot relaunch it, and says so)
    tags = {**code_location_run_tags(run.job_name), **NO_RUN_RETRIES_TAGS, **smoke_run_tags(run.run_config)}
    if run.status == dg.DagsterRunStatus.FAILURE:
        tags[WILL_RETRY_TAG] = "false"
    instance.add_run_tags(run_id, tags)
    record_code_location_origin(instance, run_id)
    return None


# a run's log line as `dg launch` prints it: "<time> - dagster - <LEVEL> - <job> - <run id> - <pid> - ..."
_LAUNCH_LOG_RUN_ID = re.compile(
    r" - dagster - [A-Z]+ - [A-Za-z0-9_]+ - ([0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}) - "
)


def launched_run_id(output: str) -> str | None:
    """The id of the run whose log `output` (what one `dg launch` printed) holds: its first run log line's."""
    found = _LAUNCH_LOG_RUN_ID.search(output)
    return found.group(1) if found else None
