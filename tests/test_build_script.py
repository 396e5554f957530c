"""scripts/build.sh as a user runs it, on small shards: every pass launched through the instance as runs of its
job; a file name with spaces and quotes, a second build on the same data root, SIGTERM, a killed run worker,
SIGKILL of the whole build, an empty raw dir (its error said on the console). What a full build does with a
removed shard is tested in process (tests/test_raw_inventory.py): same assets, same code."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from synthkd_assets.cli import low_disk_lines
from synthkd_assets.core.buildlock import BuildLockHeld, build_lock
from synthkd_assets.core.layout import DataLayout, InputOutputOverlap
from synthkd_assets.core.parallel import available_cores, thread_map
from synthkd_assets.defs.jobs import PASS_JOBS
from synthkd_assets.defs.passes import build_passes
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_assets.launch import BUILD_TAG
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR

QUOTED = 'it\'s a "quoted" shard 01'  # a partition key with spaces and both kinds of quote
ROWS = 40


def small_shard(path: Path, source: int) -> None:
    """The first ROWS rows of the sample's shard `source` (synth_001.parquet is 1) written to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pq.read_table(SAMPLE_RAW_DIR / f"synth_{source:03d}.parquet").slice(0, ROWS), path)


def environment(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DAGSTER_HOME": str(root / "home"),
        "SYNTHKD_RAW_DIR": str(root / "raw"),
        "SYNTHKD_DATA_DIR": str(root / "data"),
    }


