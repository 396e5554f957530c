"""The valuation features of one pool shard (docs/distillation.md#valuation-features): one row per pool row, keyed by
its `id`.

Prompt-only features are polars expressions over the pool part: the exact prompt token count, the skill and
ctx bucket tags, and per lexical marker of synthkd_contract/valuation.py the number of its matches in the user
message. Model features (teacher entropy / margin, student-teacher KL over the continuation window) come from a
`ModelFeatures` function given by the caller (synthkd_training.valuation, which imports torch: the asset passes
one only when a checkpoint is configured); without one they are null, never invented. The conversation tokens
the models read are synth_tokenized's, the arrays the pool row was made from (same synth_id).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_assets.core.dataset_manifest import files_section
from synthkd_assets.core.near_dup import USER_PROMPT_PATH
from synthkd_assets.core.parquet_io import iter_frames, list_column_rows
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.steps import SHARD, Outputs, ParquetOutputs, ShardStep, Table, run_step
from synthkd_contract.manifest_seal import file_record, sha256_file
from synthkd_contract.schemas import VALUATION_SCHEMA
from synthkd_contract.valuation import (
    LEXICAL_MARKERS,
    MARKER_COLUMNS,
    MODEL_FEATURE_COLUMNS,
    VALUATION_WINDOW,
    WINDOW_TOKENS_COLUMN,
)

# (sequences, prompt token counts) -> feature columns, one value per conversation, in order
ModelFeatures = Callable[[Sequence[np.ndarray], Sequence[int]], dict[str, list]]
POOL_COLUMNS = ("id", "source_example_id", "skill_bucket", "ctx_bucket", "messages", "prompt_tokens_est")
MODEL_COLUMNS = (WINDOW_TOKENS_COLUMN, *MODEL_FEATURE_COLUMNS)
KEY_COLUMNS = ("id", "skill_bucket", "ctx_bucket")  # the row's key and tags; every other column is a number


def feature_config(window: int = VALUATION_WINDOW) -> dict[str, Any]:
    """What defines the features (the code version's slice, and the metadata): markers, columns, window."""
    return {
        "markers": dict(LEXICAL_MARKERS),
        "prompt": USER_PROMPT_PATH,
        "schema": VALUATION_SCHEMA.to_string(show_schema_metadata=False),
        "window": window,
    }


def prompt_text() -> pl.Expr:
    """The user message of a pool row's Harmony conversation (the text the markers are counted in)."""
    return pl.col("messages").str.json_path_match(USER_PROMPT_PATH).fill_null("")


def marker_counts(text: pl.Expr) -> list[pl.Expr]:
    """One Int32 column per lexical marker: its non-overlapping matches in `text`."""
    return [
        text.str.count_matches(pattern).cast(pl.Int32).alias(MARKER_COLUMNS[name])
        for name, pattern in LEXICAL_MARKERS.items()
    ]


def prompt_features(pool: pl.DataFrame) -> pl.DataFrame:
    """id, bucket tags, prompt tokens and the marker counts of every pool row, in order."""
    return pool.select(
        "id",
        "skill_bucket",
        "ctx_bucket",
        pl.col("prompt_tokens_est").cast(pl.Int32).alias("prompt_tokens"),
        *marker_counts(prompt_text()),
    )


def valuation_table(pool: pl.DataFrame, model: dict[str, list] | None) -> pa.Table:
    """VALUATION_SCHEMA rows of `pool`: the prompt features, and the model feature columns (null without)."""
    features = prompt_features(pool)
    n = features.height
    columns = {name: (model or {}).get(name, [None] * n) for name in MODEL_COLUMNS}
    for name, values in columns.items():
        if len(values) != n:
            raise ValueError(f"model feature {name}: {len(values)} values for {n} pool rows")
    table = features.to_arrow()
    for name in MODEL_COLUMNS:
        table = table.append_column(name, pa.array(columns[name], VALUATION_SCHEMA.field(name).type))
    return table.select(VALUATION_SCHEMA.names).cast(VALUATION_SCHEMA)


class ShardTokens:
    """The synth_tokenized tokens of a shard, by synth_id, a pool frame at a time. The shard's synth_id column is
    indexed once (row group, row in it); a lookup reads only the row groups holding the rows asked for, and keeps
    the last one read: a pool part is in its tokenized shard's order, so the whole pool reads the tokens about
    once (a scan of the shard per frame read it once per 512 rows)."""

    def __init__(self, tokenized_path: Path) -> None:
        self.path = tokenized_path
        with pq.ParquetFile(tokenized_path) as file:
            sizes = [file.metadata.row_group(g).num_rows for g in range(file.metadata.num_row_groups)]
            ids = pl.from_arrow(file.read(columns=["synth_id"]).column("synth_id"))
        self.index = pl.DataFrame(
            {
                "synth_id": ids,
                "group": np.repeat(np.arange(len(sizes), dtype=np.int64), sizes),
                "row": np.concatenate([np.arange(n, dtype=np.int64) for n in sizes] or [np.zeros(0, np.int64)]),
            }
        )
        self.cached: tuple[int, list[np.ndarray]] | None = None

    def _group(self, file: pq.ParquetFile, group: int) -> list[np.ndarray]:
        if self.cached is None or self.cached[0] != group:
            self.cached = (group, list_column_rows(file.read_row_group(group, columns=["tokens"]).column("tokens")))
        return self.cached[1]

    def __call__(self, synth_ids: list[str]) -> list[np.ndarray]:
        """The tokens of each synth_id, in the order given; a missing one is an error naming the file."""
        wanted = pl.DataFrame({"synth_id": synth_ids}, schema={"synth_id": pl.String}).with_row_index("order")
        found = wanted.join(self.index, on="synth_id", how="left")
        missing = found.filter(pl.col("group").is_null())["synth_id"].to_list()
        if missing:
            raise ValueError(f"{self.path}: no tokens for pool rows of synth_id {missing[:5]}")
        sequences: list[np.ndarray | None] = [None] * len(synth_ids)
        with pq.ParquetFile(self.path) as file:
            for order, group, row in found.sort("group", "order").select("order", "group", "row").iter_rows():
                sequences[order] = self._group(file, group)[row]
        return sequences  # type: ignore[return-value]  # every position filled: none is missing


def checkpoint_problem(teacher: str | None, student: str | None) -> str | None:
    """Why the valuation models named by `teacher` / `student` cannot run, or None: a student needs a teacher
    (student_teacher_kl compares their distributions), and each named checkpoint must be a directory."""
    if teacher is None and student is not None:
        return (
            f"a student checkpoint ({student}) without a teacher: student_teacher_kl needs the teacher's "
            "distribution; set the teacher checkpoint too"
        )
    for checkpoint in (teacher, student):
        if checkpoint is not None and not Path(checkpoint).is_dir():
            return f"valuation checkpoint {checkpoint} is not a directory (gpt_spec.json + model.pt)"
    return None


def checkpoint_sha256(directory: str | Path) -> str:
    """One digest of a checkpoint directory: sha256 of the sorted `relative path  sha256` lines of its files."""
    root = Path(directory)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    lines = "".join(f"{p.relative_to(root).as_posix()}  {sha256_file(p)}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


class FeatureSummary:
    """Per feature column, over the tables added: its mean (None when every value is null) and its null count."""

    def __init__(self) -> None:
        self.columns = [name for name in VALUATION_SCHEMA.names if name not in KEY_COLUMNS]
        self.sums = dict.fromkeys(self.columns, 0.0)
        self.values = dict.fromkeys(self.columns, 0)
        self.nulls = dict.fromkeys(self.columns, 0)

    def add(self, table: pa.Table) -> None:
        frame = pl.from_arrow(table.select(self.columns))
        for name in self.columns:
            column = frame[name]
            self.nulls[name] += column.null_count()
            self.values[name] += column.len() - column.null_count()
            self.sums[name] += column.sum() or 0

    def metadata(self) -> dict[str, float | int | None]:
        summary: dict[str, float | int | None] = {}
        for name in self.columns:
            summary[f"mean_{name}"] = self.sums[name] / self.values[name] if self.values[name] else None
            summary[f"nulls_{name}"] = self.nulls[name]
        return summary


@dataclass
class ValuationResult:
    report: ShardReport
    summary: dict[str, float | int | None]  # FeatureSummary.metadata()
    model_features: bool  # whether the model feature columns were computed


class ValuationStep(ShardStep):
    """Pool rows -> their features, a frame at a time (every row kept), so memory does not grow with the shard."""

    def __init__(self, pool_part: Path, tokenized_path: Path, out_path: Path, model: ModelFeatures | None) -> None:
        self.pool_part, self.out_path, self.model = pool_part, out_path, model
        self.tokens = ShardTokens(tokenized_path) if model is not None else None
        self.summary = FeatureSummary()

    def open_outputs(self) -> Outputs:
        return ParquetOutputs({SHARD: (self.out_path, VALUATION_SCHEMA)})

    def frames(self) -> Iterator[pl.DataFrame]:
        return iter_frames(self.pool_part, POOL_COLUMNS)

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        columns = None
        if self.model is not None and self.tokens is not None:
            sequences = self.tokens(frame["source_example_id"].to_list())
            columns = self.model(sequences, frame["prompt_tokens_est"].to_list())
        table = valuation_table(frame, columns)
        self.summary.add(table)
        return {SHARD: table}


def write_valuation_shard(
    pool_part: Path, tokenized_path: Path, out_path: Path, shard: str, model: ModelFeatures | None = None
) -> ValuationResult:
    """The features of every row of `pool_part`, written to `out_path` atomically (nothing half written); the
    model columns from `model` over the conversations' synth_tokenized tokens, or null without it."""
    step = ValuationStep(pool_part, tokenized_path, out_path, model)
    report = run_step(step, shard)
    return ValuationResult(report, step.summary.metadata(), model is not None)


def valuation_manifest(name: str, root: Path, pool_root: Path, pool_parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The valuation features' `manifest.json` (sealed like a dataset's, docs/pool.md#valuation-features): every
    feature part with its bytes and sha256 (`files`), and for each the pool part it was computed from
    (`pool_parts`: {feature part: {path, sha256}}), so a scorer trains on exactly these features of that pool.

    Args:
        name: the features' directory name (`synth_pool_v1_valuation`).
        root: that directory; its parts are named like the pool's.
        pool_root: the pool's root.
        pool_parts: the pool manifest's record of each part ({path, bytes, sha256}, relative to `pool_root`).

    Returns:
        The manifest. A pool part without features is listed in `pool_parts_without_features`.
    """
    present = {part["path"]: root / Path(part["path"]).name for part in pool_parts}
    with_features = {path: out for path, out in present.items() if out.is_file()}
    return {
        "dataset": name,
        "pool": pool_root.name,
        "pool_parts": {
            out.name: {"path": path, "sha256": part["sha256"]}
            for part in pool_parts
            for path, out in with_features.items()
            if part["path"] == path
        },
        "pool_parts_without_features": sorted(set(present) - set(with_features)),
        "files": files_section(file_record(root, out) for out in sorted(with_features.values())),
    }
