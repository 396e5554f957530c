"""The synth_harmony_v1 artifact as input (docs/contract.md, "The synth_harmony_v1 artifact"): its manifest verified
against the files, each file cut into row-group ranges from its footer, and a range read into synth_harmony_v1 rows.

- `read_artifact(root)`: the manifest (required) must list exactly the `synth_harmony_shard_<NN>.parquet` files of
  the directory, each with its size, row count and row-group count as on disk; anything else is refused naming the
  file (`InputFileError`).
- `artifact_ranges(artifact)`: the partitions, `ARTIFACT_ROW_GROUPS_PER_PARTITION` row groups each.
- `range_digest(range)`: what a range's version is: the sha256 of its row groups' metadata and bytes, so a changed
  file rebuilds only the ranges whose bytes changed, and hashing reads each byte of the artifact once.
- `harmonize_artifact_range(...)`: the rows of one range as synth_harmony_v1 rows. The messages are kept as the
  artifact wrote them (they are rendered as they are, system and developer messages included); a row whose
  messages are not the artifact's shape is dropped and counted (`artifact_messages_invalid`, the reason in the
  errors log), like the other row-level problems of raw SYNTH.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_assets.core.layout import DataLayout
from synthkd_assets.core.parquet_io import InputFileError, iter_frames, read_arrow_schema
from synthkd_assets.core.raw_read import RawRead, read_raw_shard
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.stages import drop_missing_required, drop_nul_synth_id, metadata_json_expr
from synthkd_assets.core.steps import SHARD, Outputs, ParquetOutputs, ShardStep, Table, run_step
from synthkd_assets.core.synth import python_whitespace
from synthkd_assets.core.validation import DuplicateIds, check_exercises, is_text_type
from synthkd_contract import constants, drops
from synthkd_contract.buckets import EXERCISE_SKILL_BUCKET
from synthkd_contract.harmony_artifact import (
    ARTIFACT_COLUMNS,
    ARTIFACT_CONTENT_TYPES,
    ARTIFACT_FILE_STEM,
    ARTIFACT_FILE_SUFFIX,
    ARTIFACT_MANIFEST_FILENAME,
    ARTIFACT_ROW_GROUPS_PER_PARTITION,
    ARTIFACT_SCHEMA_VERSION,
    range_partition_key,
)
from synthkd_contract.schemas import HARMONY_SCHEMA

FILE_KIND = "synth_harmony_v1 artifact"


@dataclass(frozen=True)
class ArtifactFile:
    """One Parquet file of the artifact, as its manifest lists it and its footer confirms."""

    path: Path
    bytes: int
    rows: int
    row_groups: int


@dataclass(frozen=True)
class HarmonyArtifact:
    """A verified artifact directory: its manifest (path, sha256, the JSON) and its files, sorted by name."""

    root: Path
    manifest_path: Path
    manifest_sha256: str
    manifest: dict[str, Any]
    files: tuple[ArtifactFile, ...]

    def provenance(self) -> dict[str, Any]:
        """What a dataset manifest records of its input artifact (seed 000: the input manifest's hash)."""
        conversion = self.manifest.get("conversion") or {}
        return {
            "path": str(self.manifest_path),
            "sha256": self.manifest_sha256,
            "schema_version": self.manifest.get("schema_version"),
            "git_sha": self.manifest.get("git_sha"),
            "total_rows": sum(f.rows for f in self.files),
            "system_message": conversion.get("system_message"),
            "developer_message": conversion.get("developer_message"),
        }


def layout_artifact(layout: DataLayout) -> HarmonyArtifact | None:
    """The layout's synth_harmony_v1 artifact, verified now (`read_artifact`), or None when it reads none.

    Raises:
        InputFileError: the artifact does not verify.
    """
    return None if layout.harmony_root is None else read_artifact(layout.harmony_root)


def input_artifact_record(layout: DataLayout, artifact: HarmonyArtifact | None) -> dict[str, Any]:
    """`{"input_artifact": {path, sha256, ...}}` for a manifest of a build that reads `artifact` (`layout_artifact`),
    `{}` for one that reads none: what every dataset manifest records of it (seed 000).

    Args:
        layout: the build's layout (how the manifest's path is recorded).
        artifact: the verified artifact, or None.

    Returns:
        The manifest's `input_artifact` entry, or nothing.
    """
    if artifact is None:
        return {}
    return {"input_artifact": {**artifact.provenance(), "path": layout.recorded(artifact.manifest_path)}}


def dataset_config(config: dict[str, Any], artifact: HarmonyArtifact | None) -> dict[str, Any]:
    """A dataset's config (what its config_hash covers) with the artifact's conversion settings (system and
    developer messages, metadata fields) when the build reads a synth_harmony_v1 artifact; `config` unchanged
    otherwise.

    Args:
        config: the dataset's config (kd_build_config, distill_build_config, the pool's).
        artifact: the verified artifact (`layout_artifact`), or None.

    Returns:
        The config the manifest hashes.
    """
    if artifact is None:
        return config
    conversion = artifact.manifest.get("conversion") or {}
    return {**config, "input_artifact": {"schema_version": ARTIFACT_SCHEMA_VERSION, "conversion": conversion}}


def _manifest_error(manifest: Path, what: str) -> InputFileError:
    return InputFileError(
        f"{manifest}: {what}; the artifact is refused (docs/contract.md, the synth_harmony_v1 artifact)"
    )


def _listed_shards(manifest_path: Path, manifest: Any) -> dict[str, dict[str, int]]:
    """{file name: {bytes, rows, row_groups}} as the manifest lists them, its shape checked."""
    if not isinstance(manifest, dict) or manifest.get("schema_version") != ARTIFACT_SCHEMA_VERSION:
        found = manifest.get("schema_version") if isinstance(manifest, dict) else type(manifest).__name__
        raise _manifest_error(manifest_path, f"schema_version is {found!r}, not {ARTIFACT_SCHEMA_VERSION!r}")
    storage = manifest.get("storage")
    shards = storage.get("shards") if isinstance(storage, dict) else None
    if not isinstance(shards, list) or not shards:
        raise _manifest_error(
            manifest_path, "storage.shards is not a non-empty list of {path, bytes, rows, row_groups}"
        )
    listed: dict[str, dict[str, int]] = {}
    for i, shard in enumerate(shards):
        fields = ("bytes", "rows", "row_groups")
        if not isinstance(shard, dict) or not isinstance(shard.get("path"), str):
            raise _manifest_error(manifest_path, f"storage.shards[{i}] has no path")
        if not all(isinstance(shard.get(f), int) and not isinstance(shard.get(f), bool) for f in fields):
            raise _manifest_error(manifest_path, f"storage.shards[{i}] ({shard['path']}): {fields} must be integers")
        name = Path(shard["path"]).name  # the converter records its own path; the file is looked up by its name
        if name in listed:
            raise _manifest_error(manifest_path, f"storage.shards[{i}]: {name} is listed twice")
        listed[name] = {f: shard[f] for f in fields}
    return listed


def read_artifact(root: Path) -> HarmonyArtifact:
    """Verify an artifact directory against its manifest.

    Args:
        root: the directory holding `manifest.json` and the `synth_harmony_shard_<NN>.parquet` files.

    Returns:
        The artifact, its files sorted by name.

    Raises:
        InputFileError: naming the file and the mismatch: no manifest or not JSON, another schema version, a
            listed file missing, a Parquet file not listed or not named `synth_harmony_shard_<NN>.parquet`, a file
            whose size, row count or row-group count is not the manifest's, a column missing or not a string,
            totals that disagree.
    """
    manifest_path = root / ARTIFACT_MANIFEST_FILENAME
    if not root.is_dir():
        raise InputFileError(f"no synth_harmony_v1 artifact in {root}: the directory does not exist")
    try:
        text = manifest_path.read_bytes()
    except OSError as error:
        raise _manifest_error(manifest_path, f"the required manifest cannot be read ({type(error).__name__})") from None
    try:
        manifest = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise _manifest_error(manifest_path, f"not JSON ({error})") from None
    listed = _listed_shards(manifest_path, manifest)
    if not isinstance(manifest.get("conversion", {}), dict):
        raise _manifest_error(manifest_path, "conversion is not an object")
    on_disk = {path.name: path for path in sorted(root.glob(f"*{ARTIFACT_FILE_SUFFIX}"))}
    for name, path in on_disk.items():
        if ARTIFACT_FILE_STEM.fullmatch(name.removesuffix(ARTIFACT_FILE_SUFFIX)) is None:
            raise InputFileError(f"{path}: not an artifact shard name (synth_harmony_shard_<NN>.parquet): rename it")
        if name not in listed:
            raise _manifest_error(manifest_path, f"{path} is in the directory but not listed in storage.shards")
        if not path.is_file():
            raise InputFileError(f"{path}: not a readable Parquet file (not a regular file)")
    files = []
    for name, expected in sorted(listed.items()):
        path = root / name
        if name not in on_disk:
            raise _manifest_error(manifest_path, f"{name} is listed in storage.shards but {path} does not exist")
        metadata = _footer(path)
        found = {"bytes": path.stat().st_size, "rows": metadata.num_rows, "row_groups": metadata.num_row_groups}
        if differ := [f"{f} {expected[f]} listed, {found[f]} in the file" for f in expected if expected[f] != found[f]]:
            raise _manifest_error(manifest_path, f"{path} is not the file it lists: {'; '.join(differ)}")
        check_artifact_schema(path, metadata.schema.to_arrow_schema())
        files.append(ArtifactFile(path, found["bytes"], found["rows"], found["row_groups"]))
    storage = manifest["storage"]
    for total, field in (("total_rows", "rows"), ("total_bytes", "bytes")):
        if total in storage and storage[total] != sum(getattr(f, field) for f in files):
            what = f"storage.{total} is {storage[total]}, the files hold {sum(getattr(f, field) for f in files)}"
            raise _manifest_error(manifest_path, what)
    return HarmonyArtifact(root, manifest_path, hashlib.sha256(text).hexdigest(), manifest, tuple(files))


def _footer(path: Path, source: BinaryIO | None = None) -> pq.FileMetaData:
    try:
        return pq.ParquetFile(path if source is None else source).metadata
    except Exception as error:
        raise InputFileError(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})") from error


