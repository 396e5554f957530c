"""Mixture sampling: per-rule salted hash decisions (independent of order and layout) and the plan's targets."""

from __future__ import annotations

import hashlib
import itertools
import math
import random

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synthkd_assets.core.sampling import (
    MixTargets,
    keep_probability,
    mix_meets_targets,
    plan_keep_rates,
    sampling_drop_reason,
    sampling_rule,
)
from synthkd_assets.core.stages import select_rows_shard
from synthkd_contract import constants
from synthkd_contract.schemas import HARMONY_SCHEMA
from synthkd_contract.splits import are_valid, is_valid, salted_heads, stable_unit_intervals

EXERCISES = ("memorization", "rag", "mcq", "math exercise")
LANGUAGES = ("en", "fr", "de", "unknown")
RATES = {"memorization": 0.6, "non_english": 0.5, "english": 1.0, "global": 0.8}


def unit(salt: str, key: str) -> float:
    """The split's construction, restated: first 8 bytes of sha256(f'{salt}:{key}') over 2**64."""
    return int.from_bytes(hashlib.sha256(f"{salt}:{key}".encode()).digest()[:8], "big") / 2**64


def rows(n: int, seed: int = 0) -> pl.DataFrame:
    rng = random.Random(seed)
    return pl.DataFrame(
        {
            "synth_id": [f"id_{i:06d}" for i in range(n)],
            "language": [rng.choice(LANGUAGES) for _ in range(n)],
            "exercise": [rng.choice(EXERCISES) for _ in range(n)],
            "source_row": list(range(n)),
            "messages_json": ["{}"] * n,
            "metadata_json": ["{}"] * n,
        }
    )


def kept_ids(frame: pl.DataFrame, rates=RATES) -> set[str]:
    return set(frame.filter(sampling_rule(rates)(frame).is_null())["synth_id"].to_list())


def test_decision_is_the_salted_split_hash_per_rule():
    for synth_id, exercise, language in rows(400).select("synth_id", "exercise", "language").iter_rows():
        expected = None
        rules = (["memorization"] if exercise == "memorization" else []) + [
            "english" if language == "en" else "non_english",
            "global",
        ]
        for rule in rules:
            if not unit(constants.SAMPLING_SALTS[rule], synth_id) < RATES[rule]:
                expected = f"sampled_out_{rule}"
                break
        assert sampling_drop_reason(synth_id, exercise, language, RATES) == expected
    assert len(set(constants.SAMPLING_SALTS.values()) | {constants.SPLIT_SALT, constants.DISTILL_SPLIT_SALT}) == 6


LABELS = st.sampled_from(["en", "EN", " en-US", "en_GB", "\u200ben", "fr", "FR-ca", "de", "", " ", "unknown", None])
RATE = st.sampled_from([0.0, 0.25, 0.5, 0.8, 0.999, 1.0])


@settings(max_examples=200, deadline=None)
@given(
    cells=st.lists(st.tuples(st.sampled_from([*EXERCISES, None]), LABELS), max_size=60),
    rates=st.fixed_dictionaries({rule: RATE for rule in ("memorization", "non_english", "english", "global")}),
)
def test_the_frames_rule_is_every_rows_own_decision(cells, rates):
    """The RowRule the sampled step applies (a rule at a time over a frame) gives each row what the per-row rule,
    `sampling_drop_reason`, gives it: any label spelling, null labels and exercises, rates at 0 and 1."""
    frame = pl.DataFrame(
        {
            "synth_id": [f"row_{i}" for i in range(len(cells))],
            "exercise": [exercise for exercise, _ in cells],
            "language": [label for _, label in cells],
        },
        schema={"synth_id": pl.String, "exercise": pl.String, "language": pl.String},
    )
    expected = [sampling_drop_reason(*row, rates) for row in frame.iter_rows()]
    assert sampling_rule(rates)(frame).to_list() == expected


def test_independent_of_row_order_and_shard_layout(tmp_path):
    frame = rows(3000, seed=1)
    reference = kept_ids(frame)
    shuffled = frame.sample(fraction=1.0, shuffle=True, seed=7)
    assert kept_ids(shuffled) == reference
    # the same rows laid out as 1 shard or as 5 uneven shards of real Parquet, through the real step
    for layout in ([3000], [1, 499, 1000, 700, 800]):
        kept: set[str] = set()
        start = 0
        for index, size in enumerate(layout):
            shard = shuffled.slice(start, size)
            start += size
            in_path, out_path = (
                tmp_path / f"in_{len(layout)}_{index}.parquet",
                tmp_path / f"out_{len(layout)}_{index}.parquet",
            )
            pq.write_table(shard.to_arrow().cast(HARMONY_SCHEMA), in_path)
            report = select_rows_shard(in_path, out_path, f"s{index}", sampling_rule(RATES))
            assert report.rows_in == report.rows_out + sum(report.dropped.values())
            kept |= set(pl.read_parquet(out_path)["synth_id"].to_list())
        assert kept == reference


