"""SpanGPTDataset against a slow reference that walks the raw arrays of real shards.

Shards are written with the project's MegatronShardWriter; samples are drawn through megatron-core's
BlendedMegatronDatasetBuilder on CPU, with its own document / sample / shuffle indices (cached on
disk). The reference concatenates the documents the test generated, in Megatron's epoch order, and
slices that: it never goes through IndexedDataset or the dataset's reading code.
"""

from __future__ import annotations

import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from megatron.core.datasets.blended_dataset import BlendedDataset
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from synthkd_assets.core.dataset_manifest import files_section, write_sealed_manifest
from synthkd_contract import constants, manifest_seal
from synthkd_contract.manifest_seal import ManifestError, file_record, verify_manifest
from synthkd_contract.trio import validate_trio
from synthkd_training.dataset import (
    O200kHarmonyIds,
    SpanDatasetError,
    SpanGPTDataset,
    SpanGPTDatasetConfig,
    build_span_datasets,
    tokens_prefixes,
    train_valid_datasets,
)
from synthkd_training.synthetic import (
    Document,
    synthetic_document,
    write_documents,
    write_synthetic_dataset,
    write_synthetic_split,
)

PAD = O200kHarmonyIds.pad


def _reference_item(documents: list[Document], dataset: SpanGPTDataset, idx: int) -> dict[str, np.ndarray]:
    """What item `idx` must be, from the raw documents and Megatron's index arrays only."""
    config = dataset.config
    length, extra = config.sequence_length, int(config.add_extra_token_to_sequence)
    ordered = [documents[int(d)] for d in dataset.document_index]
    cat = {
        "tokens": np.concatenate([d.tokens for d in ordered]).astype(np.int64),
        "loss_mask": np.concatenate([d.loss_mask for d in ordered]).astype(np.int64),
        "span_id": np.concatenate([d.span_id for d in ordered]).astype(np.int64),
    }
    starts = np.concatenate([[0], np.cumsum([len(d.tokens) for d in ordered])])
    j = int(dataset.shuffle_index[idx])
    (doc_beg, off_beg), (doc_end, off_end) = dataset.sample_index[j], dataset.sample_index[j + 1]
    begin, end = int(starts[doc_beg] + off_beg), int(starts[doc_end] + off_end)
    assert 0 < end - begin <= length
    text = np.full(length + extra, PAD, dtype=np.int64)
    piece = cat["tokens"][begin : end + extra]
    text[: len(piece)] = piece
    if extra:
        tokens, labels = text[:-1].copy(), text[1:].copy()
    else:
        tokens, labels = text.copy(), np.append(text[1:], PAD)
    # label-aligned: stored[begin + i] describes token begin + i + 1 = labels[i]
    masks = {}
    for kind in ("loss_mask", "span_id"):
        window = np.zeros(length, dtype=np.int64)
        stored = cat[kind][begin : begin + length]
        window[: len(stored)] = stored
        window[labels == PAD] = 0
        masks[kind] = window
    tokens[tokens == PAD] = 0
    labels[labels == PAD] = 0
    return {"tokens": tokens, "labels": labels, **masks, "sample_length": end - begin}


def _check_all_items(dataset, documents: list[Document]) -> int:
    partial = 0
    for idx in range(len(dataset)):
        item = dataset[idx]
        expected = _reference_item(documents, dataset, idx)
        for key in ("tokens", "labels", "span_id"):
            assert item[key].dtype == torch.int64
            np.testing.assert_array_equal(item[key].numpy(), expected[key], err_msg=f"{key} of item {idx}")
        assert item["loss_mask"].dtype == torch.float32
        np.testing.assert_array_equal(
            item["loss_mask"].numpy(), expected["loss_mask"], err_msg=f"loss_mask of item {idx}"
        )
        # the contract: masked exactly where span_id == 0
        np.testing.assert_array_equal(item["loss_mask"].numpy() == 0, item["span_id"].numpy() == 0)
        partial += expected["sample_length"] < dataset.config.sequence_length
    return partial


