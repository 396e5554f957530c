"""A smoke build alone, then the daemon (`dg dev` after `build.sh --smoke`): a real `dagster-daemon run` on a
sqlite DAGSTER_HOME, as tests/test_automation_daemon.py runs it (its own file, so that pytest-xdist runs it
beside that file's tests: most of its time is the daemon's tick intervals)."""

from __future__ import annotations

import shutil

import dagster as dg
import pytest

from synthkd_assets.defs.build import build_all
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from tests.daemon import dagster_home, open_instance, running_daemon
from tests.helpers import SAMPLE_RAW_DIR
from tests.test_automation_daemon import Workspace, events, finished_run, finished_ticks

pytestmark = pytest.mark.daemon


def test_after_a_smoke_build_alone_every_run_the_daemon_launches_succeeds(tmp_path):
    """`build.sh --smoke`, then `dg dev`: the code location follows the full layout, where no shard is built.
    The raw sensor scans every shard there (no plan: scan passes only); the manifests' automation then rewrites
    the one manifest those scans give all its records to (synth_harmony's) and holds back the two dataset
    manifests, whose shards only the smoke build materialized: a run of theirs would fail ("has not been
    materialized"). Nothing the daemon launches fails."""
    ws = Workspace(tmp_path)
    ws.raw.mkdir()
    shards = ["synth_001", "synth_002"]  # two of the sample's: two scan runs for the daemon to launch
    for shard in shards:
        shutil.copyfile(SAMPLE_RAW_DIR / f"{shard}.parquet", ws.raw / f"{shard}.parquet")
    automation = {"dagster/sensor_name": "synth_manifests_automation"}
    with open_instance(dagster_home(ws.home)) as instance:
        smoke = SynthKDBuildConfig(smoke=True)
        layout = SynthKDLayout(raw_dir=str(ws.raw), data_dir=str(ws.data))
        build_all(instance, layout, smoke, outputs=["synth_kd_v1", "synth_distill"])
        with running_daemon(ws.home, ws.env(), ws.root / "daemon.log") as daemon:
            scans = daemon.wait_for(
                "the raw sensor's scan run of every shard",
                lambda: (
                    len(runs := instance.get_runs(dg.RunsFilter(job_name="synth_scan_job"))) == len(shards)
                    and all(finished_run(instance, run_ids=[run.run_id]) for run in runs)
                    and runs
                ),
                timeout_s=300,
            )
            manifests_run = daemon.wait_for(
                "the manifests run requested by synth_manifests_automation",
                lambda: finished_run(instance, tags=automation),
                timeout_s=180,
            )
            ended = instance.get_run_record_by_id(manifests_run.run_id).end_time
            daemon.wait_for(
                "two evaluations of synth_manifests_automation after its run",
                lambda: len(finished_ticks(instance, "synth_manifests_automation", ended)) >= 2,
                timeout_s=150,
            )
        assert sorted(run.tags["dagster/partition"] for run in scans) == shards
        assert instance.get_runs(dg.RunsFilter(tags=automation)) == [manifests_run]
        assert manifests_run.job_name == "synth_manifests_job"
        materialized = {
            e.asset_key.to_user_string()
            for e in events(instance, manifests_run.run_id, dg.DagsterEventType.ASSET_MATERIALIZATION)
        }
        assert materialized == {"synth_harmony_manifest"}
        failed = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE]))
        assert failed == [], [(run.job_name, run.tags) for run in failed]
    assert ws.paths.harmony_manifest().is_file() and not ws.paths.megatron_manifest().exists()
