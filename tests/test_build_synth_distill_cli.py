"""001's canonical command as a subprocess on the bundled sample: the same assets, the same bytes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from synthkd_contract.manifest_seal import sha256_file
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR


def test_build_synth_distill_writes_the_distillkit_layout(built_sample, tmp_path):
    _, _, data_dir = built_sample
    out = tmp_path / "out" / "synth_distill"
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}  # an ephemeral instance
    done = subprocess.run(
        [
            sys.executable,
            "scripts/build_synth_distill.py",
            "--input-dir",
            str(SAMPLE_RAW_DIR),
            "--output-dir",
            str(out),
            "--encoding-errors-log",
            str(tmp_path / "render_errors.jsonl"),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    parts = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert parts == ["manifest.json", "manifest.json.sha256"] + [
        f"{s}/part-0000{i}.parquet" for s in ("train", "validation") for i in range(1, 7)
    ]
    # one progress bar per pass, advancing shard by shard
    assert "scan: harmony + filters: 100%" in done.stderr and "build: sample + tokenize + distill: 100%" in done.stderr
    assert "6/6" in done.stderr
    assert "synth_distill: 6 shards" in done.stdout and "rows in: 3149" in done.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encoding_errors_log"] == {"path": str(tmp_path / "render_errors.jsonl"), "records": 0}
    assert (tmp_path / "render_errors.jsonl").read_text() == ""
    work_dir = tmp_path / "out" / "synth_distill.work"
    assert (work_dir / "synth_sampling_plan" / "plan.json").is_file()
    assert done.stdout.rstrip().endswith(f"(relative paths above are under it): {work_dir}")
    # no second stack: the same Dagster assets as the graph build give the same bytes and config
    graph = data_dir / "distill" / "synth_distill"
    for part in parts[2:]:  # the parts (the manifests differ: other paths)
        assert sha256_file(out / part) == sha256_file(graph / part), part
    assert manifest["config_hash"] == json.loads((graph / "manifest.json").read_text())["config_hash"]


def test_bad_arguments_are_refused_before_any_work(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "scripts/build_synth_distill.py",
            "--input-dir",
            str(SAMPLE_RAW_DIR),
            "--output-dir",
            str(tmp_path / "o"),
            "--non-english-min",
            "0.5",
            "--non-english-max",
            "0.3",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "non_english_min 0.5 > non_english_max 0.3" in done.stderr
    assert not (tmp_path / "o").exists()


def test_help_shows_no_none_default():
    """Options whose help says what unset means show no "(default: None)"."""
    done = subprocess.run(
        [sys.executable, "scripts/build_synth_distill.py", "--help"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0 and "(default: <output-dir>.work)" in done.stdout
    assert "(default: None)" not in done.stdout and "(default: 8192)" in done.stdout
