"""Every `SYNTHKD_*` environment variable, and the one function that reads them (docs/design.md, "Environment
variables").

A process reads its environment once, into `Settings`, and hands that snapshot on: the layout's roots, the
executor, the run queue's size, the nightly cron, the checkpoints and the caches all come from it, so a value
is parsed and validated in one place and a typo in a variable's name cannot hide in a second reader. Unset
and empty mean the same (the default). The variables the deploy YAML files hand to Dagster (`env:` fields of
deploy/cluster and deploy/k8s) are listed here too, read by Dagster itself.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from synthkd_contract.harmony_artifact import ARTIFACT_ROW_GROUPS_PER_PARTITION


class SettingError(ValueError):
    """A variable's value a build cannot use; the message names the variable, its value and what it expects."""


@dataclass(frozen=True)
class Variable:
    """One environment variable: its name, what it means and what unset means."""

    name: str
    meaning: str
    unset: str
    read_by: str = "synthkd"  # or "Dagster" (an `env:` field of a deploy YAML), or "synthkd_dev"


RAW_DIR: Final = Variable("SYNTHKD_RAW_DIR", "the raw SYNTH Parquet shards", "data/sample/synth_raw")
DATA_DIR: Final = Variable("SYNTHKD_DATA_DIR", "the output root", "data")
SOURCES_DIR: Final = Variable(
    "SYNTHKD_SOURCES_DIR", "the anchor sources' shards, <dir>/<source key>/<shard>.{parquet,jsonl}", "SYNTH only"
)
HARMONY_DIR: Final = Variable(
    "SYNTHKD_HARMONY_DIR", "a synth_harmony_v1 artifact, beside or instead of raw SYNTH", "none"
)
HARMONY_RANGE_ROW_GROUPS: Final = Variable(
    "SYNTHKD_HARMONY_RANGE_ROW_GROUPS", "row groups per artifact partition (a whole number >= 1)", "100"
)
BUILD_CONFIG: Final = Variable(
    "SYNTHKD_BUILD_CONFIG", "a JSON object of the build resource's fields, for every run of the code location", "{}"
)
PARALLEL_RUNS: Final = Variable(
    "SYNTHKD_PARALLEL_RUNS", "runs the local run queue starts at once (a whole number >= 1)", "every core"
)
EXECUTOR: Final = Variable("SYNTHKD_EXECUTOR", "the executor: in_process, multiprocess, celery or k8s", "in_process")
CELERY_CONFIG: Final = Variable(
    "SYNTHKD_CELERY_CONFIG", "the Celery executor's and workers' YAML", "deploy/cluster/celery.yaml"
)
K8S_CONFIG: Final = Variable("SYNTHKD_K8S_CONFIG", "the k8s executor's run config YAML", "deploy/k8s/run_config.yaml")
REBUILD_CRON: Final = Variable("SYNTHKD_REBUILD_CRON", "the nightly rebuild schedule's cron", "0 3 * * *")
TEACHER_CHECKPOINT: Final = Variable(
    "SYNTHKD_TEACHER_CHECKPOINT", "the teacher the valuation features run", "none (model features null)"
)
STUDENT_CHECKPOINT: Final = Variable("SYNTHKD_STUDENT_CHECKPOINT", "the student of the valuation's KL", "none")
CACHE_DIR: Final = Variable(
    "SYNTHKD_CACHE_DIR",
    "where megatron-core's index caches of the trios go",
    "$XDG_CACHE_HOME/synthkd or ~/.cache/synthkd",
)
CELERY_BROKER: Final = Variable("SYNTHKD_CELERY_BROKER", "the Celery broker URL (Redis)", "required", "Dagster")
CELERY_BACKEND: Final = Variable("SYNTHKD_CELERY_BACKEND", "the Celery result backend URL", "required", "Dagster")
POSTGRES_URL: Final = Variable(
    "SYNTHKD_POSTGRES_URL", "the cluster instance's PostgreSQL storage", "required", "Dagster"
)
MAX_CONCURRENT_RUNS: Final = Variable(
    "SYNTHKD_MAX_CONCURRENT_RUNS", "the cluster run queue's limit", "deploy YAML's default", "Dagster"
)
LOCAL_CLUSTER_PIDS: Final = Variable(
    "SYNTHKD_LOCAL_CLUSTER_PIDS", "the processes `synthkd_dev.local_cluster` started", "none", "synthkd_dev"
)

