"""The global source mix on tokens (core/source_mix.py): shares met in expectation, caps never exceeded, K maximal.

The plan's exact breakpoint solution is checked against oracles written without it: the target shares by a
bisection over the water level, every constraint in exact rational arithmetic (fractions), and the kept total by a
scan of K over a fine grid. Hand-worked examples pin the rule; a seeded synthetic pool checks that the salted hash
keeps the planned token shares within binomial noise, and that the same check catches a wrong rate.
"""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synthkd_assets.core.source_mix import (
    GROUP_SOURCES,
    GROUPS,
    SOURCES,
    SourceMixTargets,
    achieved_vs_target,
    exact_cap,
    plan_source_mix,
    source_mix_config,
    source_mix_keep,
)
from synthkd_contract.sources import (
    ANCHOR_CATEGORIES,
    ANCHOR_CATEGORY_SHARES,
    SOURCE_MIX_SALT,
    SOURCE_TOKEN_CAPS,
    SYNTH_SHARE,
)
from synthkd_contract.splits import stable_unit_interval

REL = 1e-9

counts = st.one_of(st.just(0), st.integers(1, 10**9), st.floats(1.0, 1e9))
token_maps = st.dictionaries(st.sampled_from(SOURCES), counts, max_size=len(SOURCES))
shares = st.one_of(st.just(0.0), st.floats(1e-3, 10.0))
targets_st = (
    st.tuples(
        shares,
        st.dictionaries(st.sampled_from(ANCHOR_CATEGORIES), shares),
        st.dictionaries(st.sampled_from(SOURCES), st.floats(1e-3, 1.0)),
    )
    .filter(lambda t: t[0] + sum(t[1].values()) > 0)
    .map(lambda t: SourceMixTargets(*t))
)


def rows_for(tokens: dict) -> dict:
    return {s: math.floor(n / 1000) for s, n in tokens.items()}


def plan_for(tokens: dict, targets: SourceMixTargets) -> dict:
    return plan_source_mix(tokens, rows_for(tokens), targets)


# --- oracles, written without the plan's closed forms ---------------------------------------------------------


def oracle_shares(tokens: dict, targets: SourceMixTargets) -> dict | None:
    """The shares the rule asks for: renormalized over the groups with tokens, each clamped at the most its caps
    allow (the sum of its sources' caps when all of them are capped), the rest in proportion to the targets, found
    by bisection over the level; None when the limits cannot sum to 1 (no mix respects the caps)."""
    weights = {g: targets.group_shares()[g] for g in GROUPS}
    held = {g: [s for s in GROUP_SOURCES[g] if tokens.get(s, 0) > 0] for g in GROUPS}
    feasible = [g for g in GROUPS if weights[g] > 0 and held[g]]
    if not feasible:
        return dict.fromkeys(GROUPS, 0.0)
    caps = targets.source_caps
    limit = {
        g: math.inf if any(s not in caps for s in held[g]) else math.fsum(caps[s] for s in held[g]) for g in feasible
    }
    if math.fsum(limit.values()) < 1:  # (the limits sum as the plan sums them: 0.3 + 0.7 is 1)
        return None
    total = sum(weights[g] for g in feasible)

    def level(x: float) -> float:
        return sum(min(limit[g], x * weights[g] / total) for g in feasible)

    low, high = 0.0, 1.0
    while level(high) < 1 and high < 2.0**100:
        high *= 2
    if level(high) < 1:  # the limits sum to 1 up to rounding: every group at its limit
        return {g: limit.get(g, 0.0) for g in GROUPS}
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if level(middle) < 1 else (low, middle)
    return {g: min(limit[g], high * weights[g] / total) if g in feasible else 0.0 for g in GROUPS}


def capacity(group: str, k: Fraction, tokens: dict, caps: dict) -> Fraction:
    """The most the group can hold at kept total k, exactly: each source its tokens, a capped one at most cap k."""
    held = 0
    for s in GROUP_SOURCES[group]:
        available = Fraction(tokens.get(s, 0))
        held += min(available, Fraction(caps[s]) * k) if s in caps else available
    return held


