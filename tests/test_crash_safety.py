"""SIGKILL at random points never leaves a file that looks complete; a rerun gives the clean bytes."""

from __future__ import annotations

import hashlib
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from synthkd_assets.core.atomic import PARTIAL_SUFFIX
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR

KILLS = 4
TIME_BUDGET_S = 240


def final_files(data_dir: Path) -> dict[str, str]:
    """sha256 of every file under its final name (hash caches and per-run error logs aside)."""
    return {
        str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data_dir.rglob("*"))
        if p.is_file() and not p.name.endswith(PARTIAL_SUFFIX) and p.name != "hash_cache.json"
    }


def start_build(raw: Path, data: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_child", str(raw), str(data)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )


def test_sigkill_never_leaves_complete_looking_output(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(SAMPLE_RAW_DIR / "synth_01.parquet", raw / "synth_01.parquet")

    clean_dir = tmp_path / "clean"
    started = time.monotonic()
    clean = start_build(raw, clean_dir)
    assert clean.communicate(timeout=600)[0].strip().endswith("done")
    clean_seconds = time.monotonic() - started
    expected = final_files(clean_dir)
    assert any(name.endswith(".bin") for name in expected) and any(name.endswith("manifest.json") for name in expected)

    rng = random.Random(20261122)
    deadline = time.monotonic() + TIME_BUDGET_S
    for attempt in range(KILLS):
        if time.monotonic() > deadline:
            break
        data = tmp_path / f"killed_{attempt}"
        victim = start_build(raw, data)
        time.sleep(rng.uniform(0.5, clean_seconds))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
        if data.exists():
            for name, digest in final_files(data).items():
                # anything published under its final name is the finished file, byte for byte
                assert expected.get(name) == digest, f"kill #{attempt}: {name} is present but not the complete file"
        rerun = start_build(raw, data)
        assert rerun.communicate(timeout=600)[0].strip().endswith("done")
        assert final_files(data) == expected, f"kill #{attempt}: rerun after the kill differs from a clean run"
        assert not list(data.rglob(f"*{PARTIAL_SUFFIX}")), "a rerun leaves no partial file behind"
