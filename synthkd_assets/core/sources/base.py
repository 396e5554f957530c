"""The mechanics every anchor-source adapter shares: reading a shard as the dataset publishes it, checking its
schema, and turning the adapter's conversations into synth_harmony_v1 rows with SYNTH's accounting.

An adapter (one module per source, registry in `__init__.py`) only says what the dataset looks like (`SourceSpec`:
its published columns, file format, language, id rule) and how one of its rows becomes a conversation
(`to_conversations`: polars expressions from the dataset's columns to `CONVERSATION_COLUMNS`). Everything else is
here, once:

- `read_source_table`: a Parquet shard whose schema lacks a published column, or stores one in another type, is
  refused (`InputFileError` naming file, column, expected and actual type); a JSONL shard is read line by line, a
  line that is not a JSON object or holds a field of another type is a counted drop (`invalid_json_line`,
  `wrong_type`), a published column absent from every line refuses the file.
- `harmonize_source`: NULs removed from turn texts (counted), a leading system turn removed (counted: the run's
  system message is fixed, docs/sources.md#from-a-shard-to-rows), `<think>...</think>` at the start of an assistant turn
  split into the reasoning (`analysis`, last turn) and the answer, then the row checks in order (the adapter's own
  reason first, `empty_conversation`, `unsupported_role`, `empty_turn`, `bad_turn_order`, `missing_source_id`,
  `nul_in_synth_id`), the synth_id and
  `duplicate_synth_id`, and the Harmony JSON: system (synth.py's), the turns (user / assistant `final`), the last
  assistant's `analysis` before its `final` when there is reasoning.

A row's synth_id is `<source key>:<source_example_id>`: the dataset's own id (`ID_DATASET`), the sha256 of the
canonical content when it has none (`ID_CONTENT`), or both when its id names a group of rows (`ID_DATASET_CONTENT`,
e.g. one problem's many trajectories). The canonical content is `canonical_content()` of the turns as rendered.
"""

from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_assets.core.parquet_io import InputFileError, read_arrow_schema, write_tables_together
from synthkd_assets.core.raw_read import read_raw_shard
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.synth import message_json, messages_json_head, python_whitespace, system_message_dict
from synthkd_assets.core.validation import DuplicateIds
from synthkd_contract import drops, sources
from synthkd_contract.schemas import HARMONY_SCHEMA

PARQUET = "parquet"
JSONL = "jsonl"
FILE_SUFFIXES = {PARQUET: ".parquet", JSONL: ".jsonl"}  # a shard's name ends so in $SYNTHKD_SOURCES_DIR/<source>/
ID_DATASET = "dataset"  # the dataset's own id, unique per row
ID_CONTENT = "content"  # sha256 of canonical_content(): the dataset has no id
ID_DATASET_CONTENT = "dataset+content"  # "<own id>-<sha256[:16]>": the own id names a group of rows
USER, ASSISTANT, SYSTEM = "user", "assistant", "system"
TURN_TYPE = pl.List(pl.Struct({"role": pl.String, "text": pl.String}))
# what an adapter's to_conversations returns: one row per input row, in any order
CONVERSATION_COLUMNS = {
    "source_row": pl.Int64,  # the row's index in its file (JSONL: its line among the non-blank lines)
    "drop_reason": pl.String,  # the adapter's own reason to drop the row (drops.py), else null
    "example_id": pl.String,  # the dataset's id of the row (see the spec's id rule), else null
    "language": pl.String,  # the row's language when the dataset says it, else null (the spec's default)
    "turns": TURN_TYPE,  # the conversation in order, roles as the dataset names them (mapped to user / assistant)
    "reasoning": pl.String,  # the last assistant turn's reasoning when the dataset has it apart, else null
    "extra": None,  # a struct of the dataset's own fields kept in metadata_json (any struct, or null)
}
# drops that are the policy of a message-per-row source (oasst1), not faults: counted, not named in the error log
QUIET_REASONS = (drops.DROP_OFF_BEST_PATH, drops.DROP_FOLDED_INTO_CONVERSATION)
THINK_PATTERN = r"(?s)^\s*<think>(.*?)</think>(.*)$"
OPENS_THINK_PATTERN = r"^\s*<think>"  # what THINK_PATTERN needs a `</think>` after


