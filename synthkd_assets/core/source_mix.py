"""The global source mix on tokens (docs/sources.md#the-source-mix-on-tokens; issue #21 item 3): keep rates per source
so that SYNTH and each anchor category hold their target shares of the kept tokens, and no capped source more than its
cap.

The plan solves on tokens available per source (for SYNTH, the tokens expected after the pool's skill quota, so
floats are allowed) and reports rows beside them. It only downsamples: a row of source s is kept iff
stable_unit_interval(SOURCE_MIX_SALT, synth_id) < rates[s] (core/sampling.py's hash with the mix's own salt), so a
row's fate depends on its synth_id and the plan, never on row order or sharding, and is independent of the split,
the 001 sampling and the quota, whose salts differ.

The groups are "synth" (share synth_share) and each anchor category (its share); A_s is the tokens of source s and
cap_s its cap (a fraction of the kept total K). The solver:

1. a group with a share > 0 and no tokens is infeasible and reported (personality has no source yet: always, when
   its share is > 0); the shares are renormalized over the groups that hold tokens (SYNTH alone keeps rate 1.0). A
   group with share 0 keeps rate 0.
2. a group whose sources with tokens are all capped can hold at most m_g = the sum of their caps of any mix. When
   m_g is below its share the group is infeasible too (reported as under target): its share becomes m_g, and only
   the shortfall goes to the other groups, in proportion to their shares (the same water-filling clamps any group the
   shortfall would push above its own m_g). This is the same as if its target had been m_g. When the groups' m_g
   sum to less than 1, no mix can respect the caps and nothing is kept.
3. a group's capacity at total K is C_g(K) = sum over its sources of min(A_s, cap_s K) (A_s when uncapped). C_g(K) -
   share_g K is concave and piecewise linear with breakpoints A_s / cap_s, so {K : C_g(K) >= share_g K} is an
   interval [0, K_g], solved exactly segment by segment (no bisection); K = min_g K_g, the largest total at which
   every group can fill its share.
4. within a group, the target share_g K is split by water-filling: one common rate for its sources, a capped source
   clamped at cap_s K / A_s, the excess going to the others by raising their common rate (never above 1). The
   group(s) with K_g = K keep everything the caps allow (rate exactly 1.0 for an uncapped source).
5. a capped source is capped exactly, not in expectation: given its rows (synth_id, tokens), its rate becomes the
   hash of the first row, in hash order, that would take its kept tokens past its planned tokens (rate_s A_s <=
   cap_s K), so the rule keeps the longest hash-ordered prefix within them and the plan states those tokens exactly;
   the tokens this leaves out of the group's share (less than one row) go to its other sources by the same
   water-filling.
   (A rate on its own keeps rate_s A_s only on average: a few long rows of a small source went 4% over the cap.)
6. every source whose rows the plan is given is selected the same way (not only the capped ones): its longest
   hash-ordered prefix within its planned tokens, an oversized row that does not fit skipped and excluded by id
   (core/quota.py `hash_ordered_prefix`); a source whose long rows leave it under half its planned tokens is solved
   again without them. One long row then cannot take a group off its share (docs/sources.md).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

import numpy as np
import polars as pl

from synthkd_assets.core.buckets import grids_from_reports
from synthkd_assets.core.quota import (
    OVERSIZED_ROW_SHARE,
    QUOTA_SHARE_TOLERANCE,
    bucket_prefixes,
    hash_ordered_prefix,
    share_misses,
)
from synthkd_assets.core.quota_rows import QuotaRows, length_counts, median_of_counts
from synthkd_contract.sources import (
    ANCHOR_CATEGORIES,
    ANCHOR_CATEGORY_SHARES,
    CATEGORY_SOURCES,
    SOURCE_GROUPS,
    SOURCE_MIX_SALT,
    SOURCE_TOKEN_CAPS,
    SYNTH_SHARE,
    SYNTH_SOURCE,
    partition_source,
)
from synthkd_contract.splits import stable_unit_interval

SOURCE_MIX_RULE = (
    "keep iff stable_unit_interval(salt, synth_id) < rates[source]; K is the largest kept total at which every "
    "feasible group (synth, each anchor category) can hold share[group] * K with no capped source above cap * K; "
    "a group's sources share one rate, a capped one clamped at cap * K / tokens[source], then lowered to the hash "
    "of its first row (in hash order) past its planned tokens, so it keeps at most those exactly"
)

# the groups of the mix and their sources, in a fixed order: the plan's bytes never follow a dict's order
GROUPS: tuple[str, ...] = SOURCE_GROUPS
GROUP_SOURCES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {SYNTH_SOURCE: (SYNTH_SOURCE,), **{category: CATEGORY_SOURCES[category] for category in ANCHOR_CATEGORIES}}
)
SOURCES: tuple[str, ...] = tuple(source for group in GROUPS for source in GROUP_SOURCES[group])
SOURCE_GROUP: Mapping[str, str] = MappingProxyType(
    {source: group for group in GROUPS for source in GROUP_SOURCES[group]}
)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class SourceMixTargets:
    """What the mix aims for: `synth_share` of the kept tokens for SYNTH, `category_shares` for the anchor
    categories (a category left out has share 0; renormalized over the groups that hold tokens), and
    `source_caps`, the most a source may hold of the kept tokens."""

    synth_share: float = SYNTH_SHARE
    category_shares: Mapping[str, float] = field(default_factory=lambda: dict(ANCHOR_CATEGORY_SHARES))
    source_caps: Mapping[str, float] = field(default_factory=lambda: dict(SOURCE_TOKEN_CAPS))

    def __post_init__(self) -> None:
        problems = []
        if not _is_number(self.synth_share) or not 0 <= self.synth_share < math.inf:
            problems.append(f"synth_share = {self.synth_share!r} is not a finite number >= 0")
        if unknown := sorted(set(self.category_shares) - set(ANCHOR_CATEGORIES)):
            problems.append(
                f"anchor_shares (category_shares) names {unknown}, not categories of synthkd_contract/sources.py "
                f"ANCHOR_CATEGORY_SHARES {list(ANCHOR_CATEGORIES)}"
            )
        for category, share in sorted(self.category_shares.items()):
            if not _is_number(share) or not 0 <= share < math.inf:
                problems.append(
                    f"anchor_shares (category_shares)[{category!r}] = {share!r} is not a finite number >= 0"
                )
        if unknown := sorted(set(self.source_caps) - set(SOURCES)):
            problems.append(
                f"source_caps names {unknown}, not {SYNTH_SOURCE!r} or a source of synthkd_contract/sources.py "
                f"SOURCE_CATEGORY"
            )
        for source, cap in sorted(self.source_caps.items()):
            if not _is_number(cap) or not 0 < cap <= 1:
                problems.append(f"source_caps[{source!r}] = {cap!r} is not a number in (0, 1]")
        if not problems and not math.fsum([self.synth_share, *self.category_shares.values()]) > 0:
            problems.append("synth_share and category_shares sum to 0: no group would be kept")
        if problems:
            raise ValueError("invalid source mix targets: " + "; ".join(problems))
        # read-only copies in table order: the caller's dicts can change neither the targets nor their bytes
        object.__setattr__(self, "synth_share", float(self.synth_share))
        shares = {c: float(self.category_shares[c]) for c in ANCHOR_CATEGORIES if c in self.category_shares}
        object.__setattr__(self, "category_shares", MappingProxyType(shares))
        caps = {s: float(self.source_caps[s]) for s in SOURCES if s in self.source_caps}
        object.__setattr__(self, "source_caps", MappingProxyType(caps))

    def to_dict(self) -> dict[str, Any]:
        return {
            "synth_share": self.synth_share,
            "category_shares": dict(self.category_shares),
            "source_caps": dict(self.source_caps),
        }

    def group_shares(self) -> dict[str, float]:
        """The target share of every group, 0 for a category left out."""
        return {SYNTH_SOURCE: self.synth_share, **{c: self.category_shares.get(c, 0.0) for c in ANCHOR_CATEGORIES}}


def _check_counts(name: str, counts: Mapping[str, float]) -> dict[str, float]:
    """The counts per source as floats; ValueError naming unknown sources or counts that are not finite >= 0."""
    if unknown := sorted(set(counts) - set(SOURCES), key=str):
        raise ValueError(
            f"{name}: {unknown} are not {SYNTH_SOURCE!r} or a source of synthkd_contract/sources.py SOURCE_CATEGORY"
        )
    if bad := [f"{s!r}: {n!r}" for s, n in sorted(counts.items()) if not _is_number(n) or not 0 <= n < math.inf]:
        raise ValueError(f"{name}: not a finite count >= 0: {', '.join(bad)}")
    return {s: float(counts.get(s, 0.0)) for s in SOURCES}


def _cap_limits(available: Mapping[str, float], caps: Mapping[str, float]) -> dict[str, float]:
    """m_g: the largest share of any mix a group can hold, the sum of its capped sources' caps when all its
    sources with tokens are capped (inf when one is not, 0 when none holds tokens)."""
    limits = {}
    for group in GROUPS:
        held = [s for s in GROUP_SOURCES[group] if available[s] > 0]
        uncapped = any(s not in caps for s in held)
        limits[group] = math.inf if uncapped else math.fsum(caps[s] for s in held)
    return limits


def _effective_shares(weights: Mapping[str, float], limits: Mapping[str, float]) -> dict[str, float]:
    """Shares over the groups in `weights`, proportional to them except that none exceeds its limit: a clamped group
    holds its limit and the others share the rest in proportion to their weights (water-filling). Without a
    clamp it is the plain renormalization w_g / sum(w). Sums to 1 unless the limits sum to less."""
    clamped: set[str] = set()
    while free := [g for g in weights if g not in clamped]:
        rest = 1.0 - math.fsum(limits[g] for g in clamped)  # > 0: a group is clamped only below its own share
        total = math.fsum(weights[g] for g in free)
        shares = {g: weights[g] * rest / total if g in free else limits[g] for g in weights}
        if not (over := [g for g in free if shares[g] > limits[g]]):
            return shares
        clamped.update(over)
    return {g: limits[g] for g in weights}


def _group_limit_total(
    share: float, sources: list[str], available: Mapping[str, float], caps: Mapping[str, float]
) -> float:
    """K_g: the largest K with sum_s min(A_s, cap_s K) >= share K, walking the breakpoints A_s / cap_s in order:
    on each segment the capacity is (uncapped + saturated tokens) + (unsaturated caps) K, a line."""
    uncapped = math.fsum(available[s] for s in sources if s not in caps)
    capped = sorted((available[s] / caps[s], s) for s in sources if s in caps)
    for i, (breakpoint, _) in enumerate(capped):
        fixed = math.fsum([uncapped, *(available[s] for _, s in capped[:i])])
        slope = math.fsum(caps[s] for _, s in capped[i:])
        if share > slope and (root := fixed / (share - slope)) <= breakpoint:
            return root
    return math.fsum([uncapped, *(available[s] for _, s in capped)]) / share


def _water_fill(
    target: float, sources: list[str], available: Mapping[str, float], ceilings: Mapping[str, float]
) -> dict[str, float]:
    """Rates min(r, ceiling_s) with sum_s A_s min(r, ceiling_s) = target: one common rate r, each source clamped at
    its ceiling (1, or cap_s K / A_s for a capped one) and the excess going to the others."""
    order = sorted(sources, key=lambda s: (ceilings[s], s))
    rates = {}
    for i, s in enumerate(order):
        rest = order[i:]
        rate = (target - math.fsum(available[t] * rates[t] for t in order[:i])) / math.fsum(available[t] for t in rest)
        if rate <= ceilings[s]:
            return {**rates, **{t: max(0.0, min(rate, ceilings[t])) for t in rest}}
        rates[s] = ceilings[s]
    return rates  # the target is the group's whole capacity: every source at its ceiling


def exact_cap(rows: Sequence[tuple[str, int]], planned_tokens: float) -> tuple[float, int, int]:
    """(rate, tokens, rows) keeping the longest prefix of `rows` (synth_id, tokens) in source-mix hash order whose
    tokens stay within `planned_tokens`: the rate is the hash of the first row left out (1.0 when all fit), so
    `source_mix_keep` keeps exactly that prefix."""
    selection = hash_ordered_prefix(rows, SOURCE_MIX_SALT, planned_tokens, math.inf)
    return selection.rate, selection.tokens, len(selection.kept)


class PrefixCount(NamedTuple):
    """What a source's hash-ordered prefix keeps (`SourceRows.prefix`)."""

    rate: float  # the hash of the first row left out (1.0 when every row fits)
    tokens: int  # the kept rows' tokens
    rows: int  # the kept rows
    skipped: list[tuple[str, int]]  # (synth_id, tokens) of the oversized rows below the rate: excluded by id


