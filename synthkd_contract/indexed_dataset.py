"""megatron-core's IndexedDataset files (`.bin` + `.idx`), written and read with numpy alone.

The build writes and checks every trio in processes that need neither torch nor megatron-core (importing
megatron-core's `indexed_dataset` imports torch: ~0.2 GiB of a worker's memory and seconds of start-up).
This module is that format, as megatron-core 0.16.1 writes and reads it (`megatron/core/datasets/
indexed_dataset.py`):

- `<prefix>.bin`: each document's values, C order, in the dataset's dtype, one after the other;
- `<prefix>.idx`: the header `MMIDIDX\\x00\\x00`, version 1 (`<Q`), the dtype's code (`<B`, `DType`),
  the sequence count and the document count (`<Q` each), then the sequence lengths (int32), the byte
  offset of each sequence in the `.bin` (int64) and the document indices (int64: 0, then the number of
  sequences after each document).

`IndexedDatasetWriter` writes byte for byte what megatron-core's `IndexedDatasetBuilder` writes for the same
`add_document` calls; `read_index` accepts exactly the files megatron-core's `IndexedDataset` opens and
reads the same arrays from them (tests/test_indexed_dataset.py writes and reads both ways, megatron-core
beside this module). Training reads the files with megatron-core itself.
"""

from __future__ import annotations

import os
import struct
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# megatron-core's `DType` enum: the code written in the .idx for each value dtype
DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}
INT32_MAX = np.iinfo(np.int32).max


class IndexedDatasetWriter:
    """`IndexedDatasetBuilder(bin_path, dtype)`'s `add_document` / `finalize`, without megatron-core.

    Values go to `data_file` (opened here, by path) as they come; the index is kept as two int64
    arrays (sequence lengths, document ends) and written by `finalize`, which closes `data_file` first
    as megatron-core does. Multimodal datasets (sequence modes) are not written.
    """

    def __init__(self, bin_path: str | Path, dtype: type[np.number] | np.dtype = np.int32) -> None:
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"{self.dtype} has no IndexedDataset dtype code (one of {sorted(map(str, DTYPE_CODES))})")
        self.data_file: BinaryIO = open(bin_path, "wb")
        self.sequence_lengths = array("q")
        self.document_indices = array("q", [0])

    def add_document(self, values: np.ndarray, lengths: Sequence[int]) -> None:
        """One document: `values` (cast to the dataset's dtype as `numpy.array(values, dtype)` casts) and the
        lengths of its sequences."""
        self.data_file.write(np.array(values, dtype=self.dtype).tobytes(order="C"))
        self.sequence_lengths.extend(int(n) for n in lengths)
        self.document_indices.append(len(self.sequence_lengths))

    def add_documents(self, values: np.ndarray, lengths: np.ndarray) -> None:
        """Documents of one sequence each, in order: `values` holds their values one after another and `lengths`
        each one's length. The same bytes as `add_document(values[a:b], [b - a])` for each, in one write.

        Args:
            values: every document's values, concatenated (cast as `add_document` casts them).
            lengths: each document's length (>= 0); they sum to `len(values)`.

        Raises:
            ValueError: the lengths do not sum to the values' count, or one is negative.
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        if (lengths < 0).any() or int(lengths.sum()) != len(values):
            raise ValueError(
                f"{len(values)} values cannot be {len(lengths)} documents of lengths summing to {int(lengths.sum())}"
            )
        self.data_file.write(np.ascontiguousarray(values, dtype=self.dtype).data)  # its bytes, not a copy of them
        first = len(self.sequence_lengths)
        self.sequence_lengths.extend(lengths.tolist())
        self.document_indices.extend(range(first + 1, first + len(lengths) + 1))

    def finalize(self, idx_path: str | Path) -> None:
        """Close the .bin and write the .idx."""
        self.data_file.close()
        with open(idx_path, "wb") as index:
            index.write(index_bytes(self.dtype, self.sequence_lengths, self.document_indices))


def index_bytes(dtype: np.dtype, sequence_lengths: Sequence[int], document_indices: Sequence[int]) -> bytes:
    """The .idx of a dataset of `dtype` values: header, counts, lengths, pointers, document indices."""
    lengths = np.asarray(sequence_lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 0 or lengths.max() > INT32_MAX):
        raise OverflowError(f"a sequence length outside [0, {INT32_MAX}] cannot be stored in an IndexedDataset")
    pointers = np.zeros(lengths.size, dtype=np.int64)
    np.cumsum(lengths[:-1] * dtype.itemsize, out=pointers[1:])
    return b"".join(
        (
            INDEX_HEADER,
            struct.pack("<Q", INDEX_VERSION),
            struct.pack("<B", DTYPE_CODES[dtype]),
            struct.pack("<Q", lengths.size),
            struct.pack("<Q", len(document_indices)),
            lengths.astype(np.int32).tobytes(order="C"),
            pointers.tobytes(order="C"),
            np.asarray(document_indices, dtype=np.int64).tobytes(order="C"),
        )
    )


class IndexedDatasetError(ValueError):
    """An IndexedDataset that megatron-core's `IndexedDataset` would refuse to open."""


