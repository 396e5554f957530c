"""What the daemon does on its own: a real `dagster-daemon run` on a sqlite DAGSTER_HOME, a changed raw shard,
no hand step. The sample is built once (in process, on the same instance directory) and copied for each test."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.scheduler.instigation import TickStatus

# the keys under which Dagster's retry daemon (its event log consumer) keeps its cursors: no public API
from dagster._daemon.auto_run_reexecution.event_log_consumer import DAGSTER_EVENT_TYPES as RETRY_EVENTS
from dagster._daemon.auto_run_reexecution.event_log_consumer import _create_cursor_key as retry_daemon_cursor

from synthkd_assets.core.buildlock import build_lock
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.manifest import read_json
from synthkd_assets.defs.build import build_all, materialize_steps
from synthkd_assets.defs.passes import MANIFEST_STEPS, SHARD_STEPS
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_assets.defs.retries import REANNOUNCED_MESSAGE, REANNOUNCED_TAG
from synthkd_contract.manifest_seal import sha256_file, verify_manifest
from tests.daemon import DAGSTER_DAEMON, REPO_ROOT, dagster_home, open_instance, running_daemon
from tests.helpers import SAMPLE_RAW_DIR
from tests.raw_files import current_shas, edit_shard, write_input_manifest
from tests.test_sensor import outputs_state

pytestmark = pytest.mark.daemon

MANIFEST_CHECKS = {
    "synth_harmony_manifest": {"raw_inputs_unchanged"},
    "synth_kd_v1_manifest": {
        "manifest_provenance",
        "dataset_rows_accounted",
        "no_split_leakage",
        "no_duplicate_synth_ids",
        "validation_sets_not_trained",
        "shards_readable_by_megatron",
        "output_table_schemas",
    },
    "synth_distill_manifest": {
        "distill_labels_match_input_ids",
        "distill_spans_consistent",
        "distill_max_length_respected",
        "distill_no_split_leakage",
        "distill_manifest_provenance",
        "distill_dataset_rows_accounted",
    },
}


@dataclass
class Workspace:
    root: Path

    @property
    def raw(self) -> Path:
        return self.root / "raw"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def paths(self) -> DataLayout:
        return DataLayout(self.raw, self.data)

    @property
    def home(self) -> Path:
        return self.root / "dagster_home"

    def env(self, **extra: str) -> dict[str, str]:
        """The daemon's environment: the data roots, and in_process steps (the sample's shards are small: one
        process per run instead of one per step saves their imports)."""
        return {
            "SYNTHKD_RAW_DIR": str(self.raw),
            "SYNTHKD_DATA_DIR": str(self.data),
            "SYNTHKD_EXECUTOR": "in_process",
            **extra,
        }


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("built_for_daemon")
    shutil.copytree(SAMPLE_RAW_DIR, root / "raw")
    with open_instance(dagster_home(root / "dagster_home")) as instance:
        build_all(instance, SynthKDLayout(raw_dir=str(root / "raw"), data_dir=str(root / "data")))
    return root


@pytest.fixture
def workspace(built, tmp_path) -> Workspace:
    """A copy of the built sample: raw files, outputs and the instance that built them (runs, partitions)."""
    for name in ("raw", "data", "dagster_home"):
        shutil.copytree(built / name, tmp_path / name)
    return Workspace(tmp_path)


def finished_run(instance: dg.DagsterInstance, **filters) -> dg.DagsterRun | None:
    """The newest finished run matching `filters`; it must have succeeded."""
    statuses = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
    runs = instance.get_runs(dg.RunsFilter(statuses=statuses, **filters), limit=1)
    if runs:
        assert runs[0].status == dg.DagsterRunStatus.SUCCESS, (
            f"run {runs[0].run_id} ({runs[0].job_name}, {runs[0].tags}) failed"
        )
        return runs[0]
    return None


def events(instance: dg.DagsterInstance, run_id: str, kind: dg.DagsterEventType) -> list:
    return [record.dagster_event for record in instance.all_logs(run_id, of_type=kind)]


def run_worker_pid(instance: dg.DagsterInstance, run_id: str) -> int | None:
    """The pid the run's RUN_START event carries: its run worker's (what the launcher's health check watches)."""
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_START, limit=1).records
    return records[0].event_log_entry.dagster_event.pid if records else None


SHARD_003_RUNS = dg.RunsFilter(job_name="synth_shard_job", tags={"dagster/partition": "synth_003"})