def check_artifact_schema(path: Path, schema: pa.Schema) -> None:
    """InputFileError naming the file and column when a column of the artifact is missing or not text."""
    missing = [column for column in ARTIFACT_COLUMNS if column not in schema.names]
    if missing:
        raise InputFileError(f"{path}: not a {FILE_KIND} file: missing columns {missing} (has {schema.names})")
    for column in ARTIFACT_COLUMNS:
        actual = schema.field(column).type
        if not is_text_type(actual) or pa.types.is_binary(actual) or pa.types.is_large_binary(actual):
            raise InputFileError(f"{path}: column {column!r} has type {actual}, expected string (the file is refused)")


@dataclass(frozen=True)
class ArtifactRange:
    """Row groups `first`..`stop - 1` of one artifact file: one partition."""

    key: str
    path: Path
    first: int
    stop: int
    first_row: int  # the range's first row's index in the file
    rows: int


def artifact_ranges(
    artifact: HarmonyArtifact, row_groups_per_partition: int = ARTIFACT_ROW_GROUPS_PER_PARTITION
) -> list[ArtifactRange]:
    """Every partition of the artifact, in file then row-group order, from each file's footer.

    Args:
        artifact: a verified artifact (`read_artifact`).
        row_groups_per_partition: consecutive row groups per partition (the last of a file may hold fewer).

    Returns:
        One range per partition; a file without rows gives none.
    """
    ranges = []
    for file in artifact.files:
        metadata = _footer(file.path)
        row = 0
        stem = file.path.name.removesuffix(ARTIFACT_FILE_SUFFIX)
        for first in range(0, metadata.num_row_groups, row_groups_per_partition):
            stop = min(first + row_groups_per_partition, metadata.num_row_groups)
            rows = sum(metadata.row_group(i).num_rows for i in range(first, stop))
            ranges.append(ArtifactRange(range_partition_key(stem, first, stop - 1), file.path, first, stop, row, rows))
            row += rows
    return ranges


