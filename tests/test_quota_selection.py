"""Quota and source-mix selection (core/quota.py, core/source_mix.py): one row cannot wreck the mix.

The oracle recounts the kept rows itself: every row is run through the pool's own keep rules (`quota_keep`,
`source_mix_keep`, with the plan's rates and excluded ids) and the kept tokens are summed per bucket or group, then
compared with the targets the data's tokens give. A per-row draw at the grid's rates (the rule the plan replaced)
misses the same targets by tens of points when one long row is in play; the hash-ordered token-budget prefix holds
every share within QUOTA_SHARE_TOLERANCE, or the plan names the rows that prevent it.
"""

from __future__ import annotations

import json
import math
import random
import statistics

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synthkd_assets.core.quota import (
    MAX_SELECTION_ROUNDS,
    OVERSIZED_ROW_SHARE,
    QUOTA_SALT,
    QUOTA_SHARE_TOLERANCE,
    PrefixSelection,
    QuotaRow,
    QuotaTargets,
    excluded_ids,
    hash_ordered_prefix,
    plan_quota_grid,
    plan_quota_selection,
    quota_keep,
    share_miss_problems,
)
from synthkd_assets.core.quota_rows import QUOTA_HASH_BINS, QuotaRows
from synthkd_assets.core.source_mix import BinnedRows, SourceMixTargets, plan_source_mix, source_mix_keep
from synthkd_contract.buckets import SKILL_BUCKETS, SKILL_MIX, ctx_bucket, ctx_codes
from synthkd_contract.sources import SOURCE_MIX_SALT
from synthkd_contract.splits import stable_unit_interval


def select(rows: list[QuotaRow], targets: QuotaTargets, bins: int = QUOTA_HASH_BINS) -> tuple[dict, list[QuotaRow]]:
    """`plan_quota_selection` over these rows: the plan and the rows its rule keeps."""
    held = QuotaRows.from_rows(rows, bins)
    plan = plan_quota_selection(held, targets)
    return plan, held.kept(plan["rates"], excluded_ids(plan), QUOTA_SALT).all_rows()


def small_rows(seed: int, n: int) -> list[QuotaRow]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        skill = rng.choices(SKILL_BUCKETS, weights=(6, 1, 1.5, 3))[0]
        length = rng.randint(200, 4000)
        rows.append(QuotaRow(f"synth_{seed}_{i}", skill, ctx_bucket(length), length))
    return rows


def kept_shares(rows: list[QuotaRow], plan: dict) -> dict[str, float]:
    """The oracle: the pool's keep rule over every row, tokens summed per skill bucket, as shares."""
    excluded = excluded_ids(plan)
    kept = {b: 0 for b in SKILL_BUCKETS}
    for row in rows:
        if quota_keep(row.synth_id, row.skill, row.ctx, plan["rates"], excluded):
            kept[row.skill] += row.tokens
    total = sum(kept.values())
    return {b: kept[b] / total for b in SKILL_BUCKETS}


def test_one_2mb_reasoning_row_no_longer_takes_b1_off_its_share():
    """The attack: one ~500k-token B1 row beside thousands of ordinary rows. Drawn row by row at the grid's rates,
    B1 lands tens of points off target; selected, every bucket is within a point and the long row is excluded."""
    giant = QuotaRow("synth_giant", "B1", "C4", 520_000)
    rows = [*small_rows(7, 600), giant]
    mix = {"B1": 0.606, "B2": 0.087, "B3": 0.157, "B4": 0.15}
    old_plan = plan_quota_grid(*grids(rows), QuotaTargets(mix))
    old = kept_shares(rows, {"rates": old_plan["rates"]})
    shares = old_plan["targets"]["shares"]
    assert max(abs(old[b] - shares[b]) for b in SKILL_BUCKETS) > QUOTA_SHARE_TOLERANCE  # the injected failure

    plan, kept = select(rows, QuotaTargets(mix))
    achieved = kept_shares(rows, plan)
    for b in SKILL_BUCKETS:
        assert abs(achieved[b] - plan["targets"]["shares"][b]) <= QUOTA_SHARE_TOLERANCE, (b, achieved[b])
    assert plan["share_misses"] == []
    assert sorted(kept) == sorted(r for r in rows if r.synth_id in kept_ids(rows, plan))
    # the plan states its kept tokens exactly
    assert plan["skill_tokens"]["expected"] == {b: sum(r.tokens for r in kept if r.skill == b) for b in SKILL_BUCKETS}


