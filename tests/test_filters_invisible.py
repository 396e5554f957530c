"""The empty-answer filter sees what a reader sees, and the failure marker is found however it is spaced.

Raw rows go through the real stages (raw Parquet -> synth_harmony -> synth_filtered, `filter_rows`). An answer of
zero-width spaces, soft hyphens, a BOM or no-break spaces passed `strip()`; `result: Failed after maximum attempts`
(a blank after the colon, as hand-edited constraints write it) missed the exact marker: both were kept and trained on.
The oracle for invisibility is `unicodedata` categories, restated here.
"""

from __future__ import annotations

import unicodedata

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from synthkd_assets.core.filters import is_blank_expr, is_invisible
from tests.test_filters import EMPTY, FAILED, filter_rows, raw_row

INVISIBLES = "\u200b\u200c\u200d\u2060\ufeff\u00ad\u00a0\u2007\u202f\u3000 \t\n\u180e\u2800\u3164"


def test_an_answer_of_invisible_characters_is_empty(tmp_path):
    rows = [
        raw_row("zwsp", answer="\u200b\u200b"),
        raw_row("mixed", answer="\u00a0\u200b\ufeff\u00ad \u2060"),
        raw_row("braille", answer="\u2800\u3164"),
        raw_row("visible", answer="\u200bA\u200b"),
    ]
    reasons, _ = filter_rows(tmp_path, rows)
    assert reasons == {"zwsp": EMPTY, "mixed": EMPTY, "braille": EMPTY, "visible": None}


def test_the_failure_marker_is_found_in_any_spacing_and_case(tmp_path):
    spellings = {
        "space": "result: Failed after maximum attempts",
        "spaces": "domain:math; result :  failed after  maximum attempts",
        "upper": "RESULT:FAILED AFTER MAXIMUM ATTEMPTS",
        "tab": "result:\tFailed after maximum\tattempts",
    }
    rows = [raw_row(key, constraints=value) for key, value in spellings.items()]
    rows.append(raw_row("number", answer="15 apples", constraints="result:15"))
    rows.append(raw_row("near", constraints="note: Failed after maximum attempts"))  # not a result item's value
    reasons, _ = filter_rows(tmp_path, rows)
    assert reasons == {**dict.fromkeys(spellings, FAILED), "number": None, "near": None}


def visible(ch: str) -> bool:
    return not ch.isspace() and unicodedata.category(ch)[0] in "LNPS" and ch not in "\u2800\u3164\u115f\u1160\uffa0"


texts = st.text(
    st.one_of(st.sampled_from(INVISIBLES), st.characters(categories=("L", "N", "P", "S", "Cf", "Zs", "Cc"))),
    max_size=8,
)


@settings(max_examples=200)
@given(st.text(alphabet=st.sampled_from(INVISIBLES), max_size=12), texts)
def test_invisibility_is_per_character_whatever_the_mix(padding, extra):
    """The polars rule (is_blank_expr) and the Python one agree with the restated oracle on any mix."""
    text = padding + extra + padding
    expected = not any(visible(ch) for ch in text)
    assert is_invisible(padding) and is_invisible(text) == expected
    assert pl.DataFrame({"answer": [text]}).select(is_blank_expr("answer"))["answer"].item() == expected
