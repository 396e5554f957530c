"""A split whose prefixes are too short for one sample: the README's unweighted blend used to die in
megatron-core with a bare AssertionError; it is refused up front, naming the prefixes."""

from __future__ import annotations

import pytest
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder

from synthkd_training.dataset import (
    SpanDatasetError,
    SpanGPTDataset,
    SpanGPTDatasetConfig,
    token_weights,
    tokens_prefixes,
)
from synthkd_training.synthetic import write_synthetic_split


@pytest.fixture
def short_valid(tmp_path):
    write_synthetic_split(tmp_path / "train", shards=2, documents_per_shard=40, seed=1)
    write_synthetic_split(tmp_path / "valid", shards=3, documents_per_shard=1, seed=2)  # a few dozen tokens each
    return tokens_prefixes(tmp_path / "train"), tokens_prefixes(tmp_path / "valid")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_unweighted_blend_of_too_short_prefixes_is_refused_by_name(short_valid):
    train, valid = short_valid
    with pytest.raises(SpanDatasetError) as refused:  # as in the README: config, then Megatron's builder
        config = SpanGPTDatasetConfig(
            random_seed=1, sequence_length=512, blend_per_split=[(train, None), (valid, None), None], path_to_cache=None
        )
        BlendedMegatronDatasetBuilder(SpanGPTDataset, [8, 4, None], lambda: True, config).build()
    message = str(refused.value)
    assert message.startswith(
        "valid split: 3 of its 3 prefixes hold fewer tokens than one sample (sequence_length 512 + 1)"
    )
    assert all(f"{prefix} (" in message for prefix in valid)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_same_split_with_weights_builds(short_valid, gloo_world):
    """As docs/contract.md's fragment gives them: each prefix by its tokens (its index cache in the per-user
    default, which megatron-core's BlendedDataset asks torch.distributed about)."""
    train, valid = short_valid
    config = SpanGPTDatasetConfig(
        random_seed=1,
        sequence_length=512,
        blend_per_split=[(train, token_weights(train)), (valid, token_weights(valid)), None],
        path_to_cache=None,
    )
    _, valid_ds, _ = BlendedMegatronDatasetBuilder(SpanGPTDataset, [8, 4, None], lambda: True, config).build()
    assert len(valid_ds) >= 4 and valid_ds[0]["tokens"].shape[0] == 512