def grids(rows: list[QuotaRow]) -> tuple[dict, dict]:
    tokens: dict = {}
    counts: dict = {}
    for r in rows:
        tokens[r.skill, r.ctx] = tokens.get((r.skill, r.ctx), 0) + r.tokens
        counts[r.skill, r.ctx] = counts.get((r.skill, r.ctx), 0) + 1
    return tokens, counts


def kept_ids(rows: list[QuotaRow], plan: dict) -> set[str]:
    excluded = excluded_ids(plan)
    return {r.synth_id for r in rows if quota_keep(r.synth_id, r.skill, r.ctx, plan["rates"], excluded)}


giants = st.lists(st.tuples(st.sampled_from(SKILL_BUCKETS), st.integers(50_000, 3_000_000)), min_size=0, max_size=4)
mixes = st.dictionaries(st.sampled_from(SKILL_BUCKETS), st.floats(0.05, 1.0), min_size=2)


@settings(max_examples=25)
@given(giants, mixes, st.integers(0, 10**6))
def test_every_share_is_within_a_point_whatever_the_long_rows(long_rows, mix, seed):
    """Hypothesis: ordinary rows in every bucket plus up to four very long rows anywhere, any mix: every kept share
    is within the tolerance of its target, the plan's expected tokens are exactly what the keep rule keeps, and
    the plan does not depend on the rows' order."""
    rows = small_rows(seed, 3000)
    rows += [QuotaRow(f"long_{i}", skill, ctx_bucket(n), n) for i, (skill, n) in enumerate(long_rows)]
    plan, _ = select(rows, QuotaTargets(mix))
    achieved = kept_shares(rows, plan)
    for b in SKILL_BUCKETS:
        assert abs(achieved[b] - plan["targets"]["shares"][b]) <= QUOTA_SHARE_TOLERANCE, (b, achieved, plan["notes"])
    assert plan["share_misses"] == []
    shuffled = rows[:]
    random.Random(seed).shuffle(shuffled)
    assert json.dumps(select(shuffled, QuotaTargets(mix))[0]) == json.dumps(plan)


def test_a_bucket_only_one_long_row_fills_is_a_miss_naming_that_row():
    """B2 holds a single row, too long for its share of what B1 holds: no selection meets B2's target. The plan
    says so (share_misses), and the problems name the row (synth_id, tokens) that causes it."""
    rows = [*[QuotaRow(f"b1_{i}", "B1", "C1", 1000) for i in range(100)], QuotaRow("b2_only", "B2", "C4", 900_000)]
    plan, _ = select(rows, QuotaTargets({"B1": 0.5, "B2": 0.5}))
    assert [m["key"] for m in plan["share_misses"]] == ["B1"]  # B2's one row is its granularity: B1 is off
    achieved = {b: plan["skill_tokens"]["expected"][b] for b in SKILL_BUCKETS}
    problems = share_miss_problems(achieved, plan["targets"]["shares"], plan["excluded"], plan["granularity"])
    assert len(problems) == 1 and problems[0].startswith("B1: 100.00% of the kept tokens, target 50.00%")
    assert "b2_only (900000 tokens)" in problems[0]


def test_default_mix_on_ordinary_rows_keeps_its_shares_and_excludes_nothing():
    rows = small_rows(3, 8000)
    plan, _ = select(rows, QuotaTargets())
    achieved = kept_shares(rows, plan)
    assert all(abs(achieved[b] - SKILL_MIX[b]) <= QUOTA_SHARE_TOLERANCE for b in SKILL_BUCKETS)
    assert plan["share_misses"] == []


