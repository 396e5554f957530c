"""The DistillKit / TRL dataset of seed 001, derived from the same tokenized arrays as synth_kd_v1.

Per conversation, from `data/synth_tokenized/<shard>.parquet` (tokens ending with EOD, label-aligned
span_id) and the conversation's system + user messages:

- `input_ids` = tokens without the trailing EOD;
- `assistant_token_start` = len(render_conversation_for_completion(system + user, Role.ASSISTANT)),
  whose tokens must equal the head of `input_ids` (asserted, `DistillContractError` otherwise). It is
  read off the row's own arrays (the completion's first `<|start|>` + the `<|start|>assistant` header,
  `CompletionPrefixes`) and confirmed with openai-harmony's render on the first row of every prompt shape
  of a shard and every `PREFIX_CHECK_EVERY`-th row: the tokens are openai-harmony's render already
  (the `harmony_round_trip` check), so where the prefix ends depends only on the messages' headers;
- `labels` = -100 before `assistant_token_start`, `input_ids` from there on;
- `analysis_token_count` / `final_token_count` = the tokens from `assistant_token_start` on whose
  span (from span_id) is analysis / final; they add up to len(input_ids) - assistant_token_start.

The completion prefix ends with `<|start|>assistant`, so those tokens of the first assistant message are
-100 here while synth_kd_v1 supervises them (its spans start at the message's `<|start|>`): the one
deliberate difference between the two outputs, checked row by row.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from openai_harmony import Conversation, Message, Role

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.caps import NO_CAPS, BuildCaps
from synthkd_assets.core.parquet_io import iter_frames, list_column, list_column_flat, streaming_parquet_file
from synthkd_assets.core.problems import Problems
from synthkd_assets.core.render import completion_start
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.stages import DatasetStep, TokenizedRow
from synthkd_assets.core.steps import Outputs, ParquetOutputs, Table, run_step
from synthkd_contract import constants, drops, sources
from synthkd_contract.labels import token_align
from synthkd_contract.manifest_seal import file_record
from synthkd_contract.schemas import DISTILL_SCHEMA, DISTILL_SOURCE_TYPE, DISTILL_SPANS_TYPE
from synthkd_contract.splits import is_valid


class DistillContractError(AssertionError):
    """The tokenized arrays and openai-harmony's completion render disagree: a bug, never a data drop."""


@dataclass(frozen=True)
class DistillRow:
    input_ids: np.ndarray  # int32
    labels: np.ndarray  # int32, LABEL_IGNORE_ID before assistant_token_start
    assistant_token_start: int
    analysis_token_count: int
    final_token_count: int


def distill_split(synth_id: str, valid_fraction: float = constants.DISTILL_VALID_FRACTION) -> str:
    """'validation' or 'train': the split rule of synth_kd_v1 with the distill salt and fraction."""
    valid = is_valid(synth_id, constants.DISTILL_SPLIT_SALT, valid_fraction)
    return constants.DISTILL_SPLITS[1] if valid else constants.DISTILL_SPLITS[0]


