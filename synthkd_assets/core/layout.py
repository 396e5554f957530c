"""Where every file of a build lives: one frozen dataclass, asked by the assets, checks, sensor, schedule,
CLI, tests and benchmarks, so that no path is spelled out anywhere else.

    <raw root>/<key>.parquet                      raw shards (partition key = file stem)
    <sources root>/<source>/<stem>.{parquet,jsonl} anchor source shards (partition key = <source>/<stem>)
    <harmony root>/synth_harmony_shard_NN.parquet  synth_harmony_v1 artifact + manifest.json (partition key =
                                                  synth_harmony_shard_NN/rg_<first>-<last>, a row-group range)
    <raw root>/input_manifest.json                optional, user-provided: the shards the inputs should be
    <data>/synth_raw/hash_cache.json              raw sha256 by (size, mtime), shared by full and smoke builds
    <data>/tokenizer/o200k_base.tiktoken          the pinned vocabulary, shared by full and smoke builds
    <data>/.build.lock                            one build per data root
    <data>/.synthkd/written.jsonl                 every file the build wrote (core/ownership.py): all it removes
    <build>/<stage>/<key>.parquet, .report.json   intermediate stages (synth_harmony ... synth_tokenized)
    <build>/synth_tokenized/<key>.rows.parquet    each synth_tokenized row's token counts, written with it
    <build>/synth_harmony/manifest.json
    <build>/synth_sampling_plan/plan.json
    <build>/errors/<step>/<key>.jsonl             dropped rows of one shard step (first 1000)
    <build>/<distill name>/<key>.json             DistillKit per-shard records (kept out of its dataset root)
    <data>/megatron/<dataset>/                    {train,valid}/shard_XX_*.{bin,idx}, shards/shard_XX{.json,
                                                  _documents.parquet}, manifest.json
    <data>/distill/<distill name>/                {train,validation}/part-XXXXX.parquet, manifest.json
    <build>/synth_signatures/<key>.parquet        MinHash signatures and LSH band keys per shard
    <build>/synth_clusters/clusters.json          near-duplicate clusters: summary, held-out clusters; <key>.parquet
                                                  per shard: every row's cluster and the cap / held-out decision
    <data>/validation/<validation name>/          heldout_kl.parquet, format_suite.parquet, manifest.json
    <build>/synth_quota_plan/plan.json            the B x C token quota grid of the pool
    <data>/pool/<pool name>/                      parts/part-XXXXX.parquet (docs/pool.md#what-the-pool-holds rows),
    megatron/{train,valid}/ <B>_<C>/shard_XX_*.{bin,idx} (per-cell trios), shards/shard_XX.json,
                                                  curriculum/<stage>.{json,args}, manifest.json
    <data>/pool/<pool name>_valuation/            part-XXXXX.parquet: the valuation features of each pool part

`<build>` is the data root, or `<data>/smoke/` for a smoke build, so a smoke build never touches a full
build's intermediates; its datasets are named `*_smoke`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from synthkd_assets.core.ownership import WRITTEN_LEDGER, dataset_ledger_path, register_output_root
from synthkd_contract import constants
from synthkd_contract import settings as env
from synthkd_contract.buckets import POOL_DATASET_NAME, POOL_SMOKE_DATASET_NAME
from synthkd_contract.harmony_artifact import ARTIFACT_ROW_GROUPS_PER_PARTITION
from synthkd_contract.settings import Settings

RAW_DIR_ENV = env.RAW_DIR.name
HARMONY_DIR_ENV = env.HARMONY_DIR.name
HARMONY_RANGE_ENV = env.HARMONY_RANGE_ROW_GROUPS.name
SOURCES_DIR_ENV = env.SOURCES_DIR.name
DATA_DIR_ENV = env.DATA_DIR.name
DEFAULT_RAW_DIR = env.RAW_DIR.unset  # the bundled sample, relative to the working directory
DEFAULT_DATA_DIR = env.DATA_DIR.unset

# the partitioned steps that write <stage>/<key>.parquet and <stage>/<key>.report.json
STAGE_NAMES = ("synth_harmony", "synth_filtered", "synth_sampled", "synth_tokenized")
STAGE_SUFFIX = ".parquet"
REPORT_SUFFIX = ".report.json"
ROWS_SUFFIX = ".rows.parquet"  # synth_tokenized's row sizes beside its shard (TOKENIZED_ROWS_SCHEMA)
RECORD_SUFFIX = ".json"  # DistillKit per-shard records
ERROR_LOG_SUFFIX = ".jsonl"
SMOKE_SUBDIR = "smoke"
ERRORS_SUBDIR = "errors"
TOKENIZER_SUBDIR = "tokenizer"
MEGATRON_SUBDIR = "megatron"
DISTILL_SUBDIR = "distill"
POOL_SUBDIR = "pool"
POOL_PARTS_SUBDIR = "parts"  # the pool's Parquet rows (docs/pool.md#what-the-pool-holds), one part per shard
POOL_TRIOS_SUBDIR = "megatron"  # the pool's per-cell trios, {train,valid}/<B>_<C>/shard_XX_*
CURRICULUM_SUBDIR = "curriculum"
# kept out of the inputs as part of the output tree; the curriculum's Megatron-LM index cache is per user, outside
# the data root (core/curriculum.py, stage_cache_dir)
VALUATION_SUFFIX = "_valuation"  # <pool name>_valuation/: the features of the pool's rows, beside its sealed root
CURRICULUM_PLAN_FILENAME = constants.CURRICULUM_PLAN_FILENAME
QUOTA_PLAN_STAGE = "synth_quota_plan"
QUOTA_PLAN_FILENAME = "plan.json"
RAW_STATE_SUBDIR = "synth_raw"
MEGATRON_SHARDS_SUBDIR = "shards"  # per-shard records and documents tables of a synth_kd_v1 dataset
HASH_CACHE_FILENAME = "hash_cache.json"
BUILD_LOCK_FILENAME = ".build.lock"
SAMPLING_PLAN_STAGE = "synth_sampling_plan"
SIGNATURES_STAGE = "synth_signatures"  # <key>.parquet + <key>.report.json, like the stages
CLUSTERS_STAGE = "synth_clusters"  # <key>.parquet per shard + clusters.json
CLUSTERS_SUMMARY_FILENAME = "clusters.json"
VALIDATION_SUBDIR = "validation"
VALIDATION_NAME = "synth_validation_v1"
HELDOUT_KL_FILENAME = "heldout_kl.parquet"
FORMAT_SUITE_FILENAME = "format_suite.parquet"
HARMONY_STAGE = "synth_harmony"


def shard_record_path(dataset_root: Path, shard_index: int) -> Path:
    """A Megatron shard's record (report and split inventories) inside a synth_kd_v1 dataset root."""
    return dataset_root / MEGATRON_SHARDS_SUBDIR / f"shard_{shard_index:02d}.json"