def test_one_10mb_anchor_line_no_longer_takes_math_to_zero():
    """The attack on the source mix: a math anchor source whose tokens are mostly one huge line. Drawn at its rate,
    that line and most of the rest are dropped (math far under its share); selected with its rows, the line is
    excluded and math holds its share."""
    rng = random.Random(5)
    synth = [(f"s{i}", rng.randint(300, 3000)) for i in range(4000)]
    math_rows = [(f"m{i}", rng.randint(300, 3000)) for i in range(600)] + [("math_line", 2_600_000)]
    code_rows = [(f"c{i}", rng.randint(300, 3000)) for i in range(600)]
    rows = {"synth": synth, "nemotron_math_v2": math_rows, "opencodeinstruct": code_rows}
    tokens = {s: float(sum(n for _, n in r)) for s, r in rows.items()}
    counts = {s: float(len(r)) for s, r in rows.items()}
    targets = SourceMixTargets(category_shares={"math": 0.087, "code": 0.05}, source_caps={})

    def group_shares(plan: dict) -> dict[str, float]:
        excluded = excluded_ids(plan)
        kept = {s: sum(n for sid, n in r if source_mix_keep(sid, s, plan["rates"], excluded)) for s, r in rows.items()}
        total = sum(kept.values())
        return {
            "synth": kept["synth"] / total,
            "math": kept["nemotron_math_v2"] / total,
            "code": kept["opencodeinstruct"] / total,
        }

    drawn = plan_source_mix(tokens, counts, targets)  # no rows: rates drawn row by row
    assert abs(group_shares(drawn)["math"] - drawn["groups"]["math"]["target_share"]) > QUOTA_SHARE_TOLERANCE

    plan = plan_source_mix(tokens, counts, targets, rows)
    achieved = group_shares(plan)
    for group in ("synth", "math", "code"):
        assert abs(achieved[group] - plan["groups"][group]["target_share"]) <= QUOTA_SHARE_TOLERANCE, achieved
    assert plan["share_misses"] == []
    assert "math_line" in excluded_ids(plan)


def binned(rows: list[tuple[str, int]], bins: int) -> BinnedRows:
    """These (synth_id, tokens) rows by source-mix hash bin, as the pool hands SYNTH's kept rows to the mix."""
    held = QuotaRows(bins, salt=SOURCE_MIX_SALT)
    if rows:
        lengths = np.array([n for _, n in rows], dtype=np.int64)
        held.add(pa.array([i for i, _ in rows]), np.zeros(len(rows), np.int16), ctx_codes(lengths), lengths)
    return BinnedRows(held)


@settings(max_examples=80, deadline=None)
@given(
    st.sampled_from([0, 3, 10, 30, 100, 400]),
    st.lists(st.tuples(st.integers(0, 600), st.integers(20_000, 2_000_000)), max_size=4),
    st.floats(0.02, 0.6),
    st.floats(0.02, 0.3),
    st.sampled_from([1, 5, 64, QUOTA_HASH_BINS]),
    st.integers(0, 10**6),
)
def test_synths_rows_by_hash_bin_give_the_source_mix_of_its_rows_in_memory(
    ordinary, long_rows, math_share, code_share, bins, seed
):
    """SYNTH's kept rows reach the source mix by hash bin (`BinnedRows`); the anchors' as lists. Whatever SYNTH's
    rows (very long ones, repeated ids) and shares: the plan is the one made from SYNTH's rows as a list, byte for
    byte, and its bins are what the oversized and unusable rows were taken out of."""
    rng = random.Random(seed)
    synth = [(rng.randrange(600), rng.randint(0, 4_000)) for _ in range(ordinary)]  # ids repeat now and then
    synth = [(f"s{key}", n) for key, n in synth + long_rows]
    anchors = {
        "nemotron_math_v2": [(f"m{i}", rng.randint(100, 3000)) for i in range(rng.randint(0, 80))],
        "opencodeinstruct": [(f"c{i}", rng.randint(100, 3000)) for i in range(rng.randint(0, 80))],
    }
    rows = {"synth": synth, **anchors}
    tokens = {s: float(sum(n for _, n in r)) for s, r in rows.items()}
    counts = {s: float(len(r)) for s, r in rows.items()}
    targets = SourceMixTargets(category_shares={"math": math_share, "code": code_share}, source_caps={})
    listed = plan_source_mix(tokens, counts, targets, rows)
    by_bin = plan_source_mix(tokens, counts, targets, {**anchors, "synth": binned(synth, bins)})
    assert json.dumps(by_bin) == json.dumps(listed)


