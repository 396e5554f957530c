"""A build launched through the Dagster instance: every pass of defs/passes.py, each once the passes it runs
after are through, submitted to the instance's run queue as runs of the pass's job and waited for.

This is what scripts/build.sh runs (`python -m synthkd_assets.cli build`), locally as on a cluster: the runs go
through the run coordinator, launcher, run monitoring and run retries that $DAGSTER_HOME/dagster.yaml
configures, and execute wherever that instance's launcher and the code location's executor put them. A shard
pass is one run of the pass's job per registered shard partition, any other pass one run. Runs are submitted
through Dagster's GraphQL API (the `launchRun` mutation the UI's launch dialog sends) on a webserver the build
starts, so they carry the code location's origin as any launched run does, and the UI re-executes them.

Queued runs are started by a Dagster daemon: the one of `dg dev` or of the cluster when it is running for this
instance, else one this build starts for itself and stops at the end. Stopping the build (SIGINT, SIGTERM,
SIGHUP) cancels its queued runs and terminates its running ones through the instance.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import dagster as dg
import yaml

from synthkd_assets.core.parallel import die_with_parent, process_directory, remove_dead_process_directories
from synthkd_assets.defs.conventions import pass_tags
from synthkd_assets.defs.failures import check_evaluations, failed_check_lines, run_failure_lines
from synthkd_assets.defs.ingest import INVENTORY_WARNINGS
from synthkd_assets.defs.instances import REPO_ROOT
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.passes import Pass
from synthkd_assets.defs.retries import RETRY_GRACE_S
from synthkd_assets.defs.tags import (
    AUTO_RETRY_RUN_ID_TAG,
    PARTITION_TAG,
    RETRY_NUMBER_TAG,
    UNFINISHED_RUN_STATUSES,
    WILL_RETRY_TAG,
    retry_tag_pending,
)

WORKSPACE_YAML = REPO_ROOT / "workspace.yaml"  # the code location, as `dg dev` and the daemon load it
LOCATION_NAME = "synthkd"  # workspace.yaml's location_name (pyproject's [tool.dg.project] code_location_name)
REPOSITORY_NAME = "__repository__"  # the one repository of a `Definitions` code location
BUILD_TAG = "synthkd/build"  # on every run of one build, the same value
DATA_ROOT_TAG = "synthkd/data_root"  # on every run of a build: the data root it builds (resolved)
WEBSERVER_START_SECONDS = 180.0  # the webserver loads the code location before it answers
CODE_DIRECTORY_PREFIX = "synthkd-code-"  # a build's code server directory: this, the build's pid, a suffix
CODE_SERVER_START_SECONDS = 180.0  # the code server loads the definitions before it answers
GRAPHQL_TIMEOUT_SECONDS = 600.0  # one launch (the webserver plans the run); generous for a loaded machine
LAUNCH_THREADS = 4  # a shard pass's launches sent at once (the webserver plans each run)
POLL_SECONDS = 0.5  # how often the build asks the instance for its runs' status
DAEMON_FRESH_SECONDS = 65.0  # a daemon whose last heartbeat is older is not running (it beats every 30 s)
DAEMON_CHECK_SECONDS = 5.0  # how often a waiting build asks whether a daemon still serves its queue
STOP_GRACE_SECONDS = 45.0  # runs still going this long after the build asked them to stop are marked canceled
STOP_SETTLE_SECONDS = 3.0  # a stop is over once its runs have been stopped for this long (no late dequeue or retry)
DEAD_BUILD_GRACE_SECONDS = 10.0  # the same for the runs of a killed earlier build, found by the next one

# what repairs a failed run once its cause is fixed: a new build, whose inventory rescans the inputs (a run
# re-executed as it was would read a fixed input file against the old scan and refuse it); a failure whose cause
# was not in the input files (the code, a full disk) can be re-executed from the run's page in the UI
REPAIR_HINT = (
    "fix the cause, then run build.sh again; if the cause was not an input file (the code, a full disk), "
    "Re-execute run {run_id} from its page in the Dagster UI (Runs) instead"
)
_LAUNCH_RUN = """
mutation($params: ExecutionParams!) {
  launchRun(executionParams: $params) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on RunConfigValidationInvalid { errors { message } }
    ... on Error { message }
  }
}"""
_STOPPABLE = (*UNFINISHED_RUN_STATUSES, dg.DagsterRunStatus.FAILURE)  # a failed run may still be retried


class LaunchFailed(RuntimeError):
    """Dagster refused to launch a pass's run (invalid config, the code location failed to load)."""