def prompt_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages before the completion (render.py `completion_start`): system + user, and for a multi-turn
    conversation its whole history."""
    start = completion_start(messages)
    if start >= len(messages):
        raise DistillContractError("conversation has no assistant message")
    return messages[:start]


def completion_prefix(encoding: Any, messages: list[dict[str, Any]]) -> list[int]:
    """render_conversation_for_completion(system + user, Role.ASSISTANT): the tokens before the output."""
    conversation = Conversation.from_messages([Message.from_dict(m) for m in prompt_messages(messages)])
    return encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)


# one row in this many has its derived completion prefix confirmed by openai-harmony's render, on top of the
# first row of every prompt shape (a Python render costs ~1 ms a row, as much as the rest of the step)
PREFIX_CHECK_EVERY: int = 64


class CompletionPrefixes:
    """Where each tokenized row's completion starts, from its own arrays, confirmed against openai-harmony.

    The completion's first assistant `<|start|>` is the first supervised position (span_id); the prefix is the
    tokens before it plus openai-harmony's `<|start|>assistant` header. The harmony_round_trip check has
    already proven the tokens to be openai-harmony's render of the messages, each content encoded as ordinary
    text, so whether `render_conversation_for_completion(prompt)` is that head depends on the message headers
    alone (roles, channels: what auto-dropping or any other rendering rule of the prompt could look at). The
    first row of every distinct header sequence of a shard, and every `check_every`-th row, are rendered with
    openai-harmony and must agree (`checked` counts them); a disagreement is a `DistillContractError`."""

    def __init__(self, encoding: Any, check_every: int = PREFIX_CHECK_EVERY) -> None:
        self.encoding, self.check_every = encoding, check_every
        header = encoding.render_conversation_for_completion(Conversation.from_messages([]), Role.ASSISTANT)
        self.assistant_header = np.asarray(header, dtype=np.int32)
        self.start_id = int(self.assistant_header[0])
        self.message_id = encoding.encode("<|message|>", allowed_special="all")[0]
        self.shapes: set[bytes] = set()
        self.rows = self.checked = 0

    def prefix(self, input_ids: np.ndarray, spans: np.ndarray, messages: Callable[[], list[dict[str, Any]]]) -> int:
        """The completion prefix's length in `input_ids` (label-aligned `spans` give the completion's first
        token); `messages` (called only for the rows openai-harmony confirms) gives the conversation."""
        supervised = np.flatnonzero(spans != constants.SPAN_PROMPT)
        first = int(supervised[0]) if len(supervised) else len(input_ids)
        start = first + len(self.assistant_header)
        if start >= len(input_ids) or not np.array_equal(input_ids[first:start], self.assistant_header):
            raise DistillContractError("the completion does not open with openai-harmony's <|start|>assistant")
        shape = self._shape(input_ids[:first])
        self.rows += 1
        if shape not in self.shapes or self.rows % self.check_every == 0:
            self.shapes.add(shape)
            self.checked += 1
            prefix = completion_prefix(self.encoding, messages())
            if len(prefix) != start or not np.array_equal(input_ids[:start], np.asarray(prefix, dtype=np.int32)):
                raise DistillContractError(
                    f"render_conversation_for_completion(system + user) ({len(prefix)} tokens) is not the head "
                    f"of input_ids (derived: {start} tokens)"
                )
        return start

    def _shape(self, prompt: np.ndarray) -> bytes:
        """The prompt's headers (`<|start|>` .. `<|message|>` of each message), contents left out."""
        starts = np.flatnonzero(prompt == self.start_id)
        bodies = np.flatnonzero(prompt == self.message_id)
        if len(starts) != len(bodies) or np.any(bodies < starts):
            return prompt.tobytes()  # not a sequence of whole messages: this exact prompt is its own shape
        return b"|".join(prompt[s:b].tobytes() for s, b in zip(starts.tolist(), bodies.tolist()))