def fits(k: Fraction, shares: dict, tokens: dict, caps: dict) -> bool:
    """Whether every group can hold its share of k, to 1e-12 relative: a share that is a sum of caps is rounded."""
    slack = 1 - Fraction(1, 10**12)
    return all(capacity(g, k, tokens, caps) >= Fraction(shares[g]) * k * slack for g in GROUPS if shares[g] > 0)


def group_expected(plan: dict, group: str) -> float:
    return plan["groups"][group]["expected_tokens"]


# --- properties ---------------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(tokens=token_maps, targets=targets_st)
def test_rates_are_probabilities_meeting_the_shares_under_the_caps_at_the_largest_total(tokens, targets):
    plan = plan_for(tokens, targets)
    rates, caps, kept = plan["rates"], targets.source_caps, plan["kept_total"]
    assert list(rates) == list(SOURCES) and all(0.0 <= rates[s] <= 1.0 for s in SOURCES)
    wanted = oracle_shares(tokens, targets)
    if wanted is None:  # every group with tokens is capped and the caps sum below 1
        assert kept == 0.0 and all(rate == 0.0 for rate in rates.values()) and not plan["feasible"]
        return
    for g in GROUPS:
        assert math.isclose(plan["targets"]["shares"][g], wanted[g], rel_tol=REL, abs_tol=1e-12), g
    if not any(wanted.values()):
        assert kept == 0.0 and all(rate == 0.0 for rate in rates.values())
        return
    for g in GROUPS:  # the expected mix is the target mix
        assert math.isclose(group_expected(plan, g) / kept, wanted[g], rel_tol=REL, abs_tol=1e-12), g
        assert math.isclose(plan["groups"][g]["expected_share"], wanted[g], rel_tol=REL, abs_tol=1e-12), g
        if wanted[g] == 0:
            assert all(rates[s] == 0.0 for s in GROUP_SOURCES[g])
    for s in SOURCES:
        expected = plan["sources"][s]["expected_tokens"]
        assert expected <= tokens.get(s, 0) and math.isclose(expected, tokens.get(s, 0) * rates[s], rel_tol=REL)
        if s in caps:
            assert expected <= caps[s] * kept * (1 + 1e-12), s  # never above the cap
    # the scarcest group keeps all its caps allow, exactly: rate 1.0 for a source below its cap (x / x, not ~1)
    ceiling = {s: min(1.0, caps[s] * kept / tokens[s]) if s in caps else 1.0 for s in SOURCES if tokens.get(s, 0)}
    assert any(wanted[g] > 0 and all(rates[s] == ceiling[s] for s in GROUP_SOURCES[g] if s in ceiling) for g in GROUPS)
    shares = plan["targets"]["shares"]
    k = Fraction(kept)
    assert fits(k * (1 - Fraction(1, 10**9)), shares, tokens, caps)
    assert not fits(k * (1 + Fraction(1, 10**6)), shares, tokens, caps)  # maximal: 1e-6 more breaks a group


@settings(max_examples=200, deadline=None)
@given(tokens=token_maps, targets=targets_st)
def test_unreachable_targets_are_reported_never_hidden(tokens, targets):
    plan = plan_for(tokens, targets)
    weights = targets.group_shares()
    empty = [g for g in GROUPS if weights[g] > 0 and not any(tokens.get(s, 0) for s in GROUP_SOURCES[g])]
    reported = [entry["group"] for entry in plan["infeasible"]]
    assert reported[: len(empty)] == empty
    for entry in plan["infeasible"][: len(empty)]:
        assert entry["target"] == weights[entry["group"]] and entry["reason"].startswith("no tokens in ")
    for entry in plan["infeasible"][len(empty) :]:  # capped below its share: keeps its capped maximum
        assert entry["reason"].startswith(f"caps hold {entry['group']} to ")
        assert plan["groups"][entry["group"]]["target_share"] == plan["groups"][entry["group"]]["cap"]
    assert plan["feasible"] == (plan["kept_total"] > 0 and not reported)


