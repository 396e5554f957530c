"""The Python parts of the manifests' automation condition (synthkd_assets/defs/conditions.py), on a real
instance: which failed runs Dagster's run retries are about to launch again (and so which shards the raw
sensor leaves to their retry), and which manifests have every shard built in the code location's layout
(Dagster's own evaluation of the condition). The daemon honouring the whole condition:
tests/test_automation_daemon.py."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator

import dagster as dg
import pytest

from synthkd_assets.core.layout import DATA_DIR_ENV, RAW_DIR_ENV
from synthkd_assets.definitions import build_definitions
from synthkd_assets.defs import tags
from synthkd_assets.defs.automation import last_shard_run_failed
from synthkd_assets.defs.build import build_all, materialize_steps
from synthkd_assets.defs.conditions import RETRY_GRACE_S, runs_awaiting_retry
from synthkd_assets.defs.passes import MANIFEST_STEPS, SHARD_STEPS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.tags import (
    AUTO_RETRY_RUN_ID_TAG,
    PARTITION_TAG,
    RETRY_TAG_GRACE_SECONDS,
    WILL_RETRY_TAG,
)
from synthkd_assets.defs.upstream import first_missing_shard_record
from tests.helpers import add_failed_run


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance


def test_a_run_just_failed_and_to_be_retried_is_awaited(instance):
    waiting = add_failed_run(instance, {WILL_RETRY_TAG: "true"})
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
    add_failed_run(instance, tags, launched)
    assert runs_awaiting_retry(instance) == []


def test_a_failed_run_not_yet_tagged_is_awaited_while_dagster_may_still_tag_it():
    """Dagster tags whether it will retry a run in a second write after the failure: with run retries on, a run
    read in between is awaited, for RETRY_TAG_GRACE_SECONDS."""
    with dg.DagsterInstance.ephemeral(settings={"run_retries": {"enabled": True}}) as instance:
        untold = add_failed_run(instance, {})
        assert runs_awaiting_retry(instance) == [untold]
        assert runs_awaiting_retry(instance, now=time.time() + RETRY_TAG_GRACE_SECONDS + 1) == []


def test_the_raw_sensor_rebuilds_a_shard_only_once_its_last_run_failed_for_good(monkeypatch):
    """The raw sensor rebuilds a shard whose last run failed (last_shard_run_failed), not one Dagster is about to
    retry: told so, or failed moments ago and not yet tagged either way."""
    with dg.DagsterInstance.ephemeral(settings={"run_retries": {"enabled": True}}) as instance:
        untold = add_failed_run(instance, {PARTITION_TAG: "synth_001"})
        assert not last_shard_run_failed(instance, "synth_001")
        instance.add_run_tags(untold, {WILL_RETRY_TAG: "true"})
        assert not last_shard_run_failed(instance, "synth_001")
        instance.add_run_tags(untold, {WILL_RETRY_TAG: "false"})
        assert last_shard_run_failed(instance, "synth_001")
        add_failed_run(instance, {PARTITION_TAG: "synth_002"})
        monkeypatch.setattr(tags, "RETRY_TAG_GRACE_SECONDS", 0.0)  # a tag that never came
        assert last_shard_run_failed(instance, "synth_002")


def test_a_retry_that_never_came_is_not_awaited_for_ever(instance):
    add_failed_run(instance, {WILL_RETRY_TAG: "true"})
    assert runs_awaiting_retry(instance, now=time.time() + RETRY_GRACE_S + 1) == []


MANIFESTS = [dg.AssetKey(name) for name in MANIFEST_STEPS]


def requested_manifests(result) -> set[str]:
    return {key.to_user_string() for key in MANIFESTS if result.get_num_requested(key)}


def test_the_manifests_wait_for_every_shard_of_their_layout(built_sample, tmp_path, monkeypatch):
    """The manifests' automation follows the code location's (full) layout. After a smoke build alone (the same
    assets, in the same instance) it requests nothing: every full-layout record is missing, and a run would
    fail. With the full build there too it requests each manifest whose records are all present; one missing
    record holds back exactly the manifest that reads it, which would fail naming it."""
    data = tmp_path / "data"
    layout = SynthKDLayout(raw_dir=built_sample[1].raw_dir, data_dir=str(data))
    monkeypatch.setenv(RAW_DIR_ENV, layout.raw_dir)
    monkeypatch.setenv(DATA_DIR_ENV, str(data))
    defs = build_definitions(os.environ)
    full = layout.data_layout()
    with dg.DagsterInstance.ephemeral() as instance:
        smoke = SynthKDBuildConfig(smoke=True)
        build_all(instance, layout, smoke, outputs=["synth_kd_v1", "synth_distill"])  # its manifests last
        built = dg.evaluate_automation_conditions(defs=defs, instance=instance)  # the cursor the next ones start from
        # a shard run of the smoke build (as a re-execution of one from the UI): the manifests are due
        materialize_steps(instance, layout, SHARD_STEPS, "synth_003", build=smoke)
        smoke_only = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=built.cursor)
        assert requested_manifests(smoke_only) == set()
        for manifest in MANIFEST_STEPS:
            assert first_missing_shard_record(full, manifest) is not None  # nothing of the full layout yet

        # the full build's files beside the smoke build's (as a full build leaves them), one DistillKit record gone
        shutil.copytree(built_sample[2], data, dirs_exist_ok=True)
        gone = full.distill_record("synth_004")
        gone.unlink()
        assert first_missing_shard_record(full, "synth_distill_manifest") == gone
        later = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=smoke_only.cursor)
        assert requested_manifests(later) == {"synth_harmony_manifest", "synth_kd_v1_manifest"}
        # what the condition spared: the manifest run would have failed, naming the record
        failed = materialize_steps(instance, layout, ["synth_distill_manifest"], raise_on_error=False)
        assert not failed.success
        errors = [event.event_specific_data.error.message for event in failed.get_step_failure_events()]
        assert any(f"synth_distill partition 'synth_004' has not been materialized ({gone}" in e for e in errors)
