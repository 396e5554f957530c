"""The code location's jobs: one per build pass (defs/passes.py), which the build's runs are runs of, and the
shard job the sensor and the schedule request.

A build launches each pass as runs of that pass's job (synthkd_assets/launch.py), so the UI names its runs
(`synth_build_job`, not `__ephemeral_asset_job__`), opens their job, and re-executes them.
"""

import dagster as dg

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

# the type `dg.define_asset_job` returns (Dagster exports the function, not its class)
AssetJob = type(dg.define_asset_job("__synthkd_type_probe__"))

_JOB_STEPS: dict[str, tuple[str, ...]] = {}  # each job's assets, by job name (steps_job fills it)


def steps_job(name: str, steps: list[str], description: str, build_pass: str | None = None) -> AssetJob:
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
    "(synth_manifests_automation, or synth_manifests_job). Needs a sampling plan (synth_plan_job).",
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


def repair_action(asset: str, partition: str) -> str:
    """The one UI action that materializes `asset` for `partition` (the job of the pass that builds it, launched
    from its page; a global step's job takes no partition), for a failure whose cause is that asset missing.

    Raises:
        ValueError: no pass builds `asset`.
    """
    build_pass = next((p for p in build_passes() if asset in p.steps), None)
    if build_pass is None:
        raise ValueError(f"no pass of the build materializes {asset!r}")
    job = PASS_JOBS[build_pass.name].name
    if build_pass.per_shard:
        return (
            f"in the UI, Jobs > {job} > Materialize all, partition {partition!r} "
            f"(dg launch --job {job} --partition {partition})"
        )
    return f"in the UI, Jobs > {job} > Materialize all (dg launch --job {job})"


def job_for_steps(steps: list[str] | tuple[str, ...]) -> AssetJob | None:
    """The smallest job of the code location whose assets include every one of `steps` (a pass's job, of which
    a build without synth_distill runs a subset), or None when no job has them all."""
    covering = [job for job in JOBS if set(steps) <= set(_JOB_STEPS[job.name])]
    return min(covering, key=lambda job: len(_JOB_STEPS[job.name])) if covering else None


def job_steps(job_name: str) -> tuple[str, ...] | None:
    """The assets of the code location's job `job_name`, or None for a job not defined here (Dagster's implicit
    asset job)."""
    return _JOB_STEPS.get(job_name)


def is_whole_job(job: AssetJob, steps: list[str] | tuple[str, ...]) -> bool:
    """Whether `steps` are all of `job`'s assets (else a run of it selects them: the UI re-executes that subset)."""
    return set(steps) == set(_JOB_STEPS[job.name])


def smoke_run_tags(run_config: dict) -> dict[str, str]:
    """SMOKE_RUN_TAGS for a run whose config sets the `build` resource's `smoke` (a build's own run, or one of
    `build.sh --smoke`'s `dg launch` calls), else none."""
    smoke = run_config.get("resources", {}).get(BUILD_KEY, {}).get("config", {}).get("smoke")
    return dict(SMOKE_RUN_TAGS) if smoke else {}