@settings(max_examples=100, deadline=None)
@given(tokens=token_maps, targets=targets_st, seed=st.integers(0, 2**32 - 1))
def test_the_plans_bytes_do_not_depend_on_the_order_of_the_mappings(tokens, targets, seed):
    rng = random.Random(seed)

    def shuffled(mapping):
        items = list(mapping.items())
        rng.shuffle(items)
        return dict(items)

    again = SourceMixTargets(targets.synth_share, shuffled(targets.category_shares), shuffled(targets.source_caps))
    a = plan_source_mix(tokens, rows_for(tokens), targets)
    b = plan_source_mix(shuffled(tokens), shuffled(rows_for(tokens)), again)
    assert json.dumps(a) == json.dumps(b)
    assert json.loads(json.dumps(a)) == a  # JSON-able as it is


@pytest.mark.parametrize("seed", range(60))
def test_no_total_on_a_fine_grid_beats_the_plans(seed):
    """Small random cases: scan K over a grid of 20,000 steps up to every token; the plan's K is the largest
    feasible grid point to within one step, and the plan's own expected tokens are a witness that K is feasible."""
    rng = random.Random(seed)
    tokens = {s: rng.choice([0, rng.randint(1, 100)]) for s in SOURCES}
    tokens["synth"] = rng.randint(1, 1000)
    caps = {s: rng.choice([0.02, 0.05, 0.1, 0.3, 1.0]) for s in rng.sample(SOURCES, 3)}
    synth_share = rng.choice([0.0, 0.5, 0.8])
    category_shares = {c: rng.choice([0.0, 0.05, 0.1, 0.2]) for c in ANCHOR_CATEGORIES}
    if synth_share == 0 and not any(category_shares.values()):
        synth_share = 1.0
    targets = SourceMixTargets(synth_share, category_shares, caps)
    plan = plan_for(tokens, targets)
    wanted = oracle_shares(tokens, targets)
    total = sum(tokens.values())
    grid = np.linspace(0.0, total, 20_001)
    fine = np.ones_like(grid, dtype=bool)
    for g in GROUPS:
        share = wanted[g] if wanted else 0.0
        if share == 0:
            continue
        held = sum(
            np.minimum(tokens[s], caps[s] * grid) if s in caps else np.full_like(grid, tokens[s])
            for s in GROUP_SOURCES[g]
        )
        fine &= held >= share * grid * (1 - 1e-12)
    best = grid[np.nonzero(fine)[0].max()] if wanted and any(wanted.values()) else 0.0
    step = total / 20_000
    kept = plan["kept_total"]
    assert best - 1e-9 * total <= kept < best + step, (kept, best, step)
    for g in GROUPS:  # the witness: each group holds its share of K, no source above its tokens or its cap
        assert math.isclose(group_expected(plan, g), (wanted[g] if wanted else 0.0) * kept, rel_tol=REL, abs_tol=1e-9)
    for s in SOURCES:
        expected = plan["sources"][s]["expected_tokens"]
        assert expected <= tokens[s] + 1e-9 and (s not in caps or expected <= caps[s] * kept + 1e-9)


# --- hand-worked examples -----------------------------------------------------------------------------------


