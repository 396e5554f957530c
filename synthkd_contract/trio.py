"""The tokens / lossmask / span trio of one shard: how its six files are named, and when it is sound.

One validator for the build's checks (`trio_alignment`, `shards_readable_by_megatron`) and for the
training loader (`SpanGPTDataset`). A trio is sound when

- megatron-core's `IndexedDataset` opens all three, with the contract's dtypes (read here by
  `indexed_dataset.read_index`, which accepts and reads exactly what megatron-core does without importing
  it or torch: the build's checks run in worker processes that never load either);
- they hold the same number of sequences, of the same lengths, grouped into the same documents;
- each index describes contiguous sequences (sequence i starts where sequence i-1 ends) and each
  `.bin` holds exactly those bytes: `sum(sequence_lengths) * itemsize`, no byte missing or extra;
- lossmask is in {0, 1}, span in {0, 1, 2}, lossmask == 0 exactly where span == 0, and every
  sequence ends with EOD at a position that carries 0/0 (see labels.py).

Values are read in chunks of `CHECK_CHUNK_TOKENS`, so memory stays bounded on shards of any size.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from synthkd_contract import settings as env
from synthkd_contract.constants import (
    ARRAY_DTYPES,
    ARRAY_KINDS,
    EOD_TOKEN_ID,
    PADDED_VOCAB_SIZE,
    SPAN_FINAL,
    SPAN_PROMPT,
    shard_prefix_name,
)
from synthkd_contract.indexed_dataset import DatasetIndex, read_index
from synthkd_contract.settings import Settings

if TYPE_CHECKING:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

TOKENS_KIND, LOSSMASK_KIND, SPAN_KIND = ARRAY_KINDS
TOKENS_SUFFIX = f"_{TOKENS_KIND}"
# largest value each array may hold (tokens: an id of the padded vocabulary)
MAX_VALUE = {TOKENS_KIND: PADDED_VOCAB_SIZE - 1, LOSSMASK_KIND: 1, SPAN_KIND: SPAN_FINAL}
CHECK_CHUNK_TOKENS = 1 << 22  # positions validated at a time


CACHE_DIR_ENV = env.CACHE_DIR.name  # where megatron-core's index caches of the trios go; default per user
CACHE_SUBDIR = "megatron"


def megatron_cache_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where megatron-core caches the document / sample / shuffle indices it builds over the trios, by default:
    a per-user directory, never the shared data root (a cache there is one any user of the root can plant a file
    in, and inside a sealed dataset it is an unlisted file).

    Args:
        environ: the environment: `SYNTHKD_CACHE_DIR` when set, else `$XDG_CACHE_HOME/synthkd`, else
            `~/.cache/synthkd`.

    Returns:
        That directory's `megatron/` subdirectory, absolute.
    """
    configured = Settings.read(environ).cache_dir
    if configured:
        return Path(configured).expanduser().absolute() / CACHE_SUBDIR
    base = Path(environ["XDG_CACHE_HOME"]) if environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base.expanduser().absolute() / "synthkd" / CACHE_SUBDIR


def index_cache_problems(cache_dir: Path | str | None) -> list[str]:
    """A problem per `.npy` file under megatron-core's index cache `cache_dir` that is not a plain numeric array:
    megatron-core loads its cached indices with `allow_pickle=True`, so an object array planted there (a pickle)
    would run code as the training loads it. Only each file's header is read.

    Args:
        cache_dir: the cache directory (`path_to_cache`); None or a missing directory has nothing to check.

    Returns:
        One problem per refused file, naming it.
    """
    if cache_dir is None or not Path(cache_dir).is_dir():
        return []
    problems = []
    for path in sorted(Path(cache_dir).rglob("*.npy")):
        try:
            with open(path, "rb") as handle:
                version = np.lib.format.read_magic(handle)
                if version == (1, 0):
                    dtype = np.lib.format.read_array_header_1_0(handle)[2]
                elif version == (2, 0):
                    dtype = np.lib.format.read_array_header_2_0(handle)[2]
                else:
                    raise ValueError(f"format version {version}, not one numpy.save writes for an index")
        except (OSError, ValueError) as error:
            problems.append(f"{path}: not a numpy index array ({error})")
            continue
        if dtype.hasobject:
            problems.append(f"{path}: holds Python objects (dtype {dtype}), a pickle, not an index")
    return problems


class TrioError(ValueError):
    """A path that cannot name a trio (its tokens prefix must end with `_tokens`)."""


def trio_prefixes(split_dir: Path, shard_index: int) -> dict[str, Path]:
    """kind -> IndexedDataset path prefix (no .bin/.idx) of one shard in one split directory."""
    return {kind: split_dir / shard_prefix_name(shard_index, kind) for kind in ARRAY_KINDS}


