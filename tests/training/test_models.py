"""synthkd_training.models: checkpoints round-trip exactly; a Hugging Face GPT-OSS checkpoint serves as teacher."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from synthkd_contract import constants
from synthkd_training import losses
from synthkd_training.losses import HeadedLogits, SpanLossConfig, span_ce_loss, span_kd_loss
from synthkd_training.models import (
    CPU_HUGE_PAGES_VARIABLE,
    GPTSpec,
    NoCudaError,
    build_gpt,
    forward_headed,
    forward_logits,
    load_checkpoint,
    load_model,
    megatron_world,
    pick_device,
    save_checkpoint,
    training_session,
)
from synthkd_training.valuation import checkpoint_window_features, window_features

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
CPU = torch.device("cpu")
SPEC = GPTSpec(num_layers=1, hidden_size=16, num_attention_heads=2, seq_length=16)


def batch(seed: int = 0, b: int = 2, s: int = 16) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "tokens": torch.randint(0, 200_000, (b, s), generator=generator),
        "position_ids": torch.arange(s).expand(b, s),
        "attention_mask": (torch.tril(torch.ones(s, s)) < 0.5).expand(b, 1, s, s),
    }


def test_a_saved_checkpoint_loads_to_the_same_model(tmp_path):
    with megatron_world(CPU, seed=3):
        model = build_gpt(SPEC, CPU, 2).eval()
        save_checkpoint(model, SPEC, tmp_path / "ckpt")
        assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["gpt_spec.json", "model.pt"]
        assert not list(tmp_path.glob(".ckpt.partial-*"))  # written aside, renamed into place
        torch.manual_seed(99)  # a different initialisation, overwritten by the weights
        loaded, spec = load_checkpoint(tmp_path / "ckpt", CPU, 2)
        assert spec == SPEC
        for name, value in model.state_dict().items():
            if torch.is_tensor(value):
                assert torch.equal(value, loaded.state_dict()[name]), name
        with torch.no_grad():
            assert torch.equal(forward_logits(model, batch()), forward_logits(loaded, batch()))
        opened = load_model(tmp_path / "ckpt", CPU, 2)
        assert (opened.kind, opened.vocab_size, opened.max_positions) == ("gpt_spec", constants.PADDED_VOCAB_SIZE, 16)


def test_headed_logits_give_the_whole_logits_losses_and_gradients(monkeypatch):
    """`forward_headed` keeps a GPTModel's logits as the decoder's hidden states and its output layer, which the
    losses apply chunk by chunk (how an 8192-position window fits): the logits, both losses and every parameter's
    gradient equal those of the whole logits that `forward_logits` returns."""
    monkeypatch.setattr(losses, "CHUNK_POSITIONS", 5)  # 2 x 16 positions: 7 chunks, the last one short
    config = SpanLossConfig(kd_divergence="mix", kd_temperature=2.0)
    with megatron_world(CPU, seed=3):
        student, teacher = build_gpt(SPEC, CPU, 2), build_gpt(SPEC, CPU, 2).eval()
        data = batch(seed=1)
        labels = torch.roll(data["tokens"], -1, dims=1)
        span_id = torch.randint(0, 3, labels.shape, generator=torch.Generator().manual_seed(2))
        with torch.no_grad():
            target = forward_logits(teacher, data)
            headed_target = forward_headed(teacher, data)
            assert isinstance(headed_target, HeadedLogits) and headed_target.hidden.shape == (2, 16, SPEC.hidden_size)
            assert headed_target.shape == target.shape
            torch.testing.assert_close(headed_target.logits(), target, rtol=0, atol=1e-5)
        assert student.post_process  # the flag forward_headed turns off for its call is back on

        def loss_and_grads(logits, teacher_logits):
            loss = span_kd_loss(logits, teacher_logits, span_id, config).loss
            loss = loss + span_ce_loss(logits, labels, span_id, config).loss
            grads = torch.autograd.grad(loss, [p for p in student.parameters() if p.requires_grad])
            return loss, grads

        whole_loss, whole_grads = loss_and_grads(forward_logits(student, data), target)
        headed_loss, headed_grads = loss_and_grads(forward_headed(student, data), headed_target)
        torch.testing.assert_close(headed_loss, whole_loss, rtol=1e-5, atol=1e-6)
        assert len(headed_grads) == len(whole_grads) > 0
        for headed, whole in zip(headed_grads, whole_grads):
            torch.testing.assert_close(headed, whole, rtol=1e-4, atol=1e-6)


def test_a_checkpoint_missing_a_parameter_is_refused(tmp_path):
    with megatron_world(CPU, seed=3):
        save_checkpoint(build_gpt(SPEC, CPU, 2), SPEC, tmp_path / "ckpt")
        weights = torch.load(tmp_path / "ckpt" / "model.pt", weights_only=True)
        removed = sorted(weights)[0]
        del weights[removed]
        torch.save(weights, tmp_path / "ckpt" / "model.pt")
        with pytest.raises(ValueError, match="missing"):
            load_checkpoint(tmp_path / "ckpt", CPU, 2)
    with pytest.raises(FileNotFoundError, match="neither gpt_spec.json"):
        load_model(tmp_path, CPU, 2)


def test_a_hugging_face_gpt_oss_checkpoint_is_a_teacher(gpt_oss_checkpoint):
    """GptOssForCausalLM (MoE, sinks) from its checkpoint path, behind GPTModel's call convention."""
    from transformers import AutoModelForCausalLM

    with megatron_world(CPU, seed=0):
        opened = load_model(gpt_oss_checkpoint, CPU, 2)
    assert (opened.kind, opened.vocab_size, opened.max_positions) == ("huggingface", constants.PADDED_VOCAB_SIZE, 64)
    reference = AutoModelForCausalLM.from_pretrained(gpt_oss_checkpoint, dtype=torch.float32).eval()
    inputs = batch(1)
    with torch.no_grad():
        expected = reference(input_ids=inputs["tokens"]).logits
        assert torch.equal(forward_logits(opened.model, inputs), expected)
    assert expected.shape == (2, 16, constants.PADDED_VOCAB_SIZE)


