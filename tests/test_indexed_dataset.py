"""synthkd_contract.indexed_dataset against megatron-core 0.16.1 itself.

- `IndexedDatasetWriter` writes the same bytes as megatron-core's `IndexedDatasetBuilder` for the same
  `add_document` calls: hypothesis-generated documents (several sequences each, empty ones, none at all) in
  every dtype of the contract and every dtype megatron-core has a code for;
- `read_index` opens exactly the files megatron-core's `IndexedDataset` opens and reads the same arrays:
  every file the writer produces, every truncation and single-field corruption of an index, and arbitrary
  index bytes behind a valid header.
"""

from __future__ import annotations

import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

from synthkd_contract import constants
from synthkd_contract.indexed_dataset import (
    DTYPE_CODES,
    INDEX_HEADER,
    IndexedDatasetError,
    IndexedDatasetWriter,
    read_index,
)

# megatron-core's IndexedDataset.__del__ raises (AttributeError) after a refused open: expected here
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
MEGATRON_DTYPES = [dtype.type for dtype in DTYPE_CODES]  # numpy scalar types, as megatron-core takes them


def documents(dtype: type[np.number]) -> st.SearchStrategy[list[tuple[np.ndarray, list[int]]]]:
    """Documents of `dtype` values: each a value array and the lengths of its (0 or more) sequences."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        value = st.integers(int(info.min), int(info.max))
    else:
        value = st.floats(allow_nan=False, width=np.dtype(dtype).itemsize * 8)
    sequence = st.lists(value, max_size=40)
    document = st.lists(sequence, max_size=4).map(
        lambda seqs: (np.array([v for s in seqs for v in s], dtype=dtype), [len(s) for s in seqs])
    )
    return st.lists(document, max_size=12)


def write_both(directory: Path, dtype, docs) -> tuple[str, str]:
    """The same documents through megatron-core's builder and through the writer: their two prefixes."""
    prefixes = str(directory / "megatron"), str(directory / "numpy")
    builder = IndexedDatasetBuilder(f"{prefixes[0]}.bin", dtype=dtype)
    writer = IndexedDatasetWriter(f"{prefixes[1]}.bin", dtype=dtype)
    for values, lengths in docs:
        builder.add_document(values, lengths)
        writer.add_document(values, lengths)
    builder.finalize(f"{prefixes[0]}.idx")
    writer.finalize(f"{prefixes[1]}.idx")
    return prefixes


def megatron_reads(prefix: str):
    """megatron-core's IndexedDataset of `prefix`'s arrays, or the exception it raised."""
    try:
        dataset = IndexedDataset(prefix, multimodal=False, mmap=True)
    except Exception as error:  # noqa: BLE001 - any refusal
        return RuntimeError(repr(error))  # not `error`: its traceback would keep the half-built dataset alive
    index = dataset.index
    return (
        np.dtype(index.dtype),
        index.sequence_lengths.copy(),
        index.sequence_pointers.copy(),
        index.document_indices.copy(),
    )


def ours_reads(prefix: str):
    try:
        index = read_index(prefix)
    except IndexedDatasetError as error:
        return error
    return index.dtype, index.sequence_lengths, index.sequence_pointers, index.document_indices


def assert_same_reading(prefix: str) -> None:
    theirs, ours = megatron_reads(prefix), ours_reads(prefix)
    assert isinstance(theirs, Exception) == isinstance(ours, Exception), (prefix, theirs, ours)
    if not isinstance(ours, Exception):
        assert theirs[0] == ours[0]
        for a, b in zip(theirs[1:], ours[1:]):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def same_bytes(a: str, b: str) -> None:
    for ext in (".bin", ".idx"):
        assert Path(f"{a}{ext}").read_bytes() == Path(f"{b}{ext}").read_bytes(), ext


@pytest.mark.parametrize("kind", constants.ARRAY_KINDS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_writer_bytes_equal_megatron_builder_for_the_contract_dtypes(kind, data):
    dtype = constants.ARRAY_DTYPES[kind]
    docs = data.draw(documents(dtype))
    with tempfile.TemporaryDirectory() as directory:
        megatron, ours = write_both(Path(directory), dtype, docs)
        same_bytes(megatron, ours)
        assert_same_reading(ours)


@pytest.mark.parametrize("dtype", MEGATRON_DTYPES, ids=lambda d: d.__name__)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_writer_bytes_equal_megatron_builder_for_every_dtype_code(dtype, data):
    docs = data.draw(documents(dtype))
    with tempfile.TemporaryDirectory() as directory:
        megatron, ours = write_both(Path(directory), dtype, docs)
        same_bytes(megatron, ours)
        assert_same_reading(ours)


@pytest.mark.parametrize("kind", constants.ARRAY_KINDS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_documents_written_at_once_equal_megatron_builder_one_by_one(kind, data):
    """`add_documents` (documents of one sequence each, values concatenated, calls of any size) against
    megatron-core's builder given the same documents one `add_document` at a time."""
    dtype = constants.ARRAY_DTYPES[kind]
    docs = [(values, [len(values)]) for values, _ in data.draw(documents(dtype))]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(docs)), max_size=4)))
    with tempfile.TemporaryDirectory() as directory:
        megatron, ours = write_both(Path(directory), dtype, docs)
        writer = IndexedDatasetWriter(f"{ours}.bin", dtype=dtype)
        for lo, hi in zip([0, *cuts], [*cuts, len(docs)]):
            batch = docs[lo:hi]
            values = np.concatenate([v for v, _ in batch]) if batch else np.zeros(0, dtype)
            writer.add_documents(values, np.array([n for _, (n,) in batch], dtype=np.int64))
        writer.finalize(f"{ours}.idx")
        same_bytes(megatron, ours)
        assert_same_reading(ours)


