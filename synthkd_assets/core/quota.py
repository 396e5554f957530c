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

import math
import numbers
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np

from synthkd_assets.core.buckets import Cell, nested_grid
from synthkd_assets.core.quota_rows import QuotaRow, QuotaRows, cell_counts
from synthkd_contract.buckets import (
    CTX_BUCKET_MAX_TOKENS,
    CTX_BUCKETS,
    EXERCISE_SKILL_BUCKET,
    QUOTA_SALT,
    SKILL_BUCKET_NAMES,
    SKILL_BUCKETS,
    SKILL_MIX,
)
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


def _excluded_entry(row: QuotaRow, why: str) -> dict[str, Any]:
    return {"synth_id": row.synth_id, "skill": row.skill, "ctx": row.ctx, "tokens": row.tokens, "why": why}


class BucketSelection(NamedTuple):
    """What one skill bucket keeps under its budget."""

    rate: float  # the hash of the first row left out (1.0: every usable row; 0.0: none)
    kept_tokens: np.ndarray  # per ctx bucket
    kept_rows: np.ndarray  # per ctx bucket
    skipped: list[QuotaRow]  # oversized rows below the rate, in hash order: excluded by id
    tokens: int  # the kept tokens


def _whole_bucket(rows: QuotaRows, skill: int) -> BucketSelection:
    tokens, counts = rows.usable_tokens[skill].sum(axis=1), rows.usable_rows[skill].sum(axis=1)
    return BucketSelection(1.0, tokens, counts, [], int(tokens.sum()))


def _no_rows() -> BucketSelection:
    none = np.zeros(len(CTX_BUCKETS), dtype=np.int64)
    return BucketSelection(0.0, none, none, [], 0)


def bucket_prefixes(rows: QuotaRows, budgets: Mapping[int, float], oversized: float) -> dict[int, BucketSelection]:
    """`hash_ordered_prefix` of each skill bucket's usable rows (by its index in SKILL_BUCKETS) within its budget,
    reading again only the rows of the hash bins where the budget ends (docs/pool.md "How the quota selects rows").

    Every bin before the first one whose running total of tokens passes the budget is kept whole, from the counts.
    The rows of that bin and of the bins after it that the budget plus a margin of oversized rows reaches are
    gathered (one read for every bucket) and walked row by row (`prefix_places`); when the walk keeps every one of
    them and usable rows lie beyond, the margin grows and they are read again.

    A bucket whose budget holds all its usable tokens keeps them whole (rate 1.0), without a read.

    Args:
        rows: the rows, with the usable counts the selection round leaves.
        budgets: the most tokens each bucket (by index) may keep.
        oversized: a row that does not fit and holds more tokens than this is skipped instead of ending the prefix.

    Returns:
        Each bucket's selection: rate, kept tokens and rows per ctx bucket, skipped rows, kept tokens.
    """
    walks = {}
    chosen: dict[int, BucketSelection] = {}
    for skill, budget in budgets.items():
        running = np.cumsum(rows.usable_tokens[skill].sum(axis=0))
        if not math.isfinite(budget) or math.floor(budget) >= running[-1]:
            chosen[skill] = _whole_bucket(rows, skill)
            continue
        limit = math.floor(budget)  # an integer total fits iff <= floor(budget)
        first = int(np.searchsorted(running, limit, side="right"))  # the first bin whose running total passes it
        walks[skill] = [running, limit, first, int(running[first - 1]) if first else 0, max(2.0 * oversized, 1.0)]
    while pending := [skill for skill in walks if skill not in chosen]:
        ranges = {}
        for skill in pending:
            running, limit, first, _, margin = walks[skill]
            ranges[skill] = (first, min(int(np.searchsorted(running, limit + margin, side="right")) + 1, rows.bins))
        for skill, found in rows.gather_bins(ranges).items():
            running, limit, first, before, margin = walks[skill]
            order = hash_order(found.units, found.ids.__getitem__)
            rate, kept, skipped, tokens = prefix_places(
                found.units[order], found.tokens[order], limit - before, oversized
            )
            if rate == 1.0 and rows.usable_rows[skill][:, ranges[skill][1] :].any():
                walks[skill][4] = margin * 4  # every gathered row fits: the prefix goes on past them
                continue
            places = order[kept]
            kept_tokens = rows.usable_tokens[skill][:, :first].sum(axis=1) + np.bincount(
                found.ctx[places], weights=found.tokens[places], minlength=len(CTX_BUCKETS)
            ).astype(np.int64)
            kept_rows = rows.usable_rows[skill][:, :first].sum(axis=1) + np.bincount(
                found.ctx[places], minlength=len(CTX_BUCKETS)
            )
            chosen[skill] = BucketSelection(rate, kept_tokens, kept_rows, found.rows(order[skipped]), before + tokens)
    return chosen


