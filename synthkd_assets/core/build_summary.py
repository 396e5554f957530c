"""What a build did to the rows before its datasets, read back from the files it wrote (for build.sh's summary
and the UI): the 001 quality filters' drops per exercise, summed over every shard's synth_filtered report, and
what the sampling plan keeps, from the plan.json the build wrote (never recomputed)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.manifest import read_json
from synthkd_contract import drops

FILTER_STAGE = "synth_filtered"
FILTER_REASONS: tuple[str, ...] = tuple(drops.DROP_REASONS_BY_STEP[FILTER_STAGE])


@dataclass(frozen=True)
class ExerciseDrops:
    """One exercise through a row-selection step: rows in, and rows dropped by reason (every reason of the step,
    0 when none, then any other reason counted)."""

    exercise: str
    rows_in: int
    dropped: dict[str, int]

    @property
    def rows_dropped(self) -> int:
        return sum(self.dropped.values())


@dataclass(frozen=True)
class StepDrops:
    """A row-selection step over every shard: its rows in and drops, and the same per exercise (most rows in first).
    `unattributed`: drops a report counted without their exercise (a report written before the per-exercise
    counter); `missing`: the shards without a report."""

    rows_in: int
    dropped: dict[str, int]
    exercises: list[ExerciseDrops]
    unattributed: int = 0
    missing: list[str] = field(default_factory=list)

    @property
    def rows_dropped(self) -> int:
        return sum(self.dropped.values())


def drops_by_exercise(reports: Iterable[Mapping[str, Any]], reasons: Sequence[str] = FILTER_REASONS) -> StepDrops:
    """Sum row-selection reports (synth_filtered's by default) per exercise: an exercise's rows in are the rows the
    step kept of it (`exercise`) plus those it dropped (`dropped_by_exercise`, {exercise: {reason: n}})."""
    kept: dict[str, int] = {}
    dropped: dict[str, dict[str, int]] = {}
    totals: dict[str, int] = {}
    rows_in = unattributed = 0
    for report in reports:
        rows_in += int(report["rows_in"])
        for reason, n in report.get("dropped", {}).items():
            totals[reason] = totals.get(reason, 0) + int(n)
        for exercise, n in report.get("exercise", {}).items():
            kept[exercise] = kept.get(exercise, 0) + int(n)
        attributed = 0
        for exercise, by_reason in report.get("dropped_by_exercise", {}).items():
            entry = dropped.setdefault(exercise, {})
            for reason, n in by_reason.items():
                entry[reason] = entry.get(reason, 0) + int(n)
                attributed += int(n)
        unattributed += sum(int(n) for n in report.get("dropped", {}).values()) - attributed

    def zero_filled(counts: Mapping[str, int]) -> dict[str, int]:
        return {**dict.fromkeys(reasons, 0), **dict(sorted(counts.items()))}

    exercises = []
    for exercise in kept.keys() | dropped.keys():
        by_reason = dropped.get(exercise, {})
        rows = kept.get(exercise, 0) + sum(by_reason.values())
        exercises.append(ExerciseDrops(exercise, rows, zero_filled(by_reason)))
    exercises.sort(key=lambda e: (-e.rows_in, e.exercise))
    return StepDrops(rows_in, zero_filled(totals), exercises, unattributed)


def read_step_drops(
    layout: DataLayout, partitions: Sequence[str], stage: str = FILTER_STAGE, reasons: Sequence[str] = FILTER_REASONS
) -> StepDrops:
    """`drops_by_exercise` of the reports `stage` wrote for `partitions` under `layout` (a shard without one is
    named in `missing`)."""
    paths = {key: layout.stage_report(stage, key) for key in partitions}
    summed = drops_by_exercise([read_json(path) for path in paths.values() if path.is_file()], reasons)
    missing = [key for key, path in paths.items() if not path.is_file()]
    return StepDrops(summed.rows_in, summed.dropped, summed.exercises, summed.unattributed, missing)


def drops_by_exercise_markdown(step: StepDrops) -> str:
    """A table of rows in and drops by reason per exercise (a total row last), for the UI."""
    reasons = list(step.dropped)
    lines = [
        "| exercise | rows in | dropped | " + " | ".join(f"`{r}`" for r in reasons) + " |",
        "|---|---:|---:|" + "---:|" * len(reasons),
    ]
    for entry in step.exercises:
        by_reason = " | ".join(str(entry.dropped.get(r, 0)) for r in reasons)
        lines.append(f"| `{entry.exercise}` | {entry.rows_in} | {entry.rows_dropped} | {by_reason} |")
    totals = " | ".join(str(step.dropped[r]) for r in reasons)
    lines.append(f"| all | {step.rows_in} | {step.rows_dropped} | {totals} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class PlanKeeps:
    """What a sampling plan keeps, as the plan says it (expected: each rule is a salted hash decision): its rates,
    the rows it saw (after the filters and the near-duplicate clusters) and the rows it keeps, and the memorization
    and non-English shares before -> after sampling."""

    rates: dict[str, float]
    rows_seen: float
    rows_kept: float
    memorization_share: tuple[float, float]
    non_english_share: tuple[float, float]
    feasible: bool
    notes: list[str]

    @property
    def memorization_keep_rate(self) -> float:
        return self.rates["memorization"]

    @property
    def kept_share(self) -> float:
        return self.rows_kept / self.rows_seen if self.rows_seen else 1.0


def plan_keeps(plan: Mapping[str, Any]) -> PlanKeeps:
    """The numbers of a sampling plan (core/sampling.py `plan_keep_rates`, as written to plan.json)."""
    before, after = plan["before"], plan["expected_after"]
    return PlanKeeps(
        rates=dict(plan["rates"]),
        rows_seen=before["rows"],
        rows_kept=after["rows"],
        memorization_share=(before["memorization_share"], after["memorization_share"]),
        non_english_share=(before["non_english_share"], after["non_english_share"]),
        feasible=plan["feasible"],
        notes=list(plan["notes"]),
    )


def read_plan_keeps(layout: DataLayout) -> PlanKeeps | None:
    """`plan_keeps` of the plan the build under `layout` wrote; None when there is none."""
    path = layout.sampling_plan()
    return plan_keeps(read_json(path)) if path.is_file() else None
