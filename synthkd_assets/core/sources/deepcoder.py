"""agentica-org/DeepCoder-Preview-Dataset: verifiable competitive-programming problems (Parquet per config:
primeintellect, taco, lcbv5, codeforces; problem, tests (JSON text), metadata (JSON text), starter_code in some).

The published rows carry no reference solution (the set was made for RL against its tests), so a row becomes a
conversation only where a `solutions` list is present (as in derived releases): its first solution is the final.
Every other row drops as no_reference_answer, counted. The source is strictly capped in the mix
(synthkd_contract/sources.py SOURCE_TOKEN_CAPS). No id column: the id is the content hash."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from synthkd_assets.core.sources.base import ID_CONTENT, PARQUET, Column, SourceAdapter, SourceSpec
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
    return frame.select(
        "source_row",
        pl.when(solution.is_null()).then(pl.lit(drops.DROP_NO_REFERENCE_ANSWER)).alias("drop_reason"),
        pl.lit(None, pl.String).alias("example_id"),
        pl.lit(None, pl.String).alias("language"),
        pair_turns(pl.col("problem"), solution).alias("turns"),
        pl.lit(None, pl.String).alias("reasoning"),
        pl.struct("tests", "metadata", "starter_code").alias("extra"),
    )


ADAPTER = SourceAdapter(SPEC, to_conversations)
