"""SIGKILL at random points never leaves a file that looks complete; a rerun gives the clean bytes."""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_assets.core import atomic
from synthkd_assets.core.atomic import PARTIAL_SUFFIX, PartialFile, atomic_write_text
from synthkd_assets.core.dataset_manifest import PENDING
from synthkd_assets.core.megatron_io import MegatronShardWriter, trio_alignment_problems
from synthkd_assets.core.ownership import ledger_path, owns, register_output_root
from synthkd_assets.core.parquet_io import ParquetShardWriter
from synthkd_contract import constants
from synthkd_contract.manifest_seal import CHECKS_SUFFIX, HELD, SIDECAR_SUFFIX, ManifestError, verify_manifest
from synthkd_contract.trio import trio_files
from tests.helpers import REPO_ROOT, SAMPLE_RAW_DIR, location_dependent

KILLS = 4
TIME_BUDGET_S = 240


def final_files(data_dir: Path) -> dict[str, str]:
    """sha256 of every file under its final name (hash caches and per-run error logs aside; the pool's
    curriculum stage files and manifest name absolute paths under `data_dir`, so they are left out)."""
    return {
        str(p.relative_to(data_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(data_dir.rglob("*"))
        if p.is_file()
        and not p.name.endswith(PARTIAL_SUFFIX)
        and p.name != "hash_cache.json"
        and p != ledger_path(data_dir)
        and not location_dependent(data_dir, p)
    }


def start_build(raw: Path, data: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_child", str(raw), str(data)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_sigkill_never_leaves_complete_looking_output(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(SAMPLE_RAW_DIR / "synth_002.parquet", raw / "synth_002.parquet")

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
                if Path(name).parent.name == constants.MANIFEST_FILENAME + CHECKS_SUFFIX:
                    # killed before a dataset's blocking checks all passed: the dataset is held, it does not verify
                    assert (data / name).read_text().startswith(f"{PENDING} "), f"kill #{attempt}: {name}"
                    with pytest.raises(ManifestError, match=f"blocking check {Path(name).name} has not passed"):
                        verify_manifest(data / Path(name).parent.parent)
                    continue
                sealed = data / name
                if name.endswith(SIDECAR_SUFFIX) and sealed.read_text().startswith(f"{HELD} "):
                    # the seal of a manifest whose blocking checks have not all passed: the finished seal, held
                    final = (clean_dir / name).read_text()
                    assert sealed.read_text() == f"{HELD} {final}", f"kill #{attempt}: {name}"
                    with pytest.raises(ManifestError):
                        verify_manifest(sealed.parent)
                    continue
                # anything else published under its final name is the finished file, byte for byte
                assert expected.get(name) == digest, f"kill #{attempt}: {name} is present but not the complete file"
        rerun = start_build(raw, data)
        assert rerun.communicate(timeout=600)[0].strip().endswith("done")
        assert final_files(data) == expected, f"kill #{attempt}: rerun after the kill differs from a clean run"
        assert not list(data.rglob(f"*{PARTIAL_SUFFIX}")), "a rerun leaves no partial file behind"


# --- partial files: unique, exclusive, never a planted link -----------------------------------

PLANTED = b"another user's file, outside the data root"


def plant_links(directory: Path, names: list[str], outside: Path) -> dict[Path, Path]:
    """A symlink at each old, predictable partial name (`<final>.partial`), pointing outside the root."""
    directory.mkdir(parents=True, exist_ok=True)
    links = {}
    for name in names:
        target = outside / f"{name}.target"
        target.write_bytes(PLANTED)
        link = directory / f"{name}{PARTIAL_SUFFIX}"
        os.symlink(target, link)
        links[link] = target
    return links


def assert_untouched(links: dict[Path, Path]) -> None:
    for link, target in links.items():
        assert target.read_bytes() == PLANTED, f"the write followed {link} to {target}"
        assert os.readlink(link) == str(target), f"{link} was replaced"


def test_writes_do_not_follow_a_symlink_planted_at_a_partial_name(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "root"

    parquet = root / "stage" / "synth_001.parquet"
    links = plant_links(parquet.parent, [parquet.name], outside)
    with ParquetShardWriter(parquet, pa.schema([("x", pa.int64())])) as writer:
        writer.write(pa.table({"x": list(range(100))}))
    assert pq.read_table(parquet)["x"].to_pylist() == list(range(100))

    train = root / "megatron" / "train"
    links |= plant_links(train, [p.name for p in trio_files(train, 0)], outside)
    with MegatronShardWriter(train, 0, "train") as trio:
        trio.add(
            np.array([5, 6, constants.EOD_TOKEN_ID], np.int32),
            np.array([1, 0, 0], np.uint8),
            np.array([2, 0, 0], np.uint8),
        )
        trio.commit()
    assert trio_alignment_problems(train, 0) == []

    manifest = root / "megatron" / "manifest.json"
    links |= plant_links(manifest.parent, [manifest.name], outside)
    atomic_write_text(manifest, "{}\n")
    assert manifest.read_text() == "{}\n"
    assert_untouched(links)


def test_a_dead_writers_partial_is_swept_and_a_live_ones_is_not(tmp_path):
    final = tmp_path / "out.parquet"
    live = PartialFile(final)  # a writer still at work (holds its lock)
    dead = tmp_path / f"{final.name}.killed{PARTIAL_SUFFIX}"
    dead.write_bytes(b"left by a SIGKILLed writer")  # nobody holds its lock
    atomic_write_text(final, "done\n")
    assert final.read_text() == "done\n" and not dead.exists() and live.path.exists()
    live.discard()
    assert sorted(p.name for p in tmp_path.iterdir()) == [final.name]


def test_a_partial_is_in_the_written_ledger_before_it_exists(tmp_path, monkeypatch):
    """A writer killed at any instant while it creates its partial leaves no file the build does not own: the
    ledger line comes first, so there is no moment when the file exists unrecorded (a SIGKILL there left a partial
    no rerun removed)."""
    root = tmp_path / "data"
    register_output_root(root)
    final = root / "pool" / "shards" / "shard_02.json"
    existed_when_recorded = []
    real_record = atomic.record_written

    def record(final_path, written, partial=False):
        if partial:
            existed_when_recorded.append(written.exists())
        real_record(final_path, written, partial)

    monkeypatch.setattr(atomic, "record_written", record)
    writer = PartialFile(final)
    assert existed_when_recorded == [False] and owns(writer.path)
    os.close(writer._fd)  # the writer dies: its lock goes, its partial stays
    writer._fd = None
    atomic_write_text(final, "done\n")
    assert sorted(p.name for p in final.parent.iterdir()) == [final.name]
