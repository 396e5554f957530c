"""synth_nightly_rebuild evaluated as Dagster evaluates a tick (the loaded Definitions' schedule,
build_schedule_context) against a built sample, and the input-manifest rules it applies. The daemon-driven rebuild is in
tests/test_automation_daemon.py."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime

import dagster as dg
import pytest

from synthkd_assets.core.inventory import (
    InputManifestError,
    RawShard,
    input_manifest_disagreements,
    read_input_manifest,
)
from synthkd_assets.definitions import defs
from synthkd_assets.defs.automation import latest_materializations, shard_run_key
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDLayout, synthkd_resources
from synthkd_contract import constants
from synthkd_contract.manifest_seal import sha256_file
from tests.daemon import dagster_home, open_instance
from tests.helpers import SAMPLE_RAW_DIR
from tests.raw_files import current_shas, edit_shard, write_input_manifest

SHARDS = ["synth_001", "synth_002", "synth_003", "synth_004", "synth_005", "synth_006"]


@pytest.fixture
def setup(built_sample, tmp_path):
    """A copy of the sample's raw files next to the data built from them, and a persistent instance with
    their partitions registered (schedules are evaluated against a persistent instance)."""
    _, _, data_dir = built_sample
    raw = tmp_path / "raw"
    shutil.copytree(SAMPLE_RAW_DIR, raw)
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(data_dir))
    with open_instance(dagster_home(tmp_path / "home")) as instance:
        instance.add_dynamic_partitions(SYNTH_SHARDS.name, SHARDS)
        yield instance, layout, raw


def tick(instance, layout: SynthKDLayout):
    """One evaluation of the schedule of the loaded Definitions, as the scheduler daemon evaluates it."""
    definitions = defs()
    with dg.build_schedule_context(
        instance=instance,
        scheduled_execution_time=datetime(2026, 1, 1, 3, tzinfo=UTC),
        resources=synthkd_resources(layout),
        repository_def=definitions.get_repository_def(),
    ) as context:
        return definitions.resolve_schedule_def("synth_nightly_rebuild").evaluate_tick(context)


def built_id(instance: dg.DagsterInstance, shard: str) -> int | None:
    """The storage id of the shard's latest synth_harmony materialization: part of its run key."""
    return latest_materializations(instance, dg.AssetKey("synth_harmony"), {shard}).get(shard)


def requested(data) -> list[tuple[str, str | None]]:
    return sorted((r.partition_key, r.run_key) for r in data.run_requests)


def test_nothing_changed_requests_nothing(setup):
    instance, layout, raw = setup
    data = tick(instance, layout)
    assert data.run_requests == [] and data.skip_message.startswith(
        "nothing changed: all 6 shards are built from the raw files"
    )
    write_input_manifest(raw, current_shas(raw))
    data = tick(instance, layout)
    assert data.run_requests == [] and "the input manifest" in data.skip_message


def test_a_changed_input_manifest_rebuilds_exactly_its_changed_shard(setup):
    instance, layout, raw = setup
    before = current_shas(raw)
    write_input_manifest(raw, before)
    edit_shard(raw / "synth_003.parquet")
    after = current_shas(raw)

    # the file changed, the manifest still lists the old bytes: the tick fails naming the file, requests nothing
    with pytest.raises(dg.DagsterUserCodeExecutionError) as failed:
        tick(instance, layout)
    error = failed.value.user_exception
    assert isinstance(error, InputManifestError) and "disagrees with the raw files, nothing requested" in str(error)
    assert f"synth_003.parquet: listed sha256 {before['synth_003']}, the file's is {after['synth_003']}" in str(error)

    write_input_manifest(raw, after)
    data = tick(instance, layout)
    key = shard_run_key("synth_003", after["synth_003"], built_id(instance, "synth_003"))  # the sensor's key
    assert key.startswith(f"synth_003:{after['synth_003']}:after-") and requested(data) == [("synth_003", key)]
    assert data.run_requests[0].asset_selection is None  # the whole synth_shard_job, under the plan in force

    # while a run of it is in flight (from this schedule or the sensor: same run key), it is not asked for again
    instance.create_run_for_job(
        defs().resolve_job_def("synth_shard_job"),
        status=dg.DagsterRunStatus.STARTED,
        tags={"dagster/run_key": key, "dagster/partition": "synth_003"},
    )
    data = tick(instance, layout)
    assert (
        data.run_requests == []
        and "already queued or running" in data.skip_message
        and "synth_003" in data.skip_message
    )