@dataclass(frozen=True)
class Column:
    """One column as the dataset publishes it. `json_text`: a free-form JSON value (JSONL), kept as its JSON text."""

    name: str
    type: pa.DataType
    required: bool = True
    json_text: bool = False


@dataclass(frozen=True)
class SourceSpec:
    """What an adapter reads: the dataset's published columns and file format, its language, its id rule."""

    key: str
    file_format: str
    columns: tuple[Column, ...]
    id_rule: str
    language: str | None = None  # the card's language for every row, when the dataset says none per row
    cited: tuple[str, ...] = field(default=())  # where the published schema was read (docs/sources.md)

    @property
    def dataset(self) -> str:
        return sources.SOURCE_DATASETS[self.key]

    @property
    def file_suffix(self) -> str:
        return FILE_SUFFIXES[self.file_format]

    @property
    def exercise(self) -> str:
        return sources.source_exercise(self.key)

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([(column.name, column.type) for column in self.columns])


@dataclass(frozen=True)
class SourceAdapter:
    spec: SourceSpec
    to_conversations: Callable[[pl.DataFrame], pl.DataFrame]


@dataclass
class SourceResult:
    """A shard of a source as synth_harmony_v1 rows, and its report (rows in = rows out + dropped)."""

    frame: pl.DataFrame
    report: ShardReport


# --- reading a shard ---------------------------------------------------------------------------------------
def _kind(arrow_type: pa.DataType) -> str:
    """The family a type belongs to for the schema check: one name per family the adapters read alike."""
    if pa.types.is_dictionary(arrow_type):
        return _kind(arrow_type.value_type)
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return "string"
    if pa.types.is_integer(arrow_type):
        return "integer"
    if pa.types.is_floating(arrow_type):
        return "float"
    if pa.types.is_boolean(arrow_type):
        return "bool"
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return "list"
    if pa.types.is_struct(arrow_type):
        return "struct"
    return str(arrow_type)


def type_matches(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a column stored as `actual` holds what the adapter reads as `expected`: the same family (string /
    large_string / dictionary of strings alike, any integer width, any float width), list items and the expected
    struct fields alike recursively (a struct may carry more fields); an all-null column matches anything."""
    if pa.types.is_null(actual):
        return True
    if _kind(actual) != _kind(expected):
        return False
    if _kind(expected) == "list":
        return type_matches(actual.value_type, expected.value_type)
    if _kind(expected) == "struct":
        names = [actual.field(i).name for i in range(actual.num_fields)]
        return all(
            expected.field(i).name in names
            and type_matches(actual.field(expected.field(i).name).type, expected.field(i).type)
            for i in range(expected.num_fields)
        )
    return True


def check_source_schema(path: Path, spec: SourceSpec, schema: pa.Schema) -> None:
    """InputFileError naming file, column, expected and actual type when `schema` is not the dataset's."""
    for column in spec.columns:
        if column.name not in schema.names:
            if column.required:
                raise InputFileError(
                    f"{path}: not a {spec.dataset} shard: column {column.name!r} is missing (expected "
                    f"{column.type}, actual: absent; has {schema.names})"
                )
            continue
        if (n := len(schema.get_all_field_indices(column.name))) > 1:
            raise InputFileError(f"{path}: column {column.name!r} appears {n} times")
        actual = schema.field(column.name).type
        if not type_matches(actual, column.type):
            raise InputFileError(
                f"{path}: not a {spec.dataset} shard: column {column.name!r} has type {actual}, expected "
                f"{column.type} (a column of another type is not coerced: the file is refused)"
            )


def _conform_column(array: pa.ChunkedArray, expected: pa.DataType) -> pa.ChunkedArray:
    """Flat columns cast to the published type (large_string, dictionary, int32, all-null ...); nested ones are
    read by field name and kept as stored (extra struct fields do no harm)."""
    if array.type.equals(expected) or _kind(expected) in ("list", "struct") and not pa.types.is_null(array.type):
        return array
    return array.cast(expected)


def read_parquet_source(path: Path, spec: SourceSpec, file: BinaryIO | None = None) -> pa.Table:
    """The published columns of a Parquet shard (optional ones absent: all null), schema checked first; `file`:
    an already open file of `path` to read instead."""
    schema = read_arrow_schema(path, file)
    check_source_schema(path, spec, schema)
    present = [column.name for column in spec.columns if column.name in schema.names]
    try:
        table = pq.read_table(path if file is None else file, columns=present)
        table.validate(full=True)
    except Exception as error:
        raise InputFileError(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})") from error
    arrays, names = [], []
    for column in spec.columns:
        names.append(column.name)
        if column.name in present:
            arrays.append(_conform_column(table.column(column.name), column.type))
        else:
            arrays.append(pa.chunked_array([pa.nulls(table.num_rows, column.type)]))
    return pa.Table.from_arrays(arrays, names=names)