def test_synth_alone_keeps_everything_and_names_the_empty_anchor_categories():
    plan = plan_source_mix({"synth": 123_457.5}, {"synth": 100}, SourceMixTargets())
    assert plan["rates"]["synth"] == 1.0 and plan["kept_total"] == 123_457.5
    assert all(plan["rates"][s] == 0.0 for s in SOURCES if s != "synth")
    assert plan["targets"]["shares"] == {"synth": 1.0, "math": 0.0, "code": 0.0, "chat": 0.0, "personality": 0.0}
    # infeasible only because the anchor categories have shares > 0 and no tokens: each one is named
    assert not plan["feasible"]
    assert [e["group"] for e in plan["infeasible"]] == ["math", "code", "chat", "personality"]
    assert plan["infeasible"][1] == {
        "group": "code",
        "target": 0.06,
        "reason": "no tokens in category code (sources opencodeinstruct, deepcoder): its target share cannot be met",
    }
    assert "no source yet in synthkd_contract/sources.py CATEGORY_SOURCES" in plan["infeasible"][3]["reason"]
    # without anchor shares the same input meets every target
    plan = plan_source_mix({"synth": 123_457.5}, {"synth": 100}, SourceMixTargets(category_shares={}))
    assert plan["rates"]["synth"] == 1.0 and plan["feasible"] and plan["infeasible"] == []
    assert plan["groups"]["synth"]["expected_rows"] == 100.0