def a_shard_run_left_started(ws: Workspace, instance: dg.DagsterInstance) -> tuple[str, int]:
    """synth_003 changed, a daemon's sensor launches its run, and once that run has started the daemon's whole
    process group (daemon, code server, run worker) is SIGKILLed: the run stays STARTED. Its id and worker pid."""
    edit_shard(ws.raw / "synth_003.parquet")

    def started_worker() -> tuple[str, int] | None:
        for run in instance.get_runs(SHARD_003_RUNS):
            pid = run_worker_pid(instance, run.run_id) if run.status == dg.DagsterRunStatus.STARTED else None
            if pid:
                return run.run_id, pid
        return None

    with running_daemon(ws.home, ws.env(), ws.root / "daemon.log") as daemon:
        run_id, pid = daemon.wait_for("the sensor's synth_003 run to start", started_worker, 240, every_s=0.1)
        os.killpg(daemon.process.pid, signal.SIGKILL)
        daemon.process.wait(timeout=30)
    assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.STARTED  # what nothing could correct
    return run_id, pid


def test_a_run_left_started_by_a_killed_daemon_is_failed_then_retried(workspace):
    """The machine's way of dying: the daemon's whole process group (daemon, code server, the run worker of a
    changed shard's run) is SIGKILLed mid-run, so nothing is left to say the run ended and it stays STARTED. The
    restarted daemon's run monitoring (the launcher's run-worker health check) marks it failed, run retries launch
    it again from its failed step, the retry rebuilds the shard, and then the manifests are rewritten. Without
    both, the run stays STARTED for ever and the sensor never requests the shard again."""
    ws = workspace
    with open_instance(ws.home) as instance:
        run_id, pid = a_shard_run_left_started(ws, instance)
        with running_daemon(ws.home, ws.env(), ws.root / "daemon_restarted.log") as daemon:
            daemon.wait_for(
                "run monitoring to mark the killed run failed",
                lambda: instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE,
                timeout_s=120,
            )
            retry = daemon.wait_for(
                "the retry of the killed run to succeed",
                lambda: finished_run(instance, tags={"dagster/parent_run_id": run_id}),
                timeout_s=240,
            )
            # the manifests wait for the retry (not only for runs in progress: between the failure and the retry
            # none is), so they list what it rebuilt
            manifests = daemon.wait_for(
                "the manifests rewritten after the retry",
                lambda: finished_run(instance, tags={"dagster/sensor_name": "synth_manifests_automation"}),
                timeout_s=180,
            )
        retry_end = instance.get_run_record_by_id(retry.run_id).end_time
        assert instance.get_run_record_by_id(manifests.run_id).create_timestamp.timestamp() >= retry_end
        harmony = read_json(ws.paths.harmony_manifest())
        new_sha = sha256_file(ws.raw / "synth_003.parquet")
        assert {s["name"]: s["source"]["sha256"] for s in harmony["shards"]}["synth_003"] == new_sha
        said = [e.message for e in events(instance, run_id, dg.DagsterEventType.RUN_FAILURE)]
        assert f"run worker process {pid} on " in said[0] and "is gone" in said[0], said
        assert said[1:] in ([], [REANNOUNCED_MESSAGE]), said  # the watchdog's, when Dagster's retry daemon lost it
        assert (retry.tags["dagster/retry_number"], retry.tags["dagster/partition"]) == ("1", "synth_003")
        assert {run.run_id for run in instance.get_runs(SHARD_003_RUNS)} == {run_id, retry.run_id}
    assert read_json(ws.paths.stage_report("synth_harmony", "synth_003"))["source_sha256"] == new_sha


def test_a_retry_dagsters_retry_daemon_lost_is_launched_once_the_watchdog_reports_the_failure_again(workspace):
    """Dagster's retry daemon reads a run-failure event, then the run; a tick between Dagster's two writes (the
    event, then the run's status) passes the event for good, and the run, tagged `dagster/will_retry=true`, is never
    retried (seen in a daemon restarted as above). That state is made here: the killed run marked failed as run
    monitoring marks it, and the retry daemon's cursor past its failure event. The restarted daemon's
    synth_retry_watchdog reports the failure again, the retry daemon launches the retry, and it rebuilds the shard."""
    ws = workspace
    with open_instance(ws.home) as instance:
        run_id, _ = a_shard_run_left_started(ws, instance)
        instance.report_run_failed(instance.get_run_by_id(run_id), "run worker gone (the test's word)")
        assert instance.get_run_by_id(run_id).tags["dagster/will_retry"] == "true"
        last = instance.event_log_storage.get_maximum_record_id()
        instance.daemon_cursor_storage.set_cursor_values(
            {retry_daemon_cursor(kind): str(last) for kind in RETRY_EVENTS}
        )
        with running_daemon(ws.home, ws.env(), ws.root / "daemon_restarted.log") as daemon:
            retry = daemon.wait_for(
                "the retry of the run whose retry was lost to succeed",
                lambda: finished_run(instance, tags={"dagster/parent_run_id": run_id}),
                timeout_s=240,
            )
        said = [e.message for e in events(instance, run_id, dg.DagsterEventType.RUN_FAILURE)]
        assert said == ["run worker gone (the test's word)", REANNOUNCED_MESSAGE]
        assert instance.get_run_by_id(run_id).tags[REANNOUNCED_TAG] == run_id
        assert (retry.tags["dagster/retry_number"], retry.tags["dagster/partition"]) == ("1", "synth_003")
        assert {run.run_id for run in instance.get_runs(SHARD_003_RUNS)} == {run_id, retry.run_id}
    new_sha = sha256_file(ws.raw / "synth_003.parquet")
    assert read_json(ws.paths.stage_report("synth_harmony", "synth_003"))["source_sha256"] == new_sha


