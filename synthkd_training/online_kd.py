"""Online, teacher-forced knowledge distillation (docs/distillation.md#online-kd).

The teacher and the student forward the same `input_ids` (a `SpanGPTDataset` batch); the teacher is frozen and
never generates; the student is updated with 000's span-normalized KD loss (`span_kd_loss`: forward, reverse or
mixed KL at a temperature) plus, optionally, `ce_weight` times the span-normalized CE on the data's own tokens:

    L = KD(student, teacher | span_id) + ce_weight * CE(student, labels | span_id)

Progress is measured by `heldout_kl`: the mean, over every supervised token (span_id 1 or 2) of a fixed held-out
slice, of KL(teacher || student) at temperature 1, whatever divergence and temperature the training uses, so runs
with different settings compare on one scale.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from synthkd_contract import constants
from synthkd_training.losses import HeadedLogits, SpanLossConfig, SpanLossResult, span_ce_loss, span_kd_loss
from synthkd_training.models import forward_headed

Batch = dict[str, torch.Tensor]

HELDOUT_METRIC = SpanLossConfig(kd_divergence="forward", kd_temperature=1.0)
"""The held-out metric's loss settings: forward KL(teacher || student) at temperature 1 (weights unused)."""


@dataclass(frozen=True)
class OnlineKDConfig:
    """How the student learns from the teacher."""

    loss: SpanLossConfig = field(default_factory=SpanLossConfig)
    """Span weights w_r / w_f and the KD divergence, temperature and mix weight."""

    ce_weight: float = 0.0
    """Weight of the span-normalized CE on the data's tokens added to the KD loss (0: pure KD)."""

    lr: float = 3e-3
    weight_decay: float = 0.0

    autocast_dtype: torch.dtype | None = None
    """Run the forwards under torch.autocast in this dtype (torch.bfloat16 on CUDA); the losses reduce in float32
    whatever the logits' dtype (losses.py). None: the models' own dtype."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.ce_weight) and self.ce_weight >= 0):
            raise ValueError(f"ce_weight must be finite and >= 0, got {self.ce_weight}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be finite and > 0, got {self.lr}")


@dataclass(frozen=True)
class KDStep:
    """One update: the loss that was minimized and its parts, with what 000 says must be logged."""

    loss: float
    kd: SpanLossResult
    ce: SpanLossResult | None

    def log_dict(self) -> dict[str, float]:
        out = {"loss": self.loss, **self.kd.log_dict("kd/")}
        if self.ce is not None:
            out.update(self.ce.log_dict("ce/"))
        return out


@dataclass(frozen=True)
class HeldoutKL:
    """KL(teacher || student) per supervised token over a held-out slice, overall and per span."""

    kl: float
    tokens: int
    per_span: dict[str, float]
    span_tokens: dict[str, int]


def freeze(teacher: torch.nn.Module) -> torch.nn.Module:
    """Eval mode and no gradients: the teacher is a constant of the student's loss."""
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher


def _autocast(batch: Batch, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=batch["tokens"].device.type, dtype=dtype)


def _head_in_context(headed: HeadedLogits, batch: Batch, autocast_dtype: torch.dtype | None, frozen: bool):
    """`headed` whose head runs as its forward did (under its autocast; without gradient for the frozen teacher),
    wherever the losses call it."""

    def head(states: torch.Tensor) -> torch.Tensor:
        with torch.no_grad() if frozen else contextlib.nullcontext(), _autocast(batch, autocast_dtype):
            return headed.head(states)

    return HeadedLogits(headed.hidden, head)


def teacher_logits(teacher: torch.nn.Module, batch: Batch, autocast_dtype: torch.dtype | None = None) -> HeadedLogits:
    """The frozen teacher's logits of `batch` (`HeadedLogits`: the losses make them chunk by chunk)."""
    with torch.no_grad(), _autocast(batch, autocast_dtype):
        return _head_in_context(forward_headed(teacher, batch), batch, autocast_dtype, frozen=True)


def student_logits(student: torch.nn.Module, batch: Batch, autocast_dtype: torch.dtype | None = None) -> HeadedLogits:
    """The student's logits of `batch` (`HeadedLogits`, differentiable)."""
    with _autocast(batch, autocast_dtype):
        return _head_in_context(forward_headed(student, batch), batch, autocast_dtype, frozen=False)


def _check_vocab(student_logits: HeadedLogits, teacher_logits_: HeadedLogits) -> None:
    if student_logits.shape != teacher_logits_.shape:
        raise ValueError(
            f"student logits {tuple(student_logits.shape)} and teacher logits {tuple(teacher_logits_.shape)} "
            "differ: teacher and student must share the tokenizer's (padded) vocabulary and see the same batch"
        )


