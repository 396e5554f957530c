"""Synthetic synth_kd_v1 trios: contract-shaped documents written with the project's own writer.

For tests and for `examples/train_tiny.py --synthetic` when no real `data/megatron/synth_kd_v1`
exists yet. Each document looks like a rendered conversation as far as the supervision arrays
go: some prompt tokens, then assistant segments of the analysis or the final channel, then EOD;
the stored lossmask / span are label-aligned (position i describes token i+1, the EOD position
is 0/0), exactly as the real builder stores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from synthkd_assets import contracts
from synthkd_assets.core.megatron_io import MegatronShardWriter


@dataclass(frozen=True)
class Document:
    """One conversation: the three label-aligned arrays the writer stores."""

    tokens: np.ndarray
    loss_mask: np.ndarray
    span_id: np.ndarray


def synthetic_document(
    rng: np.random.Generator,
    *,
    min_tokens: int = 3,
    max_tokens: int = 60,
    token_range: int = 1000,
    spans: tuple[int, ...] | None = None,
) -> Document:
    """A random document of min_tokens..max_tokens tokens (EOD included).

    `spans`: which assistant channels appear (e.g. (1,), (2,), (1, 2), ()); random when None.
    Token ids are drawn from [0, token_range) (never EOD); assistant tokens follow a learnable
    pattern (each is the previous token + 1 modulo token_range) so a tiny model's loss can drop.
    """
    n = int(rng.integers(min_tokens, max_tokens + 1))
    body = n - 1  # the last token is EOD
    if spans is None:
        spans = [(), (contracts.SPAN_ANALYSIS,), (contracts.SPAN_FINAL,), (contracts.SPAN_ANALYSIS, contracts.SPAN_FINAL)][
            int(rng.integers(0, 4))
        ]
    token_span = np.zeros(n, dtype=np.int64)  # span of each *token*
    prompt = int(rng.integers(1, max(2, body // 2 + 1))) if spans else body
    prompt = min(prompt, body)
    cursor = prompt
    for position, span in enumerate(spans):
        remaining = body - cursor
        if remaining <= 0:
            break
        length = remaining if position == len(spans) - 1 else int(rng.integers(1, remaining + 1))
        token_span[cursor : cursor + length] = span
        cursor += length
    tokens = rng.integers(0, token_range, size=n).astype(np.int64)
    for i in range(1, body):
        if token_span[i] != contracts.SPAN_PROMPT:
            tokens[i] = (tokens[i - 1] + 1) % token_range
    tokens[-1] = contracts.EOD_TOKEN_ID
    # label alignment: stored[i] describes token i+1; the EOD position (last) is 0/0
    span_id = np.zeros(n, dtype=np.int64)
    span_id[:-1] = token_span[1:]
    loss_mask = (span_id != contracts.SPAN_PROMPT).astype(np.int64)
    return Document(
        tokens.astype(contracts.TOKENS_DTYPE),
        loss_mask.astype(contracts.LOSSMASK_DTYPE),
        span_id.astype(contracts.SPAN_DTYPE),
    )


def write_documents(split_dir: Path, shard_index: int, documents: list[Document], split: str = "train") -> str:
    """Write one trio with MegatronShardWriter; returns its `…_tokens` prefix."""
    with MegatronShardWriter(Path(split_dir), shard_index, split) as writer:
        for document in documents:
            writer.add(document.tokens, document.loss_mask, document.span_id)
        writer.commit()
    return str(Path(split_dir) / contracts.shard_prefix_name(shard_index, contracts.ARRAY_KINDS[0]))


def write_synthetic_split(
    split_dir: Path, *, shards: int = 2, documents_per_shard: int = 40, seed: int = 0, split: str = "train", **document_kwargs
) -> dict[str, list[Document]]:
    """Write `shards` synthetic trios into `split_dir`; returns tokens prefix -> its documents."""
    rng = np.random.default_rng(seed)
    written = {}
    for shard in range(shards):
        documents = [synthetic_document(rng, **document_kwargs) for _ in range(documents_per_shard)]
        written[write_documents(split_dir, shard, documents, split)] = documents
    return written