def terminal_signals() -> None:
    """The stop signals as a terminal's shell leaves them (default), whatever this test process inherited: a
    background launch ignores SIGINT, and Dagster's in-process runs then give SIGTERM that disposition, which
    bash could neither trap nor reset."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def start(root: Path, **env: str) -> subprocess.Popen:
    """build.sh in its own session, as from a terminal; output in files under root."""
    return subprocess.Popen(
        ["bash", "scripts/build.sh"],
        cwd=REPO_ROOT,
        env={**environment(root), **env},
        start_new_session=True,
        preexec_fn=terminal_signals,
        stdout=open(root / "stdout.txt", "w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def build(root: Path, timeout: int = 600, cores: set[int] | None = None) -> subprocess.CompletedProcess:
    """build.sh to its end; `cores`: the CPUs it may run on (default: all of this process's)."""
    return subprocess.run(
        ["bash", "scripts/build.sh"],
        cwd=REPO_ROOT,
        env=environment(root),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
    )


def materialized(instance: dg.DagsterInstance, run_id: str) -> set[str]:
    return {
        entry.dagster_event.asset_key.to_user_string()
        for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    }


def run_process_id(instance: dg.DagsterInstance, run_id: str) -> int:
    """The process that executed the run (Dagster's "Executing steps in process (pid: N)" event)."""
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        metadata = entry.dagster_event.engine_event_data.metadata
        if "pid" in metadata:
            return int(metadata["pid"].value)
    raise AssertionError(f"run {run_id}: no process recorded")


def start_two_shard_build(root: Path, rows: int = 400) -> subprocess.Popen:
    """build.sh (`start`) of synth_001 and synth_002 of the sample, `rows` rows each (runs long enough that a kill
    cannot miss them), once it has set up DAGSTER_HOME."""
    (root / "raw").mkdir(parents=True, exist_ok=True)
    for key in ["synth_001", "synth_002"]:
        table = pq.read_table(SAMPLE_RAW_DIR / f"{key}.parquet").slice(0, rows)
        pq.write_table(table, root / "raw" / f"{key}.parquet")
    process = start(root)
    # its first pass line: the build has created the instance's storage, which a second process creating it at
    # the same moment on a fresh DAGSTER_HOME would race ("table alembic_version already exists")
    wait_for(lambda: "inventory:" in (root / "stdout.txt").read_text() or process.poll() is not None, "the inventory")
    return process


def wait_for(condition, what: str, timeout: float = 300, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(every)


def descendants(pid: int) -> dict[int, tuple[int, bytes]]:
    """Every live process under `pid` (from /proc): its parent's pid and its command line."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = {}, [pid]
    while todo:
        parent = todo.pop()
        for child in parents.get(parent, []):
            try:
                found[child] = (parent, (Path("/proc") / str(child) / "cmdline").read_bytes())
            except OSError:
                continue
            todo.append(child)
    return found


def resume(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_every_pass_is_launched_through_the_instance_as_runs_of_its_job(tmp_path):
    """build.sh with nothing set on three shards: every pass is submitted to DAGSTER_HOME's instance, through
    its run queue and launcher (the daemon the build starts), as runs of the pass's job with the code location's
    origin (what the UI re-executes); a shard pass is a run of its job per shard; every run is
    in a process of its own, none in build.sh's; no more run at once than the queue admits; every run succeeded,
    one per pass and shard; a pass submitted only once the passes it runs after are through, and the quota plan
    before the manifests' run has ended (they run at once); the build's daemon and webserver are gone afterwards."""
    cores = available_cores()
    keys = ["synth_001", "synth_002", "synth_003"]
    for source, key in enumerate(keys, 1):
        small_shard(tmp_path / "raw" / f"{key}.parquet", source)
    process = start(tmp_path)
    seen: dict[int, tuple[int, bytes]] = {}
    while process.poll() is None:
        seen.update(descendants(process.pid))
        time.sleep(0.2)
    assert process.returncode == 0, (tmp_path / "stdout.txt").read_text()[-3000:]
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        runs = instance.get_runs()
        pid = {run.run_id: run_process_id(instance, run.run_id) for run in runs}
        assets = {run.run_id: materialized(instance, run.run_id) for run in runs}
        stats = {run.run_id: instance.get_run_stats(run.run_id) for run in runs}
    assert all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
    assert all(run.remote_job_origin is not None and run.remote_job_origin.location_name == "synthkd" for run in runs)
    assert len({run.tags[BUILD_TAG] for run in runs}) == 1
    pass_of_job = {job.name: name for name, job in PASS_JOBS.items()}
    assert all(run.tags["synthkd/pass"] == pass_of_job[run.job_name] for run in runs)
    shard_runs = [run for run in runs if "dagster/partition" in run.tags]
    whole = [run for run in runs if "dagster/partition" not in run.tags]
    passes = build_passes()
    assert sorted(run.job_name for run in whole) == sorted(PASS_JOBS[p.name].name for p in passes if not p.per_shard)
    for build_pass in (p for p in passes if p.per_shard):
        ran = [r for r in shard_runs if r.job_name == PASS_JOBS[build_pass.name].name]
        assert sorted(r.tags["dagster/partition"] for r in ran) == keys, build_pass.name
        assert all(assets[r.run_id] == set(build_pass.steps) for r in ran)
    assert process.pid not in pid.values() and len(set(pid.values())) == len(runs)  # a process per run
    # each pass is submitted once the passes it runs after are through (Pass.after); the manifests run beside the
    # quota plan, whose run is submitted before theirs has ended
    submitted = {
        p.name: [stats[r.run_id].enqueued_time for r in runs if r.tags["synthkd/pass"] == p.name] for p in passes
    }
    ended = {p.name: [stats[r.run_id].end_time for r in runs if r.tags["synthkd/pass"] == p.name] for p in passes}
    for build_pass in passes:
        assert all(min(submitted[build_pass.name]) >= max(ended[name]) for name in build_pass.after), build_pass.name
    assert submitted["quota"][0] < ended["manifest"][0]
    spans = sorted((stats[r].start_time, stats[r].end_time) for r in pid)
    at_once = max(sum(1 for s, e in spans if s <= start_ < e) for start_, _ in spans)
    assert at_once <= cores
    wait_for(lambda: not any(alive(p) for p in seen), "the build's daemon and webserver to exit", timeout=60)


def test_one_build_per_data_root_quoted_names_and_sigterm(tmp_path):
    """A build of two shards, one named with spaces and quotes: once its scan pass is through (both keys reached
    Dagster whole), a second build.sh and an in-process build on the same data root stop at once; then SIGTERM
    to build.sh stops it and every process under it, leaves no run of the instance in progress, and frees the
    lock."""
    (tmp_path / "raw").mkdir()
    for name, source in ((QUOTED, 2), ("synth_004", 4)):
        table = pq.read_table(SAMPLE_RAW_DIR / f"synth_{source:03d}.parquet").slice(0, 400)
        pq.write_table(table, tmp_path / "raw" / f"{name}.parquet")
    paths = DataLayout.from_environ(environment(tmp_path))
    first = start(tmp_path)
    seen: dict[int, tuple[int, bytes]] = {}

    def scanned() -> bool:
        seen.update(descendants(first.pid))
        reports = [paths.stage_report("synth_filtered", key) for key in (QUOTED, "synth_004")]
        return first.poll() is not None or all(report.is_file() for report in reports)

    try:
        wait_for(scanned, "the scan pass of both shards", timeout=600)
        assert first.poll() is None, (tmp_path / "stdout.txt").read_text()[-3000:]
        second = build(tmp_path, timeout=120)
        assert second.returncode == 75
        assert f"another build holds {paths.build_lock()}" in second.stderr
        with pytest.raises(BuildLockHeld, match="another build holds"):  # the in-process build honours it too
            with build_lock(paths.build_lock()):
                pass
        assert first.poll() is None, "the build ended before it could be stopped"
        seen.update(descendants(first.pid))
        first.send_signal(signal.SIGTERM)  # to build.sh only, as `kill <pid>` would
        assert first.wait(timeout=120) == 143
        stopped = "build stopped by SIGTERM: its queued runs canceled, its running ones stopped; run build.sh again"
        assert stopped in (tmp_path / "stdout.txt").read_text()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(pid) for pid in seen), "the build's processes to exit", timeout=60)
    with build_lock(paths.build_lock()):  # nothing holds the lock any more
        pass
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        runs = instance.get_runs()
    assert runs and not [run for run in runs if not run.is_finished], "a run left in progress"


def test_a_run_worker_killed_mid_run_is_failed_and_retried_by_dagster(tmp_path):
    """SIGKILL (the out-of-memory killer, say) to the process of a shard run of the build pass: Dagster marks the
    run failed (its code server, or the daemon's run monitoring) and its run retries launch it again; the build
    waits for the retry and finishes. Every run of the build carries its pass as the `synthkd/pass` tag."""
    process = start_two_shard_build(tmp_path, rows=750)
    started = dg.RunsFilter(tags={"synthkd/pass": "build"}, statuses=[dg.DagsterRunStatus.STARTED])
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:

        def worker() -> tuple | None:  # the run and process of a build-pass run that has started (its RUN_START's pid)
            for run in instance.get_runs(filters=started):
                for record in instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.RUN_START).records:
                    return run, record.event_log_entry.dagster_event.pid
            return None

        found: list = []
        wait_for(lambda: process.poll() is not None or found.append(worker()) or found[-1], "a build-pass run")
        assert process.poll() is None, (tmp_path / "stdout.txt").read_text()[-3000:]
        victim, pid = found[-1]
        os.kill(pid, signal.SIGKILL)
    assert process.wait(timeout=600) == 0, (tmp_path / "stdout.txt").read_text()[-3000:]
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        runs = instance.get_runs()
        killed = instance.get_run_by_id(victim.run_id)
    assert killed.status == dg.DagsterRunStatus.FAILURE and killed.tags["dagster/will_retry"] == "true"
    (retry,) = [run for run in runs if run.parent_run_id == victim.run_id]
    assert (
        retry.status == dg.DagsterRunStatus.SUCCESS
        and retry.tags["dagster/partition"] == victim.tags["dagster/partition"]
    )
    assert runs and all(run.is_finished for run in runs)
    assert {run.tags.get("synthkd/pass") for run in runs} == {p.name for p in build_passes()}


def test_sigkill_of_build_sh_and_its_group_stops_the_build(tmp_path):
    """What a scheduler's or CI's timeout sends: SIGKILL to build.sh's process group. Every process of the build
    exits (its daemon, webserver and runs die with it), the lock is free, nothing goes on to the summary; the
    runs it left in progress are failed by the next build's daemon (run monitoring), which then builds."""
    process = start_two_shard_build(tmp_path, rows=200)
    started = dg.RunsFilter(tags={"synthkd/pass": "scan"}, statuses=[dg.DagsterRunStatus.STARTED])
    seen: dict[int, tuple[int, bytes]] = {}
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:

        def running() -> bool:
            seen.update(descendants(process.pid))
            return process.poll() is not None or bool(instance.get_runs(filters=started))

        wait_for(running, "a shard run of the scan pass", timeout=600)
    assert process.poll() is None, (tmp_path / "stdout.txt").read_text()[-3000:]
    seen.update(descendants(process.pid))
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=60)
    wait_for(lambda: not any(alive(pid) for pid in seen), "the build's processes to exit", timeout=120)
    paths = DataLayout.from_environ(environment(tmp_path))
    with build_lock(paths.build_lock()):  # nothing holds the lock any more
        pass
    assert not paths.megatron_manifest().exists()  # the build did not go on to its end
    assert "synth_kd_v1: " not in (tmp_path / "stdout.txt").read_text()  # nor printed its summary
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        left = [run.run_id for run in instance.get_runs() if not run.is_finished]
    assert left, "the kill left no run unfinished: nothing tested"
    again = build(tmp_path, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    with dg.DagsterInstance.from_config(str(tmp_path / "home")) as instance:
        runs = instance.get_runs()
        stopped = [instance.get_run_by_id(run_id).status for run_id in left]
    assert runs and all(run.is_finished for run in runs), "a run left in progress"
    assert set(stopped) <= {dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE}


def test_an_empty_raw_directory_is_an_error_said_on_the_console(tmp_path):
    """On one core (this build.sh's CPU affinity). The dagster.yaml it writes into the fresh DAGSTER_HOME fixes no
    run-queue limit (the daemon counts its cores: tests/test_cluster_config.py) and no storage (it stores in
    that directory)."""
    (tmp_path / "raw").mkdir()
    done = build(tmp_path, timeout=300, cores={min(os.sched_getaffinity(0))})
    assert done.returncode != 0
    instance_yaml = yaml.safe_load((tmp_path / "home" / "dagster.yaml").read_text())
    assert "max_concurrent_runs" not in instance_yaml["run_coordinator"]["config"] and "storage" not in instance_yaml
    assert (tmp_path / "home" / "history").is_dir()
    # the failed step's own error
    assert (
        "step synth_raw_inventory failed: synthkd_assets.core.parquet_io.InputFileError: no raw shards in "
        f"{tmp_path / 'raw'}" in done.stderr
    )
    assert "0 shards" not in done.stdout


def test_a_missing_valuation_checkpoint_fails_the_build_before_it_starts(tmp_path):
    """Not after every shard's scan and build, in the pool pass: nothing is built, and the message names the
    checkpoint and the variables."""
    shutil.copytree(SAMPLE_RAW_DIR, tmp_path / "raw")
    missing = tmp_path / "student"
    done = subprocess.run(
        ["bash", "scripts/build.sh"],
        cwd=REPO_ROOT,
        env={
            **environment(tmp_path),
            "SYNTHKD_TEACHER_CHECKPOINT": str(tmp_path),
            "SYNTHKD_STUDENT_CHECKPOINT": str(missing),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1
    assert (
        "FAILED before the build started ($SYNTHKD_TEACHER_CHECKPOINT, $SYNTHKD_STUDENT_CHECKPOINT): valuation "
        f"checkpoint {missing} is not a directory (gpt_spec.json + model.pt)" in done.stderr
    )
    assert not [path for path in (tmp_path / "data").rglob("*") if path.is_file() and path.name != ".build.lock"]


@pytest.mark.parametrize("raw_below", ["data/synth_harmony", "data"])
def test_an_input_root_inside_the_output_tree_is_refused_before_anything_is_written(tmp_path, raw_below):
    """SYNTHKD_RAW_DIR inside the data root's output tree (its synth_harmony directory: the build overwrote the raw
    shards with its own tables), or the data root itself: refused naming both paths; the raw bytes and the data
    root stay as they were."""
    raw = tmp_path / raw_below
    small_shard(raw / "synth_001.parquet", 1)
    before = {path: path.read_bytes() for path in (tmp_path / "data").rglob("*") if path.is_file()}
    done = subprocess.run(
        ["bash", "scripts/build.sh"],
        cwd=REPO_ROOT,
        env={**environment(tmp_path), "SYNTHKD_RAW_DIR": str(raw)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert f"the input directory of the raw shards (SYNTHKD_RAW_DIR) {raw} overlaps the build's output" in done.stderr
    assert f"(data root {tmp_path / 'data'}, SYNTHKD_DATA_DIR)" in done.stderr
    assert {path: path.read_bytes() for path in (tmp_path / "data").rglob("*") if path.is_file()} == before
    with pytest.raises(InputOutputOverlap, match="overlaps the build's output directory"):
        SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data")).data_layout()  # every Dagster route


def test_a_newline_in_a_file_name_does_not_cut_the_reason_off_the_console_error(tmp_path):
    small_shard(tmp_path / "raw" / "synth_001.parquet", 1)
    small_shard(tmp_path / "raw" / "synth\n002.parquet", 2)
    done = build(tmp_path, timeout=300)
    assert done.returncode == 1
    shown = tmp_path / "raw" / "synth\\n002.parquet"  # escaped: the line goes on
    assert f"{shown}: the name holds ['\\n'], which a partition key cannot: rename the file" in done.stderr


def test_a_symlinked_build_lock_is_refused_and_creates_nothing_outside(tmp_path):
    small_shard(tmp_path / "raw" / "synth_001.parquet", 1)
    outside = tmp_path / "outside" / "lock"
    lock = tmp_path / "data" / ".build.lock"
    lock.parent.mkdir(parents=True)
    lock.symlink_to(outside)
    done = build(tmp_path, timeout=300)
    assert done.returncode == 2
    assert f"{lock} is a symbolic link (to {outside}): the build lock is a regular file" in done.stderr
    assert not outside.parent.exists()
    with pytest.raises(OSError, match="is a symbolic link"):
        with build_lock(lock):
            pass
    assert not outside.parent.exists()


def test_thread_map_keeps_the_order_runs_at_once_and_raises_the_first_error():
    """The global steps' per-file work (manifest checks, length stats) relies on results in input order."""
    import threading

    seen: set[int] = set()

    def slow_first(item: int) -> int:
        seen.add(threading.get_ident())
        time.sleep(0.05 if item == 0 else 0)
        return item * item

    assert thread_map(slow_first, range(8)) == [i * i for i in range(8)]
    assert len(seen) > 1 or available_cores() == 1  # item 0 sleeps: another thread takes the rest

    def fails_on_three(item: int) -> int:
        if item == 3:
            raise ValueError("part 3 unreadable")
        return item

    with pytest.raises(ValueError, match="part 3"):
        thread_map(fails_on_three, range(6))
    assert thread_map(fails_on_three, []) == [] and thread_map(fails_on_three, [2]) == [2]


def test_a_failed_builds_report_names_a_nearly_full_disk(tmp_path, monkeypatch):
    """SQLite says only "disk I/O error" on a full disk: the failure report names the filesystem and what is on it."""
    home, data = tmp_path / "home", tmp_path / "data" / "not yet made"
    home.mkdir()
    free = {str(home): 10 * 2**20, str(tmp_path): 2**40}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(0, 0, free[str(path)]))
    places = {"the data root": data, "$DAGSTER_HOME, the Dagster instance": home}
    assert low_disk_lines(places) == [
        f"disk nearly full: 10 MiB free on the filesystem of {home} ($DAGSTER_HOME, the Dagster instance)"
    ]
    free[str(home)] = 2**40
    assert low_disk_lines(places) == []
