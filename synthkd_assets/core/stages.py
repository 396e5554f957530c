"""The per-shard steps before and of synth_kd_v1, each a rule plugged into the step loop (core/steps.py).

- harmonize: raw SYNTH Parquet -> synth_harmony_v1 (messages_json + metadata_json + id columns);
- select rows: synth_harmony_v1 -> the rows a `RowRule` keeps (the 001 filters, the sampling plan);
- tokenize: synth_harmony_v1 -> tokens / loss_mask / span_id per conversation (label-aligned);
- trio: tokenized -> the Megatron trio of the shard in train/ and valid/, and its documents table.

Each returns the `ShardReport` (rows in/out, drops by reason, mixes, token counts) the shell turns
into metadata. The DistillKit step is core/distill_io.py.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from synthkd_assets.core.caps import NO_CAPS, BuildCaps, SmokeBudget
from synthkd_assets.core.layout import documents_path, rows_summary_path
from synthkd_assets.core.megatron_io import MegatronShardWriter, ShardSplitInventory, commit_shard
from synthkd_assets.core.parquet_io import (
    ParquetShardWriter,
    iter_frames,
    list_column,
    list_column_rows,
    parquet_row_count,
    rows_at,
)
from synthkd_assets.core.raw_read import RawRead, read_raw_shard
from synthkd_assets.core.render import FastRenderer, HarmonyRenderer, RenderError, span_token_counts
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.round_trip import RoundTrip, RoundTripChecker
from synthkd_assets.core.steps import (
    EXPRESSION_FRAME_ROWS,
    SHARD,
    Outputs,
    ParquetOutputs,
    ShardStep,
    Table,
    run_step,
)
from synthkd_assets.core.synth import has_visible_text, messages_json_expr, remove_nul
from synthkd_assets.core.validation import DuplicateIds, check_exercises, check_raw_schema, conform_raw_frame
from synthkd_contract import constants, drops
from synthkd_contract.buckets import EXERCISE_SKILL_BUCKET
from synthkd_contract.manifest_seal import sha256_file
from synthkd_contract.schemas import (
    DOCUMENTS_SCHEMA,
    HARMONY_SCHEMA,
    ROWS_OF_SHA256_KEY,
    SPAN_SIZE_COLUMNS,
    TOKENIZED_ROWS_SCHEMA,
    TOKENIZED_SCHEMA,
)
from synthkd_contract.splits import assign_split

Renderer = FastRenderer | HarmonyRenderer


class HarmonizeStep(ShardStep):
    """Raw rows -> synth_harmony_v1 rows: bad rows dropped and counted (core/validation.py), text sanitized."""

    def __init__(
        self,
        raw: RawRead,
        out_path: Path,
        system: dict[str, Any],
        shard: str,
        max_rows: int | None,
        exercise_table: Mapping[str, str] = EXERCISE_SKILL_BUCKET,
    ) -> None:
        self.raw, self.out_path, self.system, self.shard, self.max_rows = raw, out_path, system, shard, max_rows
        self.exercise_table = exercise_table
        self.duplicates = DuplicateIds()
        self.rows_read = 0

    def open_outputs(self) -> Outputs:
        return ParquetOutputs({SHARD: (self.out_path, HARMONY_SCHEMA)})

    def frames(self) -> Iterator[pl.DataFrame]:
        columns, rows = constants.RAW_COLUMNS, EXPRESSION_FRAME_ROWS
        for frame in iter_frames(self.raw.path, columns, rows, max_rows=self.max_rows, source=self.raw.file):
            first, self.rows_read = self.rows_read, self.rows_read + frame.height
            yield frame.with_columns(pl.int_range(first, self.rows_read, dtype=pl.Int64).alias("source_row"))

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        frame = conform_raw_frame(frame, report)
        frame = drop_missing_required(frame, report)
        frame = drop_nul_synth_id(frame, report)
        frame = self.duplicates.drop_duplicates(frame, report)
        frame = _sanitize(frame, report)
        # every kept row needs a skill bucket (docs/pool.md#buckets); the inventory checked the file's labels already
        check_exercises(frame, self.raw.path, self.shard, self.exercise_table)
        report.language.update(frame["language"].to_list())
        report.exercise.update(frame["exercise"].to_list())
        messages = messages_json_expr(self.system).alias("messages_json")
        metadata = metadata_json_expr(self.shard, has_visible_text("synthetic_reasoning")).alias("metadata_json")
        return {SHARD: frame.select("synth_id", "language", "exercise", "source_row", messages, metadata)}

    def finish(self, report: ShardReport) -> None:
        report.source_sha256, report.source_bytes = self.raw.sha256, self.raw.bytes  # what was read, not scanned
        if self.max_rows is not None:  # the rows a smoke build never read still count, as smoke_cap
            unread = parquet_row_count(self.raw.path, self.raw.file) - self.rows_read
            if unread:
                report.rows_in += unread
                report.dropped[drops.DROP_SMOKE_CAP] += unread
        self.raw.check_unchanged()  # before the output is published


def harmonize_shard(
    raw_path: Path,
    out_path: Path,
    system: dict[str, Any],
    shard: str,
    source_sha256: str | None = None,
    max_rows: int | None = None,
    errors_log: Path | None = None,
    exercise_table: Mapping[str, str] = EXERCISE_SKILL_BUCKET,
) -> ShardReport:
    """Raw SYNTH Parquet -> synth_harmony_v1 Parquet (messages_json + metadata_json + id columns).

    The raw file is opened once, hashed through that open file and parsed from it; the report records
    that hash (`source_sha256`) and size. RawShardChangedError (naming the file) when the hash is not
    `source_sha256` as given (the file changed since the inventory scan) or the file is written to
    while being read; no output is published then.

    A file that is not a usable SYNTH shard raises InputFileError before any output is opened; an
    output that cannot be written raises OutputFileError; either way nothing remains under the final
    name or as a partial file. Bad rows are dropped and counted (see core/validation.py for the rules);
    an exercise `exercise_table` does not map refuses the shard (UnknownExerciseError, an InputFileError).

    `max_rows` (a smoke build) reads only the first rows of the file and stops, so every later step
    sees only those; the rows never read still count in `rows_in` (the file's row count, from its
    footer) and are dropped as `smoke_cap`.
    """
    with read_raw_shard(raw_path, source_sha256) as raw:
        check_raw_schema(raw_path, raw.file)
        return run_step(HarmonizeStep(raw, out_path, system, shard, max_rows, exercise_table), shard, errors_log)


MISSING_SAYS = {"synth_id": "null, empty or only whitespace"}  # what each column's missing rule finds


def drop_missing_required(
    frame: pl.DataFrame, report: ShardReport, columns: tuple[str, ...] = constants.REQUIRED_TEXT_COLUMNS
) -> pl.DataFrame:
    """Drop (and count, as missing_<column>) the rows where a column of `columns` is missing."""
    for column in columns:
        missing = pl.col(column).is_null() | (
            (pl.col(column).str.strip_chars() == "") if column == "synth_id" else pl.lit(False)
        )
        bad = frame.filter(missing)
        for row in bad.select("source_row", "synth_id").iter_rows():
            report.drop(drops.DROP_MISSING[column], row[0], row[1], f"{column} is {MISSING_SAYS.get(column, 'null')}")
        frame = frame.filter(~missing)
    return frame


def drop_nul_synth_id(frame: pl.DataFrame, report: ShardReport) -> pl.DataFrame:
    """A synth_id holding NUL is dropped, not cleaned: it would reach the DistillKit `id` and C-string
    consumers, and removing the NUL could make it equal another row's id."""
    bad = pl.col("synth_id").str.contains("\x00", literal=True)
    for source_row, synth_id in frame.filter(bad).select("source_row", "synth_id").iter_rows():
        report.drop(drops.DROP_NUL_IN_SYNTH_ID, source_row, synth_id.replace("\x00", "\\0"), "synth_id contains NUL")
    return frame.filter(~bad)