def documents_path(dataset_root: Path, shard_index: int) -> Path:
    """Which synth_id is which document of which split: for debugging, and for the leakage check."""
    return dataset_root / MEGATRON_SHARDS_SUBDIR / f"shard_{shard_index:02d}_documents.parquet"


def rows_summary_path(tokenized_path: Path) -> Path:
    """Where the row sizes of a synth_tokenized shard file are (`<key>.rows.parquet` beside `<key>.parquet`).

    Args:
        tokenized_path: a synth_tokenized shard's `<key>.parquet`.

    Returns:
        The path of its TOKENIZED_ROWS_SCHEMA file, written together with it.
    """
    return tokenized_path.with_name(tokenized_path.name.removesuffix(STAGE_SUFFIX) + ROWS_SUFFIX)


class LayoutError(env.SettingError):
    """A layout a build cannot use; the message names the setting (variable) and why."""


class InputOutputOverlap(LayoutError):
    """An input root (raw shards, anchor sources, the artifact) overlaps the build's output tree."""


def configured_root(configured: str | None, environment: Path | None) -> Path | None:
    """An optional input root (anchor sources, the synth_harmony_v1 artifact) as a resource field sets it, in
    its three states: None (the field unset) takes the environment's root; "" says there is none (SYNTH alone,
    no artifact), whatever the environment says; any other value is that directory.

    Args:
        configured: the resource field's value.
        environment: the root the environment names (`DataLayout.from_settings`), or None.

    Returns:
        The root, or None when the build has none.
    """
    match configured:
        case None:
            return environment
        case "":
            return None
        case directory:
            return Path(directory)


