"""The prompt scorer and the sampling policy (docs/distillation.md#scorer).

- `ScorerConfig` says which feature columns go in (numeric, nullable, categorical), the head size, the seed, the
  training schedule and τ; `train_scorer` fits the normalization (mean/std of each numeric feature over the
  training rows) and one small MLP head per skill bucket on learning-progress labels
  (docs/distillation.md#learning-progress-labels), mapped per bucket to a [0, 1] target by rank; `Scorer.predict` gives
  `utility_score ∈ [0, 1]` (a sigmoid).
- A null feature is never invented: a nullable column enters as its normalized value with null filled by 0
  (the training mean) plus an is-null indicator input, so the head sees that the value is absent; a null in a
  column not declared nullable is an error naming the column.
- `sampling_weights` is `exp(τ · utility_score)`: the weights a curriculum stage's stream draws its conversations
  by (docs/pool.md#the-stream: per-unit token quotas, a per-cluster cap, an ε diversity tail).
- `save_scorer` / `load_scorer`: the heads, the feature config (normalization included) and a sealed manifest
  with every file's sha256 (synthkd_contract.manifest_seal, the datasets' own format); loading verifies them.

torch runs on CPU in float32 here: the heads are tiny, and CPU float32 with a fixed seed gives identical weights.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from synthkd_contract.buckets import CTX_BUCKETS, SKILL_BUCKETS
from synthkd_contract.constants import MANIFEST_FILENAME
from synthkd_contract.manifest_seal import ManifestError, file_record, verify_manifest, write_sealed

SCORER_FORMAT = "synthkd-scorer/1"
"""The layout of a scorer directory; a loader refuses any other."""
WEIGHTS_FILE = "heads.pt"
"""`torch.save` of every head's state dict, keys `<bucket>.<parameter>` (safetensors is not installed)."""
FEATURE_CONFIG_FILE = "feature_config.json"
"""The ScorerConfig, the fitted normalization and the training summary."""
LABEL_MAPPING = "rank"
"""lp_value -> target: per-bucket average rank scaled to [0, 1] (`lp_targets`)."""
ID_COLUMN, BUCKET_COLUMN, LABEL_COLUMN = "id", "skill_bucket", "lp_value"
RESERVED_COLUMNS = (ID_COLUMN, BUCKET_COLUMN, LABEL_COLUMN, "utility_score", "sampling_weight")


class UnknownSkillBucket(ValueError):
    """A skill bucket that synthkd_contract/buckets.py does not define, or one the scorer has no head for."""


class FeatureError(ValueError):
    """A feature table the scorer cannot read as configured: a missing column, a null where none is allowed,
    a non-finite value or an unknown category."""


def check_buckets(buckets: Sequence[str] | pl.Series, known: Sequence[str] = SKILL_BUCKETS, what: str = "") -> None:
    """UnknownSkillBucket naming the first bucket outside `known` (the contract's SKILL_BUCKETS by default)."""
    unknown = sorted(set(buckets) - set(known), key=str)
    if unknown:
        raise UnknownSkillBucket(
            f"skill bucket {unknown[0]!r}{what} is not one of {tuple(known)}"
            + (" (synthkd_contract/buckets.py SKILL_BUCKETS)" if tuple(known) == SKILL_BUCKETS else "")
        )


