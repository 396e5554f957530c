"""SYNTH rows -> Harmony messages (seed 001 "Canonical prompt rendering"), as polars expressions.

The system message is defined once here; the user turn is the query plus its reference text; the
assistant turn is `analysis` (only when `synthetic_reasoning.strip()` is non-empty) then `final`,
both verbatim. Each message is JSON of exactly the dict `openai_harmony.Message.to_dict()` gives.
"""

from __future__ import annotations

import json
from typing import Any

import polars as pl
from openai_harmony import Message, Role, SystemContent

from synthkd_contract import constants


def default_system_content() -> SystemContent:
    """The fixed system message of v1: Harmony's own `SystemContent.new()`, recorded in manifests."""
    return SystemContent.new()


def system_message_dict(system: SystemContent | None = None) -> dict[str, Any]:
    return json.loads(Message.from_role_and_content(Role.SYSTEM, system or default_system_content()).to_json())


# Every code point `str.isspace()` accepts (polars/Rust `trim` uses a slightly different set), written out:
# finding them by testing all 1.1M code points costs ~0.5 s in every process (tests/test_filters.py checks it)
PYTHON_WHITESPACE = (
    "\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)


def python_whitespace() -> str:
    """Every code point `str.isspace()` accepts."""
    return PYTHON_WHITESPACE


def has_visible_text(column: str) -> pl.Expr:
    """Vectorized `value.strip() != ""` with Python's exact whitespace definition."""
    return pl.col(column).str.strip_chars(python_whitespace()).str.len_bytes() > 0


def remove_nul(column: str) -> pl.Expr:
    """NULs are never meaningful SYNTH text and break C-string consumers: removed (and counted)."""
    return pl.col(column).str.replace_all("\x00", "", literal=True)


def user_content_expr() -> pl.Expr:
    """`f"{query}\\n\\nReference:\\n{query_seed_text}"` (constants.USER_TEMPLATE), vectorized."""
    head, rest = constants.USER_TEMPLATE.split("{query}")
    middle, tail = rest.split("{query_seed_text}")
    return pl.concat_str([pl.lit(head), pl.col("query"), pl.lit(middle), pl.col("query_seed_text"), pl.lit(tail)])


def message_json(role: str, text: pl.Expr, channel: str | None = None) -> pl.Expr:
    """JSON of `Message.to_dict()` for one text message, vectorized (`text` may be a column or a list element)."""
    fields: dict[str, pl.Expr] = {
        "role": pl.lit(role),
        "name": pl.lit(None, dtype=pl.String),
        "content": pl.concat_list(pl.struct(type=pl.lit("text"), text=text)),
    }
    if channel is not None:
        fields["channel"] = pl.lit(channel)
    return pl.struct(**fields).struct.json_encode()


def messages_json_head(system: dict[str, Any]) -> str:
    """What every messages_json starts with: the object's opening and the system message, then ", "."""
    return '{"messages": [' + json.dumps(system, ensure_ascii=False) + ", "


def messages_json_expr(system: dict[str, Any]) -> pl.Expr:
    """`{"messages": [system, user, (analysis), final]}` for every row of a sanitized SYNTH frame."""
    analysis = (
        pl.when(has_visible_text("synthetic_reasoning"))
        .then(pl.lit(", ") + message_json("assistant", pl.col("synthetic_reasoning"), "analysis"))
        .otherwise(pl.lit(""))
    )
    return pl.concat_str(
        [
            pl.lit(messages_json_head(system)),
            message_json("user", user_content_expr()),
            analysis,
            pl.lit(", "),
            message_json("assistant", pl.col("synthetic_answer"), "final"),
            pl.lit("]}"),
        ]
    )


def reference_messages(row: dict[str, str], system: dict[str, Any]) -> list[dict[str, Any]]:
    """The same messages built row by row with openai-harmony objects: the oracle for tests and CLI."""
    messages = [
        system,
        json.loads(Message.from_role_and_content(Role.USER, constants.USER_TEMPLATE.format(**row)).to_json()),
    ]
    if row["synthetic_reasoning"].strip():
        analysis = Message.from_role_and_content(Role.ASSISTANT, row["synthetic_reasoning"]).with_channel("analysis")
        messages.append(json.loads(analysis.to_json()))
    final = Message.from_role_and_content(Role.ASSISTANT, row["synthetic_answer"]).with_channel("final")
    messages.append(json.loads(final.to_json()))
    return messages
