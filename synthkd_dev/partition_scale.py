"""Dagster-side scaling with the number of shards: N small partitions, discovered, sensed and backfilled.

`run_scenario` generates N small raw SYNTH shards (4 rows each, sliced from the bundled sample, every file
with its own bytes) and goes through, on a real DagsterInstance configured by the repository's dagster.yaml
(`cli instance-home`: sqlite storage, a queued run coordinator), Dagster-side work only:

  1. discovery      materializing synth_raw_inventory: hash N files, register N `synth_shards` partitions,
                    report N synth_raw data versions (an observation and a materialization each: 2N events)
  2. sensor tick 1  synth_raw_sensor evaluated with build_sensor_context on a fresh instance (no partitions,
                    no cursor), its partition request applied as the daemon applies it: adds N partitions,
                    requests N synth_scan_job runs
  3. sensor tick 2  one shard's bytes changed, evaluated from tick 1's cursor: requests exactly that shard
  4. sensor daemon  one tick of Dagster's sensor daemon (execute_sensor_iteration) on the instance of
                    phase 1: evaluates the sensor in the code server, stores its 2N asset events, creates
                    and queues its N synth_scan_job runs
  5. backfill       a job backfill of synth_scan_job over all N partitions, created as the UI and `dagster job
                    backfill` create one (a PartitionBackfill on the job's partition set), driven by the
                    backfill daemon's iteration (execute_backfill_iteration) until its N runs are created and
                    queued. Executing them is benchmarks/throughput.py's business. Includes the daemon's own
                    pacing (Dagster 1.13 sleeps CHECKPOINT_INTERVAL = 1 s twice between chunks of
                    CHECKPOINT_COUNT = 25 runs), measured separately.

The code location is loaded as `dagster dev` / `dagster-daemon` load workspace.yaml, in a `dagster api grpc`
code server subprocess (in_process: in this process). benchmarks/partition_scale.py times the phases against
budgets; tests/test_partition_scale.py checks their outcomes only.

Private Dagster APIs, each without a public equivalent in 1.13: the backfill and sensor daemon iterations
(dagster._daemon), PartitionBackfill / BulkActionStatus and the backfill id (the daemon's input, which only
the UI's GraphQL and the CLI create, the CLI launching the runs itself), WorkspaceProcessContext and its load
targets (dagster._core.workspace: the daemons' view of the code location), the event-log storage classes
named in dagster.yaml (Dagster documents no other module for them), and job_backfill's pacing (its `time`
module is wrapped to count the pauses, which still really sleep). The sensor ticks use public
dagster.build_sensor_context; runs are read with public dagster.RunsFilter.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import unittest.mock
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster._core.execution import job_backfill
from dagster._core.execution.backfill import BULK_ACTION_TERMINAL_STATUSES, BulkActionStatus, PartitionBackfill
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.remote_representation.external_data import PartitionNamesSnap
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.utils import make_new_backfill_id
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget, WorkspaceFileTarget
from dagster._daemon.backfill import execute_backfill_iteration
from dagster._daemon.sensor import execute_sensor_iteration

from synthkd_assets.defs.build import materialize_steps
from synthkd_assets.defs.instances import local_instance_yaml
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_assets.launch import LOCATION_NAME  # workspace.yaml's location_name (dg's code_location_name)
from synthkd_contract.settings import DATA_DIR, RAW_DIR
from synthkd_dev import REPO_ROOT, SAMPLE_RAW_DIR
from synthkd_dev.sensor_ticks import store_sensor_events, tick_synth_raw_sensor

SCALE_PARTITIONS = 500  # the scale the benchmark's budgets are for
ROWS_PER_SHARD = 4
DEFINITIONS_MODULE = "synthkd_assets.definitions"  # workspace.yaml's python_module
SCAN_JOB = "synth_scan_job"
SENSOR_NAME = "synth_raw_sensor"
STORAGES = ("sharded", "consolidated", "memory")

RunRequestSummary = tuple[str, str | None, str | None]  # job, partition, run key


@dataclass
class ScaleResult:
    """What one scenario run observed: functional outcomes (for the test) and timings (for the benchmark)."""

    partitions: int
    seconds: dict[str, float] = field(default_factory=dict)
    registered_by_inventory: list[str] = field(default_factory=list)
    tick1_added: list[str] = field(default_factory=list)
    tick1_registered: list[str] = field(default_factory=list)
    tick1_requests: list[RunRequestSummary] = field(default_factory=list)
    tick2_requests: list[RunRequestSummary] = field(default_factory=list)
    changed_shard: str = ""
    changed_sha256: str = ""
    daemon_tick_status: str = ""
    daemon_runs: list[dict] = field(default_factory=list)  # job_name, partition, status, tags
    backfill_id: str = ""
    backfill_status: str = ""
    backfill_errors: list[str] = field(default_factory=list)
    backfill_runs: list[dict] = field(default_factory=list)
    backfill_checkpoint_pauses: int = 0
    backfill_checkpoint_pause_s: float = 0.0


# --- inputs -----------------------------------------------------------------------------------


def shard_name(index: int, count: int) -> str:
    return f"synth_{index:0{max(3, len(str(count - 1)))}d}"


def make_shards(raw_dir: Path, count: int, rows_per_shard: int = ROWS_PER_SHARD) -> list[Path]:
    """`count` raw shards of `rows_per_shard` rows in the raw SYNTH schema, sliced from the bundled sample
    (rows are reused cyclically past its 3056 rows, with the shard index appended to synth_id, so every file
    has its own bytes)."""
    sample = pa.concat_tables(pq.read_table(p) for p in sorted(SAMPLE_RAW_DIR.glob("*.parquet")))
    raw_dir.mkdir(parents=True, exist_ok=True)
    id_index = sample.schema.get_field_index("synth_id")
    files = []
    for i in range(count):
        start = (i * rows_per_shard) % (sample.num_rows - rows_per_shard + 1)
        rows = sample.slice(start, rows_per_shard)
        ids = pc.binary_join_element_wise(rows.column("synth_id"), pa.scalar(f"_s{i}"), "").cast(pa.string())
        path = raw_dir / f"{shard_name(i, count)}.parquet"
        pq.write_table(rows.set_column(id_index, "synth_id", ids), path, compression="zstd")
        files.append(path)
    return files


def change_shard(path: Path) -> None:
    """Rewrite one shard with an edited answer (new bytes, size and mtime), as an upstream fix would."""
    table = pq.read_table(path)
    column = table.schema.get_field_index("synthetic_answer")
    answers = table.column(column).to_pylist()
    answers[0] = (answers[0] or "") + "\n\nEdited upstream."
    pq.write_table(table.set_column(column, "synthetic_answer", [answers]), path, compression="zstd")


# --- Dagster ----------------------------------------------------------------------------------


def project_instance(home: Path, storage: str = "sharded") -> dg.DagsterInstance:
    """A real DagsterInstance in `home`, configured by the repository's dagster.yaml (`cli instance-home`: sqlite
    storage, a queued run coordinator), as DAGSTER_HOME=<home> would give, with an event-log storage chosen by
    `storage`:

    sharded       dagster.yaml as it is: Dagster's default sqlite storage, one event-log database per run
                  (created, with its schema, when the run is created)
    consolidated  + ConsolidatedSqliteEventLogStorage: one sqlite event-log database for all runs
    memory        + InMemoryEventLogStorage (in-memory sqlite, what DagsterInstance.ephemeral() uses): only
                  for a single process, so only with an in-process code location (the tests)
    """
    home.mkdir(parents=True, exist_ok=True)
    config = local_instance_yaml()
    if storage == "consolidated":
        config += (
            "event_log_storage:\n  module: dagster._core.storage.event_log\n"
            "  class: ConsolidatedSqliteEventLogStorage\n"
            f"  config:\n    base_dir: {json.dumps(str(home / 'history'))}\n"
        )
    elif storage == "memory":
        config += "event_log_storage:\n  module: dagster._core.storage.event_log\n  class: InMemoryEventLogStorage\n"
    elif storage != "sharded":
        raise ValueError(f"storage must be one of {STORAGES}, not {storage!r}")
    (home / "dagster.yaml").write_text(config)
    return dg.DagsterInstance.from_config(str(home))


@contextlib.contextmanager
def synthkd_env(raw_dir: Path, data_dir: Path) -> Iterator[None]:
    """SYNTHKD_RAW_DIR / SYNTHKD_DATA_DIR for the code location's layout resource (the daemons' sensor
    evaluation reads them; a code server subprocess inherits them when it starts)."""
    with unittest.mock.patch.dict(os.environ, {RAW_DIR.name: str(raw_dir), DATA_DIR.name: str(data_dir)}):
        yield


@contextlib.contextmanager
def workspace_context(instance: dg.DagsterInstance, in_process: bool = False) -> Iterator[WorkspaceProcessContext]:
    """The code location as the daemon loads it: workspace.yaml through a `dagster api grpc` subprocess,
    or (in_process) the same module loaded in this process."""
    if in_process:
        origin = InProcessCodeLocationOrigin(
            LoadableTargetOrigin(module_name=DEFINITIONS_MODULE, working_directory=str(REPO_ROOT)),
            location_name=LOCATION_NAME,
        )
        target = InProcessWorkspaceLoadTarget(origin)
    else:
        target = WorkspaceFileTarget(paths=[str(REPO_ROOT / "workspace.yaml")])
    with WorkspaceProcessContext(instance, target) as context:
        entry = context.create_request_context().get_code_location_entries()[LOCATION_NAME]
        if entry.code_location is None:
            raise RuntimeError(f"code location {LOCATION_NAME} failed to load: {entry.load_error}")
        yield context


def _repository(context: WorkspaceProcessContext):
    location = context.create_request_context().get_code_location(LOCATION_NAME)
    (repo,) = location.get_repositories().values()
    return repo


def _run_summary(run: dg.DagsterRun) -> dict:
    return {
        "job_name": run.job_name,
        "partition": run.tags.get("dagster/partition"),
        "status": run.status.value,
        "tags": dict(run.tags),
    }


def discover(instance: dg.DagsterInstance, layout: SynthKDLayout) -> list[str]:
    """Phase 1: materialize synth_raw_inventory; returns the registered partitions."""
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # not 2N event lines on stderr
    materialize_steps(instance, layout, ["synth_raw_inventory"], run_config=quiet)
    return instance.get_dynamic_partitions(SYNTH_SHARDS.name)


def _requests(result: dg.SensorResult) -> list[RunRequestSummary]:
    return sorted((r.job_name, r.partition_key, r.run_key) for r in result.run_requests)


def sensor_daemon_tick(context: WorkspaceProcessContext, logger: logging.Logger) -> tuple[str, list[dict]]:
    """Phase 4: one synchronous iteration of the sensor daemon; returns the tick status and its runs."""
    instance = context.instance
    errors = [e for e in execute_sensor_iteration(context, logger, None, None) if e is not None]
    if errors:
        raise RuntimeError(f"sensor daemon iteration failed: {errors[0]}")
    sensor = _repository(context).get_sensor(SENSOR_NAME)
    ticks = instance.get_ticks(sensor.get_remote_origin_id(), sensor.selector_id, limit=1)
    status = ticks[0].status.value if ticks else "NO TICK"
    if ticks and ticks[0].error:
        raise RuntimeError(f"sensor tick failed: {ticks[0].error.to_string()}")
    runs = instance.get_runs(dg.RunsFilter(tags=dg.DagsterRun.tags_for_sensor(sensor)))
    return status, [_run_summary(r) for r in runs]


def launch_job_backfill(context: WorkspaceProcessContext, job_name: str) -> str:
    """A job backfill over all partitions, created as the UI and `dagster job backfill` create one."""
    instance = context.instance
    request_context = context.create_request_context()
    repo = _repository(context)
    partition_set = next(ps for ps in repo.get_partition_sets() if ps.job_name == job_name)
    names = request_context.get_partition_names(
        repository_selector=repo.selector, job_name=job_name, instance=instance, selected_asset_keys=None
    )
    if not isinstance(names, PartitionNamesSnap):
        raise RuntimeError(f"partition names of {job_name}: {names}")
    backfill = PartitionBackfill(
        backfill_id=make_new_backfill_id(),
        partition_set_origin=partition_set.get_remote_origin(),
        status=BulkActionStatus.REQUESTED,
        partition_names=names.partition_names,
        from_failure=False,
        reexecution_steps=None,
        tags={},
        backfill_timestamp=time.time(),
    )
    instance.add_backfill(backfill)
    return backfill.backfill_id


def drive_backfill(
    context: WorkspaceProcessContext,
    backfill_id: str,
    expected_runs: int,
    logger: logging.Logger,
    max_iterations: int = 10,
) -> tuple[str, list[str], list[dict]]:
    """Run the backfill daemon's iteration until the backfill has `expected_runs` runs (or stops); returns its
    status, the iteration's errors and its runs."""
    instance = context.instance
    backfill_runs = dg.RunsFilter(tags=dg.DagsterRun.tags_for_backfill_id(backfill_id))
    errors: list[str] = []
    for _ in range(max_iterations):
        errors += [e.to_string() for e in execute_backfill_iteration(context, logger) if e is not None]
        count = instance.get_runs_count(backfill_runs)
        backfill = instance.get_backfill(backfill_id)
        if count >= expected_runs or errors or backfill.status in BULK_ACTION_TERMINAL_STATUSES:
            break
    runs = instance.get_runs(backfill_runs)
    return instance.get_backfill(backfill_id).status.value, errors, [_run_summary(r) for r in runs]


