"""Where the pipeline reads and writes: run config first, then SYNTHKD_* variables, then defaults."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from synthkd_assets.core.caps import BuildCaps
from synthkd_assets.core.cleanup import STAGE_NAMES, OutputLayout
from synthkd_assets.core.manifest_builders import distill_build_config, kd_build_config
from synthkd_assets.core.sampling import MixTargets, selection_config
from synthkd_assets.core.synth import system_message_dict
from synthkd_contract import constants

DEFAULT_RAW_DIR = "data/sample/synth_raw"
DEFAULT_DATA_DIR = "data"
SMOKE_SUBDIR = "smoke"  # a smoke build's intermediate stages, plan and error logs: <data>/smoke/<stage>
SMOKE_READ_AHEAD = 4  # default raw rows read per shard in a smoke build, per conversation it may write


class SynthKDPaths(dg.ConfigurableResource):
    """Input and output roots of one build. Relative paths resolve against the working directory
    (the repository root when launched through workspace.yaml)."""

    raw_dir: str | None = Field(default=None, description="Raw SYNTH Parquet shards; default $SYNTHKD_RAW_DIR or the bundled sample.")
    data_dir: str | None = Field(default=None, description="Output root; default $SYNTHKD_DATA_DIR or data/.")
    smoke: bool = Field(
        default=False,
        description="Cap each shard and write data/megatron/synth_kd_v1_smoke/ and data/distill/synth_distill_smoke/ "
        "instead, with every intermediate stage, plan and error log under data/smoke/.",
    )
    smoke_max_rows: int = Field(default=64, description="Conversations written per shard in a smoke build.")
    smoke_max_tokens: int = Field(default=200_000, description="Tokens written per shard in a smoke build.")
    smoke_input_rows: int | None = Field(
        default=None,
        description="Raw rows a smoke build reads per shard (the first, in file order; no later step sees more). "
        f"Default {SMOKE_READ_AHEAD} x smoke_max_rows, so that smoke_max_rows conversations survive the filters and sampling.",
    )
    encode_threads: int = Field(
        default=1,
        description="tiktoken threads per tokenize step. 1 when shards run in parallel processes (the default "
        "executor); raise it to use idle cores when a single shard runs alone.",
    )

    # 001 mixture targets (the synth_sampling_plan asset computes keep rates for them) and DistillKit output
    memorization_cap: float = Field(default=constants.MEMORIZATION_CAP, description="Max share of exercise == memorization after sampling.")
    non_english_min: float = Field(default=constants.NON_ENGLISH_MIN, description="Min share of non-English rows after sampling, opt-in: English rows are sampled down to reach it (default 0: English is never dropped).")
    non_english_max: float = Field(default=constants.NON_ENGLISH_MAX, description="Max share of non-English rows after sampling.")
    global_keep: float = Field(default=constants.GLOBAL_KEEP, description="Uniform deterministic keep rate on top of the mixture rates (token budgets).")
    max_seq_len: int = Field(default=constants.MAX_SEQ_LEN, description="DistillKit output: longer conversations are dropped (counted).")
    distill_valid_fraction: float = Field(default=constants.DISTILL_VALID_FRACTION, description="DistillKit validation fraction (hash of synth_id).")
    distill_dir: str | None = Field(default=None, description="DistillKit dataset root; default <data_dir>/distill/synth_distill[_smoke].")
    encoding_errors_log: str | None = Field(default=None, description="Sample of Harmony render failures (JSON lines); default <data_dir>/errors/synth_distill_encoding_errors.jsonl.")

    def raw_root(self) -> Path:
        return Path(self.raw_dir or os.environ.get("SYNTHKD_RAW_DIR") or DEFAULT_RAW_DIR)

    def data_root(self) -> Path:
        return Path(self.data_dir or os.environ.get("SYNTHKD_DATA_DIR") or DEFAULT_DATA_DIR)

    def recorded(self, path: Path) -> str:
        """How a manifest records a path: relative to the data root when under it (so a dataset can move
        and two builds in different roots have identical manifests), absolute otherwise."""
        try:
            return path.resolve().relative_to(self.data_root().resolve()).as_posix()
        except ValueError:
            return str(path.resolve())

    def resolve_recorded(self, recorded: str) -> Path:
        return self.data_root() / recorded  # an absolute recorded path stays absolute

    def raw_shard(self, partition_key: str) -> Path:
        return self.raw_root() / f"{partition_key}.parquet"

    def tokenizer_dir(self) -> Path:
        return self.data_root() / "tokenizer"

    def build_root(self) -> Path:
        """Where this build keeps its intermediate stages, sampling plan, reports and error logs: the data
        root, or `<data>/smoke/` for a smoke build, so a smoke build never touches a full build's files."""
        return self.data_root() / SMOKE_SUBDIR if self.smoke else self.data_root()

    def stage_dir(self, stage: str) -> Path:
        return self.build_root() / stage

    def built_from_sha256(self, key: str) -> str | None:
        """The raw sha256 synth_harmony read when it last built shard `key` (its report), None if never built:
        what the sensor, the schedule and raw_inputs_unchanged compare the raw files with."""
        report = self.stage_dir("synth_harmony") / f"{key}.report.json"
        return json.loads(report.read_text()).get("source_sha256") if report.is_file() else None

    def raw_hash_cache(self) -> Path:
        return self.data_root() / "synth_raw" / "hash_cache.json"

    def errors_dir(self) -> Path:
        return self.build_root() / "errors"

    def megatron_root(self) -> Path:
        name = constants.SMOKE_DATASET_NAME if self.smoke else constants.DATASET_NAME
        return self.data_root() / "megatron" / name

    def targets(self) -> MixTargets:
        return MixTargets(self.memorization_cap, self.non_english_min, self.non_english_max, self.global_keep)

    def sampling_plan_path(self) -> Path:
        return self.stage_dir("synth_sampling_plan") / constants.SAMPLING_PLAN_FILENAME

    def distill_root(self) -> Path:
        if self.distill_dir:
            return Path(self.distill_dir)
        return self.data_root() / "distill" / self.distill_name()

    def distill_name(self) -> str:
        return constants.DISTILL_SMOKE_DATASET_NAME if self.smoke else constants.DISTILL_DATASET_NAME

    def distill_records_dir(self) -> Path:
        """Per-shard records (report, files, length histogram) of the DistillKit build, kept out of its root."""
        return self.stage_dir(self.distill_name())

    def encoding_errors_log_path(self) -> Path:
        if self.encoding_errors_log:
            return Path(self.encoding_errors_log)
        return self.errors_dir() / constants.DISTILL_ENCODING_ERRORS_FILENAME

    def output_layout(self) -> OutputLayout:
        """Where per-shard outputs live, for full and smoke builds alike (a removed shard's outputs go from both)."""
        data = self.data_root()
        build_roots = (data, data / SMOKE_SUBDIR)
        distill_names = (constants.DISTILL_DATASET_NAME, constants.DISTILL_SMOKE_DATASET_NAME)
        distill_roots = [self.distill_root(), *(data / "distill" / name for name in distill_names)]
        return OutputLayout(
            stage_dirs=tuple(root / stage for root in build_roots for stage in STAGE_NAMES),
            record_dirs=tuple(root / name for root in build_roots for name in distill_names),
            errors_dirs=tuple(root / "errors" for root in build_roots),
            megatron_roots=tuple(data / "megatron" / name for name in (constants.DATASET_NAME, constants.SMOKE_DATASET_NAME)),
            distill_roots=tuple(dict.fromkeys(distill_roots)),
        )

    def caps(self) -> BuildCaps:
        if not self.smoke:
            return BuildCaps()
        input_rows = self.smoke_input_rows if self.smoke_input_rows is not None else SMOKE_READ_AHEAD * self.smoke_max_rows
        return BuildCaps(self.smoke_max_rows, self.smoke_max_tokens, input_rows)


def kd_config(paths: SynthKDPaths) -> dict:
    """The synth_kd_v1 build config of these settings (hashed into the manifest, re-checked by checks)."""
    caps = paths.caps()
    return kd_build_config(
        system_message_dict(), caps.max_rows, caps.max_tokens, selection_config(paths.targets()), caps.max_input_rows
    )


def distill_config(paths: SynthKDPaths) -> dict:
    """The DistillKit build config of these settings (hashed into its manifest, re-checked by its checks)."""
    caps = paths.caps()
    return distill_build_config(
        system_message_dict(),
        selection_config(paths.targets()),
        paths.max_seq_len,
        paths.distill_valid_fraction,
        caps.max_rows,
        caps.max_tokens,
        caps.max_input_rows,
    )