def _sanitize(frame: pl.DataFrame, report: ShardReport) -> pl.DataFrame:
    """Remove NULs from every rendered text column and default the optional ones; count each fix."""
    counts = frame.select(
        *[
            pl.col(c).str.contains("\x00", literal=True).sum().alias(drops.SANITIZED_NUL_IN[c])
            for c in constants.NUL_CLEANED_COLUMNS
        ],
        *[pl.col(c).is_null().sum().alias(drops.SANITIZED_NULL[c]) for c in constants.NULL_DEFAULTS],
    ).row(0, named=True)
    report.sanitized.update({k: v for k, v in counts.items() if v})
    return frame.with_columns(
        *[remove_nul(c) for c in constants.NUL_CLEANED_COLUMNS],
    ).with_columns(
        *[pl.col(c).fill_null(default) for c, default in constants.NULL_DEFAULTS.items()],
    )


def metadata_json_expr(shard: str, has_reasoning: pl.Expr) -> pl.Expr:
    """A synth_harmony_v1 row's metadata_json: the dataset, the row's ids and provenance columns, and whether it has
    a reasoning (`has_reasoning`: raw SYNTH's non-blank synthetic_reasoning, an artifact row's analysis message)."""
    return pl.struct(
        dataset=pl.lit(constants.SOURCE_DATASET),
        synth_id=pl.col("synth_id"),
        source_shard=pl.lit(shard),
        source_row=pl.col("source_row"),
        model=pl.col("model"),
        constraints=pl.col("constraints"),
        query_seed_url=pl.col("query_seed_url"),
        seed_license=pl.col("seed_license"),
        has_reasoning=has_reasoning,
    ).struct.json_encode()