def test_every_group_present_meets_its_share_exactly():
    """Shares 0.8 / 0.1 / 0.06 / 0.04 (personality 0); capacities tokens / share: synth 10000, math 16000,
    code 5000, chat 2500, so K = 2500: chat whole, the others at K * share / tokens."""
    targets = SourceMixTargets(0.8, {"math": 0.1, "code": 0.06, "chat": 0.04})
    tokens = {"synth": 8000, "nemotron_math_v2": 1000, "hendrycks_math": 600, "opencodeinstruct": 300, "oasst1": 100}
    plan = plan_source_mix(tokens, {s: n // 10 for s, n in tokens.items()}, targets)
    assert plan["feasible"] and plan["kept_total"] == pytest.approx(2500)
    rates = plan["rates"]
    assert rates["oasst1"] == 1.0 and rates["synth"] == pytest.approx(0.25) and rates["opencodeinstruct"] == 0.5
    assert rates["nemotron_math_v2"] == rates["hendrycks_math"] == pytest.approx(250 / 1600)
    expected = {g: plan["groups"][g]["expected_tokens"] for g in GROUPS}
    assert expected == pytest.approx({"synth": 2000, "math": 250, "code": 150, "chat": 100, "personality": 0})
    assert plan["groups"]["math"]["expected_rows"] == pytest.approx(160 * 250 / 1600)
    assert "chat kept whole (the scarcest relative to its share); the others downsampled" == plan["notes"][0]


def test_the_deepcoder_cap_binds_and_the_rest_of_code_fills_the_share():
    targets = SourceMixTargets(0.8, {"code": 0.2})  # default cap: deepcoder <= 0.5% of the kept tokens
    # code binds: 19500 + 0.005 K >= 0.2 K up to K = 100000; deepcoder holds 500 of its 1000 tokens
    plan = plan_for({"synth": 100_000, "opencodeinstruct": 19_500, "deepcoder": 1000}, targets)
    assert plan["kept_total"] == pytest.approx(100_000) and plan["feasible"]
    assert plan["rates"]["opencodeinstruct"] == 1.0 and plan["rates"]["deepcoder"] == pytest.approx(0.5)
    assert plan["rates"]["synth"] == pytest.approx(0.8)
    assert plan["sources"]["deepcoder"]["expected_tokens"] == pytest.approx(500)
    assert "deepcoder held to its cap, 0.005 of the kept tokens (rate 0.5)" in plan["notes"]
    # synth binds (K = 125000): code's 25000 at one rate would give deepcoder 12500 > its cap 625, so deepcoder
    # is clamped at 625 / 100000 and opencodeinstruct takes the excess: (25000 - 625) / 100000
    plan = plan_for({"synth": 100_000, "opencodeinstruct": 100_000, "deepcoder": 100_000}, targets)
    assert plan["kept_total"] == pytest.approx(125_000) and plan["rates"]["synth"] == 1.0
    assert plan["rates"]["deepcoder"] == pytest.approx(0.00625)
    assert plan["rates"]["opencodeinstruct"] == pytest.approx(0.24375)
    # deepcoder below its cap (it saturates at K = 1 / 0.005 = 200): code keeps both whole, K = 101 / 0.06
    plan = plan_for(
        {"synth": 1_000_000, "opencodeinstruct": 100, "deepcoder": 1}, SourceMixTargets(0.94, {"code": 0.06})
    )
    assert plan["kept_total"] == pytest.approx(101 / 0.06) and plan["rates"]["deepcoder"] == 1.0
    assert plan["rates"]["opencodeinstruct"] == 1.0 and not any("held to its cap" in note for note in plan["notes"])
    # deepcoder alone in code: capped below the share, code keeps its capped maximum 0.005 (reported), synth 0.995
    plan = plan_for({"synth": 1_000_000, "deepcoder": 1000}, targets)
    assert not plan["feasible"] and [e["group"] for e in plan["infeasible"]] == ["code"]
    assert plan["infeasible"][0]["reason"].startswith("caps hold code to 0.005 of the kept tokens (deepcoder 0.005)")
    assert plan["targets"]["shares"]["code"] == 0.005 and plan["targets"]["shares"]["synth"] == pytest.approx(0.995)
    assert plan["kept_total"] == pytest.approx(200_000) and plan["rates"]["deepcoder"] == 1.0
    assert plan["rates"]["synth"] == pytest.approx(0.199)
    # deepcoder alone in the whole input: any kept token breaks its cap, so nothing is kept
    plan = plan_for({"deepcoder": 1000}, targets)
    assert plan["kept_total"] == 0.0 and plan["rates"]["deepcoder"] == 0.0 and not plan["feasible"]
    assert any("no mix respects them" in note for note in plan["notes"])


@settings(max_examples=200)
@given(st.lists(st.integers(0, 3000), min_size=0, max_size=60), st.floats(0, 60_000, allow_nan=False))
def test_an_exact_cap_keeps_the_longest_hash_ordered_prefix_within_the_planned_tokens(lengths, planned):
    """Oracle: the rule itself (source_mix_keep at the returned rate) over every row, against a brute-force walk."""
    rows = [(f"deepcoder:{i}", n) for i, n in enumerate(lengths)]
    rate, kept_tokens, kept_rows = exact_cap(rows, planned)
    kept = [(sid, n) for sid, n in rows if source_mix_keep(sid, "deepcoder", {"deepcoder": rate})]
    assert (sum(n for _, n in kept), len(kept)) == (kept_tokens, kept_rows)
    assert kept_tokens <= planned
    order = sorted(rows, key=lambda row: stable_unit_interval(SOURCE_MIX_SALT, row[0]))
    assert sorted(kept) == sorted(order[: len(kept)])  # a prefix in hash order
    if len(kept) < len(rows):  # and the longest: the next row would go past the planned tokens
        assert kept_tokens + order[len(kept)][1] > planned


def test_a_capped_source_given_its_rows_is_capped_exactly_not_in_expectation():
    """A small source of long rows: its rate alone holds it to its cap on average, and one draw of the hash went 4%
    over it on the bundled sample. Given its rows, the plan keeps at most cap * K of them, and says how many."""
    rng = random.Random(7)
    deepcoder = [(f"deepcoder:{i}", rng.randint(20, 300)) for i in range(40)]
    tokens = {"synth": 100_000, "opencodeinstruct": 100_000, "deepcoder": sum(n for _, n in deepcoder)}
    targets = SourceMixTargets(0.8, {"code": 0.2})
    expected_only = plan_for(tokens, targets)
    plan = plan_source_mix(tokens, {s: 10 for s in tokens}, targets, {"deepcoder": deepcoder})
    budget = plan["targets"]["source_caps"]["deepcoder"] * plan["kept_total"]
    kept = sum(n for sid, n in deepcoder if source_mix_keep(sid, "deepcoder", plan["rates"]))
    assert kept == plan["sources"]["deepcoder"]["expected_tokens"] <= budget
    assert kept > budget - 300  # the longest prefix: within one row of the cap
    assert plan["kept_total"] == expected_only["kept_total"]
    # what the prefix leaves of code's share goes to opencodeinstruct: the group still meets its share
    assert plan["rates"]["opencodeinstruct"] > expected_only["rates"]["opencodeinstruct"]
    assert plan["groups"]["code"]["expected_tokens"] == pytest.approx(0.2 * plan["kept_total"], rel=REL)
    assert f"deepcoder capped exactly: {kept} tokens, the first rows in hash order" in plan["notes"]
    # over many salts of the same lengths, the rate alone goes over the cap; the exact cap never does
    over = 0
    for trial in range(200):
        rows = [(f"deepcoder:{trial}:{i}", n) for i, (_, n) in enumerate(deepcoder)]
        by_rate = sum(n for sid, n in rows if source_mix_keep(sid, "deepcoder", expected_only["rates"]))
        over += by_rate > budget
        exact = plan_source_mix(tokens, {s: 10 for s in tokens}, targets, {"deepcoder": rows})
        assert sum(n for sid, n in rows if source_mix_keep(sid, "deepcoder", exact["rates"])) <= budget
    assert over > 20


def test_a_missing_category_renormalizes_the_others():
    targets = SourceMixTargets(0.8, {"math": 0.1, "chat": 0.1})
    plan = plan_for({"synth": 1600, "competition_math": 100}, targets)
    assert [e["group"] for e in plan["infeasible"]] == ["chat"] and not plan["feasible"]
    assert plan["targets"]["shares"]["synth"] == pytest.approx(8 / 9)
    assert plan["targets"]["shares"]["math"] == pytest.approx(1 / 9) and plan["targets"]["shares"]["chat"] == 0.0
    # capacities 1600 / (8/9) = 1800 and 100 / (1/9) = 900: math whole, synth at 800 / 1600
    assert plan["rates"]["competition_math"] == 1.0 and plan["rates"]["synth"] == pytest.approx(0.5)


def test_a_group_with_target_zero_is_dropped_and_noted():
    targets = SourceMixTargets(0.5, {"chat": 0.0, "math": 0.5})
    plan = plan_for({"synth": 100, "ultrachat_200k": 500, "oasst1": 5, "hendrycks_math": 50}, targets)
    assert plan["rates"]["ultrachat_200k"] == plan["rates"]["oasst1"] == 0.0 and plan["feasible"]
    assert plan["rates"]["hendrycks_math"] == 1.0 and plan["rates"]["synth"] == 0.5
    assert "target 0: chat not kept (rate 0)" in plan["notes"]


def test_nothing_to_keep_is_infeasible():
    plan = plan_source_mix({}, {}, SourceMixTargets())
    assert not plan["feasible"] and [e["group"] for e in plan["infeasible"]] == list(GROUPS)
    assert plan["kept_total"] == 0.0 and all(rate == 0.0 for rate in plan["rates"].values())
    assert "no group with a target share holds tokens: nothing is kept" in plan["notes"]


# --- keeping rows -------------------------------------------------------------------------------------------


def synthetic_rows(n: int, seed: int) -> list[tuple[str, str, int]]:
    """(synth_id, source, tokens) rows: mostly SYNTH, every anchor source but one, skewed (log-normal) lengths."""
    rng = random.Random(seed)
    weights = {s: 1.0 for s in SOURCES if s != "anthropic_helpfulness"}
    weights.update(synth=40.0, opencodeinstruct=2.0, deepcoder=3.0)
    names, odds = list(weights), list(weights.values())
    rows = []
    for i in range(n):
        source = rng.choices(names, odds)[0]
        rows.append((f"{source}:{seed}_{i}", source, max(1, int(rng.lognormvariate(6.0, 1.0)))))
    return rows


def share_z_scores(rows: list, rates: dict, plan: dict, by: str) -> dict[str, float]:
    """Per group or per source (`by`), (achieved token share - planned share) / its standard deviation, kept by
    `rates` and judged against `plan`. The share's error is, to first order, sum_i (1[i in u] - share_u) len_i
    (kept_i - p_i) / K, so its variance is the row-level sum_i p_i (1 - p_i) len_i^2 (1[i in u] - share_u)^2 / K^2."""
    planned = {u: entry["target_share"] for u, entry in plan[by].items()}
    kept = dict.fromkeys(planned, 0)
    variance = dict.fromkeys(planned, 0.0)
    for synth_id, source, length in rows:
        unit = plan["sources"][source]["group"] if by == "groups" else source
        p = plan["rates"][source]
        if source_mix_keep(synth_id, source, rates):
            kept[unit] += length
        for u in planned:
            variance[u] += p * (1 - p) * length**2 * ((unit == u) - planned[u]) ** 2
    total = sum(kept.values())
    sd = {u: math.sqrt(variance[u]) / plan["kept_total"] for u in planned}
    return {u: (kept[u] / total - planned[u]) / sd[u] for u in planned if sd[u] > 0}


def test_source_mix_keep_holds_the_planned_token_shares_within_binomial_noise():
    rows = synthetic_rows(20_000, seed=11)
    tokens, counts = {}, {}
    for _, source, length in rows:
        tokens[source] = tokens.get(source, 0) + length
        counts[source] = counts.get(source, 0) + 1
    plan = plan_source_mix(tokens, counts, SourceMixTargets())
    assert [e["group"] for e in plan["infeasible"]] == ["personality"]  # the others have tokens
    assert 0 < plan["rates"]["deepcoder"] < plan["rates"]["opencodeinstruct"]  # the cap binds
    kept = [(s, n) for synth_id, s, n in rows if source_mix_keep(synth_id, s, plan["rates"])]
    again = [(s, n) for synth_id, s, n in reversed(rows) if source_mix_keep(synth_id, s, plan["rates"])]
    assert sorted(kept) == sorted(again)  # the decision is the row's own, whatever the order
    z = share_z_scores(rows, plan["rates"], plan, "groups")
    assert set(z) == {"synth", "math", "code", "chat"} and max(map(abs, z.values())) < 4, z
    z = share_z_scores(rows, plan["rates"], plan, "sources")
    assert "deepcoder" in z and max(map(abs, z.values())) < 4, z
    report = achieved_vs_target(plan, {s: sum(n for t, n in kept if t == s) for s in tokens})
    assert report["achieved_total"] == sum(n for _, n in kept)
    assert report["groups"]["code"]["target_share"] == plan["targets"]["shares"]["code"]
    # the same checks catch a wrong rate: code kept at 85% of its planned rates, or deepcoder's cap ignored
    # (kept at opencodeinstruct's rate, the group's common one)
    wrong = {s: r * 0.85 if s in GROUP_SOURCES["code"] else r for s, r in plan["rates"].items()}
    assert abs(share_z_scores(rows, wrong, plan, "groups")["code"]) > 4
    wrong = {**plan["rates"], "deepcoder": plan["rates"]["opencodeinstruct"]}
    assert abs(share_z_scores(rows, wrong, plan, "sources")["deepcoder"]) > 4


def test_source_mix_keep_rates_zero_and_one_are_exact():
    rates = {s: 1.0 if s == "synth" else 0.0 for s in SOURCES}
    ids = [f"id{i}" for i in range(2000)]
    assert all(source_mix_keep(i, "synth", rates) for i in ids)
    assert not any(source_mix_keep(i, "oasst1", rates) for i in ids)


def test_achieved_vs_target_reports_every_source_and_group():
    plan = plan_for({"synth": 8000, "oasst1": 1000}, SourceMixTargets(0.8, {"chat": 0.2}))
    report = achieved_vs_target(plan, {"synth": 7000, "oasst1": 3000})
    assert report["achieved_total"] == 10_000.0 and list(report["sources"]) == list(SOURCES)
    assert report["groups"]["chat"] == {
        "target_share": 0.2,
        "expected_share": pytest.approx(0.2),
        "achieved_tokens": 3000.0,
        "achieved_share": 0.3,
    }
    assert (
        report["sources"]["synth"]["achieved_share"] == 0.7 and report["sources"]["deepcoder"]["achieved_tokens"] == 0
    )
    assert json.loads(json.dumps(report)) == report
    with pytest.raises(ValueError, match=r"achieved_tokens: \['nope'\] are not 'synth' or a source"):
        achieved_vs_target(plan, {"nope": 1})


# --- settings -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"synth_share": -0.1}, "synth_share = -0.1 is not a finite number >= 0"),
        ({"synth_share": math.nan}, "synth_share = nan is not a finite number >= 0"),
        ({"synth_share": True}, "synth_share = True is not a finite number >= 0"),
        ({"category_shares": {"poetry": 0.1}}, "anchor_shares (category_shares) names ['poetry'], not categories of "),
        (
            {"category_shares": {"math": math.inf}},
            "anchor_shares (category_shares)['math'] = inf is not a finite number >= 0",
        ),
        (
            {"category_shares": {"code": "0.1"}},
            "anchor_shares (category_shares)['code'] = '0.1' is not a finite number >= 0",
        ),
        ({"source_caps": {"gsm8k": 0.1}}, "source_caps names ['gsm8k'], not 'synth' or a source of "),
        ({"source_caps": {"deepcoder": 0.0}}, "source_caps['deepcoder'] = 0.0 is not a number in (0, 1]"),
        ({"source_caps": {"oasst1": 1.5}}, "source_caps['oasst1'] = 1.5 is not a number in (0, 1]"),
        ({"synth_share": 0, "category_shares": {"math": 0.0}}, "synth_share and category_shares sum to 0"),
    ],
)
def test_invalid_targets_are_refused_naming_the_problem(kwargs, problem):
    with pytest.raises(ValueError, match="invalid source mix targets: ") as caught:
        SourceMixTargets(**kwargs)
    assert problem in str(caught.value)


