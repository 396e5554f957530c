"""Learning-progress labels (docs/distillation.md#learning-progress-labels): how much one candidate batch improves the
student.

For each candidate of a calibration subset:

1. snapshot the student's parameters and buffers;
2. run `k_updates` KD updates (`online_kd.kd_step`, a fresh optimizer seeded from `seed` and the candidate's key)
   on the candidate's batches, cycling through them;
3. measure the held-out KL(teacher || student) again (`online_kd.heldout_kl`) and set
   `lp_value = (kl_before - kl_after) / tokens_used`, `tokens_used` being the supervised tokens the k updates
   learned from;
4. restore the snapshot and verify, tensor by tensor, that the student is bit-for-bit what it was (a label that
   left the student changed would bias every later label; that is an error, never a warning).

Labels are deterministic: the same student, teacher, candidates and seed give the same values. `LPCadence`
(docs/distillation.md#learning-progress-labels) says when labels are due during training: none before `warmup_steps`,
then every `every_steps`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from synthkd_training.losses import SpanLossConfig
from synthkd_training.online_kd import Batch, OnlineKDConfig, heldout_kl, kd_step, make_optimizer, supervised_tokens


class StudentNotRestoredError(RuntimeError):
    """The student differs from its snapshot after a learning-progress label."""


@dataclass(frozen=True)
class LPConfig:
    k_updates: int = 2
    """Mini-updates per candidate (docs/distillation.md#learning-progress-labels step 2)."""

    kd: OnlineKDConfig = field(default_factory=lambda: OnlineKDConfig(loss=SpanLossConfig(), lr=1e-3))
    """The loss and optimizer settings of those updates (usually the training run's own)."""

    seed: int = 0

    def __post_init__(self) -> None:
        if self.k_updates < 1:
            raise ValueError(f"k_updates must be >= 1, got {self.k_updates}")


@dataclass(frozen=True)
class LPCadence:
    """When labels are computed during training (docs/distillation.md#learning-progress-labels)."""

    warmup_steps: int = 0
    """No labels before this step: the student is not stable yet."""

    every_steps: int = 0
    """Then every this many steps (0: never)."""

    candidates_per_round: int = 1
    """Candidates labelled each time (the calibration subset: ~1-5% of the batches)."""

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step >= self.warmup_steps and (step - self.warmup_steps) % self.every_steps == 0


@dataclass(frozen=True)
class Candidate:
    """A candidate batch (or a few) and the key its label is stored under (e.g. the conversation's synth_id)."""

    key: str
    batches: Sequence[Batch]


@dataclass(frozen=True)
class LPLabel:
    key: str
    kl_before: float
    kl_after: float
    tokens_used: int
    lp_value: float


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: value.detach().clone() for name, value in model.state_dict().items() if torch.is_tensor(value)}


def restore(model: torch.nn.Module, saved: dict[str, torch.Tensor]) -> None:
    """Copies the snapshot back in place, then proves every tensor equal to it, bit for bit."""
    current = model.state_dict()
    with torch.no_grad():
        for name, value in saved.items():
            current[name].copy_(value)
    for name, value in model.state_dict().items():
        if torch.is_tensor(value) and not torch.equal(value, saved[name]):
            raise StudentNotRestoredError(f"{name} differs from the snapshot after restoring it")


def _candidate_seed(seed: int, key: str) -> int:
    """A seed per candidate, independent of the order candidates are labelled in."""
    return int.from_bytes(hashlib.sha256(f"lp/{seed}/{key}".encode()).digest()[:8], "big") >> 1


def learning_progress_labels(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    candidates: Sequence[Candidate],
    heldout: Sequence[Batch],
    config: LPConfig,
) -> list[LPLabel]:
    """One label per candidate; the student is left exactly as it came in (verified)."""
    was_training = student.training
    saved = snapshot(student)
    before = heldout_kl(student, teacher, heldout, config.kd.autocast_dtype).kl
    labels = []
    rng_state = torch.get_rng_state()
    try:
        for candidate in candidates:
            if not candidate.batches:
                raise ValueError(f"candidate {candidate.key!r} has no batch")
            torch.manual_seed(_candidate_seed(config.seed, candidate.key))
            optimizer = make_optimizer(student, config.kd)
            tokens_used = 0
            for update in range(config.k_updates):
                batch = candidate.batches[update % len(candidate.batches)]
                kd_step(student, teacher, batch, optimizer, config.kd)
                tokens_used += supervised_tokens(batch)
            after = heldout_kl(student, teacher, heldout, config.kd.autocast_dtype).kl
            restore(student, saved)
            lp_value = (before - after) / tokens_used if tokens_used else 0.0
            labels.append(LPLabel(candidate.key, before, after, tokens_used, lp_value))
    finally:
        restore(student, saved)
        student.train(was_training)
        torch.set_rng_state(rng_state)
    return labels