class SourceRows(Protocol):
    """A source's rows as the source mix selects them (docs/sources.md "The source mix on tokens")."""

    def prefix(self, budget: float, oversized: float) -> PrefixCount: ...

    def exclude(self, ids: Collection[str]) -> None: ...

    def length_counts(self) -> tuple[np.ndarray, np.ndarray]: ...


class ListedRows:
    """A source's rows in memory, (synth_id, tokens) each: an anchor source's, small beside SYNTH."""

    def __init__(self, rows: Iterable[tuple[str, int]]) -> None:
        self.rows = list(rows)

    def prefix(self, budget: float, oversized: float) -> PrefixCount:
        """`hash_ordered_prefix` of the rows in source-mix hash order."""
        selection = hash_ordered_prefix(self.rows, SOURCE_MIX_SALT, budget, oversized)
        return PrefixCount(selection.rate, selection.tokens, len(selection.kept), list(selection.skipped))

    def exclude(self, ids: Collection[str]) -> None:
        """Leave out the rows with these synth_ids."""
        self.rows = [row for row in self.rows if row[0] not in ids]

    def length_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct token counts, rows of each) of the rows."""
        return length_counts(np.fromiter((n for _, n in self.rows), np.int64, len(self.rows)))


class BinnedRows:
    """A source's rows by source-mix hash bin: a `QuotaRows` hashed with SOURCE_MIX_SALT, every row in its first
    bucket (`QuotaRows.kept(..., one_bucket=True)`). SYNTH's kept rows, however many the corpus holds: the same
    selection as `ListedRows` (`bucket_prefixes`), one file's rows in memory at a time."""

    def __init__(self, rows: QuotaRows) -> None:
        if rows.salt != SOURCE_MIX_SALT:
            raise ValueError(f"rows hashed with {rows.salt!r}, not the source mix's {SOURCE_MIX_SALT!r}")
        self.held = rows

    def prefix(self, budget: float, oversized: float) -> PrefixCount:
        """`hash_ordered_prefix` of the usable rows in source-mix hash order."""
        chosen = bucket_prefixes(self.held, {0: budget}, oversized)[0]
        skipped = [(row.synth_id, row.tokens) for row in chosen.skipped]
        return PrefixCount(chosen.rate, chosen.tokens, int(chosen.kept_rows.sum()), skipped)

    def exclude(self, ids: Collection[str]) -> None:
        """Leave out the rows with these synth_ids."""
        self.held.exclude(ids)

    def length_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct token counts, rows of each) of the usable rows."""
        return self.held.usable_length_counts(0)


def _group_median(rows: Sequence[SourceRows]) -> int:
    """The median (lower middle) token count of these sources' rows together, 0 for none."""
    counts = [source.length_counts() for source in rows]
    values = np.concatenate([v for v, _ in counts]) if counts else np.zeros(0, dtype=np.int64)
    held = np.concatenate([n for _, n in counts]) if counts else np.zeros(0, dtype=np.int64)
    order = np.argsort(values, kind="stable")
    return median_of_counts(values[order], held[order])


