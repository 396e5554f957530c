"""The 001 quality filters: each rule and its near misses, on real synth_harmony_v1 Parquet."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_assets.core.filters import (
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
    synth_id: str, answer: str = "Some answer.\n\nBody.", constraints: str | None = "", reasoning: str = "Thinking."
) -> dict:
    row = {column: "" for column in constants.RAW_STRING_COLUMNS}
    row.update(
        synth_id=synth_id,
        language="en",
        exercise="mcq",
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
        ("\u200b", False),  # zero-width space is not whitespace for str.strip()
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
        ("result: Failed after maximum attempts", False),  # 001 names the exact string; a space breaks it
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
