"""The losses under megatron-core's tensor-parallel vocab split equal the plain torch ones.

TP = 1 runs in-process on a gloo world of one; TP = 2 runs two CPU processes over gloo, each holding
half of the (padded) vocabulary, and compares losses and per-slice gradients with the full
computation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from synthkd_training.losses import SpanLossConfig, _use_tensor_parallel, span_ce_loss, span_kd_loss
from tests.training import tp_worker


def _inputs(vocab: int = 16, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 4, vocab, generator=generator, dtype=torch.float64) * 2
    teacher = torch.randn(3, 4, vocab, generator=generator, dtype=torch.float64) * 2
    span_id = torch.randint(0, 3, (3, 4), generator=generator)
    span_id[0, 0], span_id[0, 1] = 1, 2  # both spans present
    return logits, teacher, span_id, generator


def _plain(kind: str, logits, labels, teacher, span_id, config):
    student = logits.detach().clone().requires_grad_()
    if kind == "ce":
        result = span_ce_loss(student, labels, span_id, config, tensor_parallel=False)
    else:
        result = span_kd_loss(student, teacher, span_id, config, tensor_parallel=False)
    result.loss.backward()
    return result, student.grad


CASES = {
    "ce_full": ("ce", {}),
    "ce_padded": ("ce", {"vocab_size_valid": 11}),
    "ce_second_rank_all_padding": ("ce", {"vocab_size_valid": 5}),
    "kd_forward_t2": ("kd", {"kd_temperature": 2.0, "vocab_size_valid": 11}),
    "kd_reverse": ("kd", {"kd_divergence": "reverse", "w_final": 0.3}),
    "kd_mix_padded": ("kd", {"kd_divergence": "mix", "kd_forward_weight": 0.3, "vocab_size_valid": 13}),
    "kd_second_rank_all_padding": ("kd", {"kd_divergence": "mix", "vocab_size_valid": 6}),
}


@pytest.mark.parametrize("tensor_parallel", [True, None], ids=["vocab_parallel_path", "chosen_from_parallel_state"])
def test_tp1_matches_plain_torch(tp1_parallel_state, tensor_parallel):
    """At TP = 1 the vocab-parallel path (forced) equals plain torch, and left to the parallel state (None) the
    losses take the plain path: one rank splits nothing."""
    assert _use_tensor_parallel(None) is False and _use_tensor_parallel(True) is True
    logits, teacher, span_id, generator = _inputs()
    labels = torch.randint(0, 5, (3, 4), generator=generator)
    for name, (kind, fields) in CASES.items():
        config = SpanLossConfig(**fields)
        expected, expected_grad = _plain(kind, logits, labels, teacher, span_id, config)
        for dtype in (torch.float32, torch.float64):
            student = logits.detach().to(dtype).clone().requires_grad_()
            before = student.detach().clone()
            if kind == "ce":
                result = span_ce_loss(student, labels, span_id, config, tensor_parallel=tensor_parallel)
            else:
                result = span_kd_loss(student, teacher.to(dtype), span_id, config, tensor_parallel=tensor_parallel)
            result.loss.backward()
            assert torch.equal(student.detach(), before), f"{name}: logits modified in place"
            torch.testing.assert_close(result.loss.double(), expected.loss, rtol=1e-5, atol=1e-6, msg=name)
            torch.testing.assert_close(student.grad.double(), expected_grad, rtol=1e-4, atol=1e-6, msg=name)
            assert {k: int(v) for k, v in result.token_counts.items()} == {
                k: int(v) for k, v in expected.token_counts.items()
            }


def test_tp2_vocab_split_matches_plain_torch(tmp_path):
    assert not torch.distributed.is_initialized()
    logits, teacher, span_id, generator = _inputs()
    labels = torch.randint(0, 5, (3, 4), generator=generator)
    cases = {name: {"kind": kind, "config": fields} for name, (kind, fields) in CASES.items()}
    inputs = tmp_path / "inputs.pt"
    torch.save({"logits": logits, "teacher": teacher, "labels": labels, "span_id": span_id, "cases": cases}, inputs)
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    repo_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_root, env.get("PYTHONPATH")]))
    args = ["2", str(tmp_path / "store"), str(inputs), str(tmp_path)]
    # rank 1 in a fresh process, rank 0 here (megatron is imported already: half the start-up)
    other = subprocess.Popen(
        [sys.executable, tp_worker.__file__, "1", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        tp_worker.run_rank(0, 2, *args[1:])
    finally:
        output = other.communicate(timeout=120)[0]
    assert other.returncode == 0, output
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    # rank 1 ran in a fresh interpreter: synthkd_training never imports dagster, even transitively
    assert {"synthkd_training.dataset", "synthkd_training.losses", "synthkd_training.synthetic"} <= set(
        ranks[1].pop("synthkd_training_modules")
    )
    assert ranks[1].pop("dagster_modules") == []
    for name, (kind, fields) in CASES.items():
        expected, expected_grad = _plain(kind, logits, labels, teacher, span_id, SpanLossConfig(**fields))
        tolerance = {"rtol": 1e-5, "atol": 1e-6} if kind == "ce" else {"rtol": 1e-10, "atol": 1e-12}
        for rank, results in enumerate(ranks):
            got = results[name]
            assert got["unchanged"], f"{name}: rank {rank} modified its logits"
            torch.testing.assert_close(got["loss"].double(), expected.loss, **tolerance, msg=f"{name} rank {rank}")
            torch.testing.assert_close(
                got["grad"].double(),
                expected_grad[..., rank * 8 : (rank + 1) * 8],
                **tolerance,
                msg=f"{name} rank {rank}",
            )
            assert got["counts"] == {k: int(v) for k, v in expected.token_counts.items()}
