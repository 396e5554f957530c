"""The B x C quota grid on tokens (core/quota.py): reachable targets are met, unreachable ones reported.

The plan's closed form (K = min T_b / t_b) is checked against a brute-force oracle written without it: a
bisection over the kept total K whose feasibility test fills each bucket's target cell by cell, each cell
keeping at most what it holds (no oversampling). Hypothesis draws the token grids and mixes; a seeded
synthetic pool checks that the salted hash keeps the planned token shares.
"""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synthkd_assets.core.quota import QuotaTargets, keeps_nothing_reason, plan_quota_grid, quota_config, quota_keep
from synthkd_contract.buckets import CTX_BUCKETS, QUOTA_SALT, SKILL_BUCKETS, SKILL_MIX, ctx_bucket

CELLS = [(b, c) for b in SKILL_BUCKETS for c in CTX_BUCKETS]
REL = 1e-9

counts = st.one_of(st.just(0), st.integers(1, 10**9))
grids = st.dictionaries(st.sampled_from(CELLS), counts, max_size=len(CELLS))
mixes = st.dictionaries(
    st.sampled_from(SKILL_BUCKETS), st.one_of(st.just(0.0), st.floats(1e-3, 10.0)), min_size=1
).filter(lambda mix: sum(mix.values()) > 0)


