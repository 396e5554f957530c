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
