"""Learning-progress labels (docs/distillation.md#learning-progress-labels): how much one candidate batch improves the
student, relative to what a fixed reference set improves it at the same student state.

One round (one call of `learning_progress_labels`, at one training step) labels a fixed reference set, then the
candidates. For each of them:

1. snapshot the student's parameters and buffers;
2. run `k_updates` KD updates (`online_kd.kd_step`, a fresh optimizer seeded from `seed` and the item's key)
   on its batches, cycling through them;
3. measure the held-out KL(teacher || student) again (`online_kd.heldout_kl`) and set
   `lp_raw = (kl_before - kl_after) / tokens_used`, `tokens_used` being the supervised tokens the k updates
   learned from;
4. restore the snapshot and verify, tensor by tensor, that the student is bit for bit what it was (a label that
   left the student changed would bias every later label; that is an error, never a warning).

`lp_raw` depends on the student's state as much as on the batch: it drifts from round to round as the student
trains. The references are the same batches in every round, so their mean `lp_raw` measures that drift, and
`lp_value = lp_raw / reference_lp_raw - 1` (how much more per supervised token the item teaches than the
references, 0.05 = 5 % more) is comparable across rounds; it is the value the scorer trains on.

Labels are deterministic: the same student, teacher, items and seed give the same values. `LPCadence`
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


class ReferencesMadeNoProgressError(RuntimeError):
    """The reference set's mean `lp_raw` is not positive: a round's labels cannot be expressed relative to it."""


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
    """One item's learning progress in one round."""

    key: str
    step: int
    """The training step the round ran at: the round's id within a run."""

    reference: bool
    """One of the round's references (labelled in every round) rather than a candidate."""

    kl_before: float
    """Held-out KL(teacher || student) per supervised token before the updates (the same for the whole round)."""

    kl_after: float
    """The same after this item's `k_updates` updates."""

    tokens_used: int
    """Supervised tokens the updates learned from."""

    lp_raw: float
    """`(kl_before - kl_after) / tokens_used`: nats per supervised token at this round's student state."""

    reference_lp_raw: float
    """The mean `lp_raw` of the round's references."""

    lp_value: float
    """`lp_raw / reference_lp_raw - 1`: the progress relative to the references, comparable across rounds."""


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


@dataclass(frozen=True)
class _Measured:
    key: str
    kl_after: float
    tokens_used: int
    lp_raw: float


def _measure(student, teacher, candidate: Candidate, heldout, config: LPConfig, before: float, saved) -> _Measured:
    """`k_updates` updates on the candidate, the held-out KL after them, and the student restored."""
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
    return _Measured(candidate.key, after, tokens_used, (before - after) / tokens_used if tokens_used else 0.0)


def learning_progress_labels(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    candidates: Sequence[Candidate],
    heldout: Sequence[Batch],
    config: LPConfig,
    references: Sequence[Candidate],
    step: int = 0,
) -> list[LPLabel]:
    """Labels one round: the references, then the candidates, each relative to the references' mean progress.

    Give the same `references` in every round of a run (the same keys and batches): their mean `lp_raw` is what
    makes `lp_value` comparable between rounds. The student is left exactly as it came in (verified).

    Args:
        student: The model being distilled; updated on a snapshot, restored after every item.
        teacher: The frozen teacher.
        candidates: The items to value.
        heldout: The held-out batches the KL is measured on.
        config: The updates per item and their loss and optimizer settings.
        references: The round's reference set (at least one), labelled too (`LPLabel.reference`).
        step: The training step of the round, recorded in every label.

    Returns:
        One label per reference, then one per candidate, in the order given.

    Raises:
        ValueError: No reference, a key given twice, or an item without a batch.
        ReferencesMadeNoProgressError: The references' mean `lp_raw` is not positive (checked before any
            candidate is labelled).
        StudentNotRestoredError: The student differs from its snapshot after an item.
    """
    if not references:
        raise ValueError("learning-progress labels need at least one reference: lp_value is relative to them")
    keys = [item.key for item in (*references, *candidates)]
    if twice := sorted({key for key in keys if keys.count(key) > 1}):
        raise ValueError(f"key(s) {twice} given twice in one round (a reference is never a candidate)")
    was_training = student.training
    saved = snapshot(student)
    before = heldout_kl(student, teacher, heldout, config.kd.autocast_dtype).kl
    rng_state = torch.get_rng_state()
    try:
        measured_references = [_measure(student, teacher, r, heldout, config, before, saved) for r in references]
        reference_lp_raw = sum(m.lp_raw for m in measured_references) / len(measured_references)
        if not reference_lp_raw > 0:
            raise ReferencesMadeNoProgressError(
                f"at step {step} the {len(references)} reference(s) lowered the held-out KL by "
                f"{reference_lp_raw:.3e} nats per token on average: no progress to measure candidates against"
            )
        measured_candidates = [_measure(student, teacher, c, heldout, config, before, saved) for c in candidates]
    finally:
        restore(student, saved)
        student.train(was_training)
        torch.set_rng_state(rng_state)
    return [
        LPLabel(
            key=m.key,
            step=step,
            reference=is_reference,
            kl_before=before,
            kl_after=m.kl_after,
            tokens_used=m.tokens_used,
            lp_raw=m.lp_raw,
            reference_lp_raw=reference_lp_raw,
            lp_value=m.lp_raw / reference_lp_raw - 1,
        )
        for is_reference, group in ((True, measured_references), (False, measured_candidates))
        for m in group
    ]
