"""The two resources every step reads: where the build reads and writes (`layout`) and what it builds (`build`);
and the models the valuation features read (`valuation`: none by default, the model features are then null).

Run config overrides either: `{"resources": {"layout": {"config": {"data_dir": "..."}}, "build": {"config":
{"smoke": true}}}}`. The code location gives the layout its roots from SYNTHKD_RAW_DIR / SYNTHKD_DATA_DIR as
`dg.EnvVar`s, resolved by each process that runs a step (`SynthKDLayout.from_settings`), and the valuation's
checkpoints from SYNTHKD_TEACHER_CHECKPOINT / SYNTHKD_STUDENT_CHECKPOINT the same way. A root that run config
leaves unset is read the same way when the step runs (`SynthKDLayout.data_layout`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg
from pydantic import Field, field_validator, model_validator

from synthkd_assets.core.caps import NO_CAPS, BuildCaps
from synthkd_assets.core.curriculum import CurriculumStage, curriculum_stages
from synthkd_assets.core.layout import (
    DATA_DIR_ENV,
    DEFAULT_DATA_DIR,
    DEFAULT_RAW_DIR,
    HARMONY_DIR_ENV,
    HARMONY_RANGE_ENV,
    RAW_DIR_ENV,
    SOURCES_DIR_ENV,
    DataLayout,
    configured_root,
)
from synthkd_assets.core.manifest_builders import distill_build_config, kd_build_config
from synthkd_assets.core.near_dup import ClusterSettings
from synthkd_assets.core.quota import QuotaTargets, quota_config
from synthkd_assets.core.sampling import MixTargets, selection_config
from synthkd_assets.core.source_mix import SourceMixTargets, source_mix_config
from synthkd_assets.core.synth import system_message_dict
from synthkd_contract import constants, sources
from synthkd_contract import near_dup as nd
from synthkd_contract import settings as env
from synthkd_contract.buckets import CURRICULUM_STAGES, SKILL_MIX, exercise_skill_table
from synthkd_contract.harmony_artifact import ARTIFACT_ROW_GROUPS_PER_PARTITION
from synthkd_contract.settings import Settings
from synthkd_contract.valuation import VALUATION_WINDOW

LAYOUT_KEY = "layout"
BUILD_KEY = "build"
VALUATION_KEY = "valuation"
TEACHER_CHECKPOINT_ENV = env.TEACHER_CHECKPOINT.name
STUDENT_CHECKPOINT_ENV = env.STUDENT_CHECKPOINT.name
BUILD_CONFIG_ENV = env.BUILD_CONFIG.name  # a JSON object of SynthKDBuildConfig's fields (docs/design.md)
SMOKE_READ_AHEAD = 4  # default raw rows read per shard in a smoke build, per conversation it may write


class SynthKDLayout(dg.ConfigurableResource):
    """Input and output roots of one build. Relative paths resolve against the working directory
    (the repository root when launched through workspace.yaml)."""

    raw_dir: str | None = Field(
        default=None,
        description=f"Raw SYNTH Parquet shards; unset: ${RAW_DIR_ENV} where the step runs, else {DEFAULT_RAW_DIR}.",
    )
    data_dir: str | None = Field(
        default=None, description=f"Output root; unset: ${DATA_DIR_ENV} where the step runs, else {DEFAULT_DATA_DIR}."
    )
    sources_dir: str | None = Field(
        default=None,
        description=f"Anchor sources' shards, <sources_dir>/<source>/<shard>; unset: ${SOURCES_DIR_ENV} where the "
        'step runs (unset or empty there: none); "": none, SYNTH alone, whatever the environment says.',
    )
    harmony_dir: str | None = Field(
        default=None,
        description=f"A synth_harmony_v1 artifact (manifest.json + synth_harmony_shard_NN.parquet), built beside or "
        f"instead of raw SYNTH; unset: ${HARMONY_DIR_ENV} where the step runs (unset or empty there: none); "
        '"": none, whatever the environment says.',
    )
    harmony_range_row_groups: int | None = Field(
        default=None,
        ge=1,
        description=f"Row groups per artifact partition; unset: ${HARMONY_RANGE_ENV}, else "
        f"{ARTIFACT_ROW_GROUPS_PER_PARTITION} (docs/contract.md, the synth_harmony_v1 artifact).",
    )
    distill_dir: str | None = Field(
        default=None, description="DistillKit dataset root; default <data_dir>/distill/synth_distill[_smoke]."
    )
    encoding_errors_log: str | None = Field(
        default=None,
        description="Sample of Harmony render failures (JSON lines); default "
        "<data_dir>/errors/synth_distill_encoding_errors.jsonl.",
    )

    @classmethod
    def from_settings(cls, settings: Settings) -> SynthKDLayout:
        """The code location's layout: each root a `dg.EnvVar` when its variable is set in `settings` (every
        process that runs a step then resolves it in its own environment), else the bundled sample and data/."""

        def root(variable: env.Variable, value: str | None, unset: str | None) -> str | None:
            return dg.EnvVar(variable.name) if value else unset

        return cls(
            raw_dir=root(env.RAW_DIR, settings.raw_dir, DEFAULT_RAW_DIR),
            data_dir=root(env.DATA_DIR, settings.data_dir, DEFAULT_DATA_DIR),
            sources_dir=root(env.SOURCES_DIR, settings.sources_dir, None),
            harmony_dir=root(env.HARMONY_DIR, settings.harmony_dir, None),
        )

    @classmethod
    def from_settings_now(cls, settings: Settings) -> SynthKDLayout:
        """The code location's roots as `settings` name them now (for a build launched from this process): the
        same values its `dg.EnvVar`s resolve to."""
        return cls(
            raw_dir=settings.raw_dir or DEFAULT_RAW_DIR,
            data_dir=settings.data_dir or DEFAULT_DATA_DIR,
            sources_dir=settings.sources_dir,
            harmony_dir=settings.harmony_dir,
        )

    def data_layout(self, smoke: bool = False) -> DataLayout:
        """Every path of a full (or smoke) build on these roots. A root left unset is the environment's, read
        by the process that runs the step: Dagster's run config for a resource replaces all of its fields, so
        `{"layout": {"config": {"raw_dir": ...}}}` keeps $SYNTHKD_DATA_DIR and $SYNTHKD_SOURCES_DIR. The optional
        roots have three states (`configured_root`): unset, "" (none) or a directory."""
        environment = DataLayout.from_settings(Settings.read())
        return DataLayout(
            Path(self.raw_dir) if self.raw_dir else environment.raw_root,
            Path(self.data_dir) if self.data_dir else environment.data_root,
            smoke,
            Path(self.distill_dir) if self.distill_dir else None,
            Path(self.encoding_errors_log) if self.encoding_errors_log else None,
            configured_root(self.sources_dir, environment.sources_root),
            configured_root(self.harmony_dir, environment.harmony_root),
            self.harmony_range_row_groups or environment.harmony_range_row_groups,
        )


class CurriculumStageConfig(dg.Config):
    """One context-length stage of the curriculum (docs/pool.md#curriculum): its ctx bucket shares of the stage's
    tokens."""

    stage: str
    ctx_mix: dict[str, float]
    tokens: int = Field(ge=0)
    seq_length: int = Field(ge=1)
    optional: bool = False


class SynthKDBuildConfig(dg.ConfigurableResource):
    """What one build writes: full or smoke, the 001 mixture targets, the DistillKit limits, threads."""

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
        f"Default {SMOKE_READ_AHEAD} x smoke_max_rows, so that smoke_max_rows conversations survive the filters "
        "and sampling.",
    )
    encode_threads: int = Field(
        default=1,
        ge=1,
        description="tiktoken threads per tokenize step. 1 when shards run in parallel processes (the default "
        "executor); raise it to use idle cores when a single shard runs alone.",
    )

    # 001 mixture targets (the synth_sampling_plan asset computes keep rates for them) and DistillKit output
    memorization_cap: float = Field(
        constants.MEMORIZATION_CAP, gt=0, le=1, description="Max memorization share after sampling."
    )
    non_english_min: float = Field(
        constants.NON_ENGLISH_MIN,
        ge=0,
        lt=1,
        description="Min share of non-English rows after sampling, opt-in: English rows are sampled down to reach "
        "it (default 0: English is never dropped).",
    )
    non_english_max: float = Field(
        constants.NON_ENGLISH_MAX, gt=0, le=1, description="Max non-English share after sampling."
    )
    global_keep: float = Field(
        constants.GLOBAL_KEEP, gt=0, le=1, description="Uniform keep rate on top of the mixture rates."
    )
    max_seq_len: int = Field(constants.MAX_SEQ_LEN, ge=1, description="DistillKit: longer conversations are dropped.")
    distill_valid_fraction: float = Field(
        constants.DISTILL_VALID_FRACTION,
        ge=0,
        lt=1,
        description="DistillKit validation fraction (hash of synth_id), in [0, 1): 0 writes no validation rows.",
    )

    exercise_skill_buckets: dict[str, str] = Field(
        default_factory=dict,
        description="Exercise labels this build maps to a skill bucket (B1..B4) on top of the contract's table "
        '(synthkd_contract/buckets.py EXERCISE_SKILL_BUCKET), e.g. {"code review": "B3"}: a label neither '
        "maps stops the build in its inventory pass. Hashed into every manifest's config.",
    )

    # near-duplicate control (docs/near-dup.md): before the sampling plan counts rows, so it shapes every dataset
    near_dup: bool = Field(
        default=True,
        description="Cap near-duplicate clusters of user prompts at max_per_cluster rows (off: clusters are still "
        "computed and reported, nothing is capped).",
    )
    near_dup_threshold: float = Field(
        nd.JACCARD_THRESHOLD,
        gt=0,
        le=1,
        description="Estimated Jaccard (MinHash) at which two prompts are near-duplicates.",
    )
    max_per_cluster: int = Field(
        nd.MAX_PER_CLUSTER, ge=1, description="Rows kept per near-duplicate cluster per epoch."
    )
    heldout_per_exercise: int = Field(
        nd.HELDOUT_PER_EXERCISE, ge=0, description="Clusters per exercise held out for the KL slice (never trained on)."
    )
    format_suite_per_form: int = Field(
        nd.FORMAT_SUITE_PER_FORM,
        ge=0,
        description="Clusters per checkable answer form (number, MCQ letter) held out for the format suite.",
    )

    # the sequence pool (docs/pool.md#the-quota-grid-on-tokens; 004): the skill mix on tokens, balancing, the curriculum
    skill_mix: dict[str, float] = Field(
        default_factory=lambda: dict(SKILL_MIX),
        description="Target share of SYNTH's tokens in the pool per skill bucket (B1..B4), renormalized over the "
        "buckets that hold tokens; the quota grid only downsamples. With anchor sources, their tokens (math B2, code "
        "B3, chat B4) come on top: the pool's overall skill shares are reported, not enforced (docs/sources.md).",
    )
    balance_tokens: bool = Field(
        default=False,
        description="Truncate every larger skill bucket to the smallest by tokens (salted hash, never oversampling) "
        "instead of skill_mix.",
    )
    # the source mix (002 "Global source mix"; docs/sources.md): used when anchor sources are present
    synth_share: float = Field(
        sources.SYNTH_SHARE,
        ge=0,
        allow_inf_nan=False,
        description="SYNTH's target share of the pool's tokens when anchor sources are present.",
    )
    anchor_shares: dict[str, float] = Field(
        default_factory=lambda: dict(sources.ANCHOR_CATEGORY_SHARES),
        description="Target share of the pool's tokens per anchor category (math, code, chat, personality); with "
        "synth_share, renormalized over the categories that hold tokens.",
    )
    source_caps: dict[str, float] = Field(
        default_factory=lambda: dict(sources.SOURCE_TOKEN_CAPS),
        description="The most of the pool's tokens a strictly capped source may hold (DeepCoder: 0.005).",
    )
    curriculum: list[CurriculumStageConfig] = Field(
        default_factory=lambda: [CurriculumStageConfig(**stage) for stage in CURRICULUM_STAGES],
        description="Context-length stages: ctx bucket shares, token budget and sequence length of each.",
    )

    @field_validator("exercise_skill_buckets")
    @classmethod
    def _known_buckets(cls, value: dict[str, str]) -> dict[str, str]:
        exercise_skill_table(value)  # ValueError naming the label and bucket
        return value

    @model_validator(mode="after")
    def _settings_hold_together(self) -> SynthKDBuildConfig:
        """Refuse, where the settings are declared, what each rule would refuse later (its ValueError names the
        setting and the value): the mixture targets (min <= max), the skill mix, the source mix and the
        curriculum stages."""
        self.targets()
        self.quota_targets()
        self.source_mix_targets()
        self.cluster_settings()
        self.curriculum_stages()
        return self

    @classmethod
    def from_settings(cls, settings: Settings, **fields: Any) -> SynthKDBuildConfig:
        """The build settings of `settings.build_config` ($SYNTHKD_BUILD_CONFIG: a JSON object of this resource's
        fields; none when unset), `fields` on top: what build.sh's runs, `dg launch` and the code location's
        sensors all use.

        Raises:
            ValueError: the variable is not a JSON object (naming it), or a field's value is invalid.
        """
        text = settings.build_config or "{}"
        try:
            config = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(f"${BUILD_CONFIG_ENV} is not JSON ({error}): {text[:200]!r}") from None
        if not isinstance(config, dict):
            raise ValueError(f"${BUILD_CONFIG_ENV} must be a JSON object of build settings, not {text[:200]!r}")
        unknown = sorted(set(config) - set(cls.model_fields))
        if unknown:
            raise ValueError(
                f"${BUILD_CONFIG_ENV} names no build setting {unknown} (they are {sorted(cls.model_fields)})"
            )
        try:
            return cls(**{**config, **fields})
        except ValueError as error:  # pydantic's: the field, the value and why
            raise ValueError(f"${BUILD_CONFIG_ENV}: {error}") from None

    def exercise_table(self) -> dict[str, str]:
        """The exercise -> skill bucket table of this build: the contract's with `exercise_skill_buckets`."""
        return exercise_skill_table(self.exercise_skill_buckets)

    def targets(self) -> MixTargets:
        return MixTargets(self.memorization_cap, self.non_english_min, self.non_english_max, self.global_keep)

    def cluster_settings(self) -> ClusterSettings:
        return ClusterSettings(
            self.near_dup,
            self.near_dup_threshold,
            self.max_per_cluster,
            self.heldout_per_exercise,
            self.format_suite_per_form,
        )

    def selection(self) -> dict:
        """The row selection every dataset goes through: the 001 filters and sampling, the near-duplicate
        cap and held-out clusters (hashed into each manifest's config)."""
        return {
            **selection_config(self.targets()),
            "near_dup": self.cluster_settings().to_dict(),
            "exercise_skill_bucket": self.exercise_table(),
        }

    def quota_targets(self) -> QuotaTargets:
        return QuotaTargets(dict(self.skill_mix), self.balance_tokens)

    def source_mix_targets(self) -> SourceMixTargets:
        return SourceMixTargets(self.synth_share, dict(self.anchor_shares), dict(self.source_caps))

    def curriculum_stages(self) -> tuple[CurriculumStage, ...]:
        return curriculum_stages([stage.model_dump() for stage in self.curriculum])

    def pool_config(self, with_sources: bool = False) -> dict:
        """Everything that shapes the pool's bytes and files (hashed into its manifest): the selection before it,
        the quota settings and bucket tables, the curriculum, the smoke caps; `with_sources` (anchor sources are
        present): the source mix settings too (a SYNTH-only build's config and bytes stay what they were)."""
        caps = self.caps()
        mix = {"source_mix": source_mix_config(self.source_mix_targets())} if with_sources else {}
        return {
            "selection": self.selection(),
            "quota": quota_config(self.quota_targets(), self.exercise_table()),
            **mix,
            "curriculum": [stage.to_dict() for stage in self.curriculum_stages()],
            "split": {"salt": constants.SPLIT_SALT, "valid_fraction": constants.VALID_FRACTION},
            "smoke_caps": {"max_rows": caps.max_rows, "max_tokens": caps.max_tokens, "input_rows": caps.max_input_rows},
        }

    def caps(self) -> BuildCaps:
        if not self.smoke:
            return NO_CAPS
        input_rows = self.smoke_input_rows
        if input_rows is None:
            input_rows = SMOKE_READ_AHEAD * self.smoke_max_rows
        return BuildCaps(self.smoke_max_rows, self.smoke_max_tokens, input_rows)

    def kd_config(self) -> dict:
        """The synth_kd_v1 build config of these settings (hashed into the manifest, re-checked by checks)."""
        caps = self.caps()
        return kd_build_config(
            system_message_dict(), caps.max_rows, caps.max_tokens, self.selection(), caps.max_input_rows
        )

    def distill_config(self) -> dict:
        """The DistillKit build config of these settings (hashed into its manifest, re-checked by its checks)."""
        caps = self.caps()
        return distill_build_config(
            system_message_dict(),
            self.selection(),
            self.max_seq_len,
            self.distill_valid_fraction,
            caps.max_rows,
            caps.max_tokens,
            caps.max_input_rows,
        )


class ValuationModelsResource(dg.ConfigurableResource):
    """The models synth_valuation_features runs (docs/distillation.md#valuation-features): checkpoint directories of
    `synthkd_training.models.save_checkpoint` (gpt_spec.json + model.pt). None: the model features are null,
    and no build process imports torch."""

    teacher_checkpoint: str | None = Field(
        default=None, description=f"Teacher checkpoint directory (${TEACHER_CHECKPOINT_ENV}); none: no model features."
    )
    student_checkpoint: str | None = Field(
        default=None,
        description=f"Student checkpoint directory (${STUDENT_CHECKPOINT_ENV}): student_teacher_kl; needs a teacher.",
    )
    window: int = Field(
        default=VALUATION_WINDOW, ge=1, description="Continuation tokens after the prompt averaged over."
    )
    batch_size: int = Field(default=4, ge=1, description="Conversations per forward pass.")
    device: str = Field(default="auto", description='"auto" (CUDA when there is one), "cpu" or "cuda".')

    @classmethod
    def from_settings(cls, settings: Settings) -> ValuationModelsResource:
        """The code location's models: a `dg.EnvVar` for each checkpoint variable set where it loads."""
        return cls(
            teacher_checkpoint=dg.EnvVar(TEACHER_CHECKPOINT_ENV) if settings.teacher_checkpoint else None,
            student_checkpoint=dg.EnvVar(STUDENT_CHECKPOINT_ENV) if settings.student_checkpoint else None,
        )

    @classmethod
    def from_settings_now(cls, settings: Settings) -> ValuationModelsResource:
        """The same checkpoints, as `settings` name them now (a build launched from this process)."""
        return cls(teacher_checkpoint=settings.teacher_checkpoint, student_checkpoint=settings.student_checkpoint)


def synthkd_resources(
    layout: SynthKDLayout, build: SynthKDBuildConfig | None = None, valuation: ValuationModelsResource | None = None
) -> dict[str, dg.ConfigurableResource]:
    """The resources of a build under their keys, for `dg.materialize` and evaluation contexts (`valuation`: the
    checkpoints of this process's environment when None)."""
    return {
        LAYOUT_KEY: layout,
        BUILD_KEY: build or SynthKDBuildConfig(),
        VALUATION_KEY: ValuationModelsResource.from_settings_now(Settings.read()) if valuation is None else valuation,
    }


def resources_run_config(resources: Mapping[str, dg.ConfigurableResource]) -> dict[str, dict]:
    """Run config setting every field of `resources` (`synthkd_resources`), the layout's roots as this process
    resolves them now (a relative root, which the manifests record as given, is relative to the repository
    root, where build.sh and the code server both run). A build stores it with each run, so that the run
    re-executed from the UI (in the code location, whose resources come from the environment it loaded in)
    reads and writes what it did."""
    roots = resources[LAYOUT_KEY].data_layout()
    config = {key: {"config": resource.model_dump()} for key, resource in resources.items()}
    config[LAYOUT_KEY]["config"].update(
        raw_dir=str(roots.raw_root),
        data_dir=str(roots.data_root),
        sources_dir="" if roots.sources_root is None else str(roots.sources_root),  # "": SYNTH alone
        harmony_dir="" if roots.harmony_root is None else str(roots.harmony_root),  # "": no artifact
        harmony_range_row_groups=roots.harmony_range_row_groups,
    )
    return config


def merged_resource_config(ours: dict[str, dict], theirs: dict[str, dict] | None) -> dict[str, dict]:
    """`ours` (resources_run_config) with `theirs` (a caller's run config for resources) on top, field by field:
    Dagster's config for a resource replaces all of its fields, so a caller's one field must not drop the rest."""
    merged = {key: {"config": dict(value["config"])} for key, value in ours.items()}
    for key, value in (theirs or {}).items():
        merged.setdefault(key, {"config": {}})["config"].update(value.get("config") or {})
    return merged