def _config(cache: Path, **overrides) -> SpanGPTDatasetConfig:
    fields = dict(random_seed=1234, sequence_length=64, path_to_cache=str(cache))
    fields.update(overrides)
    return SpanGPTDatasetConfig(**fields)


def _plain_gpt_items(config: SpanGPTDatasetConfig, sizes):
    """The same split through megatron-core's own GPTDataset (same seed, same indices)."""
    plain = GPTDatasetConfig(
        random_seed=config.random_seed,
        sequence_length=config.sequence_length,
        blend_per_split=config.blend_per_split,
        path_to_cache=config.path_to_cache,
        tokenizer=config.tokenizer,
        reset_position_ids=config.reset_position_ids,
        reset_attention_mask=config.reset_attention_mask,
        eod_mask_loss=config.eod_mask_loss,
        add_extra_token_to_sequence=config.add_extra_token_to_sequence,
        drop_last_partial_validation_sequence=config.drop_last_partial_validation_sequence,
    )
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, plain).build()


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory) -> tuple[Path, dict[str, list[Document]]]:
    split_dir = tmp_path_factory.mktemp("data") / "train"
    written = write_synthetic_split(split_dir, shards=2, documents_per_shard=40, seed=7)
    for prefix in written:
        assert validate_trio(prefix) == []
    return split_dir, written


@pytest.mark.parametrize(
    "sequence_length, extra, reset",
    [(64, True, False), (7, True, False), (64, False, False), (23, True, True), (31, False, True)],
)
def test_every_item_matches_the_raw_arrays(two_shards, tmp_path, sequence_length, extra, reset):
    split_dir, written = two_shards
    train_prefix, valid_prefix = tokens_prefixes(split_dir)
    config = _config(
        tmp_path / "cache",
        sequence_length=sequence_length,
        blend_per_split=[([train_prefix], None), ([valid_prefix], None), None],
        add_extra_token_to_sequence=extra,
        reset_position_ids=reset,
        reset_attention_mask=reset,
        drop_last_partial_validation_sequence=False,  # the valid split pads its last sample
    )
    tokens_per_epoch = sum(len(d.tokens) for d in written[train_prefix])
    train_samples = 3 * tokens_per_epoch // sequence_length  # about three epochs
    sizes = [train_samples, None, None]
    train, valid, test = build_span_datasets(config, sizes)
    assert isinstance(train, SpanGPTDataset) and isinstance(valid, SpanGPTDataset) and test is None
    assert len(train) >= train_samples
    assert len(train.document_index) >= 3 * len(written[train_prefix])  # several epochs really drawn
    # samples do cross document boundaries
    crossing = sum(int(train.sample_index[i][0] != train.sample_index[i + 1][0]) for i in range(len(train)))
    assert crossing > 0

    assert _check_all_items(train, written[train_prefix]) == 0
    # the valid split keeps (and pads) its last partial sample, when there is one
    valid_tokens = sum(len(d.tokens) for d in written[valid_prefix])
    assert _check_all_items(valid, written[valid_prefix]) == int((valid_tokens - extra) % sequence_length != 0)

    # everything but the masks is what megatron-core's own GPTDataset gives for the same index
    plain_train, plain_valid, _ = _plain_gpt_items(config, sizes)
    for ours, theirs in ((train, plain_train), (valid, plain_valid)):
        assert len(ours) == len(theirs)
        for idx in range(len(ours)):
            a, b = ours[idx], theirs[idx]
            assert set(a) == set(b) | {"span_id"}
            for key in ("tokens", "labels", "position_ids", "attention_mask"):
                assert torch.equal(a[key], b[key]), (key, idx)
            # ours only ever removes positions from megatron's loss mask
            assert torch.all(a["loss_mask"] <= b["loss_mask"])


