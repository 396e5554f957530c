"""The Megatron trio of one shard and split: tokens / lossmask / span IndexedDatasets.

Written in megatron-core's IndexedDataset format by `synthkd_contract.indexed_dataset.IndexedDatasetWriter`
(one document per conversation; byte for byte what megatron-core's `IndexedDatasetBuilder` writes, without
importing megatron-core or torch), published atomically, and checked with `synthkd_contract.trio.validate_trio`:
the validator the training loader runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa

from synthkd_assets.core.atomic import PartialFile, discard_all, publish_partials
from synthkd_assets.core.ownership import remove_replaced_output
from synthkd_assets.core.parquet_io import ParquetShardWriter, list_column_flat, output_errors_named
from synthkd_contract import constants
from synthkd_contract.indexed_dataset import IndexedDatasetWriter
from synthkd_contract.manifest_seal import sha256_file
from synthkd_contract.trio import shard_tokens_prefix, trio_files, trio_prefixes, validate_trio

TRIO_COLUMNS = ("tokens", "loss_mask", "span_id")  # the list columns that hold a trio's arrays (ARRAY_KINDS' order)


@dataclass(frozen=True)
class FileRecord:
    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ShardSplitInventory:
    """What one shard wrote into one split; `files` is empty when the split got no document."""

    split: str
    shard_index: int
    sequences: int
    tokens: int
    files: tuple[FileRecord, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return {
            "split": self.split,
            "shard_index": self.shard_index,
            "sequences": self.sequences,
            "tokens": self.tokens,
            "bytes": sum(f.bytes for f in self.files),
            "files": [f.__dict__ for f in self.files],
        }


class MegatronShardWriter:
    """Streams conversations into the trio of one shard/split, published atomically on commit.

    Every file is written under a fresh partial name (see core/atomic.py), which the
    IndexedDatasetWriter then opens by path. Use as a context manager: leaving it with an exception
    removes every partial file, whatever closing them raises (a full disk); `commit()` fsyncs and
    renames them (all .bin first, then all .idx, so an .idx never points at a missing or short .bin);
    `commit_shard` does so for both splits and the documents table of a shard at once. A split that
    received no document publishes nothing, because megatron-core cannot memory-map an empty .bin;
    its inventory says `sequences: 0`. An OSError while writing names the file it was writing.
    """

    def __init__(self, split_dir: Path, shard_index: int, split: str, relative_to: Path | None = None) -> None:
        if split not in constants.SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {constants.SPLITS}")
        self.split_dir = split_dir
        self.shard_index = shard_index
        self.split = split
        self._relative_to = relative_to
        split_dir.mkdir(parents=True, exist_ok=True)
        self._prefixes = trio_prefixes(split_dir, shard_index)
        self._builders: dict[str, IndexedDatasetWriter] = {}
        self._bins: dict[str, PartialFile] = {}
        self._idxs: dict[str, PartialFile] = {}
        self.sequences = 0
        self.tokens = 0
        self._closed = False
        try:
            for kind, prefix in self._prefixes.items():
                with output_errors_named(Path(f"{prefix}.bin")):
                    self._bins[kind] = PartialFile(Path(f"{prefix}.bin"))
                    self._idxs[kind] = PartialFile(Path(f"{prefix}.idx"))
                    self._builders[kind] = IndexedDatasetWriter(
                        str(self._bins[kind].path), dtype=constants.ARRAY_DTYPES[kind]
                    )
        except BaseException:
            self.abort()  # e.g. disk full on the second file: the first one's partial goes too
            raise

    def add(self, tokens: np.ndarray, loss_mask: np.ndarray, span_id: np.ndarray) -> None:
        """One conversation: `add_table` of a table of its one row."""
        arrays = (tokens, loss_mask, span_id)
        self.add_table(pa.table({column: pa.array([np.asarray(a)]) for column, a in zip(TRIO_COLUMNS, arrays)}))

    def add_table(self, table: pa.Table) -> None:
        """Every row of `table` (its `tokens`, `loss_mask` and `span_id` list columns) as one conversation, in
        order: what `add` does row by row, with one write a file for each chunk of the table.

        Args:
            table: rows with the three list columns (any other columns are ignored).

        Raises:
            ValueError: a row whose three arrays are empty or of different lengths (the first such row named).
        """
        # each chunk's arrays in place (a table of slices is never joined), all checked before any is written
        chunks = [
            [list_column_flat(batch.column(column)) for column in TRIO_COLUMNS]
            for batch in table.select(list(TRIO_COLUMNS)).to_batches()
        ]
        first_row = 0
        for flats in chunks:
            lengths = flats[0][0]
            bad = np.flatnonzero((lengths == 0) | (flats[1][0] != lengths) | (flats[2][0] != lengths))
            if len(bad):
                row = int(bad[0])
                raise ValueError(
                    f"shard {self.shard_index} {self.split}: arrays must be non-empty and of equal length, got "
                    f"{'/'.join(str(int(flat[0][row])) for flat in flats)} (row {first_row + row} of "
                    f"{table.num_rows})"
                )
            first_row += len(lengths)
        for flats in chunks:
            lengths = flats[0][0]
            for kind, (_, values) in zip(constants.ARRAY_KINDS, flats):
                with output_errors_named(self._bins[kind].final):
                    self._builders[kind].add_documents(values, lengths)
            self.sequences += len(lengths)
            self.tokens += int(lengths.sum())

    def finish(self) -> None:
        """Close every .bin and write every .idx, all still under their partial names."""
        for kind, builder in self._builders.items():
            with output_errors_named(self._idxs[kind].final):
                builder.finalize(str(self._idxs[kind].path))
        self._closed = True

    def partial_files(self) -> tuple[list[PartialFile], list[PartialFile]]:
        """(.bin partials, .idx partials); none when the split got no document."""
        if self.sequences == 0:
            return [], []
        return list(self._bins.values()), list(self._idxs.values())

    def remove_finals(self) -> None:
        # old output of this shard goes first: a crash from here on leaves the shard visibly absent
        remove_replaced_output(trio_files(self.split_dir, self.shard_index))

    def inventory(self) -> ShardSplitInventory:
        """What was published (call after the files were renamed into place)."""
        files = tuple(self._record(p.final) for group in self.partial_files() for p in group)
        return ShardSplitInventory(self.split, self.shard_index, self.sequences, self.tokens, files)

    def commit(self) -> ShardSplitInventory:
        return commit_shard([self])[0]

    def _record(self, path: Path) -> FileRecord:
        shown = path.relative_to(self._relative_to) if self._relative_to else path
        return FileRecord(str(shown), path.stat().st_size, sha256_file(path))

    def abort(self) -> None:
        """Remove every partial file; closing a builder's file may itself fail (ENOSPC on the flush)."""
        try:
            if not self._closed:
                self._closed = True
                for builder in self._builders.values():
                    with contextlib.suppress(OSError):
                        builder.data_file.close()
        finally:
            discard_all([*self._bins.values(), *self._idxs.values()])

    def __enter__(self) -> MegatronShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            raise RuntimeError("MegatronShardWriter left without commit(): call commit() or let an error abort it")


