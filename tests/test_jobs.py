"""A build's runs are runs of the code location's jobs, as the UI re-executes them: the job a set of steps runs
as, the subset a run records and the resources' config it stores (the UI's Re-execute itself, from a webserver:
tests/test_cli_and_webserver.py)."""

from __future__ import annotations

import re

import dagster as dg
import pytest

from synthkd_assets.definitions import defs
from synthkd_assets.defs.build import materialize_steps
from synthkd_assets.defs.jobs import (
    JOBS,
    PASS_JOBS,
    job_for_steps,
    launch_sequence,
    repair_action,
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


def test_each_pass_runs_after_every_pass_that_builds_an_asset_it_reads():
    """`Pass.after`, against the asset graph: every upstream asset of a pass's steps is its own or built by a pass
    it runs after (directly or through them), and `after` names only earlier passes (the in-process build runs
    the list in order). The manifests and the quota plan need neither the other, so a launched build runs them at
    once; the pool's manifest waits for both."""
    passes = build_passes()
    graph = defs().resolve_asset_graph()
    builder = {step: p.name for p in passes for step in p.steps}
    after = {p.name: set(p.after) for p in passes}
    seen: list[str] = []
    for build_pass in passes:
        assert set(build_pass.after) <= set(seen), build_pass.name
        before = set(build_pass.after)
        while more := set().union(*(after[name] for name in before)) - before:
            before |= more
        after[build_pass.name] = before
        for step in build_pass.steps:
            for parent in graph.get(dg.AssetKey(step)).parent_keys:
                built_by = builder.get(parent.to_user_string())
                if built_by is None:  # an input (synth_raw): built by no pass
                    assert not graph.get(parent).is_materializable, parent
                    continue
                assert built_by == build_pass.name or built_by in before, (step, parent.to_user_string())
        seen.append(build_pass.name)
    assert "manifest" not in after["quota"] | after["pool"] and "quota" not in after["manifest"]
    assert {"pool", "manifest"} <= after["pool_manifest"]


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
    """A run of part of a job selects those assets (so Re-execute runs them, not the whole job) and stores every
    resource field, the roots resolved; a caller's resource config overrides field by field."""
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
    assert run.tags["synthkd/pass"] == "inventory"
    resources = run.run_config["resources"]
    assert resources["build"]["config"]["smoke"] is True and resources["build"]["config"]["smoke_max_rows"] == 7
    assert resources["layout"]["config"]["raw_dir"] == str(SAMPLE_RAW_DIR)
    assert resources["layout"]["config"]["data_dir"] == str(tmp_path / "data")
    assert resources["layout"]["config"]["sources_dir"] == ""  # SYNTH alone, whatever the re-executor's environment
    assert set(resources["valuation"]["config"]) >= {"teacher_checkpoint", "student_checkpoint"}


def test_a_missing_asset_is_repaired_by_launching_its_pass_job_from_the_ui():
    for build_pass in build_passes():
        job = PASS_JOBS[build_pass.name].name
        for step in build_pass.steps:
            action = repair_action(step, "synth_004")
            assert action.startswith(f"in the UI, Jobs > {job} > Materialize all")
            assert ("partition 'synth_004'" in action) == build_pass.per_shard
    with pytest.raises(ValueError, match="no pass of the build materializes 'synth_raw'"):
        repair_action("synth_raw", "synth_004")


def test_build_sh_has_one_route_and_the_upstream_hint_launches_each_pass_job_in_the_build_order():
    """build.sh names no pass and no job: the order is build_passes', which the launch follows (one route for this
    machine and a cluster); the hint a step gives when its upstream is missing is the same order."""
    script = (REPO_ROOT / "scripts" / "build.sh").read_text()
    assert not [job.name for job in JOBS if job.name in script]
    assert not re.search(r"SYNTHKD_EXECUTOR\b.*\bthen\b|\bcluster=", script)
    assert len(script.splitlines()) <= 80
    hint = [line.split("   #")[0] for line in launch_sequence("synth_004")]
    assert hint == [
        f"dg launch --job {PASS_JOBS[p.name].name}" + (" --partition synth_004" if p.per_shard else "")
        for p in build_passes()
    ]
