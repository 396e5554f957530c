"""Single conversations as model inputs: the held-out slice, learning-progress candidates, valuation windows.

`SpanGPTDataset` slices samples across document boundaries (GPT-style), which is right for training but says
nothing about one conversation. Here one document (tokens + label-aligned lossmask / span, as in synth_kd_v1 and
as `HarmonyRenderer.render` returns them) becomes one sample of `seq_length` positions in SpanGPTDataset's layout:
input `tokens[a:a+L]`, labels `tokens[a+1:a+L+1]`, mask and span `stored[a:a+L]`. SYNTH prompts (system + query
+ reference text) are often longer than a small model's window, so the window starts `context` positions before
the first supervised position (`a = max(0, first_supervised - context)`, `context` = a quarter of the window by
default) instead of at the document's start, which would often hold prompt tokens only. A short document is padded
with EOD tokens carrying span 0 (never learned).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import torch

from synthkd_contract import constants
from synthkd_contract.trio import LOSSMASK_KIND, SPAN_KIND, TOKENS_KIND, open_trio

Batch = dict[str, torch.Tensor]
Document = tuple[np.ndarray, np.ndarray, np.ndarray]
"""tokens (ending with EOD), label-aligned lossmask, label-aligned span."""


def window_start(span: np.ndarray, seq_length: int, context: int | None = None) -> int:
    supervised = np.flatnonzero(np.asarray(span) != constants.SPAN_PROMPT)
    if len(supervised) == 0:
        return 0
    context = seq_length // 4 if context is None else context
    return max(0, int(supervised[0]) - context)


def document_sample(
    tokens: np.ndarray, loss_mask: np.ndarray, span: np.ndarray, seq_length: int, context: int | None = None
) -> dict[str, torch.Tensor]:
    """One document as one unbatched sample (tokens / labels / loss_mask / span_id / position_ids)."""
    start = window_start(span, seq_length, context)
    length = max(0, min(seq_length, len(tokens) - 1 - start))
    pad = seq_length - length

    def padded(values: np.ndarray, fill: int) -> torch.Tensor:
        values = np.asarray(values[start : start + length], dtype=np.int64)
        return torch.from_numpy(np.concatenate([values, np.full(pad, fill, dtype=np.int64)]))

    return {
        "tokens": padded(tokens, constants.EOD_TOKEN_ID),
        "labels": padded(tokens[1:], constants.EOD_TOKEN_ID),
        "loss_mask": padded(loss_mask, 0).float(),
        "span_id": padded(span, constants.SPAN_PROMPT),
        "position_ids": torch.arange(seq_length),
    }


def stack_samples(samples: Sequence[dict[str, torch.Tensor]]) -> Batch:
    """A batch as SpanGPTDataset + DataLoader give it, with megatron's causal mask (True where masked)."""
    batch = {key: torch.stack([s[key] for s in samples]) for key in samples[0]}
    seq_length = batch["tokens"].shape[1]
    causal = torch.tril(torch.ones(seq_length, seq_length)) < 0.5
    batch["attention_mask"] = causal.expand(len(samples), 1, seq_length, seq_length)
    return batch


def batches_of(samples: Sequence[dict[str, torch.Tensor]], micro_batch_size: int) -> list[Batch]:
    return [stack_samples(samples[i : i + micro_batch_size]) for i in range(0, len(samples), micro_batch_size)]


def trio_documents(tokens_prefix: str | Path, indices: Sequence[int]) -> list[Document]:
    """(tokens, lossmask, span) of the given documents of one synth_kd_v1 trio, read with megatron-core."""
    trio = open_trio(tokens_prefix)
    # copies: the arrays are views of memory maps that megatron-core closes with its IndexedDataset
    return [tuple(np.array(trio[kind][i]) for kind in (TOKENS_KIND, LOSSMASK_KIND, SPAN_KIND)) for i in indices]


def document_ids(documents_parquet: str | Path, split: str) -> list[str]:
    """synth_id of each document of `split` in a shard, in document order (shards/shard_XX_documents.parquet)."""
    frame = pl.read_parquet(documents_parquet).filter(pl.col("split") == split).sort("document_index")
    return frame["synth_id"].to_list()