def assert_each_packed_conversation_is_read_alone(model, lengths: tuple[int, ...], seed: int) -> None:
    """A window as the stream packs it (position ids restarting at each conversation, Megatron's block-diagonal
    causal mask, True where masked) gives every conversation the logits it gets alone; the same tokens read as one
    sequence do not (so the comparison can tell attention across conversations apart)."""
    generator = torch.Generator().manual_seed(seed)
    conversations = [torch.randint(0, 200_000, (n,), generator=generator) for n in lengths]
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    causal = torch.tril(torch.ones(len(segment), len(segment), dtype=torch.bool))

    def window(tokens, positions, attend):
        return {"tokens": tokens[None], "position_ids": positions[None], "attention_mask": ~attend[None, None]}

    tokens = torch.cat(conversations)
    with torch.no_grad():
        restarting = torch.cat([torch.arange(n) for n in lengths])
        packed = forward_logits(model, window(tokens, restarting, causal & (segment[:, None] == segment[None, :])))[0]
        start = 0
        for conversation in conversations:
            n = len(conversation)
            alone = forward_logits(model, window(conversation, torch.arange(n), causal[:n, :n]))[0]
            torch.testing.assert_close(packed[start : start + n], alone, rtol=1e-5, atol=1e-5)
            start += n
        one_sequence = forward_logits(model, window(tokens, torch.arange(len(tokens)), causal))[0]
        assert not torch.allclose(one_sequence[lengths[0] :], packed[lengths[0] :], atol=1e-4)


def test_a_gpt_model_given_the_streams_mask_attends_within_each_conversation():
    """Through megatron-core's GPTModel, nothing leaks across the conversations of a packed window."""
    with megatron_world(CPU, seed=3):
        assert_each_packed_conversation_is_read_alone(build_gpt(SPEC, CPU, 1).eval(), (5, 8, 3), seed=6)


def test_a_hugging_face_teacher_attends_within_each_conversation_of_a_packed_window(tmp_path):
    """The stream packs whole conversations into a window with position ids restarting at each (docs/pool.md#the-
    stream). A Hugging Face teacher behind `CausalLMAdapter` gets those position ids and no mask, and builds its own
    per-conversation mask from them (transformers' packed-sequence detection), sliding-window layers included: each
    conversation's logits in the packed window are its logits alone."""
    from tests.training.conftest import write_tiny_gpt_oss

    checkpoint = write_tiny_gpt_oss(tmp_path / "gpt-oss", sliding_window=3)
    assert_each_packed_conversation_is_read_alone(load_model(checkpoint, CPU, 1).model, (6, 9, 4), seed=4)