def test_a_shard_whose_newest_run_failed_is_requested_again_until_one_succeeds(setup):
    instance, layout, raw = setup
    sha = current_shas(raw)
    job = defs().resolve_job_def("synth_shard_job")

    def finished(status: dg.DagsterRunStatus, job=job, **tags: str) -> None:
        if status == dg.DagsterRunStatus.FAILURE:  # as Dagster tags a failure with run retries on (dagster.yaml)
            tags = {"dagster/will_retry": "false", **tags}
        instance.create_run_for_job(job, status=status, tags={"dagster/partition": "synth_004", **tags})

    finished(dg.DagsterRunStatus.FAILURE)  # its bytes are those its outputs were built from
    key = shard_run_key("synth_004", sha["synth_004"], built_id(instance, "synth_004"))
    assert requested(tick(instance, layout)) == [("synth_004", key)]
    # newer runs that a shard rebuild would not redo, or that Dagster retries itself, change nothing
    finished(dg.DagsterRunStatus.SUCCESS, job=defs().resolve_job_def("synth_pool_job"))
    assert requested(tick(instance, layout)) == [("synth_004", key)]
    finished(dg.DagsterRunStatus.SUCCESS)
    finished(dg.DagsterRunStatus.FAILURE, job=defs().resolve_job_def("synth_pool_job"))
    finished(dg.DagsterRunStatus.FAILURE, **{"dagster/will_retry": "true"})
    data = tick(instance, layout)
    assert data.run_requests == [] and data.skip_message.endswith("and no shard's newest run failed")
    finished(dg.DagsterRunStatus.FAILURE, job=defs().resolve_job_def("synth_build_job"))  # a build's, failed
    assert requested(tick(instance, layout)) == [("synth_004", key)]


def test_a_new_shard_is_registered_and_requested(setup):
    instance, layout, raw = setup
    shutil.copy(raw / "synth_004.parquet", raw / "synth_07.parquet")
    data = tick(instance, layout)
    assert requested(data) == [("synth_07", f"synth_07:{sha256_file(raw / 'synth_07.parquet')}:after-none")]
    assert instance.get_dynamic_partitions(SYNTH_SHARDS.name) == [*SHARDS, "synth_07"]


def test_without_a_plan_only_the_scan_pass_is_requested(tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(SAMPLE_RAW_DIR, raw)
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"))  # nothing built
    with open_instance(dagster_home(tmp_path / "home")) as instance:
        data = tick(instance, layout)
    assert [r.partition_key for r in data.run_requests] == SHARDS
    assert {tuple(k.to_user_string() for k in r.asset_selection) for r in data.run_requests} == {
        ("synth_harmony", "synth_filtered", "synth_signatures")
    }


def shard(name: str, sha: str) -> RawShard:
    return RawShard(name, f"/raw/{name}.parquet", 1, 1, sha)


def test_input_manifest_disagreements_name_each_file():
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    listed = {"synth_001.parquet": a, "synth_002.parquet": b, "synth_006.parquet": c}
    problems = input_manifest_disagreements(
        listed, [shard("synth_001", a), shard("synth_002", c), shard("synth_003", a)]
    )
    assert problems == [
        f"synth_002.parquet: listed sha256 {b}, the file's is {c}",
        "synth_003.parquet: in the raw directory but not listed",
        f"synth_006.parquet: listed (sha256 {c}) but not in the raw directory",
    ]
    assert input_manifest_disagreements({"synth_001.parquet": a}, [shard("synth_001", a)]) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not a JSON input manifest"),
        ('["synth_001.parquet"]', 'expected {"shards"'),
        (
            '{"shards": [{"file": "sub/synth_001.parquet", "sha256": "' + "a" * 64 + '"}]}',
            r"shards\[0\]: 'file' must name",
        ),
        (
            '{"shards": [{"file": "synth_001.parquet", "sha256": "ABC"}]}',
            r"shards\[0\] \(synth_001.parquet\): 'sha256' must be",
        ),
        (
            '{"shards": [{"file": "x.parquet", "sha256": "'
            + "a" * 64
            + '"}, {"file": "x.parquet", "sha256": "'
            + "b" * 64
            + '"}]}',
            r"shards\[1\]: x.parquet is listed twice",
        ),
    ],
)
def test_a_malformed_input_manifest_is_refused_naming_file_and_entry(tmp_path, text, message):
    path = tmp_path / constants.INPUT_MANIFEST_FILENAME
    path.write_text(text)
    with pytest.raises(InputManifestError, match=message) as refused:
        read_input_manifest(path)
    assert str(path) in str(refused.value)
    assert read_input_manifest(tmp_path / "absent.json") is None
