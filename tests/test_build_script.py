"""scripts/build.sh as a user runs it, on small shards: a file name with spaces and quotes, a second build on
the same data root, a removed shard, SIGTERM, an empty raw dir (its error said on the console)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from synthkd_assets import contracts
from synthkd_assets.core.buildlock import BuildLockHeld, build_lock
from synthkd_training.dataset import tokens_prefixes
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR

QUOTED = 'it\'s a "quoted" shard 01'  # a partition key with spaces and both kinds of quote
ROWS = 40


def small_shard(path: Path, source: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pq.read_table(SAMPLE_RAW_DIR / f"synth_0{source}.parquet").slice(0, ROWS), path)


def environment(root: Path) -> dict[str, str]:
    return {**os.environ, "DAGSTER_HOME": str(root / "home"), "SYNTHKD_RAW_DIR": str(root / "raw"), "SYNTHKD_DATA_DIR": str(root / "data")}


def start(root: Path, **env: str) -> subprocess.Popen:
    """build.sh in its own session, as from a terminal; output in files under root."""
    return subprocess.Popen(
        ["bash", "scripts/build.sh"], cwd=REPO_ROOT, env={**environment(root), **env}, start_new_session=True,
        stdout=open(root / "stdout.txt", "w"), stderr=subprocess.STDOUT, text=True,
    )


def build(root: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/build.sh"], cwd=REPO_ROOT, env=environment(root), capture_output=True, text=True, timeout=timeout)


def wait_for(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def descendants(pid: int) -> set[int]:
    """Every live process under `pid` (from /proc)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def dataset_files(data: Path) -> list[str]:
    roots = [data / "megatron" / contracts.DATASET_NAME, data / "distill" / contracts.DISTILL_DATASET_NAME]
    return sorted(str(p.relative_to(data)) for root in roots for p in root.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("buildsh")
    small_shard(root / "raw" / f"{QUOTED}.parquet", 1)
    small_shard(root / "raw" / "synth_03.parquet", 3)
    return root


def test_a_second_build_on_the_same_data_root_stops_at_once(root):
    first = start(root, SYNTHKD_PARALLEL_RUNS="2")  # both shards at once: keys go through xargs -P
    try:
        # the inventory has run, so the first build holds the lock and has every other pass ahead of it
        wait_for(lambda: (root / "data" / "synth_raw" / "hash_cache.json").is_file() or first.poll() is not None, "the inventory")
        assert first.poll() is None, (root / "stdout.txt").read_text()[-3000:]
        second = build(root, timeout=120)
        assert second.returncode == 75
        assert f"another build holds {root / 'data' / '.build.lock'}" in second.stderr
        with pytest.raises(BuildLockHeld):  # the in-process build honours the same lock
            with build_lock(root / "data"):
                pass
        assert first.wait(timeout=900) == 0, (root / "stdout.txt").read_text()[-4000:]
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert "synth_kd_v1: 2 shards" in (root / "stdout.txt").read_text()
    with build_lock(root / "data"):  # released with the build
        pass


def test_a_removed_shard_leaves_nothing_behind(root):
    data = root / "data"
    assert any("shard_03" in f for f in dataset_files(data))  # built by the test above
    (root / "raw" / "synth_03.parquet").unlink()
    done = build(root)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "synth_kd_v1: 1 shards" in done.stdout and "synth_distill: 1 shards" in done.stdout
    assert not [f for f in dataset_files(data) if "shard_03" in f or "part-00003" in f]
    assert not [p for p in data.rglob("*") if "synth_03" in p.name]  # stage files, records, error logs
    kd = data / "megatron" / contracts.DATASET_NAME
    assert [Path(p).name for p in tokens_prefixes(kd / "train")] == ["shard_01_tokens"]
    manifest = json.loads((kd / "manifest.json").read_text())
    assert [s["partition"] for s in manifest["shards"]] == [QUOTED]


def test_sigterm_stops_the_build_and_every_process_under_it(root):
    build_sh = start(root)
    seen: set[int] = set()

    def dagster_running() -> bool:
        seen.update(descendants(build_sh.pid))
        return build_sh.poll() is not None or any(
            b"dagster" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in seen if alive(pid)
        )

    wait_for(dagster_running, "a dagster process under build.sh")
    assert build_sh.poll() is None
    build_sh.send_signal(signal.SIGTERM)  # to build.sh only, as `kill <pid>` would
    assert build_sh.wait(timeout=120) == 143
    wait_for(lambda: not any(alive(pid) for pid in seen), "the build's processes to exit", timeout=60)
    with build_lock(root / "data"):  # nothing holds the lock any more
        pass


def test_an_empty_raw_directory_is_an_error_said_on_the_console(tmp_path):
    (tmp_path / "raw").mkdir()
    done = build(tmp_path, timeout=300)
    assert done.returncode != 0
    # the failed step's own error, printed by `cli failures` after Dagster's output
    assert f"step synth_raw_inventory failed: synthkd_assets.core.parquet_io.InputFileError: no raw shards in {tmp_path / 'raw'}" in done.stdout
    assert "0 shards" not in done.stdout
