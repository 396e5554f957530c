"""How a launched build waits for its runs (synthkd_assets/launch.py), on runs as Dagster records them: a run
Dagster retries is followed to its retry, the first failure cancels what the pass has still queued and says how
to repair it, a daemon counts as running only while its heartbeat is fresh. The whole route (webserver, queue,
daemon, launcher) is tested through build.sh: tests/test_build_script.py."""

from __future__ import annotations

import inspect
import io
import os
import subprocess
import threading
import time
import uuid

import dagster as dg
import pytest
import yaml

# no public constructor for a daemon heartbeat: the daemon writes them, and this test stands in for one
from dagster._daemon.types import DaemonHeartbeat

from synthkd_assets import launch
from synthkd_assets.cli import ConsoleProgress
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.parallel import remove_dead_process_directories
from synthkd_assets.defs import tags
from synthkd_assets.defs.build import BuildProgress
from synthkd_assets.defs.instances import ensure_instance_yaml
from synthkd_assets.defs.passes import build_passes
from synthkd_assets.launch import (
    REPAIR_HINT,
    DaemonKeeper,
    PassFailed,
    PassRuns,
    PassWait,
    daemon_running,
    deciding_run,
)

SCAN = next(p for p in build_passes() if p.name == "scan")


def add(instance: dg.DagsterInstance, status: dg.DagsterRunStatus, partition: str, **tags: str) -> str:
    run = dg.DagsterRun(
        job_name="synth_scan_job",
        run_id=str(uuid.uuid4()),
        status=status,
        tags={"dagster/partition": partition, **tags},
    )
    return instance.add_run(run).run_id


def test_a_retried_run_counts_by_its_retry():
    """A run whose worker died is marked to be retried: its partition is decided by the retry, not by it."""
    with dg.DagsterInstance.ephemeral() as instance:
        retry = add(instance, dg.DagsterRunStatus.SUCCESS, "synth_001")
        died = add(
            instance,
            dg.DagsterRunStatus.FAILURE,
            "synth_001",
            **{"dagster/will_retry": "true", "dagster/auto_retry_run_id": retry},
        )
        done: list[str | None] = []
        waiting = PassWait(instance, PassRuns(SCAN, {died: "synth_001"}), lambda key, _: done.append(key))
        assert waiting.poll()
    assert [run.run_id for run in waiting.finished] == [retry] and done == ["synth_001"]


def test_a_look_at_a_pass_of_500_runs_reads_them_in_one_query(monkeypatch):
    """At SYNTH's 500 files a shard pass has 500 runs: the build reads them all at each look (every POLL_SECONDS)
    in one query, not one by one (~1.7 CPU s a look on sqlite), and still reports them in partition order."""
    with dg.DagsterInstance.ephemeral() as instance:
        keys = [f"synth_{i:03d}" for i in range(1, 501)]
        runs = {add(instance, dg.DagsterRunStatus.STARTED, key): key for key in keys}
        queries: list[str] = []
        for name in ("get_runs", "get_run_by_id", "get_run_record_by_id", "get_run_records"):
            monkeypatch.setattr(instance, name, _counted(getattr(instance, name), name, queries))
        done: list[str | None] = []
        waiting = PassWait(instance, PassRuns(SCAN, runs), lambda key, _: done.append(key))
        assert not waiting.poll() and queries == ["get_runs"] and done == []
        for run_id in list(runs)[::-1][:250]:  # the second half finishes, last first
            instance.handle_run_event(run_id, dg.DagsterEvent(dg.DagsterEventType.RUN_SUCCESS.value, "synth_scan_job"))
        queries.clear()
        assert not waiting.poll() and queries == ["get_runs"] and done == keys[250:]
        for run_id in list(runs)[:250]:
            instance.handle_run_event(run_id, dg.DagsterEvent(dg.DagsterEventType.RUN_SUCCESS.value, "synth_scan_job"))
        queries.clear()
        assert waiting.poll() and queries == ["get_runs"] and done == keys[250:] + keys[:250]