def finished_ticks(instance: dg.DagsterInstance, sensor: str, since: float) -> list:
    """The ticks of `sensor` that ended after `since` (a timestamp)."""
    for state in instance.all_instigator_state():
        if state.instigator_name == sensor:
            ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id)
            return [t for t in ticks if t.status != TickStatus.STARTED and t.timestamp > since]
    return []


def test_the_manifests_wait_while_a_build_holds_the_data_root(workspace):
    """A build's passes leave moments with no shard step in progress (its plan pass), and it writes the manifests
    itself at its end: while it holds the data root's lock, synth_manifests_automation requests nothing, even
    with a shard rebuilt beside it; once the lock is free, the due manifests are rewritten."""
    ws = workspace
    automation = dg.RunsFilter(tags={"dagster/sensor_name": "synth_manifests_automation"})
    with open_instance(ws.home) as instance, contextlib.ExitStack() as lock:
        lock.enter_context(build_lock(ws.paths.build_lock()))
        with running_daemon(ws.home, ws.env(), ws.root / "daemon.log") as daemon:
            daemon.wait_for(
                "a first evaluation of synth_manifests_automation",
                lambda: finished_ticks(instance, "synth_manifests_automation", 0),
                timeout_s=180,
            )
            # a shard rebuilt (in process, not a build): the manifests are now due
            materialize_steps(
                instance, SynthKDLayout(raw_dir=str(ws.raw), data_dir=str(ws.data)), SHARD_STEPS, "synth_003"
            )
            updated = time.time()
            daemon.wait_for(
                "two evaluations of synth_manifests_automation after the shard run",
                lambda: len(finished_ticks(instance, "synth_manifests_automation", updated)) >= 2,
                timeout_s=150,
            )
            assert instance.get_runs(automation) == []
            lock.close()  # the build is over
            run = daemon.wait_for(
                "the manifests run requested by synth_manifests_automation",
                lambda: finished_run(instance, tags={"dagster/sensor_name": "synth_manifests_automation"}),
                timeout_s=180,
            )
    assert run.tags.get("dagster/partition") is None  # the global manifests, not a shard
    assert run.job_name == "synth_manifests_job"  # the UI files it under the pass job, not "jobless"


