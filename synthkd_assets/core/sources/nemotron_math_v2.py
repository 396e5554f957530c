"""nvidia/Nemotron-Math-v2: gpt-oss-120b trajectories for AoPS / StackExchange math problems (JSONL shards
data/{high.part_0N,medium,low}.jsonl). `messages` is the conversation; an assistant message's `reasoning_content`
is its reasoning (-> analysis), `content` its answer (-> final). Rows that use the Python tool (tool messages)
have no v1 span and drop as unsupported_role. `uuid` names the problem, shared by its many trajectories: the id
is `<uuid>-<sha256 of the content>[:16]`."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from synthkd_assets.core.sources.base import (
    ID_DATASET_CONTENT,
    JSONL,
    Column,
    SourceAdapter,
    SourceSpec,
    conversation_frame,
    message_list_turns,
)

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("reasoning_content", pa.string())])
SPEC = SourceSpec(
    key="nemotron_math_v2",
    file_format=JSONL,
    columns=(
        Column("problem", pa.string()),
        Column("expected_answer", pa.string()),
        Column("original_expected_answer", pa.string(), required=False),
        Column("changed_answer_to_majority", pa.bool_(), required=False),
        Column("data_source", pa.string(), required=False),
        Column("messages", pa.list_(MESSAGE)),
        Column("metadata", pa.string(), required=False, json_text=True),
        Column("license", pa.string(), required=False),
        Column("used_in", pa.string(), required=False, json_text=True),
        Column("uuid", pa.string()),
        Column("url", pa.string(), required=False),
        Column("user_url", pa.string(), required=False),
        Column("user_name", pa.string(), required=False),
        Column("tools", pa.string(), required=False, json_text=True),
    ),
    id_rule=ID_DATASET_CONTENT,
    language="en",
    cited=(
        "https://huggingface.co/datasets/nvidia/Nemotron-Math-v2 (card: configs high.part_00-02 / medium / low "
        "JSONL; fields problem, expected_answer, messages, metadata, data_source, uuid, url, user_name, tools)",
        "https://nvidia-nemo.github.io/Skills/releases/nemotron-math-v2/dataset",
    ),
)


def to_conversations(frame: pl.DataFrame) -> pl.DataFrame:
    last = pl.col("messages").list.last()
    return conversation_frame(
        frame,
        message_list_turns("messages"),
        example_id=pl.col("uuid"),
        reasoning=pl.when(last.struct.field("role") == "assistant").then(last.struct.field("reasoning_content")),
        extra=pl.struct("expected_answer", "data_source", "changed_answer_to_majority", "license"),
    )


ADAPTER = SourceAdapter(SPEC, to_conversations)