def test_targets_copy_their_tables_and_record_them():
    shares, caps = {"code": 1, "math": 3}, {"deepcoder": 0.01}
    targets = SourceMixTargets(2, shares, caps)
    shares["chat"], caps["oasst1"] = 5.0, 0.5
    assert targets.to_dict() == {
        "synth_share": 2.0,
        "category_shares": {"math": 3.0, "code": 1.0},
        "source_caps": {"deepcoder": 0.01},
    }
    with pytest.raises(TypeError):
        targets.category_shares["chat"] = 1.0  # read-only
    assert SourceMixTargets().to_dict() == {
        "synth_share": SYNTH_SHARE,
        "category_shares": ANCHOR_CATEGORY_SHARES,
        "source_caps": SOURCE_TOKEN_CAPS,
    }
    config = source_mix_config(targets)
    assert config["salt"] == SOURCE_MIX_SALT and config["targets"] == targets.to_dict()
    assert json.loads(json.dumps(config)) == config


@pytest.mark.parametrize(
    ("tokens", "problem"),
    [
        ({"gsm8k": 1, "synth": 2}, r"tokens: \['gsm8k'\] are not 'synth' or a source of synthkd_contract/sources.py"),
        ({"synth": -1}, r"tokens: not a finite count >= 0: 'synth': -1"),
        ({"oasst1": math.inf}, r"tokens: not a finite count >= 0: 'oasst1': inf"),
        ({"oasst1": True}, r"tokens: not a finite count >= 0: 'oasst1': True"),
    ],
)
def test_counts_that_are_not_tokens_per_known_source_are_refused(tokens, problem):
    with pytest.raises(ValueError, match=problem):
        plan_source_mix(tokens, {}, SourceMixTargets())
    with pytest.raises(ValueError, match=problem.replace("tokens", "rows", 1)):
        plan_source_mix({}, tokens, SourceMixTargets())
