"""Dagster's `dg` CLI on this project, as real subprocesses: `dg check defs`, `dg list defs`, and `dg launch`
on a fresh DAGSTER_HOME and data directory (the README's "Dagster's UI and CLI" commands)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from synthkd_assets.core.layout import DataLayout
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR

VENV_BIN = Path(sys.executable).parent


def dg(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "dg"), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def fresh(tmp_path):
    """A fresh instance (deploy/local/dagster.yaml, nothing registered) and an empty data directory over a
    copy of two sample shards."""
    home, raw = tmp_path / "home", tmp_path / "raw"
    home.mkdir()
    shutil.copyfile(REPO_ROOT / "deploy" / "local" / "dagster.yaml", home / "dagster.yaml")
    raw.mkdir()
    for name in ("synth_00.parquet", "synth_01.parquet"):
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


def test_dg_launch_on_a_fresh_instance(fresh):
    """Unknown partitions get a hint; the one-line inventory registers them; a tag selects a pass; a shard
    step whose upstream was never built fails naming it and the order to run."""
    listed = subprocess.run(
        [sys.executable, "-m", "synthkd_assets.cli", "partitions"],
        cwd=REPO_ROOT,
        env=fresh,
        capture_output=True,
        text=True,
    )
    assert listed.returncode == 1 and "dg launch --assets synth_raw_inventory" in listed.stderr

    inventory = dg(fresh, "launch", "--assets", "synth_raw_inventory")
    assert inventory.returncode == 0, inventory.stderr[-3000:]
    listed = subprocess.run(
        [sys.executable, "-m", "synthkd_assets.cli", "partitions"],
        cwd=REPO_ROOT,
        env=fresh,
        capture_output=True,
        text=True,
    )
    assert listed.stdout.split() == ["synth_00", "synth_01"]

    scan = dg(fresh, "launch", "--assets", "tag:synthkd/pass=scan", "--partition", "synth_01")
    assert scan.returncode == 0, scan.stderr[-3000:]
    paths = DataLayout.from_environ(fresh)
    assert paths.stage_output("synth_filtered", "synth_01").is_file()
    assert not paths.stage_output("synth_filtered", "synth_00").exists()

    kd = dg(fresh, "launch", "--assets", "synth_kd_v1", "--partition", "synth_01")
    output = kd.stdout + kd.stderr
    assert kd.returncode != 0
    assert "synth_kd_v1 partition 'synth_01' needs synth_tokenized first" in output, output[-3000:]
    assert "dg launch --assets synth_sampled,synth_tokenized,synth_kd_v1,synth_distill --partition synth_01" in output
