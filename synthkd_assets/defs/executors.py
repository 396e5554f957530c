"""Which engine runs the steps: the embedded multiprocess executor on one machine, Celery or Kubernetes on a cluster.

Chosen by $SYNTHKD_EXECUTOR when the code location loads (`definitions.py` builds the Definitions then, not at
import), so every process that loads it (webserver, daemon, run worker, Celery worker, step pod) must see the
same value: deploy/cluster/env.sh sets it for all of them.
The assets are the same in every mode; only where a step's process runs changes, and every step writes
through the shared data root ($SYNTHKD_DATA_DIR), atomically, so any engine produces the same bytes.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import yaml

from synthkd_assets.core.parallel import available_cores
from synthkd_assets.defs.instances import REPO_ROOT
from synthkd_contract import settings as env
from synthkd_contract.settings import Settings

EXECUTOR_ENV = env.EXECUTOR.name
CELERY_CONFIG_ENV = env.CELERY_CONFIG.name
K8S_CONFIG_ENV = env.K8S_CONFIG.name
DEFAULT_CELERY_CONFIG = REPO_ROOT / "deploy" / "cluster" / "celery.yaml"
DEFAULT_K8S_CONFIG = REPO_ROOT / "deploy" / "k8s" / "run_config.yaml"


def celery_config_path(settings: Settings) -> Path:
    """The one YAML file both the executor and `dagster-celery worker start -y` read (broker, acks, timeouts)."""
    return Path(settings.celery_config or DEFAULT_CELERY_CONFIG)


def k8s_config_path(settings: Settings) -> Path:
    return Path(settings.k8s_config or DEFAULT_K8S_CONFIG)


def executor_config_from_yaml(path: Path) -> dict:
    """The `execution.config` block of a run-config-shaped YAML. The Celery executor is configured from the
    very file the workers start with, so broker, backend and acknowledgement settings cannot drift apart;
    the k8s executor from deploy/k8s/run_config.yaml, so runs from sensors, schedules and backfills (which
    carry no run config) get the same namespace, volumes and step resources."""
    config = yaml.safe_load(path.read_text()) or {}
    try:
        return dict(config["execution"]["config"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: expected an execution.config block (the dagster-celery worker YAML)") from exc


def executor_from_settings(settings: Settings) -> dg.ExecutorDefinition:
    """The executor $SYNTHKD_EXECUTOR names (`settings.executor`, checked there): in_process by default, every
    step in the run's process; multiprocess runs at most as many steps of a run at once as the loading process
    has cores."""
    name = settings.executor
    if name == "multiprocess":
        return dg.multiprocess_executor.configured({"max_concurrent": available_cores()})
    if name == "in_process":  # every step in the run's own process: no per-step import cost, one step at a time
        return dg.in_process_executor
    if name == "celery":
        from dagster_celery import celery_executor

        return celery_executor.configured(executor_config_from_yaml(celery_config_path(settings)))
    if name == "k8s":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor.configured(executor_config_from_yaml(k8s_config_path(settings)))
    raise env.SettingError(f"{EXECUTOR_ENV}={name!r}: expected one of {', '.join(env.EXECUTORS)}")
