"""Stable hashing of `synth_id`: the splits and the mixture sampling never depend on row order or sharding."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import polars as pl

from synthkd_assets.core.filters import filter_config
from synthkd_contract import constants, drops
from synthkd_contract.labels import normalize_language
from synthkd_contract.splits import stable_unit_interval, stable_unit_intervals

# --- mixture sampling (001 "Exercise/language mixture") --------------------------------------
#
# A row is kept iff it passes every rule that applies to it: `memorization` (exercise ==
# "memorization"), `non_english` or `english` (by language), and `global`. Each rule keeps a row iff
# stable_unit_interval(<the rule's salt>, synth_id) < <the rule's rate>: the split's construction with
# another salt, so the decision depends on synth_id and the plan only, never on row order, shard
# layout or the other rows, and the rules are independent of each other and of the split.

Cell = tuple[str, str]  # (exercise, language)
RULE_ORDER = ("memorization", "non_english", "english", "global")


@dataclass(frozen=True)
class MixTargets:
    """What the plan aims for: memorization share <= memorization_cap, non-English share within
    [non_english_min, non_english_max], and a uniform `global_keep` on top (token budgets)."""

    memorization_cap: float = constants.MEMORIZATION_CAP
    non_english_min: float = constants.NON_ENGLISH_MIN
    non_english_max: float = constants.NON_ENGLISH_MAX
    global_keep: float = constants.GLOBAL_KEEP

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.memorization_cap <= 1:
            problems.append(f"memorization_cap {self.memorization_cap} not in (0, 1]")
        if not 0 <= self.non_english_min < 1:
            problems.append(f"non_english_min {self.non_english_min} not in [0, 1)")
        if not 0 < self.non_english_max <= 1:
            problems.append(f"non_english_max {self.non_english_max} not in (0, 1]")
        if self.non_english_min > self.non_english_max:
            problems.append(f"non_english_min {self.non_english_min} > non_english_max {self.non_english_max}")
        if not 0 < self.global_keep <= 1:
            problems.append(f"global_keep {self.global_keep} not in (0, 1]")
        if problems:
            raise ValueError("invalid mixture targets: " + "; ".join(problems))

    def to_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def is_memorization(exercise: str) -> bool:
    return exercise == constants.MEMORIZATION_EXERCISE


def is_english(language: str) -> bool:
    """Whether a row's language label means English (`EN`, `en-US`, ` en` do: synthkd_contract.labels)."""
    return normalize_language(language) == constants.ENGLISH_LANGUAGE


def rules_for(exercise: str, language: str) -> tuple[str, ...]:
    """The sampling rules that apply to a row of this cell, in the order they are tested."""
    language_rule = "english" if is_english(language) else "non_english"
    return ("memorization", language_rule, "global") if is_memorization(exercise) else (language_rule, "global")


def keep_probability(exercise: str, language: str, rates: Mapping[str, float]) -> float:
    probability = 1.0
    for rule in rules_for(exercise, language):
        probability *= rates[rule]
    return probability


def sampling_drop_reason(synth_id: str, exercise: str, language: str, rates: Mapping[str, float]) -> str | None:
    """The first rule that drops this row (`sampled_out_<rule>`), or None when every rule keeps it."""
    for rule in rules_for(exercise, language):
        rate = rates[rule]
        if rate < 1.0 and not stable_unit_interval(constants.SAMPLING_SALTS[rule], synth_id) < rate:
            return drops.DROP_SAMPLED_OUT[rule]
    return None


def sampling_rule(rates: Mapping[str, float]) -> Callable[[pl.DataFrame], pl.Series]:
    """The plan's rates as a RowRule over synth_harmony_v1 frames (synth_id, exercise, language): each row's
    `sampling_drop_reason`, taken a rule at a time over the frame (each language label judged once, each rule's
    salted hashes of the rows it still decides taken together)."""

    def drop_reasons(frame: pl.DataFrame) -> pl.Series:
        ids = frame["synth_id"].to_list()
        labels = frame["language"]
        english_labels = [label for label in labels.unique().to_list() if is_english(label)]
        english = labels.is_in(english_labels).fill_null(False).to_numpy()
        memorization = (frame["exercise"] == constants.MEMORIZATION_EXERCISE).fill_null(False).to_numpy()
        applies = {"memorization": memorization, "non_english": ~english, "english": english}
        reasons = np.full(frame.height, None, dtype=object)
        undecided = np.ones(frame.height, dtype=bool)
        for rule in RULE_ORDER:  # a row's rules in rules_for's order: the language rules never both apply
            rate = rates[rule]
            if rate >= 1.0:
                continue
            places = np.flatnonzero(undecided & applies.get(rule, True))
            units = stable_unit_intervals(constants.SAMPLING_SALTS[rule], [ids[i] for i in places])
            dropped = places[~(units < rate)]
            reasons[dropped] = drops.DROP_SAMPLED_OUT[rule]
            undecided[dropped] = False
        return pl.Series("reason", reasons.tolist(), dtype=pl.String)

    return drop_reasons