def _span(metadata: pq.FileMetaData, first: int, stop: int) -> tuple[int, int]:
    """[start, end) of the bytes of row groups first..stop-1 (their column chunks, dictionary pages included)."""
    starts, ends = [], []
    for i in range(first, stop):
        group = metadata.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            start = chunk.data_page_offset
            if chunk.has_dictionary_page and chunk.dictionary_page_offset:
                start = min(start, chunk.dictionary_page_offset)
            starts.append(start)
            ends.append(start + chunk.total_compressed_size)
    return (min(starts), max(ends)) if starts else (0, 0)


def range_digester(first: int, stop: int):
    """A `read_raw_shard` digest of row groups first..stop-1 of the open file: sha256 of the file's schema, the
    row groups' metadata and their bytes, and the number of those bytes."""

    def digest(handle: BinaryIO) -> tuple[str, int]:
        metadata = _footer(Path(getattr(handle, "name", "?")), handle)
        start, end = _span(metadata, first, stop)
        sha = hashlib.sha256(metadata.schema.to_arrow_schema().to_string().encode())
        for i in range(first, stop):
            sha.update(json.dumps(metadata.row_group(i).to_dict(), sort_keys=True, default=str).encode())
        handle.seek(start)
        remaining = end - start
        while remaining > 0:
            chunk = handle.read(min(1 << 20, remaining))
            if not chunk:
                raise InputFileError(f"{getattr(handle, 'name', '?')}: truncated inside row groups {first}-{stop - 1}")
            sha.update(chunk)
            remaining -= len(chunk)
        handle.seek(0)
        return sha.hexdigest(), end - start

    return digest


