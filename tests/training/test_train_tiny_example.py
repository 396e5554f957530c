"""examples/train_tiny.py trains a tiny Megatron-Core GPTModel on CPU and its loss goes down."""

from __future__ import annotations

import pytest
import torch

from examples import train_tiny


@pytest.mark.filterwarnings("ignore::UserWarning")  # megatron-core: "Apex is not installed", deprecations
def test_train_tiny_on_synthetic_data(tmp_path, capsys):
    summary = train_tiny.main(
        [
            "--synthetic",
            "--work-dir",
            str(tmp_path),
            "--device",
            "cpu",
            "--steps",
            "10",
            "--seq-length",
            "32",
            "--micro-batch-size",
            "2",
            "--window",
            "3",
            "--lr",
            "1e-2",
        ]
    )
    out = capsys.readouterr().out
    assert len(summary["losses"]) == 10
    assert summary["last_mean"] < summary["first_mean"]
    assert all(torch.isfinite(torch.tensor(summary["losses"])))
    # what 000 says must always be logged is printed every step
    assert out.count("analysis") >= 10 and "n=" in out and "w=" in out
    # megatron's index cache was written where the example put it, and torch.distributed was left clean
    assert any("SpanGPTDataset-train" in p.name for p in (tmp_path / "index-cache").iterdir())
    assert not torch.distributed.is_initialized()
