"""One function per pipeline step, each turning one input shard into one output shard.

These are the rules the Dagster assets wrap: plain functions over paths that return a
`ShardReport` (rows in/out, drops by reason, mixes, token counts) the shell turns into metadata.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

import numpy as np
import polars as pl
import pyarrow as pa

from synthkd_assets import contracts
from synthkd_assets.core.atomic import atomic_write_text
from synthkd_assets.core.dataset_manifest import file_record, files_section
from synthkd_assets.core.inventory import read_raw_shard, shard_index_from_name
from synthkd_assets.core.layout import documents_path, shard_record_path
from synthkd_assets.core.megatron_io import MegatronShardWriter, ShardSplitInventory, commit_shard
from synthkd_assets.core.parquet_io import (
    OutputFileError,
    ParquetShardWriter,
    iter_frames,
    list_column,
    list_column_rows,
    parquet_row_count,
)
from synthkd_assets.core.render import FastRenderer, HarmonyRenderer, RenderError, span_token_counts

Renderer = FastRenderer | HarmonyRenderer
from synthkd_assets.core.sampling import assign_split
from synthkd_assets.core.synth import has_visible_text, messages_json_expr, remove_nul
from synthkd_assets.core.validation import DuplicateIds, check_raw_schema, conform_raw_frame

HARMONY_SCHEMA = pa.schema(
    [
        ("synth_id", pa.string()),
        ("language", pa.string()),
        ("exercise", pa.string()),
        ("source_row", pa.int64()),
        ("messages_json", pa.string()),
        ("metadata_json", pa.string()),
    ]
)
TOKENIZED_SCHEMA = pa.schema(
    [
        ("synth_id", pa.string()),
        ("language", pa.string()),
        ("exercise", pa.string()),
        ("source_row", pa.int64()),
        ("tokens", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.uint8())),
        ("span_id", pa.list_(pa.uint8())),
    ]
)
# text a row cannot do without; an empty reasoning is normal SYNTH, a missing answer is not
REQUIRED_TEXT = ("synth_id", "query", "query_seed_text", "synthetic_answer")
ERROR_SAMPLE_LIMIT = 1000


@dataclass
class ShardReport:
    """What one step did to one shard: the numbers the UI plots and the manifests sum."""

    shard: str
    source_sha256: str | None = None  # content hash of the input file this report was made from, as read
    source_bytes: int | None = None  # its size, as read
    plan_sha256: str | None = None  # sha256 of the sampling plan a synth_sampled shard was made with
    rows_in: int = 0
    rows_out: int = 0
    dropped: Counter = field(default_factory=Counter)
    sanitized: Counter = field(default_factory=Counter)
    language: Counter = field(default_factory=Counter)
    exercise: Counter = field(default_factory=Counter)
    span_tokens: Counter = field(default_factory=Counter)
    sequences: Counter = field(default_factory=Counter)  # per split, Megatron step only
    # (exercise, language) -> rows out, row-selection steps: what the sampling plan is computed from
    exercise_language: Counter = field(default_factory=Counter)
    render_path: Counter = field(default_factory=Counter)  # tokenize step only: fast / reference
    errors: list[dict[str, Any]] = field(default_factory=list)

    def drop(self, reason: str, source_row: int, synth_id: str | None, detail: str = "") -> None:
        self.dropped[reason] += 1
        if len(self.errors) < ERROR_SAMPLE_LIMIT:
            self.errors.append(
                {"shard": self.shard, "source_row": source_row, "synth_id": synth_id, "reason": reason, "detail": detail}
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            f.name: _counter_dict(value) if isinstance(value, Counter) else value
            for f in fields(self)
            if f.name != "errors" and (value := getattr(self, f.name)) is not None
        }

    def write_json(self, path: Path) -> None:
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def write_errors(self, path: Path) -> None:
        """JSON lines naming shard, row, synth_id and reason of each dropped row (first 1000)."""
        atomic_write_text(path, "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in self.errors))


def _counter_dict(counter: Counter) -> dict[str, Any]:
    """Sorted plain dict; a counter keyed by (outer, inner) pairs becomes {outer: {inner: n}}."""
    nested: dict[str, Any] = {}
    for key, n in sorted(counter.items()):
        if isinstance(key, tuple):
            nested.setdefault(key[0], {})[key[1]] = n
        else:
            nested[key] = n
    return nested


def harmonize_shard(
    raw_path: Path,
    out_path: Path,
    system: dict[str, Any],
    shard: str,
    source_sha256: str | None = None,
    max_rows: int | None = None,
) -> ShardReport:
    """Raw SYNTH Parquet -> synth_harmony_v1 Parquet (messages_json + metadata_json + id columns).

    The raw file is opened once, hashed through that open file and parsed from it; the report records
    that hash (`source_sha256`) and size. RawShardChangedError (naming the file) when the hash is not
    `source_sha256` as given (the file changed since the inventory scan) or the file is written to
    while being read; no output is published then.

    A file that is not a usable SYNTH shard raises InputFileError before any output is opened; an
    output that cannot be written raises OutputFileError; either way nothing remains under the final
    name or as a partial file. Bad rows are dropped and counted (see core/validation.py for the rules).

    `max_rows` (a smoke build) reads only the first rows of the file and stops, so every later step
    sees only those; the rows never read still count in `rows_in` (the file's row count, from its
    footer) and are dropped as `smoke_cap`.
    """
    report = ShardReport(shard)
    with read_raw_shard(raw_path, source_sha256) as raw:
        report.source_sha256, report.source_bytes = raw.sha256, raw.bytes  # what was read, not what was scanned
        check_raw_schema(raw_path, raw.file)
        duplicates = DuplicateIds()
        source_row = 0
        with _output_errors(out_path), ParquetShardWriter(out_path, HARMONY_SCHEMA) as writer:
            for frame in iter_frames(raw_path, contracts.RAW_COLUMNS, max_rows=max_rows, source=raw.file):
                frame = frame.with_columns(
                    pl.int_range(source_row, source_row + frame.height, dtype=pl.Int64).alias("source_row")
                )
                source_row += frame.height
                report.rows_in += frame.height
                frame = conform_raw_frame(frame, report)
                frame = _drop_missing_required(frame, report)
                frame = _drop_nul_synth_id(frame, report)
                frame = duplicates.drop_duplicates(frame, report)
                frame = _sanitize(frame, report)
                report.language.update(frame["language"].to_list())
                report.exercise.update(frame["exercise"].to_list())
                writer.write(
                    frame.select(
                        "synth_id",
                        "language",
                        "exercise",
                        "source_row",
                        messages_json_expr(system).alias("messages_json"),
                        _metadata_json(shard).alias("metadata_json"),
                    )
                )
            if max_rows is not None:
                unread = parquet_row_count(raw_path, raw.file) - source_row
                if unread:
                    report.rows_in += unread
                    report.dropped[contracts.DROP_SMOKE_CAP] += unread
            report.rows_out = writer.rows
            raw.check_unchanged()  # before the output is published
    return report


@contextlib.contextmanager
def _output_errors(out_path: Path) -> Iterator[None]:
    """OSErrors of the write side (the reader raises InputFileError instead) as one message naming the file."""
    try:
        yield
    except OSError as error:
        if isinstance(error, OutputFileError):
            raise
        blocker = next((p for p in out_path.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            reason = f"{blocker} is not a directory"
        else:
            reason = os.strerror(error.errno) if error.errno else str(error)
        raise OutputFileError(f"{out_path}: cannot write output: {reason} ({type(error).__name__}: {error})") from error


def _drop_missing_required(frame: pl.DataFrame, report: ShardReport) -> pl.DataFrame:
    for column in REQUIRED_TEXT:
        missing = pl.col(column).is_null() | (
            (pl.col(column).str.strip_chars() == "") if column == "synth_id" else pl.lit(False)
        )
        bad = frame.filter(missing)
        for row in bad.select("source_row", "synth_id").iter_rows():
            report.drop(f"missing_{column}", row[0], row[1], f"{column} is null or empty")
        frame = frame.filter(~missing)
    return frame


def _drop_nul_synth_id(frame: pl.DataFrame, report: ShardReport) -> pl.DataFrame:
    """A synth_id holding NUL is dropped, not cleaned: it would reach the DistillKit `id` and C-string
    consumers, and removing the NUL could make it equal another row's id."""
    bad = pl.col("synth_id").str.contains("\x00", literal=True)
    for source_row, synth_id in frame.filter(bad).select("source_row", "synth_id").iter_rows():
        report.drop(contracts.DROP_NUL_IN_SYNTH_ID, source_row, synth_id.replace("\x00", "\\0"), "synth_id contains NUL")
    return frame.filter(~bad)