def test_index_cache_is_megatrons_and_reused(two_shards, tmp_path):
    split_dir, written = two_shards
    prefix = tokens_prefixes(split_dir)[0]
    config = _config(tmp_path / "cache", blend_per_split=[([prefix], None), None, None])
    first = build_span_datasets(config, [30, None, None])[0]
    cached = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert {name.split("-", 1)[1] for name in cached} == {
        f"SpanGPTDataset-train-{affix}"
        for affix in ("description.txt", "document_index.npy", "sample_index.npy", "shuffle_index.npy")
    }
    mtimes = {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()}
    second = build_span_datasets(config, [30, None, None])[0]
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "cache").iterdir()} == mtimes  # loaded, not rebuilt
    for idx in range(len(first)):
        assert all(torch.equal(first[idx][k], second[idx][k]) for k in first[idx])
    # pickling (DataLoader workers) keeps the items
    clone = pickle.loads(pickle.dumps(second))
    for idx in range(len(second)):
        assert all(torch.equal(clone[idx][k], second[idx][k]) for k in second[idx])
    batch = next(iter(torch.utils.data.DataLoader(second, batch_size=4)))
    assert batch["span_id"].shape == batch["labels"].shape == (4, config.sequence_length)
    # megatron's "batch padding" item (idx None) is fully masked
    padding = second[None]
    assert not padding["loss_mask"].any() and not padding["span_id"].any()


def test_blend_of_two_shards(two_shards, tmp_path, gloo_world):
    split_dir, written = two_shards
    prefixes = tokens_prefixes(split_dir)
    config = _config(tmp_path / "cache", sequence_length=32, blend=(prefixes, [0.3, 0.7]), split="100,0,0")
    train, valid, test = build_span_datasets(config, [60, 0, 0])
    assert isinstance(train, BlendedDataset) and valid is None and test is None
    assert len(train) >= 60
    seen = set()
    for idx in range(len(train)):
        item = train[idx]
        dataset_id = int(train.dataset_index[idx])
        assert item["dataset_id"] == dataset_id
        member = train.datasets[dataset_id]
        expected = _reference_item(written[member.dataset_path], member, int(train.dataset_sample_index[idx]))
        for key in ("tokens", "labels", "loss_mask", "span_id"):
            np.testing.assert_array_equal(item[key].numpy(), expected[key], err_msg=f"{key} of blended item {idx}")
        seen.add(dataset_id)
    assert seen == {0, 1}


def test_blend_with_cache_needs_a_process_group(two_shards, tmp_path):
    split_dir, _ = two_shards
    config = _config(tmp_path / "cache", blend=(tokens_prefixes(split_dir), [0.5, 0.5]), split="100,0,0")
    with pytest.raises(ValueError, match="init_process_group"):
        build_span_datasets(config, [10, 0, 0])


# -- fail fast ------------------------------------------------------------------------------
def _documents(seed: int, count: int = 12) -> list[Document]:
    rng = np.random.default_rng(seed)
    return [synthetic_document(rng, min_tokens=5, max_tokens=30) for _ in range(count)]


def _build(prefix: str, tmp_path: Path):
    config = _config(tmp_path / "cache", sequence_length=16, blend_per_split=[([prefix], None), None, None])
    return build_span_datasets(config, [5, None, None])


def _expect_error(prefix: str, tmp_path: Path, pattern: str) -> None:
    with pytest.raises(SpanDatasetError) as caught:
        _build(prefix, tmp_path)
    message = str(caught.value)
    assert prefix in message, message
    assert re.search(pattern, message), message
    # nothing was built or cached for a broken trio
    assert not (tmp_path / "cache").exists()


def _replace_files(split_dir: Path, kind: str, source_dir: Path) -> None:
    for ext in (".bin", ".idx"):
        name = f"{constants.shard_prefix_name(0, kind)}{ext}"
        shutil.copyfile(source_dir / name, split_dir / name)


def _write_array(split_dir: Path, kind: str, documents: list[Document], dtype) -> None:
    """Overwrite one array of shard 0 with megatron's builder, in any dtype."""
    prefix = split_dir / constants.shard_prefix_name(0, kind)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for document in documents:
        array = {"tokens": document.tokens, "lossmask": document.loss_mask, "span": document.span_id}[kind]
        builder.add_document(np.asarray(array, dtype=dtype), [len(array)])
    builder.finalize(f"{prefix}.idx")


