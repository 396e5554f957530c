"""The valuation's model features (synthkd_training.valuation) against brute force: every window position's
softmax recomputed in float64 with numpy, from one unbatched forward per conversation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from synthkd_training.models import GPTSpec, build_gpt, megatron_world, save_checkpoint
from synthkd_training.valuation import checkpoint_window_features, window_features

VOCAB = 12


class TokenTable(torch.nn.Module):
    """A context-free 'model': the logits at a position are a fixed random row of the token there. What it
    predicts for window token t is row tokens[t - 1], whatever the batch, the padding or the truncation."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3)

    def forward(self, tokens, position_ids, attention_mask):
        return self.table[tokens]


def brute_force(teacher_rows: list[np.ndarray], student_rows: list[np.ndarray] | None) -> dict[str, float]:
    """Means over the window of entropy, top-1 - top-2 margin and KL(teacher || student), position by position."""
    entropies, margins, kls = [], [], []
    for k, row in enumerate(teacher_rows):
        z = row.astype(np.float64)
        p = np.exp(z - z.max())
        p /= p.sum()
        entropies.append(-sum(x * math.log(x) for x in p if x > 0))
        top = sorted(p, reverse=True)
        margins.append(top[0] - top[1])
        if student_rows is not None:
            s = student_rows[k].astype(np.float64)
            q = np.exp(s - s.max())
            q /= q.sum()
            kls.append(sum(a * (math.log(a) - math.log(b)) for a, b in zip(p, q) if a > 0))
    out = {"teacher_entropy": np.mean(entropies), "teacher_margin": np.mean(margins)}
    if student_rows is not None:
        out["student_teacher_kl"] = np.mean(kls)
    return out


conversations = st.lists(
    st.tuples(st.lists(st.integers(0, VOCAB - 1), min_size=0, max_size=30), st.integers(0, 32)),
    min_size=1,
    max_size=7,
)


@given(conversations, st.integers(1, 9), st.integers(1, 12), st.integers(1, 4))
def test_the_window_is_the_tokens_after_the_prompt(rows, window, context, batch_size):
    """For each conversation, the features are over window tokens tokens[p : p + w] with w = min(window,
    tokens after the prompt, context), each predicted from the token before it; none without such tokens."""
    teacher, student = TokenTable(1), TokenTable(2)
    sequences = [np.asarray(tokens, dtype=np.int32) for tokens, _ in rows]
    prompts = [min(p, len(tokens)) for tokens, p in rows]
    got = window_features(
        teacher,
        student,
        sequences,
        prompts,
        window=window,
        context=context,
        batch_size=batch_size,
        vocab_size_valid=VOCAB,
    )
    for i, (tokens, p) in enumerate(zip(sequences, prompts)):
        targets = list(range(p, min(len(tokens), p + window, p + context))) if p >= 1 else []
        assert got["window_tokens"][i] == len(targets)
        if not targets:
            assert got["teacher_entropy"][i] is None and got["student_teacher_kl"][i] is None
            continue
        previous = [int(tokens[t - 1]) for t in targets]
        expected = brute_force(
            [teacher.table[j].detach().numpy() for j in previous], [student.table[j].detach().numpy() for j in previous]
        )
        for name, value in expected.items():
            assert got[name][i] == pytest.approx(value, rel=1e-9, abs=1e-12), name


def test_megatron_models_match_an_unbatched_float64_brute_force(tmp_path):
    """Tiny megatron GPTModels from checkpoints: batched, right-padded, truncated to the context, the features
    equal a per-conversation forward and a per-position float64 softmax; and the same again gives the same."""
    spec_t = GPTSpec(num_layers=1, hidden_size=16, num_attention_heads=2, seq_length=24)
    spec_s = GPTSpec(num_layers=1, hidden_size=8, num_attention_heads=2, seq_length=20)
    device = torch.device("cpu")
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, 200_000, size=n).astype(np.int32) for n in (40, 9, 25, 3, 31)]
    prompts = [30, 5, 10, 3, 12]  # a prompt longer than the context, one with nothing after it
    window = 6
    with megatron_world(device, seed=7):
        teacher, student = build_gpt(spec_t, device, 4), build_gpt(spec_s, device, 4)
        save_checkpoint(teacher, spec_t, tmp_path / "teacher")
        save_checkpoint(student, spec_s, tmp_path / "student")
        teacher.eval(), student.eval()
        context = 20  # the smaller model's seq_length
        oracle = []
        with torch.no_grad():
            for tokens, p in zip(sequences, prompts):
                w = min(window, len(tokens) - p)
                if w <= 0:
                    oracle.append(None)
                    continue
                inputs = tokens[max(0, p + w - 1 - context) : p + w - 1]
                x = torch.as_tensor(inputs.astype(np.int64)).unsqueeze(0)
                positions = torch.arange(len(inputs)).unsqueeze(0)
                n = len(inputs)
                mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1).view(1, 1, n, n)
                rows = [m(x, positions, mask)[0, -w:].numpy() for m in (teacher, student)]
                oracle.append((w, brute_force(list(rows[0]), list(rows[1]))))
    got = checkpoint_window_features(
        tmp_path / "teacher", tmp_path / "student", sequences, prompts, window=window, batch_size=2, device="cpu"
    )
    for i, expected in enumerate(oracle):
        if expected is None:
            assert got["window_tokens"][i] == 0 and got["teacher_margin"][i] is None
            continue
        assert got["window_tokens"][i] == expected[0]
        for name, value in expected[1].items():
            assert got[name][i] == pytest.approx(value, rel=1e-4, abs=1e-6), (i, name)
    again = checkpoint_window_features(
        tmp_path / "teacher", tmp_path / "student", sequences, prompts, window=window, batch_size=2, device="cpu"
    )
    assert again == got
    alone = checkpoint_window_features(tmp_path / "teacher", None, sequences, prompts, window=window, device="cpu")
    assert alone["student_teacher_kl"] == [None] * len(sequences)
    assert alone["teacher_entropy"][0] == pytest.approx(got["teacher_entropy"][0], rel=1e-5)