def test_rows_sharing_the_stopping_hash_are_left_out_with_it(monkeypatch):
    """Two synth_ids can share one float hash (53 bits of 64): the rule keeps hash < rate, so a kept row tied with
    the first row left out would be dropped by the pool while the plan counted it. With a coarse hash forcing
    ties, the plan's kept rows are exactly the rule's, row for row."""
    import synthkd_assets.core.quota as quota
    import synthkd_assets.core.quota_rows as quota_rows

    real, reals = quota.stable_unit_interval, quota_rows.stable_unit_intervals
    monkeypatch.setattr(quota, "stable_unit_interval", lambda salt, key: int(real(salt, key) * 16) / 16)
    monkeypatch.setattr(quota_rows, "stable_unit_intervals", lambda salt, keys: np.floor(reals(salt, keys) * 16) / 16)
    rows = small_rows(11, 400)
    plan, kept = select(rows, QuotaTargets())
    assert sorted(r.synth_id for r in kept) == sorted(kept_ids(rows, plan))
    assert plan["skill_tokens"]["expected"] == {b: sum(r.tokens for r in kept if r.skill == b) for b in SKILL_BUCKETS}


def walked_selection(rows: list[QuotaRow], targets: QuotaTargets) -> dict:
    """The oracle: the selection as docs/pool.md "How the quota selects rows" states it, every bucket's rows walked
    one by one (`walked_prefix`), the rounds that lower the kept total or set long rows aside taken in turn."""
    grid = plan_quota_grid(*grids(rows), targets)
    shares = grid["targets"]["shares"]
    total = math.fsum(grid["skill_tokens"]["expected"].values())
    unusable: dict[str, QuotaRow] = {}
    for _ in range(MAX_SELECTION_ROUNDS):
        oversized = OVERSIZED_ROW_SHARE * total
        budgets = {b: total * shares[b] for b in SKILL_BUCKETS}
        picked = {}
        for b in SKILL_BUCKETS:
            usable = [r for r in rows if r.skill == b and r.synth_id not in unusable]
            held = sum(r.tokens for r in usable)
            if shares[b] <= 0 or budgets[b] <= 0:
                picked[b] = PrefixSelection(0.0, [], [], 0)
            elif budgets[b] >= held:
                picked[b] = PrefixSelection(1.0, usable, [], held)
            else:
                picked[b] = walked_prefix(usable, QUOTA_SALT, budgets[b], oversized)
        short = [b for b in SKILL_BUCKETS if budgets[b] - picked[b].tokens > oversized and picked[b].skipped]
        if not short:
            break
        if lumpy := [b for b in short if picked[b].tokens < budgets[b] / 2]:
            unusable.update({r.synth_id: r for b in lumpy for r in picked[b].skipped})
            usable = [r for r in rows if r.synth_id not in unusable]
            held = {b: sum(r.tokens for r in usable if r.skill == b) for b in SKILL_BUCKETS}
            capacities = [held[b] / shares[b] for b in SKILL_BUCKETS if shares[b] > 0 and held[b] > 0]
            total = min([total, *capacities]) if capacities else 0.0
        else:
            lowered = min(picked[b].tokens / shares[b] for b in short)
            if lowered >= total:
                break
            total = lowered
    kept = [r for b in SKILL_BUCKETS for r in picked[b].kept]
    return {
        "rates": {b: picked[b].rate for b in SKILL_BUCKETS},
        "excluded": sorted(
            [(r.synth_id, r.tokens, "unusable") for r in unusable.values()]
            + [(r.synth_id, r.tokens, "oversized") for b in SKILL_BUCKETS for r in picked[b].skipped]
        ),
        "expected_tokens": {b: picked[b].tokens for b in SKILL_BUCKETS},
        "expected_rows": grids(kept)[1],
        "granularity": {
            b: statistics.median_low([r.tokens for r in rows if r.skill == b] or [0]) for b in SKILL_BUCKETS
        },
    }


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 400), st.sampled_from(SKILL_BUCKETS), st.integers(0, 5_000) | st.integers(0, 400_000)),
        max_size=300,
    ),
    mixes,
    st.booleans(),
    st.sampled_from([2, 7, 64, QUOTA_HASH_BINS]),
)
def test_the_selection_read_by_hash_bins_is_the_rule_walked_row_by_row(rows, mix, balance, bins):
    """The selection reads again only the hash bins where each budget ends (`bucket_prefixes`); with one bin it
    reads every row of a bucket at once. Whatever the bins, long rows, repeated ids (one hash, several rows) and
    mix: the rates, excluded rows and kept tokens and rows are the oracle's, and the plan is the one-bin plan,
    byte for byte."""
    rows = [QuotaRow(f"id-{key}", skill, ctx_bucket(n), n) for key, skill, n in rows]
    targets = QuotaTargets(mix, balance_tokens=balance)
    plan = select(rows, targets, bins=bins)[0]
    walked = walked_selection(rows, targets)
    assert {b: cells["C1"] for b, cells in plan["rates"].items()} == walked["rates"]
    assert sorted((e["synth_id"], e["tokens"], e["why"].split(":")[0]) for e in plan["excluded"]) == walked["excluded"]
    assert plan["skill_tokens"]["expected"] == walked["expected_tokens"]
    expected_rows = {(b, c): n for b, cells in plan["expected"]["rows"].items() for c, n in cells.items() if n}
    assert expected_rows == walked["expected_rows"]
    assert plan["granularity"] == walked["granularity"]
    assert json.dumps(plan) == json.dumps(select(rows, targets, bins=1)[0])