def test_a_failure_in_a_pass_of_500_runs_cancels_the_queued_in_a_few_queries(monkeypatch):
    """The first failure cancels the pass's 499 queued runs: read in one query to cancel them, and once more so
    that the same look sees them canceled, not one by one."""
    with dg.DagsterInstance.ephemeral() as instance:
        failed = add(instance, dg.DagsterRunStatus.FAILURE, "synth_001")
        runs = {failed: "synth_001"}
        runs.update(
            {add(instance, dg.DagsterRunStatus.NOT_STARTED, f"synth_{i:03d}"): f"synth_{i:03d}" for i in range(2, 501)}
        )
        queries: list[str] = []
        for name in ("get_runs", "get_run_by_id", "get_run_record_by_id", "get_run_records"):
            monkeypatch.setattr(instance, name, _counted(getattr(instance, name), name, queries))
        with pytest.raises(PassFailed) as raised:
            PassWait(instance, PassRuns(SCAN, runs)).poll()
        # the look, the failed run's record (for its retry tag), the cancel, the look again
        assert queries == ["get_runs", "get_run_record_by_id", "get_runs", "get_runs"]
        monkeypatch.undo()
        canceled = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.CANCELED]))
    assert len(canceled) == 499 and raised.value.partition == "synth_001"
    assert raised.value.lines[-1] == "not run (canceled after the failure): " + ", ".join(list(runs.values())[1:])


def _counted(method, name: str, calls: list[str]):
    """`method`, its calls from launch.py listed by `name` (Dagster's own reads, when it records an event, are
    not the build's)."""

    def counted(*args, **kwargs):
        caller = inspect.currentframe().f_back
        if caller is not None and caller.f_code.co_filename == launch.__file__:
            calls.append(name)
        return method(*args, **kwargs)

    return counted


def test_a_failed_run_waits_for_dagsters_word_on_its_retry(monkeypatch):
    """Dagster marks a run failed, then tags whether its run retries will launch it again: in between, the run
    decides nothing (the build once gave up a partition there and canceled the retry on its way)."""
    with dg.DagsterInstance.ephemeral(settings={"run_retries": {"enabled": True}}) as instance:
        failed = add(instance, dg.DagsterRunStatus.FAILURE, "synth_001")
        assert deciding_run(instance, instance.get_run_by_id(failed)) is None
        instance.add_run_tags(failed, {"dagster/will_retry": "false"})
        assert deciding_run(instance, instance.get_run_by_id(failed)).run_id == failed
        untagged = add(instance, dg.DagsterRunStatus.FAILURE, "synth_002")
        monkeypatch.setattr(tags, "RETRY_TAG_GRACE_SECONDS", 0.0)  # a tag that never came
        assert deciding_run(instance, instance.get_run_by_id(untagged)).run_id == untagged


def test_a_failed_run_read_before_its_retry_tag_is_decided_on_the_tag():
    """The build read a run just failed, without its tag; Dagster then tags it to be retried and submits the
    retry: the run decides on what Dagster wrote, not on the read before (the build once gave up a partition
    there, its retry on the way)."""
    with dg.DagsterInstance.ephemeral(settings={"run_retries": {"enabled": True}}) as instance:
        failed = add(instance, dg.DagsterRunStatus.FAILURE, "synth_001")
        read_before_the_tag = instance.get_run_by_id(failed)
        retry = add(instance, dg.DagsterRunStatus.SUCCESS, "synth_001")
        instance.add_run_tags(failed, {"dagster/will_retry": "true", "dagster/auto_retry_run_id": retry})
        assert deciding_run(instance, read_before_the_tag).run_id == retry


def test_a_retry_dagster_promised_but_never_launched_is_not_waited_for_ever(monkeypatch):
    """Tagged to be retried, no retry named: awaited, until RETRY_GRACE_S after its last update (the retry
    watchdog announces a lost retry's failure again well before: defs/retries.py); then it decides as failed."""
    with dg.DagsterInstance.ephemeral(settings={"run_retries": {"enabled": True}}) as instance:
        promised = add(instance, dg.DagsterRunStatus.FAILURE, "synth_001", **{"dagster/will_retry": "true"})
        assert deciding_run(instance, instance.get_run_by_id(promised)) is None
        monkeypatch.setattr(launch, "RETRY_GRACE_S", 0.0)
        assert deciding_run(instance, instance.get_run_by_id(promised)).run_id == promised


def test_the_first_failure_cancels_the_queued_runs_and_names_the_repair():
    with dg.DagsterInstance.ephemeral() as instance:
        failed = add(instance, dg.DagsterRunStatus.FAILURE, "synth_002")
        queued = add(instance, dg.DagsterRunStatus.NOT_STARTED, "synth_003")  # not yet launched
        succeeded = add(instance, dg.DagsterRunStatus.SUCCESS, "synth_001")
        runs = PassRuns(SCAN, {succeeded: "synth_001", failed: "synth_002", queued: "synth_003"})
        with pytest.raises(PassFailed) as raised:
            PassWait(instance, runs).poll()
        assert instance.get_run_by_id(queued).status == dg.DagsterRunStatus.CANCELED
    assert raised.value.partition == "synth_002" and raised.value.build_pass == SCAN
    assert raised.value.lines == [
        f"run {failed[:8]} of synth_scan_job (partition synth_002) failed:",
        "  (no check or step error recorded)",
        f"  repair: {REPAIR_HINT.format(run_id=failed)}",
        "not run (canceled after the failure): synth_003",
    ]