def commit_shard(
    writers: Sequence[MegatronShardWriter], tables: Sequence[ParquetShardWriter] = ()
) -> list[ShardSplitInventory]:
    """Publish the trios of one shard (every split) and its tables together: everything is finished
    under partial names first, so a full disk publishes none of it; then the shard's old files go,
    and all .bin, the tables, then all .idx are renamed. On any error every partial is removed."""
    try:
        for writer in writers:
            if not writer._closed:
                writer.finish()
        for table in tables:
            table.finish()
        for writer in writers:
            writer.remove_finals()
        bins = [p for writer in writers for p in writer.partial_files()[0]]
        idxs = [p for writer in writers for p in writer.partial_files()[1]]
        publish_partials([*bins, *[t._partial_file for t in tables], *idxs])
        for table in tables:
            table.published = True
    except BaseException:
        for writer in writers:
            writer.abort()
        for table in tables:
            table._discard()
        raise
    for writer in writers:
        if not writer.sequences:  # megatron-core cannot map an empty .bin: that split publishes nothing
            discard_all([*writer._bins.values(), *writer._idxs.values()])
    return [writer.inventory() for writer in writers]


def trio_alignment_problems(split_dir: Path, shard_index: int) -> list[str]:
    """Everything wrong with one shard/split trio (`validate_trio`), each problem naming it
    (`train/shard_00: ...`); an empty list when it is sound."""
    name = f"{split_dir.name}/shard_{shard_index:02d}"
    return [f"{name}: {problem}" for problem in validate_trio(shard_tokens_prefix(split_dir, shard_index))]
