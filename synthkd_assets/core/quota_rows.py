"""The rows the quota plan draws from, held as counts by hash range and read again only where a budget ends
(docs/pool.md "How the quota selects rows").

A plan keeps, per skill bucket, a prefix of the bucket's rows in quota-hash order. Its memory must not grow with
the corpus (benchmarks/README.md, "The quota plan out of core"), so the rows are read once, file by file, into
token and row counts per (skill bucket, ctx bucket, hash bin): the hash's range [0, 1) cut into `bins` equal
bins. A budget's prefix takes every bin before the one where the bucket's running total passes the budget from
those counts, and reads again (`gather`) only the rows of that bin and a few after it. Each file's quota hashes,
skill and ctx codes and token counts are kept on disk (a temporary directory, removed on `close`) so that a
second read hashes nothing; a row's synth_id is read from its file only when its row is gathered.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from synthkd_assets.core.parallel import process_directory, remove_dead_process_directories
from synthkd_assets.core.row_sizes import current_row_sizes
from synthkd_contract.buckets import CTX_BUCKETS, QUOTA_SALT, SKILL_BUCKETS, ctx_codes, skill_bucket
from synthkd_contract.manifest_seal import HashedFile
from synthkd_contract.splits import stable_unit_intervals

QUOTA_HASH_BINS = 1 << 16  # the quota hash's range in this many bins: ~1,200 rows a bin at the real corpus's size
QUOTA_SPILL_PREFIX = "synthkd-quota-"  # a plan's temporary directory: this, the process id, a suffix
HASHED_IDS_AT_ONCE = 65_536  # synth_ids made Python strings at a time to hash them
_PART_DTYPE = np.dtype([("unit", "<f8"), ("tokens", "<i8"), ("skill", "<i2"), ("ctx", "<i2")])


class QuotaRow(NamedTuple):
    """One tokenized conversation as the quota sees it: its id, cell and token count."""

    synth_id: str
    skill: str
    ctx: str
    tokens: int


class GatheredRows(NamedTuple):
    """Rows read again (`QuotaRows.gather`), in input order: their quota hashes, codes, token counts and ids."""

    units: np.ndarray  # float64
    skill: np.ndarray  # int16, an index into SKILL_BUCKETS
    ctx: np.ndarray  # int16, an index into CTX_BUCKETS
    tokens: np.ndarray  # int64
    ids: list[str]

    def rows(self, places: Iterable[int] | None = None) -> list[QuotaRow]:
        """These rows (every one when None) as QuotaRows, in the order of `places`."""
        chosen = range(len(self.ids)) if places is None else places
        return [
            QuotaRow(self.ids[i], SKILL_BUCKETS[self.skill[i]], CTX_BUCKETS[self.ctx[i]], int(self.tokens[i]))
            for i in chosen
        ]


class _Part:
    """One file's rows (or one batch given in memory): their hashes, codes and tokens, on disk or in memory, and
    how to read their synth_ids again."""

    def __init__(self, table: np.ndarray, spill: Path | None, ids: Callable[[], pa.Array]) -> None:
        self._table: np.ndarray | None = None
        self._path: Path | None = None
        if spill is None:
            self._table = table
        else:
            self._path = spill
            np.save(spill, table, allow_pickle=False)
        self.ids = ids

    def table(self) -> np.ndarray:
        return self._table if self._table is not None else np.load(self._path, allow_pickle=False)


def _merge_counts(counts: tuple[np.ndarray, np.ndarray], lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values, counts) of token counts, with `lengths` added."""
    values, how_many = length_counts(lengths)
    merged, inverse = np.unique(np.concatenate([counts[0], values]), return_inverse=True)
    return merged, np.bincount(inverse, weights=np.concatenate([counts[1], how_many]), minlength=len(merged)).astype(
        np.int64
    )


