"""bucket_balance says whether an unbalanced pool is what its quota plan means (no action) or not (action)."""

from __future__ import annotations

import pytest

from synthkd_assets.core.quota import bucket_balance, planned_bucket_tokens

LIMIT = 1.5
INFEASIBLE = [{"bucket": "B3", "reason": "no tokens in B3"}]


def test_balanced_buckets_pass():
    verdict = bucket_balance({"B1": 100, "B2": 80}, {"B1": 100, "B2": 80}, [], LIMIT)
    assert verdict.balanced and verdict.sentence.startswith("balanced: B1 holds 1.25x")


def test_an_imbalance_the_targets_mean_is_expected_and_an_unfillable_bucket_is_named():
    verdict = bucket_balance({"B1": 330, "B2": 100, "B3": 0}, {"B1": 300, "B2": 100, "B3": 0}, INFEASIBLE, LIMIT)
    assert not verdict.balanced and verdict.planned
    assert verdict.sentence.startswith("expected, no action needed: B1 holds 3.30x the tokens of the smallest bucket")
    assert "expects 3.00x" in verdict.sentence
    assert verdict.sentence.endswith("; B3 empty: a target the corpus cannot meet (no tokens in B3)")


@pytest.mark.parametrize(
    "achieved, expected",
    [
        ({"B1": 500, "B2": 100}, {"B1": 300, "B2": 100}),  # 5x where the plan expects 3x
        ({"B1": 100, "B2": 100, "B4": 0}, {"B1": 100, "B2": 100, "B4": 50}),  # a bucket the plan fills is empty
    ],
)
def test_an_imbalance_the_plan_does_not_mean_needs_action(achieved, expected):
    verdict = bucket_balance(achieved, expected, [], LIMIT)
    assert not verdict.planned
    if not verdict.balanced:
        assert verdict.sentence.startswith("needs action: ") and "./scripts/build.sh" in verdict.sentence
    else:  # balanced on the buckets that hold tokens, but one the plan fills is empty: said, not planned
        assert verdict.sentence.endswith("; B4 empty: not planned so")


def test_an_empty_pool_needs_action():
    verdict = bucket_balance({"B1": 0}, {"B1": 10}, [], LIMIT)
    assert not verdict.balanced and not verdict.planned and verdict.sentence.startswith("needs action")


def test_the_plan_includes_the_anchor_sources_tokens():
    expected = {"B1": {"C1": 100.0, "C2": 50.0}, "B2": {"C1": 10.0}}
    anchors = [{"B2": {"C1": 40}}, {"B3": {"C2": 7}}]
    assert planned_bucket_tokens(expected, anchors) == {"B1": 150.0, "B2": 50.0, "B3": 7.0}
