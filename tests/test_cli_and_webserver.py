"""The README's build line as a subprocess, then dagster-webserver on 127.0.0.1 asked over GraphQL."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
from dagster._core.storage.tags import PARTITION_NAME_TAG  # Dagster's own name for it

from synthkd_assets.cli import split_lengths_line
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.manifest_builders import length_stats
from synthkd_assets.definitions import defs
from synthkd_assets.defs.build import build_all
from synthkd_assets.defs.instances import ensure_instance_yaml, instance_home
from synthkd_assets.defs.jobs import PASS_JOBS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_assets.defs.tags import PARTITION_TAG
from synthkd_assets.launch import BUILD_TAG, GraphQLServer, LaunchFailed, launch_run
from synthkd_contract.buckets import EXERCISE_SKILL_BUCKET
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR
from tests.test_crash_safety import final_files
from tests.webserver import graphql, running_webserver

VENV_BIN = Path(sys.executable).parent
ASSETS = {
    "o200k_tokenizer",
    "synth_raw",
    "synth_raw_inventory",
    "synth_harmony",
    "synth_harmony_manifest",
    "synth_filtered",
    "synth_sampled",
    "synth_tokenized",
    "synth_kd_v1",
    "synth_kd_v1_manifest",
    "synth_sampling_plan",
    "synth_signatures",
    "synth_clusters",
    "synth_validation_sets",
    "synth_distill",
    "synth_distill_manifest",
    "synth_quota_plan",
    "synth_pool",
    "synth_curriculum",
    "synth_pool_manifest",
    "synth_valuation_features",
}


@pytest.fixture(scope="module")
def cli_build(tmp_path_factory):
    """`scripts/build.sh --smoke` on a copy of the sample, with its own DAGSTER_HOME and data root. The env it
    yields names, as DAGSTER_HOME, the smoke builds' instance the build recorded into (`ui.sh --smoke`'s)."""
    root = tmp_path_factory.mktemp("cli")
    raw = root / "raw"
    shutil.copytree(SAMPLE_RAW_DIR, raw)
    (raw / "synth_09.PARQUET").write_bytes(b"not a shard: the inventory skips it, and build.sh says so")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(root / "home"),
        "SYNTHKD_RAW_DIR": str(raw),
        "SYNTHKD_DATA_DIR": str(root / "data"),
    }
    done = subprocess.run(
        ["bash", "scripts/build.sh", "--smoke"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (root / "build.stderr").write_text(done.stderr)
    return {**env, "DAGSTER_HOME": str(instance_home(env["DAGSTER_HOME"], smoke=True))}, root, done.stdout


def test_build_script_materializes_through_the_cli(cli_build):
    env, root, stdout = cli_build
    assert "synth_kd_v1_smoke: 6 shards" in stdout and "rows in: 3149" in stdout
    smoke = DataLayout.from_environ(env, smoke=True)
    manifest = json.loads(smoke.megatron_manifest().read_text())
    # 64 per regular shard (the cap), the 37 of the bucket shard synth_005 and the 50 of the near-duplicate shard
    # synth_006 that the filters, the clusters (capped, held out) and the sampling plan keep
    assert manifest["totals"]["rows_out"] == 4 * 64 + 37 + 50
    assert "synth_distill_smoke: 6 shards" in stdout
    distill = json.loads(smoke.distill_manifest().read_text())
    assert distill["totals"]["rows_out"] == 4 * 64 + 37 + 50 and distill["config"]["caps"]["max_rows_per_shard"] == 64
    # the smoke build recorded into its own instance, in $DAGSTER_HOME/smoke/; the full builds' instance of
    # $DAGSTER_HOME, which `dg dev` shows, got no run and no materialization from it
    assert Path(env["DAGSTER_HOME"]) == root / "home" / "smoke" and (root / "home" / "smoke" / "dagster.yaml").is_file()
    with dg.DagsterInstance.from_config(str(root / "home")) as full:
        assert full.get_runs() == [] and full.get_latest_materialization_event(dg.AssetKey("synth_kd_v1")) is None


def test_build_prints_progress_and_keeps_dagster_logs_in_a_file(cli_build):
    """One line per pass and shard and the summaries on the terminal; Dagster's log lines in the build log;
    no warning the user cannot act on (dagster.yaml in the working directory, superseded CLI, megatron's TE)."""
    env, root, stdout = cli_build
    stderr = (root / "build.stderr").read_text()
    # 71 lines on the sample: a line per pass and shard, then the filters' drops per exercise (a line for each of
    # the nine), the sampling plan and each dataset's summary
    assert " - DEBUG - " not in stdout + stderr and len(stdout.splitlines()) < 75, stdout
    logs = list((root / "home" / "smoke" / "build_logs").glob("build-*.log"))
    assert len(logs) == 1 and stdout.splitlines()[0].endswith(f"full log: {logs[0]}")
    log = logs[0].read_text()
    assert log.count(" - DEBUG - ") > 100 and log.count(" - RUN_SUCCESS - ") == 23  # 15 runs, then the pool's 8
    lines = stdout.splitlines()
    assert any(line.startswith("inventory: o200k_tokenizer,synth_raw_inventory (") for line in lines)
    raw = root / "raw"
    ignored = (
        f"  warning: not input shards (only *.parquet directly in {raw} are), ignored: ['{raw / 'synth_09.PARQUET'}']"
    )
    assert lines[lines.index(ignored) + 1].startswith("inventory: ")  # said before the pass line, once
    assert "scan pass over 6 shards: synth_harmony,synth_filtered,synth_signatures" in lines
    assert "pool pass over 6 shards: synth_pool,synth_valuation_features" in lines
    assert any(line.startswith("synth_pool_v1_smoke: 6 shards, config ") for line in lines)
    assert any(line.startswith("curriculum P1 (seq 2048, 300,000,000 tokens): written (C1 ") for line in lines)
    # smoke: synth_harmony reads the first 256 of the 750 raw rows (the other 494 are counted as smoke_cap)
    assert (
        "  scan synth_001 (1/6): 750 rows in -> synth_harmony 256 (494 dropped), synth_filtered 256, "
        "synth_signatures 256 (" in stdout
    )
    # the quality filters drop 2 rows of synth_004's prefix (blank answers)
    assert (
        "  scan synth_004 (4/6): 750 rows in -> synth_harmony 256 (494 dropped), synth_filtered 254 (2 dropped), "
        "synth_signatures 254 (" in stdout
    )
    # of synth_001's 256, 3 rows belong to held-out clusters (the validation sets) and the sampling plan samples out
    # 149 memorization rows
    assert "  build synth_001 (1/6): 256 rows in -> synth_sampled 104 (152 dropped), synth_tokenized 104, " in stdout
    for i, key in enumerate(["synth_001", "synth_002", "synth_003", "synth_004"], 1):
        line = next(line for line in lines if line.startswith(f"  build {key} ({i}/6): "))
        assert "synth_kd_v1 64 (" in line and "synth_distill 64 (" in line, line  # the smoke cap
    # the bucket shard's 54 rows are all read (under the 256 cap) and the 37 it keeps all written
    assert (
        "  scan synth_005 (5/6): 54 rows in -> synth_harmony 54, synth_filtered 51 (3 dropped), synth_signatures 51 ("
        in stdout
    )
    assert (
        "  build synth_005 (5/6): 51 rows in -> synth_sampled 37 (14 dropped), synth_tokenized 37, synth_kd_v1 37, "
        "synth_distill 37 (" in stdout
    )
    # before the datasets: the quality filters' drops, a line per exercise, and what the sampling plan keeps
    assert "quality filters (synth_filtered): 1173 rows in, 6 dropped (0.5%); per exercise:" in lines
    assert sum(line.startswith(f"  {label}: ") for line in lines for label in EXERCISE_SKILL_BUCKET) == 9
    assert any(line.startswith("sampling plan (synth_sampling_plan): memorization keep rate ") for line in lines)
    assert any(line.startswith("manifest: synth_harmony_manifest,") for line in lines)
    # the smoke build's DistillKit validation split (1% by hash) holds 7 of its 343 rows; an empty one is said
    # plainly, never as None five times
    assert "rows in: 3149   rows written: 343 (train=336, validation=7)" in lines
    assert any(line.startswith("validation tokens: min=") for line in lines)
    assert split_lengths_line("validation", length_stats({})) == "validation tokens: no rows"
    assert not any("=None" in line for line in lines)
    assert any(line.startswith("train tokens: min=") for line in lines)
    for noise in ("dagster.yaml", "SupersessionWarning", "superseded", "Transformer Engine", "Warning"):
        assert noise not in stdout + stderr + log, noise


def test_build_failure_names_the_step_and_the_log(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "synth_001.parquet").write_bytes(b"not a parquet file")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path / "home"),
        "SYNTHKD_RAW_DIR": str(raw),
        "SYNTHKD_DATA_DIR": str(tmp_path / "data"),
    }
    done = subprocess.run(
        ["bash", "scripts/build.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 1
    # the inventory leaves a file it cannot read to that shard's own scan step, which refuses it alone
    assert "FAILED: scan synth_001 (after " in done.stderr
    # the failed run and its step's error, naming the file
    assert "(partition synth_001) failed:\n  step synth_harmony failed: " in done.stderr
    assert "synth_001.parquet: not a readable Parquet file" in done.stderr
    log = next((tmp_path / "home" / "build_logs").glob("build-*.log"))
    assert f"full log: {log}" in done.stderr and "scan pass done" not in done.stdout


def test_cli_build_equals_an_in_process_build_byte_for_byte(cli_build, tmp_path):
    """Parallel runs do not change a byte: build.sh (shard runs in worker processes on every core) and a build
    one run after another in one process (another data root) give identical outputs."""

    env, root, _ = cli_build
    other = tmp_path / "data"
    with dg.DagsterInstance.ephemeral() as instance:
        layout = SynthKDLayout(raw_dir=env["SYNTHKD_RAW_DIR"], data_dir=str(other))
        build_all(instance, layout, SynthKDBuildConfig(smoke=True))
    assert final_files(other) == final_files(root / "data")


@pytest.fixture
def webserver(cli_build):
    env, _, _ = cli_build
    with running_webserver(env, "-m", "synthkd_assets.definitions") as port:
        yield port


NODES = """{ assetNodes { assetKey { path } isPartitioned partitionKeys
  assetChecksOrError { ... on AssetChecks { checks {
    name blocking executionForLatestMaterialization { status } partitionStatuses {
      ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions } } } } } } }"""


def stale(port: int, asset: str, partition: str) -> str:
    data = graphql(
        port, f'{{ assetNodes(assetKeys: [{{path: ["{asset}"]}}]) {{ staleStatus(partition: "{partition}") }} }}'
    )
    return data["assetNodes"][0]["staleStatus"]


def test_webserver_shows_graph_partitions_checks_and_staleness(cli_build, webserver):
    env, root, _ = cli_build
    nodes = {"/".join(n["assetKey"]["path"]): n for n in graphql(webserver, NODES)["assetNodes"]}
    assert set(nodes) == ASSETS
    assert graphql(webserver, "{ shouldShowNux }") == {"shouldShowNux": False}  # no pop-up over the graph
    for asset in (
        "synth_raw",
        "synth_harmony",
        "synth_filtered",
        "synth_sampled",
        "synth_tokenized",
        "synth_kd_v1",
        "synth_distill",
    ):
        assert nodes[asset]["isPartitioned"] and nodes[asset]["partitionKeys"] == [
            "synth_001",
            "synth_002",
            "synth_003",
            "synth_004",
            "synth_005",
            "synth_006",
        ]
    checks = {c["name"]: {**c, "asset": a} for a, n in nodes.items() for c in n["assetChecksOrError"].get("checks", [])}
    assert {
        "tokenizer_sha256_pin",
        "manifest_provenance",
        "no_split_leakage",
        "validation_sets_not_trained",
        "shards_readable_by_megatron",
        "trio_alignment",
        "rows_accounted",
    } <= set(checks)
    assert {
        "distill_rows_valid",
        "distill_labels_match_input_ids",
        "distill_spans_consistent",
        "distill_max_length_respected",
        "distill_no_split_leakage",
        "distill_manifest_provenance",
    } <= set(checks)
    # the pool's WARN check is shown, non-blocking, and warns: the default skill mix is unbalanced by design
    warn = checks.pop("bucket_balance")
    assert not warn["blocking"] and warn["executionForLatestMaterialization"]["status"] == "FAILED"
    # the pool's publication status is shown, non-blocking, and passes on a built pool
    published = checks.pop("pool_published")
    assert not published["blocking"] and published["executionForLatestMaterialization"]["status"] == "SUCCEEDED"
    # and whether every part is built from its shard as it is now: it is, after a whole build
    current = checks.pop("pool_current")
    assert not current["blocking"] and current["executionForLatestMaterialization"]["status"] == "SUCCEEDED"
    # the near-duplicate WARN checks are shown, non-blocking, and pass on the sample
    for name in ("large_cluster", "clusters_cross_split"):
        near_dup = checks.pop(name)
        assert not near_dup["blocking"] and near_dup["executionForLatestMaterialization"]["status"] == "SUCCEEDED"
    # near_dup_controlled and shard_not_empty (per shard) are non-blocking WARNs; every shard of the sample was
    # seen by the clusters and writes documents
    per_shard_warnings = ("near_dup_controlled", "shard_not_empty")
    assert not any(checks[name]["blocking"] for name in per_shard_warnings)
    assert all(c["blocking"] for name, c in checks.items() if name not in per_shard_warnings)
    for name, c in checks.items():
        if nodes[c["asset"]]["isPartitioned"]:
            # per-shard checks are partitioned like their asset: the UI shows each shard's verdict. (Its
            # "for the latest materialization" can still be empty: Dagster compares the latest execution of any
            # shard with the latest materialization of any shard, and parallel shard runs interleave.)
            statuses = c["partitionStatuses"]
            assert statuses["succeededPartitions"] == nodes[c["asset"]]["partitionKeys"], (name, statuses)
            assert statuses["failedPartitions"] == [], (name, statuses)
        else:
            assert c["executionForLatestMaterialization"]["status"] == "SUCCEEDED", (name, c)
    assert stale(webserver, "synth_harmony", "synth_003") == "FRESH"

    # an upstream edit of one shard, seen by the inventory, marks exactly that partition stale
    raw = Path(env["SYNTHKD_RAW_DIR"]) / "synth_003.parquet"
    original = raw.read_bytes()
    try:
        pq.write_table(pq.read_table(raw).slice(1), raw)
        done = subprocess.run(
            [
                str(VENV_BIN / "dagster"),
                "asset",
                "materialize",
                "-m",
                "synthkd_assets.definitions",
                "--select",
                "synth_raw_inventory",
            ],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        # Dagster's stale status is one hop: the direct child of the changed source partition
        assert stale(webserver, "synth_harmony", "synth_003") == "STALE"
        assert all(
            stale(webserver, "synth_harmony", key) == "FRESH"
            for key in ("synth_001", "synth_002", "synth_004", "synth_005", "synth_006")
        )
    finally:
        raw.write_bytes(original)  # the module's build stays consistent with its input for later tests


REEXECUTE = """mutation { launchPipelineReexecution(reexecutionParams: {parentRunId: "%s", strategy: ALL_STEPS}) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } ... on InvalidSubsetError {
  message } ... on RunConfigValidationInvalid { errors { message } } ... on PipelineNotFoundError { message } } }"""


@contextlib.contextmanager
def runs_at_once(home: Path) -> Iterator[None]:
    """The instance of `home` launching a run at once when it is submitted (Dagster's DefaultRunCoordinator: no
    queue, so no daemon), for the block."""
    config = home / "dagster.yaml"
    queued = config.read_text()
    at_once = "run_coordinator:\n  module: dagster._core.run_coordinator\n  class: DefaultRunCoordinator\n"
    config.write_text(
        queued.split("run_coordinator:")[0] + at_once + "run_launcher:" + queued.split("run_launcher:")[1]
    )
    try:
        yield
    finally:
        config.write_text(queued)


def finished(home: Path, run_id: str) -> tuple[dg.DagsterRun, list[str]]:
    """Run `run_id` of the instance of `home` once it has finished, and its step failures."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        deadline = time.monotonic() + 300
        while not (run := instance.get_run_by_id(run_id)).is_finished:
            assert time.monotonic() < deadline, f"run {run_id} still {run.status}"
            time.sleep(1)
        return run, [e.message for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)]


def test_a_build_run_is_its_pass_jobs_run_and_the_ui_reexecutes_it_as_built(cli_build, tmp_path):
    """Every run of build.sh is a run of its pass's job in the code location (so the UI names it and can open
    and re-execute it) and carries its resources' config. The UI's "Re-execute" of the smoke build's shard run,
    from a webserver whose environment names another data root, rebuilds that shard as the build did: smoke,
    the build's roots, the same bytes."""
    env, root, _ = cli_build
    home = Path(env["DAGSTER_HOME"])
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = [run for run in instance.get_runs() if BUILD_TAG in run.tags]  # the module's other tests run too
    assert {(run.tags["synthkd/pass"], run.job_name) for run in runs} == {
        (name, job.name) for name, job in PASS_JOBS.items()
    }
    code_location_jobs = {job.name for job in defs().resolve_all_job_defs()}
    assert {run.job_name for run in runs} <= code_location_jobs
    assert all(run.run_config["resources"]["build"]["config"]["smoke"] for run in runs)
    (parent,) = [
        run for run in runs if run.job_name == "synth_build_job" and run.tags[PARTITION_NAME_TAG] == "synth_003"
    ]
    before = final_files(root / "data")

    # its code location reads another data root
    elsewhere = tmp_path / "elsewhere"
    with (
        runs_at_once(home),
        running_webserver({**env, "SYNTHKD_DATA_DIR": str(elsewhere)}, "-w", "workspace.yaml") as port,
    ):
        launched = graphql(port, REEXECUTE % parent.run_id)["launchPipelineReexecution"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run, failures = finished(home, launched["run"]["runId"])
    assert run.status == dg.DagsterRunStatus.SUCCESS, failures
    assert run.job_name == "synth_build_job" and run.tags[PARTITION_NAME_TAG] == "synth_003"
    assert run.tags["synthkd/pass"] == "build" and run.parent_run_id == parent.run_id
    assert not elsewhere.exists()
    assert final_files(root / "data") == before


@pytest.mark.parametrize("smoke_run", [True, False], ids=["smoke run, full instance", "full run, smoke instance"])
def test_each_instance_refuses_the_other_kind_of_builds_runs(cli_build, monkeypatch, smoke_run):
    """A smoke run launched into the full builds' instance (the UI's launchpad, `dg launch` with `smoke: true`),
    or a full build's run into the smoke builds' instance, is refused when it is submitted, saying where it
    belongs; Dagster records it as failed with that message, and nothing is materialized: what the full
    instance's UI shows as the assets' latest state stays the full build's."""
    env, root, _ = cli_build
    home = root / "home" if smoke_run else Path(env["DAGSTER_HOME"])
    ensure_instance_yaml(home)  # the full builds' instance, as build.sh and ui.sh write it; the smoke one has its own
    for name, value in {**env, "DAGSTER_HOME": str(home)}.items():
        monkeypatch.setenv(name, value)
    run_config = {"resources": {"build": {"config": {"smoke": smoke_run}}}}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        before = {run.run_id for run in instance.get_runs()}
    server = GraphQLServer()
    try:
        with pytest.raises(LaunchFailed) as refused:
            launch_run(server, "synth_scan_job", run_config, {PARTITION_TAG: "synth_001"})
    finally:
        server.close()
    expected = "this instance holds full builds" if smoke_run else "this is the smoke builds' instance"
    assert expected in str(refused.value), refused.value
    with dg.DagsterInstance.from_config(str(home)) as instance:
        (run,) = [run for run in instance.get_runs() if run.run_id not in before]
        assert run.status == dg.DagsterRunStatus.FAILURE
        said = [event.message for event in instance.all_logs(run.run_id)]
        assert any(expected in (message or "") for message in said), said
        materialized = instance.get_latest_materialization_event(dg.AssetKey("synth_harmony"))
        assert smoke_run == (materialized is None)  # the full instance has none; the smoke one keeps its own
        if materialized is not None:
            assert materialized.run_id in before


EXECUTE_CHECK = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


def test_a_check_that_runs_alone_is_executed_from_its_asset_page(cli_build):
    """The Checks tab's "Execute" of a check defined on its own (here `dataset_rows_accounted` of
    synth_kd_v1_manifest) launches what the UI sends: a run of Dagster's asset job selecting that check alone.
    It reads the built dataset again and records a new passing evaluation; no asset is materialized."""
    env, _, _ = cli_build
    home = Path(env["DAGSTER_HOME"])
    check = {"assetKey": {"path": ["synth_kd_v1_manifest"]}, "name": "dataset_rows_accounted"}
    selector = {"repositoryLocationName": "synthkd", "repositoryName": "__repository__", "jobName": "__ASSET_JOB"}
    params = {
        "selector": {**selector, "assetSelection": [], "assetCheckSelection": [check]},
        "runConfigData": {"resources": {"build": {"config": {"smoke": True}}}},
    }
    with runs_at_once(home), running_webserver(env, "-w", "workspace.yaml") as port:
        launched = graphql(port, EXECUTE_CHECK, {"params": params})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run, failures = finished(home, launched["run"]["runId"])
    assert run.status == dg.DagsterRunStatus.SUCCESS, failures
    with dg.DagsterInstance.from_config(str(home)) as instance:
        evaluations = [
            e.dagster_event.event_specific_data
            for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        ]
        materialized = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    assert [(e.check_name, e.passed) for e in evaluations] == [("dataset_rows_accounted", True)]
    assert evaluations[0].metadata["summary"].value.startswith("passed: ") and materialized == []
