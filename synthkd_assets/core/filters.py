"""Seed 001's quality filters ("cheap quality wins") as one `RowRule` over synth_harmony_v1 frames.

A row is dropped, and counted under the first reason that applies, when

1. `synthetic_answer` has no visible character: nothing but Python's whitespace,
   format characters (Unicode Cf: zero-width spaces and joiners, soft hyphens, BOM),
   other separators and controls, and blank fillers (INVISIBLE_PATTERN)          -> empty_synthetic_answer
2. `constraints` carries the failure marker `result:Failed after maximum attempts` in
   any case and spacing (`result: Failed after  maximum attempts`: failed_result_pattern)
                                                                                 -> result_failed_after_max_attempts
3. a `result:` value of `constraints` is numerically or multiple-choice
   inconsistent with the first line of the answer                                -> result_inconsistent_with_answer

Rules 1 and 2 are polars expressions; rule 3 is the small pure function `result_is_inconsistent`,
applied only to the rows whose constraints carry a `result:` item. The principle of rule 3 is "drop
only what is obviously broken": a `result:` that is neither a number nor an MCQ letter, or a first
line from which no number / option letter can be read, leaves the row in. A number result is
consistent when the first line states it in any of SYNTH's answer shapes (`line_numbers`): with
Markdown, units or currency around it (`**Answer: 15 systems**`, `$15`, `15 km²`), grouped
(`1,000`, `1 000`, `15{,}000`), as a percentage (`25%` for 0.25), a fraction (`1/4`,
`\\frac{1}{4}`, `¼`), a scale word (`1.5 million`), rounded (`≈ 3.33` for 3.3333333), or without its
sign (math mcq `A. 74.5%` for `result:-74.5`: a net change's sign is said in words).
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation
from fractions import Fraction

import polars as pl

from synthkd_assets.core.synth import python_whitespace
from synthkd_contract import constants, drops

# the text of a synth_harmony_v1 row's last message: one JSON path, not the whole conversation decoded
LAST_MESSAGE_TEXT_PATH = "$.messages[-1:].content[0].text"


def answer_expr() -> pl.Expr:
    """`synthetic_answer` (after NUL removal) of a synth_harmony_v1 row: the text of its last message,
    which is always the assistant `final` message in that schema (null when the row has no message or the
    message no content)."""
    return pl.col("messages_json").str.json_path_match(LAST_MESSAGE_TEXT_PATH)


def constraints_expr() -> pl.Expr:
    """The raw SYNTH `constraints` string carried in metadata_json (null when absent)."""
    return pl.col("metadata_json").str.json_path_match("$.constraints")


# what a reader cannot see: whitespace, format characters (Cf: ZWSP U+200B, ZWJ, soft hyphen, BOM ...), every
# separator (Z*) and control (Cc), and the blank fillers (braille blank, Hangul fillers) that render as nothing
_INVISIBLE_CHARACTERS = r"\s\p{Cf}\p{Cc}\p{Z}\x{2800}\x{115F}\x{1160}\x{3164}\x{FFA0}"
INVISIBLE_PATTERN = f"[{_INVISIBLE_CHARACTERS}]"
VISIBLE_PATTERN = f"[^{_INVISIBLE_CHARACTERS}]"  # one character INVISIBLE_PATTERN does not match
_INVISIBLE = re.compile(r"[\s\u0000-\u001f\u007f-\u009f\u2800\u115f\u1160\u3164\uffa0]")


def is_invisible(text: str | None) -> bool:
    """Whether `text` has no visible character (INVISIBLE_PATTERN), null included: the oracle of `is_blank_expr`.

    Args:
        text: an answer, or None.

    Returns:
        True when every character is whitespace, a format character (Cf), a separator (Z*), a control (Cc) or
        a blank filler.
    """
    return all(
        _INVISIBLE.fullmatch(ch) or unicodedata.category(ch) in ("Cf", "Cc", "Zs", "Zl", "Zp") for ch in text or ""
    )


def is_blank_expr(column: str) -> pl.Expr:
    """Vectorized `is_invisible`: the value has no visible character (null counts as blank)."""
    # searching for one visible character stops at the first, rather than reading the whole answer
    return ~pl.col(column).fill_null("").str.contains(VISIBLE_PATTERN)


def _marker_pattern(marker: str) -> str:
    """`key:value words` of `marker` matched in any case, with any blanks around the colon and between words."""
    key, value = marker.split(":", 1)
    return "(?i)" + re.escape(key) + r"\s*:\s*" + r"\s+".join(re.escape(word) for word in value.split())


def failed_result_pattern() -> str:
    """The failure marker (constants.FAILED_RESULT_MARKER) as the corpus and hand-edited shards spell it: any case,
    any blanks around the colon and between the words (docs/bad-input.md), read from the constant when called."""
    return _marker_pattern(constants.FAILED_RESULT_MARKER)


def failed_result_expr(column: str) -> pl.Expr:
    """`constraints` carries the failure marker (`failed_result_pattern`: any case and spacing)."""
    return pl.col(column).fill_null("").str.contains(failed_result_pattern())


# `result:<value>` items: constraints are `key:value` items separated by `;` (or new lines); the key
# is matched case-insensitively, like the failure marker
RESULT_ITEM_PATTERN = r"(?:^|[;\n])[ \t]*" + constants.RESULT_KEY + r"[ \t]*:([^;\n]*)"
_RESULT_ITEM = re.compile(RESULT_ITEM_PATTERN, re.IGNORECASE)


def has_result_expr(column: str) -> pl.Expr:
    return pl.col(column).fill_null("").str.contains("(?i)" + RESULT_ITEM_PATTERN)


def result_values(constraints: str | None) -> list[str]:
    """Every `result:` value of a constraints string, stripped (`"tone:x; result:12"` -> `["12"]`)."""
    return [value.strip() for value in _RESULT_ITEM.findall(constraints or "")]


# a result value that is a number: `1000`, `1,000`, `1000.0`, `-3.5`, `.5` (comma = thousands only)
_RESULT_NUMBER = re.compile(r"[-+\u2212]?(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)")
# a result value that is an option letter: `b`, `B`, `(B)`, `B)`, `B.`
_RESULT_LETTER = re.compile(r"\(?([A-Za-z])\)?\.?")


def parse_number(text: str) -> Decimal | None:
    """`1,000` / `1000` / `1000.0` -> Decimal('1000'), compared as numbers; None if not a plain number."""
    if not _RESULT_NUMBER.fullmatch(text):
        return None
    try:
        return Decimal(text.replace(",", "").replace("\u2212", "-")).normalize()
    except InvalidOperation:  # pragma: no cover - the regex admits only valid literals
        return None


def parse_letter(text: str) -> str | None:
    match = _RESULT_LETTER.fullmatch(text)
    return None if match is None else match.group(1).upper()


ANSWER_NUMBER = "number"
ANSWER_MCQ_LETTER = "mcq_letter"


def expected_answer(constraints: str | None) -> tuple[str, str] | None:
    """The answer form a row's first `result:` value makes checkable (docs/near-dup.md#validation-sets format
    compliance): (ANSWER_NUMBER, the number as a plain decimal) or (ANSWER_MCQ_LETTER, the upper-case letter); None when
    there is no `result:` or it is neither."""
    for value in result_values(constraints)[:1]:
        number = parse_number(value)
        if number is not None:
            return ANSWER_NUMBER, format(number, "f")
        letter = parse_letter(value)
        if letter is not None:
            return ANSWER_MCQ_LETTER, letter
    return None


def first_line(answer: str) -> str:
    """The first line of `answer.strip()`, without surrounding markdown emphasis / heading marks."""
    line = re.split(r"\r\n|\r|\n", answer.strip(python_whitespace()), maxsplit=1)[0]
    return re.sub(r"[*`]", "", line).strip(python_whitespace() + "_#>").strip(python_whitespace())


# a run of digits possibly grouped by , . ' or (narrow, no-break) spaces: `12,532`, `12 532`, `3,5`
# (no sign: results are compared sign-insensitively)
_NUMERIC_RUN = re.compile(r"\d(?:[\d,.'\u00a0\u202f\u2009 ]*\d)?")
# LaTeX spacing inside numbers: `15{,}000` -> `15,000`, `15\,000` -> `15 000`
_LATEX_GROUPING = re.compile(r"\{,\}|\\,")
# what a number right after it is multiplied by: `25%`, `25 \%`, `25 percent`, `1.5 million`
_SCALE = re.compile(r"\s*\\?(%|per\s?cent\b|(?:thousand|million|billion)s?\b)", re.IGNORECASE)
# a fraction, optionally after a whole part: `1/4`, `\frac{1}{4}`, `\dfrac{3}{4}`, `2 1/2`, `2½`, `¼`
_VULGAR_FRACTIONS = "\u00bc-\u00be\u2150-\u215e"  # ¼ ½ ¾, ⅐ ... ⅞
_FRACTION = re.compile(
    rf"(?<!\d)(?:(\d+)(?:\s+|(?=\\|[{_VULGAR_FRACTIONS}])))?"  # the whole part of a mixed number
    r"(?:\\[dt]?frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}"
    r"|(\d+)\s*[/\u2044\u2215]\s*(\d+)"
    rf"|([{_VULGAR_FRACTIONS}]))"
)


def _readings(run: str) -> list[str]:
    """Decimal literals a grouped digit run can mean: `,` as thousands or decimal separator, `.` as
    decimal or (`1.000`, `1.234.567`) thousands separator; spaces and apostrophes as thousands."""
    compact = re.sub(r"[\s'\u00a0\u202f\u2009]", "", run)
    readings = []
    if compact.count(".") <= 1:
        readings.append(compact.replace(",", ""))
    if compact.count(",") == 1:
        readings.append(compact.replace(".", "").replace(",", "."))
    if "," not in compact and re.fullmatch(r"\d{1,3}(?:\.\d{3})+", compact):
        readings.append(compact.replace(".", ""))
    return readings


def _scale(word: str) -> tuple[Fraction, int]:
    """The factor a scale word applies and the decimal places it shifts (`%` -> 1/100, 2)."""
    shift = {"%": -2, "p": -2, "t": 3, "m": 6, "b": 9}[word[0].lower()]
    return Fraction(10) ** shift, -shift


def line_numbers(line: str) -> set[tuple[Fraction, int | None]]:
    """Every non-negative number the line can be read as stating, generously (so that only clear
    mismatches drop), each with the decimal places it shows (None: exact, as a fraction is).

    Args:
        line: the answer's first line (`first_line`).

    Returns:
        (value, places) pairs: each grouped run (and each of its space-separated pieces) read with
        every separator convention of `_readings`, each also scaled by a `%` / scale word after it
        (`25%` -> 25 and 0.25 with 2 more places, `1.5 million` -> 1500000 shown to -5 places), and
        each fraction and mixed number (`1/4`, `\\frac{1}{4}`, `2 1/2`, `¼`) as an exact value.
    """
    line = _LATEX_GROUPING.sub(lambda m: "," if m.group() == "{,}" else " ", line)
    values: set[tuple[Fraction, int | None]] = set()
    for run in _NUMERIC_RUN.finditer(line):
        scale = _SCALE.match(line, run.end())
        factor, shift = _scale(scale.group(1)) if scale else (Fraction(1), 0)
        candidates = re.findall(r"\d+(?:\.\d+)?", run.group())
        for piece in {run.group(), *re.split(r"[,;]?[\s\u00a0\u202f\u2009]+", run.group())}:
            candidates.extend(_readings(piece))
        for candidate in candidates:
            try:
                number = Decimal(candidate)
            except InvalidOperation:
                continue
            places = -int(number.as_tuple().exponent)
            values.add((Fraction(number), places))
            values.add((Fraction(number) * factor, places + shift))
    for whole, tex_numerator, tex_denominator, numerator, denominator, vulgar in _FRACTION.findall(line):
        if vulgar:
            fraction = Fraction(unicodedata.numeric(vulgar)).limit_denominator(10)
        elif int(tex_denominator or denominator):
            fraction = Fraction(int(tex_numerator or numerator), int(tex_denominator or denominator))
        else:
            continue
        values.update({(fraction, None), (int(whole or 0) + fraction, None)})
    return values


def states_number(result: Decimal, stated: tuple[Fraction, int | None]) -> bool:
    """Whether a stated number is the result, up to its sign and to rounding.

    The less precise of the two must be the other rounded to the decimal places it shows, a tie
    rounding either way (`3.33` / `≈ 3.33` state 3.3333333; `3` states 2.5 and 3.4; `14` does not
    state 15); an integer result counts as shown to 0 places; a fraction is exact.

    Args:
        result: the `result:` number (`parse_number`).
        stated: a (value, places) reading of the first line (`line_numbers`).

    Returns:
        True when `|result|` and the stated value differ by at most half a unit of the coarser one's
        last place.
    """
    value, places = stated
    result_places = max(0, -int(result.as_tuple().exponent))
    places = result_places if places is None else min(places, result_places)
    return abs(abs(Fraction(result)) - value) <= Fraction(1, 2) / Fraction(10) ** places


# `B`, `b) text`, `(C) text`, `D. text`, `A: text`, optionally after `Answer:` / `The answer is`
_LINE_LETTER = re.compile(
    r"(?:(?:the\s+)?(?:correct\s+)?answer(?:\s+is)?\s*[:\uff1a]?\s*)?\(?([A-Za-z])(?:\)|\.|:|$)(?:\s|$)",
    re.IGNORECASE,
)


def line_letter(line: str) -> str | None:
    match = _LINE_LETTER.match(line)
    return None if match is None else match.group(1).upper()


def result_is_inconsistent(constraints: str | None, answer: str | None) -> bool:
    """Whether a row's `result:` label is obviously contradicted by its answer's first line.

    A number result is contradicted when the first line states numbers and none of them is the result
    (`states_number`: up to sign and rounding, in any shape `line_numbers` reads, so a math mcq
    `A. 74.5%` states `result:-74.5`); an option-letter result when the first line gives another
    option letter. Anything undecidable (no number / letter on the first line, a result that is
    neither) is consistent.

    Args:
        constraints: the raw SYNTH `constraints` string (every `result:` item is checked).
        answer: the raw `synthetic_answer`.

    Returns:
        True to drop the row as `result_inconsistent_with_answer`.
    """
    line = first_line(answer or "")
    for value in result_values(constraints):
        number = parse_number(value)
        if number is not None:
            stated = line_numbers(line)
            if stated and not any(states_number(number, reading) for reading in stated):
                return True
            continue
        letter = parse_letter(value)
        if letter is not None:
            given = line_letter(line)
            if given is not None and given != letter:
                return True
    return False


def quality_drop_reasons(frame: pl.DataFrame) -> pl.Series:
    """The 001 quality filters as a RowRule: a drop reason per synth_harmony_v1 row, or null to keep it."""
    parts = frame.select(answer_expr().alias("answer"), constraints_expr().alias("constraints"))
    flags = parts.select(
        is_blank_expr("answer").alias("empty"),
        failed_result_expr("constraints").alias("failed"),
        has_result_expr("constraints").alias("has_result"),
    )
    candidates = parts.with_row_index("i").filter((~flags["empty"] & ~flags["failed"] & flags["has_result"]).to_list())
    inconsistent = [False] * frame.height
    for i, constraints, answer in candidates.select("i", "constraints", "answer").iter_rows():
        inconsistent[i] = result_is_inconsistent(constraints, answer)
    return flags.with_columns(inconsistent=pl.Series(inconsistent, dtype=pl.Boolean)).select(
        pl.when("empty")
        .then(pl.lit(drops.DROP_EMPTY_ANSWER))
        .when("failed")
        .then(pl.lit(drops.DROP_RESULT_FAILED))
        .when("inconsistent")
        .then(pl.lit(drops.DROP_RESULT_INCONSISTENT))
        .otherwise(pl.lit(None, dtype=pl.String))
        .alias("reason")
    )["reason"]


def filter_config() -> dict:
    """What the filters do, for the manifests' config hash."""
    return {
        "rules": [drops.DROP_EMPTY_ANSWER, drops.DROP_RESULT_FAILED, drops.DROP_RESULT_INCONSISTENT],
        "failed_marker": constants.FAILED_RESULT_MARKER,
        "failed_marker_case_insensitive": True,
        "failed_marker_pattern": failed_result_pattern(),
        "empty_answer_invisible": INVISIBLE_PATTERN,
        "result_item": RESULT_ITEM_PATTERN,
        "result_number": _RESULT_NUMBER.pattern,
        "result_letter": _RESULT_LETTER.pattern,
        "line_numeric_run": _NUMERIC_RUN.pattern,
        "line_latex_grouping": _LATEX_GROUPING.pattern,
        "line_scale": _SCALE.pattern,
        "line_fraction": _FRACTION.pattern,
        "number_match": "sign-insensitive; the less precise number rounded to its places, ties either way",
        "line_letter": _LINE_LETTER.pattern,
    }