# --- the scenario -------------------------------------------------------------------------------


class _CountingTime:
    """Stands in for the `time` module inside Dagster's job_backfill for one backfill: every call goes to the
    real module (it really sleeps); the sleeps are added up, so the benchmark can show how much of the
    backfill is the daemon's own pacing. `pause_s` (tests only) changes the pause length."""

    def __init__(self, pause_s: float | None):
        self.pause_s = pause_s
        self.slept = 0.0
        self.pauses = 0

    def sleep(self, seconds: float) -> None:
        seconds = seconds if self.pause_s is None else self.pause_s
        self.pauses += 1
        start = time.perf_counter()
        time.sleep(seconds)
        self.slept += time.perf_counter() - start

    def __getattr__(self, name: str):
        return getattr(time, name)


@contextlib.contextmanager
def counted_backfill_pauses(pause_s: float | None = None) -> Iterator[_CountingTime]:
    counter = _CountingTime(pause_s)
    job_backfill.time = counter
    try:
        yield counter
    finally:
        job_backfill.time = time


def backfill_pacing() -> tuple[float, int]:
    """The backfill daemon's pause between chunks (seconds) and its chunk size (runs)."""
    return job_backfill.CHECKPOINT_INTERVAL, job_backfill.CHECKPOINT_COUNT