def _json_value(value: Any, arrow_type: pa.DataType) -> tuple[bool, Any]:
    """(matches, the value reduced to the published type): a JSON value against an Arrow type, recursively."""
    if value is None:
        return True, None
    kind = _kind(arrow_type)
    if kind == "string":
        return isinstance(value, str), value
    if kind == "bool":
        return isinstance(value, bool), value
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool), value
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool), value
    if kind == "list":
        if not isinstance(value, list):
            return False, None
        items = [_json_value(item, arrow_type.value_type) for item in value]
        return all(ok for ok, _ in items), [item for _, item in items]
    if kind == "struct":
        if not isinstance(value, dict):
            return False, None
        fields = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
        reduced = {f.name: _json_value(value.get(f.name), f.type) for f in fields}
        return all(ok for ok, _ in reduced.values()), {name: item for name, (_, item) in reduced.items()}
    return False, None


def _type_mismatch(value: Any, arrow_type: pa.DataType, where: str) -> str:
    """Where a JSON value that `_json_value` refuses first differs from the published type, down to the nested
    item or field (`'messages'[0]['role'] is a JSON number, expected string`)."""
    kind = _kind(arrow_type)
    if kind == "list" and isinstance(value, list):
        for i, item in enumerate(value):
            if not _json_value(item, arrow_type.value_type)[0]:
                return _type_mismatch(item, arrow_type.value_type, f"{where}[{i}]")
    if kind == "struct" and isinstance(value, dict):
        for field in (arrow_type.field(i) for i in range(arrow_type.num_fields)):
            if not _json_value(value.get(field.name), field.type)[0]:
                return _type_mismatch(value.get(field.name), field.type, f"{where}[{field.name!r}]")
    return f"{where} is a JSON {_json_type_name(value)}, expected {arrow_type}"


def _json_type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(
        type(value), type(value).__name__
    )


LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # where json.loads may have made a lone surrogate


