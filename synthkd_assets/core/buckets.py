"""Token and row counts by skill bucket, ctx bucket, language and exercise (docs/pool.md#buckets, 004).

004 makes tokens the authoritative size of a bucket, so every report counts tokens beside rows. The
tokenize step keeps the (skill, ctx) grid in its ShardReport (`bucket_tokens`, `bucket_rows`); the quota
plan sums those grids over the shards (`grids_from_reports`); `bucket_counts` gives any step the full
breakdown as plain dicts for its metadata. The bucket rules themselves are synthkd_contract/buckets.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from synthkd_contract.buckets import CTX_BUCKETS, SKILL_BUCKETS, ctx_bucket, skill_bucket

Cell = tuple[str, str]  # (skill bucket, ctx bucket)
BREAKDOWNS = ("skill", "ctx", "language", "exercise", "cell")


def bucket_cell(exercise: str, sequence_length: int, exercise_table: Mapping[str, str] | None = None) -> Cell:
    """(skill bucket, ctx bucket) of one conversation: its exercise and the length of its full rendered
    sequence; UnknownExercise for an exercise `exercise_table` (the contract's when None) does not map."""
    return skill_bucket(exercise, exercise_table), ctx_bucket(sequence_length)


def bucket_counts(rows: Iterable[tuple[str, str, int]]) -> dict[str, dict[str, Any]]:
    """{"tokens": ..., "rows": ...} of (exercise, language, sequence length) rows, each broken down as
    {"skill": {B: n}, "ctx": {C: n}, "language": {lang: n}, "exercise": {ex: n}, "cell": {B: {C: n}}}.

    Every skill and ctx bucket (and every grid cell) is present, zeros included, so a plot over time
    has the same series at every materialization; languages and exercises are the ones seen."""
    tokens: dict[str, Counter] = {name: Counter() for name in BREAKDOWNS}
    rows_: dict[str, Counter] = {name: Counter() for name in BREAKDOWNS}
    for exercise, language, length in rows:
        skill, ctx = bucket_cell(exercise, length)
        for name, key in (("skill", skill), ("ctx", ctx), ("language", language), ("exercise", exercise)):
            tokens[name][key] += length
            rows_[name][key] += 1
        tokens["cell"][skill, ctx] += length
        rows_["cell"][skill, ctx] += 1
    return {"tokens": _breakdown(tokens), "rows": _breakdown(rows_)}


def _breakdown(counts: Mapping[str, Counter]) -> dict[str, Any]:
    return {
        "skill": {b: counts["skill"][b] for b in SKILL_BUCKETS},
        "ctx": {c: counts["ctx"][c] for c in CTX_BUCKETS},
        "language": dict(sorted(counts["language"].items())),
        "exercise": dict(sorted(counts["exercise"].items())),
        "cell": nested_grid(counts["cell"]),
    }


def nested_grid(cells: Mapping[Cell, float]) -> dict[str, dict[str, float]]:
    """{(B, C): n} -> {B: {C: n}} over every cell of SKILL_BUCKETS x CTX_BUCKETS (0 where absent)."""
    return {b: {c: cells.get((b, c), 0) for c in CTX_BUCKETS} for b in SKILL_BUCKETS}


def grid_from_nested(nested: Mapping[str, Mapping[str, int]]) -> dict[Cell, int]:
    """{B: {C: n}} (as a report stores a (skill, ctx) Counter) -> {(B, C): n}."""
    return {(b, c): int(n) for b, ctxs in nested.items() for c, n in ctxs.items()}


def grids_from_reports(reports: Iterable[Mapping[str, Any]]) -> tuple[dict[Cell, int], dict[Cell, int]]:
    """(tokens, rows) per (skill, ctx) cell, summed over synth_tokenized report dicts: the quota plan's input.
    A report without the counters (no row kept) adds nothing."""
    tokens: Counter = Counter()
    rows: Counter = Counter()
    for report in reports:
        tokens.update(grid_from_nested(report.get("bucket_tokens", {})))
        rows.update(grid_from_nested(report.get("bucket_rows", {})))
    return dict(tokens), dict(rows)
