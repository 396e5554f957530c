"""Fixtures of the synthkd_training tests (CPU only, no GPU, no dagster)."""

from __future__ import annotations

import pytest
import torch.distributed as dist


@pytest.fixture
def gloo_world():
    """A single-process gloo world (in-memory store) for code that asks torch.distributed for the
    rank; torn down afterwards unless something else had set one up."""
    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


@pytest.fixture
def tp1_parallel_state(gloo_world):
    """megatron-core parallel state with TP = PP = 1 on the gloo world."""
    from megatron.core import parallel_state

    parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    yield
    parallel_state.destroy_model_parallel()
