"""qwedsacf/competition_math: the MATH competition problems with worked solutions (Parquet; problem, level, type,
solution, all strings). The solution (which ends in its \\boxed{} answer) is the final; there is no id column, so
the id is the content hash."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from synthkd_assets.core.sources.base import ID_CONTENT, PARQUET, Column, SourceAdapter, SourceSpec, conversation_frame
from synthkd_assets.core.sources.pairs import pair_turns

SPEC = SourceSpec(
    key="competition_math",
    file_format=PARQUET,
    columns=(
        Column("problem", pa.string()),
        Column("level", pa.string(), required=False),
        Column("type", pa.string(), required=False),
        Column("solution", pa.string()),
    ),
    id_rule=ID_CONTENT,
    language="en",
    cited=(
        "https://huggingface.co/datasets/qwedsacf/competition_math (viewer: default, train, 12.5k rows)",
        "https://huggingface.co/datasets/hendrycks/competition_math (loading script features: problem, level, "
        "type, solution)",
    ),
)


def to_conversations(frame: pl.DataFrame) -> pl.DataFrame:
    return conversation_frame(
        frame, pair_turns(pl.col("problem"), pl.col("solution")), extra=pl.struct("level", "type")
    )


ADAPTER = SourceAdapter(SPEC, to_conversations)