def kd_objective(
    student: torch.nn.Module, teacher: torch.nn.Module, batch: Batch, config: OnlineKDConfig
) -> tuple[torch.Tensor, SpanLossResult, SpanLossResult | None]:
    """The differentiable loss of one batch, with its KD and (when ce_weight > 0) CE parts."""
    target = teacher_logits(teacher, batch, config.autocast_dtype)
    logits = student_logits(student, batch, config.autocast_dtype)
    _check_vocab(logits, target)
    kd = span_kd_loss(logits, target, batch["span_id"], config.loss)
    loss = kd.loss
    ce = None
    if config.ce_weight > 0:
        ce = span_ce_loss(logits, batch["labels"], batch["span_id"], config.loss)
        loss = loss + config.ce_weight * ce.loss
    return loss, kd, ce


def make_optimizer(student: torch.nn.Module, config: OnlineKDConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(student.parameters(), lr=config.lr, weight_decay=config.weight_decay)


def kd_step(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    batch: Batch,
    optimizer: torch.optim.Optimizer,
    config: OnlineKDConfig,
) -> KDStep:
    """One teacher-forced update of the student (the teacher's weights are never touched)."""
    student.train()
    loss, kd, ce = kd_objective(student, teacher, batch, config)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return KDStep(float(loss.detach()), kd, ce)


def heldout_kl(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    batches: Sequence[Batch],
    autocast_dtype: torch.dtype | None = None,
) -> HeldoutKL:
    """Mean KL(teacher || student) at temperature 1 over every supervised token of `batches`."""
    was_training = student.training
    student.eval()
    sums = {name: 0.0 for name in ("analysis", "final")}
    counts = {name: 0 for name in ("analysis", "final")}
    with torch.no_grad():
        for batch in batches:
            result = span_kd_loss(
                student_logits(student, batch, autocast_dtype),
                teacher_logits(teacher, batch, autocast_dtype),
                batch["span_id"],
                HELDOUT_METRIC,
            )
            for name in sums:
                sums[name] += float(result.span_loss_sums[name])
                counts[name] += int(result.token_counts[name])
    student.train(was_training)
    tokens = sum(counts.values())
    if tokens == 0:
        raise ValueError("the held-out slice has no supervised token (span_id 1 or 2): nothing to measure")
    per_span = {name: sums[name] / counts[name] if counts[name] else 0.0 for name in sums}
    return HeldoutKL(sum(sums.values()) / tokens, tokens, per_span, counts)


def supervised_tokens(batch: Batch) -> int:
    """Positions a KD update learns from: span_id analysis or final."""
    return int((batch["span_id"] != constants.SPAN_PROMPT).sum())


@dataclass
class OnlineKDSummary:
    steps: list[dict[str, float]]
    heldout_before: HeldoutKL
    heldout_after: HeldoutKL
    heldout_trace: list[tuple[int, float]]

    @property
    def kl_fell(self) -> bool:
        return math.isfinite(self.heldout_after.kl) and self.heldout_after.kl < self.heldout_before.kl


def train_online_kd(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    batches: Iterable[Batch],
    heldout: Sequence[Batch],
    config: OnlineKDConfig,
    *,
    steps: int,
    eval_every: int = 0,
    eval_at: Collection[int] = (),
    log: Callable[[int, KDStep], None] | None = None,
    after_step: Callable[[int, torch.optim.Optimizer], None] | None = None,
) -> OnlineKDSummary:
    """`steps` KD updates of `student` on `batches`, with the held-out KL before, every `eval_every` steps, after
    the steps of `eval_at` (a curriculum's stage ends) and after. `after_step(step, optimizer)` runs after each update
    (the learning-progress labels hook in there)."""
    freeze(teacher)
    optimizer = make_optimizer(student, config)
    before = heldout_kl(student, teacher, heldout, config.autocast_dtype)
    trace = [(0, before.kl)]
    logged: list[dict[str, float]] = []
    iterator = iter(batches)
    for step in range(1, steps + 1):
        result = kd_step(student, teacher, next(iterator), optimizer, config)
        logged.append(result.log_dict())
        if log is not None:
            log(step, result)
        if after_step is not None:
            after_step(step, optimizer)
        if ((eval_every and step % eval_every == 0) or step in eval_at) and step != steps:
            trace.append((step, heldout_kl(student, teacher, heldout, config.autocast_dtype).kl))
    after = heldout_kl(student, teacher, heldout, config.autocast_dtype)
    trace.append((steps, after.kl))
    return OnlineKDSummary(logged, before, after, trace)