def shard_tokens_prefix(split_dir: Path, shard_index: int) -> Path:
    """The prefix that names the trio of one shard in one split directory: its tokens dataset's."""
    return split_dir / shard_prefix_name(shard_index, TOKENS_KIND)


def trio_files(split_dir: Path, shard_index: int) -> list[Path]:
    """The six files of one shard in one split directory: each kind's .bin and .idx."""
    prefixes = trio_prefixes(split_dir, shard_index).values()
    return [Path(f"{prefix}{ext}") for prefix in prefixes for ext in (".bin", ".idx")]


def sibling_prefix(tokens_prefix: str | Path, kind: str) -> str:
    """`…/shard_00_tokens` -> `…/shard_00_<kind>`; TrioError for a prefix that does not name a tokens dataset."""
    tokens_prefix = str(tokens_prefix)
    if not tokens_prefix.endswith(TOKENS_SUFFIX):
        raise TrioError(
            f"{tokens_prefix}: a trio is named by its tokens dataset, whose prefix ends with {TOKENS_SUFFIX!r} "
            f"(e.g. train/{shard_prefix_name(0, TOKENS_KIND)})"
        )
    return f"{tokens_prefix[: -len(TOKENS_KIND)]}{kind}"


def open_trio(tokens_prefix: str | Path, mmap: bool = True) -> dict[str, IndexedDataset]:
    """kind -> megatron-core IndexedDataset of each array of the trio (raises what megatron-core raises)."""
    return {kind: _indexed_dataset(sibling_prefix(tokens_prefix, kind), mmap) for kind in ARRAY_KINDS}


def _indexed_dataset(prefix: str, mmap: bool) -> IndexedDataset:
    # megatron-core (and torch under it) load only when a trio is opened: the Dagster code location imports this
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset(prefix, multimodal=False, mmap=mmap)


def validate_trio(
    tokens_prefix: str | Path, *, check_values: bool = True, sequences: tuple[int, int] | None = None
) -> list[str]:
    """Everything that keeps the trio of `tokens_prefix` from being sound, as sentences (empty: sound).

    The structure is always checked; with `check_values`, the values of the sequences
    `sequences = (first, end)` (all by default) too. Stops after the first group of problems that makes
    the next checks meaningless (missing files, unreadable index, dtypes, shapes, file sizes).
    """
    prefixes = {kind: sibling_prefix(tokens_prefix, kind) for kind in ARRAY_KINDS}
    missing = [f"{prefix}{ext}" for prefix in prefixes.values() for ext in (".bin", ".idx")]
    missing = [f"{path} is missing" for path in missing if not Path(path).is_file()]
    if missing:
        return missing
    datasets = {}
    for kind, prefix in prefixes.items():
        try:
            datasets[kind] = read_index(prefix)
        except Exception as error:  # what megatron-core's IndexedDataset would refuse: malformed, truncated, empty
            reason = f"{type(error).__name__}: {error}"
            return [f"{kind} dataset {prefix} not readable by megatron-core IndexedDataset: {reason}"]
    for group in (_dtype_problems, _shape_problems, _size_problems):
        problems = group(datasets)
        if problems:
            return problems
    if not check_values:
        return []
    lengths = datasets[TOKENS_KIND].sequence_lengths.astype(np.int64)
    return _value_problems(prefixes, lengths, sequences or (0, len(lengths)))


def _dtype_problems(datasets: dict[str, DatasetIndex]) -> list[str]:
    problems = []
    for kind, dataset in datasets.items():
        actual, expected = np.dtype(dataset.dtype), np.dtype(ARRAY_DTYPES[kind])
        if actual != expected:
            problems.append(f"{kind} dtype is {actual}, the contract says {expected}")
    return problems


def _shape_problems(datasets: dict[str, DatasetIndex]) -> list[str]:
    """Same sequences, same lengths, same documents as the tokens dataset."""
    tokens = datasets[TOKENS_KIND]
    problems = []
    for kind in (LOSSMASK_KIND, SPAN_KIND):
        dataset = datasets[kind]
        if len(dataset) != len(tokens):
            problems.append(f"{kind} has {len(dataset)} sequences, tokens has {len(tokens)}")
            continue
        differ = np.flatnonzero(dataset.sequence_lengths != tokens.sequence_lengths)
        if differ.size:
            first = int(differ[0])
            problems.append(
                f"{kind} sequence_lengths differ from tokens (first at sequence {first}: "
                f"{int(dataset.sequence_lengths[first])} vs {int(tokens.sequence_lengths[first])})"
            )
        if not np.array_equal(dataset.document_indices, tokens.document_indices):
            problems.append(f"{kind} document_indices differ from tokens")
    return problems