def plan_source_mix(
    tokens: Mapping[str, float],
    rows: Mapping[str, float],
    targets: SourceMixTargets,
    capped_rows: Mapping[str, Sequence[tuple[str, int]] | SourceRows] | None = None,
) -> dict[str, Any]:
    """The mix plan for the tokens and rows available per source: the keep rate of every source, whether every
    target is reachable (`feasible`, each unreachable one in `infeasible` with its reason), and the available /
    expected tokens and rows per source and per group. JSON-able; every sum is math.fsum and every loop runs in
    table order, so neither the numbers nor the bytes depend on the order of the mappings.

    Args:
        tokens: tokens available per source.
        rows: rows available per source.
        targets: the shares and caps to meet.
        capped_rows: the rows of any source, capped or not, as (synth_id, tokens) pairs or a SourceRows (SYNTH's
            kept rows by hash bin, `BinnedRows`): each such source below its whole keeps the hash-ordered prefix
            of its rows within its planned tokens (step 5), an oversized row that does not fit excluded by id;
            rows that leave their source short are unusable and the mix is solved again without them
            (docs/sources.md "The source mix on tokens"). Without its rows, a source's rate holds it to its share
            on average only.

    Returns:
        The plan, with `excluded` (every row dropped by id: source, group, tokens, why) and `share_misses` (groups
        whose expected share misses its target share by more than QUOTA_SHARE_TOLERANCE).

    Raises:
        ValueError: a count names an unknown source or is not a finite number >= 0.
    """
    available = _check_counts("tokens", tokens)
    row_counts = _check_counts("rows", rows)
    given = {s: r if isinstance(r, ListedRows | BinnedRows) else ListedRows(r) for s, r in (capped_rows or {}).items()}
    unusable: list[dict[str, Any]] = []
    shares: dict[str, float] | None = None  # the data's own: what the kept shares are held to (as in core/quota.py)
    while True:
        plan, short = _solve_source_mix(available, row_counts, targets, given)
        shares = shares or {g: entry["target_share"] for g, entry in plan["groups"].items()}
        if not short:
            break
        for source, skipped in short.items():
            dropped = {synth_id for synth_id, _ in skipped}
            given[source].exclude(dropped)
            available[source] = available[source] - sum(n for _, n in skipped)
            row_counts[source] = max(0.0, row_counts[source] - len(skipped))
            why = "unusable: its source cannot fill its planned tokens with it"
            unusable += [_excluded_entry(source, row, why) for row in skipped]
    excluded = sorted([*unusable, *plan["excluded"]], key=lambda entry: (-entry["tokens"], entry["synth_id"]))
    # what is reported as available is what the data holds, unusable rows included
    for entry in unusable:
        plan["sources"][entry["source"]]["available_tokens"] += entry["tokens"]
        plan["sources"][entry["source"]]["available_rows"] += 1
        plan["groups"][entry["group"]]["available_tokens"] += entry["tokens"]
        plan["groups"][entry["group"]]["available_rows"] += 1
    if excluded:
        plan["notes"].append(
            f"{len(excluded)} rows excluded by id ({sum(e['tokens'] for e in excluded)} tokens): too long for their "
            "source's planned tokens (the plan's `excluded`)"
        )
    for g, share in shares.items():
        plan["groups"][g]["target_share"] = share
    plan["targets"]["shares"] = shares
    granularity = {g: _group_median([given[s] for s in GROUP_SOURCES[g] if s in given]) for g in GROUPS}
    achieved = {g: entry["expected_tokens"] for g, entry in plan["groups"].items()}
    misses = share_misses(achieved, shares, granularity) if plan["kept_total"] else []
    return {
        **plan,
        "excluded": excluded,
        "share_tolerance": QUOTA_SHARE_TOLERANCE,
        "granularity": granularity,
        "share_misses": misses,
    }


