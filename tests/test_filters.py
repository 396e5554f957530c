"""The 001 quality filters: each rule and its near misses, on real synth_harmony_v1 Parquet."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from synthkd_assets.core.filters import (
    answer_expr,
    filter_config,
    first_line,
    parse_letter,
    parse_number,
    quality_drop_reasons,
    result_is_inconsistent,
    result_values,
)
from synthkd_assets.core.stages import harmonize_shard, select_rows_shard
from synthkd_assets.core.synth import python_whitespace, system_message_dict
from synthkd_contract import constants, drops
from synthkd_contract.schemas import RAW_SCHEMA
from tests.conftest import SAMPLE_RAW_DIR

EMPTY, FAILED, INCONSISTENT = drops.DROP_EMPTY_ANSWER, drops.DROP_RESULT_FAILED, drops.DROP_RESULT_INCONSISTENT


def raw_row(
    synth_id: str,
    answer: str = "Some answer.\n\nBody.",
    constraints: str | None = "",
    reasoning: str = "Thinking.",
    exercise: str = "mcq",
) -> dict:
    row = {column: "" for column in constants.RAW_STRING_COLUMNS}
    row.update(
        synth_id=synth_id,
        language="en",
        exercise=exercise,
        query="Which option?",
        query_seed_text="Seed text.",
        synthetic_reasoning=reasoning,
        synthetic_answer=answer,
        constraints=constraints,
        words=1,
    )
    return row


def filter_rows(tmp_path: Path, rows: list[dict]) -> tuple[dict[str, str | None], dict]:
    """Raw rows -> synth_harmony (real Parquet) -> synth_filtered with the 001 rule: reason per synth_id."""
    raw = tmp_path / "synth_00.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=RAW_SCHEMA), raw)
    harmony = tmp_path / "harmony.parquet"
    harmonize_shard(raw, harmony, system_message_dict(), "synth_00")
    frame = pl.read_parquet(harmony)
    reasons = dict(zip(frame["synth_id"].to_list(), quality_drop_reasons(frame).to_list()))
    report = select_rows_shard(harmony, tmp_path / "filtered.parquet", "synth_00", quality_drop_reasons)
    kept = pl.read_parquet(tmp_path / "filtered.parquet")["synth_id"].to_list()
    assert kept == [sid for sid, reason in reasons.items() if reason is None]
    assert report.rows_in == report.rows_out + sum(report.dropped.values())
    return reasons, report.to_dict()


@pytest.mark.parametrize(
    ("answer", "dropped"),
    [
        ("", True),
        ("   \n\t ", True),
        ("\u3000\u2003\n", True),  # ideographic / em space
        ("\x1c\x1d\x1e\x1f", True),  # str.strip() treats these separators as whitespace too
        (".", False),
        ("\u200b", True),  # a zero-width space alone: nothing a reader sees (test_filters_invisible.py)
        ("  x  ", False),
    ],
)
def test_blank_answer_is_dropped_near_misses_are_kept(tmp_path, answer, dropped):
    reasons, _ = filter_rows(tmp_path, [raw_row("a", answer=answer)])
    assert reasons["a"] == (EMPTY if dropped else None)


@pytest.mark.parametrize(
    ("constraints", "dropped"),
    [
        ("result:Failed after maximum attempts", True),
        ("tone:formal; RESULT:FAILED AFTER MAXIMUM ATTEMPTS; format:plain", True),
        ("Result:failed after maximum attempts", True),
        ("result:Failed after maximum attempts (3)", True),  # contains the marker
        ("Failed after maximum attempts", False),  # no `result:`
        ("result:Failed after maximum attempt", False),  # singular: not the marker
        ("result: Failed after maximum attempts", True),  # the marker with a blank after the colon
        ("result:Failed after max attempts", False),
        ("note:result failed after maximum attempts", False),
        (None, False),
    ],
)
def test_failed_result_marker_case_insensitive_and_near_misses(tmp_path, constraints, dropped):
    reasons, _ = filter_rows(tmp_path, [raw_row("a", answer="Body text only.", constraints=constraints)])
    assert reasons["a"] == (FAILED if dropped else None)


@pytest.mark.parametrize(
    ("constraints", "answer", "inconsistent"),
    [
        # numbers compared as numbers
        ("result:1000", "1,000\n\nBecause...", False),
        ("result:1,000", "1000.0", False),
        ("result:1000.0", "1000", False),
        ("result:10.30", "10.3 metres", False),
        ("result:-5", "-5", False),
        ("result:12532", "**12532**", False),
        ("result:12532", "The total is 12 532.", False),  # space-grouped thousands
        ("result:3.5", "3,5", False),  # decimal comma
        ("result:1000", "1.000", False),  # dot-grouped thousands
        ("result:1000", "1,000, 2,000 and 3,000", False),
        ("result:1001", "1,000", True),
        ("result:137.6", "135.4\n\n## Key points", True),
        ("result:12", "12532", True),
        ("result:1000", "100", True),
        ("result:5", "\n\n  4\nthen 5", True),  # the first line of the stripped answer is "4"
        ("result:12", "# Title without numbers", False),  # nothing to compare
        # MCQ letters, case-insensitive
        ("result:b", "B\n\nBecause...", False),
        ("result:B", "b) It is studied in geography.", False),
        ("result:(C)", "C. The third option", False),
        ("result:d", "Answer: D", False),
        ("result:c", "B", True),
        ("result:A", "b) It is unknown", True),
        ("result:C", "(D) Wrong", True),
        ("result:a", "A cat sat on the mat.", False),  # no option letter can be read
        ("result:a", "12", False),
        # neither a number nor a letter: the row stays
        ("result:abc", "B", False),
        ("result:twelve", "13", False),
        ("result:$12", "13", False),
        ("result:", "13", False),
        # every result item is checked; other keys are not
        ("length:12; result:5", "5", False),
        ("result:5; result:6", "5", True),
        ("tone:formal\nresult:7", "7", False),
        ("results:7", "8", False),
    ],
)
def test_result_consistency_cases(tmp_path, constraints, answer, inconsistent):
    assert result_is_inconsistent(constraints, answer) is inconsistent
    reasons, _ = filter_rows(tmp_path, [raw_row("a", answer=answer, constraints=constraints)])
    assert reasons["a"] == (INCONSISTENT if inconsistent else None)


# Real SYNTH answer shapes (docs/bad-input.md; the corpus as published) the rule must keep: each was dropped as
# inconsistent by the rule before issue 42.
SOLUTION = "\n\n## Solution\n\nLet the initial value be $V$. Then..."


@pytest.mark.parametrize(
    ("exercise", "constraints", "answer"),
    [
        # math mcq: the question asks a net percentage change; the option states its size, the sign is said in words
        ("math mcq", "result:-74.5", "A. 74.5%" + SOLUTION),
        ("math mcq", "result:-12", "B. 12% decrease"),
        ("math mcq", "result:-74.5", "**C. 74.5 %**"),
        ("math mcq", "result:0.25", "D. 25%"),  # a share written as a percentage
        ("math mcq", "result:-0.745", "A. 74.5\\%"),
        # fractions for a decimal result
        ("math exercise", "result:0.25", "1/4"),
        ("math exercise", "result:0.25", "\\frac{1}{4}"),
        ("math exercise", "result:0.25", "$\\frac{1}{4}$" + SOLUTION),
        ("math exercise", "result:0.25", "**Answer: $\\dfrac{1}{4}$ of the tank**" + SOLUTION),
        ("math exercise", "result:2.5", "**Answer: 2 1/2 hours**"),
        ("math exercise", "result:1.75", "**Answer: 1¾ cups**"),
        ("math exercise", "result:0.3333333", "**Answer: $\\frac{1}{3}$**"),  # the result is the fraction rounded
        ("math exercise", "result:0.25", "25%"),
        ("math exercise", "result:0.25", "**Answer: 25 percent of the students**"),
        # grouping, LaTeX grouping and scale words around the number
        ("math exercise", "result:15000", "**Answer: $15{,}000$**"),
        ("math exercise", "result:15000", "**Answer: $15\\,000$ km²**"),
        ("math exercise", "result:1500000", "**Answer: $1.5 million**"),
        # the first line states the result rounded to the digits it shows
        ("math exercise", "result:3.3333333", "≈ 3.33"),
        ("math exercise", "result:3.3333333", "**Answer: 3.33 hours**" + SOLUTION),
        ("math exercise", "result:3.33", "**Answer: ≈ 3.333 hours**"),  # or the result is the stated one rounded
        ("math exercise", "result:2.5", "≈ 3"),  # a tie rounds either way: 3 (half up) and 2 (half even) state 2.5
        ("math exercise", "result:2.5", "≈ 2"),
        # a net change's sign said in words
        ("math exercise", "result:-20", "**Answer: the temperature falls by 20 °C**"),
    ],
)
def test_real_answer_shapes_are_consistent(tmp_path, exercise, constraints, answer):
    assert result_is_inconsistent(constraints, answer) is False
    reasons, _ = filter_rows(tmp_path, [raw_row("a", answer=answer, constraints=constraints, exercise=exercise)])
    assert reasons["a"] is None


# What stays dropped: the first line clearly states another number / another option letter.
@pytest.mark.parametrize(
    ("exercise", "constraints", "answer"),
    [
        ("math exercise", "result:15", "**Answer: 17 systems**" + SOLUTION),
        ("math exercise", "result:15", "**Answer: 14 systems**"),
        ("math exercise", "result:15000", "**Answer: $15{,}500$**"),
        ("math exercise", "result:0.25", "**Answer: $\\frac{1}{3}$**"),
        ("math exercise", "result:0.25", "**Answer: 20%**"),
        ("math exercise", "result:3.3333333", "≈ 3.34"),  # not the result rounded to 2 places
        ("math exercise", "result:3.35", "≈ 3.2"),
        ("math mcq", "result:-74.5", "B. 25.5%"),  # another option's number
        ("math mcq", "result:-12", "C. 21% increase"),
        ("mcq", "result:B", "C. the 1960s"),
        ("mcq", "result:b", "**A. the 1950s**"),
    ],
)
def test_clear_contradictions_are_still_dropped(tmp_path, exercise, constraints, answer):
    assert result_is_inconsistent(constraints, answer) is True
    reasons, _ = filter_rows(tmp_path, [raw_row("a", answer=answer, constraints=constraints, exercise=exercise)])
    assert reasons["a"] == INCONSISTENT


@pytest.mark.parametrize(
    "constraints",
    [
        "domain:history, exercise:fact recall, answer_shape:standard, exercise_pattern:sentence_following",
        "domain:sports, exercise:result recall, answer_shape:standard, exercise_pattern:result_first",
        "quality:corruption, stylistic:tone, structural:expansion",
        "combination:repeat_prompt",
        "",
    ],
)
def test_comma_separated_constraints_carry_no_result(tmp_path, constraints):
    """mcq / editing / writing constraints are `key:value` items separated by `, `: none of them is a result item,
    so an answer whose first line names a year or another letter is never compared with anything."""
    assert result_values(constraints) == []
    for answer in ("C. the 1960s", "B. 1815\n\nBecause..."):
        assert result_is_inconsistent(constraints, answer) is False
    reasons, _ = filter_rows(tmp_path, [raw_row("a", answer="C. the 1960s", constraints=constraints)])
    assert reasons["a"] is None


@given(st.integers(min_value=-(10**12), max_value=10**12))
def test_any_integer_result_is_consistent_with_its_grouped_answer(n):
    for line in (f"**Answer: {n:,} units**", f"**Answer: {abs(n):,} units**", f"A. {abs(n)}%"):
        assert not result_is_inconsistent(f"result:{n}", line + SOLUTION)


@given(st.integers(min_value=-(10**12), max_value=10**12), st.integers(min_value=-(10**6), max_value=10**6))
def test_any_other_integer_is_inconsistent(n, k):
    assume(k != 0 and abs(n + k) != abs(n))  # the sign of a result is not compared
    assert result_is_inconsistent(f"result:{n}", f"**Answer: {n + k} units**" + SOLUTION)


@given(st.decimals(min_value=0, max_value=10**6, places=7, allow_nan=False, allow_infinity=False), st.integers(0, 3))
def test_a_result_rounded_to_the_places_shown_is_consistent_two_units_off_is_not(result, places):
    unit = Decimal(1).scaleb(-places)
    shown = result.quantize(unit, rounding=ROUND_HALF_UP)
    value = format(result, "f")
    assert not result_is_inconsistent(f"result:{value}", f"≈ {shown}")
    assert not result_is_inconsistent(f"result:-{value}", f"**Answer: ≈ {shown} m**")
    if places <= -result.normalize().as_tuple().exponent:  # else the result is the coarser one (`result:0.5`)
        assert result_is_inconsistent(f"result:{value}", f"≈ {shown + 2 * unit}")


@given(st.integers(1, 1000), st.integers(1, 1000), st.integers(2, 10))
def test_a_fraction_states_its_decimal_result(numerator, denominator, places):
    result = (Decimal(numerator) / Decimal(denominator)).quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    for line in (f"{numerator}/{denominator}", f"$\\frac{{{numerator}}}{{{denominator}}}$"):
        assert not result_is_inconsistent(f"result:{format(result, 'f')}", f"**Answer: {line}**")


@given(st.decimals(min_value=0, max_value=1000, places=3, allow_nan=False, allow_infinity=False))
def test_a_percentage_states_its_share(percent):
    share, shown = format(percent / 100, "f"), format(percent, "f")
    assert not result_is_inconsistent(f"result:{share}", f"{shown}%")
    assert not result_is_inconsistent(f"result:-{shown}", f"A. {shown}%")


def test_filter_config_names_every_pattern_the_rule_reads():
    config = filter_config()
    for key in ("line_numeric_run", "line_latex_grouping", "line_scale", "line_fraction", "number_match"):
        assert config[key]


def test_number_and_letter_parsing():
    assert parse_number("1,000") == parse_number("1000") == parse_number("1000.0") == parse_number("1000.000")
    assert parse_number("1,00") is None and parse_number("1 000") is None and parse_number("12a") is None
    assert parse_number("-0.5") == parse_number("-.5")
    assert parse_letter("b") == parse_letter("(B)") == parse_letter("B)") == parse_letter("B.") == "B"
    assert parse_letter("bb") is None and parse_letter("1") is None
    assert result_values("tone:x; result: 12 ;Result:b\nresult:c") == ["12", "b", "c"]
    assert first_line("\n\n  **42**  \nrest") == "42"


def test_first_reason_wins_and_drops_are_counted(tmp_path):
    rows = [
        raw_row("keep"),
        raw_row("empty_and_failed", answer=" ", constraints="result:Failed after maximum attempts"),
        raw_row("failed_and_inconsistent", answer="1", constraints="result:Failed after maximum attempts; result:2"),
        raw_row("inconsistent", answer="1", constraints="result:2"),
    ]
    reasons, report = filter_rows(tmp_path, rows)
    assert reasons == {
        "keep": None,
        "empty_and_failed": EMPTY,
        "failed_and_inconsistent": FAILED,
        "inconsistent": INCONSISTENT,
    }
    assert report["dropped"] == {EMPTY: 1, FAILED: 1, INCONSISTENT: 1}
    assert report["exercise_language"] == {"mcq": {"en": 1}}


def test_filters_on_the_sample_match_a_plain_python_reading_of_the_raw_rows(tmp_path):
    """The polars expressions over messages_json / metadata_json equal the rules applied to the raw columns."""
    for raw in sorted(SAMPLE_RAW_DIR.glob("*.parquet")):
        harmony = tmp_path / raw.name
        harmonize_shard(raw, harmony, system_message_dict(), raw.stem)
        frame = pl.read_parquet(harmony)
        got = dict(zip(frame["synth_id"].to_list(), quality_drop_reasons(frame).to_list()))
        expected = {}
        for row in pl.read_parquet(raw).iter_rows(named=True):
            answer, constraints = row["synthetic_answer"].replace("\x00", ""), row["constraints"] or ""
            if not answer.strip():
                expected[row["synth_id"]] = EMPTY
            elif constants.FAILED_RESULT_MARKER.lower() in constraints.lower():
                expected[row["synth_id"]] = FAILED
            elif result_is_inconsistent(constraints, answer):
                expected[row["synth_id"]] = INCONSISTENT
            else:
                expected[row["synth_id"]] = None
        assert got == expected


def test_the_written_out_whitespace_is_exactly_what_str_isspace_accepts():
    assert python_whitespace() == "".join(chr(c) for c in range(0x110000) if chr(c).isspace())


_TEXT = st.one_of(st.none(), st.text(max_size=20))
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant"])},
    optional={"content": st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), max_size=3)},
)


@given(st.lists(st.one_of(st.none(), st.fixed_dictionaries({}, optional={"messages": st.lists(_MESSAGE, max_size=4)}))))
def test_the_answer_is_the_text_of_the_last_messages_first_content_as_json_reads_it(documents):
    """answer_expr's one JSON path against Python's json module, per row: the last message's first content's text,
    null where there is no message, no content or no text."""

    def oracle(document: dict | None) -> str | None:
        messages = (document or {}).get("messages") or []
        content = messages[-1].get("content") or [] if messages else []
        return content[0]["text"] if content else None

    payloads = [None if d is None else json.dumps(d, ensure_ascii=i % 2 == 0) for i, d in enumerate(documents)]
    found = pl.DataFrame({"messages_json": payloads}, schema={"messages_json": pl.String})
    assert found.select(answer_expr())["messages_json"].to_list() == [oracle(d) for d in documents]