def _size_problems(datasets: dict[str, DatasetIndex]) -> list[str]:
    """Each index describes contiguous sequences, and its .bin holds exactly their bytes."""
    problems = []
    for kind, dataset in datasets.items():
        itemsize = np.dtype(ARRAY_DTYPES[kind]).itemsize
        lengths = dataset.sequence_lengths.astype(np.int64)
        expected_pointers = np.concatenate(([0], np.cumsum(lengths[:-1]))) * itemsize
        wrong = np.flatnonzero(dataset.sequence_pointers != expected_pointers)
        if wrong.size:
            first = int(wrong[0])
            problems.append(
                f"{kind} index {dataset.path_prefix}.idx does not describe contiguous sequences (sequence "
                f"{first} starts at byte {int(dataset.sequence_pointers[first])}, "
                f"expected {int(expected_pointers[first])})"
            )
            continue
        path = Path(f"{dataset.path_prefix}.bin")
        actual, needed = path.stat().st_size, int(lengths.sum()) * itemsize
        if actual != needed:
            problems.append(f"{kind} data file {path} holds {actual} bytes, its index describes {needed}")
    return problems


def _value_problems(prefixes: dict[str, str], lengths: np.ndarray, sequences: tuple[int, int]) -> list[str]:
    """The value rules over sequences [first, end), read chunk by chunk (contiguity is checked already)."""
    first, end = sequences
    if end <= first:
        return []
    starts = np.concatenate(([0], np.cumsum(lengths)))  # element offset of each sequence, and the total
    begin, stop = int(starts[first]), int(starts[end])
    last_positions = starts[first + 1 : end + 1] - 1  # where each sequence's EOD is

    def where(position: int) -> str:
        sequence = int(np.searchsorted(starts, position, side="right") - 1)
        return f"sequence {sequence}, position {position - int(starts[sequence])}"

    counts = dict.fromkeys((TOKENS_KIND, LOSSMASK_KIND, SPAN_KIND, "disagree", "no_eod", "eod_supervised"), 0)
    first_bad: dict[str, int] = {}  # key -> first position found
    first_value: dict[str, int] = {}  # kind -> its value there
    for chunk_begin in range(begin, stop, CHECK_CHUNK_TOKENS):
        count = min(CHECK_CHUNK_TOKENS, stop - chunk_begin)
        values = {  # every value of the chunk, read (not mapped: a read buffer is freed with the chunk)
            kind: np.fromfile(
                f"{prefixes[kind]}.bin",
                dtype=ARRAY_DTYPES[kind],
                count=count,
                offset=chunk_begin * np.dtype(ARRAY_DTYPES[kind]).itemsize,
            )
            for kind in ARRAY_KINDS
        }
        tokens, mask, span = values[TOKENS_KIND], values[LOSSMASK_KIND], values[SPAN_KIND]
        ends = last_positions[(last_positions >= chunk_begin) & (last_positions < chunk_begin + count)]
        local_ends = ends - chunk_begin
        end_tokens = tokens[local_ends]
        found = {
            TOKENS_KIND: np.flatnonzero((tokens < 0) | (tokens >= PADDED_VOCAB_SIZE)),
            LOSSMASK_KIND: np.flatnonzero(mask > MAX_VALUE[LOSSMASK_KIND]),
            SPAN_KIND: np.flatnonzero(span > MAX_VALUE[SPAN_KIND]),
            "disagree": np.flatnonzero((mask == 0) != (span == SPAN_PROMPT)),
            "no_eod": local_ends[end_tokens != EOD_TOKEN_ID],
            "eod_supervised": local_ends[(mask[local_ends] != 0) | (span[local_ends] != 0)],
        }
        for key, positions in found.items():
            counts[key] += positions.size
            if positions.size and key not in first_bad:
                first_bad[key] = chunk_begin + int(positions[0])
                if key in values:
                    first_value[key] = int(values[key][positions[0]])
    problems = [
        f"{kind} value {first_value[kind]} outside [0, {MAX_VALUE[kind]}] at {counts[kind]} positions, "
        f"first at {where(first_bad[kind])}"
        for kind in ARRAY_KINDS
        if counts[kind]
    ]
    sentences = {
        "disagree": f"lossmask == 0 and span == 0 disagree at {counts['disagree']} positions",
        "no_eod": f"{counts['no_eod']} documents do not end with EOD ({EOD_TOKEN_ID})",
        "eod_supervised": f"the last (EOD) position of {counts['eod_supervised']} documents is not 0/0",
    }
    problems += [f"{sentence}, first at {where(first_bad[key])}" for key, sentence in sentences.items() if counts[key]]
    return problems