def test_valuation_features_take_a_gpt_oss_teacher_path(gpt_oss_checkpoint, tmp_path):
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, 200_000, size=n).astype(np.int32) for n in (30, 12)]
    prompts = [20, 4]
    with megatron_world(CPU, seed=0):
        save_checkpoint(build_gpt(SPEC, CPU, 2), SPEC, tmp_path / "student")
    got = checkpoint_window_features(
        gpt_oss_checkpoint, tmp_path / "student", sequences, prompts, window=4, batch_size=2, device="cpu"
    )
    assert all(value is not None for name in ("teacher_entropy", "student_teacher_kl") for value in got[name])
    with megatron_world(CPU, seed=0):  # the same as handing the loaded models in directly
        teacher = load_model(gpt_oss_checkpoint, CPU, 2).model
        student = load_model(tmp_path / "student", CPU, 2).model
        direct = window_features(teacher, student, sequences, prompts, window=4, context=16, batch_size=2, device=CPU)
    assert direct == got


def test_cuda_without_cuda_is_refused_naming_why(monkeypatch):
    """Not left to NCCL's "Distributed package doesn't have NCCL built in" once the world starts."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pick_device("auto") == CPU and pick_device("cpu") == CPU
    with pytest.raises(NoCudaError, match=r"device 'cuda' asked for, but torch .* has no CUDA here"):
        pick_device("cuda")


EXAMPLE_ARGUMENTS = {"train_tiny": [], "train_online_kd": ["--teacher-checkpoint", "teacher"]}


@pytest.mark.parametrize("example", sorted(EXAMPLE_ARGUMENTS))
def test_an_example_asked_for_cuda_without_it_exits_naming_why_before_writing(monkeypatch, tmp_path, example):
    module = importlib.import_module(f"examples.{example}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    work_dir = tmp_path / "work"
    with pytest.raises(SystemExit, match=r"device 'cuda' asked for, but torch .* has no CUDA here"):
        module.main(["--device", "cuda", "--synthetic", "--work-dir", str(work_dir), *EXAMPLE_ARGUMENTS[example]])
    assert not work_dir.exists()


def test_a_training_session_without_a_work_dir_removes_its_temporary_one():
    with training_session("cpu", 0, None, "session-test-") as (device, work_dir):
        assert device == CPU and work_dir.is_dir() and work_dir.name.startswith("session-test-")
        (work_dir / "checkpoint").write_text("written during the run")
    assert not work_dir.exists()


HUGE_PAGES_PROBE = """
import os, sys
import torch
from synthkd_training.models import CPU_HUGE_PAGES_VARIABLE, training_session

with training_session("cpu", 0, None, "huge-pages-test-"):
    chunk = torch.ones(64 * 2**20 // 4)  # a 64 MiB tensor, as the losses make on a CPU
    rollup = open("/proc/self/smaps_rollup").read().split()
    huge_kib = int(rollup[rollup.index("AnonHugePages:") + 1])
    print(os.environ.get(CPU_HUGE_PAGES_VARIABLE), huge_kib)
"""


@pytest.mark.parametrize("asked", [None, "0"])
def test_a_cpu_session_backs_large_tensors_with_huge_pages_unless_told_not_to(asked):
    """In a new process (PyTorch reads the variable at its first tensor): a CPU session turns huge pages on when
    the variable is unset, and then a 64 MiB tensor sits on them where the kernel offers them; a value the user
    set is left as it is."""
    env = {key: value for key, value in os.environ.items() if key != CPU_HUGE_PAGES_VARIABLE}
    if asked is not None:
        env[CPU_HUGE_PAGES_VARIABLE] = asked
    done = subprocess.run([sys.executable, "-c", HUGE_PAGES_PROBE], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    value, huge_kib = done.stdout.split()
    assert value == (asked or "1")
    kernel_offers = "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    if asked is None and kernel_offers:
        assert int(huge_kib) >= 32 * 1024
