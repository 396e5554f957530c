"""When the manifests are rewritten: `synth_manifests_automation` (defs/automation.py) requests a run of
synth_manifests_job after their shards are rebuilt, once no run or backfill that writes what they read is queued
or in progress, no failed run awaits its automatic retry, no build holds the data root and every shard is built
in the full layout.

It is a sensor of synth_manifests_job, so the UI files its runs under that job, as it files a build's manifests
pass. Dagster's declarative automation would file them under its implicit asset job ("jobless asset
materializations"): an automation condition sensor launches asset selections through that job, and Dagster's
job automation conditions (a preview in Dagster 1.13) are evaluated only by the daemon's own automation sensor,
which cannot run the Python parts below.

A manifest is due when an asset it reads (`dependency_keys`: its shards' dataset, the plan, the tokenizer, the
harmony manifest) was materialized after the run of the manifest's latest materialization started, by another run:
an update that lands while the manifests run is still going makes them due again, not swallowed. The run
rewrites the due manifests together (those whose every shard is built: `synth_harmony_manifest` alone after scan
passes only), with their checks, after the last queued or running run of a shard step.

A build (scripts/build.sh, build_all) has moments with no run in progress (between passes) and writes the
manifests itself at its end: while it holds the data root's lock nothing is requested, as the raw sensor skips
then. So is the moment between a run's failure and the retry Dagster's run retries launch for it (seconds).
And a smoke build materializes the same assets in the same instance, so a shard's steps can be materialized in
Dagster's eyes while the layout this code location builds (the full one) has none of its records: a manifest
waits until every shard's records it reads are there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import dagster as dg

from synthkd_assets.core.buildlock import build_in_progress
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.defs.jobs import job_steps
from synthkd_assets.defs.manifests import synth_distill_manifest, synth_harmony_manifest, synth_kd_v1_manifest
from synthkd_assets.defs.passes import SHARD_STEPS
from synthkd_assets.defs.retries import RETRY_GRACE_S  # how long a failed run's promised retry is waited for
from synthkd_assets.defs.tags import (  # Dagster's run-retry tags, read
    AUTO_RETRY_RUN_ID_TAG,
    UNFINISHED_RUN_STATUSES,
    may_be_retried,
)
from synthkd_assets.defs.upstream import first_missing_shard_record

MANIFEST_ASSETS = [synth_harmony_manifest, synth_kd_v1_manifest, synth_distill_manifest]
# what each manifest reads, by manifest
MANIFEST_PARENTS: dict[str, frozenset[dg.AssetKey]] = {
    manifest.key.to_user_string(): frozenset(manifest.dependency_keys) for manifest in MANIFEST_ASSETS
}
# the assets whose runs in flight hold the manifests back: every shard step, what the manifests read, themselves
WATCHED_STEPS = frozenset(
    [*SHARD_STEPS, *MANIFEST_PARENTS, *(key.to_user_string() for keys in MANIFEST_PARENTS.values() for key in keys)]
)


def runs_awaiting_retry(instance: dg.DagsterInstance, now: float | None = None) -> list[str]:
    """Ids of the runs that failed in the last RETRY_GRACE_S seconds and that Dagster's run retries will launch
    again but have not yet: tagged to be retried (or, with run retries on, not yet tagged either way, for
    RETRY_TAG_GRACE_SECONDS), no retry named, and launched from a code location (a run of `dg launch` or
    `dg.materialize` has no origin to relaunch, and the retry daemon gives up on it)."""
    now = time.time() if now is None else now
    failed = instance.get_run_records(
        dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.FAILURE],
            updated_after=datetime.fromtimestamp(now - RETRY_GRACE_S, tz=UTC),
        )
    )

    def awaiting(record: dg.RunRecord) -> bool:
        pending = may_be_retried(record, instance.run_retries_enabled, now)
        return pending and AUTO_RETRY_RUN_ID_TAG not in record.dagster_run.tags

    return [r.dagster_run.run_id for r in failed if awaiting(r) and r.dagster_run.remote_job_origin is not None]


def run_steps(run: dg.DagsterRun) -> frozenset[str] | None:
    """The assets `run` materializes: its asset selection, else its job's assets; None when not known (a job
    of no pass, run whole: taken as writing anything)."""
    if run.asset_selection is not None:
        return frozenset(key.to_user_string() for key in run.asset_selection)
    steps = job_steps(run.job_name)
    return frozenset(steps) if steps is not None else None


def runs_in_flight(instance: dg.DagsterInstance, steps: frozenset[str] = WATCHED_STEPS) -> list[dg.DagsterRun]:
    """The queued or running runs that materialize any of `steps` (or whose assets are not known)."""
    runs = instance.get_runs(dg.RunsFilter(statuses=list(UNFINISHED_RUN_STATUSES)))
    return [run for run in runs if (written := run_steps(run)) is None or written & steps]


def backfills_in_flight(instance: dg.DagsterInstance) -> list[str]:
    """Ids of the backfills still requesting runs: between two of its submissions a backfill has none in flight."""
    backfills = instance.get_backfills(limit=50)
    return [backfill.backfill_id for backfill in backfills if backfill.status.value == "REQUESTED"]


def _run_started_at(instance: dg.DagsterInstance, record: dg.EventLogRecord) -> float:
    """When the run of `record` started (the run's record: storage ids of a sqlite instance are per run, not
    comparable across runs), or `record`'s own time when it has none (an event reported outside a run). On a
    cluster the times come from the workers' clocks: a skew shorter than a shard run's start-up cannot hide an
    update, since no shard run is in flight when the manifests' run is requested."""
    run = instance.get_run_record_by_id(record.run_id) if record.run_id else None
    if run is None:
        return record.timestamp
    return run.start_time if run.start_time is not None else run.create_timestamp.timestamp()


