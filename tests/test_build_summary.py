"""What a build did before its datasets, as its summary prints it (core/build_summary.py, cli.py): the quality
filters' drops per exercise from real synth_filtered reports, and what the sampling plan keeps from the plan.json
as written."""

from __future__ import annotations

import json
from collections import Counter

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_assets.cli import filter_lines, plan_lines
from synthkd_assets.core import manifest as mf
from synthkd_assets.core.build_summary import (
    FILTER_REASONS,
    drops_by_exercise,
    drops_by_exercise_markdown,
    plan_keeps,
    read_plan_keeps,
    read_step_drops,
)
from synthkd_assets.core.filters import quality_drop_reasons
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.sampling import MixTargets, plan_keep_rates
from synthkd_assets.core.stages import harmonize_shard, select_rows_shard
from synthkd_assets.core.synth import system_message_dict
from synthkd_contract import constants, drops
from synthkd_contract.schemas import RAW_SCHEMA
from tests.test_filters import raw_row

EMPTY, FAILED, INCONSISTENT = drops.DROP_EMPTY_ANSWER, drops.DROP_RESULT_FAILED, drops.DROP_RESULT_INCONSISTENT


# per shard: (exercise, answer, constraints) of each row; the filters drop blank answers, the failure marker and a
# `result:` the answer's first line contradicts
SHARDS = {
    "synth_00": [
        *[("memorization", "Paris is the capital.", "")] * 6,
        ("memorization", "   ", ""),
        ("mcq", "C. the 1960s", "domain:history, exercise:fact recall"),
        ("mcq", "", "domain:history"),
        ("mcq", "B. 12", f"{constants.FAILED_RESULT_MARKER}"),
    ],
    "synth_01": [
        *[("memorization", "Rome is older.", "")] * 3,
        ("mcq", "A. 74.5%", "result:-74.5"),
        ("mcq", "The answer is 42.", "result:15"),
        ("mcq", "D. 3", f"{constants.FAILED_RESULT_MARKER}"),
    ],
}


def filter_shard(layout: DataLayout, key: str, rows: list[tuple[str, str, str]]) -> Counter:
    """Raw rows -> synth_harmony -> synth_filtered (real Parquet) with its report where the build writes it;
    returns (exercise, reason) -> rows, from the harmony rows and the filter rule applied to them."""
    raw = layout.raw_shard(key)
    raw.parent.mkdir(parents=True, exist_ok=True)
    table = [
        raw_row(f"{key}_{i}", answer, constraints, exercise=ex) for i, (ex, answer, constraints) in enumerate(rows)
    ]
    pq.write_table(pa.Table.from_pylist(table, schema=RAW_SCHEMA), raw)
    harmony = layout.stage_output("synth_harmony", key)
    harmony.parent.mkdir(parents=True, exist_ok=True)
    harmonize_shard(raw, harmony, system_message_dict(), key)
    filtered = layout.stage_output("synth_filtered", key)
    filtered.parent.mkdir(parents=True, exist_ok=True)
    errors = layout.error_log("synth_filtered", key)
    errors.parent.mkdir(parents=True, exist_ok=True)
    report = select_rows_shard(harmony, filtered, key, quality_drop_reasons, errors)
    report.write_json(layout.stage_report("synth_filtered", key))
    report.write_errors(errors)
    frame = pl.read_parquet(harmony)
    return Counter(zip(frame["exercise"].to_list(), quality_drop_reasons(frame).to_list()))


@pytest.fixture
def filtered_build(tmp_path) -> tuple[DataLayout, Counter]:
    layout = DataLayout(tmp_path / "raw", tmp_path / "data")
    fates: Counter = Counter()
    for key, rows in SHARDS.items():
        fates += filter_shard(layout, key, rows)
    return layout, fates


def test_the_filter_drops_per_exercise_are_those_of_the_rows(filtered_build):
    layout, fates = filtered_build
    step = read_step_drops(layout, list(SHARDS))
    assert {EMPTY, FAILED, INCONSISTENT} <= {reason for _, reason in fates}  # every reason happens here
    assert step.rows_in == sum(len(rows) for rows in SHARDS.values()) and not step.unattributed and not step.missing
    assert [e.exercise for e in step.exercises] == ["memorization", "mcq"]  # most rows in first
    for entry in step.exercises:
        assert entry.rows_in == sum(n for (ex, _), n in fates.items() if ex == entry.exercise)
        assert list(entry.dropped) == list(FILTER_REASONS)  # every reason, 0 when none
        assert entry.dropped == {r: fates[(entry.exercise, r)] for r in FILTER_REASONS}
    assert step.dropped == {r: sum(n for (_, reason), n in fates.items() if reason == r) for r in FILTER_REASONS}


def test_the_counter_agrees_with_the_error_logs_joined_with_the_exercise(filtered_build):
    """The per-exercise counter says what the error logs (the first 1000 drops of a shard) joined with
    synth_harmony's exercise column say, while they name every drop."""
    layout, _ = filtered_build
    joined: Counter = Counter()
    for key in SHARDS:
        harmony = pl.read_parquet(layout.stage_output("synth_harmony", key))
        exercise = dict(harmony.select("synth_id", "exercise").rows())
        for line in layout.error_log("synth_filtered", key).read_text().splitlines():
            logged = json.loads(line)
            joined[(exercise[logged["synth_id"]], logged["reason"])] += 1
    step = read_step_drops(layout, list(SHARDS))
    counted = Counter({(e.exercise, r): n for e in step.exercises for r, n in e.dropped.items() if n})
    assert counted == joined


