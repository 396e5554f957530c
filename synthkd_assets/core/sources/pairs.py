"""The single-turn sources: one prompt column and one response column per row (problem/solution, question/answer,
instruction/output). `pair_turns` is the one mapping they share."""

from __future__ import annotations

import polars as pl


def pair_turns(prompt: pl.Expr, response: pl.Expr) -> pl.Expr:
    """[user prompt, assistant response] as a conversation's turns."""
    return pl.concat_list(
        pl.struct(role=pl.lit("user"), text=prompt),
        pl.struct(role=pl.lit("assistant"), text=response),
    )


def pair_conversations(
    frame: pl.DataFrame, prompt: pl.Expr, response: pl.Expr, example_id: pl.Expr | None, extra: pl.Expr | None
) -> pl.DataFrame:
    """A single-turn source's CONVERSATION_COLUMNS (no per-row language, no separate reasoning)."""
    return frame.select(
        "source_row",
        pl.lit(None, pl.String).alias("drop_reason"),
        (pl.lit(None, pl.String) if example_id is None else example_id).alias("example_id"),
        pl.lit(None, pl.String).alias("language"),
        pair_turns(prompt, response).alias("turns"),
        pl.lit(None, pl.String).alias("reasoning"),
        (pl.lit(None) if extra is None else extra).alias("extra"),
    )
