"""Incremental rebuilds: the sensor asks for exactly the changed shard; other shards' files are untouched."""

from __future__ import annotations

import json
import shutil

import dagster as dg
import pyarrow.parquet as pq
import pytest

from synthkd_assets.core.layout import STAGE_NAMES, DataLayout
from synthkd_assets.definitions import defs
from synthkd_assets.defs.build import materialize_steps
from synthkd_assets.defs.ingest import latest_raw_versions
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.passes import INVENTORY_STEPS
from synthkd_assets.defs.resources import SynthKDLayout, synthkd_resources
from synthkd_contract.manifest_seal import sha256_file
from synthkd_dev.sensor_ticks import tick_synth_raw_sensor
from tests.helpers import ALL_ASSETS, MANIFEST_STEPS, SAMPLE_RAW_DIR, SCAN_STEPS, SHARD_STEPS, build_everything, run


def tick(instance, layout: SynthKDLayout, cursor: str | None) -> dg.SensorResult:
    return tick_synth_raw_sensor(instance, layout, cursor)


def requested(result: dg.SensorResult) -> list[tuple[str, str | None]]:
    return sorted((r.job_name, r.partition_key) for r in result.run_requests)


def outputs_state(paths: DataLayout, shard: str, index: int) -> dict[str, tuple[int, int]]:
    files = [
        *(paths.stage_output(stage, shard) for stage in STAGE_NAMES),
        *sorted(paths.megatron_root().glob(f"*/shard_{index:02d}_*")),
        *sorted(paths.distill_root().glob(f"*/part-{index:05d}.parquet")),
    ]
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in files}


@pytest.fixture
def workspace(tmp_path):
    raw = tmp_path / "raw"
    shutil.copytree(SAMPLE_RAW_DIR, raw)
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        yield instance, layout, raw, layout.data_layout()


def test_sensor_builds_new_shards_then_only_the_changed_one(workspace):
    instance, layout, raw, paths = workspace
    first = tick(instance, layout, None)
    assert instance.get_dynamic_partitions(SYNTH_SHARDS.name) == [f"synth_{i:03d}" for i in range(1, 7)]
    # no sampling plan yet: only the scan pass (harmony, filters, signatures) can run per shard
    assert requested(first) == [("synth_scan_job", f"synth_{i:03d}") for i in range(1, 7)]

    build_everything(instance, layout)
    idle = tick(instance, layout, first.cursor)
    assert requested(idle) == [] and first.skip_reason is None
    # the tick history says why the tick did nothing, not only its cursor of hashes
    assert idle.skip_reason.skip_message.startswith("nothing to rebuild: the bytes of the 6 input shards are")
    assert requested(tick(instance, layout, None)) == []  # a lost cursor does not rebuild up-to-date shards

    untouched = {k: outputs_state(paths, f"synth_{k:03d}", k) for k in (1, 2, 4)}
    table = pq.read_table(raw / "synth_003.parquet")
    answers = table.column("synthetic_answer").to_pylist()
    answers[0] = answers[0] + "\n\nEdited upstream."
    pq.write_table(
        table.set_column(table.schema.get_field_index("synthetic_answer"), "synthetic_answer", [answers]),
        raw / "synth_003.parquet",
    )

    changed = tick(instance, layout, first.cursor)
    assert requested(changed) == [("synth_shard_job", "synth_003")]
    observed = {(e.partition, e.tags["dagster/data_version"]) for e in changed.asset_events}
    assert observed == {("synth_003", json.loads(changed.cursor)["shards"]["synth_003"])}
    assert requested(tick(instance, layout, changed.cursor)) == []  # asked once per content

    before = outputs_state(paths, "synth_003", 3)
    plan = paths.sampling_plan().read_bytes()
    run(instance, layout, SHARD_STEPS, "synth_003")  # rebuilt under the plan in force, which is not recomputed
    run(instance, layout, MANIFEST_STEPS)
    assert outputs_state(paths, "synth_003", 3) != before
    assert {k: outputs_state(paths, f"synth_{k:03d}", k) for k in (1, 2, 4)} == untouched
    assert paths.sampling_plan().read_bytes() == plan
    # the manifests rewritten by a run (synth_manifests_automation's, here by hand) are not asked for a second time
    assert requested(tick(instance, layout, changed.cursor)) == []


