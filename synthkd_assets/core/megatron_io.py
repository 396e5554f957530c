"""The Megatron trio of one shard and split: tokens / lossmask / span IndexedDatasets.

Written with megatron-core's own `IndexedDatasetBuilder` (one document per conversation) and read
back with its `IndexedDataset`, so what we validate is exactly what training will load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import numpy as np

from synthkd_assets import contracts
from synthkd_assets.core.atomic import partial_path, publish
from synthkd_assets.core.manifest import sha256_file


def trio_prefixes(split_dir: Path, shard_index: int) -> dict[str, Path]:
    """kind -> IndexedDataset path prefix (no .bin/.idx) for one shard of one split."""
    return {kind: split_dir / contracts.shard_prefix_name(shard_index, kind) for kind in contracts.ARRAY_KINDS}


def trio_files(split_dir: Path, shard_index: int) -> list[Path]:
    return [Path(f"{prefix}{ext}") for prefix in trio_prefixes(split_dir, shard_index).values() for ext in (".bin", ".idx")]


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

    Use as a context manager: leaving it with an exception removes the partial files; `commit()`
    fsyncs and renames them (all .bin first, then all .idx, so an .idx never points at a missing
    or short .bin). A split that received no document publishes nothing, because megatron-core
    cannot memory-map an empty .bin; its inventory says `sequences: 0`.
    """

    def __init__(self, split_dir: Path, shard_index: int, split: str, relative_to: Path | None = None) -> None:
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        if split not in contracts.SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {contracts.SPLITS}")
        self.split_dir = split_dir
        self.shard_index = shard_index
        self.split = split
        self._relative_to = relative_to
        split_dir.mkdir(parents=True, exist_ok=True)
        self._prefixes = trio_prefixes(split_dir, shard_index)
        self._builders = {
            kind: IndexedDatasetBuilder(
                str(partial_path(Path(f"{prefix}.bin"))), dtype=contracts.ARRAY_DTYPES[kind]
            )
            for kind, prefix in self._prefixes.items()
        }
        self.sequences = 0
        self.tokens = 0
        self._closed = False

    def add(self, tokens: np.ndarray, loss_mask: np.ndarray, span_id: np.ndarray) -> None:
        n = len(tokens)
        if not (len(loss_mask) == n == len(span_id)) or n == 0:
            raise ValueError(
                f"shard {self.shard_index} {self.split}: arrays must be non-empty and of equal length, got "
                f"{len(tokens)}/{len(loss_mask)}/{len(span_id)}"
            )
        for kind, array in zip(contracts.ARRAY_KINDS, (tokens, loss_mask, span_id)):
            self._builders[kind].add_document(np.asarray(array, dtype=contracts.ARRAY_DTYPES[kind]), [n])
        self.sequences += 1
        self.tokens += n

    def _partials(self) -> list[tuple[Path, Path]]:
        bins = [(partial_path(Path(f"{p}.bin")), Path(f"{p}.bin")) for p in self._prefixes.values()]
        idxs = [(partial_path(Path(f"{p}.idx")), Path(f"{p}.idx")) for p in self._prefixes.values()]
        return bins + idxs

    def _remove_finals(self) -> None:
        # old output of this shard goes first: a crash from here on leaves the shard visibly absent
        for path in trio_files(self.split_dir, self.shard_index):
            path.unlink(missing_ok=True)

    def commit(self) -> ShardSplitInventory:
        for kind, builder in self._builders.items():
            builder.finalize(str(partial_path(Path(f"{self._prefixes[kind]}.idx"))))
        self._closed = True
        self._remove_finals()
        if self.sequences == 0:
            self._discard_partials()
            return ShardSplitInventory(self.split, self.shard_index, 0, 0)
        publish(self._partials())
        return ShardSplitInventory(
            self.split,
            self.shard_index,
            self.sequences,
            self.tokens,
            tuple(self._record(final) for _, final in self._partials()),
        )

    def _record(self, path: Path) -> FileRecord:
        shown = path.relative_to(self._relative_to) if self._relative_to else path
        return FileRecord(str(shown), path.stat().st_size, sha256_file(path))

    def _discard_partials(self) -> None:
        for partial, _ in self._partials():
            partial.unlink(missing_ok=True)

    def abort(self) -> None:
        if not self._closed:
            for builder in self._builders.values():
                builder.data_file.close()
            self._closed = True
        self._discard_partials()

    def __enter__(self) -> "MegatronShardWriter":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            raise RuntimeError("MegatronShardWriter left without commit(): call commit() or let an error abort it")