RowRule = Callable[[pl.DataFrame], pl.Series]
"""Maps a synth_harmony_v1 frame to a String series: the drop reason of each row, or null to keep it."""


def first_reason(*rules: RowRule) -> RowRule:
    """The rules applied in order: a row's reason is the first rule's that drops it (each drop counted once)."""

    def reasons(frame: pl.DataFrame) -> pl.Series:
        return frame.select(pl.coalesce([pl.lit(rule(frame)) for rule in rules]).alias("reason"))["reason"]

    return reasons


def keep_everything(frame: pl.DataFrame) -> pl.Series:
    """The RowRule that drops nothing (e.g. an anchor source's shard, which the 001 mixture does not sample)."""
    return pl.Series("reason", [None] * frame.height, dtype=pl.String)


class SelectRowsStep(ShardStep):
    """synth_harmony_v1 rows -> the ones `drop_reason` keeps (same schema)."""

    def __init__(self, in_path: Path, out_path: Path, drop_reason: RowRule) -> None:
        self.in_path, self.out_path, self.drop_reason = in_path, out_path, drop_reason

    def open_outputs(self) -> Outputs:
        return ParquetOutputs({SHARD: (self.out_path, HARMONY_SCHEMA)})

    def frames(self) -> Iterator[pl.DataFrame]:
        return iter_frames(self.in_path, HARMONY_SCHEMA.names, EXPRESSION_FRAME_ROWS)

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        reasons = self.drop_reason(frame)
        dropped = frame.with_columns(reasons.alias("_reason")).filter(pl.col("_reason").is_not_null())
        columns = ("source_row", "synth_id", "_reason", "exercise")
        for source_row, synth_id, reason, exercise in dropped.select(columns).iter_rows():
            report.drop(reason, source_row, synth_id, exercise=exercise)
        kept = frame.filter(reasons.is_null())
        report.language.update(kept["language"].to_list())
        report.exercise.update(kept["exercise"].to_list())
        report.exercise_language.update(zip(kept["exercise"].to_list(), kept["language"].to_list()))
        return {SHARD: kept}


