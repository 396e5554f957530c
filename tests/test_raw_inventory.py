"""The raw directory as users and filesystems leave it: empty, missing, colliding shard numbers, names
without a number, a directory or a dangling symlink named *.parquet, files the rule skips; shards that
vanish after a build; NUL in synth_id; the data root's build lock against a second real process."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from synthkd_assets.core.buildlock import BuildLockHeld, build_in_progress, build_lock, lock_fd
from synthkd_assets.core.checks import dataset_rows_problems
from synthkd_assets.core.cleanup import orphaned_outputs, remove_orphaned_outputs, unpublish_pool
from synthkd_assets.core.inventory import (
    ignored_raw_files,
    partition_key_for,
    raw_shard_paths,
    scan_raw_dir,
    shard_index_from_name,
)
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.ownership import OutputPathError, compact_ledger, ledger_path, written_by_build
from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.core.stages import harmonize_shard
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.defs.automation import synth_raw_sensor
from synthkd_assets.defs.build import BuildFailed, BuildProgress, build_all
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.passes import INVENTORY_STEPS
from synthkd_assets.defs.resources import SynthKDLayout, synthkd_resources
from synthkd_assets.launch import failed_run_lines
from synthkd_contract import constants, drops
from synthkd_contract.manifest_seal import sidecar_path
from synthkd_dev.sensor_ticks import tick_synth_raw_sensor
from synthkd_training.dataset import tokens_prefixes
from tests.helpers import (
    MANIFEST_STEPS,
    REPO_ROOT,
    SAMPLE_RAW_DIR,
    SCAN_STEPS,
    SHARD_STEPS,
    check_outcomes,
    materialize_steps,
    partial_left_by_killed_writer,
    pool_published,
    run,
    write_as_build,
)
from tests.test_bad_input import row, write_raw

ROWS = 40  # rows per small shard cut from the sample


def small_shard(path: Path, source: int = 1, rows: int = ROWS) -> Path:
    """The first `rows` rows of the sample's shard `source` (synth_001.parquet is 1) written to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pq.read_table(SAMPLE_RAW_DIR / f"synth_{source:03d}.parquet").slice(0, rows), path)
    return path


def lock_of(data_root: Path) -> Path:
    """The build lock of a data root (the raw root plays no part in it)."""
    return DataLayout(data_root.parent / "raw", data_root).build_lock()


def every_file(*roots: Path) -> list[str]:
    return sorted(str(p) for root in roots for p in root.rglob("*") if p.is_file())


# --- what the inventory refuses -----------------------------------------------------------------


def test_an_empty_or_missing_raw_directory_is_an_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputFileError, match=f"no raw shards in {tmp_path / 'empty'}"):
        scan_raw_dir(tmp_path / "empty")
    with pytest.raises(InputFileError, match=f"no raw shards in {tmp_path / 'missing'}: the directory does not exist"):
        scan_raw_dir(tmp_path / "missing")


def test_an_empty_raw_directory_fails_the_inventory_and_leaves_the_partitions(tmp_path):
    raw = tmp_path / "raw"
    small_shard(raw / "synth_001.parquet")
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        run(instance, layout, ["synth_raw_inventory"])
        (raw / "synth_001.parquet").unlink()  # e.g. an unmounted share
        with pytest.raises(BuildFailed, match="no raw shards in"):
            run(instance, layout, ["synth_raw_inventory"])
        assert instance.get_dynamic_partitions(SYNTH_SHARDS.name) == ["synth_001"]


@pytest.mark.parametrize(
    "names, number",
    [
        (("synth_001.parquet", "synth_1.parquet"), 1),
        (("a_1.parquet", "b_1.parquet"), 1),
        (("x_1.5.parquet", "y_5.parquet"), 5),
    ],
)
def test_two_names_with_one_shard_number_are_refused_naming_both(tmp_path, names, number):
    for name in names:
        small_shard(tmp_path / name)
        # the number the inventory judges is the number every output of that partition is named after
        assert shard_index_from_name(name) == shard_index_from_name(partition_key_for(tmp_path / name)) == number
    with pytest.raises(InputFileError) as refused:
        scan_raw_dir(tmp_path)
    message = str(refused.value)
    assert all(str(tmp_path / name) in message for name in names) and f"(shard {number:02d})" in message