def _json_object(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object a JSONL line holds, or why it is none: not UTF-8, not JSON (or nested past Python's
    recursion limit), another JSON type, or a string holding a lone UTF-16 surrogate escape (`"\\ud800"`: valid
    JSON syntax, but not Unicode text, so no Arrow string can hold it)."""
    try:
        obj = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        return None, f"not JSON: {error}"
    if not isinstance(obj, dict):
        return None, f"a JSON {_json_type_name(obj)}, not an object"
    if LONE_SURROGATE_ESCAPE.search(line):
        try:
            json.dumps(obj, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as error:
            return None, f"not Unicode text: a string holds the lone surrogate {error.object[error.start]!r}"
    return obj, None


JSONL_BATCH_ROWS = 1024  # JSONL lines parsed into Python objects at a time, then into Arrow: what a read holds


def _jsonl_lines(path: Path, file: BinaryIO | None) -> Iterator[bytes]:
    """The non-blank lines of a JSONL file, read line by line (a byte order mark before the first removed)."""
    with contextlib.ExitStack() as stack:
        handle = file if file is not None else stack.enter_context(open(path, "rb"))
        first = True
        for line in handle:
            if first:  # a byte order mark some editors write: not part of the first line
                line, first = line.removeprefix(codecs.BOM_UTF8), False
            line = line.removesuffix(b"\n")
            if line.strip():
                yield line


def read_jsonl_source(path: Path, spec: SourceSpec, report: ShardReport, file: BinaryIO | None = None) -> pa.Table:
    """The published columns of a JSONL shard, one row per non-blank line (`source_row` = its index among them):
    a line that is not a JSON object (`_json_object`) or holds a field of another type is dropped and counted; a
    file none of whose lines is a JSON object is not JSON Lines, and a required column absent from every line is
    another dataset's: either refuses the file. `file`: an open file of `path` to read. The file is read line by
    line and converted to Arrow JSONL_BATCH_ROWS rows at a time, so no more than one batch is held as Python
    objects, whatever the file's size (docs/sources.md)."""
    batches: list[pa.Table] = []
    rows: list[dict[str, Any]] = []
    source_rows: list[int] = []
    keys_seen: set[str] = set()
    lines = objects = 0
    first_problem: str | None = None

    def flush() -> None:
        if rows:
            table = pa.Table.from_pylist(rows, schema=spec.schema)
            batches.append(table.append_column("source_row", pa.array(source_rows, pa.int64())))
            rows.clear()
            source_rows.clear()

    try:
        for index, line in enumerate(_jsonl_lines(path, file)):
            lines += 1
            obj, not_an_object = _json_object(line)
            if obj is None:
                first_problem = not_an_object if index == 0 else first_problem
                report.drop(drops.DROP_INVALID_JSON_LINE, index, None, not_an_object)
                continue
            objects += 1
            keys_seen |= obj.keys()
            row, wrong = {}, None
            for column in spec.columns:
                value = obj.get(column.name)
                if column.json_text:
                    row[column.name] = None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)
                    continue
                ok, row[column.name] = _json_value(value, column.type)
                if not ok and wrong is None:
                    wrong = _type_mismatch(value, column.type, repr(column.name))
            if wrong is not None:
                report.drop(drops.DROP_WRONG_TYPE, index, None, wrong)
                continue
            rows.append(row)
            source_rows.append(index)
            if len(rows) >= JSONL_BATCH_ROWS:
                flush()
    except OSError as error:
        raise InputFileError(f"{path}: not a readable JSONL file ({type(error).__name__}: {error})") from error
    flush()
    if lines and not objects:
        raise InputFileError(
            f"{path}: not a JSONL file: none of its {lines} lines is a JSON object (line 0: {first_problem}); "
            "a gzip file or one JSON document over several lines is refused whole, not dropped line by line"
        )
    if lines and keys_seen:
        for column in spec.columns:
            if column.required and column.name not in keys_seen:
                raise InputFileError(
                    f"{path}: not a {spec.dataset} shard: column {column.name!r} is missing (expected "
                    f"{column.type}, actual: absent from all {lines} lines; has {sorted(keys_seen)})"
                )
    empty = spec.schema.empty_table().append_column("source_row", pa.array([], pa.int64()))
    table = pa.concat_tables(batches).combine_chunks() if batches else empty  # one chunk: the bytes a whole read gave
    report.rows_in += lines - table.num_rows  # the lines dropped here; the rest are counted with the table
    return table


def read_source_table(path: Path, spec: SourceSpec, report: ShardReport, file: BinaryIO | None = None) -> pa.Table:
    """A shard's published columns plus `source_row`, by the spec's file format (from `file` when given: an open
    file of `path`)."""
    if spec.file_format == JSONL:
        return read_jsonl_source(path, spec, report, file)
    table = read_parquet_source(path, spec, file)
    return table.append_column("source_row", pa.array(range(table.num_rows), pa.int64()))


# --- what adapters build with --------------------------------------------------------------------------------
def conversation_frame(
    frame: pl.DataFrame,
    turns: pl.Expr,
    example_id: pl.Expr | None = None,
    language: pl.Expr | None = None,
    reasoning: pl.Expr | None = None,
    drop_reason: pl.Expr | None = None,
    extra: pl.Expr | None = None,
) -> pl.DataFrame:
    """CONVERSATION_COLUMNS from expressions over a shard's published columns (null where not given)."""
    nothing = pl.lit(None, pl.String)
    return frame.select(
        "source_row",
        (nothing if drop_reason is None else drop_reason).alias("drop_reason"),
        (nothing if example_id is None else example_id).alias("example_id"),
        (nothing if language is None else language).alias("language"),
        turns.alias("turns"),
        (nothing if reasoning is None else reasoning).alias("reasoning"),
        (pl.lit(None) if extra is None else extra).alias("extra"),
    )


def message_list_turns(column: str, role: str = "role", text: str = "content") -> pl.Expr:
    """Turns from a list of message structs (`[{role, content}, ...]`, the chat-dataset layout)."""
    return pl.col(column).list.eval(
        pl.struct(role=pl.element().struct.field(role), text=pl.element().struct.field(text))
    )


