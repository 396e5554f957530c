"""The smoke build caps work, not only output: the first step reads a bounded prefix of each raw shard,
every later step sees only those rows, and a smoke build never touches a full build's files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from synthkd_assets.core.caps import NO_CAPS, BuildCaps, SmokeBudget
from synthkd_assets.core.distill_io import write_distill_shard
from synthkd_assets.core.layout import HASH_CACHE_FILENAME, RAW_STATE_SUBDIR, STAGE_NAMES, documents_path
from synthkd_assets.core.ownership import WRITTEN_LEDGER
from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.stages import harmonize_shard, write_megatron_shard
from synthkd_assets.defs.build import build_all
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_contract import drops
from synthkd_contract.manifest_seal import sha256_file
from tests.test_bad_input import SHARD, SYSTEM, accounted, row, write_raw

GOOD_ROWS = 100  # the first row group; the second one is zeroed out


@pytest.fixture
def half_corrupt_shard(tmp_path) -> Path:
    """A raw shard whose first row group is sound and whose second row group's pages are all zeros:
    any read that reaches row GOOD_ROWS fails."""
    rows = [row(f"id{i:03d}", synthetic_answer=f"answer {i} " * 20) for i in range(2 * GOOD_ROWS)]
    raw = write_raw(tmp_path / "synth_001.parquet", rows, row_group_size=GOOD_ROWS, compression="zstd")
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
        assert dict(report.dropped) == {drops.DROP_SMOKE_CAP: 2 * GOOD_ROWS - cap} and accounted(report)
    with pytest.raises(InputFileError, match="unreadable after row"):
        harmonize_shard(raw, tmp_path / "one_more.parquet", SYSTEM, SHARD, max_rows=GOOD_ROWS + 1)


def test_an_uncapped_read_of_a_short_shard_counts_no_smoke_cap(tmp_path):
    raw = write_raw(tmp_path / "synth_001.parquet", [row(f"id{i}") for i in range(10)])
    report = harmonize_shard(raw, tmp_path / "out.parquet", SYSTEM, SHARD, max_rows=64)
    assert report.rows_in == report.rows_out == 10 and not report.dropped


# shared by design between full and smoke builds of one data root (docs/design.md, "Smoke build"): the raw hash cache,
# which any scan of the raw directory may rewrite (other tests on this shared build scan other directories)
SHARED_FILES = {f"{RAW_STATE_SUBDIR}/{HASH_CACHE_FILENAME}", str(WRITTEN_LEDGER)}  # both builds' records


def snapshot(root: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(root)): (sha256_file(p), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and str(p.relative_to(root)) not in SHARED_FILES
    }


def test_smoke_build_passes_its_checks_and_leaves_the_full_build_untouched(built_sample, tmp_path):
    # on a copy of the full build (mtimes kept): the shared build stays what the other tests compare against
    data_dir = tmp_path / "data"
    shutil.copytree(built_sample[2], data_dir)
    layout = SynthKDLayout(raw_dir=built_sample[1].raw_dir, data_dir=str(data_dir))
    full = snapshot(data_dir)
    build = SynthKDBuildConfig(smoke=True)
    smoke = layout.data_layout(smoke=True)
    with dg.DagsterInstance.ephemeral() as instance:  # the same data root, not the shared fixture's instance
        keys = build_all(instance, layout, build)  # raises on a failed step or a failed blocking check
        # every run says it is a smoke build's (the Runs list filters on it); a full build's runs do not
        assert {run.tags.get("synthkd/smoke") for run in instance.get_runs()} == {"true"}
    # and a run of the shared instance is tagged smoke exactly when its config says smoke (the full build's: not)
    full_runs = built_sample[0].get_runs()
    smoke_config = [r.run_config["resources"]["build"]["config"].get("smoke", False) for r in full_runs]
    assert not smoke_config[-1]  # the oldest run: the shared full build's
    assert [r.tags.get("synthkd/smoke") == "true" for r in full_runs] == smoke_config
    after = snapshot(data_dir)
    assert {name: after[name] for name in full if after.get(name) != full[name]} == {}  # not a byte or mtime changed
    roots = (
        smoke.build_root(),
        smoke.megatron_root(),
        smoke.distill_root(),
        smoke.pool_root(),
        smoke.valuation_root(),
        smoke.validation_root(),
    )
    own = tuple(f"{smoke.recorded(root)}/" for root in roots)
    assert own == (
        "smoke/",
        "megatron/synth_kd_v1_smoke/",
        "distill/synth_distill_smoke/",
        "pool/synth_pool_v1_smoke/",
        "pool/synth_pool_v1_smoke_valuation/",
        "validation/synth_validation_v1_smoke/",
    )
    assert [name for name in after if name not in full and not name.startswith(own)] == []
    assert smoke.sampling_plan().is_file()  # its own plan
    caps = build.caps()
    assert (caps.max_input_rows, caps.max_rows, caps.max_tokens) == (256, 64, 200_000)

    raw_rows = {key: pq.ParquetFile(smoke.raw_shard(key)).metadata.num_rows for key in keys}
    for key in keys:
        reports = {stage: json.loads(smoke.stage_report(stage, key).read_text()) for stage in STAGE_NAMES}
        harmony = reports["synth_harmony"]
        read = min(raw_rows[key], 256)  # the bucket shard synth_005 has only 54 rows: all read, none capped
        assert harmony["rows_in"] == raw_rows[key] and harmony["dropped"].get("smoke_cap", 0) == raw_rows[key] - read
        assert harmony["rows_out"] + sum(v for k, v in harmony["dropped"].items() if k != "smoke_cap") == read
        # every later step processes only the rows the first step read
        assert reports["synth_filtered"]["rows_in"] == harmony["rows_out"] <= 256
        assert reports["synth_sampled"]["rows_in"] == reports["synth_filtered"]["rows_out"]
        assert reports["synth_tokenized"]["rows_in"] == reports["synth_sampled"]["rows_out"]

    kd = json.loads(smoke.megatron_manifest().read_text())
    distill = json.loads(smoke.distill_manifest().read_text())
    for manifest in (kd, distill):
        assert manifest["config"]["caps"] == {
            "max_input_rows_per_shard": 256,
            "max_rows_per_shard": 64,
            "max_tokens_per_shard": 200_000,
        }
        assert manifest["input_manifest"]["path"] == smoke.recorded(smoke.harmony_manifest())
        totals = manifest["totals"]
        assert totals["rows_in"] == sum(raw_rows.values()) == totals["rows_out"] + sum(totals["dropped"].values())
        # the sample keeps 64 conversations of every regular shard's 256-row prefix (93-117 of each survive the
        # filters, the clusters and the sampling plan), all 37 of the bucket shard's 54 rows that do, and all 50 of
        # the near-duplicate shard's 95 (its planted copies capped or held out, memorization sampled)
        assert len(keys) == 6 and totals["rows_out"] == 64 * 4 + 37 + 50


def test_both_dataset_writers_apply_the_same_token_cap(built_sample, encoding, tmp_path):
    """One cap rule for synth_kd_v1 and synth_distill: conversations counted by their tokenized length (EOD
    included), kept in order until the next would pass the cap, so both keep the same first conversations."""
    _, layout, _ = built_sample
    paths = layout.data_layout()
    tokenized = paths.stage_output("synth_tokenized", "synth_002")
    sampled = paths.stage_output("synth_sampled", "synth_002")
    lengths = [len(tokens) for tokens in pq.read_table(tokenized, columns=["tokens"])["tokens"].to_pylist()]
    cap = sum(lengths[:5]) + lengths[5] - 1  # the sixth conversation is one token too many
    caps = BuildCaps(max_tokens=cap)
    kd, _ = write_megatron_shard(tokenized, tmp_path / "kd", 1, "synth_002", caps)
    distill = write_distill_shard(tokenized, sampled, tmp_path / "distill", 1, "synth_002", encoding, caps=caps)
    for report in (kd, distill.report):
        assert report.rows_out == 5 and report.dropped == {drops.DROP_SMOKE_CAP: len(lengths) - 5}
    kd_ids = pq.read_table(documents_path(tmp_path / "kd", 1))["synth_id"].to_pylist()
    parts = [pq.read_table(tmp_path / "distill" / record["path"]) for record in distill.files]
    distill_ids = [i for part in parts for i in part["source"].combine_chunks().field("synth_id").to_pylist()]
    assert sorted(kd_ids) == sorted(distill_ids)


def admitted(caps: BuildCaps, lengths: list[int]) -> tuple[list[int], ShardReport]:
    report, budget, kept = ShardReport("synth_001"), SmokeBudget(caps), []
    for tokens in lengths:
        if budget.admits(tokens, report):
            budget.spend(tokens)
            kept.append(tokens)
    return kept, report


def test_the_smoke_budget_keeps_a_prefix():
    kept, report = admitted(BuildCaps(max_rows=2, max_tokens=10), [4, 7, 1, 1, 1])  # 4 + 7 passes 10 tokens
    assert kept == [4] and report.dropped == {drops.DROP_SMOKE_CAP: 4}  # what follows is capped too
    kept, report = admitted(BuildCaps(max_rows=2), [1, 1, 1])
    assert kept == [1, 1] and report.dropped == {drops.DROP_SMOKE_CAP: 1}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"smoke_max_rows": -1}, "smoke_max_rows = -1"),
        ({"smoke_max_tokens": 0}, "smoke_max_tokens = 0"),
        ({"smoke_input_rows": 0}, "smoke_input_rows = 0"),
    ],
)
def test_a_smoke_cap_below_one_is_refused_by_its_setting(settings, named):
    """A cap below 1 would write empty smoke datasets with every run succeeding."""
    with pytest.raises(ValueError, match=f"build config {named} is not a whole number >= 1"):
        SynthKDBuildConfig(smoke=True, **settings).caps()
    assert SynthKDBuildConfig(smoke=False, **settings).caps() == NO_CAPS  # a full build reads no smoke cap