def test_a_report_without_the_counter_or_a_shard_without_a_report_is_said(filtered_build):
    layout, _ = filtered_build
    path = layout.stage_report("synth_filtered", "synth_01")
    old = json.loads(path.read_text())
    del old["dropped_by_exercise"]  # as written before drops were counted per exercise
    path.write_text(json.dumps(old))
    step = read_step_drops(layout, [*SHARDS, "synth_02"])
    assert step.unattributed == sum(old["dropped"].values()) > 0
    assert step.missing == ["synth_02"]
    lines = filter_lines(step)
    assert lines[0].startswith(f"quality filters (synth_filtered): {step.rows_in} rows in, ")
    assert "per exercise: not recorded for" in lines[1] and len(lines) == 3  # no wrong per-exercise rows in
    assert lines[2] == "  no synth_filtered report for: synth_02"


def test_a_step_without_drops_lists_its_exercises_with_zeros():
    report = {"rows_in": 5, "rows_out": 5, "dropped": {}, "exercise": {"rag": 2, "memorization": 3}}
    step = drops_by_exercise([report])
    assert [(e.exercise, e.rows_in, e.rows_dropped) for e in step.exercises] == [("memorization", 3, 0), ("rag", 2, 0)]
    assert step.dropped == dict.fromkeys(FILTER_REASONS, 0)


def test_the_markdown_table_has_a_row_per_exercise_and_the_total(filtered_build):
    layout, _ = filtered_build
    step = read_step_drops(layout, list(SHARDS))
    table = drops_by_exercise_markdown(step).splitlines()
    assert table[0] == "| exercise | rows in | dropped | " + " | ".join(f"`{r}`" for r in FILTER_REASONS) + " |"
    mcq = next(e for e in step.exercises if e.exercise == "mcq")
    assert f"| `mcq` | {mcq.rows_in} | {mcq.rows_dropped} | " in table[3]
    assert table[-1].startswith(f"| all | {step.rows_in} | {step.rows_dropped} |")


def test_the_summary_lines_of_the_filters(filtered_build):
    layout, fates = filtered_build
    lines = filter_lines(read_step_drops(layout, list(SHARDS)))
    dropped = sum(n for (_, reason), n in fates.items() if reason)
    header = f"quality filters (synth_filtered): 16 rows in, {dropped} dropped ({100 * dropped / 16:.1f}%)"
    assert lines[0] == header + "; per exercise:"
    memorization = fates[("memorization", EMPTY)]
    assert lines[1] == (
        f"  memorization: 10 in, {memorization} dropped ({10 * memorization:.1f}%): "
        f"{EMPTY}={memorization}, {FAILED}=0, {INCONSISTENT}=0"
    )
    mcq = {r: fates[("mcq", r)] for r in FILTER_REASONS}
    assert lines[2] == (
        f"  mcq: 6 in, {sum(mcq.values())} dropped ({100 * sum(mcq.values()) / 6:.1f}%): "
        + ", ".join(f"{r}={n}" for r, n in mcq.items())
    )
    assert len(lines) == 3


# a memorization-heavy corpus as SYNTH publishes it (~90% memorization, ~80% English): 001's cap binds
HEAVY = {("memorization", "en"): 7300, ("memorization", "fr"): 1700, ("mcq", "en"): 700, ("mcq", "de"): 300}


def test_the_plan_is_read_as_written_not_recomputed(tmp_path):
    layout = DataLayout(tmp_path / "raw", tmp_path / "data")
    assert read_plan_keeps(layout) is None
    plan = plan_keep_rates(HEAVY, MixTargets())
    plan["rates"]["memorization"] = 0.123  # a plan the build wrote is what is said, whatever the counts say now
    layout.sampling_plan().parent.mkdir(parents=True)
    mf.write_manifest(layout.sampling_plan(), plan)
    keeps = read_plan_keeps(layout)
    assert keeps == plan_keeps(json.loads(layout.sampling_plan().read_text()))
    assert keeps.memorization_keep_rate == 0.123
    assert keeps.rows_seen == 10000 and keeps.rows_kept == plan["expected_after"]["rows"]


def test_the_summary_lines_of_a_binding_memorization_cap():
    keeps = plan_keeps(plan_keep_rates(HEAVY, MixTargets()))
    rate = keeps.memorization_keep_rate
    assert rate == pytest.approx(0.7 / 0.3 * 1000 / 9000)  # memorization kept to 70% of what remains
    assert keeps.memorization_share == (0.9, pytest.approx(0.7))
    kept = 9000 * rate + 1000
    assert keeps.rows_kept == pytest.approx(kept) and keeps.kept_share == pytest.approx(kept / 10000)
    non_english = (1700 * rate + 300) / kept
    assert keeps.non_english_share == (0.2, pytest.approx(non_english))
    assert plan_lines(keeps) == [
        f"sampling plan (synth_sampling_plan): memorization keep rate {rate:.4g}, rows kept {kept:.0f} / 10000 "
        f"({100 * kept / 10000:.1f}%, expected)",
        f"  mix before -> after sampling: memorization 90.0% -> 70.0%, non-English 20.0% -> {100 * non_english:.1f}%",
    ]


def test_the_summary_lines_name_other_rates_and_unmet_targets():
    # every memorization row is non-English, every other row English: the cap and the range exclude each other
    targets = MixTargets(non_english_min=0.8, non_english_max=1.0)
    keeps = plan_keeps(plan_keep_rates({("memorization", "fr"): 900, ("mcq", "en"): 100}, targets))
    lines = plan_lines(keeps)
    assert not keeps.feasible and lines[-1].startswith("  targets NOT met in expectation: ")
    assert plan_lines(None) == ["sampling plan (synth_sampling_plan): none written"]
    english = plan_keeps(plan_keep_rates(HEAVY, MixTargets(non_english_min=0.25)))
    assert english.rates["english"] < 1
    assert f"({'english'}={english.rates['english']:.4g})" in plan_lines(english)[0]