# --- the feature config -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScorerConfig:
    """What goes into the heads and how they are trained; saved with the heads as the feature config.

    `feature_columns` are numeric (booleans count as 0/1); `nullable_columns` (a subset) may hold nulls and get
    an is-null indicator input; `categorical_columns` maps a string column to its categories, one-hot encoded
    (an unseen category is an error). `version` names the artifact (recorded in the manifest)."""

    feature_columns: tuple[str, ...]
    nullable_columns: tuple[str, ...] = ()
    categorical_columns: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    hidden_size: int = 16
    seed: int = 0
    tau: float = 1.0
    epochs: int = 300
    learning_rate: float = 0.02
    weight_decay: float = 1e-4
    version: str = "scorer-v1"

    def __post_init__(self) -> None:
        object.__setattr__(self, "feature_columns", tuple(self.feature_columns))
        object.__setattr__(self, "nullable_columns", tuple(self.nullable_columns))
        object.__setattr__(
            self, "categorical_columns", {k: tuple(v) for k, v in sorted(dict(self.categorical_columns).items())}
        )
        names = [*self.feature_columns, *self.categorical_columns]
        if not names:
            raise ValueError("a scorer needs at least one feature column")
        if len(set(names)) != len(names):
            raise ValueError(f"feature columns named twice: {sorted({n for n in names if names.count(n) > 1})}")
        if clash := sorted(set(names) & set(RESERVED_COLUMNS)):
            raise ValueError(f"{clash} cannot be features: they are the scorer's keys, label or outputs")
        if stray := sorted(set(self.nullable_columns) - set(self.feature_columns)):
            raise ValueError(f"nullable columns {stray} are not among the numeric feature_columns")
        if empty := [k for k, v in self.categorical_columns.items() if not v or len(set(v)) != len(v)]:
            raise ValueError(f"categorical columns {empty} need distinct categories")
        if self.hidden_size < 1 or self.epochs < 1 or not self.learning_rate > 0:
            raise ValueError("hidden_size and epochs must be >= 1 and learning_rate > 0")
        if not math.isfinite(self.tau):
            raise ValueError(f"tau {self.tau} is not finite")

    @classmethod
    def for_table(
        cls, features: pl.DataFrame, nullable: Sequence[str] = (), exclude: Sequence[str] = (), **settings: Any
    ) -> ScorerConfig:
        """A config over every column of a valuation-features table: numeric columns are features (nullable when
        named in `nullable` or holding a null), `ctx_bucket` is one-hot over the contract's CTX_BUCKETS; any
        other column must be named in `exclude` (a guess about what it means would be a silent feature)."""
        numeric, categorical, other = [], {}, []
        for name, dtype in features.schema.items():
            if name in RESERVED_COLUMNS or name in exclude:
                continue
            if dtype.is_numeric() or dtype == pl.Boolean:
                numeric.append(name)
            elif name == "ctx_bucket":
                categorical[name] = CTX_BUCKETS
            else:
                other.append(f"{name} ({dtype})")
        if other:
            raise FeatureError(f"columns {other} are neither numeric nor ctx_bucket: pass them in `exclude`")
        holding_null = {name for name in numeric if features[name].null_count()}
        nullable_columns = tuple(name for name in numeric if name in set(nullable) | holding_null)
        return cls(tuple(numeric), nullable_columns, categorical, **settings)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["feature_columns"] = list(self.feature_columns)
        data["nullable_columns"] = list(self.nullable_columns)
        data["categorical_columns"] = {k: list(v) for k, v in self.categorical_columns.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ScorerConfig:
        return cls(**{**data, "categorical_columns": {k: tuple(v) for k, v in data["categorical_columns"].items()}})


@dataclass(frozen=True)
class Normalization:
    """Mean and standard deviation of each numeric feature over the non-null training values (float64, stored
    as JSON numbers, which round-trip exactly). A column without values gets (0, 1); a constant one std 1."""

    mean: Mapping[str, float]
    std: Mapping[str, float]

    @classmethod
    def fit(cls, features: pl.DataFrame, config: ScorerConfig) -> Normalization:
        mean, std = {}, {}
        for name in config.feature_columns:
            values = _numeric_values(features, name, config)[0]
            values = values[~np.isnan(values)]
            mean[name] = float(values.mean()) if values.size else 0.0
            spread = float(values.std()) if values.size else 0.0
            std[name] = spread if spread > 0 else 1.0
        return cls(mean, std)


def _numeric_values(features: pl.DataFrame, name: str, config: ScorerConfig) -> tuple[np.ndarray, np.ndarray]:
    """(float64 values with NaN where null, is-null mask) of a numeric feature column, after its checks."""
    if name not in features.columns:
        raise FeatureError(f"feature column {name!r} is missing (the table has {features.columns})")
    column = features[name]
    if not (column.dtype.is_numeric() or column.dtype == pl.Boolean):
        raise FeatureError(f"feature column {name!r} is {column.dtype}, not numeric")
    nulls = column.is_null().to_numpy()
    values = column.cast(pl.Float64).to_numpy().astype(np.float64, copy=True)
    if nulls.any() and name not in config.nullable_columns:
        raise FeatureError(
            f"feature column {name!r} holds {int(nulls.sum())} null(s) but is not in nullable_columns: a missing "
            "value is never invented; declare the column nullable (it then gets an is-null indicator)"
        )
    present = values[~nulls]
    if present.size and not np.isfinite(present).all():
        raise FeatureError(f"feature column {name!r} holds NaN or infinite values: write a missing value as null")
    values[nulls] = np.nan
    return values, nulls


def feature_matrix(features: pl.DataFrame, config: ScorerConfig, normalization: Normalization) -> np.ndarray:
    """The heads' float32 input, one row per table row: each numeric feature normalized (null -> 0), then an
    is-null indicator per nullable column, then the one-hot categories."""
    numeric, indicators, one_hot = [], [], []
    for name in config.feature_columns:
        values, nulls = _numeric_values(features, name, config)
        normalized = (values - normalization.mean[name]) / normalization.std[name]
        normalized[nulls] = 0.0
        numeric.append(normalized)
        if name in config.nullable_columns:
            indicators.append(nulls.astype(np.float64))
    for name, categories in config.categorical_columns.items():
        if name not in features.columns:
            raise FeatureError(f"categorical column {name!r} is missing (the table has {features.columns})")
        column = features[name].cast(pl.String)
        if column.null_count():
            raise FeatureError(f"categorical column {name!r} holds nulls")
        if unseen := sorted(set(column.unique().to_list()) - set(categories)):
            raise FeatureError(f"categorical column {name!r} holds {unseen}, not among {categories}")
        one_hot.extend((column == category).cast(pl.Float64).to_numpy() for category in categories)
    return np.stack([*numeric, *indicators, *one_hot], axis=1).astype(np.float32)


def input_size(config: ScorerConfig) -> int:
    return (
        len(config.feature_columns)
        + len(config.nullable_columns)
        + sum(len(categories) for categories in config.categorical_columns.values())
    )


# --- labels ------------------------------------------------------------------------------------------------
def lp_targets(labelled: pl.DataFrame) -> np.ndarray:
    """The [0, 1] training target of each row of (skill_bucket, lp_value): its average rank within its bucket,
    (rank - 1) / (n - 1) (0.5 for a bucket of one row).

    Rank, not min-max: lp_value = Δmetric / tokens is noisy, heavy-tailed and on a different scale per bucket, so
    one outlier would squeeze every other min-max target against 0 or 1; ranks only keep the order the sampler
    needs (which prompts teach more), and a sigmoid head fits uniform targets well."""
    values = labelled[LABEL_COLUMN]
    if values.null_count() or not np.isfinite(values.cast(pl.Float64).to_numpy()).all():
        raise ValueError(f"{LABEL_COLUMN} holds nulls or non-finite values: label only measured rows")
    ranked = labelled.select(
        rank=pl.col(LABEL_COLUMN).rank("average").over(BUCKET_COLUMN),
        n=pl.len().over(BUCKET_COLUMN),
    )
    rank, n = ranked["rank"].to_numpy(), ranked["n"].to_numpy()
    return np.where(n > 1, (rank - 1) / np.maximum(n - 1, 1), 0.5)


@contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one intra-op thread while the heads run: they are far too small to gain from threads (on a
    loaded machine, two threads made a training step 40x slower), and one thread fixes the order of every
    float sum, so the weights do not depend on the machine's core count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


# --- the heads -----------------------------------------------------------------------------------------------
def _bucket_seed(seed: int, bucket: str) -> int:
    """A head's initialization seed: from the scorer's seed and the bucket only, so a head does not change
    when another bucket gains or loses labels."""
    return int.from_bytes(hashlib.sha256(f"synthkd/scorer:{seed}:{bucket}".encode()).digest()[:7], "big")


def _head(config: ScorerConfig) -> torch.nn.Module:
    """features -> hidden (tanh) -> one logit; the sigmoid of the logit is utility_score."""
    return torch.nn.Sequential(
        torch.nn.Linear(input_size(config), config.hidden_size),
        torch.nn.Tanh(),
        torch.nn.Linear(config.hidden_size, 1),
    )


@dataclass
class Scorer:
    """Per-skill-bucket heads over the configured features; `predict` scores rows of their own bucket only."""

    config: ScorerConfig
    normalization: Normalization
    heads: dict[str, torch.nn.Module]
    training_rows: dict[str, int]

    @property
    def buckets(self) -> tuple[str, ...]:
        return tuple(self.heads)

    def predict(self, features: pl.DataFrame) -> np.ndarray:
        """utility_score ∈ [0, 1] (float32) of each row, by the head of its skill_bucket, in the table's order.
        UnknownSkillBucket for a bucket the contract does not define or that had no labels to train a head."""
        if BUCKET_COLUMN not in features.columns:
            raise FeatureError(f"the feature table has no {BUCKET_COLUMN!r} column")
        buckets = features[BUCKET_COLUMN]
        if buckets.null_count():
            raise UnknownSkillBucket(f"{buckets.null_count()} row(s) have a null {BUCKET_COLUMN}")
        check_buckets(buckets.unique().to_list())
        check_buckets(buckets.unique().to_list(), self.buckets, what=" has no trained scorer head (no labelled rows)")
        inputs = torch.from_numpy(feature_matrix(features, self.config, self.normalization))
        scores = torch.empty(features.height, dtype=torch.float32)
        bucket_array = buckets.to_numpy()
        with torch.no_grad(), _one_thread():
            for bucket, head in self.heads.items():
                rows = torch.from_numpy(np.flatnonzero(bucket_array == bucket))
                if len(rows):
                    scores[rows] = torch.sigmoid(head(inputs[rows]).squeeze(-1))
        return scores.numpy()

    def score(self, features: pl.DataFrame) -> pl.DataFrame:
        """The table with `utility_score` and `sampling_weight = exp(τ · utility_score)` columns (Float64, as
        in the pool's schema)."""
        utility = self.predict(features).astype(np.float64)
        return features.with_columns(
            utility_score=pl.Series(utility), sampling_weight=pl.Series(sampling_weights(utility, self.config.tau))
        )


def train_scorer(
    features: pl.DataFrame, labels: pl.DataFrame, config: ScorerConfig | None = None, **settings: Any
) -> Scorer:
    """Heads trained on the rows of `features` (id, skill_bucket, feature columns) that `labels` (id, lp_value)
    label. Deterministic: rows in id order, each head seeded from (seed, bucket), full-batch Adam on the
    binary cross-entropy against the rank targets, CPU float32. `config` defaults to `ScorerConfig.for_table`
    with `settings`. A bucket gets a head iff it has labelled rows."""
    for name, table, key in (("features", features, BUCKET_COLUMN), ("labels", labels, LABEL_COLUMN)):
        if missing := [column for column in (ID_COLUMN, key) if column not in table.columns]:
            raise FeatureError(f"{name} lacks column(s) {missing}")
        if table[ID_COLUMN].is_duplicated().any():
            raise FeatureError(f"{name}: id {table.filter(pl.col(ID_COLUMN).is_duplicated())[ID_COLUMN][0]!r} twice")
    if stray := labels.join(features, on=ID_COLUMN, how="anti")[ID_COLUMN].head(3).to_list():
        raise FeatureError(f"labels for ids without features, e.g. {stray}")
    labelled = features.drop(LABEL_COLUMN, strict=False).join(
        labels.select(ID_COLUMN, LABEL_COLUMN), on=ID_COLUMN, how="inner"
    )
    labelled = labelled.sort(ID_COLUMN)
    if labelled.height == 0:
        raise ValueError("no labelled rows to train on")
    if config is not None and settings:
        raise ValueError(f"give either a config or settings for ScorerConfig.for_table, not both: {sorted(settings)}")
    config = config or ScorerConfig.for_table(labelled.drop(LABEL_COLUMN), **settings)
    check_buckets(labelled[BUCKET_COLUMN].unique().to_list())
    normalization = Normalization.fit(labelled, config)
    inputs = torch.from_numpy(feature_matrix(labelled, config, normalization))
    targets = torch.from_numpy(lp_targets(labelled).astype(np.float32))
    bucket_array = labelled[BUCKET_COLUMN].to_numpy()
    heads, training_rows = {}, {}
    for bucket in SKILL_BUCKETS:
        rows = torch.from_numpy(np.flatnonzero(bucket_array == bucket))
        if not len(rows):
            continue
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_bucket_seed(config.seed, bucket))
            head = _head(config)
        optimizer = torch.optim.Adam(head.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay)
        x, y = inputs[rows], targets[rows]
        with _one_thread():
            for _ in range(config.epochs):
                optimizer.zero_grad()
                loss = torch.nn.functional.binary_cross_entropy_with_logits(head(x).squeeze(-1), y)
                loss.backward()
                optimizer.step()
        heads[bucket] = head.eval()
        training_rows[bucket] = len(rows)
    return Scorer(config, normalization, heads, training_rows)