def select_rows_shard(
    in_path: Path, out_path: Path, shard: str, drop_reason: RowRule = keep_everything, errors_log: Path | None = None
) -> ShardReport:
    """synth_harmony_v1 in, the rows `drop_reason` keeps out (same schema); every drop counted by reason, and by
    exercise and reason (`dropped_by_exercise`)."""
    return run_step(SelectRowsStep(in_path, out_path, drop_reason), shard, errors_log)


ROWS = "rows"  # TokenizeStep's second output: its rows' sizes (TOKENIZED_ROWS_SCHEMA)


class TokenizedOutputs(ParquetOutputs):
    """synth_tokenized's shard and its row sizes, published together; the row sizes' footer records the sha256 of
    the finished shard (ROWS_OF_SHA256_KEY), so that they are read only while the shard keeps those bytes
    (`current_row_sizes`)."""

    shard_sha256: str | None = None  # once published: the finished shard's, as its row sizes record it

    def publish(self) -> None:
        shard = self.writers[SHARD]
        shard.finish()
        self.shard_sha256 = sha256_file(shard.partial_path)
        self.writers[ROWS].add_footer_metadata({ROWS_OF_SHA256_KEY: self.shard_sha256})
        super().publish()


class TokenizeStep(ShardStep):
    """synth_harmony_v1 rows -> tokens / loss_mask / span_id; a conversation the renderer refuses is dropped.

    With a `checker`, the Harmony round-trip (docs/contract.md "Harmony round-trip") of every conversation it
    writes, batch by batch on the arrays written rather than read back from the file: `round_trip` after
    `run_step`. Beside the shard, and published with it, each written row's sizes (`rows_summary_path`,
    TOKENIZED_ROWS_SCHEMA): what the quota plan and the length statistics read instead of the token lists."""

    def __init__(
        self,
        harmony_path: Path,
        out_path: Path,
        renderer: Renderer,
        exercise_table: Mapping[str, str] = EXERCISE_SKILL_BUCKET,
        checker: RoundTripChecker | None = None,
    ) -> None:
        self.harmony_path, self.out_path, self.renderer = harmony_path, out_path, renderer
        self.exercise_table = exercise_table
        self.routed_before = renderer.routed_to_reference
        self.checker = checker
        self.round_trip = RoundTrip(0, [])  # of the rows written, when `checker` is given
        self.outputs: TokenizedOutputs | None = None

    summary_outputs = frozenset({ROWS})

    def open_outputs(self) -> Outputs:
        rows = (rows_summary_path(self.out_path), TOKENIZED_ROWS_SCHEMA)
        self.outputs = TokenizedOutputs({SHARD: (self.out_path, TOKENIZED_SCHEMA), ROWS: rows})
        return self.outputs

    @property
    def hashed(self) -> dict[Path, str]:
        """The published shard's sha256, taken as it was published (none before): its materialization records it
        without reading the shard again (`files_metadata`)."""
        digest = self.outputs.shard_sha256 if self.outputs is not None else None
        return {self.out_path: digest} if digest is not None else {}

    def frames(self) -> Iterator[pl.DataFrame]:
        return iter_frames(self.harmony_path, ("synth_id", "language", "exercise", "source_row", "messages_json"))

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        conversations = [json.loads(payload)["messages"] for payload in frame["messages_json"]]
        kept: list[int] = []
        rendered = []
        spans: list[dict[str, int]] = []
        for i, result in enumerate(self.renderer.render_many(conversations)):
            if isinstance(result, RenderError):
                report.drop(result.reason, frame["source_row"][i], frame["synth_id"][i], str(result))
                continue
            kept.append(i)
            rendered.append(result)
            spans.append(result.span_token_counts())
            report.span_tokens.update(spans[-1])
        if self.checker is not None:  # the tokens as written, against the messages they were rendered from
            written = zip(frame["synth_id"][kept], (c.tokens for c in rendered), map(conversations.__getitem__, kept))
            found = self.checker.check_many(written)
            self.round_trip = self.round_trip.plus(found)
        frame = frame[kept]
        report.language.update(frame["language"].to_list())
        report.exercise.update(frame["exercise"].to_list())
        for exercise, language, conversation in zip(frame["exercise"], frame["language"], rendered):
            report.count_sequence(exercise, language, len(conversation.tokens), self.exercise_table)
        table = frame.select("synth_id", "language", "exercise", "source_row").to_arrow()
        table = table.append_column("tokens", list_column([c.tokens for c in rendered], np.int32))
        table = table.append_column("loss_mask", list_column([c.loss_mask for c in rendered], np.uint8))
        table = table.append_column("span_id", list_column([c.span_id for c in rendered], np.uint8))
        sizes = {
            "tokens": [len(c.tokens) for c in rendered],
            **{column: [c[constants.SPAN_NAMES[span]] for c in spans] for span, column in SPAN_SIZE_COLUMNS.items()},
        }
        rows = pa.table(
            {name: table.column(name) for name in ("synth_id", "language", "exercise")} | sizes,
            schema=TOKENIZED_ROWS_SCHEMA,
        )
        return {SHARD: table, ROWS: rows}

    def finish(self, report: ShardReport) -> None:
        routed = self.renderer.routed_to_reference - self.routed_before
        report.render_path.update({"reference": routed, "fast": report.rows_in - routed - sum(report.dropped.values())})