def test_raising_a_rate_only_adds_rows_and_rates_hold_statistically():
    frame = rows(20000, seed=2)
    low = kept_ids(frame, {**RATES, "memorization": 0.3})
    high = kept_ids(frame, {**RATES, "memorization": 0.7})
    assert low < high  # nested: each rule's decision is a threshold on the row's own hash
    memorization_rows = frame.filter(pl.col("exercise") == "memorization")
    for rate in (0.1, 0.5, 0.9):
        kept = len(
            kept_ids(memorization_rows, {"memorization": rate, "english": 1.0, "non_english": 1.0, "global": 1.0})
        )
        n = memorization_rows.height
        assert abs(kept - n * rate) < 5 * math.sqrt(n * rate * (1 - rate))
    every = {rule: 1.0 for rule in constants.SAMPLING_SALTS}
    assert kept_ids(frame, every) == set(frame["synth_id"].to_list())


# --- the plan -------------------------------------------------------------------------------------

cells_strategy = st.dictionaries(
    st.tuples(st.sampled_from(EXERCISES), st.sampled_from(LANGUAGES)), st.integers(0, 1_000_000), max_size=16
)


@st.composite
def targets_strategy(draw) -> MixTargets:
    lo = draw(st.floats(0.0, 0.95))
    hi = draw(st.floats(max(lo, 0.01), 1.0))
    return MixTargets(draw(st.floats(0.01, 1.0)), lo, hi, draw(st.floats(0.01, 1.0)))


def expected_mix(cells, rates) -> tuple[float, float, float]:
    """(rows, memorization share, non-English share) of counts x keep probabilities, computed here."""
    kept = {cell: n * keep_probability(cell[0], cell[1], rates) for cell, n in cells.items()}
    total = sum(kept.values())
    if not total:
        return 0.0, 0.0, 0.0
    memorization = sum(n for (ex, _), n in kept.items() if ex == "memorization")
    non_english = sum(n for (_, lang), n in kept.items() if lang != "en")
    return total, memorization / total, non_english / total


def grid_feasible(cells, targets: MixTargets, margin: float = 1e-3) -> bool:
    """An independent oracle: some memorization rate a and language ratio b meet the targets with slack."""
    for a in [i / 100 for i in range(1, 101)]:
        for log_b in [x / 10 for x in range(-60, 61)]:
            b = math.exp(log_b)
            rates = {"memorization": a, "english": min(1.0, 1 / b), "non_english": min(1.0, b), "global": 1.0}
            total, mem, non_en = expected_mix(cells, rates)
            if (
                total
                and mem <= targets.memorization_cap - margin
                and (targets.non_english_min + margin <= non_en <= targets.non_english_max - margin)
            ):
                return True
    return False


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cells_strategy, targets_strategy())
def test_plan_meets_the_targets_whenever_they_are_reachable(cells, targets):
    plan = plan_keep_rates(cells, targets)
    rates = plan["rates"]
    assert set(rates) == set(constants.SAMPLING_SALTS) and all(0 <= r <= 1 for r in rates.values())
    assert rates["global"] == targets.global_keep
    assert min(rates["english"], rates["non_english"]) <= 1 and max(rates["english"], rates["non_english"]) == 1
    total, mem, non_en = expected_mix(cells, rates)
    assert total == pytest.approx(plan["expected_after"]["rows"], rel=1e-9, abs=1e-6)
    meets = not total or (
        mem <= targets.memorization_cap + 1e-9
        and targets.non_english_min - 1e-9 <= non_en <= targets.non_english_max + 1e-9
    )
    assert plan["feasible"] == meets  # the plan says honestly whether its own rates meet the targets
    if not meets:
        # then no rates can (brute force over memorization rate x language ratio), and the plan says why
        assert not mix_meets_targets(plan["before"], targets) and not grid_feasible(cells, targets)
        assert plan["notes"]
    # no needless drops: a rule below 1 puts its share exactly at the target it enforces
    if rates["memorization"] < 1:
        assert mem == pytest.approx(targets.memorization_cap, abs=1e-9)
    if rates["english"] < 1:
        assert non_en == pytest.approx(targets.non_english_min, abs=1e-9)
    if rates["non_english"] < 1:
        assert non_en == pytest.approx(targets.non_english_max, abs=1e-9)
    if mix_meets_targets(plan["before"], targets):
        assert rates["memorization"] == rates["english"] == rates["non_english"] == 1.0