def _excluded_entry(source: str, row: tuple[str, int], why: str) -> dict[str, Any]:
    return {"synth_id": row[0], "source": source, "group": SOURCE_GROUP[source], "tokens": int(row[1]), "why": why}


def _solve_source_mix(
    tokens: Mapping[str, float],
    rows: Mapping[str, float],
    targets: SourceMixTargets,
    capped_rows: Mapping[str, SourceRows],
) -> tuple[dict[str, Any], dict[str, list[tuple[str, int]]]]:
    """One solve of `plan_source_mix` over these rows; also the sources whose skipped oversized rows leave them
    more than one oversized row short of their planned tokens, with those rows."""
    available = _check_counts("tokens", tokens)
    row_counts = _check_counts("rows", rows)
    caps = targets.source_caps
    weights = targets.group_shares()
    group_tokens = {g: math.fsum(available[s] for s in GROUP_SOURCES[g]) for g in GROUPS}
    notes: list[str] = []
    infeasible: list[dict[str, Any]] = []
    for g in GROUPS:
        if weights[g] > 0 and group_tokens[g] == 0:
            held = ", ".join(GROUP_SOURCES[g])
            where = f"sources {held}" if held else "no source yet in synthkd_contract/sources.py CATEGORY_SOURCES"
            what = "synth" if g == SYNTH_SOURCE else f"category {g}"
            reason = f"no tokens in {what} ({where}): its target share cannot be met"
            infeasible.append({"group": g, "target": weights[g], "reason": reason})
    feasible_groups = [g for g in GROUPS if weights[g] > 0 and group_tokens[g] > 0]
    weight_total = math.fsum(weights[g] for g in feasible_groups)
    renormalized = {g: weights[g] / weight_total for g in feasible_groups}
    limits = _cap_limits(available, caps)
    for g in feasible_groups:
        if limits[g] < renormalized[g]:
            held = ", ".join(f"{s} {caps[s]:g}" for s in GROUP_SOURCES[g] if available[s] > 0)
            reason = (
                f"caps hold {g} to {limits[g]:g} of the kept tokens ({held}), below its share {renormalized[g]:.6g}: "
                "it keeps its capped maximum and the shortfall goes to the other groups in proportion to their shares"
            )
            infeasible.append({"group": g, "target": weights[g], "reason": reason})
    effective = _effective_shares(renormalized, limits) if feasible_groups else {}
    shares = {g: effective.get(g, 0.0) for g in GROUPS}
    for g in feasible_groups:
        if renormalized[g] <= limits[g] == shares[g] and renormalized[g] < shares[g]:
            notes.append(f"{g}: the shortfall of capped groups raises its share only to its caps' total {limits[g]:g}")

    if feasible_groups and math.fsum(limits[g] for g in feasible_groups) < 1:
        notes.append("the caps of the groups with tokens sum to less than 1: no mix respects them, nothing is kept")
        group_totals: dict[str, float] = {}
    else:
        group_totals = {
            g: _group_limit_total(shares[g], [s for s in GROUP_SOURCES[g] if available[s] > 0], available, caps)
            for g in feasible_groups
        }
    kept_total = min(group_totals.values()) if group_totals else 0.0
    rate = dict.fromkeys(SOURCES, 0.0)
    ceilings: dict[str, float] = {}
    for g, limit_total in group_totals.items():
        held = [s for s in GROUP_SOURCES[g] if available[s] > 0]
        ceilings.update({s: min(1.0, caps[s] * kept_total / available[s]) if s in caps else 1.0 for s in held})
        # the binding group keeps all its caps allow: its capacity is its target, exactly
        if limit_total == kept_total:
            rate.update({s: ceilings[s] for s in held})
        else:
            rate.update(_water_fill(shares[g] * kept_total, held, available, ceilings))
    expected_tokens = {s: available[s] * rate[s] for s in SOURCES}
    expected_rows = {s: row_counts[s] * rate[s] for s in SOURCES}
    at_cap = [s for s in caps if s in ceilings and ceilings[s] < 1.0 and rate[s] == ceilings[s]]
    exact = sorted(s for s in SOURCES if 0 < rate[s] < 1 and s in capped_rows)
    oversized = OVERSIZED_ROW_SHARE * kept_total
    excluded: list[dict[str, Any]] = []
    short: dict[str, list[tuple[str, int]]] = {}
    for s in exact:  # step 5: the longest hash-ordered prefix within its planned tokens, stated exactly
        selection = capped_rows[s].prefix(expected_tokens[s], oversized)
        # lumpy: a few long rows hold its tokens, and without them it cannot fill half its planned tokens
        if selection.skipped and selection.tokens < expected_tokens[s] / 2 and expected_tokens[s] > oversized:
            short[s] = list(selection.skipped)
        why = "oversized: does not fit its source's planned tokens"
        excluded += [_excluded_entry(s, row, why) for row in selection.skipped]
        rate[s], expected_tokens[s], expected_rows[s] = (
            selection.rate,
            float(selection.tokens),
            float(selection.rows),
        )
    for g in sorted({SOURCE_GROUP[s] for s in exact}, key=GROUPS.index):  # the rows left out: to the group's others
        others = [s for s in GROUP_SOURCES[g] if available[s] > 0 and s not in exact]
        if others:
            left = shares[g] * kept_total - math.fsum(expected_tokens[s] for s in GROUP_SOURCES[g] if s in exact)
            rate.update(_water_fill(left, others, available, ceilings))
            expected_tokens.update({s: available[s] * rate[s] for s in others})
            expected_rows.update({s: row_counts[s] * rate[s] for s in others})
    if group_totals:
        binding = [g for g in GROUPS if group_totals.get(g) == kept_total]
        capped = [s for g in binding for s in GROUP_SOURCES[g] if s in caps and available[s] > 0]
        held = ", capped sources up to their caps" if capped else ""
        notes.append(
            f"{', '.join(binding)} kept whole{held} (the scarcest relative to its share); the others downsampled"
        )
    elif not feasible_groups:
        notes.append("no group with a target share holds tokens: nothing is kept")
    for s in at_cap:
        notes.append(f"{s} held to its cap, {caps[s]:g} of the kept tokens (rate {rate[s]:.6g})")
    for s in exact:
        notes.append(f"{s} capped exactly: {expected_tokens[s]:.0f} tokens, the first rows in hash order")
    if dropped := [g for g in GROUPS if weights[g] == 0 and group_tokens[g] > 0]:
        notes.append(f"target 0: {', '.join(dropped)} not kept (rate 0)")

    expected_total = math.fsum(expected_tokens.values())

    def share_of(value: float, total: float) -> float:
        return value / total if total else 0.0

    sources = {
        s: {
            "group": SOURCE_GROUP[s],
            "cap": caps.get(s),
            "rate": rate[s],
            "available_tokens": available[s],
            "available_rows": row_counts[s],
            "expected_tokens": expected_tokens[s],
            "expected_rows": expected_rows[s],
            # a source has no target of its own: its share of K is what the water-filling allots it
            "target_share": share_of(expected_tokens[s], kept_total),
            "expected_share": share_of(expected_tokens[s], expected_total),
        }
        for s in SOURCES
    }
    groups = {}
    for g in GROUPS:
        members = GROUP_SOURCES[g]
        expected = math.fsum(expected_tokens[s] for s in members)
        groups[g] = {
            "sources": list(members),
            # the most of the kept tokens the group can hold under its caps; None: unbounded or no tokens
            "cap": limits[g] if 0 < limits[g] < math.inf else None,
            "target": weights[g],
            "available_tokens": group_tokens[g],
            "available_rows": math.fsum(row_counts[s] for s in members),
            "expected_tokens": expected,
            "expected_rows": math.fsum(expected_rows[s] for s in members),
            "target_share": shares[g],
            "expected_share": share_of(expected, expected_total),
        }
    plan = {
        "targets": {**targets.to_dict(), "shares": shares},
        "salt": SOURCE_MIX_SALT,
        "rule": SOURCE_MIX_RULE,
        "rates": rate,
        "feasible": kept_total > 0 and not infeasible,
        "infeasible": infeasible,
        "notes": notes,
        "kept_total": kept_total,
        "sources": sources,
        "groups": groups,
        "excluded": excluded,
    }
    return plan, short


