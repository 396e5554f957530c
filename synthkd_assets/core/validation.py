"""Bad input, decided in one place: which raw files are SYNTH at all, which rows are usable.

File level (`check_raw_schema`, before any output is opened): a file that is not Parquet, lacks a
SYNTH column, names one twice, or stores a column in a type that cannot hold its values is refused
with an `InputFileError` naming the file, the column, the expected and the actual type. A text
column stored as int64 (or any other non-text type) is such a file: turning numbers into prompt text
would be inventing data, so nothing is coerced.

Row level (`conform_raw_frame`, `DuplicateIds`, then the harmonize step's own missing-value and NUL
rules): every problem a single row can have either leaves the row rendered correctly or drops it,
counted by reason with shard, source row and synth_id in the errors log.

- `binary` text columns are decoded as UTF-8 row by row; a value that is not valid UTF-8 drops its
  row as `invalid_utf8_<column>`. Lone surrogates cannot exist in Arrow strings (UTF-8 cannot encode
  them, and a `string` column carrying such bytes is refused as a corrupt file by the reader); in a
  binary column their bytes (`ED A0 80`...) are rejected by Python's UTF-8 decoder like any other
  invalid sequence, so they drop the row as `invalid_utf8_<column>` too.
- `null`-typed (all-null) and dictionary-encoded string columns are read as strings.
- `words` is in no output; integer, float and text types are accepted and a value that is not a
  non-negative whole number is only counted (`sanitized.invalid_words`).
- a synth_id already seen earlier in the same shard drops the later row as `duplicate_synth_id`
  (the first row that passed every other rule is kept). Duplicates across shards are found at the
  dataset level, by `cross_shard_duplicates` over the per-shard documents tables.

Table level: an exercise the build's table (synthkd_contract/buckets.py EXERCISE_SKILL_BUCKET plus the
`build` resource's `exercise_skill_buckets`) does not map is found before any shard is scanned, by the
inventory reading each file's `exercise` column (`exercise_labels`, `unknown_exercise_files`): it names every
such label, its files and the setting that maps it. The harmonize step checks again (`check_exercises`, on the
rows it keeps, after a null exercise became "unknown"), for a file changed since. Dropping such rows would
silently shrink a skill bucket and defaulting them would mislabel them, so the table is extended instead.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_assets.core.parquet_io import InputFileError, read_arrow_schema
from synthkd_assets.core.problems import Problems
from synthkd_assets.core.report import ShardReport
from synthkd_contract import constants, drops
from synthkd_contract.buckets import (
    EXERCISE_SKILL_BUCKET,
    UNKNOWN_EXERCISE_SETTING,
    UnknownExercise,
    unknown_exercise_message,
)

TEXT_TYPES_DESCRIPTION = (
    "string, large_string, string_view, binary, large_binary, binary_view, dictionary<string> or null"
)
WORDS_TYPES_DESCRIPTION = "an integer or floating type, or " + TEXT_TYPES_DESCRIPTION


def _is_string(arrow_type: pa.DataType) -> bool:
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type)


def is_text_type(arrow_type: pa.DataType) -> bool:
    """An Arrow type a SYNTH text column may have: a string type, a binary type (decoded per row), a
    dictionary of strings, or null (a column with no values)."""
    if pa.types.is_dictionary(arrow_type):
        return _is_string(arrow_type.value_type)
    return (
        _is_string(arrow_type)
        or pa.types.is_binary(arrow_type)
        or pa.types.is_large_binary(arrow_type)
        or pa.types.is_binary_view(arrow_type)
        or pa.types.is_null(arrow_type)
    )


def is_words_type(arrow_type: pa.DataType) -> bool:
    return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type) or is_text_type(arrow_type)


def check_raw_schema(path: Path, source=None) -> pa.Schema:
    """The file's Arrow schema if it is a usable raw SYNTH shard; InputFileError naming what is wrong otherwise
    (`source`: an already open file of `path` to read)."""
    schema = read_arrow_schema(path, source)
    missing = [column for column in constants.RAW_COLUMNS if column not in schema.names]
    if missing:
        raise InputFileError(
            f"{path}: not a {constants.SOURCE_DATASET} shard: missing columns {missing} (has {schema.names})"
        )
    for column in constants.RAW_COLUMNS:
        if (n := len(schema.get_all_field_indices(column))) > 1:
            raise InputFileError(f"{path}: column {column!r} appears {n} times")
        actual = schema.field(column).type
        text = column in constants.RAW_STRING_COLUMNS
        if not (is_text_type(actual) if text else is_words_type(actual)):
            expected = TEXT_TYPES_DESCRIPTION if text else WORDS_TYPES_DESCRIPTION
            raise InputFileError(
                f"{path}: column {column!r} has type {actual}, expected {expected} "
                f"(a column of another type is not coerced: the file is refused)"
            )
    return schema


def _decode_utf8(values: list[bytes | None]) -> tuple[list[str | None], dict[int, UnicodeDecodeError]]:
    decoded: list[str | None] = []
    errors: dict[int, UnicodeDecodeError] = {}
    for i, value in enumerate(values):
        if value is None:
            decoded.append(None)
            continue
        try:
            decoded.append(value.decode("utf-8"))
        except UnicodeDecodeError as error:
            decoded.append(value.decode("utf-8", errors="replace"))  # only to name the row in the errors log
            errors[i] = error
    return decoded, errors


def conform_raw_frame(frame: pl.DataFrame, report: ShardReport) -> pl.DataFrame:
    """A raw SYNTH frame (with `source_row`) whose text columns are all String: binary columns decoded
    (rows with invalid UTF-8 dropped as `invalid_utf8_<column>`), null / categorical ones cast;
    `words` as Int64 (values that are not whole numbers >= 0 become null, counted)."""
    for column in constants.RAW_STRING_COLUMNS:  # synth_id first: later drops name the row by it
        dtype = frame.schema[column]
        if dtype == pl.String:
            continue
        if dtype != pl.Binary:  # Null, Categorical, Enum
            frame = frame.with_columns(pl.col(column).cast(pl.String))
            continue
        try:  # fast path: the whole column is valid UTF-8
            frame = frame.with_columns(pl.col(column).cast(pl.String))
            continue
        except pl.exceptions.PolarsError:
            pass
        decoded, errors = _decode_utf8(frame[column].to_list())
        frame = frame.with_columns(pl.Series(column, decoded, dtype=pl.String))
        reason = drops.DROP_INVALID_UTF8[column]
        rows = frame["source_row"].to_list()
        ids = frame["synth_id"].to_list()
        for i, error in errors.items():
            report.drop(reason, rows[i], ids[i], f"{column} is not valid UTF-8: {error.reason} at byte {error.start}")
        frame = frame.filter(pl.Series([i not in errors for i in range(frame.height)]))
    return _conform_words(frame, report)


def _conform_words(frame: pl.DataFrame, report: ShardReport) -> pl.DataFrame:
    words = pl.col("words")
    dtype = frame.schema["words"]
    if dtype == pl.Binary:
        frame = frame.with_columns(
            pl.Series("words", [None if v is None else v.decode("utf-8", "replace") for v in frame["words"]], pl.String)
        )
        dtype = pl.String
    if dtype.is_integer():
        conformed = pl.when(words >= 0).then(words.cast(pl.Int64, strict=False))
    elif dtype.is_float():
        conformed = pl.when(words.is_finite() & (words == words.floor()) & (words >= 0)).then(
            words.cast(pl.Int64, strict=False)
        )
    else:  # String, Null, Categorical
        as_int = words.cast(pl.String).str.strip_chars().cast(pl.Int64, strict=False)
        conformed = pl.when(as_int >= 0).then(as_int)
    invalid = frame.select((words.is_not_null() & conformed.is_null()).sum()).item()
    if invalid:
        report.sanitized[drops.SANITIZED_INVALID_WORDS] += invalid
    return frame.with_columns(conformed.alias("words"))


class DuplicateIds:
    """Remembers the synth_ids kept so far in one shard; a later row with one of them is dropped."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def drop_duplicates(self, frame: pl.DataFrame, report: ShardReport) -> pl.DataFrame:
        ids = frame["synth_id"].to_list()
        batch = set(ids)
        if len(batch) == len(ids) and self.seen.isdisjoint(batch):  # the usual case, at set speed
            self.seen |= batch
            return frame
        keep: list[bool] = []
        for synth_id in ids:
            keep.append(synth_id not in self.seen)
            self.seen.add(synth_id)
        rows = frame["source_row"].to_list()
        for i in (i for i, kept in enumerate(keep) if not kept):
            report.drop(drops.DROP_DUPLICATE_SYNTH_ID, rows[i], ids[i], "synth_id already kept earlier in this shard")
        return frame.filter(pl.Series(keep, dtype=pl.Boolean))