@dataclass(frozen=True)
class DatasetIndex:
    """What megatron-core's `IndexedDataset(path_prefix)` reads from a dataset's .idx (its `.index`)."""

    path_prefix: str
    dtype: np.dtype
    sequence_lengths: np.ndarray  # int32
    sequence_pointers: np.ndarray  # int64, byte offsets in the .bin
    document_indices: np.ndarray  # int64

    def __len__(self) -> int:
        return len(self.sequence_lengths)


def read_index(path_prefix: str | Path) -> DatasetIndex:
    """The index of `<path_prefix>.idx`, read as megatron-core's `IndexedDataset(path_prefix)` reads it
    (`multimodal=False`, the .bin memory-mapped), with the same refusals: a missing file, a wrong
    header, version or dtype code, an index shorter than its counts say, no document index, document
    indices that do not end at the sequence count, or an empty .bin. The arrays are copies: no file stays open."""
    path_prefix = str(path_prefix)
    idx_path, bin_path = Path(f"{path_prefix}.idx"), Path(f"{path_prefix}.bin")
    if not (idx_path.exists() and bin_path.exists()):
        raise IndexedDatasetError(f"{path_prefix}: one or both of the .idx and .bin files cannot be found")
    try:
        with open(bin_path, "rb") as data:
            if os.fstat(data.fileno()).st_size == 0:  # numpy.memmap: "cannot mmap an empty file"
                raise IndexedDatasetError(f"{bin_path} is empty: megatron-core cannot memory-map it")
        buffer = idx_path.read_bytes()
    except OSError as error:  # a directory, no permission
        raise IndexedDatasetError(f"{path_prefix}: {type(error).__name__}: {error}") from error
    if buffer[: len(INDEX_HEADER)] != INDEX_HEADER:
        raise IndexedDatasetError(f"bad header, cannot read: {idx_path}")
    try:
        version, code, sequence_count, document_count = struct.unpack_from("<QBQQ", buffer, len(INDEX_HEADER))
    except struct.error as error:
        raise IndexedDatasetError(f"{idx_path}: index shorter than its header ({error})") from error
    if version != INDEX_VERSION:
        raise IndexedDatasetError(f"bad version, cannot read: {idx_path}")
    if code not in CODE_DTYPES:
        raise IndexedDatasetError(f"{idx_path}: {code} is not a valid DType code")
    offset = len(INDEX_HEADER) + struct.calcsize("<QBQQ")
    try:
        lengths = np.frombuffer(buffer, dtype=np.int32, count=sequence_count, offset=offset)
        offset += lengths.nbytes
        pointers = np.frombuffer(buffer, dtype=np.int64, count=sequence_count, offset=offset)
        offset += pointers.nbytes
        documents = np.frombuffer(buffer, dtype=np.int64, count=document_count, offset=offset)
    except (ValueError, OverflowError) as error:  # numpy: the buffer is smaller than the requested counts
        raise IndexedDatasetError(f"{idx_path}: index shorter than its counts ({error})") from error
    if not documents.size or documents[-1] != lengths.size:
        raise IndexedDatasetError(f"{idx_path}: document indices do not end at the sequence count {lengths.size}")
    return DatasetIndex(path_prefix, CODE_DTYPES[code], lengths.copy(), pointers.copy(), documents.copy())