# --- conversations -> synth_harmony_v1 -----------------------------------------------------------------------
def canonical_content(turns: Sequence[dict[str, str]], reasoning: str | None) -> str:
    """The text an example's content id hashes: its turns (role, text) and reasoning, as compact sorted JSON."""
    content = {"turns": [[turn["role"], turn["text"]] for turn in turns], "reasoning": reasoning}
    return json.dumps(content, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def content_sha256(turns: Sequence[dict[str, str]], reasoning: str | None) -> str:
    return hashlib.sha256(canonical_content(turns, reasoning).encode("utf-8")).hexdigest()


def _roles() -> pl.Expr:
    return pl.element().struct.field("role")


def _texts() -> pl.Expr:
    return pl.element().struct.field("text")


def _sanitize(frame: pl.DataFrame) -> pl.DataFrame:
    """NULs removed from turn texts and reasoning, a leading system turn removed; `_nul` / `_system` flag the
    rows fixed, counted once each among the rows kept (`_count_sanitized`)."""
    has_nul = pl.col("turns").list.eval(_texts().str.contains("\x00", literal=True)).list.any().fill_null(False)
    has_nul = has_nul | pl.col("reasoning").str.contains("\x00", literal=True).fill_null(False)
    leading_system = (pl.col("turns").list.first().struct.field("role") == SYSTEM).fill_null(False)
    clean_turns = pl.col("turns").list.eval(
        pl.struct(role=_roles(), text=_texts().str.replace_all("\x00", "", literal=True))
    )
    reasoning = pl.col("reasoning").str.replace_all("\x00", "", literal=True)
    return frame.with_columns(
        turns=pl.when(leading_system).then(clean_turns.list.slice(1)).otherwise(clean_turns),
        reasoning=pl.when(_visible(reasoning)).then(reasoning),  # blank reasoning: no analysis message, as SYNTH
        _nul=has_nul,
        _system=leading_system,
    )


def _count_sanitized(kept: pl.DataFrame, report: ShardReport) -> None:
    for flag, key in (("_nul", drops.SANITIZED_NUL_IN_TURN_TEXT), ("_system", drops.SANITIZED_SOURCE_SYSTEM_TURN)):
        if n := int(kept[flag].sum()):
            report.sanitized[key] += n


def _split_think(frame: pl.DataFrame) -> pl.DataFrame:
    """`<think>R</think>A` opening an assistant turn: A is the turn's text; R is the reasoning of the last turn
    (unless the dataset gave it apart), a history turn's is dropped (Harmony keeps no past analysis)."""
    think = _texts().str.extract(THINK_PATTERN, 1)
    answer = _texts().str.extract(THINK_PATTERN, 2).str.strip_chars_start(python_whitespace())
    last = pl.col("turns").list.last()
    last_think = pl.when(last.struct.field("role") == ASSISTANT).then(
        last.struct.field("text").str.extract(THINK_PATTERN, 1).str.strip_chars(python_whitespace())
    )
    return frame.with_columns(
        reasoning=pl.coalesce(pl.col("reasoning"), pl.when(_visible(last_think)).then(last_think)),
        turns=pl.col("turns").list.eval(
            pl.struct(
                role=_roles(),
                text=pl.when((_roles() == ASSISTANT) & think.is_not_null()).then(answer).otherwise(_texts()),
            )
        ),
    )


def _visible(text: pl.Expr) -> pl.Expr:
    return text.str.strip_chars(python_whitespace()).str.len_bytes() > 0


def _row_reason(needs_id: bool) -> pl.Expr:
    """The first reason a conversation row is dropped for (the order of docs/sources.md), null to keep it;
    `needs_id`: the spec's id rule reads the dataset's id, so a null one drops the row too."""
    turns = pl.col("turns")
    n = turns.list.len()
    position = pl.int_range(pl.len())
    expected_role = pl.when(position % 2 == 0).then(pl.lit(USER)).otherwise(pl.lit(ASSISTANT))
    unsupported = turns.list.eval(~_roles().is_in([USER, ASSISTANT]) | _roles().is_null()).list.any()
    empty = turns.list.eval(~_visible(_texts()).fill_null(False)).list.any()
    # `_split_think` took every closed `<think>...</think>` apart: one still opening a turn is never closed
    unterminated = turns.list.eval(
        ((_roles() == ASSISTANT) & _texts().str.contains(OPENS_THINK_PATTERN)).fill_null(False)
    ).list.any()
    in_order = turns.list.eval((_roles() == expected_role).all()).list.first() & (n % 2 == 0)
    return (
        pl.when(pl.col("drop_reason").is_not_null())
        .then(pl.col("drop_reason"))
        .when(turns.is_null() | (n == 0))
        .then(pl.lit(drops.DROP_EMPTY_CONVERSATION))
        .when(unsupported)
        .then(pl.lit(drops.DROP_UNSUPPORTED_ROLE))
        .when(empty)
        .then(pl.lit(drops.DROP_EMPTY_TURN))
        .when(unterminated)
        .then(pl.lit(drops.DROP_UNTERMINATED_THINK))
        .when(~in_order)
        .then(pl.lit(drops.DROP_BAD_TURN_ORDER))
        .when((~_visible(pl.col("example_id"))).fill_null(needs_id))
        .then(pl.lit(drops.DROP_MISSING_SOURCE_ID))
        .when(pl.col("example_id").str.contains("\x00", literal=True).fill_null(False))
        .then(pl.lit(drops.DROP_NUL_IN_SYNTH_ID))
    )


def _source_example_ids(frame: pl.DataFrame, id_rule: str) -> pl.Series:
    """Per row: the dataset's id, the content hash, or both, by the spec's id rule."""
    if id_rule == ID_DATASET:
        return frame["example_id"]
    hashes = [content_sha256(turns, reasoning) for turns, reasoning in frame.select("turns", "reasoning").iter_rows()]
    if id_rule == ID_CONTENT:
        return pl.Series("example_id", hashes, dtype=pl.String)
    return pl.Series(
        "example_id", [f"{own}-{digest[:16]}" for own, digest in zip(frame["example_id"], hashes)], dtype=pl.String
    )


def _messages_json(system: dict[str, Any]) -> pl.Expr:
    """{"messages": [system, turns (user / assistant final) ..., (analysis), last assistant final]}."""
    turn_json = (
        pl.when(_roles() == USER)
        .then(message_json(USER, _texts()))
        .otherwise(message_json(ASSISTANT, _texts(), "final"))
    )
    history = pl.col("turns").list.slice(0, pl.col("turns").list.len() - 1).list.eval(turn_json).list.join(", ")
    analysis = pl.when(pl.col("reasoning").is_not_null()).then(
        message_json(ASSISTANT, pl.col("reasoning"), "analysis") + pl.lit(", ")
    )
    final = message_json(ASSISTANT, pl.col("turns").list.last().struct.field("text"), "final")
    return pl.concat_str(
        [
            pl.lit(messages_json_head(system)),
            pl.when(pl.col("turns").list.len() > 1).then(history + pl.lit(", ")).otherwise(pl.lit("")),
            analysis.fill_null(""),
            final,
            pl.lit("]}"),
        ]
    )


def _metadata_json(spec: SourceSpec, file_name: str, subset: str) -> pl.Expr:
    return pl.struct(
        dataset=pl.lit(spec.dataset),
        source=pl.lit(spec.key),
        subset=pl.lit(subset),
        source_file=pl.lit(file_name),
        source_row=pl.col("source_row"),
        source_example_id=pl.col("example_id"),
        id_rule=pl.lit(spec.id_rule),
        turns=pl.col("turns").list.len(),
        has_reasoning=pl.col("reasoning").is_not_null(),
        source_fields=pl.col("extra"),
    ).struct.json_encode()


def _conform_conversations(frame: pl.DataFrame, spec: SourceSpec) -> pl.DataFrame:
    """The adapter's frame with every CONVERSATION_COLUMNS column in its type (extra: null when absent)."""
    missing = [name for name in CONVERSATION_COLUMNS if name not in frame.columns and name != "extra"]
    if missing:
        raise ValueError(f"the {spec.key} adapter returned no {missing} (CONVERSATION_COLUMNS)")
    columns = [pl.col(name).cast(dtype) for name, dtype in CONVERSATION_COLUMNS.items() if dtype is not None]
    extra = pl.col("extra") if "extra" in frame.columns else pl.lit(None)
    return frame.select(*columns, extra.alias("extra")).sort("source_row")


def harmonize_source(
    path: Path,
    adapter: SourceAdapter,
    shard: str | None = None,
    subset: str | None = None,
    system: dict[str, Any] | None = None,
    file: BinaryIO | None = None,
) -> SourceResult:
    """One shard of an anchor source -> synth_harmony_v1 rows (HARMONY_SCHEMA) and a ShardReport: rows in (the
    file's rows, JSONL: its non-blank lines) = rows out + rows dropped (by reason, the first 1000 named in
    `report.errors` with shard, source_row, synth_id when known, reason and detail). `shard` names the file in
    the report (default `<source>/<file name>`); `subset` is recorded in metadata_json (default the file's stem).
    InputFileError when the file is not the dataset's (module docstring). `file`: an open file of `path` to read
    instead of opening `path`."""
    spec = adapter.spec
    report = ShardReport(shard=shard or f"{spec.key}/{path.name}")
    table = read_source_table(path, spec, report, file)
    report.rows_in += table.num_rows
    conversations = _conform_conversations(adapter.to_conversations(pl.from_arrow(table)), spec)
    if conversations.height != table.num_rows:
        raise ValueError(f"the {spec.key} adapter returned {conversations.height} rows for {table.num_rows}")
    conversations = _split_think(_sanitize(conversations))
    conversations = conversations.with_columns(
        drop_reason=_row_reason(spec.id_rule != ID_CONTENT),
        language=pl.col("language").fill_null(pl.lit(spec.language, pl.String)),
    )
    dropped = conversations.filter(pl.col("drop_reason").is_not_null())
    for source_row, reason, example_id in dropped.select("source_row", "drop_reason", "example_id").iter_rows():
        if reason in QUIET_REASONS:
            report.dropped[reason] += 1
        else:
            named = example_id is not None and spec.id_rule == ID_DATASET  # else the synth_id is not known yet
            synth_id = f"{spec.key}:{example_id}".replace("\x00", "\\0") if named else None
            report.drop(reason, source_row, synth_id, drops.DROP_DESCRIPTIONS[reason])
    kept = conversations.filter(pl.col("drop_reason").is_null())
    kept = kept.with_columns(example_id=_source_example_ids(kept, spec.id_rule))
    kept = kept.with_columns(synth_id=pl.lit(f"{spec.key}:") + pl.col("example_id"))
    kept = DuplicateIds().drop_duplicates(kept, report)
    _count_sanitized(kept, report)
    out = kept.select(
        "synth_id",
        "language",
        pl.lit(spec.exercise).alias("exercise"),
        "source_row",
        _messages_json(system or system_message_dict()).alias("messages_json"),
        _metadata_json(spec, path.name, subset or path.stem).alias("metadata_json"),
    )
    out = out.cast(dict(pl.from_arrow(HARMONY_SCHEMA.empty_table()).schema))  # HARMONY_SCHEMA, as polars types
    report.rows_out = out.height
    report.language.update(out["language"].fill_null("unknown").to_list())
    report.exercise.update(out["exercise"].to_list())
    return SourceResult(out, report)


def harmonize_source_shard(
    path: Path,
    out_path: Path,
    adapter: SourceAdapter,
    shard: str,
    source_sha256: str | None = None,
    max_rows: int | None = None,
    errors_log: Path | None = None,
) -> ShardReport:
    """The synth_harmony step of an anchor partition: `harmonize_source` of its file, written to `out_path`
    (HARMONY_SCHEMA, published atomically) with its error log. The file is opened once, hashed and parsed
    through that handle (`read_raw_shard`, as a SYNTH shard), so the recorded sha256 is of the bytes parsed.
    RawShardChangedError when that sha256 is not `source_sha256` (the file changed since the inventory scanned
    it) or the file is written to while being read; nothing is published then. `max_rows` (a smoke build) keeps
    the first rows written and drops the rest as `smoke_cap`."""
    file_kind = "JSONL" if adapter.spec.file_format == JSONL else "Parquet"
    with read_raw_shard(path, source_sha256, file_kind) as raw:
        result = harmonize_source(path, adapter, shard=shard, file=raw.file)
        raw.check_unchanged()
    frame, report = result.frame, result.report
    if max_rows is not None and frame.height > max_rows:
        report.dropped[drops.DROP_SMOKE_CAP] += frame.height - max_rows
        frame = frame.head(max_rows)
        report.rows_out = frame.height
        report.language = Counter(frame["language"].fill_null("unknown").to_list())
        report.exercise = Counter(frame["exercise"].to_list())
    report.source_sha256, report.source_bytes = raw.sha256, raw.bytes
    write_tables_together([(out_path, HARMONY_SCHEMA, frame.to_arrow())])
    if errors_log is not None:
        report.write_errors(errors_log)
    return report