VARIABLES: Final = (
    RAW_DIR,
    DATA_DIR,
    SOURCES_DIR,
    HARMONY_DIR,
    HARMONY_RANGE_ROW_GROUPS,
    BUILD_CONFIG,
    PARALLEL_RUNS,
    EXECUTOR,
    CELERY_CONFIG,
    K8S_CONFIG,
    REBUILD_CRON,
    TEACHER_CHECKPOINT,
    STUDENT_CHECKPOINT,
    CACHE_DIR,
    CELERY_BROKER,
    CELERY_BACKEND,
    POSTGRES_URL,
    MAX_CONCURRENT_RUNS,
    LOCAL_CLUSTER_PIDS,
)

DEFAULT_HARMONY_RANGE_ROW_GROUPS: Final = ARTIFACT_ROW_GROUPS_PER_PARTITION
CLUSTER_EXECUTORS: Final = ("celery", "k8s")  # steps run off this machine; the instance must be the cluster's
EXECUTORS: Final = ("in_process", "multiprocess", *CLUSTER_EXECUTORS)
DEFAULT_EXECUTOR: Final = EXECUTOR.unset
DEFAULT_REBUILD_CRON: Final = REBUILD_CRON.unset


def _whole_number(variable: Variable, value: str, what: str) -> int:
    number = int(value) if value.strip().isdigit() else 0
    if number < 1:
        raise SettingError(
            f"{variable.name}={value!r}: expected a whole number of {what} >= 1 (default {variable.unset})"
        )
    return number


@dataclass(frozen=True)
class Settings:
    """The `SYNTHKD_*` variables of one process's environment, read once; None where a variable is unset or
    empty (what unset means is each consumer's default, listed in `VARIABLES`)."""

    raw_dir: str | None = None
    data_dir: str | None = None
    sources_dir: str | None = None
    harmony_dir: str | None = None
    harmony_range_row_groups: int = DEFAULT_HARMONY_RANGE_ROW_GROUPS
    build_config: str | None = None
    parallel_runs: int | None = None
    executor: str = DEFAULT_EXECUTOR
    celery_config: str | None = None
    k8s_config: str | None = None
    rebuild_cron: str = DEFAULT_REBUILD_CRON
    teacher_checkpoint: str | None = None
    student_checkpoint: str | None = None
    cache_dir: str | None = None

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """The settings of `environ` (this process's environment when None).

        Args:
            environ: the environment to read.

        Returns:
            Every synthkd-read variable of `VARIABLES`, parsed.

        Raises:
            SettingError: naming the variable, when a number is not a whole number >= 1.
        """
        environ = os.environ if environ is None else environ

        def value(variable: Variable) -> str | None:
            return environ.get(variable.name) or None

        range_row_groups = value(HARMONY_RANGE_ROW_GROUPS)
        parallel = (value(PARALLEL_RUNS) or "").strip()
        return cls(
            raw_dir=value(RAW_DIR),
            data_dir=value(DATA_DIR),
            sources_dir=value(SOURCES_DIR),
            harmony_dir=value(HARMONY_DIR),
            harmony_range_row_groups=(
                _whole_number(HARMONY_RANGE_ROW_GROUPS, range_row_groups, "row groups")
                if range_row_groups
                else DEFAULT_HARMONY_RANGE_ROW_GROUPS
            ),
            build_config=value(BUILD_CONFIG),
            parallel_runs=_whole_number(PARALLEL_RUNS, parallel, "shard runs") if parallel else None,
            executor=value(EXECUTOR) or DEFAULT_EXECUTOR,  # checked where the executor is made
            celery_config=value(CELERY_CONFIG),
            k8s_config=value(K8S_CONFIG),
            rebuild_cron=value(REBUILD_CRON) or DEFAULT_REBUILD_CRON,
            teacher_checkpoint=value(TEACHER_CHECKPOINT),
            student_checkpoint=value(STUDENT_CHECKPOINT),
            cache_dir=value(CACHE_DIR),
        )
