"""nvidia/OpenCodeInstruct: coding instructions with generated solutions (Parquet, data/train-*; id, input,
output, domain, generation_algorithm, llm_judgement, unit_tests, tests_execution_status, average_test_score, all
strings). input -> user, output -> final; the id is `id`."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from synthkd_assets.core.sources.base import ID_DATASET, PARQUET, Column, SourceAdapter, SourceSpec, conversation_frame
from synthkd_assets.core.sources.pairs import pair_turns

SPEC = SourceSpec(
    key="opencodeinstruct",
    file_format=PARQUET,
    columns=(
        Column("id", pa.string()),
        Column("input", pa.string()),
        Column("output", pa.string()),
        Column("domain", pa.string(), required=False),
        Column("generation_algorithm", pa.string(), required=False),
        Column("llm_judgement", pa.string(), required=False),
        Column("unit_tests", pa.string(), required=False),
        Column("tests_execution_status", pa.string(), required=False),
        Column("average_test_score", pa.string(), required=False),
    ),
    id_rule=ID_DATASET,
    language="en",
    cited=("https://huggingface.co/datasets/nvidia/OpenCodeInstruct/blob/main/README.md (dataset_info features)",),
)


def to_conversations(frame: pl.DataFrame) -> pl.DataFrame:
    extra = pl.struct("domain", "generation_algorithm", "average_test_score")
    return conversation_frame(frame, pair_turns(pl.col("input"), pl.col("output")), pl.col("id"), extra=extra)


ADAPTER = SourceAdapter(SPEC, to_conversations)
