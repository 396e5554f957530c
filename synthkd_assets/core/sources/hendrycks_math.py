"""PrimeIntellect/Hendrycks-Math: MATH problems with their final answer only (Parquet, data/train-*.parquet;
question, answer, info{problem_id, task_type}, difficulty). The assistant's final is the short answer as
published (there is no worked solution); the id is info.problem_id."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from synthkd_assets.core.sources.base import ID_DATASET, PARQUET, Column, SourceAdapter, SourceSpec, conversation_frame
from synthkd_assets.core.sources.pairs import pair_turns

SPEC = SourceSpec(
    key="hendrycks_math",
    file_format=PARQUET,
    columns=(
        Column("question", pa.string()),
        Column("answer", pa.string()),
        Column("info", pa.struct([("problem_id", pa.string()), ("task_type", pa.string())])),
        Column("difficulty", pa.float64(), required=False),
    ),
    id_rule=ID_DATASET,
    language="en",
    cited=("https://huggingface.co/datasets/PrimeIntellect/Hendrycks-Math (card: dataset_info features)",),
)


def to_conversations(frame: pl.DataFrame) -> pl.DataFrame:
    info = pl.col("info")
    return conversation_frame(
        frame,
        pair_turns(pl.col("question"), pl.col("answer")),
        example_id=info.struct.field("problem_id"),
        extra=pl.struct(task_type=info.struct.field("task_type"), difficulty=pl.col("difficulty")),
    )


ADAPTER = SourceAdapter(SPEC, to_conversations)
