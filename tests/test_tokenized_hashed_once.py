"""synth_tokenized's shards are hashed once, as the tokenize step publishes them (docs/contract.md "Checks",
"Hashed once, when written"): the step's materialization records that sha256, and the global steps that trust a
shard's row sizes by it (the quota plan, the kd manifest's length statistics) take it from there while the
shard's stat is unchanged, instead of reading every shard again in one process."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from synthkd_assets.core import stages
from synthkd_assets.defs import metadata
from synthkd_assets.defs.passes import QUOTA_STEPS
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract import manifest_seal
from synthkd_contract.manifest_seal import sha256_file
from tests.helpers import SAMPLE_RAW_DIR, run

SHARDS = [f"synth_{i:03d}" for i in range(1, 7)]  # every shard of the sample


@pytest.fixture
def hashed_tokenized(monkeypatch) -> list[str]:
    """The synth_tokenized shards read and hashed from now on (by the step, its metadata or any check), by name:
    the shard as it is published (`<key>.parquet.<id>.partial`) or since."""
    names: list[str] = []

    def counted(path, *args, **kwargs):
        if Path(path).parent.name == "synth_tokenized" and ".parquet" in Path(path).name:
            names.append(Path(path).name)
        return sha256_file(path, *args, **kwargs)

    for module in (manifest_seal, stages, metadata):
        monkeypatch.setattr(module, "sha256_file", counted)
    return names


def test_the_quota_plan_and_length_statistics_read_no_shard_the_tokenize_step_hashed(
    built_sample, own_instance, tmp_path, hashed_tokenized
):
    """Tokenized in this instance, each shard is hashed once, by its own step; the quota plan and the kd manifest
    (its length statistics from the row sizes) hash none of them again, and the plan is the one the build wrote.
    One shard's mtime moved since (bytes unchanged): exactly that shard is hashed again, and the plan is the same."""
    data = tmp_path / "data"
    shutil.copytree(built_sample[2], data)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(data))
    paths = layout.data_layout()
    plan_before = paths.quota_plan().read_bytes()
    for key in SHARDS:
        run(own_instance, layout, ["synth_tokenized"], key)
    assert len(hashed_tokenized) == len(SHARDS)  # once each, as published
    hashed_tokenized.clear()

    run(own_instance, layout, [*QUOTA_STEPS, "synth_kd_v1_manifest"])
    assert hashed_tokenized == []
    assert paths.quota_plan().read_bytes() == plan_before

    moved = paths.stage_output("synth_tokenized", "synth_003")
    stat = moved.stat()
    os.utime(moved, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    run(own_instance, layout, QUOTA_STEPS)
    assert hashed_tokenized == [moved.name]
    assert paths.quota_plan().read_bytes() == plan_before