def test_sensor_follows_added_and_removed_files_and_the_input_manifest(workspace):
    instance, layout, raw, paths = workspace
    first = tick(instance, layout, None)
    build_everything(instance, layout)
    settled = tick(instance, layout, first.cursor)

    shutil.copy(raw / "synth_004.parquet", raw / "synth_07.parquet")
    synth_002 = (raw / "synth_002.parquet").read_bytes()
    (raw / "synth_002.parquet").unlink()
    result = tick(instance, layout, settled.cursor)
    registered = instance.get_dynamic_partitions(SYNTH_SHARDS.name)
    assert registered == ["synth_001", "synth_003", "synth_004", "synth_005", "synth_006", "synth_07"]
    # synth_002's outputs are removed by a run of their own (the sensor deletes nothing), then listed no more
    assert requested(result) == [("synth_inventory_job", None), ("synth_shard_job", "synth_07")]
    [cleanup] = [r for r in result.run_requests if r.job_name == "synth_inventory_job"]
    materialize_steps(instance, layout, INVENTORY_STEPS, tags={"dagster/run_key": cleanup.run_key})
    # a manifests run in flight (the automation's): the removal's run waits for it, never beside it
    writing = instance.add_run(
        dg.DagsterRun(job_name="synth_manifests_job", run_id="m" * 36, status=dg.DagsterRunStatus.STARTED)
    )
    deferred = tick(instance, layout, result.cursor)
    assert requested(deferred) == []
    instance.report_run_canceled(writing)
    tidied = tick(instance, layout, deferred.cursor)
    assert requested(tidied) == [("synth_manifests_job", None)]

    manifest = paths.harmony_manifest()
    manifest.write_text(manifest.read_text() + "\n")
    edited = tick(instance, layout, tidied.cursor)
    assert requested(edited) == [("synth_manifests_job", None)]

    # a shard removed, put back and removed again: the second removal's manifests run gets a key of its own
    # (the manifests were rewritten in between), so the daemon launches it and they stop listing the shard
    (raw / "synth_07.parquet").unlink()  # never built: its ids are synth_004's

    def put_back(cursor: str) -> str:
        (raw / "synth_002.parquet").write_bytes(synth_002)
        back = tick(instance, layout, cursor)
        assert requested(back) == [("synth_shard_job", "synth_002")]
        run(instance, layout, SHARD_STEPS, "synth_002")
        run(instance, layout, MANIFEST_STEPS)
        return back.cursor

    cursor, keys = put_back(edited.cursor), set()
    for _ in range(2):
        (raw / "synth_002.parquet").unlink()
        removal = tick(instance, layout, cursor)
        [cleanup] = removal.run_requests  # the sensor deletes nothing: synth_raw_inventory removes the files
        assert cleanup.job_name == "synth_inventory_job" and cleanup.run_key.startswith("removed:")
        materialize_steps(instance, layout, INVENTORY_STEPS, tags={"dagster/run_key": cleanup.run_key})
        removal = tick(instance, layout, removal.cursor)
        [request] = removal.run_requests
        assert request.job_name == "synth_manifests_job" and request.run_key.startswith("removed:")
        keys.add(request.run_key)
        materialize_steps(instance, layout, MANIFEST_STEPS, tags={"dagster/run_key": request.run_key})
        listed = [shard["partition"] for shard in json.loads(paths.megatron_manifest().read_text())["shards"]]
        assert "synth_002" not in listed and "synth_001" in listed
        cursor = put_back(removal.cursor)
    assert len(keys) == 2


def test_bytes_built_before_are_rebuilt_when_they_come_back(workspace):
    """A -> B -> A -> B, and a shard removed and put back twice: every change gets a run key no run has had, so
    the daemon launches it (Dagster never launches a sensor's run key twice: keyed by content alone, the second B
    was skipped and the shard stayed built from A). A tick with nothing new asks for nothing."""
    instance, layout, raw, paths = workspace
    shard, path = "synth_003", raw / "synth_003.parquet"
    original = path.read_bytes()
    edited = pq.read_table(path)
    answers = edited.column("synthetic_answer").to_pylist()
    answers[0] += "\n\nEdited upstream."
    edited = edited.set_column(edited.schema.get_field_index("synthetic_answer"), "synthetic_answer", [answers])

    def tick_and_run(cursor: str | None) -> str:
        result = tick(instance, layout, cursor)
        [request] = [r for r in result.run_requests if r.partition_key == shard]
        assert request.run_key not in {r.tags.get("dagster/run_key") for r in instance.get_runs()}, request.run_key
        # what the daemon launches: the request's job under its run key
        materialize_steps(instance, layout, SCAN_STEPS, shard, tags={"dagster/run_key": request.run_key})
        assert requested(tick(instance, layout, result.cursor)) == []
        return result.cursor

    cursor = tick_and_run(None)  # A
    for _ in range(2):
        pq.write_table(edited, path)  # B
        cursor = tick_and_run(cursor)
        path.write_bytes(original)  # A again
        cursor = tick_and_run(cursor)
    assert json.loads(paths.stage_report("synth_harmony", shard).read_text())["source_sha256"] == sha256_file(path)
    # B seen but its rebuild never ran (failed, say), then A put back: nothing to build, but synth_raw's version is
    # A's again (else the UI shows the shard stale for ever and synth_harmony refuses to read it)
    pq.write_table(edited, path)
    seen = tick(instance, layout, cursor)
    assert latest_raw_versions(instance, [shard]) == {shard: json.loads(seen.cursor)["shards"][shard]}
    path.write_bytes(original)
    returned = tick(instance, layout, seen.cursor)
    assert requested(returned) == [] and latest_raw_versions(instance, [shard]) == {shard: sha256_file(path)}
    # B seen and its rebuild launched, but A put back before it read the shard: the run fails
    # (RawShardChangedError) and the UI shows the shard's partitions failed. The next tick rebuilds A once (the
    # same bytes), and then asks for nothing
    pq.write_table(edited, path)
    seen = tick(instance, layout, returned.cursor)
    [request] = [r for r in seen.run_requests if r.partition_key == shard]
    path.write_bytes(original)
    failed = materialize_steps(
        instance, layout, SCAN_STEPS, shard, raise_on_error=False, tags={"dagster/run_key": request.run_key}
    )
    assert not failed.success
    cursor = tick_and_run(seen.cursor)
    assert instance.get_runs(limit=1)[0].status == dg.DagsterRunStatus.SUCCESS
    for _ in range(2):
        path.unlink()
        gone = tick(instance, layout, cursor)  # its partition goes; its outputs by the run the tick asks for
        [cleanup] = gone.run_requests
        assert cleanup.job_name == "synth_inventory_job" and paths.stage_report("synth_harmony", shard).exists()
        materialize_steps(instance, layout, INVENTORY_STEPS, tags={"dagster/run_key": cleanup.run_key})
        assert not paths.stage_report("synth_harmony", shard).exists()
        path.write_bytes(original)  # put back
        cursor = tick_and_run(gone.cursor)


