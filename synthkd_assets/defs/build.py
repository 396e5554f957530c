"""The whole graph built in process, pass by pass (defs/passes.py): scripts/build.sh (through `python -m
synthkd_assets.cli build`), the tests, the DistillKit CLI and the benchmark.

With `workers` > 1 and a persistent instance, each shard pass runs its partitions in that many worker processes
at once (each imports the graph once and materializes on the same instance, so every run is recorded there and
shows in the UI); the unpartitioned passes run in the calling process. An ephemeral instance lives in one
process only: with one, the shards run one after another."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

import dagster as dg

from synthkd_assets.core.buildlock import build_lock
from synthkd_assets.core.inventory import input_shard_paths
from synthkd_assets.core.parallel import die_with_parent, watch_stop_signals
from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.defs.code_versions import with_code_versions
from synthkd_assets.defs.failures import error_message, failed_check_lines
from synthkd_assets.defs.graph import ASSET_CHECKS, ASSETS
from synthkd_assets.defs.ingest import INVENTORY_WARNINGS
from synthkd_assets.defs.jobs import (
    NO_RUN_RETRIES_TAGS,
    code_location_run_tags,
    is_whole_job,
    job_for_steps,
    record_code_location_origin,
    smoke_run_tags,
    steps_selection,
)
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.passes import OUTPUTS, Pass, build_passes
from synthkd_assets.defs.resources import (
    SynthKDBuildConfig,
    SynthKDLayout,
    merged_resource_config,
    resources_run_config,
    synthkd_resources,
)
from synthkd_assets.defs.tags import EPHEMERAL_JOB_NAME, PARTITION_TAG

WORKER_STOP_SECONDS = 30  # a worker still running this long after the build told it to stop is killed
# how a worker ends when told to stop: 128 + SIGTERM from its own handler (_worker_stop), -SIGTERM before it is set
OWN_EXITS = frozenset({0, 128 + signal.SIGTERM, -signal.SIGTERM, 128 + signal.SIGINT, 128 + signal.SIGHUP})
BUILD_TAG = "synthkd/build"  # on every run of one build_all call, the same value
# on a shard run of a worker process, that process's pid: set when the run is created, so a worker killed
# before its run has logged anything is still told from the workers the pool stopped with it
WORKER_PID_TAG = "synthkd/worker_pid"
DATA_ROOT_TAG = "synthkd/data_root"  # on every run of a build_all call: the data root it builds (resolved)


class BuildFailed(RuntimeError):
    """A step or a blocking check failed; the message names the steps, the partition and the reasons."""

    def __init__(self, message: str, steps: Sequence[str] = (), partition: str | None = None):
        super().__init__(message)
        self.steps = tuple(steps)
        self.partition = partition


class BuildProgress:
    """What a build reports as it goes; this one reports nothing. `pass_started` comes before every pass (`keys`:
    the shard partitions of a shard pass, empty otherwise), `shard_done` after each shard of a shard pass (in the
    order they finish), `pass_done` after the pass."""

    def pass_started(self, build_pass: Pass, keys: Sequence[str]) -> None:
        pass

    def shard_done(self, build_pass: Pass, key: str, seconds: float) -> None:
        pass

    def pass_done(self, build_pass: Pass, seconds: float) -> None:
        pass

    def warned(self, build_pass: Pass, warnings: Sequence[str]) -> None:
        """What a pass run in this process warned the user of (the inventory: shards' outputs removed, files
        ignored); called before `pass_done`, only when there is something."""


def all_definitions() -> list:
    """The code location's assets (with their code versions) and checks."""
    return [*with_code_versions(ASSETS), *ASSET_CHECKS]