def tokenize_shard(
    harmony_path: Path,
    out_path: Path,
    renderer: Renderer,
    shard: str,
    errors_log: Path | None = None,
    exercise_table: Mapping[str, str] = EXERCISE_SKILL_BUCKET,
) -> ShardReport:
    """synth_harmony_v1 Parquet -> tokens / loss_mask / span_id per conversation (label-aligned).

    Streams batch by batch; `render_path` counts rows the fast renderer had to hand to openai-harmony.
    """
    return run_step(TokenizeStep(harmony_path, out_path, renderer, exercise_table), shard, errors_log)


@dataclass(frozen=True)
class TokenizedRow:
    """One row of synth_tokenized, as the dataset writers see it."""

    index: int  # in its frame
    synth_id: str
    language: str
    exercise: str
    source_row: int
    tokens: np.ndarray
    span_id: np.ndarray


class DatasetStep(ShardStep):
    """A dataset writer: the conversations of synth_tokenized one by one, in order, through the smoke budget
    (core/caps.py), each kept into the split `keep` names (or dropped by it, counted); `tables` turns what a
    frame kept into the rows of each split's output."""

    COLUMNS = ("synth_id", "language", "exercise", "source_row", "tokens", "loss_mask", "span_id")

    def __init__(self, tokenized_path: Path, caps: BuildCaps) -> None:
        self.tokenized_path, self.budget = tokenized_path, SmokeBudget(caps)

    def frames(self) -> Iterator[pl.DataFrame]:
        return iter_frames(self.tokenized_path, self.COLUMNS)

    @abstractmethod
    def keep(self, row: TokenizedRow, report: ShardReport) -> tuple[str, Any] | None:
        """(split, what `tables` needs of the row), or None for a row dropped (and counted in `report`)."""

    @abstractmethod
    def tables(self, arrow: pa.Table, kept: dict[str, list[Any]]) -> dict[str, Table]:
        """The output rows of the kept conversations of a frame (`arrow`), by split."""

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        arrow = frame.to_arrow()
        tokens, span_ids = list_column_rows(arrow.column("tokens")), list_column_rows(arrow.column("span_id"))
        kept: dict[str, list[Any]] = {}
        for i, fields in enumerate(frame.select("synth_id", "language", "exercise", "source_row").iter_rows()):
            row = TokenizedRow(i, *fields, tokens[i], span_ids[i])
            if not self.budget.admits(len(row.tokens), report):
                continue
            decision = self.keep(row, report)
            if decision is None:
                continue
            self.budget.spend(len(row.tokens))
            split, payload = decision
            kept.setdefault(split, []).append(payload)
            report.sequences[split] += 1
            report.language[row.language] += 1
            report.exercise[row.exercise] += 1
        return self.tables(arrow, kept)


