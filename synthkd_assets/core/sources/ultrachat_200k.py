"""HuggingFaceH4/ultrachat_200k: multi-turn chats (Parquet, data/{train,test}_{sft,gen}-*; prompt, prompt_id,
messages: list of {content, role}). `messages` is the whole conversation (user first); the id is prompt_id."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from synthkd_assets.core.sources.base import (
    ID_DATASET,
    PARQUET,
    Column,
    SourceAdapter,
    SourceSpec,
    conversation_frame,
    message_list_turns,
)

SPEC = SourceSpec(
    key="ultrachat_200k",
    file_format=PARQUET,
    columns=(
        Column("prompt", pa.string()),
        Column("prompt_id", pa.string()),
        Column("messages", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
    ),
    id_rule=ID_DATASET,
    language="en",
    cited=("https://huggingface.co/datasets/HuggingFaceH4/ultrachat_200k (card: dataset_info features)",),
)


def to_conversations(frame: pl.DataFrame) -> pl.DataFrame:
    return conversation_frame(frame, message_list_turns("messages"), example_id=pl.col("prompt_id"))


ADAPTER = SourceAdapter(SPEC, to_conversations)