def materialize_steps(
    instance: dg.DagsterInstance,
    layout: SynthKDLayout,
    selection: Sequence[str],
    partition_key: str | None = None,
    raise_on_error: bool = True,
    build: SynthKDBuildConfig | None = None,
    **kwargs,
) -> dg.ExecuteInProcessResult:
    """Materialize `selection` and run the checks of those assets, in process (`build`: the default config
    when None), as a run of the code location's job of those steps (`job_for_steps`: a pass's job, so the UI
    names the run and can open and re-execute it; a subset of its assets when `selection` is part of it), or of
    Dagster's `__ephemeral_asset_job__` for steps no job has."""
    job = job_for_steps(selection)
    subset = None if job is None or is_whole_job(job, selection) else [dg.AssetKey(s) for s in selection]
    if job is None:
        job = dg.define_asset_job(EPHEMERAL_JOB_NAME, selection=steps_selection(selection))
    resources = synthkd_resources(layout, build)
    definitions = dg.Definitions(assets=all_definitions(), jobs=[job], resources=resources)
    # the resources' config goes with the run (a caller's own fields win): its re-execution reproduces it
    run_config = dict(kwargs.pop("run_config", None) or {})
    run_config["resources"] = merged_resource_config(resources_run_config(resources), run_config.get("resources"))
    kwargs["tags"] = {**kwargs.get("tags", {}), **smoke_run_tags(run_config), **code_location_run_tags(job.name)}
    run_id = str(uuid.uuid4())  # what Dagster's own run ids are
    try:
        result = definitions.resolve_job_def(job.name).execute_in_process(
            run_config=run_config,
            instance=instance,
            partition_key=partition_key,
            raise_on_error=False,
            asset_selection=subset,
            run_id=run_id,
            **kwargs,
        )
    except BaseException:  # interrupted: a failed run is the one to re-execute from the UI
        with contextlib.suppress(Exception):  # the interruption is what to report
            record_code_location_origin(instance, run_id)
        raise
    record_code_location_origin(instance, run_id)
    failed_checks = failed_check_lines(result.get_asset_check_evaluations())
    if raise_on_error and (not result.success or failed_checks):
        where = f" (partition {partition_key})" if partition_key else ""
        errors = [error_message(e.step_failure_data.error) for e in result.get_step_failure_events()]
        message = "\n".join([f"{', '.join(selection)}{where} failed: {'; '.join(errors)}", *failed_checks])
        raise BuildFailed(message, selection, partition_key)
    return result


def build_all(
    instance: dg.DagsterInstance,
    layout: SynthKDLayout,
    build: SynthKDBuildConfig | None = None,
    outputs: Iterable[str] = tuple(OUTPUTS),
    progress: BuildProgress | None = None,
    workers: int = 1,
    take_lock: bool = True,
    **kwargs,
) -> list[str]:
    """Every pass of `build_passes(outputs)` in order: inventory, scan pass per shard, the plan, build pass per
    shard, manifests, then (with synth_pool) the quota plan, the pool per shard and its curriculum and manifest;
    returns the shards. Raises BuildFailed at the first failed step or blocking check (a shard pass lets the shards
    already running finish first and starts no other).

    `outputs` picks the datasets (synth_kd_v1, synth_distill, synth_pool); `progress` hears of each pass and shard;
    `workers`: shard runs at once, in as many worker processes (never more than there are shards; 1, or an
    ephemeral instance: one after another in this process); `kwargs` go to each run (`run_config`, `tags`);
    every run is tagged `synthkd/build` with an id of this build, and is never retried by the daemon.
    Holds the data root's build lock throughout: raises BuildLockHeld at once if another build (this function or
    scripts/build.sh) is running on the same root; `take_lock=False` when the caller already holds it (build.sh
    takes it on a file descriptor this process inherits)."""
    build_id = uuid.uuid4().hex
    data_root = str(layout.data_layout().data_root.resolve())
    tags = {**kwargs.get("tags", {}), BUILD_TAG: build_id, DATA_ROOT_TAG: data_root, **NO_RUN_RETRIES_TAGS}
    kwargs = {**kwargs, "tags": tags}
    try:
        return _build_all(instance, layout, build, outputs, progress, workers, take_lock, kwargs)
    except WorkerDied as error:  # a worker died without a word (SIGKILL, out of memory): say which shard
        # the runs of the processes that died are the build's failure; the others' runs only stopped with them
        lost = _fail_unfinished_runs(instance, build_id, WORKER_STOPPED if error.pids else WORKER_LOST, error.pids)
        shards = ", ".join(lost) or "(none had started a run)"
        message = f"a worker process died while building {shards}: {error.__cause__}"
        raise BuildFailed(message, partition=lost[0] if len(lost) == 1 else None) from error
    except BaseException:
        _fail_unfinished_runs(instance, build_id, "the build stopped while this run was in progress")
        raise


WORKER_LOST = "its worker process died before the run finished (killed: the kernel's out-of-memory killer? see dmesg)"
WORKER_STOPPED = "stopped by the build when another shard's worker process died"


class WorkerDied(RuntimeError):
    """A worker process of a shard pass died on its own (not told to stop by the build); `pids`: those
    processes. Python's pool then stops every other worker, so their runs fail too, but not for their own
    reason; `pids` is empty when no worker's exit says it died on its own."""

    def __init__(self, pids: set[int]):
        super().__init__(f"worker processes {sorted(pids)} died")
        self.pids = pids


