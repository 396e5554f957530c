"""Where the pipeline reads and writes: run config first, then SYNTHKD_* variables, then defaults."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from synthkd_assets import contracts
from synthkd_assets.core.manifest import kd_build_config
from synthkd_assets.core.stages import BuildCaps
from synthkd_assets.core.synth import system_message_dict

DEFAULT_RAW_DIR = "data/sample/synth_raw"
DEFAULT_DATA_DIR = "data"


class SynthKDPaths(dg.ConfigurableResource):
    """Input and output roots of one build. Relative paths resolve against the working directory
    (the repository root when launched through workspace.yaml)."""

    raw_dir: str | None = Field(default=None, description="Raw SYNTH Parquet shards; default $SYNTHKD_RAW_DIR or the bundled sample.")
    data_dir: str | None = Field(default=None, description="Output root; default $SYNTHKD_DATA_DIR or data/.")
    smoke: bool = Field(default=False, description="Cap each shard and write data/megatron/synth_kd_v1_smoke/ instead.")
    smoke_max_rows: int = Field(default=64, description="Rows per shard in a smoke build.")
    smoke_max_tokens: int = Field(default=200_000, description="Tokens per shard in a smoke build.")
    encode_threads: int = Field(
        default=1,
        description="tiktoken threads per tokenize step. 1 when shards run in parallel processes (the default "
        "executor); raise it to use idle cores when a single shard runs alone.",
    )

    def raw_root(self) -> Path:
        return Path(self.raw_dir or os.environ.get("SYNTHKD_RAW_DIR") or DEFAULT_RAW_DIR)

    def data_root(self) -> Path:
        return Path(self.data_dir or os.environ.get("SYNTHKD_DATA_DIR") or DEFAULT_DATA_DIR)

    def raw_shard(self, partition_key: str) -> Path:
        return self.raw_root() / f"{partition_key}.parquet"

    def tokenizer_dir(self) -> Path:
        return self.data_root() / "tokenizer"

    def stage_dir(self, stage: str) -> Path:
        return self.data_root() / stage

    def raw_hash_cache(self) -> Path:
        return self.data_root() / "synth_raw" / "hash_cache.json"

    def errors_dir(self) -> Path:
        return self.data_root() / "errors"

    def megatron_root(self) -> Path:
        name = contracts.SMOKE_DATASET_NAME if self.smoke else contracts.DATASET_NAME
        return self.data_root() / "megatron" / name

    def caps(self) -> BuildCaps:
        return BuildCaps(self.smoke_max_rows, self.smoke_max_tokens) if self.smoke else BuildCaps()


def kd_config(paths: SynthKDPaths) -> dict:
    """The synth_kd_v1 build config of these settings (hashed into the manifest, re-checked by checks)."""
    caps = paths.caps()
    return kd_build_config(system_message_dict(), caps.max_rows, caps.max_tokens)