def _row_arrays(tokens: np.ndarray, span_id: np.ndarray, synth_id: str) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, per-token spans) of a tokenized row: the tokens without their EOD, span_id label-aligned."""
    if len(tokens) < 2 or tokens[-1] != constants.EOD_TOKEN_ID or len(span_id) != len(tokens):
        raise DistillContractError(f"{synth_id}: tokenized row does not end with EOD or span_id has another length")
    spans = token_align(np.asarray(span_id, dtype=constants.SPAN_DTYPE))[:-1]
    return np.asarray(tokens[:-1], dtype=np.int32), spans


def _split_row(input_ids: np.ndarray, spans: np.ndarray, start: int, synth_id: str) -> DistillRow:
    """The DistillKit row of `input_ids` whose completion starts at `start`."""
    supervised = np.flatnonzero(spans != constants.SPAN_PROMPT)
    # Megatron's spans start at the first assistant <|start|>, which the completion prefix ends with
    if not len(supervised) or supervised[0] >= start or len(supervised) != len(spans) - supervised[0]:
        raise DistillContractError(
            f"{synth_id}: assistant tokens of the Megatron spans do not run from inside the completion prefix "
            "to the end"
        )
    output = spans[start:]
    analysis = int(np.count_nonzero(output == constants.SPAN_ANALYSIS))
    final = int(np.count_nonzero(output == constants.SPAN_FINAL))
    if analysis + final != len(output) or final == 0:
        raise DistillContractError(f"{synth_id}: assistant output has tokens outside analysis/final, or no final")
    labels = input_ids.copy()
    labels[:start] = constants.LABEL_IGNORE_ID
    return DistillRow(input_ids, labels, start, analysis, final)


class SampledMessages:
    """synth_sampled's rows in order, advanced to each tokenized row (the tokenized rows are the sampled rows in
    the same order, minus the ones the renderer dropped); a row's messages_json is read out of its frame only
    when asked (synth_distill asks for the few rows openai-harmony confirms)."""

    def __init__(self, sampled_path: Path, shard: str) -> None:
        self.frames = iter_frames(sampled_path, ("source_row", "messages_json"))
        self.shard = shard
        self.source_rows: list[int] = []
        self.messages: pl.Series | None = None
        self.at = 0

    def advance(self, source_row: int) -> Callable[[], str]:
        """Advance to `source_row`: its messages_json, when called.

        Raises:
            DistillContractError: `source_row` is not among the rows left.
        """
        while True:
            for i in range(self.at, len(self.source_rows)):
                if self.source_rows[i] == source_row:
                    self.at, messages = i + 1, self.messages
                    return lambda: messages[i]
            frame = next(self.frames, None)
            if frame is None:
                raise DistillContractError(
                    f"{self.shard}: tokenized source_row {source_row} is not in synth_sampled (in order)"
                )
            self.source_rows, self.messages, self.at = frame["source_row"].to_list(), frame["messages_json"], 0


@dataclass
class DistillShardResult:
    report: ShardReport
    files: list[dict[str, Any]]  # per split: path (relative to the dataset root), rows, bytes, sha256
    lengths: dict[str, Counter]  # per split: len(input_ids) -> rows
    prefixes_checked: int = 0  # rows whose completion prefix openai-harmony rendered (CompletionPrefixes)
    row_problems: Problems = field(default_factory=Problems)  # the parts' row invariants as written

    def record(self, partition: str, shard_index: int, root: str) -> dict[str, Any]:
        """The per-shard record; `root` is the dataset root as manifests record it (data-root relative)."""
        return {
            "partition": partition,
            "shard_index": shard_index,
            "dataset_root": root,
            "report": self.report.to_dict(),
            "files": self.files,
            "length_histogram": {
                split: {str(length): n for length, n in sorted(counts.items())}
                for split, counts in self.lengths.items()
            },
        }


class DistillStep(DatasetStep):
    """Tokenized conversations -> DistillKit rows of their split; longer than max_seq_len: dropped."""

    COLUMNS = ("synth_id", "language", "exercise", "source_row", "tokens", "span_id")

    def __init__(
        self,
        tokenized_path: Path,
        sampled_path: Path,
        paths: dict[str, Path],
        shard: str,
        encoding: Any,
        max_seq_len: int,
        valid_fraction: float,
        caps: BuildCaps,
    ) -> None:
        super().__init__(tokenized_path, caps)
        self.paths, self.shard, self.prefixes = paths, shard, CompletionPrefixes(encoding)
        self.max_seq_len, self.valid_fraction = max_seq_len, valid_fraction
        self.messages = SampledMessages(sampled_path, shard)
        self.lengths: dict[str, Counter] = {split: Counter() for split in constants.DISTILL_SPLITS}
        # the row invariants, on the tables as they are handed to Parquet (`written_rows_problems`)
        self.row_checks = {
            split: DistillRowCheck(path.name, split, max_seq_len, valid_fraction) for split, path in paths.items()
        }

    def open_outputs(self) -> Outputs:
        return ParquetOutputs({split: (path, DISTILL_SCHEMA) for split, path in self.paths.items()})

    def keep(self, row: TokenizedRow, report: ShardReport) -> tuple[str, tuple[str, str, str, DistillRow]] | None:
        length = len(row.tokens) - 1  # input_ids: the tokens without the trailing EOD
        if length > self.max_seq_len:
            detail = f"{length} tokens > {self.max_seq_len}"
            report.drop(drops.DROP_OVER_MAX_SEQ_LEN, row.source_row, row.synth_id, detail)
            return None
        payload = self.messages.advance(row.source_row)
        input_ids, token_spans = _row_arrays(row.tokens, row.span_id, row.synth_id)
        try:
            start = self.prefixes.prefix(input_ids, token_spans, lambda: json.loads(payload())["messages"])
        except DistillContractError as error:
            raise DistillContractError(f"{row.synth_id}: {error}") from error
        distilled = _split_row(input_ids, token_spans, start, row.synth_id)
        split = distill_split(row.synth_id, self.valid_fraction)
        report.exercise_language[(row.exercise, row.language)] += 1
        spans = {"prompt": distilled.assistant_token_start, "analysis": distilled.analysis_token_count}
        report.span_tokens.update({**spans, "final": distilled.final_token_count})
        self.lengths[split][length] += 1
        return split, (row.synth_id, row.exercise, row.language, distilled)

    def tables(self, arrow: pa.Table, kept: dict[str, list[tuple[str, str, str, DistillRow]]]) -> dict[str, Table]:
        dataset = sources.source_dataset(sources.partition_source(self.shard))
        tables = {split: distill_table(rows, dataset) for split, rows in kept.items()}
        for split, table in tables.items():
            self.row_checks[split].check(table)
        return tables

    def written_rows_problems(self) -> Problems:
        """After `run_step`: what breaks the DistillKit row invariants in the parts written (every kind of
        `distill_part_problems`), from the rows checked as they were written and each part's footer read back."""
        problems = Problems()
        for split, check in self.row_checks.items():
            schema_problem = part_schema_problem(self.paths[split])
            if schema_problem is not None:
                check.add("schema", schema_problem)
            for kind_problems in check.problems.values():
                problems.merge(kind_problems)
        return problems