def _fail_unfinished_runs(
    instance: dg.DagsterInstance, build_id: str, why: str, died: set[int] = frozenset()
) -> list[str]:
    """A build that stops (interrupted, a worker lost) leaves none of its runs in progress in the instance: Dagster
    marks a run it interrupts failed, this marks the rest (a run interrupted while being set up, or whose worker
    was killed) with `why`, or with WORKER_LOST when its process is one of `died`; returns the partitions of
    the runs whose process died (of every run marked, when `died` is empty)."""
    failed: list[str] = []
    with contextlib.suppress(Exception):  # best effort: the error that stopped the build is the one to report
        for run in instance.get_runs(filters=dg.RunsFilter(tags={BUILD_TAG: build_id})):
            if run.is_finished or run.parent_run_id is not None:  # a UI re-execution copies the build's tags
                continue
            lost = bool(died) and run.tags.get(WORKER_PID_TAG) in {str(pid) for pid in died}
            instance.report_run_failed(run, WORKER_LOST if lost else why)
            record_code_location_origin(instance, run.run_id)  # its process died before it could
            if lost or not died:
                failed.append(run.tags.get(PARTITION_TAG, "(unpartitioned)"))
    return sorted(failed)


def fail_runs_of_dead_builds(instance: dg.DagsterInstance, data_root: str, build_id: str) -> list[str]:
    """Mark failed every unfinished run of an earlier build of `data_root` (another build id), and return their
    ids. Called with the root's build lock held, so no other build of that root is alive: such a run's process
    was killed (SIGKILL, a lost machine) before it could say so, and it would otherwise show in progress for ever
    (the daemon's run monitoring cannot see in-process runs)."""
    dead = [
        run
        for run in instance.get_runs(filters=dg.RunsFilter(tags={DATA_ROOT_TAG: data_root}))
        # a run with a parent is a re-execution the daemon launched from the UI, with the build's tags copied
        if not run.is_finished and run.tags.get(BUILD_TAG) != build_id and run.parent_run_id is None
    ]
    for run in dead:
        instance.report_run_failed(run, "its build was killed before the run finished (found by the next build)")
        record_code_location_origin(instance, run.run_id)
    return [run.run_id for run in dead]


def _build_all(instance, layout, build, outputs, progress, workers, take_lock, kwargs) -> list[str]:
    held = build_lock(layout.data_layout().build_lock()) if take_lock else contextlib.nullcontext()
    with held, contextlib.ExitStack() as stack:
        fail_runs_of_dead_builds(instance, kwargs["tags"][DATA_ROOT_TAG], kwargs["tags"][BUILD_TAG])
        progress = progress or BuildProgress()
        # the workers start now, importing the graph while this process runs the inventory (one per raw shard
        # file at most: the inventory registers a partition per file)
        parallel = 1 if instance.is_ephemeral else min(workers, _raw_shard_count(layout))
        if parallel > 1:
            shard_runs = stack.enter_context(_worker_pool(parallel, instance, layout, build, kwargs))
        else:
            shard_runs = _shards_in_process(instance, layout, build, kwargs)
        keys: list[str] | None = None
        for build_pass in build_passes(outputs):
            start = time.monotonic()
            if not build_pass.per_shard:
                progress.pass_started(build_pass, [])
                result = materialize_steps(instance, layout, build_pass.steps, build=build, **kwargs)
                warnings = [
                    warning
                    for event in result.get_asset_materialization_events()
                    for warning in event.materialization.metadata.get(
                        INVENTORY_WARNINGS, dg.JsonMetadataValue([])
                    ).value
                ]
                if warnings:
                    progress.warned(build_pass, warnings)
            else:
                if keys is None:  # registered by the inventory pass
                    keys = list(instance.get_dynamic_partitions(SYNTH_SHARDS.name))
                progress.pass_started(build_pass, keys)
                for key, seconds in shard_runs(build_pass, keys):
                    progress.shard_done(build_pass, key, seconds)
            progress.pass_done(build_pass, time.monotonic() - start)
    return keys or []


def _raw_shard_count(layout: SynthKDLayout) -> int:
    try:
        return len(input_shard_paths(layout.data_layout()))
    except InputFileError:  # the inventory fails on it, naming the problem
        return 0


def _shards_in_process(instance, layout, build, kwargs):
    def run(build_pass: Pass, keys: Sequence[str]) -> Iterator[tuple[str, float]]:
        for key in keys:
            start = time.monotonic()
            materialize_steps(instance, layout, build_pass.steps, key, build=build, **kwargs)
            yield key, time.monotonic() - start

    return run