class PassFailed(RuntimeError):
    """A run of the pass failed, or one of its blocking checks; `lines`: what failed and why, per run."""

    def __init__(self, build_pass: Pass, partition: str | None, lines: Sequence[str]):
        super().__init__("\n".join(lines))
        self.build_pass, self.partition, self.lines = build_pass, partition, list(lines)


def _bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


class CodeServer:
    """The code location's gRPC code server (`dagster api grpc`, on a Unix socket) that the build's webserver and
    daemon share, as `dagster dev` shares one: the definitions are loaded once, by this process, which also starts
    the build's runs. Given workspace.yaml, each of them would start a code server of its own, and the daemon
    would replace its own every minute (Dagster's workspace refresh), loading the definitions again each time.
    `workspace` names it for `-w`, under workspace.yaml's location name (its module and working directory
    loaded), so runs launched through it are runs of the same code location. Its lines go to `log`; it dies with
    this process."""

    def __init__(self, log: IO[str] | None = None):
        remove_dead_process_directories(CODE_DIRECTORY_PREFIX)  # those of builds killed with SIGKILL
        self.directory = process_directory(CODE_DIRECTORY_PREFIX)
        self.socket = self.directory / "grpc.sock"
        self.workspace = self.directory / "workspace.yaml"
        location = yaml.safe_load(WORKSPACE_YAML.read_text())["load_from"][0]["python_module"]
        grpc_server = {"socket": str(self.socket), "location_name": location["location_name"]}
        self.workspace.write_text(json.dumps({"load_from": [{"grpc_server": grpc_server}]}))  # JSON is YAML
        command = [_bin("dagster"), "api", "grpc", "-m", location["module_name"]]
        command += ["-d", str(REPO_ROOT / location["working_directory"]), "--location-name", location["location_name"]]
        self.process = _start([*command, "--socket", str(self.socket)], log)

    def wait_ready(self, timeout: float = CODE_SERVER_START_SECONDS) -> None:
        """Wait until the server accepts connections (it binds its socket once the definitions are loaded).
        Raises LaunchFailed when it exits or does not answer within `timeout` seconds."""
        _await_answer(self.process, "code server", self._answers, timeout, pause=0.1)

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX) as probe:
            try:
                probe.connect(str(self.socket))
                return True
            except OSError:
                return False

    def close(self) -> None:
        _stop(self.process)
        shutil.rmtree(self.directory, ignore_errors=True)


