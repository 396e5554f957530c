"""A build's runs are runs of the code location's jobs, as the UI re-executes them: the job a set of steps runs
as, the subset a run records, its origin and the resources' config it stores (the UI's Re-execute itself, from
a webserver: tests/test_cli_and_webserver.py)."""

from __future__ import annotations

import re

import dagster as dg
import pytest
from dagster._core.remote_origin import RemoteJobOrigin
from dagster._core.storage.tags import MAX_RETRIES_TAG, REPOSITORY_LABEL_TAG, WILL_RETRY_TAG
from dagster._core.utils import make_new_run_id
from dagster._daemon.auto_run_reexecution.auto_run_reexecution import should_retry

from synthkd_assets.definitions import defs
from synthkd_assets.defs.build import materialize_steps
from synthkd_assets.defs.jobs import (
    JOBS,
    PASS_JOBS,
    adopt_launched_run,
    code_location_repository,
    job_for_steps,
    launch_sequence,
    launched_run_id,
)
from synthkd_assets.defs.passes import BUILD_STEPS, SCAN_STEPS, build_passes
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR


def test_every_pass_runs_as_its_own_job_and_the_code_location_has_every_job():
    passes = build_passes()
    assert [p.name for p in passes] == list(PASS_JOBS)
    assert all(job_for_steps(p.steps) is PASS_JOBS[p.name] for p in passes)
    assert {job.name for job in JOBS} <= {job.name for job in defs().resolve_all_job_defs()}
    assert {name: job.run_tags for name, job in PASS_JOBS.items()} == {
        name: {"synthkd/pass": name} for name in PASS_JOBS
    }


@pytest.mark.parametrize(
    ("steps", "job"),
    [
        (["synth_sampled", "synth_tokenized", "synth_distill"], "synth_build_job"),  # a build without synth_kd_v1
        ([*SCAN_STEPS, *BUILD_STEPS], "synth_shard_job"),
        (["synth_valuation_features"], "synth_pool_job"),
        (["synth_harmony", "synth_quota_plan"], None),  # no job has both: Dagster's own asset job
    ],
)
def test_steps_run_as_the_smallest_job_that_has_them_all(steps, job):
    found = job_for_steps(steps)
    assert (found.name if found else None) == job


def test_a_run_records_its_subset_origin_and_resources_config(tmp_path):
    """A run of part of a job selects those assets (so Re-execute runs them, not the whole job), carries the code
    location's origin and repository label, and stores every resource field, the roots resolved; a caller's
    resource config overrides field by field."""
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path / "data"))
    own = {"resources": {"build": {"config": {"smoke_max_rows": 7}}}}
    with dg.DagsterInstance.ephemeral() as instance:
        result = materialize_steps(
            instance, layout, ["synth_raw_inventory"], build=SynthKDBuildConfig(smoke=True), run_config=own
        )
        run = instance.get_run_by_id(result.run_id)
        whole = instance.get_run_by_id(
            materialize_steps(instance, layout, ["o200k_tokenizer", "synth_raw_inventory"]).run_id
        )
    assert run.job_name == whole.job_name == "synth_inventory_job"
    assert run.asset_selection == {dg.AssetKey("synth_raw_inventory")} and not whole.asset_selection
    assert run.remote_job_origin.location_name == "synthkd"  # workspace.yaml's, as `dg dev` names it
    assert run.remote_job_origin.repository_origin == code_location_repository()
    assert run.tags[REPOSITORY_LABEL_TAG] == code_location_repository().get_label()
    assert run.tags["synthkd/pass"] == "inventory"
    resources = run.run_config["resources"]
    assert resources["build"]["config"]["smoke"] is True and resources["build"]["config"]["smoke_max_rows"] == 7
    assert resources["layout"]["config"]["raw_dir"] == str(SAMPLE_RAW_DIR)
    assert resources["layout"]["config"]["data_dir"] == str(tmp_path / "data")
    assert resources["layout"]["config"]["sources_dir"] == ""  # SYNTH alone, whatever the re-executor's environment
    assert set(resources["valuation"]["config"]) >= {"teacher_checkpoint", "student_checkpoint"}