def range_digest(artifact_range: ArtifactRange) -> str:
    """The version of one range (what `harmonize_artifact_range` checks it reads)."""
    with open(artifact_range.path, "rb") as handle:
        return range_digester(artifact_range.first, artifact_range.stop)(handle)[0]


def find_range(ranges: Sequence[ArtifactRange], key: str) -> ArtifactRange | None:
    return next((r for r in ranges if r.key == key), None)


# --- one range -> synth_harmony_v1 rows --------------------------------------------------------------------------


def messages_problem(messages_json: str | None) -> tuple[str | None, bool]:
    """Why a `messages_json` is not the artifact's shape (None when it is), and whether it has a reasoning.

    The shape: a JSON object `{"messages": [...]}` of message objects, each with a role of
    ARTIFACT_CONTENT_TYPES and a non-empty content list of items of that role's type (`text` items with a string
    text holding no NUL), ending in an assistant message on channel `final`. Rendering judges the rest
    (channels, the system content's fields) and counts what it refuses.
    """
    if messages_json is None:
        return "messages_json is null", False
    try:
        document = json.loads(messages_json)
    except json.JSONDecodeError as error:
        return f"messages_json is not JSON ({error.msg} at character {error.pos})", False
    except (ValueError, RecursionError) as error:  # an integer past Python's digit limit, nesting past the stack
        return f"messages_json cannot be read ({type(error).__name__}: {str(error)[:120]})", False
    messages = document.get("messages") if isinstance(document, dict) else None
    if not isinstance(messages, list) or not messages:
        return 'messages_json is not {"messages": [...]} with at least one message', False
    has_reasoning = False
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if not isinstance(role, str) or role not in ARTIFACT_CONTENT_TYPES:
            return f"message {i}: role {role!r} is not one of {sorted(ARTIFACT_CONTENT_TYPES)}", False
        content = message.get("content")
        if not isinstance(content, list) or not content:
            return f"message {i} ({role}): content is not a non-empty list", False
        for item in content:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind != ARTIFACT_CONTENT_TYPES[role]:
                return (
                    f"message {i} ({role}): unknown content type {kind!r} (expected {ARTIFACT_CONTENT_TYPES[role]!r})",
                    False,
                )
            if kind == "text":
                text = item.get("text")
                if not isinstance(text, str):
                    return f"message {i} ({role}): text is not a string", False
                if "\x00" in text:
                    return f"message {i} ({role}): text holds NUL", False
                if role == "assistant" and message.get("channel") == "analysis" and text.strip(python_whitespace()):
                    has_reasoning = True
    last = messages[-1]
    if last.get("role") != "assistant" or last.get("channel") != "final":
        return "the last message is not the assistant's final answer", False
    if not any(m.get("role") == "user" for m in messages):
        return "no user message", False
    return None, has_reasoning