def _sanitize(frame: pl.DataFrame, report: ShardReport) -> pl.DataFrame:
    """Remove NULs from every rendered text column and default the optional ones; count each fix."""
    text_columns = ("query", "query_seed_text", "synthetic_reasoning", "synthetic_answer")
    counts = frame.select(
        *[pl.col(c).str.contains("\x00", literal=True).sum().alias(f"nul_in_{c}") for c in text_columns],
        pl.col("synthetic_reasoning").is_null().sum().alias("null_synthetic_reasoning"),
        pl.col("language").is_null().sum().alias("null_language"),
        pl.col("exercise").is_null().sum().alias("null_exercise"),
    ).row(0, named=True)
    report.sanitized.update({k: v for k, v in counts.items() if v})
    return frame.with_columns(
        *[remove_nul(c) for c in text_columns],
    ).with_columns(
        pl.col("synthetic_reasoning").fill_null(""),
        pl.col("language").fill_null("unknown"),
        pl.col("exercise").fill_null("unknown"),
    )


def _metadata_json(shard: str) -> pl.Expr:
    return pl.struct(
        dataset=pl.lit(contracts.SOURCE_DATASET),
        synth_id=pl.col("synth_id"),
        source_shard=pl.lit(shard),
        source_row=pl.col("source_row"),
        model=pl.col("model"),
        constraints=pl.col("constraints"),
        query_seed_url=pl.col("query_seed_url"),
        seed_license=pl.col("seed_license"),
        has_reasoning=has_visible_text("synthetic_reasoning"),
    ).struct.json_encode()


