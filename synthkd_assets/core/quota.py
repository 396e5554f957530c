"""The B x C quota grid on tokens (002 §4, §4.3; 004): keep rates per (skill, ctx) cell for a target skill mix.

004 makes tokens the authoritative size, so the plan solves on token counts (synth_tokenized's
`bucket_tokens`, summed by core/buckets.py `grids_from_reports`) and reports rows beside them. It only
downsamples: a row is kept iff stable_unit_interval(QUOTA_SALT, synth_id) < its cell's rate (the hash of
core/sampling.py with the pool's own salt), so a row's fate depends on its synth_id and the plan, never
on row order or sharding, and is independent of the 001 sampling rules applied before it.

The solver, for shares t_b (the mix renormalized over the feasible buckets) and available tokens T_b:
a bucket with t_b > 0 and T_b > 0 is feasible; one with t_b > 0 and no tokens is infeasible and reported.
The kept total K is the largest with K t_b <= T_b for every feasible b, i.e. K = min_b T_b / t_b, and
every cell of bucket b keeps K t_b / T_b <= 1 (the scarcest bucket relative to its target keeps all of
its rows). Within a bucket the ctx cells share the rate: the ctx mix is the curriculum's (002 §4.2).
`balance_tokens` (004) replaces the mix by equal shares over the buckets that hold tokens, which
truncates every larger bucket to the smallest.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from synthkd_assets.core.buckets import Cell, nested_grid
from synthkd_assets.core.sampling import stable_unit_interval
from synthkd_contract.buckets import (
    CTX_BUCKET_MAX_TOKENS,
    CTX_BUCKETS,
    EXERCISE_SKILL_BUCKET,
    QUOTA_SALT,
    SKILL_BUCKET_NAMES,
    SKILL_BUCKETS,
    SKILL_MIX,
)

QUOTA_RULE = (
    "keep iff stable_unit_interval(salt, synth_id) < rates[skill_bucket][ctx_bucket]; rates[b][c] = "
    "K * share[b] / tokens[b] for the largest K with K * share[b] <= tokens[b] in every feasible bucket"
)


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


def quota_keep(synth_id: str, skill: str, ctx: str, rates: Mapping[str, Mapping[str, float]]) -> bool:
    """Whether the pool keeps a conversation of cell (skill, ctx) under the plan's `rates`: a salted hash of
    synth_id, so the choice is deterministic, order-free and independent of the split and 001 sampling."""
    return stable_unit_interval(QUOTA_SALT, synth_id) < rates[skill][ctx]


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