def open_trio(split_dir: Path, shard_index: int):
    """kind -> megatron-core IndexedDataset (mmap) for one shard/split."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return {kind: IndexedDataset(str(prefix)) for kind, prefix in trio_prefixes(split_dir, shard_index).items()}


def trio_alignment_problems(split_dir: Path, shard_index: int) -> list[str]:
    """Everything wrong with one shard/split trio, as readable sentences (empty list = sound).

    Loads through megatron-core, so an unreadable or truncated file is reported, not raised.
    """
    name = f"{split_dir.name}/shard_{shard_index:02d}"
    missing = [str(p.name) for p in trio_files(split_dir, shard_index) if not p.is_file()]
    if missing:
        return [f"{name}: missing files {missing}"]
    try:
        datasets = open_trio(split_dir, shard_index)
        arrays = {}
        for kind, dataset in datasets.items():
            expected = np.dtype(contracts.ARRAY_DTYPES[kind])
            if np.dtype(dataset.index.dtype) != expected:
                return [f"{name}: {kind} dtype is {np.dtype(dataset.index.dtype)}, expected {expected}"]
            total = int(dataset.sequence_lengths.sum())
            arrays[kind] = dataset.bin_reader.read(dtype=expected, count=total, offset=0)
    except Exception as error:  # megatron-core raises AssertionError/ValueError on malformed files
        return [f"{name}: not readable by megatron-core IndexedDataset: {type(error).__name__}: {error}"]
    problems: list[str] = []
    tokens_ds = datasets["tokens"]
    for kind in ("lossmask", "span"):
        if not np.array_equal(datasets[kind].sequence_lengths, tokens_ds.sequence_lengths):
            problems.append(f"{name}: {kind} sequence_lengths differ from tokens")
        if not np.array_equal(datasets[kind].document_indices, tokens_ds.document_indices):
            problems.append(f"{name}: {kind} document_indices differ from tokens")
    if problems:
        return problems
    loss_mask, span = arrays["lossmask"], arrays["span"]
    if (bad := np.flatnonzero(loss_mask > 1)).size:
        problems.append(f"{name}: loss_mask outside {{0,1}} at {bad.size} positions, first {int(bad[0])}")
    if (bad := np.flatnonzero(span > contracts.SPAN_FINAL)).size:
        problems.append(f"{name}: span_id outside {{0,1,2}} at {bad.size} positions, first {int(bad[0])}")
    if (bad := np.flatnonzero((loss_mask == 0) != (span == contracts.SPAN_PROMPT))).size:
        problems.append(f"{name}: loss_mask==0 and span_id==0 disagree at {bad.size} positions, first {int(bad[0])}")
    ends = np.cumsum(tokens_ds.sequence_lengths.astype(np.int64)) - 1
    if ends.size:
        if not np.all(arrays["tokens"][ends] == contracts.EOD_TOKEN_ID):
            problems.append(f"{name}: {int(np.sum(arrays['tokens'][ends] != contracts.EOD_TOKEN_ID))} documents do not end with EOD")
        if np.any(loss_mask[ends] != 0) or np.any(span[ends] != 0):
            problems.append(f"{name}: the EOD position of some documents does not carry 0/0")
    return problems