RowRule = Callable[[pl.DataFrame], pl.Series]
"""Maps a synth_harmony_v1 frame to a String series: the drop reason of each row, or null to keep it."""


def keep_everything(frame: pl.DataFrame) -> pl.Series:
    return pl.Series("reason", [None] * frame.height, dtype=pl.String)


def select_rows_shard(in_path: Path, out_path: Path, shard: str, drop_reason: RowRule = keep_everything) -> ShardReport:
    """synth_harmony_v1 in, the rows `drop_reason` keeps out (same schema); every drop counted by reason."""
    report = ShardReport(shard)
    with ParquetShardWriter(out_path, HARMONY_SCHEMA) as writer:
        for frame in iter_frames(in_path, HARMONY_SCHEMA.names):
            report.rows_in += frame.height
            reasons = drop_reason(frame)
            dropped = frame.with_columns(reasons.alias("_reason")).filter(pl.col("_reason").is_not_null())
            for source_row, synth_id, reason in dropped.select("source_row", "synth_id", "_reason").iter_rows():
                report.drop(reason, source_row, synth_id)
            kept = frame.filter(reasons.is_null())
            report.language.update(kept["language"].to_list())
            report.exercise.update(kept["exercise"].to_list())
            report.exercise_language.update(zip(kept["exercise"].to_list(), kept["language"].to_list()))
            writer.write(kept)
        report.rows_out = writer.rows
    return report


def tokenize_shard(harmony_path: Path, out_path: Path, renderer: Renderer, shard: str) -> ShardReport:
    """synth_harmony_v1 Parquet -> tokens / loss_mask / span_id per conversation (label-aligned).

    Streams batch by batch; `render_path` counts rows the fast renderer had to hand to openai-harmony.
    """
    report = ShardReport(shard)
    columns = ("synth_id", "language", "exercise", "source_row", "messages_json")
    routed_before = renderer.routed_to_reference
    with ParquetShardWriter(out_path, TOKENIZED_SCHEMA) as writer:
        for frame in iter_frames(harmony_path, columns):
            report.rows_in += frame.height
            conversations = [json.loads(payload)["messages"] for payload in frame["messages_json"]]
            kept: list[int] = []
            rendered = []
            for i, result in enumerate(renderer.render_many(conversations)):
                if isinstance(result, RenderError):
                    report.drop(result.reason, frame["source_row"][i], frame["synth_id"][i], str(result))
                    continue
                kept.append(i)
                rendered.append(result)
                report.span_tokens.update(result.span_token_counts())
            frame = frame[kept]
            report.language.update(frame["language"].to_list())
            report.exercise.update(frame["exercise"].to_list())
            table = frame.select("synth_id", "language", "exercise", "source_row").to_arrow()
            table = table.append_column("tokens", list_column([c.tokens for c in rendered], np.int32))
            table = table.append_column("loss_mask", list_column([c.loss_mask for c in rendered], np.uint8))
            table = table.append_column("span_id", list_column([c.span_id for c in rendered], np.uint8))
            writer.write(table)
        report.rows_out = writer.rows
    routed = renderer.routed_to_reference - routed_before
    report.render_path.update({"reference": routed, "fast": report.rows_in - routed - sum(report.dropped.values())})
    return report


