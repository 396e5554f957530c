"""Fixtures of the synthkd_training tests (CPU only, no GPU, no dagster)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def per_test_index_cache(tmp_path, monkeypatch):
    """megatron-core's index cache, by default per user (synthkd_contract.trio.megatron_cache_dir), per test."""
    monkeypatch.setenv("SYNTHKD_CACHE_DIR", str(tmp_path / "user-cache"))


@pytest.fixture
def tp1_parallel_state(gloo_world):
    """megatron-core parallel state with TP = PP = 1 on the gloo world."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    yield
    parallel_state.destroy_model_parallel()


def write_tiny_gpt_oss(directory, seed: int = 0, max_positions: int = 64, sliding_window: int | None = None):
    """A Hugging Face GPT-OSS checkpoint (GptOssForCausalLM: MoE, attention sinks) at toy size, created from a config
    and saved with save_pretrained, as a real openai/gpt-oss checkpoint directory is laid out (config.json +
    safetensors); the vocabulary is o200k_harmony's padded 201,088. With `sliding_window`, two layers alternate as
    GPT-OSS's do: one attending to that many positions, one to all."""
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    from synthkd_contract import constants

    config = GptOssConfig(
        vocab_size=constants.PADDED_VOCAB_SIZE,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1 if sliding_window is None else 2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        max_position_embeddings=max_positions,
        sliding_window=sliding_window or max_positions,
        layer_types=["full_attention"] if sliding_window is None else ["sliding_attention", "full_attention"],
    )
    torch.manual_seed(seed)
    GptOssForCausalLM(config).save_pretrained(directory)
    return directory


@pytest.fixture
def gpt_oss_checkpoint(tmp_path):
    return write_tiny_gpt_oss(tmp_path / "gpt-oss-tiny")
