"""When synth_manifests_automation rewrites the manifests (synthkd_assets/defs/conditions.py), on a real
instance: which manifests are due (something they read materialized since their run started, by another run),
which failed runs Dagster's run retries are about to launch again (and so which shards the raw sensor leaves to
their retry), and which manifests have every shard built in the code location's layout. The daemon running the
sensor: tests/test_automation_daemon.py."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Iterator

import dagster as dg
import pytest

from synthkd_assets.core.layout import DATA_DIR_ENV, RAW_DIR_ENV
from synthkd_assets.defs import tags
from synthkd_assets.defs.automation import last_shard_run_failed, synth_manifests_automation
from synthkd_assets.defs.build import build_all, materialize_steps
from synthkd_assets.defs.conditions import RETRY_GRACE_S, is_due, manifests_decision, runs_awaiting_retry
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


def report(instance: dg.DagsterInstance, asset: str) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(asset))


def test_a_manifest_is_due_once_what_it_reads_is_newer(instance):
    assert not is_due(instance, "synth_harmony_manifest")  # nothing written yet, nothing to list
    report(instance, "synth_harmony")
    assert is_due(instance, "synth_harmony_manifest")  # never written, its shards are
    report(instance, "synth_harmony_manifest")
    assert not is_due(instance, "synth_harmony_manifest")
    report(instance, "synth_sampling_plan")  # read by the datasets' manifests, not by the harmony manifest
    assert not is_due(instance, "synth_harmony_manifest")
    assert is_due(instance, "synth_kd_v1_manifest") and is_due(instance, "synth_distill_manifest")
    report(instance, "synth_harmony")
    assert is_due(instance, "synth_harmony_manifest")


@pytest.mark.parametrize("storage", ["in memory", "sqlite"])
def test_an_update_landing_during_the_manifests_run_makes_them_due_again(storage, tmp_path):
    """A shard materialized while the manifest's run is going (after it started, before it wrote the manifest)
    may be missing from what it wrote: due again. A shard the same run materialized first is not. On sqlite, as
    in a DAGSTER_HOME, each run's events have their own storage ids: the run's start is compared by time."""
    with contextlib.ExitStack() as stack:
        if storage == "sqlite":
            instance = stack.enter_context(dg.DagsterInstance.local_temp(str(tmp_path)))
        else:
            instance = stack.enter_context(dg.DagsterInstance.ephemeral())
        materialize_during_and_after(instance)


def materialize_during_and_after(instance: dg.DagsterInstance) -> None:
    for _ in range(5):  # shards written before the manifest's run: it read them
        report(instance, "synth_harmony")

    @dg.asset(name="synth_harmony_manifest")
    def manifest_after_the_shards() -> None:
        pass

    assert dg.materialize([manifest_after_the_shards], instance=instance).success
    assert not is_due(instance, "synth_harmony_manifest")

    @dg.asset(name="synth_harmony_manifest")
    def manifest_while_a_shard_lands(context) -> None:  # noqa: ANN001 (Dagster reads the annotation)
        report(context.instance, "synth_harmony")

    assert dg.materialize([manifest_while_a_shard_lands], instance=instance).success
    assert is_due(instance, "synth_harmony_manifest")

    @dg.asset(name="synth_harmony")
    def shard() -> None:
        pass

    @dg.asset(name="synth_harmony_manifest", deps=[shard])
    def manifest_after_its_shard() -> None:
        pass

    assert dg.materialize([shard, manifest_after_its_shard], instance=instance).success
    assert not is_due(instance, "synth_harmony_manifest")


MANIFESTS = [dg.AssetKey(name) for name in MANIFEST_STEPS]


def decided(instance: dg.DagsterInstance, layout: SynthKDLayout) -> set[str]:
    """The manifests synth_manifests_automation requests now (its sensor, evaluated as the daemon does), in a run
    of synth_manifests_job."""
    result = synth_manifests_automation(dg.build_sensor_context(instance=instance))
    if isinstance(result, dg.SkipReason):
        return set()
    assert result.job_name in (None, "synth_manifests_job") and result.run_key
    return {key.to_user_string() for key in result.asset_selection}


def test_the_manifests_wait_for_every_shard_of_their_layout(built_sample, tmp_path, monkeypatch):
    """The manifests' automation follows the code location's (full) layout. After a smoke build alone (the same
    assets, in the same instance) it requests nothing: every full-layout record is missing, and a run would
    fail. With the full build there too it requests each manifest whose records are all present; one missing
    record holds back exactly the manifest that reads it, which would fail naming it."""
    data = tmp_path / "data"
    layout = SynthKDLayout(raw_dir=built_sample[1].raw_dir, data_dir=str(data))
    monkeypatch.setenv(RAW_DIR_ENV, layout.raw_dir)
    monkeypatch.setenv(DATA_DIR_ENV, str(data))
    full = layout.data_layout()
    with dg.DagsterInstance.ephemeral() as instance:
        smoke = SynthKDBuildConfig(smoke=True)
        build_all(instance, layout, smoke, outputs=["synth_kd_v1", "synth_distill"])  # its manifests last
        assert decided(instance, layout) == set()  # written after their shards
        # a shard run of the smoke build (as a re-execution of one from the UI): the manifests are due
        materialize_steps(instance, layout, SHARD_STEPS, "synth_003", build=smoke)
        assert all(is_due(instance, manifest) for manifest in MANIFEST_STEPS)
        assert decided(instance, layout) == set()
        assert "for shards built in this code location's layout" in manifests_decision(instance, full).reason
        for manifest in MANIFEST_STEPS:
            assert first_missing_shard_record(full, manifest) is not None  # nothing of the full layout yet

        # the full build's files beside the smoke build's (as a full build leaves them), one DistillKit record gone
        shutil.copytree(built_sample[2], data, dirs_exist_ok=True)
        gone = full.distill_record("synth_004")
        gone.unlink()
        assert first_missing_shard_record(full, "synth_distill_manifest") == gone
        assert decided(instance, layout) == {"synth_harmony_manifest", "synth_kd_v1_manifest"}
        assert f"synth_distill_manifest waits for {gone}" in manifests_decision(instance, full).reason
        # what the sensor spared: the manifest run would have failed, naming the record
        failed = materialize_steps(instance, layout, ["synth_distill_manifest"], raise_on_error=False)
        assert not failed.success
        errors = [event.event_specific_data.error.message for event in failed.get_step_failure_events()]
        assert any(f"synth_distill partition 'synth_004' has not been materialized ({gone}" in e for e in errors)


def test_the_manifests_wait_for_runs_in_flight_and_retries(instance, tmp_path):
    """Due manifests are not requested while a run writing what they read is running, nor while a failed run
    awaits its retry; a run of another pass (the pool) does not hold them."""
    paths = SynthKDLayout(raw_dir=str(tmp_path / "raw"), data_dir=str(tmp_path / "data")).data_layout()
    report(instance, "synth_harmony")
    running = instance.add_run(
        dg.DagsterRun(job_name="synth_build_job", run_id="b" * 36, status=dg.DagsterRunStatus.STARTED)
    ).run_id
    assert (
        f"waiting for runs that write what they read: {running[:8]} (synth_build_job)"
        in manifests_decision(instance, paths).reason
    )
    instance.report_run_canceled(instance.get_run_by_id(running))
    instance.add_run(dg.DagsterRun(job_name="synth_pool_job", run_id="p" * 36, status=dg.DagsterRunStatus.STARTED))
    add_failed_run(instance, {WILL_RETRY_TAG: "true"})
    assert "for the retry of failed runs" in manifests_decision(instance, paths).reason
