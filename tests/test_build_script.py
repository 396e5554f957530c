"""scripts/build.sh as a user runs it, on small shards: a file name with spaces and quotes, a second build on
the same data root, SIGTERM, an empty raw dir (its error said on the console). What a full build does with a
removed shard is tested in process (tests/test_raw_inventory.py): same assets, same code."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from synthkd_assets.core.buildlock import BuildLockHeld, build_lock
from synthkd_assets.core.layout import DataLayout
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR

QUOTED = 'it\'s a "quoted" shard 01'  # a partition key with spaces and both kinds of quote
ROWS = 40


def small_shard(path: Path, source: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pq.read_table(SAMPLE_RAW_DIR / f"synth_0{source}.parquet").slice(0, ROWS), path)


def environment(root: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DAGSTER_HOME": str(root / "home"),
        "SYNTHKD_RAW_DIR": str(root / "raw"),
        "SYNTHKD_DATA_DIR": str(root / "data"),
    }


def start(root: Path, **env: str) -> subprocess.Popen:
    """build.sh in its own session, as from a terminal; output in files under root."""
    return subprocess.Popen(
        ["bash", "scripts/build.sh"],
        cwd=REPO_ROOT,
        env={**environment(root), **env},
        start_new_session=True,
        stdout=open(root / "stdout.txt", "w"),
        stderr=subprocess.STDOUT,
        text=True,
    )


def build(root: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/build.sh"],
        cwd=REPO_ROOT,
        env=environment(root),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def descendants(pid: int) -> dict[int, bytes]:
    """Every live process under `pid` (from /proc), with its command line."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = {}, [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            try:
                found[child] = (Path("/proc") / str(child) / "cmdline").read_bytes()
            except OSError:
                continue
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_one_build_per_data_root_quoted_names_and_sigterm(tmp_path):
    """A build of two shards, one named with spaces and quotes, run two at a time: once its scan pass is
    through (both keys reached Dagster whole), a second build.sh and an in-process build on the same data
    root stop at once; then SIGTERM to build.sh stops it and every process under it, and frees the lock."""
    small_shard(tmp_path / "raw" / f"{QUOTED}.parquet", 1)
    small_shard(tmp_path / "raw" / "synth_03.parquet", 3)
    paths = DataLayout.from_environ(environment(tmp_path))
    first = start(tmp_path, SYNTHKD_PARALLEL_RUNS="2")
    seen: dict[int, bytes] = {}

    def scanned() -> bool:
        seen.update(descendants(first.pid))
        reports = [paths.stage_report("synth_filtered", key) for key in (QUOTED, "synth_03")]
        return first.poll() is not None or all(report.is_file() for report in reports)

    try:
        wait_for(scanned, "the scan pass of both shards", timeout=600)
        assert first.poll() is None, (tmp_path / "stdout.txt").read_text()[-3000:]
        second = build(tmp_path, timeout=120)
        assert second.returncode == 75
        assert f"another build holds {paths.build_lock()}" in second.stderr
        with pytest.raises(BuildLockHeld, match="another build holds"):  # the in-process build honours it too
            with build_lock(paths.build_lock()):
                pass
        seen.update(descendants(first.pid))
        first.send_signal(signal.SIGTERM)  # to build.sh only, as `kill <pid>` would
        assert first.wait(timeout=120) == 143
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert any(b"dagster" in cmdline for cmdline in seen.values())
    wait_for(lambda: not any(alive(pid) for pid in seen), "the build's processes to exit", timeout=60)
    with build_lock(paths.build_lock()):  # nothing holds the lock any more
        pass


def test_an_empty_raw_directory_is_an_error_said_on_the_console(tmp_path):
    (tmp_path / "raw").mkdir()
    done = build(tmp_path, timeout=300)
    assert done.returncode != 0
    # the failed step's own error, printed by `cli failures` after Dagster's output
    assert (
        "step synth_raw_inventory failed: synthkd_assets.core.parquet_io.InputFileError: no raw shards in "
        f"{tmp_path / 'raw'}" in done.stderr
    )
    assert "0 shards" not in done.stdout
