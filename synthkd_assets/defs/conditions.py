"""When the manifests are rewritten: eagerly after their shards, but only once no shard step is queued or running,
no failed run awaits its automatic retry, no build holds the data root and every shard is built in the full layout.

Dagster's `eager()` alone waits for in-progress *direct* dependencies only: synth_harmony_manifest would be
rewritten as soon as a shard's synth_harmony step finished, while the rest of that shard's run (and other
shards' queued runs) still changed what the other two manifests list. With this condition the three are
requested together, in one run, after the last shard step of the last queued or running shard run (those of
them whose every shard is built in the full layout: synth_harmony_manifest alone after scan passes only).

A build (scripts/build.sh, build_all) has moments with no shard step in progress (its plan pass, between passes),
and writes the manifests itself at its end: while it holds the data root's lock the condition is false, as the
raw sensor skips then. So is the moment between a run's failure and the retry Dagster's run retries launch for
it (seconds): manifests requested then would run beside the retry, and Dagster's eager condition swallows the
retry's updates that land while the manifests themselves are updated, so they would not be rewritten after it.
And a smoke build materializes the same assets in the same instance, so a shard's steps can be up to date in
Dagster's eyes while the layout this code location builds (the full one) has none of its records: the condition
is false for a manifest until every shard's records it reads are there. These parts are Python (a lock file, run
tags, records on disk), so synth_manifests_automation evaluates in the code server.
"""

import os
import time
from datetime import UTC, datetime

import dagster as dg

from synthkd_assets.core.buildlock import build_in_progress
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.defs.passes import SHARD_STEPS
from synthkd_assets.defs.retries import RETRY_GRACE_S  # how long a failed run's promised retry is waited for
from synthkd_assets.defs.tags import AUTO_RETRY_RUN_ID_TAG, may_be_retried  # Dagster's run-retry tags, read
from synthkd_assets.defs.upstream import first_missing_shard_record


class _TrueUnless(dg.AutomationCondition):
    """A condition in Python: true for every candidate, unless `blocked` (then for none). Not asked when there
    is no candidate (an earlier part of the condition was false)."""

    name = "true_unless"
    description = "true unless blocked"

    def blocked(self, instance: dg.DagsterInstance, asset: str) -> bool:
        raise NotImplementedError

    def evaluate(self, context: dg.AutomationContext) -> dg.AutomationResult:
        if context.candidate_subset.is_empty:
            return dg.AutomationResult(context, context.candidate_subset)
        blocked = self.blocked(context.asset_graph_view.instance, context.key.to_user_string())
        return dg.AutomationResult(context, context.get_empty_subset() if blocked else context.candidate_subset)


class NoBuildHoldsTheDataRoot(_TrueUnless):
    """True unless a build holds the lock of the data root this code location builds ($SYNTHKD_DATA_DIR, as the
    steps and the raw sensor see it)."""

    name = "no_build_holds_the_data_root"
    description = "no build (scripts/build.sh) holds the data root's lock"

    def blocked(self, instance: dg.DagsterInstance, asset: str) -> bool:
        return build_in_progress(DataLayout.from_environ(os.environ).build_lock())


class EveryShardBuiltHere(_TrueUnless):
    """True unless a shard of the raw directory lacks a record the manifest reads (`first_missing_shard_record`)
    in the layout this code location builds (the full one, on $SYNTHKD_DATA_DIR): its shard steps were
    materialized by a smoke build (the same assets, in the same instance), or not yet at all, so a run rewriting
    the manifest now would fail for want of them. A raw directory that cannot be listed blocks too: the raw
    sensor says why. Records present are not checked for being current: the eager part of the condition waits
    for the shard runs that rewrite them."""

    name = "every_shard_built_here"
    description = "every shard's records are in this code location's layout (not only a smoke build's)"

    def blocked(self, instance: dg.DagsterInstance, asset: str) -> bool:
        try:
            return first_missing_shard_record(DataLayout.from_environ(os.environ), asset) is not None
        except InputFileError:
            return True


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


class NoRunAwaitsItsRetry(_TrueUnless):
    """True unless a run failed moments ago and Dagster's run retries are about to launch it again."""

    name = "no_run_awaits_its_retry"
    description = "no failed run awaits its automatic retry"

    def blocked(self, instance: dg.DagsterInstance, asset: str) -> bool:
        return bool(runs_awaiting_retry(instance))


def _any_shard_step_in_progress() -> dg.AutomationCondition:
    in_progress = [
        dg.AutomationCondition.asset_matches(key, dg.AutomationCondition.in_progress()) for key in SHARD_STEPS
    ]
    condition = in_progress[0]
    for other in in_progress[1:]:
        condition = condition | other
    return condition.with_label("any shard step queued or in progress")


MANIFEST_CONDITION = (
    dg.AutomationCondition.eager()
    & ~_any_shard_step_in_progress()
    & NoRunAwaitsItsRetry()
    & NoBuildHoldsTheDataRoot()
    & EveryShardBuiltHere()
).with_label(
    "eager, once no shard run is queued, in progress or awaiting its retry, no build holds the data root and every "
    "shard is built in this layout"
)
