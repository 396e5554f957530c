"""Each blocking check passes on a sound build and fails on a deliberately corrupted one."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_assets.core.tokenizer import TokenizerPinError, load_harmony_encoding
from synthkd_assets.defs.checks import gating_checks
from synthkd_assets.defs.resources import SynthKDLayout, synthkd_resources
from synthkd_contract import constants, drops, manifest_seal
from synthkd_contract.manifest_seal import ManifestError, sha256_file, verify_manifest
from tests.helpers import ALL_ASSETS, SAMPLE_RAW_DIR, check_evaluations, check_outcomes, run

MANIFEST_CHECKS = {
    "manifest_provenance",
    "no_split_leakage",
    "no_duplicate_synth_ids",
    "validation_sets_not_trained",
    "shards_readable_by_megatron",
    "dataset_rows_accounted",
    "output_table_schemas",
}


def run_checks(instance, layout: SynthKDLayout, asset: str) -> dict[str, bool]:
    return {name: evaluation.passed for name, evaluation in check_evaluations(instance, layout, asset).items()}


@pytest.fixture
def copy_of_build(built_sample, own_instance, tmp_path):
    _, _, data_dir = built_sample
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy))
    return own_instance, layout, layout.data_layout()


def test_all_checks_pass_on_a_sound_build(copy_of_build):
    instance, layout, _ = copy_of_build
    assert run_checks(instance, layout, "synth_kd_v1_manifest") == dict.fromkeys(MANIFEST_CHECKS, True)
    assert run_checks(instance, layout, "o200k_tokenizer") == {"tokenizer_sha256_pin": True}


def test_a_table_off_its_contract_schema_fails_the_schema_checks_naming_file_and_column(copy_of_build):
    instance, layout, paths = copy_of_build
    keys = [
        dg.AssetCheckKey(dg.AssetKey("synth_kd_v1_manifest"), "output_table_schemas"),
        dg.AssetCheckKey(dg.AssetKey("synth_pool_manifest"), "pool_table_schemas"),
    ]

    def evaluations():
        result = dg.materialize(
            ALL_ASSETS,
            selection=dg.AssetSelection.checks(*keys),
            instance=instance,
            resources=synthkd_resources(layout),
            raise_on_error=False,
        )
        return {e.check_name: e for e in result.get_asset_check_evaluations()}

    assert {name: e.passed for name, e in evaluations().items()} == {
        "output_table_schemas": True,
        "pool_table_schemas": True,
    }
    clusters = paths.stage_output("synth_clusters", "synth_003")
    table = pq.read_table(clusters)
    pq.write_table(table.set_column(2, "cluster_size", table.column("cluster_size").cast(pa.int64())), clusters)
    part = sorted(paths.pool_root().glob("parts/*.parquet"))[0]
    pq.write_table(pq.read_table(part).drop(["near_dup_hash"]), part)
    found = evaluations()
    kd, pool = found["output_table_schemas"], found["pool_table_schemas"]
    assert not kd.passed and f"{clusters}: column 'cluster_size' is int64, the contract says int32" in kd.description
    assert not pool.passed and f"{part}: columns [" in pool.description


def test_truncated_bin_fails_provenance_and_readability(copy_of_build):
    instance, layout, paths = copy_of_build
    path = paths.megatron_root() / "train" / "shard_01_tokens.bin"
    path.write_bytes(path.read_bytes()[:-4])
    outcome = run_checks(instance, layout, "synth_kd_v1_manifest")
    assert outcome["manifest_provenance"] is False and outcome["shards_readable_by_megatron"] is False
    assert outcome["no_split_leakage"] is True


def test_swapped_idx_fails_provenance_and_readability(copy_of_build):
    instance, layout, paths = copy_of_build
    train = paths.megatron_root() / "train"
    a, b = train / "shard_01_span.idx", train / "shard_02_span.idx"
    a_bytes, b_bytes = a.read_bytes(), b.read_bytes()
    a.write_bytes(b_bytes)
    b.write_bytes(a_bytes)
    outcome = run_checks(instance, layout, "synth_kd_v1_manifest")
    assert outcome["manifest_provenance"] is False and outcome["shards_readable_by_megatron"] is False


def test_altered_tokenizer_fails_the_pin_and_is_refused(copy_of_build):
    instance, layout, paths = copy_of_build
    tokenizer = paths.tokenizer_file()
    tokenizer.write_bytes(tokenizer.read_bytes() + b"\n")
    assert run_checks(instance, layout, "o200k_tokenizer") == {"tokenizer_sha256_pin": False}
    load_harmony_encoding.cache_clear()
    with pytest.raises(TokenizerPinError):
        load_harmony_encoding(paths.tokenizer_dir())


def test_leaked_synth_id_fails_the_leakage_check(copy_of_build):
    instance, layout, paths = copy_of_build
    documents = paths.documents_table(1)
    table = pl.read_parquet(documents)
    leaked = (
        table.filter(pl.col("split") == "train")
        .head(1)
        .with_columns(split=pl.lit("valid"), document_index=pl.lit(999, pl.Int64))
    )
    pl.concat([table, leaked]).write_parquet(documents)
    outcome = run_checks(instance, layout, "synth_kd_v1_manifest")
    assert outcome["no_split_leakage"] is False


def test_a_validation_row_in_the_dataset_fails_the_validation_check_naming_it(copy_of_build):
    """A held-out row trained on (how: a shard sampled without its cluster decisions) fails the blocking check,
    naming the synth_id, the validation set and the documents table; the other checks still pass."""
    instance, layout, paths = copy_of_build
    trained = pl.read_parquet(paths.documents_table(2))["synth_id"][0]
    kl = pq.read_table(paths.heldout_kl())
    assert kl.num_rows and trained not in kl["synth_id"].to_pylist()
    copy = kl.slice(0, 1).set_column(0, "synth_id", pa.array([trained], pa.string()))
    pq.write_table(pa.concat_tables([copy, kl]), paths.heldout_kl())  # the contract schema kept
    [failed] = [e for e in check_evaluations(instance, layout, "synth_kd_v1_manifest").values() if not e.passed]
    assert failed.check_name == "validation_sets_not_trained"
    assert f"synth_id {trained!r} of heldout_kl.parquet is in shard_02_documents.parquet" in failed.description


def test_edited_input_manifest_fails_provenance(copy_of_build):
    """The dataset manifest pins data/synth_harmony/manifest.json by sha256: editing it is caught.

    Paths are recorded relative to the data root, so the copied build checks against its own files."""
    instance, layout, paths = copy_of_build
    manifest = json.loads(paths.megatron_manifest().read_text())
    assert manifest["input_manifest"]["path"] == "synth_harmony/manifest.json"
    assert manifest["tokenizer"]["path"] == "tokenizer/o200k_base.tiktoken"
    harmony = paths.harmony_manifest()
    assert run_checks(instance, layout, "synth_kd_v1_manifest")["manifest_provenance"] is True
    harmony.write_text(harmony.read_text() + " ")
    assert run_checks(instance, layout, "synth_kd_v1_manifest")["manifest_provenance"] is False


def test_raw_shard_changed_after_the_manifest_fails_the_input_check(copy_of_build, tmp_path):
    instance, _, paths = copy_of_build
    raw = tmp_path / "raw"
    shutil.copytree(SAMPLE_RAW_DIR, raw)
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(paths.data_root))
    assert run_checks(instance, layout, "synth_harmony_manifest") == {"raw_inputs_unchanged": True}
    table = pq.read_table(raw / "synth_004.parquet")
    pq.write_table(table.slice(0, table.num_rows - 1), raw / "synth_004.parquet")
    assert run_checks(instance, layout, "synth_harmony_manifest") == {"raw_inputs_unchanged": False}


def test_synth_id_in_two_shards_fails_the_duplicate_check(copy_of_build):
    """...and a dataset whose blocking check failed does not verify, though its seal still matches, until the
    check passes on it again."""
    instance, layout, paths = copy_of_build
    root, documents = paths.megatron_root(), paths.documents_table(3)
    original = documents.read_bytes()
    first = pl.read_parquet(paths.documents_table(1)).head(1)
    second = pl.read_parquet(documents)
    duplicated = pl.concat([second, first.with_columns(document_index=pl.lit(10_000, pl.Int64))])
    duplicated.write_parquet(documents)
    outcome = run_checks(instance, layout, "synth_kd_v1_manifest")
    assert outcome["no_duplicate_synth_ids"] is False and outcome["no_split_leakage"] is True
    with pytest.raises(
        ManifestError, match=r"blocking check no_duplicate_synth_ids has not passed \(failed [0-9a-f]{64}: FAILED"
    ):
        verify_manifest(root, files=["train/shard_01_tokens.bin"])  # the files a trainer reads are intact
    documents.write_bytes(original)
    assert run_checks(instance, layout, "synth_kd_v1_manifest") == dict.fromkeys(MANIFEST_CHECKS, True)
    verify_manifest(root)
    assert not (root / "manifest.json.checks").exists()


@pytest.mark.parametrize(
    ("asset", "dataset"),
    [
        ("synth_kd_v1_manifest", "megatron_root"),
        ("synth_distill_manifest", "distill_root"),
        ("synth_pool_manifest", "pool_root"),
    ],
)
def test_a_rewritten_manifest_verifies_only_once_its_blocking_checks_pass(copy_of_build, asset, dataset):
    """The manifest's asset writes a pending marker per blocking check before the manifest; a run that writes the
    manifest without its checks (or stops before them) leaves a dataset that does not verify."""
    instance, layout, paths = copy_of_build
    root = getattr(paths, dataset)()
    verify_manifest(root)
    standalone = [dg.AssetCheckKey(dg.AssetKey(asset), name) for name in gating_checks(asset)]
    result = dg.materialize(
        ALL_ASSETS,
        selection=dg.AssetSelection.assets(asset) - dg.AssetSelection.checks(*standalone),
        instance=instance,
        resources=synthkd_resources(layout),
    )
    assert result.success and not {e.check_name for e in result.get_asset_check_evaluations()} & set(
        gating_checks(asset)
    )
    with pytest.raises(ManifestError) as refused:
        verify_manifest(root)
    pending = sorted(p.name for p in (root / "manifest.json.checks").iterdir())
    assert pending and all(f"blocking check {name} has not passed (pending" in str(refused.value) for name in pending)
    checked = dg.materialize(
        ALL_ASSETS,
        selection=dg.AssetSelection.checks(*standalone),
        instance=instance,
        resources=synthkd_resources(layout),
    )
    assert check_outcomes(checked) == dict.fromkeys(pending, True)
    verify_manifest(root)
    assert not (root / "manifest.json.checks").exists()


def test_raw_inputs_unchanged_compares_with_the_hashes_read_at_build_time(tmp_path, sample_shards):
    """A raw shard changed after synth_harmony read it and before the manifest: the manifest records
    the sha256 of the bytes that were read (not of the new file), and raw_inputs_unchanged fails."""

    raw_dir = tmp_path / "raw"
    raw_dir.mkdir()
    raw = raw_dir / "synth_001.parquet"
    table = pq.read_table(sample_shards[0]).slice(0, 20)
    pq.write_table(table, raw)
    read_sha = hashlib.sha256(raw.read_bytes()).hexdigest()
    layout = SynthKDLayout(raw_dir=str(raw_dir), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        run(instance, layout, ["synth_raw_inventory"])
        run(instance, layout, ["synth_harmony"], "synth_001")
        pq.write_table(table.slice(0, 19), raw)  # the shard changes once it has been read
        result = run(instance, layout, ["synth_harmony_manifest"], raise_on_error=False)
    assert check_outcomes(result) == {"raw_inputs_unchanged": False}
    manifest = json.loads(layout.data_layout().harmony_manifest().read_text())
    [entry] = manifest["shards"]
    assert entry["source"]["sha256"] == read_sha != hashlib.sha256(raw.read_bytes()).hexdigest()


# --- the dataset is exactly what its sealed manifest lists ---------------------------------------


def rewrite_json(path, edit) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def provenance_outcomes(instance, layout: SynthKDLayout) -> tuple[bool, bool]:
    return (
        run_checks(instance, layout, "synth_kd_v1_manifest")["manifest_provenance"],
        run_checks(instance, layout, "synth_distill_manifest")["distill_manifest_provenance"],
    )


def test_each_dataset_manifest_shows_where_it_is_and_which_commit_built_it(built_sample):
    instance, layout, _ = built_sample
    paths = layout.data_layout()
    roots = {
        "synth_kd_v1_manifest": paths.megatron_root(),
        "synth_distill_manifest": paths.distill_root(),
        "synth_pool_manifest": paths.pool_root(),
    }
    for asset, root in roots.items():
        metadata = instance.get_latest_materialization_event(dg.AssetKey(asset)).asset_materialization.metadata
        manifest = json.loads((root / constants.MANIFEST_FILENAME).read_text())
        assert metadata["dataset_root"].value == str(root), asset
        dirty = " (dirty)" if manifest["git_dirty"] else ""
        assert metadata["git_sha"].value == manifest["git_sha"] + dirty, asset


def test_every_dataset_file_is_listed_and_the_manifests_are_sealed(copy_of_build):
    _, _, paths = copy_of_build
    for root in (paths.megatron_root(), paths.distill_root()):
        manifest = verify_manifest(root)  # seal, every listed file's bytes and sha256, nothing unlisted
        on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        assert sorted([f["path"] for f in manifest["files"]] + ["manifest.json", "manifest.json.sha256"]) == on_disk
    kd = json.loads(paths.megatron_manifest().read_text())
    listed = {f["path"] for f in kd["files"]}
    assert {"shards/shard_01.json", "shards/shard_01_documents.parquet", "train/shard_01_tokens.bin"} <= listed


def test_the_validation_sets_are_sealed_like_the_datasets(copy_of_build):
    """Each set's file is the one its manifest records, the manifest is the one its seal names, nothing else is
    there: a torn, edited or other build's held-out slice is refused by the readers (train_online_kd)."""
    _, _, paths = copy_of_build
    root = paths.validation_root()
    manifest = verify_manifest(root)
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert on_disk == ["format_suite.parquet", "heldout_kl.parquet", "manifest.json", "manifest.json.sha256"]
    assert {record["path"] for record in manifest["sets"].values()} == {"format_suite.parquet", "heldout_kl.parquet"}

    (root / "stray.parquet").write_bytes(b"")
    with pytest.raises(ManifestError, match=r"stray.parquet is not listed in the manifest"):
        verify_manifest(root)
    (root / "stray.parquet").unlink()
    kl = bytearray((root / "heldout_kl.parquet").read_bytes())
    kl[len(kl) // 2] ^= 0xFF
    (root / "heldout_kl.parquet").write_bytes(bytes(kl))
    with pytest.raises(ManifestError, match=r"heldout_kl.parquet differs from the manifest \(sha256"):
        verify_manifest(root, files=["heldout_kl.parquet"])
    verify_manifest(root, files=["format_suite.parquet"])  # the other set is intact

    def edit(value):
        value["sets"]["kl"]["sha256"] = sha256_file(root / "heldout_kl.parquet")  # an edit to match the file

    rewrite_json(root / constants.MANIFEST_FILENAME, edit)
    with pytest.raises(ManifestError, match="does not match its seal"):
        verify_manifest(root, files=["heldout_kl.parquet"])


@pytest.mark.parametrize("dataset", ["synth_kd_v1", "synth_distill"])
def test_hand_edited_manifest_totals_fail_provenance(copy_of_build, dataset):
    instance, layout, paths = copy_of_build
    root = paths.megatron_root() if dataset == "synth_kd_v1" else paths.distill_root()
    assert provenance_outcomes(instance, layout) == (True, True)

    def edit(manifest):
        manifest["totals"]["rows_out"] += 1

    rewrite_json(root / constants.MANIFEST_FILENAME, edit)
    assert provenance_outcomes(instance, layout) == ((dataset != "synth_kd_v1"), (dataset != "synth_distill"))
    with pytest.raises(ManifestError, match="does not match its seal"):
        verify_manifest(root)


def test_an_edited_synth_id_in_a_documents_table_fails_provenance(copy_of_build):
    instance, layout, paths = copy_of_build
    documents = paths.documents_table(1)
    table = pl.read_parquet(documents)
    edited = table.with_columns(
        synth_id=pl.when(pl.int_range(pl.len()) == 0).then(pl.lit("edited")).otherwise(pl.col("synth_id"))
    )
    edited.write_parquet(documents)
    outcome = run_checks(instance, layout, "synth_kd_v1_manifest")
    assert outcome["manifest_provenance"] is False and outcome["no_split_leakage"] is True


def test_every_file_with_a_flipped_byte_is_named_in_order(copy_of_build):
    """Bytes unchanged, contents not: the sha256 comparison (hashed on several threads) names each such file, in
    the manifest's path order, with both digests. (The sample's valid split may hold no sequence, so no valid/
    file: a shard's documents table stands for a file of another directory.)"""
    _, _, paths = copy_of_build
    root = paths.megatron_root()
    flipped = ["train/shard_03_tokens.bin", "train/shard_01_span.bin", "shards/shard_02_documents.parquet"]
    for name in flipped:
        data = bytearray((root / name).read_bytes())
        data[len(data) // 2] ^= 0xFF
        (root / name).write_bytes(bytes(data))
    with pytest.raises(ManifestError) as raised:
        verify_manifest(root)
    named = [problem.split(" differs")[0] for problem in str(raised.value).split("; ")]
    assert named == [str(root / name) for name in sorted(flipped)]


def test_an_edited_shard_record_fails_provenance(copy_of_build):
    instance, layout, paths = copy_of_build
    rewrite_json(paths.shard_record(2), lambda r: r["report"].update(rows_out=0))
    assert run_checks(instance, layout, "synth_kd_v1_manifest")["manifest_provenance"] is False


@pytest.mark.parametrize("dataset", ["synth_kd_v1", "synth_distill"])
def test_a_file_the_manifest_does_not_list_fails_provenance(copy_of_build, dataset):
    """A stray file under a dataset root (another build's shard, a copy, a leftover) is not part of it."""
    instance, layout, paths = copy_of_build
    if dataset == "synth_kd_v1":
        train = paths.megatron_root() / "train"
        shutil.copy(train / "shard_01_span.bin", train / "shard_09_span.bin")
    else:
        train = paths.distill_root() / "train"
        shutil.copy(train / "part-00001.parquet", train / "part-00009.parquet")
    assert provenance_outcomes(instance, layout) == ((dataset != "synth_kd_v1"), (dataset != "synth_distill"))


def prompts(path, with_ids: bool = False) -> list:
    """The user prompt of every row of a synth_harmony_v1 file (with its synth_id)."""
    frame = pl.read_parquet(path, columns=["synth_id", "messages_json"])
    texts = [json.loads(m)["messages"][1]["content"][0]["text"] for m in frame["messages_json"]]
    return list(zip(frame["synth_id"], texts)) if with_ids else texts


def test_a_shard_added_after_the_clusters_warns_that_it_is_sampled_whole(copy_of_build, tmp_path):
    """A new raw shard is sampled without the clusters' decisions until a re-plan: near_dup_controlled WARNs on
    its synth_sampled (the run still succeeds) and passes on a shard the clusters saw."""
    instance, _, paths = copy_of_build
    raw = tmp_path / "raw"
    shutil.copytree(SAMPLE_RAW_DIR, raw)
    table = pl.read_parquet(raw / "synth_004.parquet")
    table.with_columns(pl.col("synth_id") + "_new").write_parquet(raw / "synth_007.parquet")
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(paths.data_root))
    run(instance, layout, ["synth_raw_inventory"])
    run(instance, layout, ["synth_harmony", "synth_filtered", "synth_signatures"], "synth_007")

    def near_dup_controlled(partition: str):
        result = run(instance, layout, ["synth_sampled"], partition)
        [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == "near_dup_controlled"]
        return evaluation

    added = near_dup_controlled("synth_007")
    kept = pl.read_parquet(paths.stage_output("synth_sampled", "synth_007")).height
    filtered = pl.read_parquet(paths.stage_output("synth_filtered", "synth_007")).height
    # no cap; but the copies of synth_004's held-out rows (the same MinHash signature) are held out, so
    # no validation prompt reaches training under a new synth_id. The plan's mixture sampling applies to the new
    # synth_ids as to any row (the sample's memorization keep rate is below 1): its drops are the only others
    decisions = pl.read_parquet(paths.stage_output("synth_clusters", "synth_004"), columns=["synth_id", "decision"])
    held = set(decisions.filter(pl.col("decision") == drops.DROP_HELDOUT)["synth_id"])
    report = json.loads(paths.stage_report("synth_sampled", "synth_007").read_text())
    dropped = report["dropped"]
    sampled_out = {reason: rows for reason, rows in dropped.items() if reason in drops.DROP_SAMPLED_OUT.values()}
    assert held and dropped == {drops.DROP_HELDOUT: len(held), **sampled_out}
    assert kept == filtered - sum(dropped.values())
    errors = [json.loads(line) for line in paths.error_log("synth_sampled", "synth_007").read_text().splitlines()]
    assert {e["synth_id"] for e in errors if e["reason"] == drops.DROP_HELDOUT} == {f"{i}_new" for i in held}
    sampled_prompts = set(prompts(paths.stage_output("synth_sampled", "synth_007")))
    heldout_prompts = {p for i, p in prompts(paths.stage_output("synth_filtered", "synth_004"), True) if i in held}
    assert not sampled_prompts & heldout_prompts
    assert not added.passed and added.severity == dg.AssetCheckSeverity.WARN
    assert added.description.startswith(f"partition synth_007: WARN: {filtered} of {filtered} rows are not in the")
    assert f"{len(held)} rows outside the held-out clusters have a held-out prompt" in added.description
    assert added.metadata["rows_unseen_by_clusters"].value == filtered
    assert added.metadata["heldout_copies"].value == len(held)
    assert near_dup_controlled("synth_004").passed

    # a shard changed in place under new synth_ids: only the rows the clusters never saw are counted
    changed = pl.read_parquet(raw / "synth_002.parquet").with_row_index()
    renamed = pl.when(pl.col("index") < 10).then(pl.col("synth_id") + "_v2").otherwise(pl.col("synth_id"))
    changed.with_columns(synth_id=renamed).drop("index").write_parquet(raw / "synth_002.parquet")
    run(instance, layout, ["synth_raw_inventory"])  # the new bytes reported as synth_raw's version
    run(instance, layout, ["synth_harmony", "synth_filtered", "synth_signatures"], "synth_002")
    evaluation = near_dup_controlled("synth_002")
    assert not evaluation.passed and 0 < evaluation.metadata["rows_unseen_by_clusters"].value <= 10


def test_the_kd_manifest_checks_read_no_trio_its_shards_hashed_and_validated_when_written(
    built_sample, own_instance, tmp_path, monkeypatch
):
    """Built in this instance, every trio's bytes are those its shard hashed and its trio_alignment passed on:
    manifest_provenance hashes none of the trio files and shards_readable_by_megatron reads no split. One .bin
    rewritten in place since (a token id's high byte flipped, size and mtime kept): that file is hashed, that split
    read, and both checks fail."""
    instance, (_, _, data_dir) = own_instance, built_sample
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path / "data"))
    paths = layout.data_layout()
    root = paths.megatron_root()
    shutil.copytree(data_dir, paths.data_root, ignore=shutil.ignore_patterns(root.parent.name))
    shards = ["synth_001", "synth_002", "synth_003", "synth_004", "synth_005", "synth_006"]
    for key in shards:
        run(instance, layout, ["synth_kd_v1"], key)
    run(instance, layout, ["synth_kd_v1_manifest"])
    hashed: list[str] = []

    def counted(path, *args, **kwargs):
        hashed.append(Path(path).relative_to(root).as_posix() if Path(path).is_relative_to(root) else str(path))
        return sha256_file(path, *args, **kwargs)

    monkeypatch.setattr(manifest_seal, "sha256_file", counted)
    evaluations = check_evaluations(instance, layout, "synth_kd_v1_manifest")
    assert {name: e.passed for name, e in evaluations.items()} == dict.fromkeys(MANIFEST_CHECKS, True)
    assert [name for name in hashed if name.endswith((".bin", ".idx"))] == []
    assert evaluations["shards_readable_by_megatron"].metadata["splits_read"].value == 0
    assert evaluations["manifest_provenance"].metadata["files_read"].value == 0

    tokens = root / "train" / "shard_03_tokens.bin"
    before = tokens.stat()
    time.sleep(0.05)  # past the kernel's timestamp tick: the rewrite gets a new ctime
    data = bytearray(tokens.read_bytes())
    data[len(data) // 8 * 4 + 3] ^= 0xFF  # the high byte of an int32 token id: now outside the vocabulary
    with open(tokens, "r+b") as handle:
        handle.write(bytes(data))
    os.utime(tokens, ns=(before.st_atime_ns, before.st_mtime_ns))
    hashed.clear()
    evaluations = check_evaluations(instance, layout, "synth_kd_v1_manifest")
    assert not evaluations["manifest_provenance"].passed and not evaluations["shards_readable_by_megatron"].passed
    assert "train/shard_03_tokens.bin" in evaluations["manifest_provenance"].description
    assert [name for name in hashed if name.endswith((".bin", ".idx"))] == ["train/shard_03_tokens.bin"]
    assert evaluations["shards_readable_by_megatron"].metadata["splits_read"].value == 1
    assert evaluations["manifest_provenance"].metadata["files_read"].value == 1
