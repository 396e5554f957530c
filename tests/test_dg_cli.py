"""Dagster's `dg` CLI on this project, as real subprocesses: `dg check defs`, `dg list defs`, and `dg launch`
on a fresh DAGSTER_HOME and data directory (the README's "Dagster's UI and CLI" commands)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import dagster
import pytest

from synthkd_assets.core.layout import DataLayout
from synthkd_assets.defs.instances import local_instance_yaml
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR

VENV_BIN = Path(sys.executable).parent


def dg(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "dg"), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def fresh(tmp_path):
    """A fresh instance (the repository's dagster.yaml settings, nothing registered) and an empty data directory over a
    copy of two sample shards."""
    home, raw = tmp_path / "home", tmp_path / "raw"
    home.mkdir()
    (home / "dagster.yaml").write_text(local_instance_yaml())
    raw.mkdir()
    for name in ("synth_001.parquet", "synth_002.parquet"):
        shutil.copyfile(SAMPLE_RAW_DIR / name, raw / name)
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "SYNTHKD_RAW_DIR": str(raw),
        "SYNTHKD_DATA_DIR": str(tmp_path / "data"),
    }


def test_dg_check_and_list_defs_see_the_code_location(fresh):
    checked = dg(fresh, "check", "defs")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr
    assert "virtual environment" not in checked.stdout + checked.stderr  # suppressed in [tool.dg.cli]

    listed = dg(fresh, "list", "defs", "--json")
    assert listed.returncode == 0, listed.stderr
    defs = json.loads(listed.stdout)
    assets = {a["asset_key"]: a for a in defs["assets"]}
    assert {"synth_raw_inventory", "synth_harmony", "synth_kd_v1", "synth_distill", "synth_kd_v1_manifest"} <= set(
        assets
    )
    assert "megatron" in assets["synth_kd_v1"]["kinds"] and assets["synth_kd_v1"]["owners"] == [{"team": "synthkd"}]
    checks = {c["key"]: c for c in defs["asset_checks"]}
    assert "synth_kd_v1:trio_alignment" in checks and all(c.get("description") for c in checks.values())
    assert {j["name"] for j in defs["jobs"]} >= {"synth_scan_job", "synth_shard_job"}
    assert "synth_raw_sensor" in {s["name"] for s in defs["sensors"]}


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """`python -m synthkd_assets.cli ...`, as README and build.sh type it."""
    command = [sys.executable, "-m", "synthkd_assets.cli", *args]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)


def cli_partitions(env: dict[str, str]) -> subprocess.CompletedProcess:
    return cli(env, "partitions")


def test_dg_launch_on_a_fresh_instance(fresh):
    """Unknown partitions get a hint; the one-line inventory registers them; a pass's job runs it; a shard
    step whose upstream was never built fails naming it and the order to run."""
    listed = cli_partitions(fresh)
    assert listed.returncode == 1 and "dg launch --job synth_inventory_job" in listed.stderr
    homeless = {name: value for name, value in fresh.items() if name != "DAGSTER_HOME"}
    listed = cli_partitions(homeless)
    assert listed.returncode == 2 and listed.stderr.startswith("DAGSTER_HOME is not an instance directory (None)")
    listed = cli_partitions({**fresh, "DAGSTER_HOME": str(Path(fresh["DAGSTER_HOME"]) / "missing")})
    assert listed.returncode == 2 and "missing): partitions live in a Dagster instance" in listed.stderr

    inventory = dg(fresh, "launch", "--job", "synth_inventory_job")
    assert inventory.returncode == 0, inventory.stderr[-3000:]
    listed = cli_partitions(fresh)
    assert listed.stdout.split() == ["synth_001", "synth_002"]

    scan = dg(fresh, "launch", "--job", "synth_scan_job", "--partition", "synth_002")  # the README's pass by pass
    assert scan.returncode == 0, scan.stderr[-3000:]
    # a run of the pass's job, tagged with its pass as a build's run is
    with dagster.DagsterInstance.from_config(fresh["DAGSTER_HOME"]) as instance:
        (run,) = instance.get_runs(filters=dagster.RunsFilter(job_name="synth_scan_job"))
        assert run.tags["synthkd/pass"] == "scan" and run.tags["dagster/partition"] == "synth_002"
        assert run.remote_job_origin is None  # executed in dg's own process, not launched (build.sh launches)
    paths = DataLayout.from_environ(fresh)
    assert paths.stage_output("synth_filtered", "synth_002").is_file()
    assert not paths.stage_output("synth_filtered", "synth_001").exists()

    kd = dg(fresh, "launch", "--assets", "synth_kd_v1", "--partition", "synth_002")
    output = kd.stdout + kd.stderr
    assert kd.returncode != 0
    assert "synth_kd_v1 partition 'synth_002' needs synth_tokenized first" in output, output[-3000:]
    assert "dg launch --job synth_build_job --partition synth_002" in output  # the order to run, as the README's
    # the one UI action first: the pass job that builds the missing asset, for this partition
    assert "Repair: in the UI, Jobs > synth_build_job > Materialize all, partition 'synth_002'" in output


def test_workspace_yaml_names_the_location_as_dg_does():
    """`dagster dev -w workspace.yaml` (and the daemon on it) and `dg dev` show one code location under one name,
    so a sensor or schedule turned on or off in one is the same in the other."""
    import tomllib

    import yaml

    from synthkd_dev.partition_scale import DEFINITIONS_MODULE, LOCATION_NAME

    tool = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]
    project, dagster = tool["dg"]["project"], tool["dagster"]
    [entry] = yaml.safe_load((REPO_ROOT / "workspace.yaml").read_text())["load_from"]
    module = entry["python_module"]
    assert module["location_name"] == project["code_location_name"] == LOCATION_NAME
    assert module["module_name"] == project["code_location_target_module"] == DEFINITIONS_MODULE
    assert (dagster["code_location_name"], dagster["module_name"]) == (LOCATION_NAME, DEFINITIONS_MODULE)


# the README's "you type / what happens" rows 1-3 (row 4: test_dg_launch_on_a_fresh_instance), as typed
README_TABLE_ERRORS = [
    (
        ["dagster", "asset", "materialize", "--select", "synth_kd_v1"],
        "Error: Invalid set of CLI arguments for loading repository/job",
    ),
    (
        ["dagster", "asset", "materialize", "-m", "synthkd_assets.definitions", "--select", "synth_kd_v1"],
        "Asset has partitions, but no '--partition' option was provided",
    ),
    (
        ["dg", "launch", "--assets", "synth_kd_v1", "--partition", "synth_001"],
        "All selected assets must have a PartitionsDefinition containing the passed partition key `synth_001`",
    ),
]


@pytest.mark.parametrize(("typed", "error"), README_TABLE_ERRORS, ids=["no-module", "no-partition", "fresh-home"])
def test_the_readme_table_quotes_what_the_cli_says(fresh, typed, error):
    readme = (REPO_ROOT / "README.md").read_text()
    assert f"| `{' '.join(typed)}`" in readme and error in readme
    done = subprocess.run(
        [str(VENV_BIN / typed[0]), *typed[1:]], cwd=REPO_ROOT, env=fresh, capture_output=True, text=True, timeout=600
    )
    assert done.returncode != 0 and error in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