@dataclass(frozen=True)
class DataLayout:
    """Every path of one build: raw root, data root, full or smoke, and the optional DistillKit overrides.

    Relative roots resolve against the working directory (the repository root when launched through
    workspace.yaml)."""

    raw_root: Path
    data_root: Path
    smoke: bool = False
    distill_dir: Path | None = None  # DistillKit dataset root; default <data>/distill/<distill name>
    encoding_errors_log: Path | None = None  # default <build>/errors/synth_distill_encoding_errors.jsonl
    sources_root: Path | None = None  # the anchor sources' shards (docs/sources.md); None: SYNTH only
    harmony_root: Path | None = None  # a synth_harmony_v1 artifact, beside or instead of raw SYNTH; None: none
    harmony_range_row_groups: int = ARTIFACT_ROW_GROUPS_PER_PARTITION  # row groups per artifact partition

    def __post_init__(self) -> None:
        if self.harmony_range_row_groups < 1:
            raise LayoutError(f"harmony_range_row_groups must be >= 1, got {self.harmony_range_row_groups}")
        if overlap := self.input_output_overlap():  # refused before anything is written, by every route
            raise InputOutputOverlap(overlap)
        # what this process writes below these roots is recorded, and never goes through a directory link
        register_output_root(self.data_root)
        if self.distill_dir is not None:
            register_output_root(self.distill_dir, dataset_ledger_path(self.data_root, self.distill_dir))

    def output_dirs(self) -> tuple[Path, ...]:
        """Every directory the full and the smoke build on this data root write into (and the DistillKit root
        and encoding-errors log configured here).

        Returns:
            The output tree, which the inputs must stay out of (`input_output_overlap`).
        """
        outputs = [self.data_root / name for name in (RAW_STATE_SUBDIR, TOKENIZER_SUBDIR, SMOKE_SUBDIR)]
        outputs += [self.data_root / name for name in (MEGATRON_SUBDIR, DISTILL_SUBDIR, POOL_SUBDIR)]
        outputs.append(self.data_root / VALIDATION_SUBDIR)
        outputs += [(self.data_root / WRITTEN_LEDGER).parent]
        full = replace(self, smoke=False) if self.smoke else self
        stages = (*STAGE_NAMES, SIGNATURES_STAGE, CLUSTERS_STAGE, SAMPLING_PLAN_STAGE, QUOTA_PLAN_STAGE)
        outputs += [full.stage_dir(stage) for stage in stages]
        outputs += [full.errors_dir(), full.distill_records_dir(), self.distill_root()]
        if self.encoding_errors_log is not None:
            outputs.append(self.encoding_errors_log)  # a file, not a tree
        return tuple(dict.fromkeys(outputs))

    def input_output_overlap(self) -> str | None:
        """Why the input roots (raw shards, anchor sources) and the output tree (`output_dirs`) overlap, links
        resolved: an input inside an output directory, or an output directory inside an input (the build would
        overwrite or re-read its own files); None when they are apart.

        Returns:
            A message naming both paths and the variables that set them, or None.
        """
        inputs = {
            f"raw shards ({RAW_DIR_ENV})": self.raw_root,
            f"anchor sources ({SOURCES_DIR_ENV})": self.sources_root,
            f"synth_harmony_v1 artifact ({HARMONY_DIR_ENV})": self.harmony_root,
        }
        for what, root in inputs.items():
            if root is None:
                continue
            source = root.resolve()
            for output in self.output_dirs():
                target = output.resolve()
                if source == target or target in source.parents or source in target.parents:
                    return (
                        f"the input directory of the {what} {root} overlaps the build's output directory {output} "
                        f"(data root {self.data_root}, {DATA_DIR_ENV}): the build would overwrite or re-read its own "
                        "files; nothing was written. Keep the inputs outside the data root's output directories."
                    )
        return None

    @classmethod
    def from_settings(cls, settings: Settings, smoke: bool = False) -> DataLayout:
        """The layout of the roots `settings` name (the bundled sample and data/ when unset).

        Args:
            settings: the process's `SYNTHKD_*` variables.
            smoke: the smoke build's layout.

        Returns:
            The layout.

        Raises:
            InputOutputOverlap: an input root overlaps the output tree.
        """
        return cls(
            Path(settings.raw_dir or DEFAULT_RAW_DIR),
            Path(settings.data_dir or DEFAULT_DATA_DIR),
            smoke,
            sources_root=Path(settings.sources_dir) if settings.sources_dir else None,
            harmony_root=Path(settings.harmony_dir) if settings.harmony_dir else None,
            harmony_range_row_groups=settings.harmony_range_row_groups,
        )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], smoke: bool = False) -> DataLayout:
        """`from_settings` of `environ`'s settings: what the build script's helpers and examples ask.

        Raises:
            SettingError: a variable's value is unusable.
            InputOutputOverlap: an input root overlaps the output tree.
        """
        return cls.from_settings(Settings.read(environ), smoke)

    # --- raw side --------------------------------------------------------------------------------
    def raw_shard(self, key: str) -> Path:
        return self.raw_root / f"{key}.parquet"

    def input_manifest(self) -> Path:
        return self.raw_root / constants.INPUT_MANIFEST_FILENAME

    def raw_hash_cache(self) -> Path:
        return self.data_root / RAW_STATE_SUBDIR / HASH_CACHE_FILENAME

    def build_lock(self) -> Path:
        return self.data_root / BUILD_LOCK_FILENAME

    def tokenizer_dir(self) -> Path:
        return self.data_root / TOKENIZER_SUBDIR

    def tokenizer_file(self) -> Path:
        return self.tokenizer_dir() / constants.TOKENIZER_FILENAME

    # --- intermediate stages, plan, reports, error logs ------------------------------------------
    def build_root(self) -> Path:
        """Where this build keeps its intermediate stages, sampling plan, reports and error logs."""
        return self.data_root / SMOKE_SUBDIR if self.smoke else self.data_root

    def stage_dir(self, stage: str) -> Path:
        return self.build_root() / stage

    def stage_output(self, stage: str, key: str) -> Path:
        return self.stage_dir(stage) / f"{key}{STAGE_SUFFIX}"

    def stage_report(self, stage: str, key: str) -> Path:
        return self.stage_dir(stage) / f"{key}{REPORT_SUFFIX}"

    def stage_rows(self, stage: str, key: str) -> Path:
        """synth_tokenized's row sizes of shard `key` (`rows_summary_path` of its output)."""
        return rows_summary_path(self.stage_output(stage, key))

    def harmony_manifest(self) -> Path:
        return self.stage_dir(HARMONY_STAGE) / constants.MANIFEST_FILENAME

    def sampling_plan(self) -> Path:
        return self.stage_dir(SAMPLING_PLAN_STAGE) / constants.SAMPLING_PLAN_FILENAME

    def clusters_summary(self) -> Path:
        return self.stage_dir(CLUSTERS_STAGE) / CLUSTERS_SUMMARY_FILENAME

    def validation_root(self) -> Path:
        name = f"{VALIDATION_NAME}_smoke" if self.smoke else VALIDATION_NAME
        return self.data_root / VALIDATION_SUBDIR / name

    def heldout_kl(self) -> Path:
        return self.validation_root() / HELDOUT_KL_FILENAME

    def format_suite(self) -> Path:
        return self.validation_root() / FORMAT_SUITE_FILENAME

    def validation_manifest(self) -> Path:
        return self.validation_root() / constants.MANIFEST_FILENAME

    def quota_plan(self) -> Path:
        return self.stage_dir(QUOTA_PLAN_STAGE) / QUOTA_PLAN_FILENAME

    def errors_dir(self) -> Path:
        return self.build_root() / ERRORS_SUBDIR

    def error_log(self, step: str, key: str) -> Path:
        return self.errors_dir() / step / f"{key}{ERROR_LOG_SUFFIX}"

    # --- synth_kd_v1 (Megatron) --------------------------------------------------------------------
    def megatron_name(self) -> str:
        return constants.SMOKE_DATASET_NAME if self.smoke else constants.DATASET_NAME

    def megatron_root(self) -> Path:
        return self.data_root / MEGATRON_SUBDIR / self.megatron_name()

    def megatron_manifest(self) -> Path:
        return self.megatron_root() / constants.MANIFEST_FILENAME

    def shard_record(self, shard_index: int) -> Path:
        return shard_record_path(self.megatron_root(), shard_index)

    def documents_table(self, shard_index: int) -> Path:
        return documents_path(self.megatron_root(), shard_index)

    # --- DistillKit ----------------------------------------------------------------------------------
    def distill_name(self) -> str:
        return constants.DISTILL_SMOKE_DATASET_NAME if self.smoke else constants.DISTILL_DATASET_NAME

    def distill_root(self) -> Path:
        return self.distill_dir or self.data_root / DISTILL_SUBDIR / self.distill_name()

    def distill_manifest(self) -> Path:
        return self.distill_root() / constants.MANIFEST_FILENAME

    def distill_records_dir(self) -> Path:
        """Per-shard records (report, files, length histogram) of the DistillKit build, kept out of its root."""
        return self.stage_dir(self.distill_name())

    def distill_record(self, key: str) -> Path:
        return self.distill_records_dir() / f"{key}{RECORD_SUFFIX}"

    def encoding_errors_log_path(self) -> Path:
        return self.encoding_errors_log or self.errors_dir() / constants.DISTILL_ENCODING_ERRORS_FILENAME

    # --- the sequence pool (docs/pool.md#what-the-pool-holds) ---------------------------------------------------------
    def pool_name(self) -> str:
        return POOL_SMOKE_DATASET_NAME if self.smoke else POOL_DATASET_NAME

    def pool_root(self) -> Path:
        return self.data_root / POOL_SUBDIR / self.pool_name()

    def pool_part(self, shard_index: int) -> Path:
        return self.pool_root() / POOL_PARTS_SUBDIR / constants.distill_part_name(shard_index)

    def pool_trio_root(self) -> Path:
        """Where the per-cell trios are: <split>/<B>_<C>/shard_XX_{tokens,lossmask,span}.{bin,idx}."""
        return self.pool_root() / POOL_TRIOS_SUBDIR

    def pool_record(self, shard_index: int) -> Path:
        return shard_record_path(self.pool_root(), shard_index)

    def pool_manifest(self) -> Path:
        return self.pool_root() / constants.MANIFEST_FILENAME

    def curriculum_dir(self) -> Path:
        return self.pool_root() / CURRICULUM_SUBDIR

    def curriculum_plan(self) -> Path:
        """Every stage's plan (ctx shares, epochs, blends with prefixes relative to the trio root)."""
        return self.curriculum_dir() / CURRICULUM_PLAN_FILENAME

    # --- the valuation features of the pool (docs/distillation.md#valuation-features) ---------------------------------
    def valuation_root(self) -> Path:
        """Beside the pool's root, not in it: the pool manifest seals what is inside, and the features change
        with the checkpoints configured, not with the pool."""
        return self.data_root / POOL_SUBDIR / f"{self.pool_name()}{VALUATION_SUFFIX}"

    def valuation_manifest(self) -> Path:
        """The valuation features' sealed manifest, written with the pool's (it names the pool part each feature
        part was made from)."""
        return self.valuation_root() / constants.MANIFEST_FILENAME

    def valuation_part(self, shard_index: int) -> Path:
        return self.valuation_root() / constants.distill_part_name(shard_index)

    # --- manifests record paths relative to the data root ---------------------------------------------
    def recorded(self, path: Path) -> str:
        """How a manifest records a path: relative to the data root when under it (so a dataset can move
        and two builds in different roots have identical manifests), absolute otherwise."""
        try:
            return path.resolve().relative_to(self.data_root.resolve()).as_posix()
        except ValueError:
            return str(path.resolve())

    def resolve_recorded(self, recorded: str) -> Path:
        return self.data_root / recorded  # an absolute recorded path stays absolute

    # --- per-shard outputs of both builds on this data root (a removed shard's go from both) ----------
    def both_builds(self) -> tuple[DataLayout, DataLayout]:
        """The full and the smoke build on this data root, with the default DistillKit roots."""
        plain = replace(self, distill_dir=None, encoding_errors_log=None)
        return replace(plain, smoke=False), replace(plain, smoke=True)

    def all_stage_dirs(self) -> tuple[Path, ...]:
        """<key>.parquet, <key>.report.json"""
        stages = (*STAGE_NAMES, SIGNATURES_STAGE, CLUSTERS_STAGE)
        return tuple(build.stage_dir(stage) for build in self.both_builds() for stage in stages)

    def all_distill_records_dirs(self) -> tuple[Path, ...]:
        """<key>.json"""
        return tuple(build.distill_records_dir() for build in self.both_builds())

    def all_errors_dirs(self) -> tuple[Path, ...]:
        """<step>/<key>.jsonl"""
        return tuple(build.errors_dir() for build in self.both_builds())

    def all_megatron_roots(self) -> tuple[Path, ...]:
        """{train,valid}/shard_XX_*.{bin,idx}, shards/shard_XX{.json,_documents.parquet}"""
        return tuple(build.megatron_root() for build in self.both_builds())

    def all_pool_roots(self) -> tuple[Path, ...]:
        """parts/part-XXXXX.parquet, megatron/{train,valid}/<cell>/shard_XX_*, shards/shard_XX.json"""
        return tuple(build.pool_root() for build in self.both_builds())

    def all_valuation_roots(self) -> tuple[Path, ...]:
        """part-XXXXX.parquet"""
        return tuple(build.valuation_root() for build in self.both_builds())

    def all_distill_roots(self) -> tuple[Path, ...]:
        """{train,validation}/part-XXXXX.parquet: this build's root (configured or not) and both defaults."""
        return tuple(dict.fromkeys([self.distill_root(), *(build.distill_root() for build in self.both_builds())]))