def test_sound_trio_builds(tmp_path):
    prefix = write_documents(tmp_path / "train", 0, _documents(1))
    assert _build(prefix, tmp_path)[0] is not None


def test_span_with_other_document_lengths_fails(tmp_path):
    prefix = write_documents(tmp_path / "train", 0, _documents(1))
    write_documents(tmp_path / "other", 0, _documents(2))  # same count, other lengths
    _replace_files(tmp_path / "train", "span", tmp_path / "other")
    _expect_error(prefix, tmp_path, r"span sequence_lengths differ from tokens")


def test_span_with_other_document_count_fails(tmp_path):
    prefix = write_documents(tmp_path / "train", 0, _documents(1))
    write_documents(tmp_path / "other", 0, _documents(1, count=11))
    _replace_files(tmp_path / "train", "span", tmp_path / "other")
    _expect_error(prefix, tmp_path, r"span has 11 sequences, tokens has 12")


def test_lossmask_document_indices_differ_fails(tmp_path):
    documents = _documents(1)
    prefix = write_documents(tmp_path / "train", 0, documents)
    # same sequences, grouped into other documents
    lossmask = tmp_path / "train" / constants.shard_prefix_name(0, "lossmask")
    builder = IndexedDatasetBuilder(f"{lossmask}.bin", dtype=constants.LOSSMASK_DTYPE)
    for first, second in zip(documents[::2], documents[1::2]):
        builder.add_document(
            np.concatenate([first.loss_mask, second.loss_mask]), [len(first.loss_mask), len(second.loss_mask)]
        )
    builder.finalize(f"{lossmask}.idx")
    _expect_error(prefix, tmp_path, r"lossmask document_indices differ")


def _supervised(documents: list[Document], nth: int) -> int:
    """Index of the nth document with at least one supervised position."""
    return [i for i, d in enumerate(documents) if d.span_id.any()][nth]


def test_span_value_out_of_domain_fails(tmp_path):
    documents = _documents(1)
    index = _supervised(documents, 2)
    bad = documents[index]
    span = bad.span_id.copy()
    position = int(np.flatnonzero(span)[0])
    span[position] = 3
    documents[index] = Document(bad.tokens, bad.loss_mask, span)
    prefix = write_documents(tmp_path / "train", 0, documents)
    _expect_error(prefix, tmp_path, rf"span value 3 outside \[0, 2\].*sequence {index}, position {position}")


def test_lossmask_value_out_of_domain_fails(tmp_path):
    documents = _documents(1)
    index = _supervised(documents, 1)
    bad = documents[index]
    mask = bad.loss_mask.copy()
    mask[np.flatnonzero(mask)[0]] = 2
    documents[index] = Document(bad.tokens, mask, bad.span_id)
    prefix = write_documents(tmp_path / "train", 0, documents)
    _expect_error(prefix, tmp_path, rf"lossmask value 2 outside \[0, 1\].*sequence {index}")


def test_lossmask_and_span_disagreeing_fails(tmp_path):
    documents = _documents(1)
    bad = documents[0]
    mask = bad.loss_mask.copy()
    mask[0] = 1  # a prompt label position (span 0) marked as supervised
    documents[0] = Document(bad.tokens, mask, bad.span_id)
    prefix = write_documents(tmp_path / "train", 0, documents)
    _expect_error(prefix, tmp_path, r"lossmask == 0 and span == 0 disagree")


def test_eod_position_supervised_fails(tmp_path):
    documents = _documents(1)
    bad = documents[3]
    mask, span = bad.loss_mask.copy(), bad.span_id.copy()
    mask[-1], span[-1] = 1, constants.SPAN_FINAL
    documents[3] = Document(bad.tokens, mask, span)
    prefix = write_documents(tmp_path / "train", 0, documents)
    _expect_error(prefix, tmp_path, r"last \(EOD\) position of 1 documents is not 0/0")