def cross_shard_duplicates(document_tables: Sequence[Path], limit: int = 20) -> Problems:
    """synth_ids in more than one of the given Parquet tables (any with a `synth_id` column, e.g. the
    per-shard `shard_XX_documents.parquet`), or more than once in one: one sentence per synth_id,
    sorted, at most `limit`, then one line counting the rest. Empty list = no duplicates."""
    if not document_tables:
        return Problems()
    names = [path.name for path in document_tables]
    labels = names if len(set(names)) == len(names) else [str(path) for path in document_tables]
    counts = (
        pl.concat(
            [
                pl.scan_parquet(path).select(pl.col("synth_id").cast(pl.String)).with_columns(table=pl.lit(label))
                for path, label in zip(document_tables, labels)
            ]
        )
        .group_by("synth_id", "table")
        .len()
        .collect()
    )
    duplicated = (
        counts.group_by("synth_id")
        .agg(pl.col("len").sum().alias("total"), pl.struct("table", "len").alias("where"))
        .filter(pl.col("total") > 1)
        .sort("synth_id")
    )
    problems = []
    for synth_id, total, where in duplicated.head(limit).iter_rows():
        places = Counter({entry["table"]: entry["len"] for entry in where})
        shown = ", ".join(f"{table} ({n}x)" if n > 1 else table for table, n in sorted(places.items()))
        problems.append(f"synth_id {synth_id!r} occurs {total} times: {shown}")
    if duplicated.height > limit:
        problems.append(f"... and {duplicated.height - limit} more duplicated synth_ids")
    return Problems(problems, total=duplicated.height)