def sampling_weights(utility_score: np.ndarray | Sequence[float], tau: float) -> np.ndarray:
    """`exp(τ · utility_score)` (docs/distillation.md#scorer): with utility in [0, 1], the heaviest row weighs at most
    e^τ times the lightest, so no prompt is filtered out; τ = 0 is uniform sampling."""
    return np.exp(tau * np.asarray(utility_score, dtype=np.float64))


# --- artifacts -----------------------------------------------------------------------------------------------
@contextmanager
def _directory_written_atomically(directory: Path) -> Iterator[Path]:
    """A sibling temporary directory to write into, renamed onto `directory` (replacing it) once complete, so a
    crash never leaves a directory that looks like a complete scorer (the pattern of models.save_checkpoint)."""
    partial = directory.with_name(f".{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        yield partial
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if directory.exists():
        shutil.rmtree(directory)
    partial.rename(directory)


def save_scorer(scorer: Scorer, directory: str | Path) -> Path:
    """Writes `heads.pt`, `feature_config.json` and `manifest.json` (format, version, buckets, every file's bytes
    and sha256) sealed by `manifest.json.sha256`: the datasets' manifest format, verified the same way."""
    directory = Path(directory)
    with _directory_written_atomically(directory) as partial:
        weights = {
            f"{bucket}.{name}": value.detach().cpu().clone()
            for bucket, head in scorer.heads.items()
            for name, value in head.state_dict().items()
        }
        torch.save(weights, partial / WEIGHTS_FILE)
        feature_config = {
            "format": SCORER_FORMAT,
            "config": scorer.config.to_dict(),
            "normalization": {"mean": dict(scorer.normalization.mean), "std": dict(scorer.normalization.std)},
            "label_mapping": LABEL_MAPPING,
            "input_size": input_size(scorer.config),
            "training_rows": scorer.training_rows,
        }
        (partial / FEATURE_CONFIG_FILE).write_text(json.dumps(feature_config, indent=2, sort_keys=True) + "\n")
        manifest = {
            "format": SCORER_FORMAT,
            "version": scorer.config.version,
            "buckets": list(scorer.buckets),
            "tau": scorer.config.tau,
            "files": [file_record(partial, partial / name) for name in (FEATURE_CONFIG_FILE, WEIGHTS_FILE)],
        }
        write_sealed(partial / MANIFEST_FILENAME, manifest)
    return directory


def load_scorer(directory: str | Path) -> Scorer:
    """The scorer `save_scorer` wrote, after checking the manifest's seal and every file's size and sha256
    (ManifestError naming each file that differs, or any file the manifest does not list)."""
    directory = Path(directory)
    manifest = verify_manifest(directory)
    if manifest.get("format") != SCORER_FORMAT:
        raise ManifestError(f"{directory / MANIFEST_FILENAME}: format {manifest.get('format')!r}, not {SCORER_FORMAT}")
    saved = json.loads((directory / FEATURE_CONFIG_FILE).read_text())
    config = ScorerConfig.from_dict(saved["config"])
    normalization = Normalization(saved["normalization"]["mean"], saved["normalization"]["std"])
    weights = torch.load(directory / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    heads = {}
    for bucket in manifest["buckets"]:
        check_buckets([bucket])
        head = _head(config)
        prefix = f"{bucket}."
        head.load_state_dict({k[len(prefix) :]: v for k, v in weights.items() if k.startswith(prefix)}, strict=True)
        heads[bucket] = head.eval()
    if stray := sorted(k for k in weights if k.split(".", 1)[0] not in heads):
        raise ManifestError(f"{directory / WEIGHTS_FILE}: weights of no listed bucket: {stray[:3]}")
    return Scorer(config, normalization, heads, {k: int(v) for k, v in saved["training_rows"].items()})
