"""The valuation features (docs/distillation.md#valuation-features), defined once: the lexical markers counted in a
user prompt, the continuation window of the model features, and the feature columns (`VALUATION_SCHEMA` in schemas.py).

A marker is a regular expression in the syntax that Python's `re` and polars (Rust's regex crate) read alike:
its feature is the number of non-overlapping matches in the user message of the conversation (the query and
its reference text, as synth_harmony renders them). The patterns are English: a prompt in another language
counts only what is language-free (lists, code fences, equations, digits followed by an English unit).
"""

from __future__ import annotations

from typing import Final

LEXICAL_MARKERS: Final[dict[str, str]] = {
    # instructions that bound the answer: modal / negated imperatives, bounds, exact counts, word limits
    "constraint": (
        r"(?i)\b(?:must|should not|do not|don't|never|at most|at least|exactly|no more than|no fewer than|"
        r"no longer than|limit(?:ed)? to|only)\b"
        r"|\b\d+\s*(?:words?|sentences?|paragraphs?|bullet points?|bullets|lines?|characters?)\b"
    ),
    # one item of a numbered or bulleted list: a line starting with `1.`, `2)`, `-`, `*` or `•`
    "enumeration": r"(?m)^[ \t]*(?:\d+[.)]|[-*•])[ \t]+\S",
    # a Markdown code fence (each opening or closing ``` counts)
    "code_fence": r"```",
    # inline LaTeX `$...$`, a LaTeX math command, or an operator / `=` between two numbers
    "equation": (
        r"\$[^$\n]+\$"
        r"|\\(?:frac|sqrt|sum|int|cdot|times|div|le|ge|neq|approx|pi|alpha|beta|theta)\b"
        r"|\d[ \t]*[=+×÷*/^<>≤≥][ \t]*-?\d"
    ),
}
MARKER_COLUMNS: Final[dict[str, str]] = {name: f"{name}_markers" for name in LEXICAL_MARKERS}

# the model features: teacher entropy and margin (top-1 minus top-2 probability) and the student-teacher KL,
# each the mean over the first VALUATION_WINDOW tokens after the prompt (teacher-forced on the data's own
# assistant tokens)
VALUATION_WINDOW: Final = 16
MODEL_FEATURE_COLUMNS: Final = ("teacher_entropy", "teacher_margin", "student_teacher_kl")
WINDOW_TOKENS_COLUMN: Final = "window_tokens"  # continuation tokens the model features averaged over