class GraphQLServer:
    """A Dagster webserver of the code location (`workspace`, by default workspace.yaml) on $DAGSTER_HOME's
    instance, on a free port of 127.0.0.1, for the build's launches: the GraphQL API the UI's "Launch run" uses.
    Its lines go to `log`; it dies with this process."""

    def __init__(self, log: IO[str] | None = None, workspace: Path = WORKSPACE_YAML):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ready = False
        webserver = [_bin("dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1", "-p", str(self.port)]
        self.process = _start(webserver, log)

    def wait_ready(self, timeout: float = WEBSERVER_START_SECONDS) -> None:
        """Wait until the server answers (it has loaded the code location), once. Raises LaunchFailed when it
        exits or does not answer within `timeout` seconds."""
        if not self.ready:
            _await_answer(self.process, "webserver", self._answers, timeout, pause=0.2)
            self.ready = True

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/server_info", timeout=5):
                return True
        except OSError:
            return False

    def query(self, query: str, variables: Mapping) -> dict:
        """Execute one GraphQL operation; its `data`. Raises LaunchFailed on a GraphQL error."""
        self.wait_ready()
        request = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": query, "variables": dict(variables)}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=GRAPHQL_TIMEOUT_SECONDS) as response:
                answer = json.loads(response.read())
        except urllib.error.HTTPError as error:  # a refused launch can come back as a 500 whose body says why
            try:
                answer = json.loads(error.read())
            except ValueError:
                raise LaunchFailed(f"the Dagster webserver answered {error.code} {error.reason}") from error
        if answer.get("errors"):
            raise LaunchFailed("; ".join(error.get("message", str(error)) for error in answer["errors"]))
        return answer["data"]

    def close(self) -> None:
        _stop(self.process)


def _await_answer(
    process: subprocess.Popen, service: str, answers: Callable[[], bool], timeout: float, pause: float
) -> None:
    """Ask `answers()` every `pause` seconds until it says yes. Raises LaunchFailed when the Dagster `service`'s
    `process` exits first, or it has not answered within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LaunchFailed(f"the Dagster {service} exited {process.returncode} (its lines are in the log)")
        if answers():
            return
        time.sleep(pause)
    raise LaunchFailed(f"the Dagster {service} did not answer within {timeout:.0f}s")


def _start(command: list[str], log: IO[str] | None) -> subprocess.Popen:
    """A Dagster service of this build (webserver, daemon), run from the repository root, its lines in `log`,
    dying with this process."""
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        stdout=log or subprocess.DEVNULL,
        stderr=log or subprocess.DEVNULL,
        preexec_fn=_die_with_this_process(os.getpid()),
    )


def _stop(process: subprocess.Popen, grace: float = 30.0) -> None:
    """SIGTERM, then SIGKILL if it is still running `grace` seconds later."""
    process.terminate()
    try:
        process.wait(grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launched(result: dict) -> dict:
    kind = result["__typename"]
    if kind == "LaunchRunSuccess":
        return result
    reasons = [e["message"] for e in result.get("errors", [])] or [result.get("message", "")]
    raise LaunchFailed(f"{kind}: {'; '.join(r for r in reasons if r)}")


def _selector(job_name: str) -> dict:
    return {"repositoryLocationName": LOCATION_NAME, "repositoryName": REPOSITORY_NAME, "jobName": job_name}


def _tag_list(tags: Mapping[str, str]) -> list[dict]:
    return [{"key": key, "value": value} for key, value in tags.items()]


def launch_run(
    server: GraphQLServer,
    job_name: str,
    run_config: dict,
    tags: Mapping[str, str],
    selection: Mapping[str, Any] | None = None,
) -> str:
    """Submit one run of `job_name` to the instance's run queue; its run id. `selection`: the selector's asset and
    check selection (`assetSelection`, `assetCheckSelection`), as the UI's asset graph sends them."""
    params = {
        "selector": {**_selector(job_name), **(selection or {})},
        "runConfigData": run_config,
        "executionMetadata": {"tags": _tag_list(tags)},
    }
    result = _launched(server.query(_LAUNCH_RUN, {"params": params})["launchRun"])
    return result["run"]["runId"]


def launch_shard_runs(
    server: GraphQLServer, job_name: str, partitions: Sequence[str], run_config: dict, tags: Mapping[str, str]
) -> dict[str, str]:
    """Submit one run of `job_name` per partition of `partitions` to the run queue, in their order (as the UI's
    launch of a partition does: the partition as the run's `dagster/partition` tag); run id -> partition. Runs,
    not a backfill: Dagster's run retries do not retry a run of a backfill it has finished submitting."""
    with ThreadPoolExecutor(max_workers=LAUNCH_THREADS) as pool:
        ids = pool.map(lambda key: launch_run(server, job_name, run_config, {**tags, PARTITION_TAG: key}), partitions)
        return dict(zip(ids, partitions, strict=True))


def daemon_running(instance: dg.DagsterInstance, now: float | None = None) -> bool:
    """Whether a Dagster daemon serving `instance` sent a heartbeat in the last DAEMON_FRESH_SECONDS."""
    now = time.time() if now is None else now
    beats = instance.get_daemon_heartbeats()
    return any(now - beat.timestamp < DAEMON_FRESH_SECONDS for beat in beats.values())


class DaemonKeeper:
    """Keeps a Dagster daemon serving `instance` while a build waits on its queue: the one of `dg dev` or of the
    cluster when its heartbeat is fresh, else one started here (`dagster-daemon run`, its lines in `log`, dying
    with this process), which `close` stops and whose heartbeats it removes (so that the next build does not
    take them for a running daemon)."""

    def __init__(self, instance: dg.DagsterInstance, log: IO[str] | None = None, workspace: Path = WORKSPACE_YAML):
        self.instance, self.log, self.workspace = instance, log, workspace
        self.process: subprocess.Popen | None = None
        self.checked = 0.0

    def keep(self) -> None:
        """Start a daemon unless one is running (asked at most every few seconds)."""
        if self.process is not None and self.process.poll() is None:
            return
        if time.monotonic() - self.checked < DAEMON_CHECK_SECONDS:
            return
        self.checked = time.monotonic()
        if self.process is None and daemon_running(self.instance):
            return
        self.process = _start([_bin("dagster-daemon"), "run", "-w", str(self.workspace)], self.log)

    def close(self) -> None:
        if self.process is None:
            return
        _stop(self.process)
        self.instance.wipe_daemon_heartbeats()
        self.process = None


@contextmanager
def launch_services(
    instance: dg.DagsterInstance, log: IO[str] | None = None
) -> Iterator[tuple[GraphQLServer, DaemonKeeper]]:
    """The webserver the build launches through and the daemon that starts its runs, for the block (both
    starting at once, once their shared code server answers); stopped when the block ends (the webserver sooner
    when the block stops it: `launch_build` does once it has launched every pass), the code server last (a run
    is terminated through the code server that started it)."""
    code = CodeServer(log)
    try:
        code.wait_ready()
        server = GraphQLServer(log, code.workspace)
        keeper = DaemonKeeper(instance, log, code.workspace)
        try:
            keeper.keep()
            yield server, keeper
        finally:
            keeper.close()
            server.close()
    finally:
        code.close()


def _die_with_this_process(parent: int) -> Callable[[], None]:
    """A child's preexec_fn: the kernel sends the child SIGTERM when `parent` (this process) exits."""
    return lambda: die_with_parent(signal.SIGTERM, parent)


@dataclass
class PassRuns:
    """The runs of one pass: by run id, the partition each builds (None: unpartitioned); a run Dagster retried is
    followed by its retry."""

    build_pass: Pass
    runs: dict[str, str | None]


def deciding_run(instance: dg.DagsterInstance, run: dg.DagsterRun) -> dg.DagsterRun | None:
    """The run that decides `run`'s partition: itself, or the retry Dagster launched for it (None: still to
    come, or still running).

    With run retries on, Dagster marks a run failed and then, in a second write, tags it with whether it will be
    retried: a failed run without the tag is undecided (a build that read it in between would give up a partition
    whose retry is on its way), for at most RETRY_TAG_GRACE_SECONDS after its last update. A run tagged to be
    retried whose retry Dagster has not launched RETRY_GRACE_S after its last update decides as failed."""
    while True:
        if run.status in UNFINISHED_RUN_STATUSES:
            return None
        if run.status == dg.DagsterRunStatus.FAILURE and WILL_RETRY_TAG not in run.tags:  # a record only then
            record = instance.get_run_record_by_id(run.run_id)
            if record is not None and retry_tag_pending(record, instance.run_retries_enabled):
                return None
            run = record.dagster_run if record is not None else run  # its tag may have been written since
        if run.status != dg.DagsterRunStatus.FAILURE or run.tags.get(WILL_RETRY_TAG) != "true":
            return run
        retry_id = run.tags.get(AUTO_RETRY_RUN_ID_TAG)
        retry = instance.get_run_by_id(retry_id) if retry_id else None
        if retry is None:
            return run if retry_id is None and _retry_overdue(instance, run) else None
        run = retry


def _retry_overdue(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """Whether the retry `run` was tagged for is still not launched RETRY_GRACE_S after its last update (lost,
    and synth_retry_watchdog's announcement did not bring it either: defs/retries.py)."""
    record = instance.get_run_record_by_id(run.run_id)
    return record is not None and time.time() - record.update_timestamp.timestamp() >= RETRY_GRACE_S


def failed_run_lines(instance: dg.DagsterInstance, run: dg.DagsterRun) -> list[str]:
    """What failed in a finished run: its failing ERROR checks' problems (a run with a failed non-blocking check
    still succeeds), its failed steps' errors, or why it failed or was canceled."""
    if run.status == dg.DagsterRunStatus.SUCCESS:
        return failed_check_lines(check_evaluations(instance, run.run_id))
    if run.status == dg.DagsterRunStatus.CANCELED:
        return ["canceled"]
    return run_failure_lines(instance, run.run_id) or ["(no check or step error recorded)"]


class PassWait:
    """Waiting for the runs of one launched pass, one look at a time (`poll`): a run Dagster retried is followed
    by its retry; `on_done(partition, seconds)` as each succeeds; at the first failure the pass's queued runs are
    canceled, the running ones finish."""

    def __init__(
        self,
        instance: dg.DagsterInstance,
        runs: PassRuns,
        on_done: Callable[[str | None, float], None] | None = None,
    ):
        self.instance, self.runs, self.on_done = instance, runs, on_done
        self.start = time.monotonic()
        self.decided: dict[str, dg.DagsterRun] = {}
        self.failures: list[str] = []
        self.canceled: list[str] = []
        self.failed_partition: str | None = None

    def poll(self) -> bool:
        """Look once at each run not yet decided.

        Returns:
            Whether every run has decided (each succeeded).

        Raises:
            PassFailed: every run has decided and one failed, naming each failed run's partition and reasons.
        """
        current = self._undecided_runs()
        for run_id, partition in self.runs.runs.items():
            if run_id in self.decided:
                continue
            run = current.get(run_id)
            final = deciding_run(self.instance, run) if run is not None else None
            if final is None:
                continue
            self.decided[run_id] = final
            problems = failed_run_lines(self.instance, final)
            if final.status == dg.DagsterRunStatus.CANCELED and self.failures:  # canceled below, after a failure
                self.canceled.append(partition or final.run_id[:8])
            elif problems:
                where = f" (partition {partition})" if partition else ""
                self.failures += [f"run {final.run_id[:8]} of {final.job_name}{where} failed:"]
                self.failures += [f"  {problem}" for problem in problems]
                self.failures.append(f"  repair: {REPAIR_HINT.format(run_id=final.run_id)}")
                if self.failed_partition is None:
                    self.failed_partition = partition
                    cancel_queued(self.instance, self._undecided())
                    current = self._undecided_runs()  # the runs after this one, as the cancel left them
            elif self.on_done is not None:
                self.on_done(partition, time.monotonic() - self.start)
        if len(self.decided) < len(self.runs.runs):
            return False
        if self.failures:
            canceled = [f"not run (canceled after the failure): {', '.join(self.canceled)}"] if self.canceled else []
            raise PassFailed(self.runs.build_pass, self.failed_partition, self.failures + canceled)
        return True

    def _undecided(self) -> list[str]:
        return [run_id for run_id in self.runs.runs if run_id not in self.decided]

    def _undecided_runs(self) -> dict[str, dg.DagsterRun]:
        """Each undecided run as the instance has it now, by run id: one query for them all (a pass of SYNTH's
        500 shards is 500 runs, read at every look)."""
        return runs_by_id(self.instance, self._undecided())

    @property
    def finished(self) -> list[dg.DagsterRun]:
        """The runs that decided (a retried run's retry in its place)."""
        return list(self.decided.values())


def runs_by_id(
    instance: dg.DagsterInstance, run_ids: Sequence[str], statuses: Sequence[dg.DagsterRunStatus] = ()
) -> dict[str, dg.DagsterRun]:
    """Those of `run_ids` (with one of `statuses`, when given) as the instance has them now, in one query."""
    if not run_ids:  # Dagster refuses an empty run id filter
        return {}
    runs = instance.get_runs(filters=dg.RunsFilter(run_ids=list(run_ids), statuses=list(statuses) or None))
    return {run.run_id: run for run in runs}


def cancel_queued(instance: dg.DagsterInstance, run_ids: Sequence[str]) -> None:
    """Cancel those of `run_ids` that are still queued (not yet launched), read in one query."""
    waiting = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
    for run in runs_by_id(instance, run_ids, waiting).values():
        instance.report_run_canceled(run, "the build stopped: another run of its pass failed, or it was stopped")


def _awaiting_retry(run: dg.DagsterRun) -> bool:
    """A failed run that Dagster's run retries may still re-launch: not told otherwise, no retry launched yet."""
    return (
        run.status == dg.DagsterRunStatus.FAILURE
        and run.tags.get(WILL_RETRY_TAG) != "false"
        and AUTO_RETRY_RUN_ID_TAG not in run.tags
    )


def stop_runs(instance: dg.DagsterInstance, runs: Callable[[], list[dg.DagsterRun]], grace: float) -> None:
    """Stop the runs `runs()` lists (unfinished or failed) until, for STOP_SETTLE_SECONDS, none is unfinished or
    awaiting a retry (at once when the first look finds none of them: no queued run to race a dequeue, no failure
    to retry): queued ones are canceled, started ones terminated through the instance's run launcher (as
    the UI's "Terminate"), and a failed one is tagged not to be retried. Asked again at every poll: a daemon
    that was dequeuing a run as it was canceled starts it anyway, and the retry of a run that failed just before
    can still be submitted. A run still unfinished `grace` seconds later is marked canceled. Call with the
    daemon still serving the queue (a run is terminated through the code server that launched it) and nothing
    left launching runs."""
    deadline = time.monotonic() + grace
    quiet_since: float | None = None
    stopped_any = False  # nothing to stop at the first look: nothing queued to race a dequeue, no failure to retry
    while time.monotonic() < deadline:
        listed = runs()
        awaiting = [run for run in listed if _awaiting_retry(run)]
        for run in awaiting:
            instance.add_run_tags(run.run_id, {WILL_RETRY_TAG: "false"})
        unfinished = [run for run in listed if run.status in UNFINISHED_RUN_STATUSES]
        cancel_queued(instance, [run.run_id for run in unfinished])
        for run in unfinished:
            if run.status == dg.DagsterRunStatus.STARTED:  # a STARTING one: once its worker has started
                instance.report_run_canceling(run)
                try:
                    instance.run_launcher.terminate(run.run_id)
                except Exception:  # noqa: BLE001 - its code server is gone: marked canceled below
                    pass
        now = time.monotonic()
        quiet_since = (quiet_since or now) if not unfinished and not awaiting else None
        stopped_any = stopped_any or quiet_since is None
        if quiet_since is not None and (not stopped_any or now - quiet_since >= STOP_SETTLE_SECONDS):
            return
        time.sleep(POLL_SECONDS)
    for run in runs():
        if run.status in UNFINISHED_RUN_STATUSES:
            instance.report_run_canceled(run, "the build that launched it stopped, and the run did not stop in time")


def stoppable_runs_of_build(instance: dg.DagsterInstance, build_id: str) -> Callable[[], list[dg.DagsterRun]]:
    """The unfinished and failed runs of build `build_id` (for stop_runs)."""
    stoppable = dg.RunsFilter(tags={BUILD_TAG: build_id}, statuses=list(_STOPPABLE))
    return lambda: list(instance.get_runs(filters=stoppable))


def stoppable_runs_of_dead_builds(
    instance: dg.DagsterInstance, tags: Mapping[str, str]
) -> Callable[[], list[dg.DagsterRun]]:
    """The unfinished and failed runs that earlier builds of this build's data root (`tags`: its run tags)
    launched, or Dagster retried for them: asked while holding the root's build lock, so those builds are dead
    (killed: SIGKILL, a lost machine), and their runs would otherwise still be launched from the queue, or show
    in progress for ever. A run re-executed from the UI, which carries its parent's tags, is not theirs."""
    stoppable = dg.RunsFilter(tags={DATA_ROOT_TAG: tags[DATA_ROOT_TAG]}, statuses=list(_STOPPABLE))
    return lambda: [
        run
        for run in instance.get_runs(filters=stoppable)
        if run.tags.get(BUILD_TAG) != tags[BUILD_TAG] and (run.parent_run_id is None or RETRY_NUMBER_TAG in run.tags)
    ]


def new_build_tags(data_root: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The tags of every run of a new build of `data_root`."""
    return {**(extra or {}), BUILD_TAG: uuid.uuid4().hex, DATA_ROOT_TAG: str(data_root.resolve())}


def shard_partitions(instance: dg.DagsterInstance) -> list[str]:
    return list(instance.get_dynamic_partitions(SYNTH_SHARDS.name))


@dataclass
class LaunchedPass:
    """A pass whose runs are launched: what waits for them, and when the pass began (its launches included)."""

    build_pass: Pass
    waiting: PassWait
    start: float


def launch_build(
    instance: dg.DagsterInstance,
    run_config: dict,
    tags: Mapping[str, str],
    passes: Sequence[Pass],
    job_names: Mapping[str, str],
    progress,
    server: GraphQLServer,
    daemon: DaemonKeeper,
) -> list[str]:
    """Launch each of `passes` (`job_names`: each pass's job) with `run_config` and `tags` once the passes it
    runs after (`Pass.after`) are through, then wait for every pass; returns the shard partitions. Passes that
    do not need each other run at once (the manifests beside the quota plan and the pool pass). `progress`
    hears of each pass and shard (defs/build.py's BuildProgress); `daemon` is kept serving the queue while the
    build waits; `server` is stopped once the last pass is launched. Raises PassFailed at the first pass with a
    failed run or check, LaunchFailed when Dagster refuses a launch."""
    keys: list[str] = []
    launched: dict[str, LaunchedPass] = {}  # not yet through
    for build_pass in passes:
        await_passes(instance, launched, set(build_pass.after), progress, daemon)
        start = time.monotonic()
        job = job_names[build_pass.name]
        # as the pass's job tags its runs (said here too: a job's run tags reach only some launch routes)
        pass_run_tags = {**tags, **pass_tags(build_pass.name)}
        if build_pass.per_shard:
            keys = keys or shard_partitions(instance)
            progress.pass_started(build_pass, keys)
            runs = launch_shard_runs(server, job, keys, run_config, pass_run_tags)
            done = lambda key, seconds, p=build_pass: progress.shard_done(p, key, seconds)  # noqa: E731
        else:
            progress.pass_started(build_pass, [])
            runs, done = {launch_run(server, job, run_config, pass_run_tags): None}, None
        waiting = PassWait(instance, PassRuns(build_pass, runs), done)
        launched[build_pass.name] = LaunchedPass(build_pass, waiting, start)
    server.close()  # every run is launched: the webserver stops while the last passes run, not after them
    await_passes(instance, launched, set(launched), progress, daemon)
    return keys


def await_passes(
    instance: dg.DagsterInstance,
    launched: dict[str, LaunchedPass],
    needed: set[str],
    progress,
    daemon: DaemonKeeper,
) -> None:
    """Poll every pass of `launched` until none of `needed` is left in it: a pass whose runs are through leaves
    it as it is seen to, after its warnings (the inventory's) and `progress.pass_done`. Raises PassFailed as soon
    as the runs of any of them, needed or not, have all decided and one failed (`PassWait.poll`)."""
    while True:
        for name, each in list(launched.items()):
            if not each.waiting.poll():
                continue
            del launched[name]
            if not each.build_pass.per_shard:
                (finished,) = each.waiting.finished
                if warnings := materialization_warnings(instance, finished.run_id):
                    progress.warned(each.build_pass, warnings)
            progress.pass_done(each.build_pass, time.monotonic() - each.start)
        if not needed & launched.keys():
            return
        daemon.keep()
        time.sleep(POLL_SECONDS)


def materialization_warnings(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    """The warnings a run's materializations report to the user (the inventory's: outputs removed, files
    ignored)."""
    warnings: list[str] = []
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
        if entry.dagster_event is None:
            continue
        value = entry.dagster_event.event_specific_data.materialization.metadata.get(INVENTORY_WARNINGS)
        warnings += list(value.value) if value is not None else []
    return warnings
