"""The run launcher of the local and cluster instances: Dagster's DefaultRunLauncher, plus the run-worker health
check that Dagster's run monitoring needs.

When only a run's process dies, the code server that started it says so; when the code server dies with it (the
daemon's process group or machine killed: SIGKILL, the kernel's OOM killer), nothing is left to say so, and
without this the run stays STARTED for ever: the sensor and schedule, which request a shard once per content,
never rebuild that shard. With it, the daemon's run monitoring (`run_monitoring` in deploy/*/dagster.yaml)
marks such a run failed, and Dagster's run retries (`run_retries`) launch it again from the failed step (the
local instance does not retry a run whose step raised or whose check failed: `retry_on_asset_or_op_failure`).

A run worker is a process on the machine whose code server started it: the launcher tags each run with that
machine's name, and only a daemon on the same machine judges its health (elsewhere, and for runs it did not
launch, it answers "running", which changes nothing).
"""

from __future__ import annotations

import socket
import typing

import dagster as dg
import psutil

# A custom launcher's health check is Dagster's documented extension point, but Dagster exports only the launcher
# (DefaultRunLauncher), not the types its methods' signatures name: they are read from those public signatures
# (an upgrade that changes them fails when this module loads) instead of imported from dagster._core.
CheckRunHealthResult = typing.get_type_hints(dg.DefaultRunLauncher.check_run_worker_health)["return"]
WorkerStatus = typing.get_type_hints(CheckRunHealthResult)["status"]
LaunchRunContext = typing.get_type_hints(dg.DefaultRunLauncher.launch_run)["context"]

RUN_WORKER_HOST_TAG = "synthkd/run_worker_host"
# a process created this long after the run's RUN_START event is another process that reused the pid. Generous:
# a process's creation time is derived from the boot time, which moves when the wall clock is stepped (NTP, a
# resumed VM), and a live worker taken for dead would be run twice; a pid reused sooner is missed (the run then
# stays STARTED, as without this launcher)
PID_REUSE_SLACK_S = 300.0


class HealthCheckedRunLauncher(dg.DefaultRunLauncher):
    """DefaultRunLauncher whose run workers the daemon's run monitoring can see die (module docstring)."""

    def launch_run(self, context: LaunchRunContext) -> None:
        self._instance.add_run_tags(context.dagster_run.run_id, {RUN_WORKER_HOST_TAG: socket.gethostname()})
        super().launch_run(context)

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        return run_worker_health(self._instance, run)


def run_worker_health(instance: dg.DagsterInstance, run: dg.DagsterRun) -> CheckRunHealthResult:
    """FAILED when the process that started `run` (the pid its RUN_START event carries) no longer exists, is a
    zombie, or is a newer process with the same pid (PID_REUSE_SLACK_S); RUNNING otherwise, and whenever that
    cannot be known here."""
    host = run.tags.get(RUN_WORKER_HOST_TAG)
    if host != socket.gethostname():
        where = f"on {host}" if host else "not launched by this launcher"
        return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker {where}: not checked from here")
    records = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.RUN_START, limit=1).records
    event = records[0].event_log_entry if records else None
    if event is None or event.dagster_event is None or event.dagster_event.pid is None:
        return CheckRunHealthResult(WorkerStatus.RUNNING, "run worker has not reported its process yet")
    pid = event.dagster_event.pid
    try:
        process = psutil.Process(pid)
        alive = (
            process.status() != psutil.STATUS_ZOMBIE and process.create_time() <= event.timestamp + PID_REUSE_SLACK_S
        )
    except psutil.NoSuchProcess:
        alive = False
    if alive:
        return CheckRunHealthResult(WorkerStatus.RUNNING, f"run worker process {pid} is alive")
    return CheckRunHealthResult(
        WorkerStatus.FAILED, f"run worker process {pid} on {host} is gone (killed without a word: SIGKILL, OOM)"
    )