def test_build_sh_cluster_route_and_the_upstream_hint_launch_each_pass_job_in_the_build_order():
    """build.sh's `dg launch` route (SYNTHKD_EXECUTOR=celery|k8s) names each pass, its job and its steps: they
    are the build's passes, in order, one run per shard where the pass is per shard; the hint a step gives
    when its upstream is missing is the same order."""
    script = (REPO_ROOT / "scripts" / "build.sh").read_text()
    launched = re.findall(r"^\s*(step|each_shard) (\w+) (\w+) ([\w,]+)$", script, re.MULTILINE)
    assert launched == [
        ("each_shard" if p.per_shard else "step", p.name, PASS_JOBS[p.name].name, ",".join(p.steps))
        for p in build_passes()
    ]
    hint = [line.split("   #")[0] for line in launch_sequence("synth_004")]
    assert hint == [
        f"dg launch --job {PASS_JOBS[p.name].name}" + (" --partition synth_004" if p.per_shard else "")
        for p in build_passes()
    ]


def test_an_adopted_launch_run_gets_the_origin_and_is_never_retried_by_the_daemon():
    """A failed `dg launch --job` run of build.sh's cluster route, which Dagster's run-retry setting marked to be
    retried: once adopted (its origin recorded, so the daemon could relaunch it) Dagster's own retry rule says
    no, as for every build run. A run of a job the code location lacks, one in progress and one launched from a
    code location (whose retries are not the build's) are left alone, each saying why."""
    with dg.DagsterInstance.ephemeral() as instance:

        def add(job_name: str, status: dg.DagsterRunStatus, **fields) -> str:
            tags = {WILL_RETRY_TAG: "true", "dagster/partition": "synth_003"}
            run = dg.DagsterRun(job_name=job_name, run_id=make_new_run_id(), status=status, tags=tags, **fields)
            return instance.add_run(run).run_id

        failed = add("synth_build_job", dg.DagsterRunStatus.FAILURE)
        assert should_retry(instance.get_run_by_id(failed), instance)  # what the daemon would do unadopted
        assert adopt_launched_run(instance, failed) is None
        adopted = instance.get_run_by_id(failed)
        assert adopted.remote_job_origin.repository_origin == code_location_repository()
        assert adopted.tags[REPOSITORY_LABEL_TAG] == code_location_repository().get_label()
        assert adopted.tags[WILL_RETRY_TAG] == "false" and adopted.tags[MAX_RETRIES_TAG] == "0"
        assert adopted.tags["dagster/partition"] == "synth_003" and adopted.status == dg.DagsterRunStatus.FAILURE
        assert not should_retry(adopted, instance)

        smoke_config = {"resources": {"build": {"config": {"smoke": True}}}}
        smoke = add("synth_build_job", dg.DagsterRunStatus.SUCCESS, run_config=smoke_config)  # `build.sh --smoke`
        assert adopt_launched_run(instance, smoke) is None
        assert instance.get_run_by_id(smoke).tags["synthkd/smoke"] == "true" and "synthkd/smoke" not in adopted.tags

        origin = RemoteJobOrigin(code_location_repository(), "synth_build_job")
        left = {
            add("__ephemeral_asset_job__", dg.DagsterRunStatus.FAILURE): "not of a job of the code location",
            add("synth_build_job", dg.DagsterRunStatus.STARTED): "still STARTED",
            add("synth_build_job", dg.DagsterRunStatus.FAILURE, remote_job_origin=origin): "has an origin already",
            make_new_run_id(): "no such run",
        }
        for run_id, why in left.items():
            assert why in adopt_launched_run(instance, run_id)
            run = instance.get_run_by_id(run_id)
            assert run is None or run.tags[WILL_RETRY_TAG] == "true"


def test_the_run_id_of_a_launch_is_read_from_its_log_lines():
    line = "2026-11-28 08:44:01 +0000 - dagster - DEBUG - synth_scan_job - {} - 30162 - RUN_START - Started"
    run_id = "22f79211-f619-4d08-b424-e2bed39cee9d"
    output = "\n".join(["UserWarning: something", line.format(run_id), line.format(make_new_run_id())])
    assert launched_run_id(output) == run_id
    assert launched_run_id("Error: no such job") is None