def rows_for(tokens: dict) -> dict:
    return {cell: n // 1000 for cell, n in tokens.items()}


def oracle_kept_total(tokens: dict, mix: dict) -> float:
    """The largest kept total K (bisection to 1e-12 relative) for which every bucket with a share can be
    filled to K * share from its cells, each cell giving at most its tokens; 0 when no bucket can."""
    held = {b: [tokens.get((b, c), 0) for c in CTX_BUCKETS] for b in SKILL_BUCKETS}
    wanted = [b for b in SKILL_BUCKETS if mix.get(b, 0) > 0 and sum(held[b]) > 0]
    if not wanted:
        return 0.0
    total = sum(mix[b] for b in wanted)

    def fits(k: float) -> bool:
        for b in wanted:
            need = k * mix[b] / total
            for cell_tokens in held[b]:
                need -= min(need, cell_tokens)
            if need > 0:
                return False
        return True

    low, high = 0.0, float(sum(sum(v) for v in held.values()))
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
        if high - low <= 1e-12 * high:
            break
    return low


def kept_total(plan: dict) -> float:
    return math.fsum(plan["skill_tokens"]["expected"].values())


@settings(max_examples=300)
@given(tokens=grids, mix=mixes)
def test_rates_are_probabilities_shared_by_a_buckets_cells_and_meet_the_renormalized_targets(tokens, mix):
    plan = plan_quota_grid(tokens, rows_for(tokens), QuotaTargets(mix))
    rates = plan["rates"]
    assert set(rates) == set(SKILL_BUCKETS) and all(set(rates[b]) == set(CTX_BUCKETS) for b in SKILL_BUCKETS)
    for b in SKILL_BUCKETS:
        assert len(set(rates[b].values())) == 1 and 0.0 <= rates[b]["C1"] <= 1.0
    available = {b: sum(tokens.get((b, c), 0) for c in CTX_BUCKETS) for b in SKILL_BUCKETS}
    feasible = [b for b in SKILL_BUCKETS if mix.get(b, 0) > 0 and available[b] > 0]
    shares = plan["skill_tokens"]["target_share"]
    for b in SKILL_BUCKETS:
        share = mix[b] / sum(mix[f] for f in feasible) if b in feasible else 0.0
        assert math.isclose(shares[b], share, rel_tol=REL)
        assert math.isclose(plan["skill_tokens"]["expected_share"][b], share, rel_tol=1e-7, abs_tol=1e-12)
        if b not in feasible:
            assert rates[b]["C1"] == 0.0
    if feasible:  # the scarcest bucket relative to its target keeps everything
        assert max(rates[b]["C1"] for b in feasible) == 1.0
    for b, c in CELLS:
        expected = plan["expected"]["tokens"][b][c]
        assert expected <= plan["available"]["tokens"][b][c]  # never more than a cell holds
        assert math.isclose(expected, tokens.get((b, c), 0) * rates[b][c], rel_tol=REL)


@settings(max_examples=300)
@given(tokens=grids, mix=mixes)
def test_no_larger_kept_total_exists_than_the_plans(tokens, mix):
    plan = plan_quota_grid(tokens, rows_for(tokens), QuotaTargets(mix))
    oracle = oracle_kept_total(tokens, mix)
    assert math.isclose(kept_total(plan), oracle, rel_tol=1e-8, abs_tol=1e-6), (kept_total(plan), oracle)


@settings(max_examples=200)
@given(tokens=grids, mix=mixes)
def test_unreachable_targets_are_reported_never_hidden(tokens, mix):
    plan = plan_quota_grid(tokens, rows_for(tokens), QuotaTargets(mix))
    empty_with_target = [
        b for b in SKILL_BUCKETS if mix.get(b, 0) > 0 and not any(tokens.get((b, c), 0) for c in CTX_BUCKETS)
    ]
    assert [entry["bucket"] for entry in plan["infeasible"]] == empty_with_target
    for entry in plan["infeasible"]:
        assert entry["target"] == mix[entry["bucket"]] and "no tokens in " + entry["bucket"] in entry["reason"]
    reachable = any(mix.get(b, 0) > 0 and tokens.get((b, c), 0) for b, c in CELLS)
    assert plan["feasible"] == (reachable and not empty_with_target)
    # refused (not merely infeasible) exactly when the data holds tokens and the mix keeps none of them
    holds_tokens = any(tokens.get(cell, 0) for cell in CELLS)
    assert (keeps_nothing_reason(plan) is not None) == (holds_tokens and not reachable)


def test_a_worked_example_and_the_default_mix_on_a_grid_without_code():
    """B3 (code) is empty in SYNTH: reported; the others renormalize to 0.5 / 0.175 / 0.15 over 0.825."""
    tokens = {("B1", "C1"): 1000, ("B1", "C2"): 1000, ("B2", "C1"): 175, ("B3", "C3"): 175, ("B4", "C1"): 300}
    plan = plan_quota_grid(tokens, rows_for(tokens), QuotaTargets())
    # capacities (tokens / share) 4000, 1000, 1000, 2000: K = 1000
    assert plan["rates"]["B1"] == {c: pytest.approx(0.25) for c in CTX_BUCKETS}
    assert plan["rates"]["B2"]["C1"] == plan["rates"]["B3"]["C3"] == 1.0 and plan["rates"]["B4"]["C4"] == pytest.approx(
        0.5
    )
    expected = {"B1": 500.0, "B2": 175.0, "B3": 175.0, "B4": 150.0}
    assert plan["feasible"] and plan["skill_tokens"]["expected"] == pytest.approx(expected)

    del tokens["B3", "C3"]
    plan = plan_quota_grid(tokens, rows_for(tokens), QuotaTargets())
    assert not plan["feasible"]
    assert plan["infeasible"] == [
        {"bucket": "B3", "target": 0.175, "reason": "no tokens in B3 (Code / algorithmic reasoning): its target "
         "share cannot be met"}
    ]  # fmt: skip
    assert plan["targets"]["shares"]["B3"] == 0.0
    assert math.isclose(plan["targets"]["shares"]["B1"], 0.5 / 0.825)
    assert plan["rates"]["B2"]["C1"] == 1.0  # 175 / (0.175 / 0.825) = 825 is the smallest capacity


def test_a_bucket_with_target_zero_is_dropped_and_noted():
    tokens = {("B1", "C1"): 100, ("B4", "C1"): 100}
    plan = plan_quota_grid(tokens, rows_for(tokens), QuotaTargets({"B1": 1.0, "B4": 0.0}))
    assert plan["rates"]["B4"]["C1"] == 0.0 and plan["rates"]["B1"]["C1"] == 1.0 and plan["feasible"]
    assert "target 0: B4 not kept (rate 0)" in plan["notes"]


def test_a_mix_that_keeps_nothing_of_data_with_tokens_is_named():
    """Shares only for empty buckets keep nothing of a grid that holds tokens: a setting to refuse (an empty
    input, or a mix that keeps something, is not one)."""
    tokens = {("B1", "C1"): 100, ("B4", "C2"): 50}
    plan = plan_quota_grid(tokens, rows_for(tokens), QuotaTargets({"B3": 1.0, "B2": 0.5, "B1": 0.0}))
    assert keeps_nothing_reason(plan) == (
        "skill_mix {'B1': 0.0, 'B2': 0.5, 'B3': 1.0} keeps nothing: the buckets it gives a share (B2, B3) hold no "
        "tokens, while B1, B4 do (skill_mix is SYNTH's: anchor sources' tokens come on top, by their category)"
    )
    assert keeps_nothing_reason(plan_quota_grid(tokens, rows_for(tokens), QuotaTargets({"B3": 1.0, "B4": 0.1}))) is None
    assert keeps_nothing_reason(plan_quota_grid({}, {}, QuotaTargets({"B3": 1.0}))) is None
    assert keeps_nothing_reason(plan_quota_grid(tokens, rows_for(tokens), QuotaTargets({"B3": 1.0}, True))) is None


def test_nothing_to_keep_is_infeasible():
    plan = plan_quota_grid({}, {}, QuotaTargets())
    assert not plan["feasible"] and [e["bucket"] for e in plan["infeasible"]] == list(SKILL_BUCKETS)
    assert all(plan["rates"][b][c] == 0.0 for b, c in CELLS) and kept_total(plan) == 0


@settings(max_examples=100)
@given(tokens=grids, mix=mixes, balance=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_the_plans_bytes_do_not_depend_on_the_order_of_the_counts(tokens, mix, balance, seed):
    rows = rows_for(tokens)
    shuffled = list(tokens.items())
    random.Random(seed).shuffle(shuffled)
    mix_shuffled = list(mix.items())
    random.Random(seed + 1).shuffle(mix_shuffled)
    a = plan_quota_grid(tokens, rows, QuotaTargets(mix, balance))
    b = plan_quota_grid(dict(shuffled), dict(reversed(list(rows.items()))), QuotaTargets(dict(mix_shuffled), balance))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert json.loads(json.dumps(a)) == a  # JSON-able as it is


# --- balance_tokens (004) ---------------------------------------------------------------------------


@settings(max_examples=300)
@given(tokens=grids, mix=mixes)
def test_balance_truncates_every_bucket_to_the_smallest_and_never_oversamples(tokens, mix):
    plan = plan_quota_grid(tokens, rows_for(tokens), QuotaTargets(mix, balance_tokens=True))
    available = {b: sum(tokens.get((b, c), 0) for c in CTX_BUCKETS) for b in SKILL_BUCKETS}
    held = [b for b in SKILL_BUCKETS if available[b] > 0]
    assert plan["infeasible"] == [] and plan["feasible"] == bool(held)
    for b in SKILL_BUCKETS:
        rate = plan["rates"][b]["C1"]
        assert 0.0 <= rate <= 1.0
        expected = plan["skill_tokens"]["expected"][b]
        if b in held:
            smallest = min(available[h] for h in held)
            assert math.isclose(expected, smallest, rel_tol=REL)
            assert expected <= available[b] and (rate == 1.0 or available[b] > smallest)
        else:
            assert expected == 0.0
    assert plan["targets"]["shares"] == {b: (1 / len(held) if b in held else 0.0) for b in SKILL_BUCKETS}


def test_balance_over_an_empty_bucket_says_so():
    tokens = {("B1", "C1"): 900, ("B2", "C2"): 300, ("B4", "C1"): 600}
    plan = plan_quota_grid(tokens, rows_for(tokens), QuotaTargets(balance_tokens=True))
    assert plan["rates"]["B1"]["C1"] == pytest.approx(1 / 3) and plan["rates"]["B2"]["C2"] == 1.0
    assert plan["rates"]["B4"]["C1"] == 0.5 and plan["feasible"]
    assert "balance_tokens: B3 hold no tokens; balanced over the others" in plan["notes"]


# --- keeping rows ------------------------------------------------------------------------------------


def synthetic_pool(n: int, seed: int) -> list[tuple[str, str, str, int]]:
    """(synth_id, skill, ctx, tokens) rows: skills drawn unevenly, lengths across C1/C2."""
    rng = random.Random(seed)
    pool = []
    for i in range(n):
        skill = rng.choices(SKILL_BUCKETS, weights=(6, 1, 1.5, 3))[0]
        length = rng.randint(200, 4000)
        pool.append((f"synth_{seed}_{i}", skill, ctx_bucket(length), length))
    return pool


def test_quota_keep_is_deterministic_and_keeps_the_planned_token_shares():
    pool = synthetic_pool(40_000, seed=7)
    tokens, rows = {}, {}
    for _, skill, ctx, length in pool:
        tokens[skill, ctx] = tokens.get((skill, ctx), 0) + length
        rows[skill, ctx] = rows.get((skill, ctx), 0) + 1
    plan = plan_quota_grid(tokens, rows, QuotaTargets())
    assert plan["feasible"]
    kept = [(s, c, n) for synth_id, s, c, n in pool if quota_keep(synth_id, s, c, plan["rates"])]
    again = [(s, c, n) for synth_id, s, c, n in reversed(pool) if quota_keep(synth_id, s, c, plan["rates"])]
    assert sorted(kept) == sorted(again)  # the decision is the row's own, whatever the order
    kept_tokens = {b: sum(n for s, _, n in kept if s == b) for b in SKILL_BUCKETS}
    total = sum(kept_tokens.values())
    for b in SKILL_BUCKETS:  # a few thousand rows per bucket: within 2 points of the target share
        assert abs(kept_tokens[b] / total - SKILL_MIX[b]) < 0.02, (b, kept_tokens[b] / total)
    assert abs(total - kept_total(plan)) < 0.03 * kept_total(plan)


def test_quota_keep_rates_zero_and_one_are_exact():
    rates = {b: {c: 1.0 if b == "B1" else 0.0 for c in CTX_BUCKETS} for b in SKILL_BUCKETS}
    ids = [f"id{i}" for i in range(2000)]
    assert all(quota_keep(i, "B1", "C3", rates) for i in ids)
    assert not any(quota_keep(i, "B2", "C1", rates) for i in ids)


# --- settings ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mix", "balance", "problem"),
    [
        ({"B5": 1.0}, False, "skill_mix names ['B5'], not skill buckets"),
        ({"B1": -0.5, "B2": 1.0}, False, "skill_mix['B1'] = -0.5 is not a finite number >= 0"),
        ({"B1": math.nan}, False, "skill_mix['B1'] = nan is not a finite number >= 0"),
        ({"B1": math.inf}, False, "skill_mix['B1'] = inf is not a finite number >= 0"),
        ({"B1": "0.5"}, False, "skill_mix['B1'] = '0.5' is not a finite number >= 0"),
        ({"B1": 0.0, "B2": 0}, False, "skill_mix shares sum to 0"),
        ({"B1": 1.0}, "yes", "balance_tokens 'yes' is not a bool"),
    ],
)
def test_invalid_targets_are_refused_naming_the_problem(mix, balance, problem):
    with pytest.raises(ValueError, match="invalid quota targets: ") as caught:
        QuotaTargets(mix, balance)
    assert problem in str(caught.value)


def test_targets_copy_the_mix_and_record_it():
    mix = {"B4": 1, "B1": 3}
    targets = QuotaTargets(mix)
    mix["B2"] = 5.0
    assert targets.to_dict() == {"skill_mix": {"B1": 3.0, "B4": 1.0}, "balance_tokens": False}
    assert QuotaTargets().to_dict()["skill_mix"] == SKILL_MIX
    config = quota_config(targets)
    assert config["salt"] == QUOTA_SALT and config["targets"] == targets.to_dict()
    assert json.loads(json.dumps(config)) == config


@pytest.mark.parametrize(
    "grid",
    [{("B9", "C1"): 1}, {("B1", "C7"): 1}, {("B1", "C1"): -1}, {("B1", "C1"): 1.5}, {("B1", "C1"): True}],
)
def test_a_grid_that_is_not_counts_per_cell_is_refused(grid):
    with pytest.raises(ValueError, match="grid: not a count >= 0 of a"):
        plan_quota_grid(grid, {}, QuotaTargets())