@dataclass(frozen=True)
class BuildCaps:
    """Smoke-build limits per shard; `None` means the full build. Same code path either way: the first
    step reads only the first `max_input_rows` raw rows (so no later step sees more), and the dataset
    writers stop at `max_rows` conversations or `max_tokens` tokens."""

    max_rows: int | None = None
    max_tokens: int | None = None
    max_input_rows: int | None = None


DOCUMENTS_SCHEMA = pa.schema([("split", pa.string()), ("document_index", pa.int64()), ("synth_id", pa.string())])


def kd_dataset_files(dataset_root: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every file of synth_kd_v1 for its manifest's `files`: each shard's trio files (hashed when they
    were written, from its record), its record and its documents table (hashed now)."""
    listed = [f for record in records for split in record["splits"] for f in split["files"]]
    for record in records:
        shard_index = shard_index_from_name(record["partition"])
        for path in (shard_record_path(dataset_root, shard_index), documents_path(dataset_root, shard_index)):
            listed.append(file_record(dataset_root, path))
    return files_section(listed)


def write_megatron_shard(
    tokenized_path: Path,
    dataset_root: Path,
    shard_index: int,
    shard: str,
    caps: BuildCaps = BuildCaps(),
    valid_fraction: float = contracts.VALID_FRACTION,
) -> tuple[ShardReport, list[ShardSplitInventory]]:
    """Tokenized Parquet -> the Megatron trio of this shard in `train/` and `valid/`, split by synth_id,
    plus the documents table mapping (split, document index) -> synth_id."""
    report = ShardReport(shard)
    documents: dict[str, list[str]] = {split: [] for split in contracts.SPLITS}
    writers: dict[str, MegatronShardWriter] = {}
    try:
        for split in contracts.SPLITS:
            writers[split] = MegatronShardWriter(dataset_root / split, shard_index, split, relative_to=dataset_root)
        columns = ("synth_id", "language", "exercise", "tokens", "loss_mask", "span_id")
        budget_exhausted = False
        for frame in iter_frames(tokenized_path, columns):
            arrow = frame.to_arrow()
            token_rows = list_column_rows(arrow.column("tokens"))
            mask_rows = list_column_rows(arrow.column("loss_mask"))
            span_rows = list_column_rows(arrow.column("span_id"))
            rows = zip(frame["synth_id"].to_list(), frame["language"].to_list(), frame["exercise"].to_list())
            for i, (synth_id, language, exercise) in enumerate(rows):
                report.rows_in += 1
                if budget_exhausted or _over_caps(report, len(token_rows[i]), caps):
                    budget_exhausted = True
                    report.dropped[contracts.DROP_SMOKE_CAP] += 1
                    continue
                split = assign_split(synth_id, valid_fraction=valid_fraction)
                writers[split].add(token_rows[i], mask_rows[i], span_rows[i])
                documents[split].append(synth_id)
                report.rows_out += 1
                report.sequences[split] += 1
                report.language[language] += 1
                report.exercise[exercise] += 1
                report.span_tokens.update(span_token_counts(span_rows[i]))
        doc_writer = ParquetShardWriter(documents_path(dataset_root, shard_index), DOCUMENTS_SCHEMA)
        try:
            for split, ids in documents.items():
                doc_writer.write(
                    pa.table({"split": [split] * len(ids), "document_index": range(len(ids)), "synth_id": ids})
                )
        except BaseException:
            doc_writer._discard()
            raise
        # both splits' trios and the documents table are renamed into place together, or none of them
        inventories = commit_shard(list(writers.values()), [doc_writer])
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise
    return report, inventories


def _over_caps(report: ShardReport, next_tokens: int, caps: BuildCaps) -> bool:
    if caps.max_rows is not None and report.rows_out >= caps.max_rows:
        return True
    written = sum(report.span_tokens.values())
    return caps.max_tokens is not None and written + next_tokens > caps.max_tokens