def test_a_zero_row_twin_cannot_overwrite_a_shard(tmp_path):
    """The reported case (then synth_01): synth_001 with rows and an empty synth_1 are refused before any step runs."""
    raw = tmp_path / "raw"
    small_shard(raw / "synth_001.parquet")
    write_raw(raw / "synth_1.parquet", [])
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance, pytest.raises(BuildFailed, match="synth_1.parquet"):
        build_all(instance, layout)
    assert not layout.data_layout().megatron_root().exists()


def test_a_name_without_a_shard_number_is_refused_at_inventory(tmp_path):
    small_shard(tmp_path / "synth_001.parquet")
    small_shard(tmp_path / "extra.parquet")
    with pytest.raises(
        InputFileError, match=f"{tmp_path / 'extra.parquet'}: shard file 'extra.parquet' has no trailing shard number"
    ):
        scan_raw_dir(tmp_path)


def test_a_shard_number_in_the_anchor_sources_range_is_refused_at_inventory(tmp_path):
    """A date-stamped name (synth_20251125) is a number an anchor shard may have: their outputs would overwrite
    each other's (shard_<n>_* trios, part-<n> files), so the inventory refuses it; one below is a shard."""
    small_shard(tmp_path / "synth_9999999.parquet")
    assert [p.name for p in raw_shard_paths(tmp_path)] == ["synth_9999999.parquet"]
    small_shard(tmp_path / "synth_20251125.parquet")
    with pytest.raises(
        InputFileError, match=f"{tmp_path / 'synth_20251125.parquet'}: shard number 20251125 is not below 10,000,000"
    ):
        scan_raw_dir(tmp_path)


@pytest.mark.parametrize("kind", ["directory", "dangling symlink"])
def test_a_directory_or_dangling_symlink_named_parquet_is_an_input_file_error(tmp_path, kind):
    small_shard(tmp_path / "synth_001.parquet")
    odd = tmp_path / "synth_002.parquet"
    if kind == "directory":
        odd.mkdir()
    else:
        odd.symlink_to(tmp_path / "gone.parquet")
    why = "not a regular file" if kind == "directory" else "a dangling symlink"
    with pytest.raises(
        InputFileError,
        match=f"{odd}: not a readable Parquet file \\({why}\\)",
    ):
        scan_raw_dir(tmp_path)


def test_files_the_rule_skips_are_reported(tmp_path):
    raw = tmp_path / "raw"
    small_shard(raw / "synth_001.parquet")
    small_shard(raw / "SYNTH_01.PARQUET")
    small_shard(raw / "more" / "synth_003.parquet")
    (raw / "README.txt").write_text("not data")
    (raw / "synth_07.parquet.gz").write_bytes(b"\x1f\x8b")  # a shard in another format: lost without a word
    (raw / "synth_08.csv").write_text("synth_id,query\n")
    (raw / "input_manifest.json").write_text("{}")  # the input manifest and a download's cache are not data
    (raw / ".cache").mkdir()
    (raw / ".cache" / "synth_09.parquet").write_bytes(b"")
    assert [s.name for s in scan_raw_dir(raw)] == ["synth_001"]
    assert ignored_raw_files(raw) == [
        str(raw / "SYNTH_01.PARQUET"),
        str(raw / "more" / "synth_003.parquet"),
        str(raw / "synth_07.parquet.gz"),
        str(raw / "synth_08.csv"),
    ]
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        result = run(instance, layout, ["synth_raw_inventory"])
        [materialization] = [
            e
            for e in result.get_asset_materialization_events()
            if e.asset_key.to_user_string() == "synth_raw_inventory"
        ]
        assert materialization.materialization.metadata["ignored_files"].value == ignored_raw_files(raw)
        warnings = [r.user_message for r in instance.all_logs(result.run_id) if r.level >= 30]  # logging.WARNING
        assert any("SYNTH_01.PARQUET" in message and "ignored" in message for message in warnings), warnings


# --- rows -----------------------------------------------------------------------------------


