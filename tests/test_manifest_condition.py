"""The Python parts of the manifests' automation condition (synthkd_assets/defs/conditions.py), on a real
instance: which failed runs Dagster's run retries are about to launch again. The daemon honouring the whole
condition: tests/test_automation_daemon.py."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import dagster as dg
import pytest
from dagster._core.remote_origin import GrpcServerCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin

from synthkd_assets.defs.conditions import (
    AUTO_RETRY_RUN_ID_TAG,
    RETRY_GRACE_S,
    WILL_RETRY_TAG,
    runs_awaiting_retry,
)

# where a daemon-launched run came from (a run of `dg launch` or `dg.materialize` has none)
ORIGIN = RemoteJobOrigin(
    repository_origin=RemoteRepositoryOrigin(
        code_location_origin=GrpcServerCodeLocationOrigin(host="localhost", port=4000, location_name="synthkd"),
        repository_name="__repository__",
    ),
    job_name="synth_shard_job",
)


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


def failed_run(instance: dg.DagsterInstance, tags: dict[str, str], launched: bool = True) -> str:
    run = dg.DagsterRun(
        job_name="synth_shard_job",
        run_id=str(uuid.uuid4()),
        status=dg.DagsterRunStatus.FAILURE,
        tags=tags,
        remote_job_origin=ORIGIN if launched else None,
    )
    return instance.add_run(run).run_id


def test_a_run_just_failed_and_to_be_retried_is_awaited(instance):
    waiting = failed_run(instance, {WILL_RETRY_TAG: "true"})
    assert runs_awaiting_retry(instance) == [waiting]


@pytest.mark.parametrize(
    "tags, launched",
    [
        ({WILL_RETRY_TAG: "true", AUTO_RETRY_RUN_ID_TAG: "its-retry"}, True),  # retried already
        ({WILL_RETRY_TAG: "false"}, True),  # out of retries, or failed in a step (not retried)
        ({}, True),  # failed with run retries off
        ({WILL_RETRY_TAG: "true"}, False),  # a dg launch run: the retry daemon cannot relaunch it
    ],
)
def test_runs_no_retry_will_follow_are_not_awaited(instance, tags, launched):
    failed_run(instance, tags, launched)
    assert runs_awaiting_retry(instance) == []


def test_a_retry_that_never_came_is_not_awaited_for_ever(instance):
    failed_run(instance, {WILL_RETRY_TAG: "true"})
    assert runs_awaiting_retry(instance, now=time.time() + RETRY_GRACE_S + 1) == []