def test_documents_whose_lengths_do_not_add_up_are_refused(tmp_path):
    writer = IndexedDatasetWriter(tmp_path / "a.bin")
    with pytest.raises(ValueError, match="3 values cannot be 2 documents"):
        writer.add_documents(np.arange(3), np.array([1, 1]))
    with pytest.raises(ValueError, match="cannot be 2 documents"):
        writer.add_documents(np.arange(3), np.array([4, -1]))
    writer.data_file.close()


def test_values_are_cast_as_megatron_casts_them(tmp_path):
    """A document handed over in another dtype (int64 tokens, bool masks, a Python list) is cast the same way."""
    docs = [
        (np.array([1, 2, 70_000], dtype=np.int64), [3]),
        (np.array([True, False]), [2]),
        ([3, 4, 5], [1, 2]),
        (np.arange(6, dtype=np.int16).reshape(2, 3).T, [6]),  # not C-contiguous
    ]
    for dtype in (np.int32, np.uint8, np.uint16):
        directory = tmp_path / dtype.__name__
        directory.mkdir()
        same_bytes(*write_both(directory, dtype, docs))


def test_a_dtype_without_a_code_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no IndexedDataset dtype code"):
        IndexedDatasetWriter(tmp_path / "x.bin", np.uint32)
    assert not (tmp_path / "x.bin").exists()


@pytest.fixture
def sound(tmp_path) -> str:
    rng = np.random.default_rng(0)
    docs = [(rng.integers(0, 1000, n, dtype=np.int32), [n]) for n in rng.integers(1, 30, 7)]
    docs.append((rng.integers(0, 1000, 9, dtype=np.int32), [4, 5]))
    megatron, ours = write_both(tmp_path, np.int32, docs)
    same_bytes(megatron, ours)
    assert not isinstance(ours_reads(ours), Exception)
    return ours


def rewrite(prefix: str, idx: bytes | None = None, bin_: bytes | None = None) -> str:
    if idx is not None:
        Path(f"{prefix}.idx").write_bytes(idx)
    if bin_ is not None:
        Path(f"{prefix}.bin").write_bytes(bin_)
    return prefix


def test_every_truncation_of_an_index_is_read_alike(sound):
    idx = Path(f"{sound}.idx").read_bytes()
    for size in range(len(idx) + 1):
        assert_same_reading(rewrite(sound, idx=idx[:size]))


def test_every_corrupted_header_field_is_read_alike(sound):
    idx = Path(f"{sound}.idx").read_bytes()
    header = len(INDEX_HEADER)
    sequences, documents_ = struct.unpack_from("<QQ", idx, header + 9)
    variants = [idx[:i] + bytes([idx[i] ^ 0xFF]) + idx[i + 1 :] for i in range(header)]  # each header byte
    for version in (0, 2, 2**63):
        variants.append(idx[:header] + struct.pack("<Q", version) + idx[header + 8 :])
    for code in (0, 9, 255, *DTYPE_CODES.values()):
        variants.append(idx[: header + 8] + struct.pack("<B", code) + idx[header + 9 :])
    for count in (0, 1, sequences - 1, sequences + 1, 2**40, 2**64 - 1):
        variants.append(idx[: header + 9] + struct.pack("<Q", count) + idx[header + 17 :])
    for count in (0, 1, documents_ - 1, documents_ + 1, 2**40, 2**64 - 1):
        variants.append(idx[: header + 17] + struct.pack("<Q", count) + idx[header + 25 :])
    last = idx[:-8]
    for end in (0, sequences - 1, sequences + 1, -1):
        variants.append(last + struct.pack("<q", end))
    variants.append(idx + b"\x00" * 5)  # trailing bytes: ignored by both
    for variant in variants:
        assert_same_reading(rewrite(sound, idx=variant))


def test_missing_empty_or_unopenable_files_are_refused_alike(sound):
    bin_bytes = Path(f"{sound}.bin").read_bytes()
    assert_same_reading(rewrite(sound, bin_=b""))  # megatron-core cannot memory-map an empty .bin
    assert_same_reading(rewrite(sound, bin_=bin_bytes[:-3]))  # a short .bin still opens (validate_trio's job)
    os.unlink(f"{sound}.bin")
    assert_same_reading(sound)
    os.mkdir(f"{sound}.bin")
    assert_same_reading(sound)
    os.unlink(f"{sound}.idx")
    assert_same_reading(sound)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    version=st.sampled_from([1, 1, 1, 2]),
    code=st.integers(0, 10),
    sequences=st.integers(0, 12),
    documents_=st.integers(0, 12),
    payload=st.binary(max_size=300),
)
def test_arbitrary_index_bytes_behind_a_header_are_read_alike(tmp_path, version, code, sequences, documents_, payload):
    prefix = str(tmp_path / "fuzz")
    header = INDEX_HEADER + struct.pack("<QBQQ", version, code, sequences, documents_)
    rewrite(prefix, idx=header + payload, bin_=b"\x01" * 64)
    assert_same_reading(prefix)