class HarmonizeArtifactStep(ShardStep):
    """Artifact rows -> synth_harmony_v1 rows: ids checked, messages' shape checked, kept as written."""

    def __init__(
        self,
        raw: RawRead,
        artifact_range: ArtifactRange,
        out_path: Path,
        max_rows: int | None,
        exercise_table: Mapping[str, str],
    ) -> None:
        self.raw, self.range, self.out_path, self.max_rows = raw, artifact_range, out_path, max_rows
        self.exercise_table = exercise_table
        self.duplicates = DuplicateIds()
        self.rows_read = 0

    def open_outputs(self) -> Outputs:
        return ParquetOutputs({SHARD: (self.out_path, HARMONY_SCHEMA)})

    def frames(self) -> Iterator[pl.DataFrame]:
        row_groups = list(range(self.range.first, self.range.stop))
        for frame in iter_frames(
            self.raw.path, ARTIFACT_COLUMNS, max_rows=self.max_rows, source=self.raw.file, row_groups=row_groups
        ):
            first = self.range.first_row + self.rows_read
            self.rows_read += frame.height
            yield frame.with_columns(pl.int_range(first, first + frame.height, dtype=pl.Int64).alias("source_row"))

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        frame = frame.with_columns(pl.col(c).cast(pl.String) for c in ARTIFACT_COLUMNS)
        frame = drop_missing_required(frame, report, ("synth_id",))
        frame = self.duplicates.drop_duplicates(drop_nul_synth_id(frame, report), report)
        judged = [messages_problem(text) for text in frame["messages_json"].to_list()]
        rows, ids = frame["source_row"].to_list(), frame["synth_id"].to_list()
        for i, (problem, _) in enumerate(judged):
            if problem is not None:
                report.drop(drops.DROP_ARTIFACT_MESSAGES, rows[i], ids[i], problem)
        keep = pl.Series([problem is None for problem, _ in judged], dtype=pl.Boolean)
        frame = frame.with_columns(pl.Series("has_reasoning", [r for _, r in judged], dtype=pl.Boolean)).filter(keep)
        nulls = {c: frame[c].null_count() for c in ("language", "exercise")}
        report.sanitized.update({drops.SANITIZED_NULL[c]: n for c, n in nulls.items() if n})
        frame = frame.with_columns(pl.col(c).fill_null(constants.NULL_DEFAULTS[c]) for c in nulls)
        check_exercises(frame, self.raw.path, self.range.key, self.exercise_table)
        report.language.update(frame["language"].to_list())
        report.exercise.update(frame["exercise"].to_list())
        metadata = metadata_json_expr(self.range.key, pl.col("has_reasoning")).alias("metadata_json")
        return {SHARD: frame.select("synth_id", "language", "exercise", "source_row", "messages_json", metadata)}

    def finish(self, report: ShardReport) -> None:
        report.source_sha256, report.source_bytes = self.raw.sha256, self.raw.bytes
        if self.max_rows is not None and (unread := self.range.rows - self.rows_read):
            report.rows_in += unread
            report.dropped[drops.DROP_SMOKE_CAP] += unread
        self.raw.check_unchanged()


def harmonize_artifact_range(
    artifact_range: ArtifactRange,
    out_path: Path,
    source_sha256: str | None = None,
    max_rows: int | None = None,
    errors_log: Path | None = None,
    exercise_table: Mapping[str, str] = EXERCISE_SKILL_BUCKET,
) -> ShardReport:
    """One artifact range -> synth_harmony_v1 Parquet (the artifact's messages as written + metadata_json).

    Args:
        artifact_range: the range (`artifact_ranges`).
        out_path: the synth_harmony output of its partition.
        source_sha256: the range's version the inventory reported; None reads it as it is.
        max_rows: a smoke build's cap on the rows read (the others count as `smoke_cap`).
        errors_log: where the dropped rows are named.
        exercise_table: the exercise -> skill bucket table every kept row's exercise must be in.

    Returns:
        The step's report: rows in / out, drops by reason, the range's sha256 and size as read.

    Raises:
        InputFileError: the file is unreadable or not the artifact's schema; RawShardChangedError (one) when its
            bytes are not `source_sha256` or change while read; UnknownExerciseError for an exercise the table
            does not map. Nothing is published then.
    """
    digest = range_digester(artifact_range.first, artifact_range.stop)
    with read_raw_shard(artifact_range.path, source_sha256, FILE_KIND, digest) as raw:
        check_artifact_schema(artifact_range.path, read_arrow_schema(artifact_range.path, raw.file))
        raw.file.seek(0)
        step = HarmonizeArtifactStep(raw, artifact_range, out_path, max_rows, exercise_table)
        return run_step(step, artifact_range.key, errors_log)
