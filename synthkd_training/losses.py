"""Span-normalized CE / KD losses (000 "Training losses").

    L = w_r * mean(loss | span_id = 1) + w_f * mean(loss | span_id = 2)

`loss` is a per-token loss: cross-entropy against the labels (stage 1, CE) or a KL divergence
between teacher and student next-token distributions over the same tokens (stage 2, KD; stage 3,
OPD: the same call on student-generated sequences with the teacher's logits over them). Tokens
with span_id 0 (prompt, EOD, padding) never contribute, to the value nor to the gradient. A span
with no token in the batch contributes 0 and is reported with count 0 and loss 0 (never NaN).

Every call returns a `SpanLossResult` carrying what 000 says must always be logged: per-span token
counts, per-span loss values and the effective weights.

Logits are `[..., V]` with `V` the (padded) vocabulary width, or this rank's `V / tp` slice when
Megatron's tensor-parallel vocab split is active; `labels` / `span_id` are `[...]` in the same
layout (Megatron's GPTModel returns `[b, s, V]` logits when called without labels, matching the
dataset's `[b, s]` `labels` / `span_id`). Columns with id >= `vocab_size_valid` are padding and
get no probability, in the student and in the teacher.

With megatron-core's parallel state initialized over more than one tensor-parallel rank, CE goes
through `megatron.core.tensor_parallel.vocab_parallel_cross_entropy` and KD through the same
vocab-parallel reductions (max / sum-exp / KL terms all-reduced over the tensor-parallel group);
otherwise (no parallel state, or one tensor-parallel rank) both are plain torch. Reductions run in
float32 (float64 stays float64 on the plain path).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch.utils.checkpoint import checkpoint

from synthkd_contract import constants

SUPERVISED_SPANS = {constants.SPAN_ANALYSIS: "analysis", constants.SPAN_FINAL: "final"}
KDDivergence = Literal["forward", "reverse", "mix"]


@dataclass(frozen=True)
class SpanLossConfig:
    """Weights and options of the span-normalized loss; the defaults are 000's locked values."""

    w_reasoning: float = 1.0
    """w_r: weight of the mean loss over span_id == 1 (assistant analysis channel)."""

    w_final: float = 1.0
    """w_f: weight of the mean loss over span_id == 2 (assistant final channel)."""

    vocab_size_valid: int = constants.PADDED_VOCAB_SIZE
    """Number of real token ids: logit columns [vocab_size_valid, V) are padding and are excluded
    from every softmax (student and teacher). o200k_harmony defines all 201088 ids (mergeable
    ranks < 199998, special/reserved tokens 199998..201087), so by default nothing is excluded at
    V = 201088; a wider V (Megatron pads the vocab to a multiple of
    make_vocab_size_divisible_by * TP, e.g. 201216 at TP=2) gets its extra columns excluded."""

    kd_divergence: KDDivergence = "forward"
    """KD per-token loss: "forward" KL(teacher || student), "reverse" KL(student || teacher), or
    "mix" = kd_forward_weight * forward + (1 - kd_forward_weight) * reverse."""

    kd_temperature: float = 1.0
    """Both distributions are softmax(logits / kd_temperature)."""

    kd_forward_weight: float = 0.5
    """Weight of the forward KL when kd_divergence == "mix" (in [0, 1])."""

    kd_scale_by_temperature_squared: bool = True
    """Multiply the KD per-token loss by kd_temperature ** 2 (Hinton et al.), which keeps gradient
    magnitudes comparable across temperatures; a no-op at temperature 1."""

    def __post_init__(self) -> None:
        for name in ("w_reasoning", "w_final"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.vocab_size_valid < 1:
            raise ValueError(f"vocab_size_valid must be positive, got {self.vocab_size_valid}")
        if self.kd_divergence not in ("forward", "reverse", "mix"):
            raise ValueError(f"kd_divergence must be 'forward', 'reverse' or 'mix', got {self.kd_divergence!r}")
        if not (math.isfinite(self.kd_temperature) and self.kd_temperature > 0):
            raise ValueError(f"kd_temperature must be finite and > 0, got {self.kd_temperature}")
        if not 0.0 <= self.kd_forward_weight <= 1.0:
            raise ValueError(f"kd_forward_weight must be in [0, 1], got {self.kd_forward_weight}")

    @property
    def span_weights(self) -> dict[int, float]:
        return {constants.SPAN_ANALYSIS: self.w_reasoning, constants.SPAN_FINAL: self.w_final}


@dataclass(frozen=True)
class SpanLossResult:
    """The loss and what must always be logged with it. All tensors but `loss` are detached."""

    loss: torch.Tensor
    """Scalar: sum over spans of effective weight * mean per-token loss; differentiable."""

    token_counts: dict[str, torch.Tensor]
    """"prompt" / "analysis" / "final" -> number of positions with that span_id (int64 scalars);
    prompt positions are the ignored ones."""

    span_losses: dict[str, torch.Tensor]
    """"analysis" / "final" -> mean per-token loss over that span (0 when the span is empty)."""

    span_loss_sums: dict[str, torch.Tensor]
    """"analysis" / "final" -> sum of per-token losses over that span: with `token_counts`, what a
    caller all-reduces to normalize over a whole data-parallel / accumulated batch."""

    effective_weights: dict[str, torch.Tensor]
    """"analysis" / "final" -> the weight that span actually got: its configured weight, or 0 when
    it had no token in the batch."""

    def log_dict(self, prefix: str = "") -> dict[str, float]:
        """Flat floats for a logger (synchronizes with the device)."""
        out = {f"{prefix}loss": float(self.loss.detach())}
        for name, value in self.token_counts.items():
            out[f"{prefix}{name}/tokens"] = int(value)
        for name in SUPERVISED_SPANS.values():
            out[f"{prefix}{name}/loss"] = float(self.span_losses[name])
            out[f"{prefix}{name}/weight"] = float(self.effective_weights[name])
        return out

    def per_span_mean(self) -> float:
        """L divided by the sum of the effective weights: the weighted mean of the per-span losses (NaN when no
        span had a token). L itself roughly doubles when a batch holds both spans instead of one, so compare
        steps by this figure (synchronizes with the device)."""
        weight = sum(float(w) for w in self.effective_weights.values())
        return float(self.loss.detach()) / weight if weight > 0 else math.nan

    def describe_spans(self, kind: str = "") -> str:
        """One console line's span part: `analysis[ kind] loss (n=count, w=weight) | final ...`."""
        label = f" {kind}" if kind else ""
        return " | ".join(
            f"{name}{label} {self.span_losses[name].item():.3f} (n={int(self.token_counts[name])}, "
            f"w={self.effective_weights[name].item():g})"
            for name in SUPERVISED_SPANS.values()
        )


# -- the span-normalized reduction ------------------------------------------------------------
def span_normalized_loss(
    per_token_loss: torch.Tensor, span_id: torch.Tensor, config: SpanLossConfig = SpanLossConfig()
) -> SpanLossResult:
    """Reduce any per-token loss `[...]` with `span_id` `[...]` (0 / 1 / 2) to 000's L.

    Positions with span_id 0 are excluded with `torch.where`, so their per-token loss (even inf or
    NaN) reaches neither L nor its gradient. Also usable on the per-token CE that Megatron's GPTModel
    returns when called with `labels`.
    """
    if per_token_loss.shape != span_id.shape:
        raise ValueError(
            f"per_token_loss {tuple(per_token_loss.shape)} and span_id {tuple(span_id.shape)} differ in shape"
        )
    if span_id.dtype.is_floating_point or span_id.dtype == torch.bool:
        raise TypeError(f"span_id must be an integer tensor, got {span_id.dtype}")
    span_id = span_id.to(per_token_loss.device)
    zero = per_token_loss.new_zeros(())
    loss = zero
    counts = {"prompt": (span_id == constants.SPAN_PROMPT).sum()}
    means, sums, weights = {}, {}, {}
    for sid, name in SUPERVISED_SPANS.items():
        in_span = span_id == sid
        count = in_span.sum()
        total = torch.where(in_span, per_token_loss, zero).sum()
        mean = total / count.clamp(min=1).to(per_token_loss.dtype)  # 0 / 1 = 0 for an empty span
        weight = config.span_weights[sid]
        loss = loss + weight * mean
        counts[name] = count.detach()
        means[name], sums[name] = mean.detach(), total.detach()
        weights[name] = (count > 0).to(per_token_loss.dtype) * weight
    return SpanLossResult(loss, counts, means, sums, weights)


# -- per-token losses -------------------------------------------------------------------------
def _use_tensor_parallel(tensor_parallel: bool | None) -> bool:
    """`tensor_parallel` as given; None: whether megatron-core's parallel state splits the vocabulary over more
    than one tensor-parallel rank (with one rank, the plain path's fused log-softmax computes the same loss in one
    pass instead of the vocab-parallel max / sum-exp / log passes)."""
    if tensor_parallel is not None:
        return tensor_parallel
    from megatron.core import parallel_state

    return parallel_state.model_parallel_is_initialized() and parallel_state.get_tensor_model_parallel_world_size() > 1


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    return torch.promote_types(logits.dtype, torch.float32)


def _local_valid_columns(partition: int, vocab_size_valid: int, tensor_parallel: bool) -> int:
    """How many of this rank's logit columns are real token ids."""
    if not tensor_parallel:
        return min(partition, vocab_size_valid)
    from megatron.core import parallel_state

    start = parallel_state.get_tensor_model_parallel_rank() * partition
    return max(0, min(partition, vocab_size_valid - start))


def per_token_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_size_valid: int = constants.PADDED_VOCAB_SIZE,
    tensor_parallel: bool | None = None,
) -> torch.Tensor:
    """-log softmax(logits)[label] at every position, padding columns excluded from the softmax.

    `tensor_parallel` None: Megatron's vocab-parallel CE when its parallel state splits the vocabulary over more
    than one tensor-parallel rank (then `logits` is this rank's vocab slice), plain torch otherwise. `logits` is
    never modified.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not match")
    tp = _use_tensor_parallel(tensor_parallel)
    valid = _local_valid_columns(logits.shape[-1], vocab_size_valid, tp)
    labels = labels.long()
    if tp:
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        # megatron's CE works in place on float32 logits: always hand it a private copy
        work = logits.float().clone() if logits.dtype == torch.float32 else logits.float()
        if valid < logits.shape[-1]:
            work[..., valid:] = float("-inf")
        return vocab_parallel_cross_entropy(work, labels)
    log_probs = torch.log_softmax(logits[..., :valid].to(_compute_dtype(logits)), dim=-1)
    return -log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)


def _log_softmax_vocab_parallel(x: torch.Tensor, differentiable: bool) -> torch.Tensor:
    """log softmax over the full (tensor-parallel split) vocab of this rank's columns `x`."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        reduce_from_tensor_model_parallel_region,
    )

    group = parallel_state.get_tensor_model_parallel_group()
    with torch.no_grad():
        if x.shape[-1]:
            row_max = x.max(dim=-1).values
        else:  # every column of this rank is padding
            row_max = x.new_full(x.shape[:-1], float("-inf"))
        torch.distributed.all_reduce(row_max, op=torch.distributed.ReduceOp.MAX, group=group)
    local_sum = torch.exp(x - row_max.unsqueeze(-1)).sum(dim=-1)
    if differentiable:
        # forward: all-reduce. backward: all-reduce too. The log-normalizer is shared by every
        # rank's columns, and the KL terms that use it are rank-local (summed by an identity-backward
        # reduce at the end), so its gradient is the sum of the ranks' contributions.
        total = copy_to_tensor_model_parallel_region(reduce_from_tensor_model_parallel_region(local_sum.contiguous()))
    else:
        total = local_sum.contiguous()
        torch.distributed.all_reduce(total, group=group)
    return x - (row_max + torch.log(total)).unsqueeze(-1)