def test_a_daemon_is_running_only_while_its_heartbeat_is_fresh():
    """A stopped daemon's last heartbeat stays in the instance: a build must not wait on it for ever. The build's
    own daemon removes its heartbeats when it stops."""
    with dg.DagsterInstance.ephemeral() as instance:
        assert not daemon_running(instance)
        now = time.time()
        instance.add_daemon_heartbeat(DaemonHeartbeat(now - 10, "SENSOR", "a-daemon", None))
        assert daemon_running(instance, now) and not daemon_running(instance, now + 120)
        keeper = DaemonKeeper(instance)
        keeper.keep()  # a fresh heartbeat: no daemon of its own
        assert keeper.process is None
        keeper.close()
        assert daemon_running(instance, now)  # another's heartbeats are left alone


def test_a_stop_outlasts_a_run_started_as_it_was_canceled_and_a_late_retry():
    """Stopping a build while Dagster's daemon works its queue: a queued run the daemon was dequeuing as the
    build canceled it starts anyway (its STARTING event lands after the cancel), and the retry of a run that
    failed just before is submitted after the stop began. The stop keeps asking until nothing of the build has
    been unfinished for a while: the late run is terminated (here: no code server, so marked canceled at the
    grace), the late retry canceled, and a failed run is told not to retry. It once returned at once and left
    the late run in progress."""
    build = {launch.BUILD_TAG: uuid.uuid4().hex}
    with dg.DagsterInstance.ephemeral() as instance:
        dequeued = add(instance, dg.DagsterRunStatus.NOT_STARTED, "synth_001", **build)  # as queued
        failed = add(instance, dg.DagsterRunStatus.FAILURE, "synth_002", **build)

        def the_daemon() -> None:  # as QueuedRunCoordinatorDaemon and the run worker report a dequeued run
            time.sleep(0.3)
            for event_type in (dg.DagsterEventType.PIPELINE_STARTING, dg.DagsterEventType.PIPELINE_START):
                event = dg.DagsterEvent(event_type_value=event_type.value, job_name="synth_scan_job")
                instance.report_dagster_event(event, run_id=dequeued)
                time.sleep(1.0)
            add(instance, dg.DagsterRunStatus.NOT_STARTED, "synth_002", **build, **{"dagster/retry_number": "1"})

        daemon = threading.Thread(target=the_daemon)
        daemon.start()
        launch.stop_runs(instance, launch.stoppable_runs_of_build(instance, build[launch.BUILD_TAG]), grace=8.0)
        daemon.join()
        runs = instance.get_runs(filters=dg.RunsFilter(tags=build))
        assert {run.status for run in runs} == {dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE}
        assert len(runs) == 3 and instance.get_run_by_id(failed).tags["dagster/will_retry"] == "false"


def test_a_stop_with_nothing_to_stop_returns_at_once(monkeypatch):
    """A build starts by stopping what dead builds of its data root left: when they left nothing, it does not wait
    for the stop to settle."""
    monkeypatch.setattr(launch, "STOP_SETTLE_SECONDS", 60.0)
    with dg.DagsterInstance.ephemeral() as instance:
        add(instance, dg.DagsterRunStatus.FAILURE, "synth_001", **{"dagster/will_retry": "false"})
        start = time.monotonic()
        launch.stop_runs(instance, lambda: instance.get_runs(), grace=120.0)
        assert time.monotonic() - start < 30.0


class Heard(BuildProgress):
    def __init__(self) -> None:
        self.done: list[str] = []

    def pass_done(self, build_pass, seconds: float) -> None:
        self.done.append(build_pass.name)


class NoDaemon:
    def keep(self) -> None:
        pass


