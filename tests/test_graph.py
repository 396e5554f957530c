"""The asset graph on the bundled sample, through a real Dagster instance and megatron-core readers."""

from __future__ import annotations

import json

import dagster as dg
import numpy as np
import polars as pl
import pytest

from synthkd_assets.core.megatron_io import trio_alignment_problems
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract import constants
from synthkd_contract.manifest_seal import sha256_file
from synthkd_contract.splits import assign_split
from synthkd_contract.trio import open_trio, shard_tokens_prefix
from tests.helpers import MANIFEST_STEPS, SAMPLE_RAW_DIR, SHARD_STEPS, run


@pytest.fixture
def built(built_sample):
    return built_sample


def test_partitions_are_discovered_from_the_raw_directory(built):
    instance, _, _ = built
    assert instance.get_dynamic_partitions(SYNTH_SHARDS.name) == [
        p.stem for p in sorted(SAMPLE_RAW_DIR.glob("*.parquet"))
    ]


def test_layout_and_alignment(built):
    _, layout, _ = built
    root = layout.data_layout().megatron_root()
    for shard_index in range(1, 7):  # synth_001 ... synth_006
        assert trio_alignment_problems(root / "train", shard_index) == []
        for kind in constants.ARRAY_KINDS:
            assert (root / "train" / f"shard_{shard_index:02d}_{kind}.bin").is_file()
    assert not list(root.rglob("*.partial"))


def test_manifest_provenance_matches_the_bytes_on_disk(built):
    _, layout, _ = built
    paths = layout.data_layout()
    root = paths.megatron_root()
    manifest = json.loads(paths.megatron_manifest().read_text())
    for key in ("git_sha", "config_hash", "tokenizer", "input_manifest", "split", "shards", "totals"):
        assert key in manifest
    assert manifest["tokenizer"]["sha256"] == constants.TOKENIZER_SHA256
    assert manifest["input_manifest"]["sha256"] == sha256_file(paths.harmony_manifest())
    assert manifest["split"]["valid_fraction"] == constants.VALID_FRACTION
    assert manifest["totals"]["rows_in"] == 3149
    files = [f for shard in manifest["shards"] for split in shard["splits"] for f in split["files"]]
    assert len(files) >= 5 * 6
    for record in files:
        path = root / record["path"]
        assert path.stat().st_size == record["bytes"] and sha256_file(path) == record["sha256"]
    # per-span token totals equal what megatron-core reads back
    span_totals = np.zeros(3, dtype=np.int64)
    for shard in manifest["shards"]:
        for split in shard["splits"]:
            if split["sequences"]:
                span = open_trio(shard_tokens_prefix(root / split["split"], split["shard_index"]))["span"]
                span_totals += np.bincount(
                    span.bin_reader.read(np.uint8, int(span.sequence_lengths.sum()), 0), minlength=3
                )
    assert dict(zip(constants.SPAN_NAMES.values(), span_totals.tolist())) == manifest["totals"]["span_tokens"]


def test_documents_follow_tokenized_rows_and_the_split_rule(built):
    _, layout, _ = built
    paths = layout.data_layout()
    root = paths.megatron_root()
    tokenized = pl.read_parquet(paths.stage_output("synth_tokenized", "synth_002"))
    by_split = {
        split: tokenized.filter(pl.col("synth_id").map_elements(assign_split, return_dtype=pl.String) == split)
        for split in constants.SPLITS
    }
    trio = open_trio(shard_tokens_prefix(root / "train", 2))
    assert len(trio["tokens"]) == by_split["train"].height
    for i, row in enumerate(by_split["train"].head(50).iter_rows(named=True)):
        np.testing.assert_array_equal(trio["tokens"][i], row["tokens"])
        np.testing.assert_array_equal(trio["span"][i], row["span_id"])


def test_rematerializing_unchanged_input_is_byte_identical(built, own_instance):
    """In an instance of its own: a run of the shared instance would be one no pass job made (no pass tag), which
    test_dagster_conventions reads there."""
    instance, (_, layout, _) = own_instance, built
    root = layout.data_layout().megatron_root()
    before = {p: sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}
    run(instance, layout, SHARD_STEPS, "synth_003")
    run(instance, layout, MANIFEST_STEPS)
    after = {p: sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}
    assert after == before


@pytest.mark.parametrize("manifest", ["synth_kd_v1_manifest", "synth_distill_manifest"])
def test_a_manifest_over_an_unbuilt_partition_fails_naming_it(manifest, tmp_path):
    """The inventory registered the shards but none was built: the manifest refuses rather than list fewer."""
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path))
    with dg.DagsterInstance.ephemeral() as instance:
        run(instance, layout, ["o200k_tokenizer", "synth_raw_inventory"])
        result = run(instance, layout, [manifest], raise_on_error=False)
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    message = failure.event_specific_data.error.message
    first = sorted(p.stem for p in SAMPLE_RAW_DIR.glob("*.parquet"))[0]
    assert f"partition {first!r} has not been materialized" in message
    assert manifest.removesuffix("_manifest") in message