def per_token_kd(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    *,
    config: SpanLossConfig = SpanLossConfig(),
    tensor_parallel: bool | None = None,
) -> torch.Tensor:
    """Per-position KL divergence between teacher and student next-token distributions.

    Both are softmax(logits / T) over the real ids only; the divergence is chosen by
    `config.kd_divergence`. The teacher is a constant (detached). Both tensors have the same shape
    (under tensor parallelism: this rank's vocab slice of each).
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits {tuple(teacher_logits.shape)} "
            "differ in shape"
        )
    tp = _use_tensor_parallel(tensor_parallel)
    valid = _local_valid_columns(student_logits.shape[-1], config.vocab_size_valid, tp)
    dtype = _compute_dtype(student_logits)
    student = student_logits[..., :valid].to(dtype) / config.kd_temperature
    teacher = teacher_logits.detach()[..., :valid].to(dtype) / config.kd_temperature
    if tp:
        log_p_student = _log_softmax_vocab_parallel(student, differentiable=True)
        log_p_teacher = _log_softmax_vocab_parallel(teacher, differentiable=False)
    else:
        log_p_student = torch.log_softmax(student, dim=-1)
        log_p_teacher = torch.log_softmax(teacher, dim=-1)

    def reduce_vocab(terms: torch.Tensor) -> torch.Tensor:
        local = terms.sum(dim=-1)
        if not tp:
            return local
        from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

        return reduce_from_tensor_model_parallel_region(local.contiguous())

    per_token = student.new_zeros(student.shape[:-1])
    if config.kd_divergence in ("forward", "mix"):
        forward = reduce_vocab(log_p_teacher.exp() * (log_p_teacher - log_p_student))
        per_token = per_token + (config.kd_forward_weight if config.kd_divergence == "mix" else 1.0) * forward
    if config.kd_divergence in ("reverse", "mix"):
        reverse = reduce_vocab(log_p_student.exp() * (log_p_student - log_p_teacher))
        per_token = per_token + (1.0 - config.kd_forward_weight if config.kd_divergence == "mix" else 1.0) * reverse
    if config.kd_scale_by_temperature_squared:
        per_token = per_token * config.kd_temperature**2
    return per_token


# -- the two losses ---------------------------------------------------------------------------
CHUNK_POSITIONS = 256
"""Positions whose vocab-wide terms (logits, log-softmax, probabilities, KL terms) exist at once: a 2048-position
window of a 201,088-id vocab holds 1.6 GB per such tensor. Each chunk's terms are recomputed in the backward pass
(activation checkpointing, as Megatron recomputes activations; under tensor parallelism every rank runs the same
chunks, so their collectives pair up) instead of kept; the values are the same, row by row."""


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


@dataclass(frozen=True)
class HeadedLogits:
    """A model's logits `[..., V]` kept as what makes them: the hidden states `[..., h]` its output layer takes and
    that layer (`head`, `[n, h] -> [n, V]`). The losses apply the head to CHUNK_POSITIONS positions at a time, inside
    each chunk's checkpoint, so a long window's logits never exist whole: an 8192-position window of a 201,088-id
    vocab is 6.6 GB of float32 logits per model, and as many again for their gradient
    (docs/distillation.md#long-windows). `models.forward_headed` makes them."""

    hidden: torch.Tensor
    head: Callable[[torch.Tensor], torch.Tensor] = _same

    @property
    def shape(self) -> torch.Size:
        """The logits' shape: the hidden states' leading dims and the head's width (one position's logits made)."""
        with torch.no_grad():
            width = self.head(self.hidden.reshape(-1, self.hidden.shape[-1])[:1]).shape[-1]
        return torch.Size((*self.hidden.shape[:-1], width))

    @property
    def device(self) -> torch.device:
        return self.hidden.device

    def logits(self) -> torch.Tensor:
        """The whole logits tensor (what the model would have returned)."""
        return self.head(self.hidden)


Logits = torch.Tensor | HeadedLogits
"""Logits whole, or as hidden states and the output layer that makes them (`HeadedLogits`)."""


def _headed(logits: Logits) -> HeadedLogits:
    return logits if isinstance(logits, HeadedLogits) else HeadedLogits(logits)


def _by_position_chunks(per_token, logits: Sequence[Logits], rest: Sequence[torch.Tensor]) -> torch.Tensor:
    """`per_token(*logits, *rest)` computed over chunks of CHUNK_POSITIONS positions (the logits' leading dims
    flattened; `rest` has those dims only), each chunk's logits made from its hidden states by their head there
    (`HeadedLogits`), each chunk checkpointed when it needs a gradient."""
    sources = [_headed(x) for x in logits]
    heads = [source.head for source in sources]

    def chunk_terms(*tensors: torch.Tensor) -> torch.Tensor:
        return per_token(*(head(h) for head, h in zip(heads, tensors)), *tensors[len(heads) :])

    shape = sources[0].hidden.shape[:-1]
    flat_hidden = [x.hidden.reshape(-1, x.hidden.shape[-1]) for x in sources]
    flat_rest = [x.reshape(-1) for x in rest]
    count = flat_hidden[0].shape[0]
    if count <= CHUNK_POSITIONS:
        return chunk_terms(*(x.hidden for x in sources), *rest)
    parts = []
    for start in range(0, count, CHUNK_POSITIONS):
        chunk = [x[start : start + CHUNK_POSITIONS] for x in (*flat_hidden, *flat_rest)]
        if torch.is_grad_enabled():  # a head's weights may need a gradient when its hidden states do not
            parts.append(checkpoint(chunk_terms, *chunk, use_reentrant=False))
        else:
            parts.append(chunk_terms(*chunk))
    return torch.cat(parts).reshape(shape)


def _check_span_shape(span_id: torch.Tensor, logits: Logits) -> None:
    if logits.shape[:-1] != span_id.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and span_id {tuple(span_id.shape)} do not match")


def span_ce_loss(
    logits: Logits,
    labels: torch.Tensor,
    span_id: torch.Tensor,
    config: SpanLossConfig = SpanLossConfig(),
    *,
    tensor_parallel: bool | None = None,
) -> SpanLossResult:
    """Stage 1: span-normalized cross-entropy of `logits` `[..., V]` (whole or `HeadedLogits`) against `labels`
    `[...]`."""
    _check_span_shape(span_id, logits)
    span_id = span_id.to(logits.device)
    # labels where nothing is learned (padding: Megatron maps them to 0, or anything else) are
    # made a harmless 0 so they can never produce an inf that a zero gradient would turn into NaN
    safe_labels = torch.where(span_id != constants.SPAN_PROMPT, labels.to(logits.device).long(), 0)

    def per_token_ce(chunk: torch.Tensor, chunk_labels: torch.Tensor) -> torch.Tensor:
        return per_token_cross_entropy(
            chunk, chunk_labels, vocab_size_valid=config.vocab_size_valid, tensor_parallel=tensor_parallel
        )

    per_token = _by_position_chunks(per_token_ce, [logits], [safe_labels])
    return span_normalized_loss(per_token, span_id, config)


def span_kd_loss(
    student_logits: Logits,
    teacher_logits: Logits,
    span_id: torch.Tensor,
    config: SpanLossConfig = SpanLossConfig(),
    *,
    tensor_parallel: bool | None = None,
) -> SpanLossResult:
    """Stages 2 and 3: span-normalized KD of the student towards the teacher over the same tokens (either's logits
    whole or `HeadedLogits`)."""
    _check_span_shape(span_id, student_logits)

    def per_token_kd_of(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        return per_token_kd(student, teacher, config=config, tensor_parallel=tensor_parallel)

    if student_logits.shape != teacher_logits.shape:
        per_token = per_token_kd_of(student_logits, teacher_logits)  # per_token_kd names the mismatch first
    else:
        per_token = _by_position_chunks(per_token_kd_of, [student_logits, teacher_logits], [])
    return span_normalized_loss(per_token, span_id.to(per_token.device), config)