def test_span_dtype_mismatch_fails(tmp_path):
    documents = _documents(1)
    prefix = write_documents(tmp_path / "train", 0, documents)
    _write_array(tmp_path / "train", "span", documents, np.int32)
    _expect_error(prefix, tmp_path, r"span dtype is int32, the contract says uint8")


def test_tokens_dtype_mismatch_fails(tmp_path):
    documents = _documents(1)
    prefix = write_documents(tmp_path / "train", 0, documents)
    _write_array(tmp_path / "train", "tokens", documents, np.int64)
    _expect_error(prefix, tmp_path, r"tokens dtype is int64, the contract says int32")


def test_truncated_lossmask_bin_fails(tmp_path):
    prefix = write_documents(tmp_path / "train", 0, _documents(1))
    path = tmp_path / "train" / f"{constants.shard_prefix_name(0, 'lossmask')}.bin"
    path.write_bytes(path.read_bytes()[:-1])
    _expect_error(prefix, tmp_path, r"lossmask data file .* holds \d+ bytes, its index describes \d+")


def test_missing_sibling_fails(tmp_path):
    prefix = write_documents(tmp_path / "train", 0, _documents(1))
    (tmp_path / "train" / f"{constants.shard_prefix_name(0, 'span')}.idx").unlink()
    _expect_error(prefix, tmp_path, r"shard_00_span\.idx is missing")


def test_prefix_must_name_the_tokens_dataset(tmp_path):
    write_documents(tmp_path / "train", 0, _documents(1))
    prefix = str(tmp_path / "train" / constants.shard_prefix_name(0, "span"))
    with pytest.raises(SpanDatasetError, match=re.escape(prefix)):
        _config(tmp_path / "cache", blend_per_split=[([prefix], None), None, None])


def test_config_rejects_mock_and_foreign_eod(tmp_path):
    with pytest.raises(ValueError, match="needs real data"):
        SpanGPTDatasetConfig(random_seed=1, sequence_length=8)

    class OtherTokenizer(O200kHarmonyIds):
        eod = 0

    prefix = write_documents(tmp_path / "train", 0, _documents(1))
    with pytest.raises(ValueError, match="199999"):
        _config(tmp_path / "cache", blend_per_split=[([prefix], None), None, None], tokenizer=OtherTokenizer())


# -- the dataset manifest: sealed, and every file's sha256 ---------------------------------------
def _sealed_dataset(root: Path) -> str:
    """One trio under `root/train` with a manifest listing its six files, sealed by its sidecar (what
    synth_kd_v1_manifest writes, through the same dagster-free functions)."""
    prefix = write_documents(root / "train", 0, _documents(3))
    files = files_section(file_record(root, path) for path in sorted((root / "train").iterdir()))
    write_sealed_manifest(root / "manifest.json", {"dataset": constants.DATASET_NAME, "files": files})
    return prefix


def test_a_sealed_dataset_builds_with_and_without_verify(tmp_path):
    prefix = _sealed_dataset(tmp_path / "root")
    assert verify_manifest(tmp_path / "root")["dataset"] == constants.DATASET_NAME
    assert _build(prefix, tmp_path)[0] is not None
    config = _config(
        tmp_path / "cache2", sequence_length=16, blend_per_split=[([prefix], None), None, None], verify=True
    )
    assert build_span_datasets(config, [5, None, None])[0] is not None