def source_mix_keep(
    synth_id: str, source: str, rates: Mapping[str, float], excluded: frozenset[str] | set[str] = frozenset()
) -> bool:
    """Whether the mix keeps a conversation of `source` under the plan's `rates`: a salted hash of synth_id below
    its source's rate and not one of the plan's `excluded` rows, so the choice is deterministic, order-free and
    independent of the split, the 001 sampling and the quota."""
    return stable_unit_interval(SOURCE_MIX_SALT, synth_id) < rates[source] and synth_id not in excluded


def source_mix_config(targets: SourceMixTargets) -> dict[str, Any]:
    """The mix settings and source table for the manifests' config hash (the rates depend on the data too: the
    manifests record the plan itself)."""
    return {
        "targets": targets.to_dict(),
        "salt": SOURCE_MIX_SALT,
        "rule": SOURCE_MIX_RULE,
        "group_sources": {g: list(GROUP_SOURCES[g]) for g in GROUPS},
    }


def achieved_vs_target(plan: Mapping[str, Any], achieved_tokens: Mapping[str, float]) -> dict[str, Any]:
    """The tokens the hash actually kept per source beside the plan's target and expected shares, per source and
    per group (for the manifests and the metadata: the achieved mix is the plan's up to binomial noise)."""
    achieved = _check_counts("achieved_tokens", achieved_tokens)
    total = math.fsum(achieved.values())
    groups = {g: math.fsum(achieved[s] for s in GROUP_SOURCES[g]) for g in GROUPS}

    def row(planned: Mapping[str, Any], tokens: float) -> dict[str, Any]:
        return {
            # a source's row names its group and cap (the UI's source table shows both)
            **({"group": planned["group"], "cap": planned["cap"]} if "group" in planned else {}),
            "target_share": planned["target_share"],
            "expected_share": planned["expected_share"],
            "achieved_tokens": tokens,
            "achieved_share": tokens / total if total else 0.0,
        }

    return {
        "achieved_total": total,
        "sources": {s: row(plan["sources"][s], achieved[s]) for s in SOURCES},
        "groups": {g: row(plan["groups"][g], groups[g]) for g in GROUPS},
    }