def test_nul_in_synth_id_drops_the_row_and_never_reaches_an_id(tmp_path):
    raw = write_raw(tmp_path / "synth_001.parquet", [row("a\x00b"), row("ab"), row("c")])
    report = harmonize_shard(raw, tmp_path / "out.parquet", system_message_dict(), "synth_001")
    assert report.dropped == {drops.DROP_NUL_IN_SYNTH_ID: 1} and report.rows_out == 2
    assert pq.read_table(tmp_path / "out.parquet").column("synth_id").to_pylist() == ["ab", "c"]
    [logged] = report.errors
    assert logged["reason"] == drops.DROP_NUL_IN_SYNTH_ID and "\x00" not in json.dumps(logged, ensure_ascii=False)


def test_dataset_rows_problems_unit():
    manifest = {
        "shards": [{"partition": "a"}, {"partition": "b"}],
        "totals": {"rows_in": 10, "rows_out": 7, "dropped": {"x": 3}},
    }
    assert dataset_rows_problems(manifest) == []
    manifest["totals"]["rows_out"] = 0
    assert dataset_rows_problems(manifest) == ["10 rows in over 2 shards but 0 out + 3 dropped (+7 unaccounted)"]
    manifest["shards"][1]["partition"] = "a"
    assert dataset_rows_problems(manifest)[0] == "shard 'a' is listed 2 times: two shards wrote one shard's files"


# --- shards that vanish ---------------------------------------------------------------------


@pytest.fixture
def three_shards(tmp_path):
    """Three small shards built in process, synth_001, synth_002 and synth_004 (shards 01, 02 and 04): (instance,
    layout, raw, data)."""
    raw = tmp_path / "raw"
    for number in (1, 2, 4):
        small_shard(raw / f"synth_{number:03d}.parquet", source=number)
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        build_all(instance, layout)
        yield instance, layout, raw, tmp_path / "data"


def shard_04_files(data: Path) -> list[str]:
    return [f for f in every_file(data) if "shard_04" in f or "part-00004" in f or "synth_004" in f]


def shard_04_decisions(data: Path) -> list[str]:
    """What stays of a removed shard until the next clustering: the plan's near-duplicate decisions for it."""
    return [str(data / "synth_clusters" / "synth_004.parquet")]


class WarningsHeard(BuildProgress):
    def __init__(self) -> None:
        self.heard: list[tuple[str, str]] = []

    def warned(self, build_pass, warnings) -> None:
        self.heard += [(build_pass.name, warning) for warning in warnings]


def test_outputs_of_a_removed_shard_are_removed_and_the_checks_pass(three_shards):
    instance, layout, raw, data = three_shards
    assert shard_04_files(data)
    (raw / "synth_004.parquet").unlink()
    progress = WarningsHeard()
    build_all(instance, layout, progress=progress)  # raises unless every step and check passed
    # what build.sh prints: the removal is said, not only done
    [(pass_name, warning)] = progress.heard
    assert pass_name == "inventory" and re.match(
        r"removed \d+ output files of shards no longer in the raw directory: \[", warning
    ), warning
    assert instance.get_dynamic_partitions(SYNTH_SHARDS.name) == ["synth_001", "synth_002"]
    assert shard_04_files(data) == []  # every stage, both datasets, records, error logs
    paths = layout.data_layout()
    prefixes = tokens_prefixes(paths.megatron_root() / "train")
    assert [Path(p).name for p in prefixes] == ["shard_01_tokens", "shard_02_tokens"]
    manifest = json.loads(paths.megatron_manifest().read_text())
    assert [s["partition"] for s in manifest["shards"]] == ["synth_001", "synth_002"]
    distill = paths.distill_root()
    assert sorted(p.name for p in (distill / "train").iterdir()) == ["part-00001.parquet", "part-00002.parquet"]


def test_a_lost_instance_does_not_hide_outputs_of_removed_shards(three_shards, tmp_path):
    """The partition was never registered in this (fresh) instance: the files on disk still go."""
    _, layout, raw, data = three_shards
    (raw / "synth_004.parquet").unlink()
    with dg.DagsterInstance.ephemeral() as fresh:
        run(fresh, layout, ["synth_raw_inventory"])
        assert "unpublished: synth_raw_inventory removed the pool files" in pool_published(fresh).description
    assert shard_04_files(data) == shard_04_decisions(data)
    assert orphaned_outputs(layout.data_layout(), ["synth_001", "synth_002"]) == []


