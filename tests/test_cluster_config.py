"""The cluster configurations in deploy/ validate against the schemas of the Dagster libraries that read them,
and SYNTHKD_EXECUTOR picks the engine the code location loads with. No services needed."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

# Dagster has no public reader of dagster.yaml that stops short of connecting to the storage it names
from dagster._core.instance.config import dagster_instance_config

from synthkd_assets.definitions import build_definitions, defs
from synthkd_assets.defs.executors import (
    CELERY_CONFIG_ENV,
    DEFAULT_CELERY_CONFIG,
    DEFAULT_K8S_CONFIG,
    EXECUTOR_ENV,
    executor_config_from_yaml,
    executor_from_settings,
)
from synthkd_assets.defs.instances import instance_home, local_instance_yaml
from synthkd_contract.settings import Settings
from tests.helpers import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
CLUSTER_ENV = {
    "SYNTHKD_CELERY_BROKER": "redis://redis.example:6379/0",
    "SYNTHKD_CELERY_BACKEND": "redis://redis.example:6379/1",
    "SYNTHKD_POSTGRES_URL": "postgresql+psycopg2://dagster@postgres.example:5432/dagster",
    "SYNTHKD_MAX_CONCURRENT_RUNS": "8",
}


@pytest.fixture
def cluster_env(monkeypatch):
    for key, value in CLUSTER_ENV.items():
        monkeypatch.setenv(key, value)


def test_the_embedded_default_runs_a_runs_steps_in_its_own_process():
    """Locally, the cores go to runs of different shards (the run queue admits one per core), and a run costs
    the same whoever launches it: no process per step."""
    assert executor_from_settings(Settings.read({})).name == "in_process"


def test_the_multiprocess_executor_runs_as_many_steps_at_once_as_there_are_cores(monkeypatch):
    """Counted when the code location loads, from the loading process's CPU affinity (7 here)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(7)))
    assert shard_job_execution_config({EXECUTOR_ENV: "multiprocess"})["max_concurrent"] == 7


def test_an_unknown_executor_is_refused_by_name():
    with pytest.raises(ValueError, match="SYNTHKD_EXECUTOR='spark'"):
        executor_from_settings(Settings.read({EXECUTOR_ENV: "spark"}))


def shard_job_execution_config(environ: dict) -> dict:
    """The executor config a synth_shard_job run gets with no run config (as sensor, schedule and backfill
    runs have), under the engine SYNTHKD_EXECUTOR names: what the configured executor really resolves to."""

    job = build_definitions(environ).resolve_job_def("synth_shard_job")
    (config,) = dg.validate_run_config(job, {})["execution"].values()
    return config


def test_the_celery_executor_is_configured_from_the_worker_yaml(cluster_env):
    config = shard_job_execution_config({EXECUTOR_ENV: "celery"})
    assert config["broker"] == CLUSTER_ENV["SYNTHKD_CELERY_BROKER"]  # {env: ...} resolved, as on the workers
    assert config["backend"] == CLUSTER_ENV["SYNTHKD_CELERY_BACKEND"]
    assert config["config_source"] == executor_config_from_yaml(DEFAULT_CELERY_CONFIG)["config_source"]
    source = config["config_source"]
    # what makes a lost worker's step come back: acknowledged only when done, and redelivered
    assert source["task_acks_late"] and source["task_reject_on_worker_lost"]
    assert source["broker_transport_options"]["visibility_timeout"] >= 3600


def test_the_celery_config_path_can_be_pointed_elsewhere(tmp_path, cluster_env):
    other = tmp_path / "celery.yaml"
    other.write_text(yaml.safe_dump({"execution": {"config": {"broker": "redis://elsewhere:6379/0"}}}))
    assert (
        shard_job_execution_config({EXECUTOR_ENV: "celery", CELERY_CONFIG_ENV: str(other)})["broker"]
        == "redis://elsewhere:6379/0"
    )
    other.write_text("broker: redis://x\n")
    with pytest.raises(ValueError, match="execution.config"):
        executor_from_settings(Settings.read({EXECUTOR_ENV: "celery", CELERY_CONFIG_ENV: str(other)}))


