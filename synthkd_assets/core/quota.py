"""The B x C quota grid on tokens (docs/pool.md#the-quota-grid-on-tokens; 004): keep rates per (skill, ctx) cell for a
target skill mix.

004 makes tokens the authoritative size, so the plan solves on token counts (synth_tokenized's
`bucket_tokens`, summed by core/buckets.py `grids_from_reports`) and reports rows beside them. It only
downsamples: a row is kept iff stable_unit_interval(QUOTA_SALT, synth_id) < its cell's rate (the hash of
core/sampling.py with the pool's own salt), so a row's fate depends on its synth_id and the plan, never
on row order or sharding, and is independent of the 001 sampling rules applied before it.

The solver, for shares t_b (the mix renormalized over the feasible buckets) and available tokens T_b:
a bucket with t_b > 0 and T_b > 0 is feasible; one with t_b > 0 and no tokens is infeasible and reported.
The kept total K is the largest with K t_b <= T_b for every feasible b, i.e. K = min_b T_b / t_b, and
every cell of bucket b keeps K t_b / T_b <= 1 (the scarcest bucket relative to its target keeps all of
its rows). Within a bucket the ctx cells share the rate: the ctx mix is the curriculum's
(docs/pool.md#the-quota-grid-on-tokens). `balance_tokens` (004) replaces the mix by equal shares over the buckets that
hold tokens, which truncates every larger bucket to the smallest.

A rate drawn row by row keeps K t_b only on average: one long row decides a bucket's share. So the plan selects
rows (`plan_quota_selection`, docs/pool.md "How the quota selects rows"): each bucket not kept whole keeps the
longest prefix of its rows in quota-hash order within its token budget K t_b, the rate becoming the hash of the
first row left out; a row that does not fit and holds more than OVERSIZED_ROW_SHARE of the kept total is skipped
(listed in the plan's `excluded`, dropped by `quota_keep`) rather than ending the prefix. A bucket left short of
its budget lowers K to what it holds; one whose long rows leave it under half its budget is solved again without
them (what is feasible). So every kept share is within QUOTA_SHARE_TOLERANCE of its target whatever the length
distribution (within one typical row of a tiny pool), or the plan says which rows prevent it.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from synthkd_assets.core.buckets import Cell, nested_grid
from synthkd_assets.core.parallel import thread_map
from synthkd_assets.core.row_sizes import current_row_sizes
from synthkd_contract.buckets import (
    CTX_BUCKET_MAX_TOKENS,
    CTX_BUCKETS,
    EXERCISE_SKILL_BUCKET,
    QUOTA_SALT,
    SKILL_BUCKET_NAMES,
    SKILL_BUCKETS,
    SKILL_MIX,
    ctx_codes,
    skill_bucket,
)
from synthkd_contract.manifest_seal import HashedFile
from synthkd_contract.splits import stable_unit_interval, stable_unit_intervals

QUOTA_RULE = (
    "keep iff stable_unit_interval(salt, synth_id) < rates[skill_bucket][ctx_bucket] and synth_id not in excluded; "
    "K is the largest total with K * share[b] <= tokens[b] in every feasible bucket; rates[b][c] is the hash of "
    "the first row of bucket b, in hash order, past its budget K * share[b] (1.0 when it is kept whole); a row "
    "that does not fit and holds more than the oversized share of K is excluded instead; rows that leave their "
    "bucket short are excluded and the plan solved again without them"
)
# the most an achieved skill or source share may miss its target (docs/pool.md "How the quota selects rows")
QUOTA_SHARE_TOLERANCE = 0.01
# a row that does not fit its bucket's budget and holds more than this share of the kept total is skipped, not the
# end of the hash-ordered prefix: the prefix then misses its budget by less than this share
OVERSIZED_ROW_SHARE = 0.0025
EXCLUDED_ROWS_NAMED = 20  # excluded rows a failed check's text names (the plan lists them all)
MAX_SELECTION_ROUNDS = 64  # the kept total is lowered at most this many times


class QuotaRow(NamedTuple):
    """One tokenized conversation as the quota sees it: its id, cell and token count."""

    synth_id: str
    skill: str
    ctx: str
    tokens: int


@dataclass(frozen=True, eq=False)  # arrays: compare `rows()`
class QuotaColumns:
    """Every SYNTH row the quota draws from, a column a field (row i is `rows([i])[0]`): a plan over tens of
    millions of rows holds a few arrays, not a Python object per row (benchmarks/README.md, "The quota plan's
    rows as columns")."""

    synth_id: pa.LargeStringArray  # one array: taking rows from a chunked one combines its chunks every time
    skill: np.ndarray  # int16: the row's skill bucket, an index into `skills`
    ctx: np.ndarray  # int16: the row's ctx bucket, an index into CTX_BUCKETS
    tokens: np.ndarray  # int64
    skills: tuple[str, ...] = SKILL_BUCKETS  # the names the skill codes stand for (SKILL_BUCKETS first)

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_rows(cls, rows: Sequence[QuotaRow]) -> QuotaColumns:
        """The columns of these rows, in order."""
        skills = tuple(dict.fromkeys([*SKILL_BUCKETS, *(row.skill for row in rows)]))
        code = {name: i for i, name in enumerate(skills)}
        return cls(
            pa.array([row.synth_id for row in rows], pa.large_string()),
            np.fromiter((code[row.skill] for row in rows), np.int16, len(rows)),
            np.fromiter((CTX_BUCKETS.index(row.ctx) for row in rows), np.int16, len(rows)),
            np.fromiter((row.tokens for row in rows), np.int64, len(rows)),
            skills,
        )

    def ids(self, indices: np.ndarray) -> list[str]:
        """The synth_ids of these rows, in that order."""
        return self.synth_id.take(pa.array(np.asarray(indices, dtype=np.int64))).to_pylist()

    def rows(self, indices: np.ndarray | None = None) -> list[QuotaRow]:
        """These rows (every row when None) as QuotaRows, in that order."""
        indices = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64)
        skills, ctxs = self.skill[indices].tolist(), self.ctx[indices].tolist()
        return [
            QuotaRow(synth_id, self.skills[skill], CTX_BUCKETS[ctx], tokens)
            for synth_id, skill, ctx, tokens in zip(self.ids(indices), skills, ctxs, self.tokens[indices].tolist())
        ]

    def grids(self, indices: np.ndarray | None = None) -> tuple[dict[Cell, int], dict[Cell, int]]:
        """Tokens and rows per (skill, ctx) cell of these rows (every row when None): the cells they hold."""
        chosen = slice(None) if indices is None else indices
        cells = self.skill[chosen].astype(np.int64) * len(CTX_BUCKETS) + self.ctx[chosen]
        size = len(self.skills) * len(CTX_BUCKETS)
        rows = np.bincount(cells, minlength=size)
        tokens = np.zeros(size, dtype=np.int64)
        np.add.at(tokens, cells, self.tokens[chosen])  # exact integer sums
        held = np.flatnonzero(rows).tolist()
        names = [(self.skills[i // len(CTX_BUCKETS)], CTX_BUCKETS[i % len(CTX_BUCKETS)]) for i in held]
        return dict(zip(names, tokens[held].tolist())), dict(zip(names, rows[held].tolist()))


class PrefixSelection(NamedTuple):
    """The rows a hash-ordered prefix keeps within a token budget (`hash_ordered_prefix`)."""

    rate: float  # the hash of the first row left out (1.0 when every row fits)
    kept: list[Any]  # the kept rows, in hash order
    skipped: list[Any]  # rows below `rate` that did not fit and were oversized: excluded by id
    tokens: int  # the kept rows' tokens


def hash_order(units: np.ndarray, id_of: Callable[[int], str]) -> np.ndarray:
    """The rows by hash, then synth_id, then input order: numpy's stable sort by hash, unless two rows share a
    hash (a repeated id, or two ids on one float), which Python's sort of (hash, synth_id) then orders.

    Args:
        units: each row's hash (`stable_unit_intervals`), in input order.
        id_of: a row's synth_id by its place in the input (asked only when two hashes are equal).

    Returns:
        The rows' places in that order (int64).
    """
    order = np.argsort(units, kind="stable")
    ordered = units[order]
    if np.any(ordered[1:] == ordered[:-1]):
        order = np.asarray(sorted(range(len(units)), key=lambda i: (units[i], id_of(i))), dtype=np.int64)
    return order


def prefix_places(
    units: np.ndarray, lengths: np.ndarray, budget: float, oversized: float
) -> tuple[float, np.ndarray, np.ndarray, int]:
    """`hash_ordered_prefix` of rows already in hash order, by their places in that order.

    Args:
        units: each row's hash, ascending.
        lengths: each row's tokens (>= 0).
        budget: the most tokens the kept rows may hold.
        oversized: a row that does not fit and holds more tokens than this is skipped instead of ending the prefix.

    Returns:
        (rate, kept places, skipped places, kept tokens): the hash of the first row left out (1.0 when every row
        fits), the kept and skipped places in order, and the kept rows' tokens.
    """
    n = len(lengths)
    sums = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=sums[1:])  # sums[j]: the tokens of the rows before place j
    limit = math.floor(budget) if math.isfinite(budget) else None  # an integer total fits iff <= floor(budget)
    skipped: list[int] = []
    skipped_tokens = 0
    while True:
        # the first place j (from the one after the last skipped) whose row does not fit: the kept rows before it,
        # plus it, exceed the budget
        start = skipped[-1] + 1 if skipped else 0
        j = n if limit is None else max(int(np.searchsorted(sums, limit + skipped_tokens, side="right")) - 1, start)
        if j >= n:
            kept = np.setdiff1d(np.arange(n), skipped, assume_unique=True)
            return 1.0, kept, np.asarray(skipped, dtype=np.int64), int(sums[n]) - skipped_tokens
        if lengths[j] > oversized:
            skipped.append(j)
            skipped_tokens += int(lengths[j])
            continue
        # the rule keeps hash < rate: rows sharing the stopping row's hash (two ids, one float) go with it
        unit, end = units[j], j
        while end > 0 and units[end - 1] == unit:
            end -= 1
        kept = np.setdiff1d(np.arange(end), skipped, assume_unique=True)
        return float(unit), kept, np.asarray(skipped, dtype=np.int64), int(lengths[kept].sum())


def hash_ordered_prefix(
    rows: Iterable[Any], salt: str, budget: float, oversized: float, tokens_of: Any = None
) -> PrefixSelection:
    """The longest prefix of `rows` in hash order whose tokens stay within `budget`, skipping oversized rows.

    Args:
        rows: rows with a `synth_id` and a `tokens` count (or tuples (synth_id, tokens)).
        salt: the hash's salt (stable_unit_interval(salt, synth_id) orders the rows).
        budget: the most tokens the kept rows may hold.
        oversized: a row that does not fit and holds more tokens than this is skipped (and excluded by its id)
            instead of ending the prefix.
        tokens_of: how to read a row's (synth_id, tokens); default: the row's fields, or the tuple itself.

    Returns:
        The PrefixSelection: the threshold rate (hash of the first row left out, 1.0 when all fit), the kept
        rows, the skipped oversized rows below the rate, and the kept tokens.
    """
    read = tokens_of or (lambda row: (row[0], row[-1]))
    rows = list(rows)
    ids, lengths = zip(*map(read, rows)) if rows else ((), ())
    units = stable_unit_intervals(salt, ids)
    order = hash_order(units, ids.__getitem__)
    rate, kept, skipped, tokens = prefix_places(
        units[order], np.fromiter(lengths, np.int64, len(lengths))[order], budget, oversized
    )
    return PrefixSelection(rate, [rows[i] for i in order[kept]], [rows[i] for i in order[skipped]], tokens)


@dataclass(frozen=True)
class QuotaTargets:
    """What the quota grid aims for: `skill_mix`, token shares per skill bucket (renormalized over the
    buckets that hold tokens; a bucket left out or at 0 is dropped), or, with `balance_tokens` (004), equal
    token shares over every bucket that holds tokens."""

    skill_mix: Mapping[str, float] = field(default_factory=lambda: dict(SKILL_MIX))
    balance_tokens: bool = False

    def __post_init__(self) -> None:
        problems = []
        if unknown := sorted(set(self.skill_mix) - set(SKILL_BUCKETS)):
            problems.append(f"skill_mix names {unknown}, not skill buckets {list(SKILL_BUCKETS)}")
        for bucket, share in sorted(self.skill_mix.items()):
            if not (isinstance(share, int | float) and not isinstance(share, bool)) or not 0 <= share < math.inf:
                problems.append(f"skill_mix[{bucket!r}] = {share!r} is not a finite number >= 0")
        if not problems and not math.fsum(self.skill_mix.values()) > 0:
            problems.append("skill_mix shares sum to 0: no bucket would be kept")
        if not isinstance(self.balance_tokens, bool):
            problems.append(f"balance_tokens {self.balance_tokens!r} is not a bool")
        if problems:
            raise ValueError("invalid quota targets: " + "; ".join(problems))
        # a read-only copy in bucket order: the caller's dict can change neither the targets nor their bytes
        mix = {b: float(self.skill_mix[b]) for b in SKILL_BUCKETS if b in self.skill_mix}
        object.__setattr__(self, "skill_mix", MappingProxyType(mix))

    def to_dict(self) -> dict[str, Any]:
        return {"skill_mix": dict(self.skill_mix), "balance_tokens": self.balance_tokens}


def _check_grid(name: str, grid: Mapping[Cell, int]) -> None:
    """ValueError naming the cells of `grid` that are not (skill, ctx) pairs or hold no count >= 0."""
    cells = {(b, c) for b in SKILL_BUCKETS for c in CTX_BUCKETS}
    bad = [f"{key!r}" for key in grid if key not in cells]
    counts = [(key, n) for key, n in grid.items() if key in cells]
    bad += [
        f"{key!r}: {n!r}"
        for key, n in counts
        if isinstance(n, bool) or not (isinstance(n, numbers.Integral) and n >= 0)
    ]
    if bad:
        raise ValueError(f"{name} grid: not a count >= 0 of a (skill bucket, ctx bucket) cell: {', '.join(bad)}")


def plan_quota_grid(tokens: Mapping[Cell, int], rows: Mapping[Cell, int], targets: QuotaTargets) -> dict[str, Any]:
    """The quota plan for the available tokens and rows per (skill, ctx) cell: the keep rate of every cell,
    whether every target is reachable (`feasible`, each unreachable one in `infeasible` with its reason),
    and the available / expected tokens and rows per cell and per skill bucket. JSON-able; every sum is
    math.fsum, so neither the numbers nor the bytes depend on the order of the counts."""
    _check_grid("tokens", tokens)
    _check_grid("rows", rows)
    available = {b: sum(int(tokens.get((b, c), 0)) for c in CTX_BUCKETS) for b in SKILL_BUCKETS}  # exact
    notes: list[str] = []
    infeasible: list[dict[str, Any]] = []
    if targets.balance_tokens:
        weights = {b: 1.0 if available[b] > 0 else 0.0 for b in SKILL_BUCKETS}
        if empty := [b for b in SKILL_BUCKETS if available[b] == 0]:
            notes.append(f"balance_tokens: {', '.join(empty)} hold no tokens; balanced over the others")
    else:
        weights = {b: targets.skill_mix.get(b, 0.0) for b in SKILL_BUCKETS}
        for b in SKILL_BUCKETS:
            if weights[b] > 0 and available[b] == 0:
                reason = f"no tokens in {b} ({SKILL_BUCKET_NAMES[b]}): its target share cannot be met"
                infeasible.append({"bucket": b, "target": weights[b], "reason": reason})
    feasible_buckets = [b for b in SKILL_BUCKETS if weights[b] > 0 and available[b] > 0]
    weight_total = math.fsum(weights[b] for b in feasible_buckets)
    shares = {b: weights[b] / weight_total if b in feasible_buckets else 0.0 for b in SKILL_BUCKETS}
    # tokens per unit of share: the smallest one is K; each bucket keeps K / its own (x / x is exactly 1)
    capacity = {b: available[b] / shares[b] for b in feasible_buckets}
    kept_total = min(capacity.values()) if capacity else 0.0
    rate = {b: kept_total / capacity[b] if b in capacity else 0.0 for b in SKILL_BUCKETS}
    if capacity:
        scarcest = sorted(b for b in feasible_buckets if rate[b] == 1.0)
        notes.append(f"{', '.join(scarcest)} kept whole (the scarcest relative to its target); the others downsampled")
    else:
        notes.append("no skill bucket with a target share holds tokens: nothing is kept")
    if dropped := [b for b in SKILL_BUCKETS if weights[b] == 0 and available[b] > 0]:
        notes.append(f"target 0: {', '.join(dropped)} not kept (rate 0)")

    cells = [(b, c) for b in SKILL_BUCKETS for c in CTX_BUCKETS]
    expected_tokens = {cell: int(tokens.get(cell, 0)) * rate[cell[0]] for cell in cells}
    expected_rows = {cell: int(rows.get(cell, 0)) * rate[cell[0]] for cell in cells}
    expected = {b: math.fsum(expected_tokens[b, c] for c in CTX_BUCKETS) for b in SKILL_BUCKETS}
    expected_total = math.fsum(expected.values())
    return {
        "targets": {**targets.to_dict(), "shares": shares},
        "salt": QUOTA_SALT,
        "rule": QUOTA_RULE,
        "rates": {b: {c: rate[b] for c in CTX_BUCKETS} for b in SKILL_BUCKETS},
        "feasible": bool(capacity) and not infeasible,
        "infeasible": infeasible,
        "notes": notes,
        "available": {"tokens": nested_grid(_ints(tokens)), "rows": nested_grid(_ints(rows))},
        "expected": {"tokens": nested_grid(expected_tokens), "rows": nested_grid(expected_rows)},
        "skill_tokens": {
            "available": available,
            "expected": expected,
            "target_share": shares,
            "expected_share": {b: expected[b] / expected_total if expected_total else 0.0 for b in SKILL_BUCKETS},
        },
    }


def keeps_nothing_reason(plan: Mapping[str, Any]) -> str | None:
    """Why `plan` keeps no token of data that holds some (its mix gives shares only to empty buckets), else None.
    That is a wrong setting, not a target the data cannot meet: refused like a mix whose shares sum to 0, rather
    than building an empty pool."""
    available = plan["skill_tokens"]["available"]
    holding = [b for b in SKILL_BUCKETS if available[b] > 0]
    if not holding or any(rate > 0 for cells in plan["rates"].values() for rate in cells.values()):
        return None
    mix = plan["targets"]["skill_mix"]
    targeted = ", ".join(b for b, share in mix.items() if share > 0)
    return (
        f"skill_mix {mix} keeps nothing: the buckets it gives a share ({targeted}) hold no tokens, while "
        f"{', '.join(holding)} do (skill_mix is SYNTH's: anchor sources' tokens come on top, by their category)"
    )


def _ints(grid: Mapping[Cell, int]) -> dict[Cell, int]:
    return {cell: int(n) for cell, n in grid.items()}


def quota_keep(
    synth_id: str,
    skill: str,
    ctx: str,
    rates: Mapping[str, Mapping[str, float]],
    excluded: frozenset[str] | set[str] = frozenset(),
) -> bool:
    """Whether the pool keeps a conversation of cell (skill, ctx) under the plan's `rates`: a salted hash of
    synth_id below the cell's rate and not one of the plan's `excluded` (oversized) rows, so the choice is
    deterministic, order-free and independent of the split and 001 sampling."""
    return stable_unit_interval(QUOTA_SALT, synth_id) < rates[skill][ctx] and synth_id not in excluded


def quota_config(targets: QuotaTargets, exercise_table: Mapping[str, str] = EXERCISE_SKILL_BUCKET) -> dict[str, Any]:
    """The quota settings and bucket rules (`exercise_table`: the build's exercise_skill_table) for the manifests'
    config hash (the rates depend on the data too: the manifests record the plan itself)."""
    return {
        "targets": targets.to_dict(),
        "salt": QUOTA_SALT,
        "rule": QUOTA_RULE,
        "exercise_skill_bucket": dict(exercise_table),
        "ctx_bucket_max_tokens": dict(CTX_BUCKET_MAX_TOKENS),
    }


def tokenized_quota_rows(
    paths: Iterable[Path],
    exercise_table: Mapping[str, str] | None = None,
    hashed: Mapping[Path, HashedFile] | None = None,
) -> QuotaColumns:
    """Every row of these synth_tokenized files as the quota sees it, file by file and row by row: from each file's
    row sizes while they are current (`current_row_sizes`), else from its own columns read in bounded batches.

    Args:
        paths: synth_tokenized Parquet files.
        exercise_table: the build's exercise table (exercise_skill_table); the contract's if None.
        hashed: what the tokenize steps hashed as they wrote these files (`current_row_sizes`).

    Returns:
        Their QuotaColumns: synth_id, skill bucket, ctx bucket (by its token count) and token count of every row.

    Raises:
        UnknownExercise: a row's exercise is in no table (`skill_bucket`).
    """
    columns = functools.partial(_quota_columns, hashed=hashed)
    read = thread_map(columns, paths)  # one file a core at once
    chunks = [chunk.cast(pa.large_string()) for file_ids, _, _ in read for chunk in file_ids.chunks]
    ids = pa.concat_arrays(chunks) if chunks else pa.array([], pa.large_string())
    exercises = pa.chunked_array(
        [chunk for _, file_exercises, _ in read for chunk in file_exercises.chunks], pa.string()
    )
    tokens = np.concatenate([lengths for _, _, lengths in read]) if read else np.zeros(0, dtype=np.int64)
    if not len(tokens):
        return QuotaColumns(ids, np.zeros(0, dtype=np.int16), np.zeros(0, dtype=np.int16), tokens)
    # each exercise's bucket asked once, then given to every row by its index
    exercise_index = pc.dictionary_encode(exercises).combine_chunks()
    names = [skill_bucket(e, exercise_table) for e in exercise_index.dictionary.to_pylist()]
    skills = tuple(dict.fromkeys([*SKILL_BUCKETS, *names]))
    skill_of = np.array([skills.index(name) for name in names], dtype=np.int16)
    return QuotaColumns(ids, skill_of[exercise_index.indices.to_numpy()], ctx_codes(tokens), tokens, skills)


def _quota_columns(
    path: Path, hashed: Mapping[Path, HashedFile] | None = None
) -> tuple[pa.ChunkedArray, pa.ChunkedArray, np.ndarray]:
    """synth_id, exercise and token count of every row of a synth_tokenized file: from its row sizes
    (`current_row_sizes`), or, for a file without current ones, its own columns read in bounded batches."""
    if (sizes := current_row_sizes(path, hashed)) is not None:
        table = pq.read_table(sizes, columns=["synth_id", "exercise", "tokens"])
        return table["synth_id"], table["exercise"], table["tokens"].to_numpy().astype(np.int64)
    ids, exercises, lengths = [], [], []
    # loss_mask (uint8) is as long as tokens (int32): its lengths for a quarter of the bytes read
    for batch in pq.ParquetFile(path).iter_batches(columns=["synth_id", "exercise", "loss_mask"], batch_size=4096):
        ids.append(batch.column("synth_id"))
        exercises.append(batch.column("exercise"))
        lengths.append(pc.list_value_length(batch.column("loss_mask")).to_numpy().astype(np.int64))
    joined = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    return pa.chunked_array(ids, pa.string()), pa.chunked_array(exercises, pa.string()), joined


def _excluded_entry(row: QuotaRow, why: str) -> dict[str, Any]:
    return {"synth_id": row.synth_id, "skill": row.skill, "ctx": row.ctx, "tokens": row.tokens, "why": why}


HASHED_IDS_AT_ONCE = 65_536  # synth_ids made Python strings at a time to hash them (`_BucketRows.units`)


class _BucketRows:
    """One skill bucket's rows (their indices among every row, in input order) and their quota hashes, taken
    once, when a prefix of them is first needed, a slice of ids at a time (no Python string kept per row)."""

    def __init__(self, rows: QuotaColumns, indices: np.ndarray) -> None:
        self.rows, self.indices = rows, indices
        self._units: np.ndarray | None = None

    def units(self) -> np.ndarray:
        if self._units is None:
            units = np.empty(len(self.indices), dtype=np.float64)
            for lo in range(0, len(self.indices), HASHED_IDS_AT_ONCE):
                ids = self.rows.ids(self.indices[lo : lo + HASHED_IDS_AT_ONCE])
                units[lo : lo + len(ids)] = stable_unit_intervals(QUOTA_SALT, ids)
            self._units = units
        return self._units

    def usable(self, unusable: Mapping[str, int]) -> np.ndarray:
        """The places (in this bucket) of the rows whose synth_id is not unusable."""
        if not unusable:
            return np.arange(len(self.indices))
        ids = self.rows.synth_id.take(pa.array(self.indices))
        return np.flatnonzero(~pc.is_in(ids, value_set=pa.array(list(unusable), pa.large_string())).to_numpy(False))

    def tokens(self, places: np.ndarray) -> int:
        """The tokens of the rows at these places."""
        return int(self.rows.tokens[self.indices[places]].sum())

    def prefix(self, places: np.ndarray, budget: float, oversized: float) -> tuple[float, np.ndarray, np.ndarray, int]:
        """`hash_ordered_prefix` of the rows at these places: (rate, kept and skipped row indices, kept tokens)."""
        tied: list[str] = []  # the rows' synth_ids, read only when two of them share a hash

        def id_of(place: int) -> str:
            if not tied:
                tied.extend(self.rows.ids(self.indices[places]))
            return tied[place]

        order = places[hash_order(self.units()[places], id_of)]
        rate, kept, skipped, tokens = prefix_places(
            self.units()[order], self.rows.tokens[self.indices[order]], budget, oversized
        )
        return rate, self.indices[order[kept]], self.indices[order[skipped]], tokens


def plan_quota_selection(rows: QuotaColumns, targets: QuotaTargets) -> tuple[dict[str, Any], np.ndarray]:
    """The quota plan that selects rows: keep rates that are hash thresholds of token-budget prefixes.

    The grid solver (`plan_quota_grid`) gives the kept total K and the shares t_b; each bucket below its whole keeps
    the longest prefix of its rows in quota-hash order within K t_b (`hash_ordered_prefix`, one rate for its ctx
    cells), oversized rows that do not fit skipped and excluded. A bucket left short of its budget by more than an
    oversized row lowers K to what it holds (every other bucket follows); one left short by more than half is
    lumpy (a few long rows hold its tokens): those rows are unusable and K is solved again without them.

    Args:
        rows: every SYNTH row the pool draws from (`tokenized_quota_rows`).
        targets: the skill mix to meet.

    Returns:
        (plan, kept): the plan as `plan_quota_grid` gives it over every row, its rates replaced by the thresholds,
        its expected tokens and rows the exact ones of the selection, `excluded` (every row dropped by id, with its
        cell, tokens and why), `granularity` (each bucket's median row tokens), `oversized_tokens` and
        `share_misses` (buckets whose kept share misses its target by more than `share_allowance`); and the kept
        rows' indices in `rows` (each bucket's in turn, SKILL_BUCKETS order; in hash order below its whole).
    """
    all_tokens, all_rows = rows.grids()
    grid_plan = plan_quota_grid(all_tokens, all_rows, targets)
    shares = grid_plan["targets"]["shares"]
    kept_total = math.fsum(grid_plan["skill_tokens"]["expected"].values())
    by_bucket = {b: _BucketRows(rows, np.flatnonzero(rows.skill == rows.skills.index(b))) for b in SKILL_BUCKETS}
    none = np.zeros(0, dtype=np.int64)
    unusable: dict[str, int] = {}  # by synth_id: the row excluded for it
    for _ in range(MAX_SELECTION_ROUNDS):
        oversized = OVERSIZED_ROW_SHARE * kept_total
        selections: dict[str, tuple[float, np.ndarray, np.ndarray, int]] = {}  # rate, kept, skipped, tokens
        budgets: dict[str, float] = {}
        for b in SKILL_BUCKETS:
            usable = by_bucket[b].usable(unusable)
            held = by_bucket[b].tokens(usable)
            budgets[b] = kept_total * shares[b]
            if shares[b] <= 0 or budgets[b] <= 0:
                selections[b] = (0.0, none, none, 0)
            elif budgets[b] >= held:
                selections[b] = (1.0, by_bucket[b].indices[usable], none, held)
            else:
                selections[b] = by_bucket[b].prefix(usable, budgets[b], oversized)
        short = [b for b in SKILL_BUCKETS if budgets[b] - selections[b][3] > oversized and len(selections[b][2])]
        if not short:
            break
        lumpy = [b for b in short if selections[b][3] < budgets[b] / 2]
        if lumpy:  # its long rows cannot be kept at any share near its target: solve K without them
            skipped = np.concatenate([selections[b][2] for b in lumpy])
            unusable.update(zip(rows.ids(skipped), skipped.tolist()))
            held = {
                b: int(rows.tokens[by_bucket[b].indices[by_bucket[b].usable(unusable)]].sum()) for b in SKILL_BUCKETS
            }
            capacities = [held[b] / shares[b] for b in SKILL_BUCKETS if shares[b] > 0 and held[b] > 0]
            kept_total = min([kept_total, *capacities]) if capacities else 0.0
        else:
            lowered = min(selections[b][3] / shares[b] for b in short)
            if lowered >= kept_total:
                break
            kept_total = lowered

    kept = np.concatenate([selections[b][1] for b in SKILL_BUCKETS])
    unusable_rows = rows.rows(np.fromiter(unusable.values(), np.int64, len(unusable)))
    excluded = [_excluded_entry(row, "unusable: too long for any share near its target") for row in unusable_rows]
    oversized_rows = rows.rows(np.concatenate([selections[b][2] for b in SKILL_BUCKETS]))
    excluded += [_excluded_entry(row, "oversized: does not fit its bucket's budget") for row in oversized_rows]
    excluded.sort(key=lambda entry: (-entry["tokens"], entry["synth_id"]))
    kept_tokens, kept_rows = rows.grids(kept)
    cells = [(b, c) for b in SKILL_BUCKETS for c in CTX_BUCKETS]
    expected = {b: sum(kept_tokens.get((b, c), 0) for c in CTX_BUCKETS) for b in SKILL_BUCKETS}
    granularity = {b: median_tokens(rows.tokens[by_bucket[b].indices]) for b in SKILL_BUCKETS}
    misses = share_misses(expected, shares, granularity)
    notes = list(grid_plan["notes"])
    if excluded:
        notes.append(
            f"{len(excluded)} rows excluded by id ({sum(e['tokens'] for e in excluded)} tokens): too long for their "
            "bucket's budget (the plan's `excluded`)"
        )
    expected_total = sum(expected.values())
    plan = {
        **grid_plan,
        "rule": QUOTA_RULE,
        "rates": {b: dict.fromkeys(CTX_BUCKETS, selections[b][0]) for b in SKILL_BUCKETS},
        "notes": notes,
        "available": {"tokens": nested_grid(all_tokens), "rows": nested_grid(all_rows)},
        "expected": {
            "tokens": nested_grid({cell: kept_tokens.get(cell, 0) for cell in cells}),
            "rows": nested_grid({cell: kept_rows.get(cell, 0) for cell in cells}),
        },
        "skill_tokens": {
            "available": {b: sum(all_tokens.get((b, c), 0) for c in CTX_BUCKETS) for b in SKILL_BUCKETS},
            "expected": expected,
            "target_share": shares,
            "expected_share": {b: expected[b] / expected_total if expected_total else 0.0 for b in SKILL_BUCKETS},
        },
        "oversized_tokens": OVERSIZED_ROW_SHARE * kept_total,
        "excluded": excluded,
        "share_tolerance": QUOTA_SHARE_TOLERANCE,
        "granularity": granularity,
        "share_misses": misses,
    }
    return plan, kept


def median_tokens(lengths: Iterable[int] | np.ndarray) -> int:
    """The median (lower middle) of token counts, 0 for none: a bucket's typical row."""
    values = np.fromiter(lengths, np.int64) if not isinstance(lengths, np.ndarray) else lengths
    return int(np.partition(values, (len(values) - 1) // 2)[(len(values) - 1) // 2]) if len(values) else 0


def share_allowance(granularity: float, total: float) -> float:
    """How far a kept share may miss its target: QUOTA_SHARE_TOLERANCE, or one typical row of its bucket (its
    `granularity`, median tokens) when the kept `total` is so small that such a row is more than that."""
    return max(QUOTA_SHARE_TOLERANCE, granularity / total if total else 0.0)


def share_misses(
    achieved: Mapping[str, float], targets: Mapping[str, float], granularity: Mapping[str, float]
) -> list[dict[str, Any]]:
    """The shares of `achieved` (tokens per bucket or group) that miss `targets` by more than `share_allowance`.

    Args:
        achieved: kept tokens per key.
        targets: target share per key.
        granularity: median row tokens per key.

    Returns:
        {key, target_share, expected_share, allowance} per miss, in `targets` order.
    """
    total = math.fsum(achieved.values())
    misses = []
    for key, target in targets.items():
        share = achieved.get(key, 0.0) / total if total else 0.0
        allowance = share_allowance(granularity.get(key, 0), total)
        if total and abs(share - target) > allowance:
            misses.append({"key": key, "target_share": target, "expected_share": share, "allowance": allowance})
    return misses


def excluded_ids(plan: Mapping[str, Any]) -> frozenset[str]:
    """The synth_ids a quota plan (or its source mix) drops by id, whatever their hash."""
    return frozenset(entry["synth_id"] for entry in plan.get("excluded", []))


def share_miss_problems(
    achieved_tokens: Mapping[str, float],
    target_shares: Mapping[str, float],
    excluded: Sequence[Mapping[str, Any]],
    granularity: Mapping[str, float] | None = None,
) -> list[str]:
    """Why an achieved mix misses its targets by more than `share_allowance`, naming the rows behind it.

    Args:
        achieved_tokens: tokens kept per skill bucket (or per source-mix group).
        target_shares: the plan's target share of each, renormalized over what is feasible.
        excluded: the plan's excluded rows (largest first): the rows that keep a share from its target.
        granularity: median row tokens per key (the plan's); none: QUOTA_SHARE_TOLERANCE alone.

    Returns:
        One problem per missed share (its target, what was achieved, the rows excluded to blame); empty when every
        share is within its allowance.
    """
    problems = []
    for miss in share_misses(achieved_tokens, target_shares, granularity or {}):
        key = miss["key"]
        rows = [
            f"{entry['synth_id']} ({entry['tokens']} tokens)"
            for entry in excluded
            if key in (entry.get("skill"), entry.get("group"), entry.get("source"))
        ]
        if not rows:  # its own rows are all kept: the rows excluded elsewhere pushed it off its share
            rows = [f"{entry['synth_id']} ({entry['tokens']} tokens)" for entry in excluded]
        named = ", ".join(rows[:EXCLUDED_ROWS_NAMED]) or "none excluded: too few rows to meet it"
        more = f" and {len(rows) - EXCLUDED_ROWS_NAMED} more" if len(rows) > EXCLUDED_ROWS_NAMED else ""
        problems.append(
            f"{key}: {miss['expected_share']:.2%} of the kept tokens, target {miss['target_share']:.2%} (allowance "
            f"{miss['allowance']:.2%}); rows that cause it: {named}{more}"
        )
    return problems


BALANCE_EXPECTED_SLACK = 1.25  # an imbalance up to this times the plan's own is the plan's (sampling noise)


@dataclass(frozen=True)
class BucketBalance:
    """How unequal the pool's skill buckets are on tokens, and whether the quota plan meant it (docs/pool.md)."""

    balanced: bool  # the largest bucket holds at most the limit times the smallest (of those holding tokens)
    planned: bool  # the imbalance is the plan's: its targets, or buckets the corpus cannot fill
    sentence: str
    ratio: float
    smallest: str | None


def bucket_balance(
    achieved: Mapping[str, float],
    expected: Mapping[str, float],
    infeasible: Sequence[Mapping[str, Any]],
    limit: float,
) -> BucketBalance:
    """The pool's tokens per skill bucket (`achieved`, every source) against `limit` and against the tokens the
    quota plan expects per bucket (`expected`, the anchor sources' achieved tokens included).

    Args:
        achieved: tokens per skill bucket in the pool.
        expected: tokens per skill bucket the plan expects (SYNTH's expected plus the anchors').
        infeasible: the plan's buckets whose target the corpus cannot meet (`bucket`, `reason`).
        limit: the largest / smallest ratio above which the buckets are unbalanced.

    Returns:
        The verdict: balanced, or unbalanced as planned (no action needed: the targets or the corpus), or
        unbalanced against the plan (action needed), in a sentence naming the buckets and both ratios.
    """
    held = {b: n for b, n in achieved.items() if n > 0}
    empty = sorted(b for b, n in achieved.items() if n <= 0)
    reasons = {entry["bucket"]: entry["reason"] for entry in infeasible}
    empty_text = "".join(
        f"; {b} empty: " + (f"a target the corpus cannot meet ({reasons[b]})" if b in reasons else "not planned so")
        for b in empty
    )
    if not held:
        return BucketBalance(False, False, "needs action: the pool holds no tokens", 0.0, None)
    smallest, largest = min(held, key=held.get), max(held, key=held.get)
    ratio = held[largest] / held[smallest]
    said = f"{largest} holds {ratio:.2f}x the tokens of the smallest bucket {smallest} ({held[smallest]:,} tokens)"
    planned_held = {b: expected.get(b, 0) for b in held}
    planned_ratio = planned_held[largest] / planned_held[smallest] if planned_held[smallest] > 0 else math.inf
    empty_planned = all(b in reasons or expected.get(b, 0) <= 0 for b in empty)
    planned = ratio <= max(limit, planned_ratio * BALANCE_EXPECTED_SLACK) and empty_planned
    if ratio <= limit:
        verdict = f"balanced: {said}, within the {limit}x limit"
    elif planned:
        verdict = (
            f"expected, no action needed: {said}, over the {limit}x limit as the quota plan means it "
            f"(it expects {planned_ratio:.2f}x from the skill_mix targets and what the corpus holds; change "
            "skill_mix or set balance_tokens to balance it)"
        )
    else:
        verdict = (
            f"needs action: {said}, where the quota plan expects {planned_ratio:.2f}x: the pool's parts were not "
            "all made under this plan or the corpus changed since; rebuild the pool (./scripts/build.sh)"
        )
    return BucketBalance(ratio <= limit, planned, verdict + empty_text, ratio, smallest)


def planned_bucket_tokens(
    expected: Mapping[str, Mapping[str, float]], anchor_grids: Iterable[Mapping[str, Mapping[str, float]]]
) -> dict[str, float]:
    """Tokens per skill bucket the pool is meant to hold: the quota plan's expected SYNTH tokens (a B x C grid)
    plus the anchor sources' tokens in the pool (their mix is the source mix's, not the quota's).

    Args:
        expected: the plan's expected tokens, bucket -> ctx bucket -> tokens.
        anchor_grids: each anchor shard's pool tokens, bucket -> ctx bucket -> tokens.

    Returns:
        bucket -> tokens.
    """
    planned = {bucket: math.fsum(cells.values()) for bucket, cells in expected.items()}
    for grid in anchor_grids:
        for bucket, cells in grid.items():
            planned[bucket] = planned.get(bucket, 0.0) + math.fsum(cells.values())
    return planned