def test_a_flipped_byte_in_a_tokens_bin_is_found_with_verify(tmp_path):
    prefix = _sealed_dataset(tmp_path / "root")
    path = Path(f"{prefix}.bin")
    payload = bytearray(path.read_bytes())
    payload[len(payload) // 2] ^= 0x01  # same size: only the sha256 tells
    path.write_bytes(bytes(payload))
    config = _config(
        tmp_path / "cache", sequence_length=16, blend_per_split=[([prefix], None), None, None], verify=True
    )
    with pytest.raises(SpanDatasetError, match=re.escape(f"{path} differs from the manifest (sha256")):
        build_span_datasets(config, [5, None, None])
    assert not (tmp_path / "cache").exists()


def test_an_edited_manifest_is_refused_even_without_verify(tmp_path):
    prefix = _sealed_dataset(tmp_path / "root")
    manifest = tmp_path / "root" / "manifest.json"
    manifest.write_text(manifest.read_text().replace(f'"{constants.DATASET_NAME}"', '"edited"'))
    _expect_error(prefix, tmp_path, r"manifest\.json does not match its seal manifest\.json\.sha256")
    with pytest.raises(ManifestError, match="does not match its seal"):
        verify_manifest(tmp_path / "root")


def test_a_file_of_another_size_than_listed_is_refused_even_without_verify(tmp_path):
    prefix = _sealed_dataset(tmp_path / "root")
    path = Path(f"{prefix}.bin")
    path.write_bytes(path.read_bytes() + bytes(4))
    _expect_error(prefix, tmp_path, re.escape(f"{path} has ") + r"\d+ bytes, the manifest records \d+")


def test_verify_needs_a_manifest(tmp_path):
    prefix = write_documents(tmp_path / "train", 0, _documents(1))
    config = _config(
        tmp_path / "cache", sequence_length=16, blend_per_split=[([prefix], None), None, None], verify=True
    )
    with pytest.raises(SpanDatasetError, match=r"manifest\.json is missing"):
        build_span_datasets(config, [5, None, None])


def test_a_truncated_tokens_idx_names_the_file(tmp_path):
    prefix = write_documents(tmp_path / "train", 0, _documents(1))
    path = Path(f"{prefix}.idx")
    path.write_bytes(path.read_bytes()[:40])
    _expect_error(prefix, tmp_path, re.escape(f"{path}: tokens index not readable by megatron-core"))


def _sealed_shards(root: Path, count: int) -> list[str]:
    """`count` trios under `root/train`, all listed in a sealed manifest."""
    prefixes = [write_documents(root / "train", shard, _documents(shard + 3)) for shard in range(count)]
    files = files_section(file_record(root, path) for path in sorted((root / "train").iterdir()))
    write_sealed_manifest(root / "manifest.json", {"dataset": constants.DATASET_NAME, "files": files})
    return prefixes


@pytest.mark.parametrize("removed", [".idx", ".bin", "_lossmask.bin"])
def test_a_dataset_short_of_a_shard_its_manifest_lists_is_refused(tmp_path, removed):
    """Globbing `.idx` files alone would train on the shards left (a build killed between removing a shard's
    files and rewriting the manifest, a deleted file) as if the dataset were whole."""
    root = tmp_path / "root"
    prefixes = _sealed_shards(root, 3)
    assert tokens_prefixes(root / "train") == prefixes
    gone = Path(prefixes[1].removesuffix("_tokens") + ("_tokens" if removed.startswith(".") else "") + removed)
    gone.unlink()
    with pytest.raises(SpanDatasetError, match=re.escape(f"{gone} is listed in the manifest but missing")):
        tokens_prefixes(root / "train")
    with pytest.raises(SpanDatasetError, match=re.escape(f"{gone} is listed in the manifest but missing")):
        train_valid_datasets(
            root, sequence_length=16, seed=1, train_samples=4, valid_samples=None, cache_dir=tmp_path / "cache"
        )


def test_a_trio_the_manifest_does_not_list_is_refused(tmp_path):
    root = tmp_path / "root"
    _sealed_shards(root, 2)
    stray = write_documents(root / "train", 7, _documents(9))
    with pytest.raises(SpanDatasetError, match=re.escape(f"{stray}.idx is not listed in the manifest")):
        tokens_prefixes(root / "train")


def test_a_root_without_its_manifest_is_not_trained_on(tmp_path, gloo_world):
    """A build stopped before its manifest pass leaves trios and no manifest: not a dataset to train on."""
    write_synthetic_split(tmp_path / "root" / "train", shards=2, documents_per_shard=6, seed=1)
    with pytest.raises(SpanDatasetError, match=r"no manifest.json in .*root: not a finished synth_kd_v1 build"):
        train_valid_datasets(
            tmp_path / "root", sequence_length=16, seed=1, train_samples=4, valid_samples=None, cache_dir=tmp_path / "c"
        )
    write_synthetic_dataset(tmp_path / "synthetic", seed=1)  # the examples' data: sealed like a build's, and
    synthetic = write_synthetic_dataset(tmp_path / "synthetic", seed=1)  # again in the same --work-dir
    assert {f["path"] for f in verify_manifest(synthetic)["files"]} >= {
        "train/shard_00_tokens.bin",
        "valid/shard_00_span.idx",
    }
    train, valid = train_valid_datasets(
        synthetic, sequence_length=16, seed=1, train_samples=4, valid_samples=None, cache_dir=tmp_path / "cache"
    )
    assert len(train) >= 4 and valid is not None


def _sealed_root(root: Path, shard_documents: dict[str, list[int]], dataset: str = constants.DATASET_NAME) -> None:
    """A sealed root whose `split` holds one trio per entry, of documents of the given token counts."""
    rng = np.random.default_rng(0)
    for split, sizes in shard_documents.items():
        for shard, count in enumerate(sizes):
            documents = [synthetic_document(rng, min_tokens=20, max_tokens=40) for _ in range(count)]
            write_documents(root / split, shard, documents)
    paths = sorted(p for split in shard_documents for p in (root / split).iterdir())
    write_sealed_manifest(
        root / "manifest.json", {"dataset": dataset, "files": files_section(file_record(root, p) for p in paths)}
    )


def _shard_tokens(split_dir: Path) -> np.ndarray:
    """Tokens per shard, read back by megatron-core's reader (the oracle: not the code under test)."""
    readers = [IndexedDataset(p) for p in tokens_prefixes(split_dir)]  # alive while their mapped index is read
    return np.array([reader.sequence_lengths.sum() for reader in readers], dtype=float)


def test_train_draws_its_shards_by_their_tokens_past_one_epoch_and_valid_takes_one_epoch(tmp_path, gloo_world):
    """Shards of very different sizes (an anchor source beside SYNTH's shards, a partial last shard) are drawn in
    proportion to their tokens, as the build mixed them, not equally: equal weights drew a 40x smaller shard as
    often as a large one. Valid (no sample count) is one epoch: every shard's documents once, a shard shorter
    than one sample as one padded sample (an unweighted blend refused it; a weighted one repeated it to fill)."""
    root = tmp_path / "root"
    _sealed_root(root, {"train": [200, 5, 60], "valid": [30, 1, 12]})
    sequence_length = 64
    train, valid = train_valid_datasets(
        root, sequence_length=sequence_length, seed=3, train_samples=4000, valid_samples=None, cache_dir=tmp_path / "c"
    )
    tokens = _shard_tokens(root / "train")
    drawn = np.bincount(np.asarray(train.dataset_index)[:4000], minlength=len(tokens))
    wanted = 4000 * tokens / tokens.sum()  # BlendedDataset's greedy draw: within a sample of it
    assert (np.abs(drawn - wanted) <= 1 + 0.01 * 4000).all(), (drawn, wanted)
    valid_tokens = _shard_tokens(root / "valid")
    assert valid_tokens[1] < sequence_length + 1  # shorter than one sample
    one_epoch = np.ceil((valid_tokens - 1) / sequence_length).astype(int)  # each shard cut once, last part padded
    assert np.bincount(np.asarray(valid.dataset_index), minlength=3).tolist() == one_epoch.tolist()
    # every supervised position once, none twice, the padding none (each shard's last token, an EOD, carries 0)
    masks = [IndexedDataset(p.removesuffix("_tokens") + "_lossmask") for p in tokens_prefixes(root / "valid")]
    stored = sum(int(mask[i].sum()) for mask in masks for i in range(len(mask)))
    assert sum(int(valid[i]["loss_mask"].sum()) for i in range(len(valid))) == stored


def test_a_few_samples_over_many_uneven_shards_build(tmp_path, gloo_world):
    """Megatron draws ceil(weight x samples) from each prefix: with a count of valid samples smaller than the
    prefixes, its default surplus failed with "The valid blend oversamples the contributing datasets"."""
    root = tmp_path / "root"
    _sealed_root(root, {"train": [10, 1, 1, 1, 1, 1], "valid": [10, 1, 1, 1, 1, 1]})
    train, valid = train_valid_datasets(
        root, sequence_length=256, seed=1, train_samples=2, valid_samples=2, cache_dir=tmp_path / "c"
    )
    assert len(train) >= 2 and len(valid) >= 2


def test_a_root_of_another_kind_is_named(tmp_path):
    """A path that does not exist, a split directory, or a finished dataset of another kind: said as such, not as
    a build stopped early, nor as a missing trio."""
    root = tmp_path / "root"
    _sealed_root(root, {"train": [3]})
    other = tmp_path / "distill"
    _sealed_root(other, {"train": [3]}, dataset=constants.DISTILL_DATASET_NAME)
    cases = {
        tmp_path / "absent": "does not exist or is not a directory: pass the synth_kd_v1 dataset's root",
        root / "train": f"is a directory inside a dataset: pass the dataset's root, {root}",
        other: "holds the dataset 'synth_distill', not synth_kd_v1",
    }
    for path, said in cases.items():
        with pytest.raises(SpanDatasetError, match=re.escape(f"{path} {said}")):
            train_valid_datasets(
                path, sequence_length=16, seed=1, train_samples=4, valid_samples=None, cache_dir=tmp_path / "c"
            )


def test_a_flipped_byte_is_refused_by_the_trainers_entry_point(tmp_path, gloo_world, monkeypatch):
    """The examples' `train_valid_datasets` hashes every file against the manifest unless told not to
    (`verify=False`, the examples' --no-hash): a same-size corruption of a .bin passed the size check alone.
    Without it, only the files of at most SMALL_FILE_BYTES are hashed (here: none)."""
    root = tmp_path / "root"
    _sealed_root(root, {"train": [20, 20], "valid": [5]})
    path = Path(f"{tokens_prefixes(root / 'train')[1]}.bin")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    kwargs = dict(sequence_length=16, seed=1, train_samples=4, valid_samples=None)
    with pytest.raises(SpanDatasetError, match=re.escape(f"{path} differs from the manifest")):
        train_valid_datasets(root, cache_dir=tmp_path / "c1", **kwargs)
    monkeypatch.setattr(manifest_seal, "SMALL_FILE_BYTES", 0)  # every .bin large
    train, _ = train_valid_datasets(root, cache_dir=tmp_path / "c2", verify=False, **kwargs)
    assert len(train) >= 4


def test_a_padded_sample_read_first_leaves_the_next_samples_loss_mask_whole(tmp_path, gloo_world):
    """megatron-core 0.16.1 caches the loss mask of the first sample it builds and then zeroes it in place at
    that sample's padding: read a padded (last, partial) valid sample first and every later sample lost its loss
    at those positions. Each sample's mask must be what a dataset that read nothing else gives for it."""
    root = tmp_path / "root"
    _sealed_root(root, {"train": [3], "valid": [12]})

    def fresh_valid():
        kwargs = dict(sequence_length=64, seed=1, train_samples=2, valid_samples=None, cache_dir=tmp_path / "c")
        return train_valid_datasets(root, **kwargs)[1]

    count = len(fresh_valid())
    alone = [fresh_valid()[i]["loss_mask"] for i in range(count)]  # each the first sample its dataset reads
    padded = [i for i in range(count) if (fresh_valid()[i]["tokens"][-8:] == 0).all()]
    assert padded and any(mask.sum() > 0 for mask in alone)
    valid = fresh_valid()
    valid[padded[0]]  # the padded sample first
    for i in range(count):
        assert torch.equal(valid[i]["loss_mask"], alone[i]), i