def test_a_renamed_shard_keeps_its_number_files_until_rebuilt(three_shards):
    """synth_004 renamed synth_4: the key-named files of synth_004 go, shard_04 files stay for synth_4."""
    instance, layout, raw, data = three_shards
    (raw / "synth_004.parquet").rename(raw / "synth_4.parquet")
    orphans = [p.name for p in orphaned_outputs(layout.data_layout(), ["synth_001", "synth_002", "synth_4"])]
    assert "synth_004.parquet" in orphans and not any("shard_04" in name or "part-00004" in name for name in orphans)
    build_all(instance, layout)
    assert not [f for f in every_file(data) if "synth_004" in f]


def test_the_sensor_removes_outputs_of_deleted_partitions(three_shards):
    instance, layout, raw, data = three_shards
    cursor = tick_synth_raw_sensor(instance, layout, None).cursor
    (raw / "synth_004.parquet").unlink()
    lock = layout.data_layout().build_lock()
    with build_lock(lock):  # a build in progress: the sensor waits, touching nothing
        context = dg.build_sensor_context(instance=instance, cursor=cursor, resources=synthkd_resources(layout))
        skipped = synth_raw_sensor(context)
    assert isinstance(skipped, dg.SkipReason) and str(lock) in skipped.skip_message and shard_04_files(data)
    assert pool_published(instance).passed
    before = every_file(data)
    result = tick_synth_raw_sensor(instance, layout, cursor)
    assert instance.get_dynamic_partitions(SYNTH_SHARDS.name) == ["synth_001", "synth_002"]
    assert every_file(data) == before, "a sensor tick changes no file on disk"
    # the removal is a run of its own, visible in the UI: synth_inventory_job (synth_raw_inventory's metadata
    # lists the files), asked for once per set of orphaned files
    [request] = result.run_requests
    assert request.job_name == "synth_inventory_job" and request.run_key.startswith("removed:")
    again = tick_synth_raw_sensor(instance, layout, result.cursor)
    assert [r.run_key for r in again.run_requests] == [request.run_key]  # the same key: launched once
    inventory = materialize_steps(instance, layout, INVENTORY_STEPS, tags={"dagster/run_key": request.run_key})
    removed = inventory.asset_materializations_for_node("synth_raw_inventory")[0].metadata["removed_files"].value
    assert "megatron/synth_kd_v1/shards/shard_04_documents.parquet" in removed
    assert shard_04_files(data) == shard_04_decisions(data)
    # the pool lost its manifest with shard 04's part: the UI shows it unpublished, not its last green run
    unpublished = pool_published(instance)
    assert not unpublished.passed and "removed the pool files of shards no longer" in unpublished.description
    # once they are gone (nothing else rebuilds) the sensor asks for the manifests to list what is left; they pass
    after = tick_synth_raw_sensor(instance, layout, again.cursor)
    assert [r.job_name for r in after.run_requests] == ["synth_manifests_job"]
    assert tick_synth_raw_sensor(instance, layout, after.cursor).run_requests == []
    outcome = check_outcomes(run(instance, layout, MANIFEST_STEPS))
    assert outcome and all(outcome.values()), outcome


def tidy_after_tick(instance, layout: SynthKDLayout, cursor: str | None) -> str:
    """A sensor tick, then the synth_inventory_job run it asks for when a shard is gone (as the daemon launches
    it: the sensor deletes no file); the tick's cursor."""
    result = tick_synth_raw_sensor(instance, layout, cursor)
    for request in result.run_requests:
        if request.job_name == "synth_inventory_job":
            materialize_steps(instance, layout, INVENTORY_STEPS, tags={"dagster/run_key": request.run_key})
    return result.cursor