def reports_by_source(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Mapping[str, Any]]]:
    """{source: {partition: report}} of per-partition reports (SYNTH's keys, anchors' `<source>/<stem>`)."""
    by_source: dict[str, dict[str, Mapping[str, Any]]] = {}
    for name, report in sorted(reports.items()):
        by_source.setdefault(partition_source(name), {})[name] = report
    return by_source


def tokenized_row_lengths(paths: Sequence[Path]) -> list[tuple[str, int]]:
    """(synth_id, tokens) of every row of these synth_tokenized files: the rows a source's exact selection is
    chosen from (anchor sources are small beside SYNTH)."""
    if not paths:
        return []
    # loss_mask (uint8) is as long as tokens (int32): its lengths for a quarter of the bytes read
    return pl.scan_parquet(list(paths)).select("synth_id", pl.col("loss_mask").list.len()).collect().rows()


def source_mix_plan(
    quota_plan: Mapping[str, Any],
    tokenized_by_source: Mapping[str, Mapping[str, Mapping[str, Any]]],
    targets: SourceMixTargets,
    capped_rows: Mapping[str, Sequence[tuple[str, int]] | SourceRows] | None = None,
) -> dict[str, Any]:
    """The pool's source mix: SYNTH enters with the tokens and rows its skill quota grid keeps in expectation (the
    quota plan), each anchor source with all its tokenized tokens and rows (synth_tokenized reports' grids);
    `capped_rows` make the caps exact (`plan_source_mix`)."""
    tokens = dict.fromkeys(SOURCES, 0.0)
    rows = dict.fromkeys(SOURCES, 0.0)
    tokens[SYNTH_SOURCE] = math.fsum(quota_plan["skill_tokens"]["expected"].values())
    rows[SYNTH_SOURCE] = math.fsum(n for cells in quota_plan["expected"]["rows"].values() for n in cells.values())
    for source, reports in tokenized_by_source.items():
        if source != SYNTH_SOURCE:
            source_tokens, source_rows = grids_from_reports(reports.values())
            tokens[source], rows[source] = float(sum(source_tokens.values())), float(sum(source_rows.values()))
    return plan_source_mix(tokens, rows, targets, capped_rows)