def test_the_code_location_loads_with_the_celery_executor_in_a_fresh_process():
    env = {**os.environ, **CLUSTER_ENV, EXECUTOR_ENV: "celery"}
    code = (
        "from synthkd_assets.definitions import defs; "
        "print(defs().resolve_job_def('synth_shard_job').executor_def.name)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "celery"


def _validate_class_config(module: str, class_name: str, config: dict) -> None:
    """The config schema of one class the instance loads (run launcher, run coordinator), checked by public
    dagster.validate_run_config through a throwaway op that takes that schema as its config; raises
    dagster.DagsterInvalidConfigError naming each bad entry."""
    klass = getattr(importlib.import_module(module), class_name)

    @dg.op(name="instance_class", config_schema=klass.config_type())
    def instance_class() -> None:
        """Never run: only its config is validated."""

    @dg.job(name="validate_instance_class")
    def validate_instance_class() -> None:
        instance_class()

    dg.validate_run_config(validate_instance_class, {"ops": {"instance_class": {"config": config}}})


def _validate_instance_yaml(directory) -> dict:
    """Dagster's own instance schema, then each configurable class's schema (without connecting anywhere)."""
    config, _ = dagster_instance_config(str(directory))
    for section in ("run_launcher", "run_coordinator"):
        if section in config:
            _validate_class_config(
                config[section]["module"], config[section]["class"], config[section].get("config", {})
            )
    return config


def test_the_repository_instance_yaml_validates_and_its_copy_stores_in_its_own_home(tmp_path):
    """dagster.yaml (DAGSTER_HOME = the repository root) keeps its storage under .dagster_home/; the copy
    build.sh and ui.sh write into another DAGSTER_HOME (`cli instance-home`) has no storage section, so that
    instance stores in its own directory; the smoke builds' instance, inside the full one's storage, is the
    same with a run queue that takes smoke runs only."""
    config = _validate_instance_yaml(REPO_ROOT)
    assert config["run_coordinator"]["class"] == "CoreSizedRunQueue"
    assert config["storage"] == {"sqlite": {"base_dir": ".dagster_home"}}
    assert config["compute_logs"]["config"]["base_dir"] == ".dagster_home/storage"
    assert_dead_runs_are_failed_and_retried(config)
    for smoke, home in ((False, tmp_path / "home"), (True, tmp_path / "home" / "smoke")):
        written = subprocess.run(
            [sys.executable, "-m", "synthkd_assets.cli", "instance-home", *(["--smoke"] if smoke else [])],
            cwd=REPO_ROOT,
            env={**os.environ, "DAGSTER_HOME": str(tmp_path / "home")},
            capture_output=True,
            text=True,
            check=True,
        )
        assert written.stdout == f"{home}\n"
        config = _validate_instance_yaml(home)
        assert "storage" not in config and "compute_logs" not in config
        assert config["telemetry"] == {"enabled": False}
        assert_dead_runs_are_failed_and_retried(config)
        assert config["run_coordinator"]["config"].get("builds", "full") == ("smoke" if smoke else "full")
        with dg.DagsterInstance.from_config(str(home)) as instance:
            assert Path(instance.root_directory) == home
            assert instance.run_coordinator.builds == ("smoke" if smoke else "full")
    # the repository's own instance keeps its smoke builds in its storage directory
    assert instance_home(str(REPO_ROOT), smoke=True) == REPO_ROOT / ".dagster_home" / "smoke"
    assert instance_home(None) == REPO_ROOT


@pytest.mark.parametrize(
    ("environ", "cores", "admitted"), [({}, {0, 1, 2}, 3), ({"SYNTHKD_PARALLEL_RUNS": "5"}, {0}, 5)]
)
def test_the_run_queue_admits_a_run_per_core_of_the_daemon(tmp_path, monkeypatch, environ, cores, admitted):
    """The tracked dagster.yaml cannot know the machine: the queue's limit is read where the instance loads (the
    daemon that dequeues), from its CPU affinity or $SYNTHKD_PARALLEL_RUNS."""
    (tmp_path / "dagster.yaml").write_text(local_instance_yaml())
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: cores)
    monkeypatch.delenv("SYNTHKD_PARALLEL_RUNS", raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.run_coordinator.get_run_queue_config().max_concurrent_runs == admitted


def assert_dead_runs_are_failed_and_retried(config: dict) -> None:
    """Run monitoring with the launcher that can see a run worker die, and retries of runs that did not fail in
    a step (tests/test_automation_daemon.py shows the daemon doing it)."""
    assert config["run_launcher"] == {
        "module": "synthkd_assets.defs.run_launcher",
        "class": "HealthCheckedRunLauncher",
    }
    assert config["run_monitoring"]["enabled"] is True
    assert config["run_retries"]["enabled"] is True and config["run_retries"]["max_retries"] >= 1


def test_the_cluster_instance_yaml_validates(cluster_env):
    config = _validate_instance_yaml(DEPLOY / "cluster")
    assert "postgres" in config["storage"]
    assert_dead_runs_are_failed_and_retried(config)


def test_the_k8s_instance_yaml_validates(cluster_env):
    config = _validate_instance_yaml(DEPLOY / "k8s")
    assert config["run_launcher"]["class"] == "K8sRunLauncher"


def test_the_k8s_executor_is_configured_from_the_k8s_run_config(cluster_env):
    """SYNTHKD_EXECUTOR=k8s: every run, with or without run config, gets deploy/k8s/run_config.yaml's
    namespace, data volume and step resources (validated by dagster-k8s's own executor schema)."""

    config = shard_job_execution_config({EXECUTOR_ENV: "k8s"})
    assert config["job_namespace"] == "synthkd"
    assert {"name": "synth-data", "mountPath": "/mnt/synth"} in config["volume_mounts"]
    assert config["step_k8s_config"]["container_config"]["resources"]["requests"]["cpu"] == "1"
    # per-step overrides name real steps of the job (a typo there would silently apply to nothing)
    steps = {node.name for node in defs().resolve_job_def("synth_shard_job").graph.nodes}
    assert set(executor_config_from_yaml(DEFAULT_K8S_CONFIG)["per_step_k8s_config"]) <= steps


def test_the_in_process_executor_can_be_chosen():
    assert executor_from_settings(Settings.read({EXECUTOR_ENV: "in_process"})).name == "in_process"


def test_pinned_local_cluster_workers_each_run_on_one_core_of_their_own(tmp_path, monkeypatch):
    """`LocalCluster.up(pin_workers=True)` (benchmarks/cluster_scaling.py --pin-workers): worker i, and every
    process it starts, may run on core i only; unpinned, on every core. The affinity each worker's Popen would
    set is applied to a real child process and read back."""
    from synthkd_dev import local_cluster

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: nothing to pin apart")
    launched: list[dict] = []

    class Started:
        pid = 0

        def __init__(self, cmd, **kwargs):
            launched.append(kwargs)

        def poll(self):
            return None

    cluster = local_cluster.LocalCluster(tmp_path / "state", tmp_path / "raw", tmp_path / "data")
    with monkeypatch.context() as patched:
        for name in ("start_postgres", "start_redis", "write_instance_yaml"):
            patched.setattr(local_cluster.LocalCluster, name, lambda self: None)
        patched.setattr(local_cluster, "_wait_for", lambda *args, **kwargs: None)
        patched.setattr(local_cluster.subprocess, "Popen", Started)
        cluster.up(workers=3, pin_workers=True)
        cluster.workers.clear()
        cluster.up(workers=1)

    def affinity(preexec_fn) -> list[int]:
        probe = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
        return yaml.safe_load(subprocess.run(probe, preexec_fn=preexec_fn, capture_output=True, text=True).stdout)

    pinned, unpinned = launched[:3], launched[3]
    assert [affinity(kwargs["preexec_fn"]) for kwargs in pinned] == [[cores[0]], [cores[1]], [cores[2 % len(cores)]]]
    assert unpinned["preexec_fn"] is None and affinity(None) == cores
