"""agentica-org/DeepCoder-Preview-Dataset: verifiable competitive-programming problems (Parquet per config:
primeintellect, taco, lcbv5, codeforces; problem, tests (JSON text), metadata (JSON text), starter_code in some).

The published rows carry no reference solution (the set was made for RL against its tests), so a row becomes a
conversation only where a `solutions` list is present (as in derived releases): its first solution is the final.
Every other row drops as no_reference_answer, counted. The source is strictly capped in the mix
(synthkd_contract/sources.py SOURCE_TOKEN_CAPS). No id column: the id is the content hash."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from synthkd_assets.core.sources.base import ID_CONTENT, PARQUET, Column, SourceAdapter, SourceSpec, conversation_frame
from synthkd_assets.core.sources.pairs import pair_turns
from synthkd_contract import drops

SPEC = SourceSpec(
    key="deepcoder",
    file_format=PARQUET,
    columns=(
        Column("problem", pa.string()),
        Column("tests", pa.string()),
        Column("metadata", pa.string(), required=False),
        Column("starter_code", pa.string(), required=False),
        Column("solutions", pa.list_(pa.string()), required=False),
    ),
    id_rule=ID_CONTENT,
    language="en",
    cited=(
        "https://huggingface.co/datasets/agentica-org/DeepCoder-Preview-Dataset/tree/main (configs codeforces, "
        "lcbv5, primeintellect, taco; Parquet)",
        "thinking-machines-lab tinker-cookbook code_rl (reads problem, tests, metadata, starter_code)",
    ),
)


def to_conversations(frame: pl.DataFrame) -> pl.DataFrame:
    solution = pl.col("solutions").list.first()
    return conversation_frame(
        frame,
        pair_turns(pl.col("problem"), solution),
        drop_reason=pl.when(solution.is_null()).then(pl.lit(drops.DROP_NO_REFERENCE_ANSWER)),
        extra=pl.struct("tests", "metadata", "starter_code"),
    )


ADAPTER = SourceAdapter(SPEC, to_conversations)