def test_a_partition_key_added_by_hand_fails_readably_and_goes_once_its_run_ends(workspace):
    """The launch dialog's "Add partition": a run of a key that names no input file fails in synth_harmony
    with a message saying so; the sensor keeps the key while a run of it is queued or running (deleted under the
    run, Dagster would fail it with a partition-range trace), then removes it."""
    instance, layout, _, paths = workspace
    first = tick(instance, layout, None)
    instance.add_dynamic_partitions(SYNTH_SHARDS.name, ["my_shard"])
    running = dg.DagsterRun(
        job_name="synth_scan_job", status=dg.DagsterRunStatus.STARTED, tags={"dagster/partition": "my_shard"}
    )
    instance.add_run(running)
    tick(instance, layout, first.cursor)
    assert "my_shard" in instance.get_dynamic_partitions(SYNTH_SHARDS.name)
    result = dg.materialize(
        ALL_ASSETS,
        selection=dg.AssetSelection.assets("synth_harmony"),
        partition_key="my_shard",
        instance=instance,
        resources=synthkd_resources(layout),
        raise_on_error=False,
    )
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    message = failure.event_specific_data.error.message
    assert f"partition 'my_shard' names no input file (looked for my_shard.parquet in {paths.raw_root})" in message
    assert '"Add partition"' in message and "launch one of the listed partitions" in message
    instance.delete_run(running.run_id)
    tick(instance, layout, first.cursor)
    assert "my_shard" not in instance.get_dynamic_partitions(SYNTH_SHARDS.name)


def test_a_rebuild_whose_run_ended_unbuilt_is_said_with_its_repair_not_asked_again(workspace):
    """The sensor asked for a changed shard's rebuild, then it was turned off and the run canceled (or the run
    failed for good): Dagster never launches a run key twice, so asking again would launch nothing while the tick
    history said "nothing to rebuild". The tick says instead which run ended how and what finishes it; once the
    shard is rebuilt (the run re-executed), nothing is left to say."""
    instance, layout, raw, paths = workspace
    build_everything(instance, layout)
    cursor = tick(instance, layout, None).cursor
    table = pq.read_table(raw / "synth_003.parquet")
    answers = table.column("synthetic_answer").to_pylist()
    answers[0] += "\n\nEdited upstream."
    column = table.schema.get_field_index("synthetic_answer")
    pq.write_table(table.set_column(column, "synthetic_answer", [answers]), raw / "synth_003.parquet")
    changed = tick(instance, layout, cursor)
    [request] = changed.run_requests
    # what the daemon launched for it, then canceled
    job = defs().resolve_job_def(request.job_name)
    launched = instance.create_run_for_job(job, tags={"dagster/run_key": request.run_key, **request.tags})
    instance.report_run_canceled(launched)
    said = tick(instance, layout, changed.cursor)
    assert requested(said) == []
    reason = said.skip_reason.skip_message
    assert reason.startswith(
        f"not rebuilt, their rebuild ended without building them (synth_003: run {launched.run_id[:8]} canceled)"
    )
    assert (
        "re-execute the run from its page (Runs)" in reason
        and "nothing else to rebuild: the bytes of the other 5" in reason
    )
    run(instance, layout, SHARD_STEPS, "synth_003")  # the re-execution
    assert tick(instance, layout, said.cursor).skip_reason.skip_message.startswith(
        "nothing to rebuild: the bytes of the 6"
    )
