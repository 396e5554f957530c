"""What one step did to one shard: the counts every step keeps, and the error log of its dropped rows."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from synthkd_assets.core.atomic import atomic_write_text
from synthkd_assets.core.buckets import Cell, bucket_cell
from synthkd_assets.core.ownership import remove_replaced_output

ERROR_SAMPLE_LIMIT = 1000  # dropped rows named in a shard's error log; the counts cover all of them
# a field that only some step fills and whose absence the other steps' report files must keep (their bytes
# predate it): left out of `to_dict` while empty
OMIT_EMPTY = {"omit_empty": True}


@dataclass
class ShardReport:
    """What one step did to one shard: the numbers the UI plots and the manifests sum."""

    shard: str
    source_sha256: str | None = None  # content hash of the input file this report was made from, as read
    source_bytes: int | None = None  # its size, as read
    plan_sha256: str | None = None  # sha256 of the sampling plan a synth_sampled shard was made with
    rows_in: int = 0
    rows_out: int = 0
    dropped: Counter = field(default_factory=Counter)
    # (exercise, reason) -> rows dropped, row-selection steps (filters, sampling): `dropped` per exercise
    dropped_by_exercise: Counter = field(default_factory=Counter, metadata=OMIT_EMPTY)
    sanitized: Counter = field(default_factory=Counter)
    language: Counter = field(default_factory=Counter)
    exercise: Counter = field(default_factory=Counter)
    span_tokens: Counter = field(default_factory=Counter)
    sequences: Counter = field(default_factory=Counter)  # per split, dataset steps only
    # (exercise, language) -> rows out, row-selection steps: what the sampling plan is computed from
    exercise_language: Counter = field(default_factory=Counter)
    render_path: Counter = field(default_factory=Counter)  # tokenize step only: fast / reference
    # (skill bucket, ctx bucket) -> tokens / rows kept, tokenize step only (core/buckets.py): the token grid
    # the quota plan is computed from (004: tokens are the authoritative size)
    bucket_tokens: Counter = field(default_factory=Counter, metadata=OMIT_EMPTY)
    bucket_rows: Counter = field(default_factory=Counter, metadata=OMIT_EMPTY)
    language_tokens: Counter = field(default_factory=Counter, metadata=OMIT_EMPTY)  # same steps, by language
    exercise_tokens: Counter = field(default_factory=Counter, metadata=OMIT_EMPTY)  # same steps, by exercise
    errors: list[dict[str, Any]] = field(default_factory=list)

    def drop(
        self, reason: str, source_row: int, synth_id: str | None, detail: str = "", exercise: str | None = None
    ) -> None:
        """Count a dropped row under `reason` (and under its `exercise`, when given), and name it in the error log
        (the first ERROR_SAMPLE_LIMIT)."""
        self.dropped[reason] += 1
        if exercise is not None:
            self.dropped_by_exercise[(exercise, reason)] += 1
        if len(self.errors) < ERROR_SAMPLE_LIMIT:
            row = {"shard": self.shard, "source_row": source_row, "synth_id": synth_id}
            self.errors.append({**row, "reason": reason, "detail": detail})

    def count_sequence(
        self, exercise: str, language: str, length: int, exercise_table: Mapping[str, str] | None = None
    ) -> Cell:
        """Count one kept conversation of `length` tokens in the bucket grid and the per-language / per-exercise
        tokens; returns its (skill, ctx) cell (UnknownExercise for an exercise `exercise_table`, the build's
        exercise_skill_table (the contract's when None), does not map)."""
        cell = bucket_cell(exercise, length, exercise_table)  # the full sequence decides the ctx bucket
        self.bucket_tokens[cell] += length
        self.bucket_rows[cell] += 1
        self.language_tokens[language] += length
        self.exercise_tokens[exercise] += length
        return cell

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: _counter_dict(value) if isinstance(value, Counter) else value
            for f in fields(self)
            if f.name != "errors"
            and (value := getattr(self, f.name)) is not None
            and (value or not f.metadata.get("omit_empty"))
        }

    def write_json(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def write_errors(self, path: Path) -> None:
        """The error log: JSON lines naming shard, row, synth_id and reason of each named dropped row. With
        none, an earlier build's log is removed, so that no log outlives the build it describes."""
        if not self.errors:
            remove_replaced_output([path])
            return
        atomic_write_text(path, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in self.errors))


def _counter_dict(counter: Counter) -> dict[str, Any]:
    """Sorted plain dict; a counter keyed by (outer, inner) pairs becomes {outer: {inner: n}}."""
    nested: dict[str, Any] = {}
    for key, n in sorted(counter.items()):
        if isinstance(key, tuple):
            nested.setdefault(key[0], {})[key[1]] = n
        else:
            nested[key] = n
    return nested


def merge_error_logs(logs: Iterable[Path], target: Path) -> int:
    """The lines of every log of `logs` that exists, in order, as one JSON-lines file written atomically
    (empty when there is none); returns how many lines it holds."""
    lines = []
    for log in logs:
        if log.is_file():
            lines.extend(line for line in log.read_text(encoding="utf-8").splitlines() if line.strip())
    atomic_write_text(target, "".join(line + "\n" for line in lines))
    return len(lines)


def why_shard_is_empty(reports: Mapping[str, Mapping[str, Any]]) -> str | None:
    """Why a shard's steps wrote no row: its input's row count and each step's drops by reason, in step order.

    Args:
        reports: each step's report of the shard (`ShardReport.to_dict`), by step name, in the order the steps
            ran (the first one read the input file).

    Returns:
        None when the last step wrote rows; else a sentence naming the input's rows and, step by step, how many
        each dropped and why (an input with no row says so).
    """
    steps = list(reports.items())
    if not steps or steps[-1][1].get("rows_out", 0) > 0:
        return None
    rows_in = steps[0][1].get("rows_in", 0)
    if rows_in == 0:
        return f"its input has no rows ({steps[0][0]} read 0)"
    dropped = []
    for step, report in steps:
        reasons = {reason: n for reason, n in sorted(report.get("dropped", {}).items()) if n}
        if reasons:
            detail = ", ".join(f"{reason} {n}" for reason, n in reasons.items())
            dropped.append(f"{step} dropped {sum(reasons.values())} ({detail})")
    return f"all {rows_in} input rows were dropped: " + "; ".join(dropped)
