"""Synthetic synth_kd_v1 trios: contract-shaped documents written with megatron-core's builder.

For tests and for `examples/train_tiny.py --synthetic` when no real `data/megatron/synth_kd_v1`
exists yet. Each document looks like a rendered conversation as far as the supervision arrays
go: some prompt tokens, then assistant segments of the analysis or the final channel, then EOD;
the stored lossmask / span come from per-token spans through `synthkd_contract.labels`, exactly
as the real builder stores them, and the files are megatron-core IndexedDatasets named as the
contract names them (tests check each trio with `synthkd_contract.trio.validate_trio`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from synthkd_contract import constants
from synthkd_contract.labels import supervision_arrays
from synthkd_contract.manifest_seal import file_record, write_sealed
from synthkd_contract.trio import shard_tokens_prefix, trio_prefixes


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
        spans = [
            (),
            (constants.SPAN_ANALYSIS,),
            (constants.SPAN_FINAL,),
            (constants.SPAN_ANALYSIS, constants.SPAN_FINAL),
        ][int(rng.integers(0, 4))]
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
        if token_span[i] != constants.SPAN_PROMPT:
            tokens[i] = (tokens[i - 1] + 1) % token_range
    tokens[-1] = constants.EOD_TOKEN_ID
    loss_mask, span_id = supervision_arrays(token_span)
    return Document(tokens.astype(constants.TOKENS_DTYPE), loss_mask, span_id)


def write_documents(split_dir: Path, shard_index: int, documents: list[Document]) -> str:
    """Write one trio (one IndexedDataset document per Document); returns its `…_tokens` prefix."""
    if not documents:
        raise ValueError("a trio needs at least one document: megatron-core cannot map an empty .bin")
    split_dir = Path(split_dir)
    split_dir.mkdir(parents=True, exist_ok=True)
    prefixes = trio_prefixes(split_dir, shard_index)
    builders = {
        kind: IndexedDatasetBuilder(f"{prefix}.bin", dtype=constants.ARRAY_DTYPES[kind])
        for kind, prefix in prefixes.items()
    }
    for document in documents:
        for kind, array in zip(constants.ARRAY_KINDS, (document.tokens, document.loss_mask, document.span_id)):
            builders[kind].add_document(array, [len(array)])
    for kind, builder in builders.items():
        builder.finalize(f"{prefixes[kind]}.idx")
    return str(shard_tokens_prefix(split_dir, shard_index))


def write_synthetic_split(
    split_dir: Path, *, shards: int = 2, documents_per_shard: int = 40, seed: int = 0, **document_kwargs
) -> dict[str, list[Document]]:
    """Write `shards` synthetic trios into `split_dir`; returns tokens prefix -> its documents."""
    rng = np.random.default_rng(seed)
    written = {}
    for shard in range(shards):
        documents = [synthetic_document(rng, **document_kwargs) for _ in range(documents_per_shard)]
        written[write_documents(split_dir, shard, documents)] = documents
    return written


def write_synthetic_dataset(root: Path, seed: int) -> Path:
    """A small synth_kd_v1-shaped root (train: 2 shards x 60 documents, valid: 1 x 20) for the CPU examples,
    with a sealed manifest listing its files, as a build's (what `train_valid_datasets` requires)."""
    write_synthetic_split(root / "train", shards=2, documents_per_shard=60, seed=seed)
    write_synthetic_split(root / "valid", shards=1, documents_per_shard=20, seed=seed + 1)
    # the splits' files only: a --work-dir used again already holds this root's manifest and its sidecar
    files = [file_record(root, path) for split in constants.SPLITS for path in sorted((root / split).iterdir())]
    write_sealed(
        root / constants.MANIFEST_FILENAME, {"dataset": constants.SYNTHETIC_DATASET_NAME, "seed": seed, "files": files}
    )
    return root