class TrioOutputs(Outputs):
    """Both splits' trios of one shard and its documents table (split, document index -> synth_id),
    published together by `commit_shard`; `inventories` says what was published. The trios' bytes are the
    rows' values whatever their chunks: a window's tables are written as they come, not joined."""

    joins_chunks = False

    def __init__(self, dataset_root: Path, shard_index: int) -> None:
        self.writers: dict[str, MegatronShardWriter] = {}
        self.documents: dict[str, list[str]] = {split: [] for split in constants.SPLITS}
        self.inventories: list[ShardSplitInventory] = []
        self.documents_table: ParquetShardWriter | None = None
        try:
            for split in constants.SPLITS:
                self.writers[split] = MegatronShardWriter(
                    dataset_root / split, shard_index, split, relative_to=dataset_root
                )
            self.documents_table = ParquetShardWriter(documents_path(dataset_root, shard_index), DOCUMENTS_SCHEMA)
        except BaseException:
            self.discard()
            raise

    def write(self, name: str, table: Table) -> None:
        arrow = table if isinstance(table, pa.Table) else table.to_arrow()
        self.writers[name].add_table(arrow)
        self.documents[name].extend(arrow.column("synth_id").to_pylist())

    def publish(self) -> None:
        for split, ids in self.documents.items():
            self.documents_table.write(
                pa.table({"split": [split] * len(ids), "document_index": range(len(ids)), "synth_id": ids})
            )
        # both splits' trios and the documents table are renamed into place together, or none of them
        self.inventories = commit_shard(list(self.writers.values()), [self.documents_table])

    def discard(self) -> None:
        for writer in self.writers.values():
            writer.abort()
        if self.documents_table is not None:
            self.documents_table._discard()


class TrioStep(DatasetStep):
    """Tokenized conversations -> the trio of their split (a salted hash of synth_id)."""

    def __init__(
        self, tokenized_path: Path, dataset_root: Path, shard_index: int, caps: BuildCaps, valid_fraction: float
    ) -> None:
        super().__init__(tokenized_path, caps)
        self.dataset_root, self.shard_index, self.valid_fraction = dataset_root, shard_index, valid_fraction
        self.outputs: TrioOutputs | None = None

    def open_outputs(self) -> Outputs:
        self.outputs = TrioOutputs(self.dataset_root, self.shard_index)
        return self.outputs

    def keep(self, row: TokenizedRow, report: ShardReport) -> tuple[str, int]:
        report.span_tokens.update(span_token_counts(row.span_id))
        return assign_split(row.synth_id, valid_fraction=self.valid_fraction), row.index

    def tables(self, arrow: pa.Table, kept: dict[str, list[int]]) -> dict[str, Table]:
        return {split: rows_at(arrow, indices) for split, indices in kept.items()}


def write_megatron_shard(
    tokenized_path: Path,
    dataset_root: Path,
    shard_index: int,
    shard: str,
    caps: BuildCaps = NO_CAPS,
    valid_fraction: float = constants.VALID_FRACTION,
    errors_log: Path | None = None,
) -> tuple[ShardReport, list[ShardSplitInventory]]:
    """Tokenized Parquet -> the Megatron trio of this shard in `train/` and `valid/`, split by synth_id,
    plus the documents table mapping (split, document index) -> synth_id."""
    step = TrioStep(tokenized_path, dataset_root, shard_index, caps, valid_fraction)
    report = run_step(step, shard, errors_log)
    return report, step.outputs.inventories