def write_distill_shard(
    tokenized_path: Path,
    sampled_path: Path,
    root: Path,
    shard_index: int,
    shard: str,
    encoding: Any,
    max_seq_len: int = constants.MAX_SEQ_LEN,
    valid_fraction: float = constants.DISTILL_VALID_FRACTION,
    caps: BuildCaps = NO_CAPS,
    errors_log: Path | None = None,
) -> DistillShardResult:
    """Tokenized Parquet -> `<root>/{train,validation}/part-XXXXX.parquet` (both always written, so a
    rebuild replaces both, and renamed into place together); conversations longer than `max_seq_len`
    are dropped and counted."""
    paths = {split: root / split / constants.distill_part_name(shard_index) for split in constants.DISTILL_SPLITS}
    step = DistillStep(tokenized_path, sampled_path, paths, shard, encoding, max_seq_len, valid_fraction, caps)
    report = run_step(step, shard, errors_log)
    files = [
        {**file_record(root, path), "split": split, "rows": report.sequences[split]} for split, path in paths.items()
    ]
    return DistillShardResult(report, files, step.lengths, step.prefixes.checked, step.written_rows_problems())


def distill_table(rows: list[tuple[str, str, str, DistillRow]], dataset: str = constants.SOURCE_DATASET) -> pa.Table:
    """(synth_id, exercise, language, DistillRow) rows of one dataset -> a table of DISTILL_SCHEMA."""
    synth_ids = [r[0] for r in rows]
    source = pa.StructArray.from_arrays(
        [
            pa.array([dataset] * len(rows), pa.string()),
            pa.array(synth_ids, pa.string()),
            pa.array([r[1] for r in rows], pa.string()),
            pa.array([r[2] for r in rows], pa.string()),
        ],
        fields=list(DISTILL_SOURCE_TYPE),
    )
    spans = pa.StructArray.from_arrays(
        [
            pa.array([r[3].assistant_token_start for r in rows], pa.int32()),
            pa.array([r[3].analysis_token_count for r in rows], pa.int32()),
            pa.array([r[3].final_token_count for r in rows], pa.int32()),
        ],
        fields=list(DISTILL_SPANS_TYPE),
    )
    input_ids = [r[3].input_ids for r in rows]
    return pa.Table.from_arrays(
        [
            pa.array([sources.distill_row_id(dataset, s) for s in synth_ids], pa.string()),
            source,
            list_column(input_ids, np.int32),
            list_column([r[3].labels for r in rows], np.int32),
            list_column([np.ones(len(ids), dtype=np.int8) for ids in input_ids], np.int8),
            spans,
        ],
        schema=DISTILL_SCHEMA,
    )


# --- verification (behind the blocking checks) ------------------------------------------------

PROBLEM_KINDS = ("schema", "labels", "spans", "max_length", "split")


