"""examples/train_trl_sft.py on a DistillKit dataset built with `distill_valid_fraction 0`: the build writes an empty
validation part (both splits are always written), which `datasets` cannot read (a raw DatasetGenerationError): the
script says so in one line and trains without an evaluation split."""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest

from examples import train_trl_sft
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from tests.helpers import SAMPLE_RAW_DIR, run

SHARDS = [f"synth_{i:03d}" for i in range(1, 7)]


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: pin_memory without an accelerator
def test_a_build_without_validation_rows_trains_with_a_clear_message(built_sample, own_instance, tmp_path, capsys):
    copy = tmp_path / "data"
    shutil.copytree(built_sample[2], copy)
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy))
    build = SynthKDBuildConfig(distill_valid_fraction=0.0)
    for shard in SHARDS:  # the user's rebuild with the new setting: every shard, then the manifest
        run(own_instance, layout, ["synth_distill"], shard, build=build)
    run(own_instance, layout, ["synth_distill_manifest"], build=build)
    root = layout.data_layout().distill_root()
    parts = sorted((root / "validation").glob("*.parquet"))
    assert parts and all(pq.ParquetFile(part).metadata.num_rows == 0 for part in parts)  # the injected state

    args = ["--data-dir", str(root), "--tiny", "--shortest", "2", "--steps", "1", "--batch-size", "1"]
    result = train_trl_sft.main([*args, "--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "hf")])
    assert result["global_step"] == 1
    said = capsys.readouterr().out
    assert "0 validation rows (distill_valid_fraction 0?): no evaluation split, training only" in said
    assert train_trl_sft.split_files(root).keys() == {"train"}