def mix_summary(cells: Mapping[Cell, float]) -> dict[str, Any]:
    """Rows, memorization and non-English shares, and rows per exercise / language of a cell table."""
    # math.fsum is exactly rounded, so neither the plan's bytes nor its numbers depend on count order
    total = math.fsum(cells.values())
    exercises = sorted({ex for ex, _ in cells})
    languages = sorted({lang for _, lang in cells})
    memorization = math.fsum(n for (ex, _), n in cells.items() if is_memorization(ex))
    non_english = math.fsum(n for (_, lang), n in cells.items() if not is_english(lang))
    return {
        "rows": total,
        "memorization_share": memorization / total if total else 0.0,
        "non_english_share": non_english / total if total else 0.0,
        "exercise": {ex: math.fsum(n for (e, _), n in cells.items() if e == ex) for ex in exercises},
        "language": {lang: math.fsum(n for (_, g), n in cells.items() if g == lang) for lang in languages},
    }


def cells_from_nested(nested: Mapping[str, Mapping[str, int]]) -> dict[Cell, int]:
    """{exercise: {language: n}} (as shard reports store it) -> {(exercise, language): n}."""
    return {(ex, lang): int(n) for ex, languages in nested.items() for lang, n in languages.items()}


def nested_from_cells(cells: Mapping[Cell, float]) -> dict[str, dict[str, float]]:
    nested: dict[str, dict[str, float]] = {}
    for (ex, lang), n in sorted(cells.items()):
        nested.setdefault(ex, {})[lang] = n
    return nested


def expected_after(cells: Mapping[Cell, int], rates: Mapping[str, float]) -> dict[Cell, float]:
    return {(ex, lang): n * keep_probability(ex, lang, rates) for (ex, lang), n in cells.items()}


def _language_rates(ratio: float) -> tuple[float, float]:
    """(english, non_english) keep rates realizing non_english/english = ratio, the larger one 1."""
    return (1.0, ratio) if ratio <= 1.0 else (1.0 / ratio, 1.0)


def _solve_rates(em: float, nm: float, eo: float, no: float, targets: MixTargets) -> tuple[float, float, list[str]]:
    """(memorization rate a, language ratio b = non_english rate / english rate) and notes.

    Shares are scale-free, so with English rows kept at 1 and non-English at b:
      memorization share  M(a, b) = a(em + nm b) / (a(em + nm b) + eo + no b)
      non-English share   L(a, b) = b(nm a + no) / (em a + eo + b(nm a + no))
    The plan is the largest fixed point a > 0 of  a = min(1, a*(b)),  b = clamp(1, b_lo(a), b_hi(a))
    where a*(b) puts M at the cap and b_lo / b_hi put L at the range's ends: memorization is kept
    as much as the cap allows and the language mix only moves to the nearest end of its range. Any
    such fixed point meets every target; each is one of six cases (a free or pinned, b free or pinned
    at either end), solved in closed form (a quadratic with one positive root when both are pinned).
    When there is none (memorization and language so correlated that the cap and the range exclude
    each other), the cap wins: languages are left as they are and memorization is capped.
    """
    cap, lo, hi = targets.memorization_cap, targets.non_english_min, targets.non_english_max
    notes: list[str] = []
    english, non_english, memorization, other = em + eo, nm + no, em + nm, eo + no
    language_free = english > 0 and non_english > 0
    memorization_free = memorization > 0 and other > 0 and cap < 1
    if not language_free:
        notes.append("no English rows" if english == 0 else "no non-English rows")
    if memorization > 0 and other == 0 and cap < 1:
        notes.append("every row is memorization")
    k1 = cap / (1 - cap) if cap < 1 else math.inf

    def a_star(b: float) -> float:
        if not memorization_free:
            return 1.0
        return min(1.0, k1 * (eo + no * b) / (em + nm * b))

    def b_bounds(a: float) -> tuple[float, float]:
        e, n = em * a + eo, nm * a + no
        b_lo = lo / (1 - lo) * e / n
        b_hi = hi / (1 - hi) * e / n if hi < 1 else math.inf
        return b_lo, b_hi

    def b_of(a: float) -> float:
        if not language_free:
            return 1.0
        b_lo, b_hi = b_bounds(a)
        return min(max(1.0, b_lo), b_hi)

    def close(x: float, y: float) -> bool:
        return abs(x - y) <= 1e-9 * max(1.0, abs(x), abs(y))

    candidates: list[tuple[float, float]] = [(1.0, b_of(1.0))]
    if memorization_free:
        candidates.append((k1 * other / memorization, 1.0))
        for share in (lo, hi) if language_free else ():
            if not 0 < share < 1:
                continue
            k2 = share / (1 - share)
            qa = nm * no * (k1 + 1)
            qb = nm * k1 * eo + no * em - k2 * (em * k1 * no + eo * nm)
            qc = k2 * em * eo * (k1 + 1)
            if qa > 0:
                root = math.sqrt(qb * qb + 4 * qa * qc)
                b = 2 * qc / (qb + root) if qb > 0 else (root - qb) / (2 * qa)
            elif qb > 0:
                b = qc / qb
            else:
                continue
            if b > 0:
                candidates.append((k1 * (eo + no * b) / (em + nm * b), b))
    fixed = [(a, b) for a, b in candidates if 0 < a <= 1 + 1e-12 and close(a, a_star(b)) and close(b, b_of(a))]
    if fixed:
        a, b = max(fixed, key=lambda ab: (ab[0], -abs(math.log(ab[1]))))
        return min(a, 1.0), b, notes
    notes.append(
        "the memorization cap and the non-English range exclude each other here: memorization capped, "
        "languages left as they are"
    )
    return a_star(1.0), 1.0, notes


