"""The smoke build caps work, not only output: the first step reads a bounded prefix of each raw shard,
every later step sees only those rows, and a smoke build never touches a full build's files."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from synthkd_assets import contracts
from synthkd_assets.core.layout import HASH_CACHE_FILENAME, RAW_STATE_SUBDIR, STAGE_NAMES
from synthkd_assets.core.manifest import sha256_file
from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.core.stages import harmonize_shard
from synthkd_assets.defs.build import build_all
from synthkd_assets.defs.resources import SynthKDBuildConfig
from tests.test_bad_input import SHARD, SYSTEM, accounted, row, write_raw

GOOD_ROWS = 100  # the first row group; the second one is zeroed out


@pytest.fixture
def half_corrupt_shard(tmp_path) -> Path:
    """A raw shard whose first row group is sound and whose second row group's pages are all zeros:
    any read that reaches row GOOD_ROWS fails."""
    rows = [row(f"id{i:03d}", synthetic_answer=f"answer {i} " * 20) for i in range(2 * GOOD_ROWS)]
    raw = write_raw(tmp_path / "synth_00.parquet", rows, row_group_size=GOOD_ROWS, compression="zstd")
    metadata = pq.ParquetFile(raw).metadata
    payload = bytearray(raw.read_bytes())
    for column in range(metadata.num_columns):
        chunk = metadata.row_group(1).column(column)
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        payload[start : start + chunk.total_compressed_size] = bytes(chunk.total_compressed_size)
    raw.write_bytes(bytes(payload))
    return raw


def test_a_capped_first_step_reads_only_the_prefix(tmp_path, half_corrupt_shard):
    raw = half_corrupt_shard
    with pytest.raises(InputFileError, match="unreadable after row"):
        harmonize_shard(raw, tmp_path / "full.parquet", SYSTEM, SHARD)  # a full read reaches the zeros
    for cap in (64, GOOD_ROWS):
        out = tmp_path / f"smoke_{cap}.parquet"
        report = harmonize_shard(raw, out, SYSTEM, SHARD, max_rows=cap)
        assert pq.read_table(out).column("source_row").to_pylist() == list(range(cap))  # the first rows, in file order
        # rows never read are still accounted for: the file's row count (from its footer), dropped as smoke_cap
        assert report.rows_in == 2 * GOOD_ROWS and report.rows_out == cap
        assert dict(report.dropped) == {contracts.DROP_SMOKE_CAP: 2 * GOOD_ROWS - cap} and accounted(report)
    with pytest.raises(InputFileError, match="unreadable after row"):
        harmonize_shard(raw, tmp_path / "one_more.parquet", SYSTEM, SHARD, max_rows=GOOD_ROWS + 1)


def test_an_uncapped_read_of_a_short_shard_counts_no_smoke_cap(tmp_path):
    raw = write_raw(tmp_path / "synth_00.parquet", [row(f"id{i}") for i in range(10)])
    report = harmonize_shard(raw, tmp_path / "out.parquet", SYSTEM, SHARD, max_rows=64)
    assert report.rows_in == report.rows_out == 10 and not report.dropped


# shared by design between full and smoke builds of one data root (docs/design.md, "Smoke build"): the raw hash cache,
# which any scan of the raw directory may rewrite (other tests on this shared build scan other directories)
SHARED_FILES = {f"{RAW_STATE_SUBDIR}/{HASH_CACHE_FILENAME}"}


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(root)): (sha256_file(p), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and str(p.relative_to(root)) not in SHARED_FILES
    }


def test_smoke_build_passes_its_checks_and_leaves_the_full_build_untouched(built_sample):
    _, layout, data_dir = built_sample
    full = snapshot(data_dir)
    build = SynthKDBuildConfig(smoke=True)
    smoke = layout.data_layout(smoke=True)
    with dg.DagsterInstance.ephemeral() as instance:  # the same data root, not the shared fixture's instance
        keys = build_all(instance, layout, build)  # raises on a failed step or a failed blocking check
    after = snapshot(data_dir)
    assert {name: after[name] for name in full if after.get(name) != full[name]} == {}  # not a byte or mtime changed
    roots = (smoke.build_root(), smoke.megatron_root(), smoke.distill_root())
    own = tuple(f"{smoke.recorded(root)}/" for root in roots)
    assert own == ("smoke/", "megatron/synth_kd_v1_smoke/", "distill/synth_distill_smoke/")
    assert [name for name in after if name not in full and not name.startswith(own)] == []
    assert smoke.sampling_plan().is_file()  # its own plan
    caps = build.caps()
    assert (caps.max_input_rows, caps.max_rows, caps.max_tokens) == (256, 64, 200_000)

    raw_rows = {key: pq.ParquetFile(smoke.raw_shard(key)).metadata.num_rows for key in keys}
    for key in keys:
        reports = {stage: json.loads(smoke.stage_report(stage, key).read_text()) for stage in STAGE_NAMES}
        harmony = reports["synth_harmony"]
        assert harmony["rows_in"] == raw_rows[key] and harmony["dropped"]["smoke_cap"] == raw_rows[key] - 256
        assert harmony["rows_out"] + sum(v for k, v in harmony["dropped"].items() if k != "smoke_cap") == 256
        # every later step processes only the rows the first step read
        assert reports["synth_filtered"]["rows_in"] == harmony["rows_out"] <= 256
        assert reports["synth_sampled"]["rows_in"] == reports["synth_filtered"]["rows_out"]
        assert reports["synth_tokenized"]["rows_in"] == reports["synth_sampled"]["rows_out"]

    kd = json.loads(smoke.megatron_manifest().read_text())
    distill = json.loads(smoke.distill_manifest().read_text())
    for manifest in (kd, distill):
        assert manifest["config"]["caps"] == {"max_input_rows_per_shard": 256, "max_rows_per_shard": 64, "max_tokens_per_shard": 200_000}
        assert manifest["input_manifest"]["path"] == smoke.recorded(smoke.harmony_manifest())
        totals = manifest["totals"]
        assert totals["rows_in"] == sum(raw_rows.values()) == totals["rows_out"] + sum(totals["dropped"].values())
        assert totals["rows_out"] == 64 * len(keys)  # the sample keeps 64 conversations of every 256-row prefix