class UnknownExerciseError(InputFileError, UnknownExercise):
    """A raw shard holding an exercise no skill bucket maps: an input the build cannot use as it is (so the
    step fails and publishes nothing, like any InputFileError), and an UnknownExercise (the contract's error)."""


def check_exercises(
    frame: pl.DataFrame, path: Path, shard: str, table: Mapping[str, str] = EXERCISE_SKILL_BUCKET
) -> None:
    """UnknownExerciseError naming the file, the first source_row, its exercise and the setting to add when a row
    of `frame` (with `exercise` and `source_row`) has an exercise `table` (the build's exercise_skill_table) does
    not map; None otherwise."""
    unknown = frame.filter(~pl.col("exercise").is_in(list(table)))
    if unknown.is_empty():
        return
    source_row, exercise = unknown.sort("source_row").select("source_row", "exercise").row(0)
    raise UnknownExerciseError(
        f"{path}: row {source_row}: {unknown_exercise_message(exercise)} (shard {shard}; it maps "
        f"{', '.join(repr(label) for label in sorted(table))})"
    )


def exercise_labels(path: Path) -> dict[str, int]:
    """Rows per `exercise` label of one raw SYNTH file (a null label counted as NULL_DEFAULTS' "unknown"), from
    that one column: what the inventory checks against the build's table before any shard is scanned.

    Args:
        path: a raw SYNTH Parquet file.

    Returns:
        {label: rows}.

    Raises:
        InputFileError: the file is no usable raw SYNTH shard (check_raw_schema's message, naming the reason).
    """
    check_raw_schema(path)
    column = pl.from_arrow(pa.table({"exercise": pq.read_table(path, columns=["exercise"])["exercise"]}))["exercise"]
    if column.dtype == pl.Binary:  # decoded as the harmonize step decodes it (conform_raw_frame)
        decoded, invalid = _decode_utf8(column.to_list())
        # a label that is not UTF-8 drops its row there (invalid_utf8_exercise): it is no label
        column = pl.Series("exercise", [v for i, v in enumerate(decoded) if i not in invalid], dtype=pl.String)
    counts = column.cast(pl.String).fill_null(constants.NULL_DEFAULTS["exercise"]).value_counts()
    return dict(zip(counts["exercise"].to_list(), counts["count"].to_list(), strict=True))


def labels_by_file(paths: Iterable[Path]) -> dict[str, dict[str, int]]:
    """{file: exercise_labels} of the raw SYNTH files among `paths` that can be read; a file that is no usable
    SYNTH shard is left out, to be refused alone by its own partition's scan step (docs/bad-input.md)."""
    labels: dict[str, dict[str, int]] = {}
    for path in paths:
        try:
            labels[str(path)] = exercise_labels(path)
        except InputFileError:
            continue
    return labels


def unknown_exercise_files(
    labels_by_file: Mapping[str, Mapping[str, int]], table: Mapping[str, str]
) -> dict[str, dict[str, int]]:
    """{label: {file: rows}} of every label `table` does not map, over `labels_by_file` ({file: exercise_labels})."""
    unknown: dict[str, dict[str, int]] = {}
    for file, labels in sorted(labels_by_file.items()):
        for label, rows in labels.items():
            if label not in table:
                unknown.setdefault(label, {})[file] = rows
    return dict(sorted(unknown.items()))


def unknown_exercises_message(unknown: Mapping[str, Mapping[str, int]], limit: int = 3) -> str:
    """One line (what build.sh and the UI show of an error): each unknown label with its rows and first files, then
    the setting that maps them all, e.g. `... 'code review': 2 rows in <file> (2 rows); map them with ...`."""
    labels = []
    for label, files in unknown.items():
        shown = ", ".join(f"{file} ({rows} rows)" for file, rows in list(files.items())[:limit])
        more = f" and {len(files) - limit} more files" if len(files) > limit else ""
        labels.append(f"{label!r}: {sum(files.values())} rows in {shown}{more}")
    example = json.dumps({UNKNOWN_EXERCISE_SETTING: dict.fromkeys(unknown, "B1")})
    return (
        f"{len(unknown)} exercise labels of the raw SYNTH shards have no skill bucket in synthkd_contract/buckets.py "
        f"EXERCISE_SKILL_BUCKET, nothing was scanned: {'; '.join(labels)}; map each to B1..B4 with the build "
        f"resource's {UNKNOWN_EXERCISE_SETTING}, e.g. SYNTHKD_BUILD_CONFIG='{example}'"
    )
