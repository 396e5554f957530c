"""bcui19/chat-v2-anthropic-helpfulness: Anthropic HH helpfulness dialogues in MosaicML's chat-v2 layout
(Parquet, train / test). Assumed columns `prompt` (the history, ChatML: `<|im_start|>role\\n...<|im_end|>` per turn,
ending with the assistant's opening) and `response` (the assistant's reply): the stored card names no features,
so a shard in another layout is refused by the schema check, naming its columns (docs/sources.md). A prompt with
no ChatML turn is one user turn. No id column: the id is the content hash."""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from synthkd_assets.core.sources.base import ID_CONTENT, PARQUET, Column, SourceAdapter, SourceSpec, conversation_frame

SPEC = SourceSpec(
    key="anthropic_helpfulness",
    file_format=PARQUET,
    columns=(Column("prompt", pa.string()), Column("response", pa.string())),
    id_rule=ID_CONTENT,
    language="en",
    cited=(
        "https://huggingface.co/datasets/bcui19/chat-v2-anthropic-helpfulness (viewer: default, train 155k / "
        "test 8.34k rows, Parquet; features not shown in the stored copy)",
    ),
)
CHATML_TURN = r"(?s)<\|im_start\|>[^\n]*\n.*?<\|im_end\|>"
CHATML_ROLE = r"(?s)^<\|im_start\|>([^\n]*)\n"
CHATML_TEXT = r"(?s)^<\|im_start\|>[^\n]*\n(.*)<\|im_end\|>$"


def to_conversations(frame: pl.DataFrame) -> pl.DataFrame:
    chatml = (
        pl.col("prompt")
        .str.extract_all(CHATML_TURN)
        .list.eval(
            pl.struct(
                role=pl.element().str.extract(CHATML_ROLE, 1).str.strip_chars(),
                text=pl.element().str.extract(CHATML_TEXT, 1),
            )
        )
    )
    plain = pl.concat_list(pl.struct(role=pl.lit("user"), text=pl.col("prompt")))
    history = pl.when(pl.col("prompt").str.contains("<|im_start|>", literal=True)).then(chatml).otherwise(plain)
    reply = pl.concat_list(pl.struct(role=pl.lit("assistant"), text=pl.col("response")))
    return conversation_frame(frame, pl.concat_list(history, reply))


ADAPTER = SourceAdapter(SPEC, to_conversations)