def test_daemon_rebuilds_a_changed_shard_then_the_manifests(workspace):
    ws = workspace
    edit_shard(ws.raw / "synth_003.parquet")
    new_sha = sha256_file(ws.raw / "synth_003.parquet")
    with open_instance(ws.home) as instance:
        with running_daemon(ws.home, ws.env(), ws.root / "daemon.log") as daemon:
            # synth_raw_sensor (running by default) asks for exactly the changed shard ...
            shard_run = daemon.wait_for(
                "successful synth_shard_job run of synth_003",
                lambda: finished_run(instance, job_name="synth_shard_job", tags={"dagster/partition": "synth_003"}),
                timeout_s=240,
            )
            # ... and synth_manifests_automation (running by default) then rewrites the three manifests
            manifests_run = daemon.wait_for(
                "manifests run requested by synth_manifests_automation",
                lambda: finished_run(instance, tags={"dagster/sensor_name": "synth_manifests_automation"}),
                timeout_s=180,
            )
        assert shard_run.tags["dagster/sensor_name"] == "synth_raw_sensor"
        assert manifests_run.job_name == "synth_manifests_job"  # the UI files it under the pass job
        assert instance.get_runs(dg.RunsFilter(job_name="synth_shard_job")) == [shard_run]  # only synth_003 rebuilt
        # one run for the three, after the whole shard run (not one per manifest as its direct dependency finished)
        assert instance.get_runs(dg.RunsFilter(tags={"dagster/sensor_name": "synth_manifests_automation"})) == [
            manifests_run
        ]
        materialized = {
            e.asset_key.to_user_string()
            for e in events(instance, manifests_run.run_id, dg.DagsterEventType.ASSET_MATERIALIZATION)
        }
        assert materialized == set(MANIFEST_STEPS)
        shard_end = instance.get_run_record_by_id(shard_run.run_id).end_time
        assert instance.get_run_record_by_id(manifests_run.run_id).create_timestamp.timestamp() >= shard_end

        checks = {
            (
                e.event_specific_data.asset_key.to_user_string(),
                e.event_specific_data.check_name,
            ): e.event_specific_data.passed
            for e in events(instance, manifests_run.run_id, dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        }
        assert set(checks) == {(asset, check) for asset, names in MANIFEST_CHECKS.items() for check in names}
        assert all(checks.values()), checks
    harmony = read_json(ws.paths.harmony_manifest())
    assert {s["name"]: s["source"]["sha256"] for s in harmony["shards"]}["synth_003"] == new_sha
    # the automation's run ran every blocking check on the datasets it rewrote: they verify, no marker is left
    for root in (ws.paths.megatron_root(), ws.paths.distill_root()):
        verify_manifest(root)


def test_the_schedule_rebuilds_exactly_the_shard_its_input_manifest_changed(workspace):
    """With synth_raw_sensor stopped, the schedule (every minute here, through SYNTHKD_REBUILD_CRON) alone
    notices the changed input manifest and rebuilds that shard."""
    ws = workspace
    env = ws.env(SYNTHKD_REBUILD_CRON="* * * * *")
    stop = subprocess.run(
        [
            str(DAGSTER_DAEMON.parent / "dagster"),
            "sensor",
            "stop",
            "synth_raw_sensor",
            "-w",
            str(REPO_ROOT / "workspace.yaml"),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, **env, "DAGSTER_HOME": str(ws.home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stop.returncode == 0, stop.stdout + stop.stderr
    edit_shard(ws.raw / "synth_002.parquet")
    write_input_manifest(ws.raw, current_shas(ws.raw))  # the user's new input manifest
    new_sha = sha256_file(ws.raw / "synth_002.parquet")
    untouched = {k: outputs_state(ws.paths, f"synth_{k:03d}", k) for k in (1, 3, 4)}

    with open_instance(ws.home) as instance:
        with running_daemon(ws.home, env, ws.root / "daemon.log") as daemon:
            run = daemon.wait_for(
                "successful run requested by synth_nightly_rebuild",
                lambda: finished_run(instance, tags={"dagster/schedule_name": "synth_nightly_rebuild"}),
                timeout_s=240,
            )
        assert (run.job_name, run.tags["dagster/partition"]) == ("synth_shard_job", "synth_002")
        assert run.tags["dagster/run_key"].startswith(f"synth_002:{new_sha}:after-")
        assert instance.get_runs(dg.RunsFilter(job_name="synth_shard_job")) == [run]  # no other shard, no second ask
    assert read_json(ws.paths.stage_report("synth_harmony", "synth_002"))["source_sha256"] == new_sha
    assert {k: outputs_state(ws.paths, f"synth_{k:03d}", k) for k in (1, 3, 4)} == untouched


def test_daemon_removes_a_gone_shards_outputs_in_an_inventory_run_then_the_manifests(workspace):
    """A raw file deleted with the daemon running: the sensor changes nothing on disk itself; it asks for
    synth_inventory_job, which removes the shard's outputs (visible as a run, its files in the metadata), then for
    synth_manifests_job, after which the manifests list what is left and verify."""
    ws = workspace
    (ws.raw / "synth_005.parquet").unlink()
    with open_instance(ws.home) as instance:
        with running_daemon(ws.home, ws.env(), ws.root / "daemon.log") as daemon:
            inventory_run = daemon.wait_for(
                "inventory run requested by synth_raw_sensor",
                lambda: finished_run(
                    instance, job_name="synth_inventory_job", tags={"dagster/sensor_name": "synth_raw_sensor"}
                ),
                timeout_s=240,
            )
            manifests_run = daemon.wait_for(
                "manifests run requested by synth_raw_sensor",
                lambda: finished_run(
                    instance, job_name="synth_manifests_job", tags={"dagster/sensor_name": "synth_raw_sensor"}
                ),
                timeout_s=240,
            )
        [inventory] = [
            e.event_specific_data.materialization
            for e in events(instance, inventory_run.run_id, dg.DagsterEventType.ASSET_MATERIALIZATION)
            if e.asset_key == dg.AssetKey("synth_raw_inventory")
        ]
        assert "megatron/synth_kd_v1/shards/shard_05_documents.parquet" in inventory.metadata["removed_files"].value
        inventory_end = instance.get_run_record_by_id(inventory_run.run_id).end_time
        assert instance.get_run_record_by_id(manifests_run.run_id).create_timestamp.timestamp() >= inventory_end
    listed = [shard["partition"] for shard in read_json(ws.paths.megatron_manifest())["shards"]]
    assert "synth_005" not in listed and "synth_004" in listed
    for root in (ws.paths.megatron_root(), ws.paths.distill_root()):
        verify_manifest(root)