def test_plan_examples():
    # memorization 80%, non-English 40%: both move, to the cap and to the top of the range
    cells = {("memorization", "en"): 5000, ("memorization", "fr"): 3000, ("rag", "en"): 1000, ("rag", "de"): 1000}
    plan = plan_keep_rates(cells, MixTargets())
    after = plan["expected_after"]
    assert (
        plan["feasible"]
        and after["memorization_share"] == pytest.approx(0.70)
        and after["non_english_share"] == pytest.approx(0.30)
    )
    # English-only data cannot reach an (opted-in) non-English minimum: reported, English kept
    plan = plan_keep_rates({("rag", "en"): 10, ("memorization", "en"): 90}, MixTargets(non_english_min=0.25))
    assert not plan["feasible"] and plan["notes"] == ["no non-English rows"]
    assert plan["rates"]["english"] == 1.0 and plan["expected_after"]["memorization_share"] == pytest.approx(0.70)
    # min 0: English is never dropped to raise the multilingual share
    plan = plan_keep_rates({("rag", "en"): 90, ("rag", "fr"): 10}, MixTargets(non_english_min=0.0))
    assert plan["feasible"] and plan["rates"]["english"] == 1.0
    # memorization is all English, the rest all French: a 25% cap forces >= 75% French, above the range
    plan = plan_keep_rates({("memorization", "en"): 1, ("rag", "fr"): 1}, MixTargets(0.25, 0.0, 0.5))
    assert not plan["feasible"] and "exclude each other" in plan["notes"][0]
    assert plan["expected_after"]["memorization_share"] == pytest.approx(0.25) and plan["rates"]["english"] == 1.0
    # nothing at all: vacuously fine
    assert plan_keep_rates({}, MixTargets())["feasible"]


def test_the_default_language_rule_only_caps_non_english():
    """001 caps non-English at ~25-30%: by default English is never dropped to raise the non-English share."""
    assert MixTargets().non_english_min == 0.0 and MixTargets().non_english_max == 0.30
    # 80% English, below the range (the bundled sample's shape): nothing is dropped for language
    plan = plan_keep_rates({("rag", "en"): 80, ("rag", "fr"): 20}, MixTargets())
    assert plan["feasible"] and plan["rates"] == {
        "memorization": 1.0,
        "non_english": 1.0,
        "english": 1.0,
        "global": 1.0,
    }
    # 50% non-English: kept at rate r with 50r / (50 + 50r) = 0.30, r = 3/7
    plan = plan_keep_rates({("rag", "en"): 50, ("rag", "fr"): 50}, MixTargets())
    assert plan["rates"]["english"] == 1.0 and plan["rates"]["non_english"] == pytest.approx(3 / 7)
    # the lower bound is opt-in: English kept at e with 20 / (80e + 20) = 0.25, e = 3/4
    plan = plan_keep_rates({("rag", "en"): 80, ("rag", "fr"): 20}, MixTargets(non_english_min=0.25))
    assert plan["rates"]["english"] == pytest.approx(0.75) and plan["rates"]["non_english"] == 1.0


@pytest.mark.parametrize(
    "bad",
    [
        dict(memorization_cap=0),
        dict(non_english_min=0.4, non_english_max=0.3),
        dict(global_keep=0),
        dict(non_english_max=1.5),
    ],
)
def test_invalid_targets_are_refused(bad):
    with pytest.raises(ValueError):
        MixTargets(**bad)


def test_plan_bytes_do_not_depend_on_count_order():
    cells = {(ex, lang): 10 * i + 1 for i, (ex, lang) in enumerate(itertools.product(EXERCISES, LANGUAGES))}
    reversed_cells = dict(reversed(list(cells.items())))
    assert plan_keep_rates(cells, MixTargets()) == plan_keep_rates(reversed_cells, MixTargets())


@given(st.text(max_size=3), st.lists(st.text(max_size=40), max_size=30), st.floats(0, 1))
def test_salted_heads_and_valid_flags_are_the_rules_key_by_key(salt, keys, fraction):
    """The vectorized salted hashes (the signature files' rank and held-out keys) and split flags against sha256
    and `is_valid` taken key by key."""
    heads = [int.from_bytes(hashlib.sha256(f"{salt}:{key}".encode()).digest()[:8], "big") for key in keys]
    assert salted_heads(salt, keys).tolist() == heads and salted_heads(salt, keys).dtype == np.uint64
    assert are_valid(keys, salt, fraction).tolist() == [is_valid(key, salt, fraction) for key in keys]


@given(st.text(max_size=3), st.lists(st.text(max_size=40), max_size=30))
def test_stable_unit_intervals_are_the_rule_key_by_key(salt, keys):
    """The vectorized hash (numpy's uint64 to float64, scaled) against sha256 taken key by key, as written."""
    assert stable_unit_intervals(salt, keys).tolist() == [unit(salt, key) for key in keys]
