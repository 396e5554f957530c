"""The trio (synthkd_contract's IndexedDatasetWriter, megatron-core's format) reads back aligned with megatron-core;
failures leave nothing complete; writing it imports neither megatron-core nor torch."""

from __future__ import annotations

import errno
import os

import numpy as np
import pyarrow as pa
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from synthkd_assets.core.megatron_io import MegatronShardWriter, trio_alignment_problems
from synthkd_assets.core.parquet_io import OutputFileError
from synthkd_contract import constants, indexed_dataset
from synthkd_contract.trio import open_trio, shard_tokens_prefix, trio_files


def random_conversation(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    prompt, analysis, final = rng.integers(3, 40), rng.integers(0, 30), rng.integers(2, 30)
    tokens = np.append(rng.integers(0, 199_000, prompt + analysis + final), constants.EOD_TOKEN_ID).astype(np.int32)
    token_spans = np.concatenate([np.zeros(prompt), np.ones(analysis), np.full(final, 2), [0]]).astype(np.uint8)
    span = np.append(token_spans[1:], 0).astype(np.uint8)
    return tokens, (span > 0).astype(np.uint8), span


def write_shard(split_dir, shard_index, conversations):
    with MegatronShardWriter(split_dir, shard_index, split_dir.name) as writer:
        for conversation in conversations:
            writer.add(*conversation)
        return writer.commit()


def test_trio_reads_back_aligned_with_megatron_core(tmp_path):
    rng = np.random.default_rng(0)
    conversations = [random_conversation(rng) for _ in range(50)]
    inventory = write_shard(tmp_path / "train", 3, conversations)
    assert inventory.sequences == 50 and inventory.tokens == sum(len(c[0]) for c in conversations)
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == sorted(
        p.name for p in trio_files(tmp_path / "train", 3)
    )
    trio = open_trio(shard_tokens_prefix(tmp_path / "train", 3))
    for kind in ("lossmask", "span"):
        np.testing.assert_array_equal(trio[kind].sequence_lengths, trio["tokens"].sequence_lengths)
        np.testing.assert_array_equal(trio[kind].document_indices, trio["tokens"].document_indices)
    np.testing.assert_array_equal(trio["tokens"].document_indices, np.arange(51))
    for i, (tokens, mask, span) in enumerate(conversations):
        assert trio["tokens"][i].dtype == np.int32 and trio["lossmask"][i].dtype == np.uint8
        np.testing.assert_array_equal(trio["tokens"][i], tokens)
        np.testing.assert_array_equal(trio["lossmask"][i], mask)
        np.testing.assert_array_equal(trio["span"][i], span)
    assert trio_alignment_problems(tmp_path / "train", 3) == []


def test_error_mid_write_leaves_no_file(tmp_path):
    rng = np.random.default_rng(1)
    with pytest.raises(RuntimeError):
        with MegatronShardWriter(tmp_path / "train", 0, "train") as writer:
            writer.add(*random_conversation(rng))
            raise RuntimeError("simulated crash")
    assert list((tmp_path / "train").iterdir()) == []


def test_empty_split_publishes_nothing_and_removes_stale_files(tmp_path):
    rng = np.random.default_rng(2)
    write_shard(tmp_path / "valid", 0, [random_conversation(rng)])
    inventory = write_shard(tmp_path / "valid", 0, [])
    assert inventory.sequences == 0 and inventory.files == ()
    assert list((tmp_path / "valid").iterdir()) == []


def test_a_table_written_at_once_is_the_same_bytes_as_its_rows_one_by_one(tmp_path):
    """`add_table` (what the trio and pool writers call) against `add` row by row; a table sliced from a larger
    one (offsets not starting at 0), as a frame's rows are."""
    rng = np.random.default_rng(5)
    conversations = [random_conversation(rng) for _ in range(40)]
    write_shard(tmp_path / "rows" / "train", 0, conversations[3:31])
    columns = ("tokens", "loss_mask", "span_id")
    table = pa.table({c: pa.array([conv[i] for conv in conversations]) for i, c in enumerate(columns)})
    with MegatronShardWriter(tmp_path / "table" / "train", 0, "train") as writer:
        writer.add_table(table.slice(3, 20))
        writer.add_table(table.slice(23, 8))
        inventory = writer.commit()
    assert inventory.sequences == 28
    for name in trio_files(tmp_path / "rows" / "train", 0):
        assert (tmp_path / "table" / "train" / name.name).read_bytes() == name.read_bytes(), name.name


def test_a_table_of_many_chunks_is_the_same_bytes_as_its_rows_one_by_one(tmp_path):
    """`add_table` of a table whose columns are slices chained without a copy (what the trio step hands it: the
    runs of a frame's kept rows, a window's frames one after another) writes each chunk where it is."""
    rng = np.random.default_rng(6)
    conversations = [random_conversation(rng) for _ in range(30)]
    write_shard(tmp_path / "rows" / "train", 0, conversations[2:9] + conversations[12:30])
    columns = ("tokens", "loss_mask", "span_id")
    table = pa.table({c: pa.array([conv[i] for conv in conversations]) for i, c in enumerate(columns)})
    chained = pa.concat_tables([table.slice(2, 7), table.slice(12, 1), table.slice(13, 17)])
    assert chained.column("tokens").num_chunks == 3
    with MegatronShardWriter(tmp_path / "table" / "train", 0, "train") as writer:
        writer.add_table(chained)
        inventory = writer.commit()
    assert inventory.sequences == 25
    for name in trio_files(tmp_path / "rows" / "train", 0):
        assert (tmp_path / "table" / "train" / name.name).read_bytes() == name.read_bytes(), name.name


def test_a_bad_row_in_a_later_chunk_is_named_and_nothing_is_written(tmp_path):
    """Every chunk is checked before any is written: a bad row in the second chunk leaves the first unwritten,
    and is named by its place in the whole table."""
    good = pa.table({"tokens": [[1, 2], [3]], "loss_mask": [[0, 1], [1]], "span_id": [[0, 1], [1]]})
    bad = pa.table({"tokens": [[4], [5, 6]], "loss_mask": [[1], [1, 1]], "span_id": [[1], [1]]})
    with MegatronShardWriter(tmp_path / "refused" / "train", 0, "train") as writer:
        with pytest.raises(ValueError, match=r"got 2/2/1 \(row 3 of 4\)"):
            writer.add_table(pa.concat_tables([good, bad]))
        assert writer.sequences == 0 and writer.tokens == 0
        writer.add_table(good)  # the refused table left nothing behind
        writer.commit()
    with MegatronShardWriter(tmp_path / "good" / "train", 0, "train") as writer:
        writer.add_table(good)
        writer.commit()
    for name in trio_files(tmp_path / "good" / "train", 0):
        assert (tmp_path / "refused" / "train" / name.name).read_bytes() == name.read_bytes(), name.name


def test_unequal_lengths_are_refused(tmp_path):
    with MegatronShardWriter(tmp_path / "train", 0, "train") as writer:
        with pytest.raises(ValueError, match="equal length"):
            writer.add(np.array([1, 2]), np.array([0]), np.array([0, 0]))
        table = pa.table({"tokens": [[1, 2], [3]], "loss_mask": [[0, 1], [1]], "span_id": [[0, 1], []]})
        with pytest.raises(ValueError, match=r"got 1/1/0 \(row 1 of 2\)"):
            writer.add_table(table)
        writer.commit()


@pytest.mark.parametrize(
    "corruption, expected",
    [
        ("truncate_bin", "tokens data file"),
        ("swap_idx", "sequence_lengths differ"),
        ("span_value", "span value 3 outside [0, 2]"),
        ("mask_disagrees", "disagree"),
        ("missing_eod", "do not end with EOD"),
        ("overwritten_bin", "tokens value 1633771873 outside [0, 201087]"),  # b"aaaa" over some tokens
    ],
)
def test_alignment_check_catches_corruption(tmp_path, corruption, expected):
    rng = np.random.default_rng(3)
    conversations = [random_conversation(rng) for _ in range(20)]
    if corruption == "span_value":
        conversations[4][2][0] = 3
    if corruption == "mask_disagrees":
        conversations[5][1][0] = 1 - conversations[5][1][0]
    if corruption == "missing_eod":
        conversations[6][0][-1] = 7
    write_shard(tmp_path / "train", 0, conversations)
    if corruption == "truncate_bin":
        path = tmp_path / "train" / "shard_00_tokens.bin"
        path.write_bytes(path.read_bytes()[:-8])
    if corruption == "overwritten_bin":  # bytes of a shard written over another file's, the size unchanged
        path = tmp_path / "train" / "shard_00_tokens.bin"
        payload = bytearray(path.read_bytes())
        payload[40:48] = b"aaaaaaaa"
        path.write_bytes(bytes(payload))
    if corruption == "swap_idx":
        other = [random_conversation(rng) for _ in range(20)]
        write_shard(tmp_path / "other" / "train", 0, other)
        (tmp_path / "train" / "shard_00_span.idx").write_bytes(
            (tmp_path / "other" / "train" / "shard_00_span.idx").read_bytes()
        )
    problems = trio_alignment_problems(tmp_path / "train", 0)
    assert any(expected in p for p in problems), problems


def test_megatron_reader_refuses_truncated_bin(tmp_path):
    """The truncated case above is also what megatron-core itself would choke on."""
    rng = np.random.default_rng(4)
    write_shard(tmp_path / "train", 0, [random_conversation(rng) for _ in range(5)])
    path = tmp_path / "train" / "shard_00_tokens.bin"
    path.write_bytes(path.read_bytes()[:-8])
    dataset = IndexedDataset(str(tmp_path / "train" / "shard_00_tokens"))
    with pytest.raises(ValueError):
        dataset[4]


def test_chunked_validation_covers_every_document(tmp_path, monkeypatch):
    """With chunks far smaller than the shard, a defect in any document (first, middle, last) is still found."""
    monkeypatch.setattr("synthkd_contract.trio.CHECK_CHUNK_TOKENS", 50)
    for victim in (0, 17, 39):
        rng = np.random.default_rng(victim)
        conversations = [random_conversation(rng) for _ in range(40)]
        conversations[victim][2][1] = 3
        write_shard(tmp_path / str(victim) / "train", 0, conversations)
        problems = trio_alignment_problems(tmp_path / str(victim) / "train", 0)
        assert any("span value 3 outside" in p for p in problems), (victim, problems)
    write_shard(tmp_path / "sound" / "train", 0, [random_conversation(rng) for _ in range(40)])
    assert trio_alignment_problems(tmp_path / "sound" / "train", 0) == []


def test_failure_opening_a_sibling_removes_the_partials_already_created(tmp_path, monkeypatch):
    """Creating the lossmask file fails (ENOSPC on the second builder): no partial remains, and the
    error names the file. (A planted obstacle at a partial name cannot do this any more: partial
    names are unique, see tests/test_crash_safety.py.)"""
    real_init = indexed_dataset.IndexedDatasetWriter.__init__
    opened = []

    def init(self, path, *args, **kwargs):
        opened.append(path)
        if len(opened) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_init(self, path, *args, **kwargs)

    monkeypatch.setattr(indexed_dataset.IndexedDatasetWriter, "__init__", init)
    split_dir = tmp_path / "train"
    with pytest.raises(OutputFileError, match=f"^{split_dir / 'shard_00_lossmask.bin'}: cannot write output: No space"):
        MegatronShardWriter(split_dir, 0, "train")
    assert list(split_dir.iterdir()) == []