class QuotaRows:
    """Every SYNTH row the quota draws from: token and row counts per (skill, ctx, hash bin), each skill bucket's
    token counts (for its median), and the rows themselves, read again by hash range (`gather`).

    Rows excluded by id (`exclude`) leave the usable counts and every later `gather`; until the first exclusion the
    usable counts are the counts themselves, and no row is added after it. A `QuotaRows` made with `spill` keeps
    each part's arrays in a temporary directory: use it as a context manager, or `close` it.
    """

    def __init__(self, bins: int = QUOTA_HASH_BINS, spill: bool = False, salt: str = QUOTA_SALT) -> None:
        if bins < 1:
            raise ValueError(f"bins {bins} < 1")
        self.bins, self.salt = bins, salt
        shape = (len(SKILL_BUCKETS), len(CTX_BUCKETS), bins)
        self.tokens = np.zeros(shape, dtype=np.int64)
        self.rows = np.zeros(shape, dtype=np.int64)
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self._lengths = [empty] * len(SKILL_BUCKETS)  # (token counts, rows of each) per skill bucket, every row
        # the same three of the rows not excluded: the arrays above until the first exclusion copies them
        self.usable_tokens, self.usable_rows, self._usable_lengths = self.tokens, self.rows, self._lengths
        self.unusable: set[str] = set()
        self._parts: list[_Part] = []
        if spill:
            remove_dead_process_directories(QUOTA_SPILL_PREFIX)  # those of plans killed with SIGKILL
        self._spill = process_directory(QUOTA_SPILL_PREFIX) if spill else None

    def __enter__(self) -> QuotaRows:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Remove the temporary directory, if any."""
        if self._spill is not None:
            shutil.rmtree(self._spill, ignore_errors=True)

    def add(
        self,
        ids: pa.Array,
        skill: np.ndarray,
        ctx: np.ndarray,
        tokens: np.ndarray,
        read_ids: Callable[[], pa.Array] | None = None,
    ) -> None:
        """Add these rows (after every row added before): their quota hashes are taken here.

        Args:
            ids: their synth_ids.
            skill: their skill buckets, as indices into SKILL_BUCKETS.
            ctx: their ctx buckets, as indices into CTX_BUCKETS.
            tokens: their token counts.
            read_ids: reads `ids` again when rows are gathered (default: `ids` are kept in memory).

        Raises:
            ValueError: rows were excluded already (the usable counts would miss these rows).
        """
        if self.usable_tokens is not self.tokens:
            raise ValueError("rows added after an exclusion: add every row first")
        units = np.empty(len(ids), dtype=np.float64)
        for lo in range(0, len(ids), HASHED_IDS_AT_ONCE):
            chunk = ids.slice(lo, HASHED_IDS_AT_ONCE).to_pylist()
            units[lo : lo + len(chunk)] = stable_unit_intervals(self.salt, chunk)
        table = np.empty(len(ids), dtype=_PART_DTYPE)
        table["unit"], table["tokens"], table["skill"], table["ctx"] = units, tokens, skill, ctx
        flat = (table["skill"].astype(np.int64) * len(CTX_BUCKETS) + table["ctx"]) * self.bins + self._bins(units)
        size = self.tokens.size
        # float weights are exact for integer sums below 2**53
        tokens_added = np.bincount(flat, weights=table["tokens"], minlength=size).astype(np.int64)
        rows_added = np.bincount(flat, minlength=size)
        self.tokens += tokens_added.reshape(self.tokens.shape)
        self.rows += rows_added.reshape(self.rows.shape)
        for s in np.unique(table["skill"]).tolist():
            self._lengths[s] = _merge_counts(self._lengths[s], table["tokens"][table["skill"] == s])
        spill = self._spill / f"{len(self._parts)}.npy" if self._spill is not None else None
        self._parts.append(_Part(table, spill, read_ids or (lambda: ids)))

    def _bins(self, units: np.ndarray) -> np.ndarray:
        # a unit just below 1 times a bin count that is not a power of two can round up to the count itself
        return np.minimum((units * self.bins).astype(np.int64), self.bins - 1)

    def grids(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """Tokens and rows per (skill, ctx) cell of every row.

        Returns:
            (tokens, rows) of the cells that hold a row, in (SKILL_BUCKETS, CTX_BUCKETS) order.
        """
        return cell_counts(self.tokens.sum(axis=2), self.rows.sum(axis=2))

    def held_tokens(self) -> list[int]:
        """The usable tokens of each skill bucket, in SKILL_BUCKETS order."""
        return [int(n) for n in self.usable_tokens.sum(axis=(1, 2))]

    def usable_length_counts(self, skill: int) -> tuple[np.ndarray, np.ndarray]:
        """(distinct token counts ascending, rows of each) of a skill bucket's usable rows (by its index)."""
        return self._usable_lengths[skill]

    def median_tokens(self, skill: int) -> int:
        """The median (lower middle) token count of every row of a skill bucket (by its index), 0 for none."""
        return median_of_counts(*self._lengths[skill])

    def gather(self, wanted: Callable[[np.ndarray], np.ndarray], usable: bool = True) -> GatheredRows:
        """The rows `wanted` marks, read again part by part, their synth_ids from their files.

        Args:
            wanted: a boolean mask over a part's table (fields unit, tokens, skill, ctx).
            usable: leave out the rows whose synth_id was excluded (`exclude`).

        Returns:
            The rows, in input order.

        Raises:
            RuntimeError: a file's synth_ids changed since it was read (`tokenized_quota_rows`).
        """
        units, skill, ctx, tokens, ids = [], [], [], [], []
        for part in self._parts:
            table = part.table()
            places = np.flatnonzero(wanted(table))
            if not len(places):
                continue
            part_ids = part.ids().take(pa.array(places)).to_pylist()
            if usable and self.unusable:
                keep = np.array([i not in self.unusable for i in part_ids], dtype=bool)
                places, part_ids = places[keep], [i for i, k in zip(part_ids, keep) if k]
            chosen = table[places]
            units.append(chosen["unit"])
            skill.append(chosen["skill"])
            ctx.append(chosen["ctx"])
            tokens.append(chosen["tokens"])
            ids += part_ids
        empty = np.zeros(0, dtype=_PART_DTYPE)
        joined = [
            np.concatenate(arrays) if arrays else empty[name]
            for arrays, name in zip((units, skill, ctx, tokens), ("unit", "skill", "ctx", "tokens"))
        ]
        return GatheredRows(joined[0], joined[1], joined[2], joined[3].astype(np.int64), ids)

    def gather_bins(self, ranges: Mapping[int, tuple[int, int]]) -> dict[int, GatheredRows]:
        """The usable rows of each skill bucket whose hash bin is in its range, in one read.

        Args:
            ranges: [lo, hi) bins by skill bucket (its index in SKILL_BUCKETS).

        Returns:
            Each bucket's rows, in input order.
        """

        def wanted(table: np.ndarray) -> np.ndarray:
            bins = self._bins(table["unit"])
            mask = np.zeros(len(table), dtype=bool)
            for s, (lo, hi) in ranges.items():
                mask |= (table["skill"] == s) & (bins >= lo) & (bins < hi)
            return mask

        found = self.gather(wanted)
        by_skill = {}
        for s in ranges:
            places = np.flatnonzero(found.skill == s)
            by_skill[s] = GatheredRows(
                found.units[places],
                found.skill[places],
                found.ctx[places],
                found.tokens[places],
                [found.ids[i] for i in places.tolist()],
            )
        return by_skill

    def exclude(self, ids: Iterable[str]) -> None:
        """Take every row whose synth_id is one of `ids` out of the usable counts and of every later `gather`."""
        ids = set(ids) - self.unusable
        if self.usable_tokens is self.tokens:  # the first exclusion: the usable counts become their own
            self.usable_tokens, self.usable_rows = self.tokens.copy(), self.rows.copy()
            self._usable_lengths = [(values, counts.copy()) for values, counts in self._lengths]
        units = stable_unit_intervals(self.salt, sorted(ids))
        found = self.gather(lambda table: np.isin(table["unit"], units), usable=False)
        places = np.array([i for i, synth_id in enumerate(found.ids) if synth_id in ids], dtype=np.int64)
        where = (found.skill[places], found.ctx[places], self._bins(found.units[places]))
        np.subtract.at(self.usable_tokens, where, found.tokens[places])
        np.subtract.at(self.usable_rows, where, 1)
        for s in np.unique(found.skill[places]).tolist():
            values, counts = self._usable_lengths[s]
            np.subtract.at(counts, np.searchsorted(values, found.tokens[places][found.skill[places] == s]), 1)
        self.unusable.update(ids)

    def kept(
        self, rates: Mapping[str, Mapping[str, float]], excluded: Iterable[str], salt: str, one_bucket: bool = False
    ) -> QuotaRows:
        """The rows a plan keeps (`quota_keep`'s rule), hashed with `salt`: what the source mix selects SYNTH's
        rows from.

        Args:
            rates: the plan's rate per skill and ctx bucket.
            excluded: the synth_ids the plan drops whatever their hash (`excluded_ids`).
            salt: the kept rows' hash.
            one_bucket: every kept row in the first skill bucket (one prefix over all of them).

        Returns:
            A QuotaRows of the kept rows, in input order, spilled when this one is: close it.
        """
        rate = np.array([[rates[b][c] for c in CTX_BUCKETS] for b in SKILL_BUCKETS], dtype=np.float64)
        dropped = pa.array(sorted(set(excluded)), pa.large_string())
        held = QuotaRows(self.bins, spill=self._spill is not None, salt=salt)
        try:
            for part in self._parts:
                table = part.table()
                places = np.flatnonzero(table["unit"] < rate[table["skill"], table["ctx"]])
                if not len(places):
                    continue
                ids = part.ids().take(pa.array(places))
                if len(dropped):
                    mask = ~pc.is_in(ids.cast(pa.large_string()), value_set=dropped).to_numpy(zero_copy_only=False)
                    places, ids = places[mask], ids.filter(pa.array(mask))
                chosen = table[places]
                skills = np.zeros(len(places), dtype=np.int16) if one_bucket else chosen["skill"]
                held.add(ids, skills, chosen["ctx"], chosen["tokens"], _taken_ids(part, places))
        except BaseException:
            held.close()
            raise
        return held

    def all_rows(self) -> list[QuotaRow]:
        """Every row as a QuotaRow, in input order (for small inputs: each row a Python object)."""
        return self.gather(lambda table: np.ones(len(table), dtype=bool), usable=False).rows()

    @classmethod
    def from_rows(cls, rows: Sequence[QuotaRow], bins: int = QUOTA_HASH_BINS) -> QuotaRows:
        """These rows, in order, held in memory.

        Raises:
            ValueError: a row's skill or ctx is not a bucket.
        """
        if unknown := sorted({row.skill for row in rows} - set(SKILL_BUCKETS)):
            raise ValueError(f"not skill buckets {list(SKILL_BUCKETS)}: {unknown}")
        held = cls(bins)
        if rows:
            held.add(
                pa.array([row.synth_id for row in rows], pa.large_string()),
                np.fromiter((SKILL_BUCKETS.index(row.skill) for row in rows), np.int16, len(rows)),
                np.fromiter((CTX_BUCKETS.index(row.ctx) for row in rows), np.int16, len(rows)),
                np.fromiter((row.tokens for row in rows), np.int64, len(rows)),
            )
        return held


