"""benchmarks/floor.py end to end on a small real-shaped file: the build's cost is every process of its tree (at
least what sampling /proc saw of each), and each part of the floor is measured on the rows the build read and
the documents it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from synthkd_assets.core.layout import DataLayout

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_the_floor_benchmark_measures_the_whole_build_and_each_part_of_the_floor(tmp_path):
    report = tmp_path / "floor.json"
    command = [sys.executable, "benchmarks/floor.py", "--rows", "1500", "--work-dir", str(tmp_path / "work")]
    done = subprocess.run([*command, "--json", str(report)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "cost / floor over 1 builds of 1 x 1,500 rows" in done.stdout
    [run] = json.loads(report.read_text())["runs"]
    sampled = sum(run["cpu_by_kind_sampled"].values())
    # the reaped total covers the daemon's code servers and their run workers, not only build.sh's own children
    assert run["cost_cpu_s"] >= sampled > 0
    assert {"step process of code server", "daemon", "webserver"} <= set(run["cpu_by_kind_sampled"])
    assert all(seconds > 0 for seconds in run["floor_parts_cpu_s"].values())
    assert run["ratio"] == run["cost_cpu_s"] / run["floor_cpu_s"]
    [raw] = (tmp_path / "work" / "raw").glob("*.parquet")
    assert run["input_rows"] == pq.read_metadata(raw).num_rows == 1500
    layout = DataLayout(tmp_path / "work" / "raw", tmp_path / "work" / "data")
    totals = json.loads(layout.megatron_manifest().read_text())["totals"]
    assert run["documents"] == sum(totals["sequences"].values()) > 0  # one sequence per written conversation
    # the floor's BPE re-encodes the written texts without their special tokens: fewer tokens than were written
    written = sum(totals["span_tokens"].values())
    assert 0.5 * written < run["bpe_tokens"] < written