def plan_quota_selection(rows: QuotaRows, targets: QuotaTargets) -> dict[str, Any]:
    """The quota plan that selects rows: keep rates that are hash thresholds of token-budget prefixes.

    The grid solver (`plan_quota_grid`) gives the kept total K and the shares t_b; each bucket below its whole keeps
    the longest prefix of its rows in quota-hash order within K t_b (`bucket_prefixes`, one rate for its ctx
    cells), oversized rows that do not fit skipped and excluded. A bucket left short of its budget by more than an
    oversized row lowers K to what it holds (every other bucket follows); one left short by more than half is
    lumpy (a few long rows hold its tokens): those rows are unusable and K is solved again without them.

    Args:
        rows: every SYNTH row the pool draws from (`tokenized_quota_rows`); its usable counts lose the unusable rows.
        targets: the skill mix to meet.

    Returns:
        The plan as `plan_quota_grid` gives it over every row, its rates replaced by the thresholds, its expected
        tokens and rows the exact ones of the selection, `excluded` (every row dropped by id, with its cell, tokens
        and why), `granularity` (each bucket's median row tokens), `oversized_tokens` and `share_misses` (buckets
        whose kept share misses its target by more than `share_allowance`). The rows it keeps are
        `rows.kept(plan["rates"], excluded_ids(plan), QUOTA_SALT)`.
    """
    all_tokens, all_rows = rows.grids()
    grid_plan = plan_quota_grid(all_tokens, all_rows, targets)
    shares = grid_plan["targets"]["shares"]
    kept_total = math.fsum(grid_plan["skill_tokens"]["expected"].values())
    unusable: dict[str, QuotaRow] = {}  # by synth_id: the row excluded for it
    for _ in range(MAX_SELECTION_ROUNDS):
        oversized = OVERSIZED_ROW_SHARE * kept_total
        budgets = {b: kept_total * shares[b] for b in SKILL_BUCKETS}
        selections = {b: _no_rows() for b in SKILL_BUCKETS if shares[b] <= 0 or budgets[b] <= 0}
        selected = {s: budgets[b] for s, b in enumerate(SKILL_BUCKETS) if b not in selections}
        for s, selection in bucket_prefixes(rows, selected, oversized).items():
            selections[SKILL_BUCKETS[s]] = selection
        short = [b for b in SKILL_BUCKETS if budgets[b] - selections[b].tokens > oversized and selections[b].skipped]
        if not short:
            break
        lumpy = [b for b in short if selections[b].tokens < budgets[b] / 2]
        if lumpy:  # its long rows cannot be kept at any share near its target: solve K without them
            skipped = {row.synth_id: row for b in lumpy for row in selections[b].skipped}
            unusable.update(skipped)
            rows.exclude(skipped)
            held = rows.held_tokens()
            capacities = [held[s] / shares[b] for s, b in enumerate(SKILL_BUCKETS) if shares[b] > 0 and held[s] > 0]
            kept_total = min([kept_total, *capacities]) if capacities else 0.0
        else:
            lowered = min(selections[b].tokens / shares[b] for b in short)
            if lowered >= kept_total:
                break
            kept_total = lowered

    excluded = [_excluded_entry(row, "unusable: too long for any share near its target") for row in unusable.values()]
    oversized_rows = [row for b in SKILL_BUCKETS for row in selections[b].skipped]
    excluded += [_excluded_entry(row, "oversized: does not fit its bucket's budget") for row in oversized_rows]
    excluded.sort(key=lambda entry: (-entry["tokens"], entry["synth_id"]))
    kept_tokens, kept_rows = cell_counts(
        np.stack([selections[b].kept_tokens for b in SKILL_BUCKETS]),
        np.stack([selections[b].kept_rows for b in SKILL_BUCKETS]),
    )
    cells = [(b, c) for b in SKILL_BUCKETS for c in CTX_BUCKETS]
    expected = {b: sum(kept_tokens.get((b, c), 0) for c in CTX_BUCKETS) for b in SKILL_BUCKETS}
    granularity = {b: rows.median_tokens(s) for s, b in enumerate(SKILL_BUCKETS)}
    misses = share_misses(expected, shares, granularity)
    notes = list(grid_plan["notes"])
    if excluded:
        notes.append(
            f"{len(excluded)} rows excluded by id ({sum(e['tokens'] for e in excluded)} tokens): too long for their "
            "bucket's budget (the plan's `excluded`)"
        )
    expected_total = sum(expected.values())
    return {
        **grid_plan,
        "rule": QUOTA_RULE,
        "rates": {b: dict.fromkeys(CTX_BUCKETS, selections[b].rate) for b in SKILL_BUCKETS},
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