def _taken_ids(part: _Part, places: np.ndarray) -> Callable[[], pa.Array]:
    return lambda: part.ids().take(pa.array(places))


def length_counts(lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct token counts ascending, rows of each) of these token counts."""
    return np.unique(np.asarray(lengths, dtype=np.int64), return_counts=True)


def median_of_counts(values: np.ndarray, counts: np.ndarray) -> int:
    """The median (lower middle) of token counts given as distinct values and the rows of each, 0 for none.

    Args:
        values: distinct token counts, ascending.
        counts: the rows of each (>= 0).

    Returns:
        The token count at place (n - 1) // 2 of the n rows in order.
    """
    total = int(np.sum(counts))
    if not total:
        return 0
    return int(values[np.searchsorted(np.cumsum(counts), (total - 1) // 2, side="right")])


def cell_counts(tokens: np.ndarray, rows: np.ndarray) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """Tokens and rows per (skill, ctx) cell, as dicts.

    Args:
        tokens: tokens per [skill, ctx] (indices into SKILL_BUCKETS, CTX_BUCKETS).
        rows: rows per [skill, ctx].

    Returns:
        (tokens, rows) of the cells that hold a row, in (SKILL_BUCKETS, CTX_BUCKETS) order.
    """
    held = list(zip(*np.nonzero(rows)))
    names = [(SKILL_BUCKETS[s], CTX_BUCKETS[c]) for s, c in held]
    return (
        dict(zip(names, [int(tokens[s, c]) for s, c in held])),
        dict(zip(names, [int(rows[s, c]) for s, c in held])),
    )


def tokenized_quota_rows(
    paths: Iterable[Path],
    exercise_table: Mapping[str, str] | None = None,
    hashed: Mapping[Path, HashedFile] | None = None,
    bins: int = QUOTA_HASH_BINS,
) -> QuotaRows:
    """Every row of these synth_tokenized files as the quota sees it, a file at a time: from each file's row sizes
    while they are current (`current_row_sizes`), else from its own columns read in bounded batches.

    Args:
        paths: synth_tokenized Parquet files.
        exercise_table: the build's exercise table (exercise_skill_table); the contract's if None.
        hashed: what the tokenize steps hashed as they wrote these files (`current_row_sizes`).
        bins: the hash bins (`QuotaRows`).

    Returns:
        Their QuotaRows, spilled to a temporary directory: close it (or use it in a `with`).

    Raises:
        UnknownExercise: a row's exercise is in no table (`skill_bucket`).
    """
    held = QuotaRows(bins, spill=True)
    skill_of: dict[str, int] = {}  # each exercise's bucket asked once
    try:
        for path in paths:
            source, ids, exercises, tokens = _quota_columns(path, hashed)
            index = pc.dictionary_encode(exercises).combine_chunks()
            for name in index.dictionary.to_pylist():
                if name not in skill_of:
                    skill_of[name] = SKILL_BUCKETS.index(skill_bucket(name, exercise_table))
            codes = np.array([skill_of[name] for name in index.dictionary.to_pylist()], dtype=np.int16)
            skills = codes[index.indices.to_numpy()] if len(codes) else np.zeros(0, dtype=np.int16)
            held.add(ids, skills, ctx_codes(tokens), tokens, _ids_reader(source, len(ids)))
    except BaseException:
        held.close()
        raise
    return held


def _ids_reader(path: Path, length: int) -> Callable[[], pa.Array]:
    """Reads the synth_id column of `path` again, refusing a file changed since it was first read."""
    stat = path.stat()

    def read() -> pa.Array:
        now = path.stat()
        ids = pq.read_table(path, columns=["synth_id"])["synth_id"].combine_chunks()
        if (now.st_size, now.st_mtime_ns) != (stat.st_size, stat.st_mtime_ns) or len(ids) != length:
            raise RuntimeError(
                f"{path} changed while the quota plan read it: plan again once the build that writes it is done"
            )
        return ids

    return read


def _quota_columns(
    path: Path, hashed: Mapping[Path, HashedFile] | None = None
) -> tuple[Path, pa.Array, pa.Array, np.ndarray]:
    """The file read, and synth_id, exercise and token count of every row of a synth_tokenized file: from its row
    sizes (`current_row_sizes`), or, for a file without current ones, its own columns read in bounded batches."""
    if (sizes := current_row_sizes(path, hashed)) is not None:
        table = pq.read_table(sizes, columns=["synth_id", "exercise", "tokens"])
        return sizes, table["synth_id"].combine_chunks(), table["exercise"], table["tokens"].to_numpy().astype(np.int64)
    ids, exercises, lengths = [], [], []
    # loss_mask (uint8) is as long as tokens (int32): its lengths for a quarter of the bytes read
    for batch in pq.ParquetFile(path).iter_batches(columns=["synth_id", "exercise", "loss_mask"], batch_size=4096):
        ids.append(batch.column("synth_id"))
        exercises.append(batch.column("exercise"))
        lengths.append(pc.list_value_length(batch.column("loss_mask")).to_numpy().astype(np.int64))
    joined = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return path, pa.chunked_array(ids, pa.string()).combine_chunks(), pa.chunked_array(exercises, pa.string()), joined
