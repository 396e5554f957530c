"""The run launcher's run-worker health check (what the daemon's run monitoring asks it), against real processes:
alive, killed but not yet reaped (a zombie), gone, and a newer process that reused the pid. The daemon doing it
end to end: tests/test_automation_daemon.py."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.launcher import WorkerStatus

from synthkd_assets.defs.run_launcher import RUN_WORKER_HOST_TAG, HealthCheckedRunLauncher, run_worker_health


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen]:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield process
    process.kill()
    process.wait()


def started_run(instance: dg.DagsterInstance, pid: int | None, host: str | None, at: float | None = None):
    """A run as the launcher leaves it (tagged with its worker's host) whose RUN_START came from `pid` at `at`."""
    run = instance.add_run(
        dg.DagsterRun(
            job_name="synth_shard_job",
            run_id=str(uuid.uuid4()),
            tags={RUN_WORKER_HOST_TAG: host} if host else {},
            status=dg.DagsterRunStatus.STARTED,
        )
    )
    if pid is not None:
        start = dg.DagsterEvent(dg.DagsterEventType.RUN_START.value, "synth_shard_job", pid=pid)
        instance.report_dagster_event(start, run.run_id, timestamp=at if at is not None else time.time())
    return run


def test_a_live_worker_is_running(instance, sleeper):
    health = run_worker_health(instance, started_run(instance, sleeper.pid, socket.gethostname()))
    assert health.status == WorkerStatus.RUNNING, health.msg
    # a creation time within PID_REUSE_SLACK_S after RUN_START still counts as the worker (a stepped clock moves it)
    health = run_worker_health(instance, started_run(instance, sleeper.pid, socket.gethostname(), time.time() - 200))
    assert health.status == WorkerStatus.RUNNING, health.msg


def test_a_killed_worker_fails_before_and_after_it_is_reaped(instance, sleeper):
    run = started_run(instance, sleeper.pid, socket.gethostname())
    sleeper.send_signal(signal.SIGKILL)
    time.sleep(0.5)  # dead, not yet waited for: a zombie
    assert open(f"/proc/{sleeper.pid}/stat").read().split(") ")[1][0] == "Z"
    zombie = run_worker_health(instance, run)
    assert zombie.status == WorkerStatus.FAILED
    assert zombie.msg == f"run worker process {sleeper.pid} on {socket.gethostname()} is gone" + (
        " (killed without a word: SIGKILL, OOM)"
    )
    sleeper.wait()
    assert run_worker_health(instance, run).status == WorkerStatus.FAILED


def test_a_newer_process_with_the_workers_pid_is_not_the_worker(instance, sleeper):
    """The worker died long ago and its pid went to another process, created an hour after the run started."""
    run = started_run(instance, sleeper.pid, socket.gethostname(), at=time.time() - 3600)
    assert run_worker_health(instance, run).status == WorkerStatus.FAILED


@pytest.mark.parametrize("host", [None, "another-machine"])
def test_a_worker_this_machine_cannot_see_is_left_alone(instance, host):
    """No host tag (a run this launcher did not start: build.sh's in-process runs) or another machine's: a dead
    pid proves nothing here, so the run is reported running and run monitoring does nothing."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    health = run_worker_health(instance, started_run(instance, dead.pid, host))
    assert health.status == WorkerStatus.RUNNING
    where = f"on {host}" if host else "not launched by this launcher"
    assert health.msg == f"run worker {where}: not checked from here"


def test_a_run_whose_worker_has_not_started_is_running(instance):
    health = run_worker_health(instance, started_run(instance, None, socket.gethostname()))
    assert (health.status, health.msg) == (WorkerStatus.RUNNING, "run worker has not reported its process yet")


def test_the_launcher_says_it_checks_worker_health():
    assert HealthCheckedRunLauncher().supports_check_run_worker_health