def test_a_shard_removed_and_put_back_is_sampled_under_its_cluster_decisions(three_shards, tmp_path):
    """The near-duplicate decisions are the plan's, not the shard's: a shard removed (the inventory run the sensor
    asks for removes its outputs) and put back with the same bytes is rebuilt under the clusters in force with the
    same cap and held-out drops, so none of its validation rows is trained on (a new user's trial found them in
    the dataset: the decisions used to go with the shard). The next clustering drops the decisions of a shard
    that is gone."""
    instance, layout, raw, data = three_shards
    paths = layout.data_layout()
    sampled_report = paths.stage_report("synth_sampled", "synth_004")
    before = json.loads(sampled_report.read_text())["dropped"]
    assert before.get(drops.DROP_HELDOUT), before
    cursor = tick_synth_raw_sensor(instance, layout, None).cursor
    shutil.move(raw / "synth_004.parquet", tmp_path / "synth_004.parquet")
    cursor = tidy_after_tick(instance, layout, cursor)
    assert not sampled_report.exists() and shard_04_files(data) == shard_04_decisions(data)
    shutil.move(tmp_path / "synth_004.parquet", raw / "synth_004.parquet")
    result = tick_synth_raw_sensor(instance, layout, cursor)
    assert result.run_requests and instance.get_dynamic_partitions(SYNTH_SHARDS.name)[-1] == "synth_004"
    run(instance, layout, [*SCAN_STEPS, *SHARD_STEPS], "synth_004")  # what the sensor's runs build
    outcome = check_outcomes(run(instance, layout, MANIFEST_STEPS))  # raises unless every blocking check passed
    assert outcome["validation_sets_not_trained"] is True
    assert json.loads(sampled_report.read_text())["dropped"] == before
    (raw / "synth_004.parquet").unlink()
    tidy_after_tick(instance, layout, result.cursor)
    run(instance, layout, ["synth_clusters"])
    assert shard_04_files(data) == []


def test_rows_are_accounted_over_the_whole_dataset(three_shards):
    """The end state of an overwritten shard (an empty twin's record under shard 01's name, its files gone):
    the dataset-level rows checks fail on it (and the sealed manifest's provenance, which lists every file
    under the root, may too); the row-level checks cannot see it."""
    instance, layout, raw, data = three_shards
    empty_raw = raw / "synth_006.parquet"
    write_raw(empty_raw, [])
    build_all(instance, layout)
    paths = layout.data_layout()
    kd = paths.megatron_root()
    shutil.copy(paths.shard_record(6), paths.shard_record(1))
    for path in [*(kd / "train").glob("shard_01_*"), *(kd / "valid").glob("shard_01_*"), paths.documents_table(1)]:
        path.unlink()
    shutil.copy(paths.distill_record("synth_006"), paths.distill_record("synth_001"))
    for path in paths.distill_root().glob("*/part-00001.parquet"):
        path.unlink()
    outcomes = check_outcomes(run(instance, layout, MANIFEST_STEPS, raise_on_error=False))
    failing = sorted(name for name, passed in outcomes.items() if not passed)
    assert {"dataset_rows_accounted", "distill_dataset_rows_accounted"} <= set(failing), failing
    assert set(failing) <= {"dataset_rows_accounted", "distill_dataset_rows_accounted", "manifest_provenance"}, failing


def test_a_failing_check_says_why(three_shards):
    """synth_005 repeats synth_001's rows: the build fails, and both the in-process error and the report the
    launched build prints for a failed run (`launch.failed_run_lines`) list the duplicated ids and the files they
    are in."""

    instance, layout, raw, data = three_shards
    since = datetime.now(UTC)
    shutil.copy(raw / "synth_001.parquet", raw / "synth_005.parquet")
    with pytest.raises(BuildFailed) as failed:
        build_all(instance, layout)
    (failed_run,) = instance.get_runs(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], created_after=since)
    )
    report = failed_run_lines(instance, failed_run)
    for text in (str(failed.value), "\n".join(report)):
        assert "check synth_kd_v1_manifest:no_duplicate_synth_ids failed: " in text, text
        assert "occurs 2 times: shard_01_documents.parquet, shard_05_documents.parquet" in text
        assert "more in the check's `problems` metadata" in text


# --- one build per data root ----------------------------------------------------------------

HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from synthkd_assets.core.buildlock import build_lock
    with build_lock(Path(sys.argv[1])):  # the lock file
        print("locked", flush=True)
        sys.stdin.read()  # hold until the test closes stdin
    """
)


def hold_lock(lock: Path) -> subprocess.Popen:
    """Another process holding the build lock until its stdin closes (it prints "locked" once it holds it)."""
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
    return subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], cwd=REPO_ROOT, **pipes)


def test_a_second_build_on_one_data_root_stops_at_once(tmp_path):
    raw = tmp_path / "raw"
    small_shard(raw / "synth_001.parquet")
    data = tmp_path / "data"
    holder = hold_lock(lock_of(data))
    try:
        assert holder.stdout.readline().strip() == "locked"
        layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(data))
        with dg.DagsterInstance.ephemeral() as instance:
            with pytest.raises(BuildLockHeld, match=f"another build holds {lock_of(data)}"):
                build_all(instance, layout)
        assert not layout.data_layout().stage_dir("synth_harmony").exists()  # it wrote nothing
        with build_lock(lock_of(tmp_path / "other")):  # another data root is not blocked
            pass
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    with build_lock(lock_of(data)):  # released when its holder exits
        pass


def test_the_lock_is_released_when_its_holder_is_killed(tmp_path):
    data = tmp_path / "data"
    holder = hold_lock(lock_of(data))
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(BuildLockHeld):
        with build_lock(lock_of(data)):
            pass
    holder.kill()
    holder.wait(timeout=60)
    with build_lock(lock_of(data)):
        pass


def test_orphans_include_unique_partials_and_both_build_roots(tmp_path):
    """A removed shard's leftovers in the full and the smoke build roots, and partials under the unique names
    core/atomic.py gives them (`<name>.<random>.partial`), are all found; a present shard's are not."""
    layout = SynthKDLayout(raw_dir=str(tmp_path / "raw"), data_dir=str(tmp_path / "data"))
    data = tmp_path / "data"
    paths = layout.data_layout()
    gone = [
        data / "synth_harmony" / "synth_004.parquet",
        data / "smoke" / "synth_harmony" / "synth_004.report.json",
        data / "smoke" / "errors" / "synth_harmony" / "synth_004.jsonl",
        data / "smoke" / constants.DISTILL_SMOKE_DATASET_NAME / "synth_004.json",
        paths.valuation_part(4),
        paths.stage_rows("synth_tokenized", "synth_004"),
    ]
    kept = [
        data / "smoke" / "synth_harmony" / "synth_001.parquet",
        paths.both_builds()[1].valuation_part(1),
        paths.stage_rows("synth_tokenized", "synth_001"),  # a present shard's row sizes: not a shard "synth_001.rows"
    ]
    for path in gone + kept:
        write_as_build(path)
    megatron, distill = paths.megatron_root() / "train", paths.distill_root() / "train"
    gone += [
        partial_left_by_killed_writer(megatron / "shard_04_tokens.bin"),
        partial_left_by_killed_writer(distill / "part-00004.parquet"),
    ]
    partial_left_by_killed_writer(megatron / "shard_01_tokens.bin")
    assert orphaned_outputs(paths, ["synth_001"]) == sorted(gone)


def test_cleanup_removes_only_what_the_build_wrote(tmp_path):
    """A user's notes, backups and copies in the build's directories, named like no present shard (or like a
    removed one's output, or a partial file, but written by the user), survive a rebuild and its cleanup; the
    removed shard's outputs the build wrote go."""
    paths = DataLayout(tmp_path / "raw", tmp_path / "data")
    data = paths.data_root
    gone = [write_as_build(paths.stage_output("synth_harmony", "synth_004")), write_as_build(paths.pool_part(4))]
    users = [
        data / "errors" / "my_notes" / "todo.jsonl",
        data / "synth_harmony" / "backup_of_old_run.parquet",
        data / "synth_tokenized" / "README.report.json",
        paths.valuation_part(7),
        paths.stage_output("synth_sampled", "synth_004"),  # a removed shard's name, the user's bytes
    ]
    for path in users:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"mine")
    named_like_a_partial = paths.stage_output("synth_harmony", "synth_001").with_name("synth_001.parquet.v2.partial")
    users.append(named_like_a_partial)
    named_like_a_partial.write_bytes(b"mine")
    write_as_build(paths.stage_output("synth_harmony", "synth_001"))  # its writer clears its dead partials first
    replaced = write_as_build(paths.stage_report("synth_filtered", "synth_004"))
    replaced.write_text("edited by hand")  # the build's file, rewritten by the user since: no longer the build's
    assert remove_orphaned_outputs(paths, ["synth_001"]) == sorted(gone)
    assert all(path.read_bytes() == b"mine" for path in users) and replaced.read_text() == "edited by hand"
    assert not any(path.exists() for path in gone)