def is_due(instance: dg.DagsterInstance, manifest: str) -> bool:
    """Whether an asset `manifest` reads was materialized since the manifest's latest materialization started
    its run, by another run (an update the manifest may not have read), or the manifest was never written and
    something it reads was."""
    written = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=dg.AssetKey(manifest)), limit=1).records
    since = _run_started_at(instance, written[0]) if written else None
    own_run = (written[0].run_id or None) if written else None  # None: reported outside a run
    return any(_written_since(instance, parent, since, own_run) for parent in MANIFEST_PARENTS[manifest])


def _written_since(instance: dg.DagsterInstance, asset: dg.AssetKey, since: float | None, own_run: str | None) -> bool:
    """Whether `asset` was materialized after time `since` (ever, when None) by a run other than `own_run`."""
    cursor = None
    while True:
        page = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset, after_timestamp=since), limit=100, cursor=cursor, ascending=True
        )
        if any(record.run_id != own_run for record in page.records):
            return True
        if not page.has_more:
            return False
        cursor = page.cursor


@dataclass(frozen=True)
class ManifestsDecision:
    """What synth_manifests_automation does on a tick: rewrite `due` (run key `run_key`), or nothing, saying
    why in `reason`."""

    due: tuple[str, ...]
    reason: str
    run_key: str | None = None


def manifests_decision(instance: dg.DagsterInstance, paths: DataLayout) -> ManifestsDecision:
    """Which manifests to rewrite now, in one run of synth_manifests_job (module docstring), or why none.

    Args:
        instance: the Dagster instance whose materializations and runs are read.
        paths: the layout this code location builds (the full one, on $SYNTHKD_DATA_DIR).

    Returns:
        The manifests due and free to run, with the run's key (the newest materialization it follows, so one
        state is requested once), or none and the reason.
    """
    due = [manifest for manifest in MANIFEST_PARENTS if is_due(instance, manifest)]
    if not due:
        return ManifestsDecision((), "the manifests are current: nothing they read changed since they were written")
    waiting = f"{', '.join(due)} due, waiting"
    if build_in_progress(paths.build_lock()):
        return ManifestsDecision((), f"{waiting}: a build holds {paths.build_lock()} and writes them itself")
    if in_flight := runs_in_flight(instance):
        ids = ", ".join(f"{run.run_id[:8]} ({run.job_name})" for run in in_flight[:5])
        return ManifestsDecision((), f"{waiting} for runs that write what they read: {ids}")
    if backfills := backfills_in_flight(instance):
        return ManifestsDecision((), f"{waiting} for backfills still requesting runs: {', '.join(backfills)}")
    if retried := runs_awaiting_retry(instance):
        return ManifestsDecision((), f"{waiting} for the retry of failed runs: {', '.join(r[:8] for r in retried)}")
    missing = {manifest: _first_missing(paths, manifest) for manifest in due}
    ready = tuple(manifest for manifest in due if missing[manifest] is None)
    held = "; ".join(f"{manifest} waits for {missing[manifest]}" for manifest in due if missing[manifest])
    if not ready:
        return ManifestsDecision((), f"{waiting} for shards built in this code location's layout: {held}")
    newest = max(
        record.storage_id
        for parents in (MANIFEST_PARENTS[manifest] for manifest in ready)
        for parent in parents
        for record in instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=parent), limit=1).records
    )
    said = f"rewrites {', '.join(ready)}" + (f" ({held})" if held else "")
    return ManifestsDecision(ready, said, f"{'+'.join(ready)}:after-{newest}")


def _first_missing(paths: DataLayout, manifest: str) -> str | None:
    """What a run of `manifest` would fail for want of now: a shard record missing from the layout, or the raw
    directory that cannot be listed; None when nothing is."""
    try:
        missing = first_missing_shard_record(paths, manifest)
    except InputFileError as error:
        return str(error)
    return str(missing) if missing is not None else None