@contextlib.contextmanager
def _worker_pool(workers: int, instance: dg.DagsterInstance, layout, build, kwargs):
    """`workers` processes, started once for every shard pass of a build (each imports the graph once); yields
    run(steps, keys), which yields (key, seconds) as each shard's run finishes. They are spawned, not forked:
    nothing of this process (its instance's connections, threads, the build lock's file descriptor) is
    shared with them. When the build stops (a failure, an interrupt, SIGTERM), the workers are told to stop
    (SIGTERM: a running run is marked failed in the instance) and killed after WORKER_STOP_SECONDS."""
    before = set(multiprocessing.active_children())
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_start,
        initargs=(
            os.getpid(),
            instance.get_ref(),
            layout.model_dump(),
            (build or SynthKDBuildConfig()).model_dump(),
            kwargs,
        ),
    )

    for _ in range(workers):  # each submit starts a worker process: all start now
        pool.submit(int)
    # kept, to be joined at the end: once a worker dies, the pool reaps the others itself (they are no longer
    # active children), and the runs they were told to stop must be marked failed by them before the build
    # says which shard's worker died
    started = [child for child in multiprocessing.active_children() if child not in before]

    def run(build_pass: Pass, keys: Sequence[str]) -> Iterator[tuple[str, float]]:
        steps = tuple(build_pass.steps)
        pending: set[Future] = {pool.submit(_worker_run, steps, key) for key in keys}
        failure: BuildFailed | None = None
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                if future.cancelled():
                    continue
                try:
                    key, seconds = future.result()
                except BuildFailed as error:  # the first failure stops the pass once the running shards finish
                    failure = failure or error
                    for other in pending:
                        other.cancel()
                    continue
                yield key, seconds
        if failure is not None:
            raise failure

    broken: BrokenProcessPool | None = None
    try:
        yield run
        pool.shutdown(wait=True)
    except BrokenProcessPool as error:
        broken = error
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        killed = _stop(
            [*started, *(c for c in multiprocessing.active_children() if c not in before and c not in started)]
        )
    if broken is not None:
        # the pool's SIGTERM (and the build's) ends a worker with one of OWN_EXITS; the one that broke the pool
        # ended otherwise (SIGKILL: -9), unless it is one the build had to kill itself
        died = {p.pid for p in started if p.exitcode not in OWN_EXITS and p not in killed}
        raise WorkerDied(died) from broken


def _stop(processes: list[multiprocessing.process.BaseProcess]) -> list[multiprocessing.process.BaseProcess]:
    """SIGTERM to each of `processes`, SIGKILL to any still alive WORKER_STOP_SECONDS later; returns those."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + WORKER_STOP_SECONDS
    killed = []
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
            killed.append(process)
    return killed


# --- in a worker process ---------------------------------------------------------------------------------
_worker: dict = {}


def _worker_start(parent: int, instance_ref, layout: dict, build: dict, kwargs: dict) -> None:
    """A worker's setup: the build's instance, resources and materialize arguments. SIGINT, SIGTERM (from the
    build, or from the kernel when the build's process dies) or SIGHUP end it; a run in progress is interrupted
    first (Dagster marks it failed)."""
    _worker.update(
        instance=dg.DagsterInstance.from_ref(instance_ref),
        layout=SynthKDLayout(**layout),
        build=SynthKDBuildConfig(**build),
        kwargs=kwargs,
        running=False,
        stopped=watch_stop_signals(_worker_stop),
    )
    die_with_parent(signal.SIGTERM, parent)


def _worker_stop(signum, _frame) -> None:
    if not _worker["running"]:
        os._exit(128 + signum)
    raise KeyboardInterrupt  # outside Dagster's own interrupt handling (a run being set up): stop it here


def _worker_run(steps: tuple[str, ...], key: str) -> tuple[str, float]:
    start = time.monotonic()
    _worker["running"] = True
    interrupted = False
    try:
        kwargs = {**_worker["kwargs"]}
        kwargs["tags"] = {**kwargs["tags"], WORKER_PID_TAG: str(os.getpid())}
        materialize_steps(_worker["instance"], _worker["layout"], steps, key, build=_worker["build"], **kwargs)
    except (KeyboardInterrupt, dg.DagsterExecutionInterruptedError):
        interrupted = True
    finally:
        _worker["running"] = False
        signum = _worker["stopped"]()
        if signum or interrupted:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(128 + (signum or signal.SIGINT))
    return key, time.monotonic() - start