def test_the_quota_rows_of_files_spill_and_are_removed(tmp_path, monkeypatch):
    """A plan over files keeps each file's hashes on disk, in a directory of its own that closing removes; one
    left by a plan killed with SIGKILL is removed by the next plan. A file changed between reads is refused."""
    import subprocess
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from synthkd_assets.core.quota_rows import QUOTA_SPILL_PREFIX, tokenized_quota_rows

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now
    killed = tmp_path / f"{QUOTA_SPILL_PREFIX}{gone.pid}-x1"
    killed.mkdir()
    path = tmp_path / "synth_000.parquet"
    pq.write_table(
        pa.table({"synth_id": ["a", "b"], "exercise": ["rag", "mcq"], "loss_mask": [[1] * 3, [0] * 5]}), path
    )
    with tokenized_quota_rows([path]) as held:
        assert not killed.exists()
        spill = held._spill
        assert spill.parent == tmp_path
        assert sorted(p.name for p in spill.iterdir()) == ["0.npy"]
        assert [row.synth_id for row in held.all_rows()] == ["a", "b"]
        pq.write_table(pa.table({"synth_id": ["c"], "exercise": ["rag"], "loss_mask": [[1]]}), path)
        with pytest.raises(RuntimeError, match="changed while the quota plan read it"):
            held.all_rows()
    assert not spill.exists()


def walked_prefix(rows: list, salt: str, budget: float, oversized: float) -> PrefixSelection:
    """The rule walked row by row, as written: rows sorted by (hash, synth_id) with Python's stable sort, each
    kept while it fits, an oversized one that does not fit skipped, the first other one that does not fit ending
    the prefix (with the kept rows sharing its hash)."""
    ordered = sorted(rows, key=lambda row: (stable_unit_interval(salt, row[0]), row[0]))
    kept: list[tuple[str, int]] = []
    skipped: list[tuple[str, int]] = []
    for row in ordered:
        unit = stable_unit_interval(salt, row[0])
        if sum(k[-1] for k in kept) + row[-1] <= budget:
            kept.append(row)
        elif row[-1] > oversized:
            skipped.append(row)
        else:
            kept = [k for k in kept if stable_unit_interval(salt, k[0]) != unit]
            return PrefixSelection(unit, kept, skipped, sum(k[-1] for k in kept))
    return PrefixSelection(1.0, kept, skipped, sum(k[-1] for k in kept))


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.integers(0, 12), st.integers(0, 400)), max_size=40),
    st.floats(-10, 6000, allow_nan=False) | st.just(math.inf),
    st.floats(-10, 500, allow_nan=False) | st.just(math.inf),
)
def test_the_hash_ordered_prefix_is_the_rule_walked_row_by_row(rows, budget, oversized):
    """Repeated ids (one hash, several rows) included: the same rate, kept rows in order, skipped rows, tokens."""
    rows = [(f"id-{key}", length) for key, length in rows]
    expected = walked_prefix(rows, QUOTA_SALT, budget, oversized)
    assert hash_ordered_prefix(rows, QUOTA_SALT, budget, oversized) == expected