def test_a_data_root_copied_with_its_times_is_still_the_builds(tmp_path):
    """A whole data root moved to another disk (`cp -a`, `rsync -a`: times kept): its outputs are still the
    build's to remove there."""
    paths = DataLayout(tmp_path / "raw", tmp_path / "data")
    write_as_build(paths.stage_output("synth_harmony", "synth_004"))
    shutil.copytree(paths.data_root, tmp_path / "moved")  # copy2: modification times kept
    moved = DataLayout(tmp_path / "raw", tmp_path / "moved")
    assert remove_orphaned_outputs(moved, ["synth_001"]) == [moved.stage_output("synth_harmony", "synth_004")]


def test_a_name_the_build_must_clear_but_did_not_write_is_refused_not_left(tmp_path):
    """Taking a pool's publication back (its manifests, seals, blends) from a data root whose files the ledger does
    not know (a user's file there, a root built before the ledger): refused naming the file, never left published
    in silence; the build's own publication goes, the valuation features' sealed manifest with it."""
    paths = DataLayout(tmp_path / "raw", tmp_path / "data")
    published = [paths.pool_manifest(), paths.valuation_manifest(), paths.curriculum_dir() / "P1.args"]
    for path in published:
        write_as_build(path)
    foreign = paths.curriculum_dir() / "P3.json"
    foreign.write_text("{}")
    with pytest.raises(OutputPathError, match=f"{foreign}: the build must replace or remove it, but did not write"):
        unpublish_pool(paths)
    assert all(path.is_file() for path in [*published, foreign])
    foreign.unlink()
    assert unpublish_pool(paths) == sorted(published)


def test_the_ledger_is_compacted_to_what_is_on_disk(tmp_path):
    """Compaction (each build's inventory) keeps the lines of files still there as written, and partials; drops
    the rest; a file written after it is still the build's."""
    paths = DataLayout(tmp_path / "raw", tmp_path / "data")
    kept = write_as_build(paths.stage_output("synth_harmony", "synth_001"))
    for _ in range(3):  # rewritten: earlier lines can never match again
        write_as_build(paths.stage_output("synth_harmony", "synth_002"), b"y" * (_ + 1))
    gone = write_as_build(paths.stage_output("synth_harmony", "synth_003"))
    gone.unlink()
    partial = partial_left_by_killed_writer(paths.stage_output("synth_harmony", "synth_004"))
    ledger = ledger_path(paths.data_root)
    assert len(ledger.read_text().splitlines()) == 2 * 5 + 1  # every publication: its partial, its final
    assert compact_ledger(paths.data_root) == 8
    assert len(ledger.read_text().splitlines()) == 3
    later = write_as_build(paths.stage_output("synth_harmony", "synth_005"))
    assert written_by_build([kept, paths.stage_output("synth_harmony", "synth_002"), partial, later]) == [
        kept,
        paths.stage_output("synth_harmony", "synth_002"),
        partial,
        later,
    ]


def test_a_symlinked_lock_is_no_build_and_a_swapped_lock_is_refused(tmp_path):
    other = tmp_path / "other" / ".build.lock"
    other.parent.mkdir()
    lock = tmp_path / "data" / ".build.lock"
    lock.parent.mkdir()
    lock.symlink_to(other)
    with build_lock(other):  # another root's build: a link to its lock does not make this root busy
        assert not build_in_progress(lock)
    real = tmp_path / "real.lock"
    real.write_text("")
    fd = os.open(real, os.O_RDWR)
    try:
        with pytest.raises(OutputPathError, match="is not the regular file the build opened as its lock"):
            lock_fd(fd, lock)
    finally:
        os.close(fd)