def run_scenario(
    partitions: int,
    work_dir: Path,
    *,
    storage: str = "sharded",
    in_process: bool = False,
    sensor_daemon: bool = True,
    backfill_pause_s: float | None = None,
    quiet: bool = True,
) -> ScaleResult:
    """Every phase, in order, in `work_dir`; returns what was observed and how long each phase took.

    storage: the instance's event-log storage (see project_instance); in_process: load the code location
    in this process instead of a code server; sensor_daemon: run phase 4; backfill_pause_s: replaces the
    backfill daemon's 1 s pause between chunks (None: Dagster's own; the test passes 0)."""
    if storage == "memory" and not in_process:
        raise ValueError("an in-memory event log is not shared with a code server: use in_process=True")
    logger = logging.getLogger("partition_scale")
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    result = ScaleResult(partitions=partitions)
    raw_dir = work_dir / "raw"
    files = make_shards(raw_dir, partitions)

    # phases 2-3 on their own instance and output root: a deployment whose sensor finds N new files
    sensed_layout = SynthKDLayout(raw_dir=str(raw_dir), data_dir=str(work_dir / "data_sensed"))
    with project_instance(work_dir / "home_sensed", storage) as instance:
        start = time.perf_counter()
        first = tick_synth_raw_sensor(instance, sensed_layout, None, store_events=False)
        result.seconds["sensor tick 1"] = time.perf_counter() - start
        store_sensor_events(instance, first)  # stored as the daemon does, outside the timed tick
        result.tick1_added = sorted(key for r in first.dynamic_partitions_requests for key in r.partition_keys)
        result.tick1_registered = instance.get_dynamic_partitions(SYNTH_SHARDS.name)
        result.tick1_requests = _requests(first)

        changed = files[len(files) // 2]
        change_shard(changed)
        start = time.perf_counter()
        second = tick_synth_raw_sensor(instance, sensed_layout, first.cursor, store_events=False)
        result.seconds["sensor tick 2"] = time.perf_counter() - start
        store_sensor_events(instance, second)
        result.tick2_requests = _requests(second)
        result.changed_shard = changed.stem
        result.changed_sha256 = json.loads(second.cursor)["shards"][changed.stem]

    # phases 1, 4, 5 on one instance: inventory discovers, then the daemons see N registered partitions
    data_dir = work_dir / "data"
    layout = SynthKDLayout(raw_dir=str(raw_dir), data_dir=str(data_dir))
    with synthkd_env(raw_dir, data_dir), project_instance(work_dir / "home", storage) as instance:
        start = time.perf_counter()
        result.registered_by_inventory = discover(instance, layout)
        result.seconds["discovery"] = time.perf_counter() - start

        with workspace_context(instance, in_process=in_process) as context:
            if sensor_daemon:
                start = time.perf_counter()
                result.daemon_tick_status, result.daemon_runs = sensor_daemon_tick(context, logger)
                result.seconds["sensor daemon"] = time.perf_counter() - start

            with counted_backfill_pauses(backfill_pause_s) as pauses:
                start = time.perf_counter()
                result.backfill_id = launch_job_backfill(context, SCAN_JOB)
                result.backfill_status, result.backfill_errors, result.backfill_runs = drive_backfill(
                    context, result.backfill_id, len(result.registered_by_inventory), logger
                )
                result.seconds["backfill"] = time.perf_counter() - start
            result.backfill_checkpoint_pauses = pauses.pauses
            result.backfill_checkpoint_pause_s = pauses.slept
    return result


def outcome_problems(result: ScaleResult) -> list[str]:
    """What is functionally wrong with a scenario run (empty: nothing)."""
    n = result.partitions
    keys = [shard_name(i, n) for i in range(n)]
    problems = []
    if result.registered_by_inventory != keys:
        problems.append(f"inventory registered {len(result.registered_by_inventory)} partitions, not {n}")
    if result.tick1_registered != keys or [p for _, p, _ in result.tick1_requests] != keys:
        problems.append(f"tick 1 registered {len(result.tick1_registered)} and requested {len(result.tick1_requests)}")
    if [p for _, p, _ in result.tick2_requests] != [result.changed_shard]:
        problems.append(f"tick 2 requested {result.tick2_requests[:3]}, not {result.changed_shard}")
    if "sensor daemon" in result.seconds and sorted(r["partition"] for r in result.daemon_runs) != keys:
        problems.append(f"sensor daemon tick {result.daemon_tick_status} created {len(result.daemon_runs)} runs")
    if result.backfill_errors or sorted(r["partition"] for r in result.backfill_runs) != keys:
        problems.append(f"backfill created {len(result.backfill_runs)} runs; errors: {result.backfill_errors[:1]}")
    return problems
