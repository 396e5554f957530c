"""synthkd_training: train on synth_kd_v1 with Megatron-Core; imports synthkd_contract, never dagster or synthkd_assets.

- `SpanGPTDataset` / `SpanGPTDatasetConfig` / `build_span_datasets`: megatron-core GPT dataset over
  the tokens / lossmask / span trio, items carrying label-aligned `loss_mask` and `span_id`.
- `span_ce_loss` / `span_kd_loss` / `span_normalized_loss`: 000's span-normalized losses, returning a
  `SpanLossResult` with the per-span counts, losses and effective weights to log.
"""

from synthkd_training.dataset import (
    O200kHarmonyIds,
    SpanDatasetError,
    SpanGPTDataset,
    SpanGPTDatasetConfig,
    build_span_datasets,
    tokens_prefixes,
)
from synthkd_training.losses import (
    SpanLossConfig,
    SpanLossResult,
    per_token_cross_entropy,
    per_token_kd,
    span_ce_loss,
    span_kd_loss,
    span_normalized_loss,
)

__all__ = [
    "O200kHarmonyIds",
    "SpanDatasetError",
    "SpanGPTDataset",
    "SpanGPTDatasetConfig",
    "SpanLossConfig",
    "SpanLossResult",
    "build_span_datasets",
    "per_token_cross_entropy",
    "per_token_kd",
    "span_ce_loss",
    "span_kd_loss",
    "span_normalized_loss",
    "tokens_prefixes",
]
