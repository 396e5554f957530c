"""The same graph on a real distributed engine: a PostgreSQL instance, the Celery executor with a Redis broker
and two Celery workers, all on 127.0.0.1 (synthkd_dev.local_cluster). Every sample partition goes through
scripts/build.sh with SYNTHKD_EXECUTOR=celery, and the outputs must equal the embedded build byte for byte;
then a worker is SIGKILLed the moment it takes a step, and the step must be redelivered to the other worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
import yaml

from synthkd_assets.defs.executors import DEFAULT_CELERY_CONFIG
from synthkd_assets.defs.jobs import PASS_JOBS
from synthkd_assets.defs.passes import BUILD_STEPS
from synthkd_dev.local_cluster import LocalCluster, services_available
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR
from tests.test_crash_safety import final_files

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(services_available() is not None, reason=str(services_available())),
]

REDELIVERY_SECONDS = 30  # the test's visibility timeout: longer than any sample step, short enough to wait for
KILLED_PARTITION = "synth_002"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    state = tmp_path_factory.mktemp("cluster")
    # the committed worker/executor settings, with a redelivery timeout a test can wait for
    settings = yaml.safe_load(DEFAULT_CELERY_CONFIG.read_text())
    settings["execution"]["config"]["config_source"]["broker_transport_options"].update(
        visibility_timeout=REDELIVERY_SECONDS, unacked_restore_interval=1, unacked_restore_throttle=1
    )
    celery_config = state / "celery.yaml"
    celery_config.write_text(yaml.safe_dump(settings))
    local = LocalCluster(state, SAMPLE_RAW_DIR, state / "data", celery_config=celery_config)
    try:
        local.up(workers=2)
        yield local
    finally:
        local.down()


@contextmanager
def cluster_instance(local: LocalCluster, monkeypatch: pytest.MonkeyPatch):
    for key, value in local.env().items():
        monkeypatch.setenv(key, value)
    with dg.DagsterInstance.from_config(str(local.dagster_home)) as instance:
        yield instance


def step_workers(instance: dg.DagsterInstance, run_id: str) -> list[tuple[str, str]]:
    """(step key, Celery worker name) for every time a worker started executing a step of the run."""
    found = []
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
        if entry.message.endswith("in celery worker"):  # "[CeleryExecutor] Executing steps <key> in celery worker"
            metadata = entry.dagster_event.engine_event_data.metadata
            found.append((entry.step_key, metadata["Celery worker"].value.split("@")[0]))
    return found


def received_tasks(local: LocalCluster, worker: str, seen: dict[str, list[str]]) -> list[str]:
    """Celery task ids the worker's log says it received, minus those in seen[worker]."""
    log = local.worker_log(worker)
    text = log.read_text(errors="replace") if log.is_file() else ""
    ids = re.findall(r"Task execute_plan\[([0-9a-f-]+)\] received", text)
    return [i for i in ids if i not in seen.get(worker, [])]


@pytest.fixture(scope="module")
def cluster_build(cluster):
    env = {**os.environ, **cluster.env(), "SYNTHKD_PARALLEL_RUNS": "2"}
    done = subprocess.run(
        ["bash", "scripts/build.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1500
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def test_every_partition_through_two_celery_workers_equals_the_embedded_build(
    cluster, cluster_build, built_sample, monkeypatch
):
    from dagster_postgres import PostgresRunStorage

    _, _, embedded_data = built_sample
    assert "synth_kd_v1: 6 shards" in cluster_build.stdout
    assert final_files(cluster.data_dir) == final_files(embedded_data)
    with cluster_instance(cluster, monkeypatch) as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        runs = instance.get_runs()
        assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
        built = {r.tags.get("dagster/partition") for r in runs if r.job_name == "synth_build_job"}
        assert built == {p.stem for p in SAMPLE_RAW_DIR.glob("*.parquet")}
        # each pass a run of its job (as the UI lists a local build's), tagged with its pass
        assert {(r.job_name, r.tags.get("synthkd/pass")) for r in runs} == {
            (job.name, name) for name, job in PASS_JOBS.items()
        }
        # and each was launched from the code location (its origin), as the UI's re-execution needs
        assert all(r.remote_job_origin.location_name == "synthkd" for r in runs)
        workers = {worker for r in runs for _, worker in step_workers(instance, r.run_id)}
        assert workers == {"worker1", "worker2"}  # both machines did work


def _build_pass_outputs(data_dir: Path, key: str) -> list[Path]:
    """The files synth_shard_job rewrites for `key` after its scan pass (the pool pass is not part of it)."""
    scan = {"synth_harmony", "synth_filtered", "synth_signatures", "synth_clusters", "synth_pool"}
    return [
        p
        for p in data_dir.rglob("*")
        if p.is_file() and key in p.name and not scan & set(p.relative_to(data_dir).parts)
    ]


def test_a_worker_killed_holding_a_step_is_redelivered_and_the_build_still_matches(
    cluster, cluster_build, built_sample, monkeypatch
):
    _, _, embedded_data = built_sample
    removed = _build_pass_outputs(cluster.data_dir, KILLED_PARTITION)
    assert removed, "the build pass wrote nothing for the partition"
    for path in removed:
        path.unlink()
    env = {**os.environ, **cluster.env()}
    with cluster_instance(cluster, monkeypatch) as instance:
        known = {r.run_id for r in instance.get_runs()}
        seen = {name: received_tasks(cluster, name, {}) for name in cluster.workers}
        run = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "dagster"),
                "asset",
                "materialize",
                "-m",
                "synthkd_assets.definitions",
                "--select",
                ",".join(BUILD_STEPS),
                "--partition",
                KILLED_PARTITION,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            # the moment a worker's log shows it received a step of the run, take that worker down hard: a step
            # is acknowledged only when finished, and none finishes between that line and the kill
            deadline = time.monotonic() + 180
            taken = None
            while taken is None:
                assert run.poll() is None and time.monotonic() < deadline, "no step of the run reached a worker"
                taken = next(
                    ((name, ids[0]) for name in cluster.workers if (ids := received_tasks(cluster, name, seen))), None
                )
                time.sleep(0.02)
            killed_worker, task_id = taken
            cluster.kill_worker(killed_worker)
            _, stderr = run.communicate(timeout=600)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 0, stderr[-4000:]
        survivor = ({"worker1", "worker2"} - {killed_worker}).pop()
        assert task_id in received_tasks(cluster, survivor, seen)  # the same Celery task, redelivered
        (new_run,) = [r for r in instance.get_runs() if r.run_id not in known]
        assert instance.get_run_by_id(new_run.run_id).status == dg.DagsterRunStatus.SUCCESS
        executions = step_workers(instance, new_run.run_id)
        # every step of the partition, the killed one included, finished on the surviving worker
        steps = {step for step, _ in executions}
        assert {step for step, worker in executions if worker == survivor} == steps
        assert {"synth_sampled", "synth_tokenized", "synth_kd_v1", "synth_distill"} <= steps
    assert all(path.is_file() for path in removed)
    assert final_files(cluster.data_dir) == final_files(embedded_data)