@pytest.mark.parametrize("linked", ["synth_signatures", "errors/synth_pool", "pool/synth_pool_v1_valuation"])
def test_a_planted_directory_link_is_never_written_or_deleted_through(tmp_path, linked):
    """A directory symlink planted inside the data root (to a directory outside it holding files named like the
    build's outputs): cleanup removes nothing through it, and a write through it is refused naming the link."""
    paths = DataLayout(tmp_path / "raw", tmp_path / "data")
    outside = tmp_path / "elsewhere"
    victims = [outside / "synth_004.parquet", outside / "synth_004.jsonl", outside / "part-00004.parquet"]
    for path in victims:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"precious")
    write_as_build(paths.stage_output("synth_harmony", "synth_004"))
    link = paths.data_root / linked
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    remove_orphaned_outputs(paths, ["synth_001"])
    assert all(path.read_bytes() == b"precious" for path in victims)
    with pytest.raises(OutputPathError, match=f"not written: {link} is a symbolic link"):
        write_as_build(link / "synth_001.parquet")
    assert sorted(outside.iterdir()) == sorted(victims)


def test_removing_shards_leaves_no_empty_source_or_error_log_directory(tmp_path):
    """Unsetting SYNTHKD_SOURCES_DIR (or removing a raw shard) removes its shards' files and then their
    `<stage>/<source>/` directories and any `errors/<step>/` left empty, as a build without them would have no
    such directory; a directory that still holds a present shard's file stays, and so does every stage
    directory."""
    paths = DataLayout(tmp_path / "raw", tmp_path / "data")
    gone = [
        paths.stage_output("synth_tokenized", "oasst1/train-00000-of-00001"),
        paths.error_log("synth_harmony", "oasst1/train-00000-of-00001"),
        paths.stage_output("synth_tokenized", "ultrachat_200k/train_sft-0"),
        paths.stage_output("synth_sampled", "deepcoder/derived/train-00000-of-00001"),  # a config directory
        paths.error_log("synth_filtered", "synth_004"),
        paths.error_log("synth_sampled", "synth_004"),
    ]
    kept = [
        paths.stage_output("synth_tokenized", "ultrachat_200k/train_sft-1"),
        paths.error_log("synth_sampled", "synth_002"),
    ]
    for path in [*gone, *kept]:
        write_as_build(path)
    assert remove_orphaned_outputs(paths, ["ultrachat_200k/train_sft-1", "synth_002"]) == sorted(gone)
    assert not (paths.data_root / "synth_tokenized" / "oasst1").exists()
    assert not (paths.data_root / "errors" / "synth_harmony").exists()
    assert not (paths.data_root / "errors" / "synth_filtered").exists()
    assert not (paths.data_root / "synth_sampled" / "deepcoder").exists()
    assert all(path.is_file() for path in kept) and (paths.data_root / "synth_tokenized").is_dir()


def test_a_pool_that_loses_a_shard_loses_its_manifest_and_blends_until_rebuilt(tmp_path):
    """No automation rebuilds the pool: when a removed shard's pool files go, so do the pool's sealed manifest and
    curriculum stage files (they list and blend those files); its plan stays, and a pool that loses nothing keeps
    everything."""
    paths = DataLayout(tmp_path / "raw", tmp_path / "data")
    part = paths.pool_part(4)
    manifest = paths.pool_manifest()
    blends = [paths.curriculum_dir() / name for name in ("P1.args", "P1.json")]
    plan = paths.curriculum_plan()
    kept_part = paths.pool_part(1)
    for path in [part, kept_part, manifest, sidecar_path(manifest), *blends, plan]:
        write_as_build(path)
    assert remove_orphaned_outputs(paths, ["synth_001", "synth_004"]) == []
    removed = remove_orphaned_outputs(paths, ["synth_001"])
    assert removed == sorted([part, manifest, sidecar_path(manifest), *blends])
    assert plan.is_file() and kept_part.is_file()