def plan_keep_rates(counts: Mapping[Cell, int], targets: MixTargets) -> dict[str, Any]:
    """The sampling plan for (exercise, language) row counts after the quality filters.

    Returns the rates of every rule, the salts, whether the targets are met in expectation
    (`feasible`, with `notes` saying why not), and the before / expected-after mixes.
    """

    def total(memorization: bool, english: bool) -> float:
        return math.fsum(
            n for (ex, lang), n in counts.items() if is_memorization(ex) == memorization and is_english(lang) == english
        )

    em, nm, eo, no = total(True, True), total(True, False), total(False, True), total(False, False)
    a, b, notes = _solve_rates(em, nm, eo, no, targets)
    english, non_english = _language_rates(b)
    rates = {"memorization": a, "non_english": non_english, "english": english, "global": targets.global_keep}
    before = mix_summary(counts)
    after = mix_summary(expected_after(counts, rates))
    met = mix_meets_targets(after, targets)
    return {
        "targets": targets.to_dict(),
        "salts": dict(constants.SAMPLING_SALTS),
        "rule": "keep iff stable_unit_interval(salt[rule], synth_id) < rates[rule] for every rule of the row "
        "(memorization: exercise == 'memorization'; english / non_english: by language; global: all rows)",
        "rates": rates,
        "feasible": met,
        "notes": notes,
        "counts": nested_from_cells(counts),
        "before": before,
        "expected_after": after,
    }


def mix_meets_targets(summary: Mapping[str, Any], targets: MixTargets, tolerance: float = 1e-9) -> bool:
    if not summary["rows"]:
        return True
    return (
        summary["memorization_share"] <= targets.memorization_cap + tolerance
        and targets.non_english_min - tolerance <= summary["non_english_share"] <= targets.non_english_max + tolerance
    )


def mix_table_markdown(columns: Mapping[str, Mapping[str, Any]]) -> str:
    """A before/after table: one column per mix summary (e.g. before / expected after / achieved)."""
    names = list(columns)
    summaries = list(columns.values())
    exercises = sorted({ex for s in summaries for ex in s["exercise"]})
    languages = sorted({lang for s in summaries for lang in s["language"]})

    def share(s: Mapping[str, Any], n: float) -> str:
        return f"{100 * n / s['rows']:.1f}%" if s["rows"] else "-"

    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    lines.append("| rows | " + " | ".join(f"{s['rows']:.0f}" for s in summaries) + " |")
    lines.append(
        "| memorization share | " + " | ".join(f"{100 * s['memorization_share']:.1f}%" for s in summaries) + " |"
    )
    lines.append(
        "| non-English share | " + " | ".join(f"{100 * s['non_english_share']:.1f}%" for s in summaries) + " |"
    )
    for ex in exercises:
        lines.append(f"| exercise `{ex}` | " + " | ".join(share(s, s["exercise"].get(ex, 0)) for s in summaries) + " |")
    for lang in languages:
        lines.append(
            f"| language `{lang}` | " + " | ".join(share(s, s["language"].get(lang, 0)) for s in summaries) + " |"
        )
    return "\n".join(lines)


def selection_config(targets: MixTargets) -> dict[str, Any]:
    """The row-selection settings (001 filters and sampling targets) for the manifests' config hash.
    The plan's rates depend on the data too: the manifests record the plan (and its sha256) itself."""
    return {
        "filters": filter_config(),
        "sampling": {
            "targets": targets.to_dict(),
            "salts": dict(constants.SAMPLING_SALTS),
            "rule_order": list(RULE_ORDER),
            "memorization_exercise": constants.MEMORIZATION_EXERCISE,
            "english_language": constants.ENGLISH_LANGUAGE,
        },
    }