class DistillRowCheck:
    """The row invariants of one DistillKit part (`distill_part_problems` lists them), checked table by table in
    the part's row order: on a part read back, or on the tables a writer hands to Parquet (`DistillStep`), so that
    the rows just written need not be decoded again. `problems`: by kind, at most `limit` lines of a kind listed,
    every problem counted; each line names the part (`name`), its split and the row in the part."""

    def __init__(
        self,
        name: str,
        split: str,
        max_seq_len: int,
        valid_fraction: float,
        kinds: tuple[str, ...] = PROBLEM_KINDS,
        limit: int = 50,
    ) -> None:
        self.name, self.split, self.max_seq_len, self.valid_fraction = name, split, max_seq_len, valid_fraction
        self.limit = limit
        self.problems: dict[str, Problems] = {kind: Problems() for kind in kinds}
        self.row_base = 0  # the part's row of the next table's first row

    def add(self, kind: str, message: str) -> None:
        if kind in self.problems:
            self.problems[kind].add(f"{self.name} ({self.split}): {message}", self.limit)

    def check(self, table: pa.Table) -> None:
        """The invariants of the next rows of the part (a table of DISTILL_SCHEMA)."""
        add, problems, row_base, n_rows = self.add, self.problems, self.row_base, table.num_rows
        self.row_base += n_rows
        lengths, ids = list_column_flat(table.column("input_ids"))
        label_lengths, labels = list_column_flat(table.column("labels"))
        mask_lengths, mask = list_column_flat(table.column("attention_mask"))
        spans = table.column("spans").combine_chunks()
        start = spans.field("assistant_token_start").to_numpy(zero_copy_only=False).astype(np.int64)
        analysis = spans.field("analysis_token_count").to_numpy(zero_copy_only=False).astype(np.int64)
        final = spans.field("final_token_count").to_numpy(zero_copy_only=False).astype(np.int64)
        same_shape = np.array_equal(lengths, label_lengths) and np.array_equal(lengths, mask_lengths)
        if "labels" in problems:
            if not same_shape:
                add(
                    "labels",
                    f"rows {row_base}..{row_base + n_rows}: labels/attention_mask lengths differ from input_ids",
                )
            else:
                if not np.all(mask == 1):
                    add("labels", f"rows {row_base}..{row_base + n_rows}: attention_mask has a value other than 1")
                bad = np.flatnonzero((labels != constants.LABEL_IGNORE_ID) & (labels != ids))
                for row in np.unique(np.searchsorted(np.cumsum(lengths), bad, side="right")):
                    add(
                        "labels",
                        f"row {row_base + row}: labels differ from input_ids where not {constants.LABEL_IGNORE_ID}",
                    )
        if "spans" in problems:
            for row in np.flatnonzero((start <= 0) | (start >= lengths) | (analysis < 0) | (final <= 0)):
                add(
                    "spans",
                    f"row {row_base + row}: assistant_token_start {start[row]} / counts out of range for "
                    f"{lengths[row]} tokens",
                )
            for row in np.flatnonzero(analysis + final != lengths - start):
                add(
                    "spans",
                    f"row {row_base + row}: analysis {analysis[row]} + final {final[row]} != {lengths[row]} - "
                    f"{start[row]}",
                )
            if same_shape:
                position = np.arange(len(ids)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
                ignored = labels == constants.LABEL_IGNORE_ID
                wrong = np.flatnonzero(ignored != (position < np.repeat(start, lengths)))
                for row in np.unique(np.searchsorted(np.cumsum(lengths), wrong, side="right")):
                    add("spans", f"row {row_base + row}: labels are not -100 exactly before assistant_token_start")
        if "max_length" in problems:
            for row in np.flatnonzero(lengths > self.max_seq_len):
                add("max_length", f"row {row_base + row}: {lengths[row]} tokens > max_seq_len {self.max_seq_len}")
        if "split" in problems:
            source = table.column("source").combine_chunks()
            for row, (row_id, synth_id, dataset) in enumerate(
                zip(
                    table.column("id").to_pylist(),
                    source.field("synth_id").to_pylist(),
                    source.field("dataset").to_pylist(),
                )
            ):
                if row_id != (want := sources.distill_row_id(dataset, synth_id)):
                    add("split", f"row {row_base + row}: id {row_id!r} is not {want!r}")
                if distill_split(synth_id, self.valid_fraction) != self.split:
                    add(
                        "split",
                        f"row {row_base + row}: synth_id {synth_id!r} belongs to "
                        f"{distill_split(synth_id, self.valid_fraction)}",
                    )


def part_schema_problem(path: Path) -> str | None:
    """Why a written part is not a DistillKit part by its footer alone (unreadable, or another schema); None when
    it is one. Reads the footer only."""
    try:
        schema = pq.read_schema(path)
    except Exception as error:
        return f"unreadable ({type(error).__name__}: {error})"
    if not schema.equals(DISTILL_SCHEMA):
        return f"schema {schema} is not the DistillKit schema"
    return None


def distill_part_problems(
    path: Path,
    split: str,
    max_seq_len: int,
    valid_fraction: float,
    kinds: tuple[str, ...] = PROBLEM_KINDS,
    limit: int = 50,
) -> dict[str, Problems]:
    """Re-read one written part and list what breaks the DistillKit contract, by kind (at most `limit` lines of a
    kind listed, every problem counted):

    - schema: the part is unreadable, or its schema is not DISTILL_SCHEMA (then nothing else is checked)
    - labels: labels[i] != input_ids[i] where labels[i] != -100; labels / attention_mask lengths differ
      from input_ids; attention_mask not all 1
    - spans: not (0 < assistant_token_start < len), -100 not exactly at the positions before it,
      analysis + final != len - assistant_token_start
    - max_length: len(input_ids) > max_seq_len
    - split: a row whose hash split is not this part's split; id != sources.distill_row_id(dataset, synth_id)
    """
    check = DistillRowCheck(path.name, split, max_seq_len, valid_fraction, kinds, limit)
    schema_problem = part_schema_problem(path)
    if schema_problem is not None:
        check.add("schema", schema_problem)
        return check.problems
    for batch in streaming_parquet_file(path).iter_batches(batch_size=2048):
        check.check(pa.Table.from_batches([batch]))
    return check.problems


def rows_valid_for(max_seq_len: int, valid_fraction: float) -> str:
    """What identifies the settings a part's row check applies (`distill_part_problems`): recorded with a shard's
    parts when the check passed, so that a later check under the same settings need not read them again.

    Args:
        max_seq_len: the longest row allowed.
        valid_fraction: the validation split's share of the salted hash.

    Returns:
        The sha256 of those settings.
    """
    return mf.config_hash({"max_seq_len": max_seq_len, "valid_fraction": valid_fraction})


def parts_checked_when_written(
    listed: Mapping[str, str],
    on_disk: Mapping[str, str],
    written: Mapping[str, str],
    valid_for: str | None,
    settings: str,
) -> set[str]:
    """The parts whose rows need no reading again: their bytes on disk are the ones the manifest lists and the
    ones a shard's row check passed on when it wrote them, under the same settings.

    Args:
        listed: {part path: sha256} as the manifest lists the shard's parts.
        on_disk: {part path: sha256} of the files now.
        written: {part path: sha256} of what the shard's step wrote (its materialization's record).
        valid_for: `rows_valid_for` of the settings its row check passed under; None when it did not pass.
        settings: `rows_valid_for` of the settings of the check asking.

    Returns:
        The part paths of `listed` that are verified.
    """
    if valid_for != settings:
        return set()
    return {path for path, sha in listed.items() if on_disk.get(path) == sha == written.get(path)}


def split_leakage(parts: Mapping[str, list[Path]]) -> Problems:
    """synth_ids found in more than one split (any parts), or twice in the dataset: one problem per id, naming the
    part files (`<split>/<part>`) it is in."""
    frames = [
        pl.read_parquet(path, columns=["id"]).with_columns(split=pl.lit(split), part=pl.lit(f"{split}/{path.name}"))
        for split, paths in parts.items()
        for path in paths
    ]
    if not frames:
        return []
    ids = pl.concat(frames)
    leaked = ids.group_by("id").agg(
        pl.col("split").n_unique().alias("splits"),
        pl.len().alias("rows"),
        pl.col("part").unique().sort().str.join(", ").alias("parts"),
    )
    in_splits, repeated = leaked.filter(pl.col("splits") > 1).sort("id"), leaked.filter(pl.col("rows") > 1).sort("id")
    listed = [
        f"{i} is in {s} splits ({f})" for i, s, f in in_splits.head(20).select("id", "splits", "parts").iter_rows()
    ]
    listed += [
        f"{i} appears {n} times ({f})" for i, n, f in repeated.head(20).select("id", "rows", "parts").iter_rows()
    ]
    return Problems(listed, total=leaked.filter((pl.col("splits") > 1) | (pl.col("rows") > 1)).height)  # ids