def test_a_pass_waits_only_for_the_passes_it_runs_after_and_a_failure_beside_it_is_raised_at_once(monkeypatch):
    """The quota plan runs after the build pass, not after the manifests: launched beside a manifests run still
    going, its wait ends when its own `after` passes are through, the manifests still waited for. When the
    manifests run then fails, the next wait raises it at once, whatever pass it waits for."""
    monkeypatch.setattr(launch, "POLL_SECONDS", 0.05)
    passes = {p.name: p for p in build_passes()}
    assert passes["quota"].after == ("build",) and set(passes["pool_manifest"].after) == {"pool", "manifest"}
    with dg.DagsterInstance.ephemeral() as instance:
        manifests = add(instance, dg.DagsterRunStatus.STARTED, "")
        quota = add(instance, dg.DagsterRunStatus.SUCCESS, "")
        launched = {
            name: launch.LaunchedPass(passes[name], launch.PassWait(instance, PassRuns(passes[name], {run: None})), 0)
            for name, run in (("manifest", manifests), ("quota", quota))
        }
        heard = Heard()
        launch.await_passes(instance, launched, set(passes["pool"].after), heard, NoDaemon())
        assert heard.done == ["quota"] and list(launched) == ["manifest"]
        instance.report_run_failed(instance.get_run_by_id(manifests), "a manifest step failed")
        instance.add_run_tags(manifests, {"dagster/will_retry": "false"})
        with pytest.raises(PassFailed) as raised:
            launch.await_passes(instance, launched, set(), heard, NoDaemon())
    assert raised.value.build_pass == passes["manifest"] and heard.done == ["quota"]


def test_the_console_names_the_pass_that_failed_not_the_one_started_last(tmp_path):
    """The manifests fail while the pool pass runs beside them: build.sh's FAILED line names the manifests."""
    passes = {p.name: p for p in build_passes()}
    progress = ConsoleProgress(io.StringIO(), DataLayout(tmp_path / "raw", tmp_path / "data"))
    for name in ("manifest", "quota", "pool"):
        progress.pass_started(passes[name], ["synth_001"] if passes[name].per_shard else [])
    assert progress.failing(None, passes["manifest"]).startswith("manifest (after ")
    assert progress.failing("synth_001").startswith("pool synth_001 (after ")


LOCATIONS = "{ workspaceOrError { ... on Workspace { locationEntries { name locationOrLoadError { __typename } } } } }"


def test_the_builds_webserver_and_daemon_share_one_code_server(tmp_path, monkeypatch):
    """`launch_services` starts one code server and points the webserver and the daemon at it: the definitions
    load once, and no daemon replaces its own code server every minute. (A fresh heartbeat stands in for a
    running daemon, so none of the daemon's sensors acts on this checkout's data.)"""
    import psutil

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    ensure_instance_yaml(tmp_path)
    with dg.DagsterInstance.get() as instance:
        instance.add_daemon_heartbeat(DaemonHeartbeat(time.time(), "SENSOR", "another-daemon", None))
        with launch.launch_services(instance) as (server, keeper):
            workspace = keeper.workspace
            assert keeper.process is None  # the running daemon serves the queue; one started would use `workspace`
            assert server.process.args[server.process.args.index("-w") + 1] == str(workspace)
            [location] = yaml.safe_load(workspace.read_text())["load_from"]
            assert location["grpc_server"]["location_name"] == launch.LOCATION_NAME
            entries = server.query(LOCATIONS, {})["workspaceOrError"]["locationEntries"]
            assert [(e["name"], e["locationOrLoadError"]["__typename"]) for e in entries] == [
                (launch.LOCATION_NAME, "RepositoryLocation")  # loaded, not PythonError
            ]
            servers = [p for p in psutil.Process().children(recursive=True) if "grpc" in " ".join(p.cmdline())]
            assert len(servers) == 1 and location["grpc_server"]["socket"] in " ".join(servers[0].cmdline())
        assert not workspace.exists()  # the code server's directory goes with it


def test_a_killed_builds_code_server_directory_is_removed_by_the_next(tmp_path):
    """A build killed with SIGKILL leaves its code server's directory (socket, workspace file) behind; the next
    build's code server removes it, and leaves a running build's alone."""
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now
    orphaned = tmp_path / f"{launch.CODE_DIRECTORY_PREFIX}{gone.pid}-k3x9"
    running = tmp_path / f"{launch.CODE_DIRECTORY_PREFIX}{os.getpid()}-a1b2"
    unrelated = tmp_path / f"{launch.CODE_DIRECTORY_PREFIX}old"  # no pid in its name: not a build's, left alone
    for directory in (orphaned, running, unrelated):
        directory.mkdir()
        (directory / "workspace.yaml").write_text("{}")
    assert remove_dead_process_directories(launch.CODE_DIRECTORY_PREFIX, tmp_path) == [orphaned]
    assert not orphaned.exists() and running.is_dir() and unrelated.is_dir()
