"""The model features of the valuation (docs/distillation.md#valuation-features): teacher uncertainty and
student-teacher disagreement on a short continuation window, from forward passes only (no autoregressive generation).

For a conversation `tokens` whose prompt is its first `p` tokens, the window is the first `W` tokens after the
prompt (`tokens[p:p+W]`, fewer when the conversation ends sooner), teacher-forced: each window token's
next-token distribution is the model's output at the position before it, given the data's own tokens up to
there. Per conversation:

- `teacher_entropy`: mean over the window of the teacher's entropy H(p_T) (nats);
- `teacher_margin`: mean of the teacher's top-1 minus top-2 probability;
- `student_teacher_kl`: mean of KL(p_T || p_S), `losses.per_token_kd` (forward KL, temperature 1), only when a
  student is given;
- `window_tokens`: how many window tokens the means are over (0: nothing after the prompt, features null).

Distributions are softmax over the real token ids (`vocab_size_valid`), computed in float64 from the logits.
A prompt longer than the models' context is cut from the left (the window and the prompt's end are kept).
Conversations are forwarded in their given order, `batch_size` at a time, right-padded (causal attention:
padding never reaches a real position), in eval mode under `torch.no_grad`: the same inputs give the same
numbers. The features gather full-vocabulary logits: one tensor-parallel rank (TP = 1).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from synthkd_contract import constants
from synthkd_contract.valuation import WINDOW_TOKENS_COLUMN
from synthkd_training.losses import SpanLossConfig, per_token_kd
from synthkd_training.models import load_model, megatron_world, pick_device

FeatureColumns = dict[str, list[float | int | None]]


def window_slice(length: int, prompt_tokens: int, window: int, context: int) -> tuple[int, int, int]:
    """(start, end, w): the model input is `tokens[start:end]` (at most `context` tokens) and its last `w`
    positions predict the `w` window tokens `tokens[prompt_tokens:prompt_tokens + w]`."""
    w = max(0, min(window, length - prompt_tokens, context)) if prompt_tokens >= 1 else 0
    end = prompt_tokens + w - 1
    return max(0, end - context), end, w


def causal_mask(length: int, device: torch.device) -> torch.Tensor:
    """megatron-core's attention mask convention: [1, 1, s, s], True where attention is masked out."""
    return (torch.tril(torch.ones(length, length, device=device)) < 0.5).view(1, 1, length, length)


def _window_logits(model: torch.nn.Module, inputs: list[np.ndarray], windows: list[int], device) -> list[torch.Tensor]:
    """Each input's last `w` positions of logits, as float64 [w, V]; one right-padded forward of the batch."""
    longest = max(len(x) for x in inputs)
    tokens = torch.zeros(len(inputs), longest, dtype=torch.long, device=device)
    for row, x in enumerate(inputs):
        tokens[row, : len(x)] = torch.as_tensor(x.astype(np.int64), device=device)
    positions = torch.arange(longest, device=device).unsqueeze(0).expand(len(inputs), -1)
    logits = model(tokens, positions, causal_mask(longest, device))
    return [logits[row, len(x) - w : len(x)].double() for row, (x, w) in enumerate(zip(inputs, windows))]


def window_features(
    teacher: torch.nn.Module,
    student: torch.nn.Module | None,
    sequences: Sequence[np.ndarray],
    prompt_tokens: Sequence[int],
    *,
    window: int,
    context: int,
    batch_size: int = 4,
    vocab_size_valid: int = constants.PADDED_VOCAB_SIZE,
    device: torch.device | None = None,
) -> FeatureColumns:
    """The model features of every conversation, in order (see the module docstring). `teacher` / `student`:
    modules called as `model(tokens, position_ids, attention_mask) -> [b, s, V]` (megatron-core's GPTModel);
    `context`: the most tokens one forward may take (the smaller model's)."""
    if window < 1 or context < 1 or batch_size < 1:
        raise ValueError(f"window {window}, context {context} and batch_size {batch_size} must be >= 1")
    device = device or torch.device("cpu")
    n = len(sequences)
    columns: FeatureColumns = {
        WINDOW_TOKENS_COLUMN: [0] * n,
        "teacher_entropy": [None] * n,
        "teacher_margin": [None] * n,
        "student_teacher_kl": [None] * n,
    }
    slices = [window_slice(len(s), p, window, context) for s, p in zip(sequences, prompt_tokens)]
    todo = [i for i, (_, _, w) in enumerate(slices) if w > 0]
    models = [m for m in (teacher, student) if m is not None]
    for model in models:
        model.eval()
    kd = SpanLossConfig(vocab_size_valid=vocab_size_valid)
    with torch.no_grad():
        for first in range(0, len(todo), batch_size):
            rows = todo[first : first + batch_size]
            inputs = [np.asarray(sequences[i][slices[i][0] : slices[i][1]]) for i in rows]
            widths = [slices[i][2] for i in rows]
            teacher_logits = _window_logits(teacher, inputs, widths, device)
            student_logits = _window_logits(student, inputs, widths, device) if student is not None else None
            for k, i in enumerate(rows):
                t = teacher_logits[k][:, :vocab_size_valid]
                log_p = torch.log_softmax(t, dim=-1)
                p = log_p.exp()
                top2 = torch.topk(p, 2, dim=-1).values
                columns[WINDOW_TOKENS_COLUMN][i] = widths[k]
                columns["teacher_entropy"][i] = float(-(p * log_p).sum(dim=-1).mean())
                columns["teacher_margin"][i] = float((top2[:, 0] - top2[:, 1]).mean())
                if student_logits is not None:
                    kl = per_token_kd(student_logits[k], teacher_logits[k], config=kd, tensor_parallel=False)
                    columns["student_teacher_kl"][i] = float(kl.mean())
    return columns


def checkpoint_window_features(
    teacher_checkpoint: str | Path,
    student_checkpoint: str | Path | None,
    sequences: Sequence[np.ndarray],
    prompt_tokens: Sequence[int],
    *,
    window: int,
    batch_size: int = 4,
    device: str = "auto",
    seed: int = 0,
) -> FeatureColumns:
    """`window_features` of the models in two checkpoint directories (`models.load_model`: save_checkpoint's
    format or a Hugging Face causal LM such as GPT-OSS), loaded in a single-process megatron world on `device`
    ("auto": CUDA when there is one); the context is the smaller of the two models' position limits."""
    where = pick_device(device)
    with megatron_world(where, seed):
        teacher = load_model(teacher_checkpoint, where, batch_size)
        student, context = None, teacher.max_positions
        if student_checkpoint is not None:
            loaded = load_model(student_checkpoint, where, batch_size)
            if loaded.vocab_size != teacher.vocab_size:
                raise ValueError(
                    f"student {student_checkpoint} has vocab {loaded.vocab_size}, "
                    f"teacher {teacher_checkpoint} {teacher.vocab_size}: their distributions do not compare"
                )
            student, context = loaded.model, min(context, loaded.max_positions)
        valid = min(teacher.vocab_size, constants.PADDED_VOCAB_SIZE)
        return window_features(
            teacher.model,
            student,
            sequences,
            prompt_tokens,
            window=window,
            context=context,
            batch_size=batch_size,
            vocab_size_valid=valid,
            device=where,
        )
