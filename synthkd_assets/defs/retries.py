"""A retry Dagster promised but lost, announced again so that Dagster's own run retries launch it.

Dagster's retry daemon (its event log consumer) reads each new run-failure event, then the run: a run it reads
as still in progress is not retried, and its cursor moves past the event for good. Dagster writes the failure
event before the run's new status, so a consumer tick between the two writes loses the retry of a run it has
tagged `dagster/will_retry=true` (seen with the daemon's run monitoring failing a run in the same second as the
consumer's first tick after a restart). Such a run would then wait for its retry for ever: a build waiting on it
hangs, and the raw sensor leaves its shard to a retry that never comes.

`synth_retry_watchdog` (a sensor, on by default) finds such runs and reports their failure once more, with a
message saying why; the retry daemon reads that event and launches the retry itself, as for any failure.
"""

import time
from datetime import UTC, datetime

import dagster as dg

from synthkd_assets.defs.tags import AUTO_RETRY_RUN_ID_TAG, WILL_RETRY_TAG

# the retry daemon reads failures every 5 s: a run tagged to be retried that has none this long after its last
# update is taken as lost
LOST_RETRY_AFTER_S = 30.0
# a failed run still without its retry this long after its last update is not waited for (by the build, the
# manifests' automation): the watchdog announces a lost one again after LOST_RETRY_AFTER_S (and its tick)
RETRY_GRACE_S = 120.0
# runs failed longer ago than this are history, not looked at
LOST_RETRY_WINDOW_S = 3600.0
# on a run whose failure was announced again: its own run id (a retry copies its parent's tags, so the tag of
# a parent names another run)
REANNOUNCED_TAG = "synthkd/failure_reannounced"
REANNOUNCED_MESSAGE = (
    "Dagster tagged this run to be retried (dagster/will_retry=true) but its retry daemon launched none in "
    f"{LOST_RETRY_AFTER_S:.0f} s (it read the run before its failure was recorded); synth_retry_watchdog reports "
    "the failure again so that the daemon launches the retry"
)


def lost_retries(instance: dg.DagsterInstance, now: float | None = None) -> list[dg.DagsterRun]:
    """The failed runs whose retry Dagster promised but has not launched: tagged WILL_RETRY_TAG "true", no
    retry named, launched from a code location (the retry daemon relaunches only those), last updated between
    LOST_RETRY_AFTER_S and LOST_RETRY_WINDOW_S before `now`, and not announced again already."""
    now = time.time() if now is None else now
    records = instance.get_run_records(
        dg.RunsFilter(
            statuses=[dg.DagsterRunStatus.FAILURE],
            tags={WILL_RETRY_TAG: "true"},
            updated_after=datetime.fromtimestamp(now - LOST_RETRY_WINDOW_S, tz=UTC),
        )
    )
    return [
        record.dagster_run
        for record in records
        if AUTO_RETRY_RUN_ID_TAG not in record.dagster_run.tags
        and record.dagster_run.tags.get(REANNOUNCED_TAG) != record.dagster_run.run_id
        and record.dagster_run.remote_job_origin is not None
        and now - record.update_timestamp.timestamp() >= LOST_RETRY_AFTER_S
    ]


def reannounce_failure(instance: dg.DagsterInstance, run: dg.DagsterRun) -> None:
    """Report `run`'s failure once more (REANNOUNCED_MESSAGE), marked so that it is done once per run."""
    instance.add_run_tags(run.run_id, {REANNOUNCED_TAG: run.run_id})
    instance.report_run_failed(run, REANNOUNCED_MESSAGE)


@dg.sensor(
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Finds failed runs that Dagster tagged to be retried (dagster/will_retry=true) but whose retry its "
    "retry daemon never launched (it read the run before its failure was recorded), and reports each one's failure "
    "once more, so that the retry daemon launches the retry. Changes no file.",
)
def synth_retry_watchdog(context: dg.SensorEvaluationContext) -> dg.SkipReason:
    if not context.instance.run_retries_enabled:
        return dg.SkipReason("run retries are off in this instance's dagster.yaml")
    lost = lost_retries(context.instance)
    for run in lost:
        reannounce_failure(context.instance, run)
        context.log.warning(f"run {run.run_id}: {REANNOUNCED_MESSAGE}")
    if lost:
        return dg.SkipReason(
            f"failure reported again for {', '.join(run.run_id[:8] for run in lost)}: {REANNOUNCED_MESSAGE}"
        )
    return dg.SkipReason("no failed run's retry is overdue")
