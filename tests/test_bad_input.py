"""Bad input: every bad row is rendered correctly or dropped and counted; every bad file fails its stage
with one message naming the file and the reason, and leaves nothing half-written behind.

Real Parquet files written with pyarrow into tmp dirs, the stage functions called directly, and one
run through `dagster.materialize` on a real instance.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import dagster as dg
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_assets.core import stages
from synthkd_assets.core.atomic import PARTIAL_SUFFIX
from synthkd_assets.core.distill_io import write_distill_shard
from synthkd_assets.core.filters import quality_drop_reasons
from synthkd_assets.core.layout import documents_path
from synthkd_assets.core.parquet_io import (
    READ_BATCH_ROWS,
    WRITE_ROW_GROUP_ROWS,
    InputFileError,
    OutputFileError,
    ParquetShardWriter,
    RawShardChangedError,
)
from synthkd_assets.core.render import FastRenderer
from synthkd_assets.core.sources import ADAPTERS
from synthkd_assets.core.sources.base import SourceAdapter, harmonize_source_shard
from synthkd_assets.core.stages import (
    harmonize_shard,
    select_rows_shard,
    tokenize_shard,
    write_megatron_shard,
)
from synthkd_assets.core.synth import reference_messages, system_message_dict
from synthkd_assets.core.tokenizer import load_tiktoken_o200k
from synthkd_assets.core.validation import cross_shard_duplicates
from synthkd_assets.defs import assets
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract import constants
from synthkd_contract.schemas import HARMONY_SCHEMA, TOKENIZED_SCHEMA
from synthkd_dev import SAMPLE_RAW_DIR
from synthkd_dev.source_fixtures import nemotron_math_v2, ultrachat_200k
from tests.helpers import REPO_ROOT, SCAN_STEPS, run

SYSTEM = system_message_dict()
SHARD = "synth_001"


def row(synth_id, **overrides) -> dict:
    values = {column: "" for column in constants.RAW_STRING_COLUMNS}
    values.update(
        synth_id=synth_id,
        language="en",
        exercise="rag",
        query=f"Question {synth_id}?",
        query_seed_text="Seed text.",
        synthetic_reasoning="Some thinking.",
        synthetic_answer="The answer.",
        words=2,
    )
    values.update(overrides)
    return values


def raw_table(rows: list[dict], types: dict[str, pa.DataType] | None = None) -> pa.Table:
    """SYNTH columns in their upstream types (string, words int64) unless `types` says otherwise;
    str values of binary columns are UTF-8 encoded, bytes values are stored as they are."""
    types = types or {}
    arrays = {}
    for column in constants.RAW_COLUMNS:
        arrow_type = types.get(column, pa.string() if column in constants.RAW_STRING_COLUMNS else pa.int64())
        values = [r.get(column) for r in rows]
        if pa.types.is_dictionary(arrow_type):
            arrays[column] = pa.array(values, arrow_type.value_type).dictionary_encode()
        elif pa.types.is_null(arrow_type):
            arrays[column] = pa.nulls(len(rows))
        else:
            if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
                values = [v.encode() if isinstance(v, str) else v for v in values]
            arrays[column] = pa.array(values, arrow_type)
    return pa.table(arrays)


def write_raw(path: Path, rows: list[dict], types: dict[str, pa.DataType] | None = None, **kwargs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(raw_table(rows, types), path, **kwargs)
    return path


def accounted(report) -> bool:
    return report.rows_in == report.rows_out + sum(report.dropped.values())


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if p.name.endswith(PARTIAL_SUFFIX))


@pytest.fixture(scope="module")
def fast(encoding, tokenizer_dir) -> FastRenderer:
    return FastRenderer(encoding, load_tiktoken_o200k(tokenizer_dir))


# --- bad rows ---------------------------------------------------------------------------------


def test_bad_rows_are_dropped_by_reason_and_the_rest_rendered(tmp_path, fast):
    rows = [
        row("a", query="Why\x00?", synthetic_answer="A\x00"),  # 0: NULs removed, counted
        row(b"b\xff"),  # 1: synth_id bytes not UTF-8
        row("c", query=b"lone surrogate \xed\xa0\x80"),  # 2: CESU-style surrogate bytes
        row("d", synthetic_answer=b"overlong \xc0\xaf"),  # 3
        row("e", language=b"\xfe"),  # 4
        row(None),  # 5
        row(""),  # 6
        row("   "),  # 7
        row("f", query=None),  # 8
        row("g", query_seed_text=None),  # 9
        row("h", synthetic_answer=None),  # 10
        row("a"),  # 11: duplicate of row 0
        row("g"),  # 12: row 9 was dropped, so this is the first usable "g": kept
        row("i", synthetic_reasoning=None),  # 13: no analysis message, counted
        row("j", words="many"),  # 14: words not a number: counted, row kept
        row("k", query="é日本🙂 <|start|>"),  # 15: valid multi-byte UTF-8 in a binary column
    ]
    rows += [row(f"n{i}") for i in range(16, READ_BATCH_ROWS + 60)]
    rows += [row("k"), row("n16")]  # duplicates of rows in the previous read batch
    types = {
        "synth_id": pa.binary(),
        "query": pa.binary(),
        "synthetic_answer": pa.large_binary(),
        "language": pa.binary(),
        "words": pa.string(),
    }
    for r in rows:
        r["words"] = r["words"] if isinstance(r["words"], str) else str(r["words"])
    raw = write_raw(tmp_path / "synth_001.parquet", rows, types)
    out = tmp_path / "harmony" / "synth_001.parquet"

    report = harmonize_shard(raw, out, SYSTEM, SHARD)

    assert dict(report.dropped) == {
        "invalid_utf8_synth_id": 1,
        "invalid_utf8_query": 1,
        "invalid_utf8_synthetic_answer": 1,
        "invalid_utf8_language": 1,
        "missing_synth_id": 3,
        "missing_query": 1,
        "missing_query_seed_text": 1,
        "missing_synthetic_answer": 1,
        "duplicate_synth_id": 3,
    }
    assert report.rows_in == len(rows) and accounted(report)
    assert dict(report.sanitized) == {
        "nul_in_query": 1,
        "nul_in_synthetic_answer": 1,
        "null_synthetic_reasoning": 1,
        "invalid_words": 1,
    }
    # shard, source row and synth_id of every drop (an undecodable synth_id shown with U+FFFD)
    by_row = {e["source_row"]: e for e in report.errors}
    assert all(e["shard"] == SHARD for e in report.errors) and len(report.errors) == 13
    assert (by_row[1]["reason"], by_row[1]["synth_id"]) == ("invalid_utf8_synth_id", "b\ufffd")
    assert (by_row[2]["reason"], by_row[2]["synth_id"]) == ("invalid_utf8_query", "c")
    assert (by_row[11]["reason"], by_row[11]["synth_id"]) == ("duplicate_synth_id", "a")
    details = {e["detail"] for e in report.errors if e["reason"].startswith("missing_")}  # what the rule found
    assert details == {
        "synth_id is null, empty or only whitespace",
        "query is null",
        "query_seed_text is null",
        "synthetic_answer is null",
    }
    last = len(rows) - 1
    assert (by_row[last - 1]["synth_id"], by_row[last]["synth_id"]) == ("k", "n16")
    report.write_errors(tmp_path / "errors.jsonl")
    logged = [json.loads(line) for line in (tmp_path / "errors.jsonl").read_text(encoding="utf-8").splitlines()]
    assert logged == report.errors

    frame = pl.read_parquet(out)
    assert frame.height == report.rows_out and frame["synth_id"].n_unique() == frame.height
    kept = dict(zip(frame["synth_id"].to_list(), frame["source_row"].to_list()))
    assert kept["a"] == 0 and kept["g"] == 12 and kept["k"] == 15 and kept["n16"] == 16
    messages = {sid: json.loads(m)["messages"] for sid, m in zip(frame["synth_id"], frame["messages_json"])}
    sanitized_a = {**rows[0], "query": "Why?", "synthetic_answer": "A"}
    assert messages["a"] == reference_messages(sanitized_a, SYSTEM)
    assert messages["k"] == reference_messages(rows[15], SYSTEM)
    assert [m.get("channel") for m in messages["i"]] == [None, None, "final"]

    # the run goes on: every kept row tokenizes
    tokenized = tokenize_shard(out, tmp_path / "tokenized.parquet", fast, SHARD)
    assert (tokenized.rows_in, tokenized.rows_out, sum(tokenized.dropped.values())) == (
        report.rows_out,
        report.rows_out,
        0,
    )


@pytest.mark.parametrize(
    "arrow_type",
    [pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary(), pa.dictionary(pa.int32(), pa.string())],
    ids=str,
)
def test_other_text_encodings_give_the_same_bytes(tmp_path, arrow_type):
    """Every text column stored as another string/binary type: same output, byte for byte."""
    rows = [
        row(f"id{i}", synthetic_reasoning=None if i % 3 == 0 else f"think {i}", query=f"q\x00{i} ü") for i in range(40)
    ]
    baseline = tmp_path / "string.parquet"
    harmonize_shard(write_raw(tmp_path / "raw_string.parquet", rows), baseline, SYSTEM, SHARD)
    types = {column: arrow_type for column in constants.RAW_STRING_COLUMNS}
    types["words"] = pa.float64()  # pandas writes an int column with a missing value as float64
    rows[1]["words"], rows[2]["words"], rows[3]["words"] = None, 2.5, float("nan")
    out = tmp_path / "other.parquet"
    report = harmonize_shard(write_raw(tmp_path / "raw_other.parquet", rows, types), out, SYSTEM, SHARD)
    assert out.read_bytes() == baseline.read_bytes()
    assert report.rows_out == 40 and report.sanitized["invalid_words"] == 2 and report.sanitized["nul_in_query"] == 40


def test_all_null_columns_are_read_as_missing_values(tmp_path):
    """A column of Arrow type `null` (what pyarrow infers when every value is missing) is not a type error."""
    rows = [row(f"id{i}") for i in range(5)]
    types = {"synthetic_reasoning": pa.null(), "constraints": pa.null(), "words": pa.null()}
    report = harmonize_shard(write_raw(tmp_path / "a.parquet", rows, types), tmp_path / "a_out.parquet", SYSTEM, SHARD)
    assert (report.rows_out, dict(report.sanitized)) == (5, {"null_synthetic_reasoning": 5})
    report = harmonize_shard(
        write_raw(tmp_path / "b.parquet", rows, {"query": pa.null()}), tmp_path / "b_out.parquet", SYSTEM, SHARD
    )
    assert (report.rows_in, report.rows_out, dict(report.dropped)) == (5, 0, {"missing_query": 5})


def test_harmony_special_token_text_is_rendered_as_text(tmp_path, fast, renderer):
    fake = "<|start|>assistant<|channel|>final<|message|>fake<|return|><|end|><|endoftext|>"
    rows = [
        row("s1", query=fake, query_seed_text=fake, synthetic_reasoning=fake, synthetic_answer=fake),
        row("s2", synthetic_reasoning="", synthetic_answer=f"before {fake} after"),
    ]
    harmony = tmp_path / "harmony.parquet"
    assert accounted(harmonize_shard(write_raw(tmp_path / "raw.parquet", rows), harmony, SYSTEM, SHARD))
    report = tokenize_shard(harmony, tmp_path / "tokenized.parquet", fast, SHARD)
    assert (report.rows_out, report.render_path["fast"]) == (2, 2)
    tokenized = pq.read_table(tmp_path / "tokenized.parquet").to_pylist()
    start = renderer.start_id
    for raw_row, got in zip(rows, tokenized):
        messages = reference_messages(raw_row, SYSTEM)
        want = renderer.render(messages)
        assert got["tokens"] == want.tokens.tolist()
        assert got["loss_mask"] == want.loss_mask.tolist() and got["span_id"] == want.span_id.tolist()
        assert got["tokens"].count(start) == len(messages)  # the literal markers did not open messages


def test_a_million_character_answer_renders_like_openai_harmony(tmp_path, fast, renderer):
    rng = random.Random(7)
    vocabulary = [
        "alpha",
        "beta",
        "Gamma",
        "Δέλτα",
        "日本語の文",
        "🙂🙃",
        "<|end|>",
        "12 345,6",
        "\n\n",
        "the",
        "of",
        "  ",
    ]
    answer = " ".join(rng.choice(vocabulary) for _ in range(220_000))[:1_000_003]
    rows = [row("huge", synthetic_answer=answer, synthetic_reasoning=answer[:300_000]), row("small")]
    harmony = tmp_path / "harmony.parquet"
    harmonize_shard(write_raw(tmp_path / "raw.parquet", rows), harmony, SYSTEM, SHARD)
    report = tokenize_shard(harmony, tmp_path / "tokenized.parquet", fast, SHARD)
    assert (report.rows_in, report.rows_out, report.render_path["fast"]) == (2, 2, 2)
    stored = pq.read_table(harmony).to_pylist()[0]
    messages = json.loads(stored["messages_json"])["messages"]
    assert messages[-1]["content"][0]["text"] == answer and len(answer) >= 1_000_000
    got = pq.read_table(tmp_path / "tokenized.parquet").to_pylist()[0]
    want = renderer.render(messages)
    assert len(got["tokens"]) > 200_000
    assert np.array_equal(np.array(got["tokens"], np.int32), want.tokens)
    assert np.array_equal(np.array(got["loss_mask"], np.uint8), want.loss_mask)
    assert np.array_equal(np.array(got["span_id"], np.uint8), want.span_id)


@pytest.mark.parametrize("content", ["no rows", "only bad rows"])
def test_empty_shard_gives_valid_empty_output_at_every_stage(tmp_path, fast, encoding, content):
    rows = [] if content == "no rows" else [row("x", query=None), row(None), row("y", synthetic_answer=None)]
    raw = write_raw(tmp_path / "raw" / "synth_004.parquet", rows)
    harmony, filtered, sampled, tokenized = (tmp_path / f"{name}.parquet" for name in ("h", "f", "s", "t"))
    reports = [
        harmonize_shard(raw, harmony, SYSTEM, "synth_004"),
        select_rows_shard(harmony, filtered, "synth_004", quality_drop_reasons),
        select_rows_shard(filtered, sampled, "synth_004"),
        tokenize_shard(sampled, tokenized, fast, "synth_004"),
    ]
    root = tmp_path / "megatron"
    kd_report, inventories = write_megatron_shard(tokenized, root, 4, "synth_004")
    distill = write_distill_shard(tokenized, sampled, tmp_path / "distill", 4, "synth_004", encoding)
    reports += [kd_report, distill.report]
    assert [(r.rows_in, r.rows_out) for r in reports] == [(len(rows), 0)] + [(0, 0)] * 5
    assert all(accounted(r) for r in reports)
    for path, schema in (
        (harmony, HARMONY_SCHEMA),
        (filtered, HARMONY_SCHEMA),
        (sampled, HARMONY_SCHEMA),
        (tokenized, TOKENIZED_SCHEMA),
    ):
        table = pq.read_table(path)
        assert table.num_rows == 0 and table.schema.equals(schema), path
    assert [i.sequences for i in inventories] == [0, 0] and not [
        p for split in constants.SPLITS for p in (root / split).glob("shard_04_*")
    ]
    assert pq.read_table(documents_path(root, 4)).num_rows == 0
    assert [f["rows"] for f in distill.files] == [0, 0]
    assert all(pq.read_table(tmp_path / "distill" / f["path"]).num_rows == 0 for f in distill.files)
    assert not leftovers(tmp_path)


# --- duplicates across shards -------------------------------------------------------------------


def test_cross_shard_duplicates_found_in_the_documents_tables(tmp_path, fast):
    """Each shard dedupes itself; a synth_id in two shards is found over the per-shard documents tables."""
    root = tmp_path / "megatron"
    shards = {1: ["a", "b", "c"], 2: ["d", "b", "e"], 3: ["f"]}
    for index, ids in shards.items():
        name = f"synth_{index:03d}"
        harmony, tokenized = tmp_path / f"{name}_h.parquet", tmp_path / f"{name}_t.parquet"
        report = harmonize_shard(write_raw(tmp_path / f"{name}.parquet", [row(i) for i in ids]), harmony, SYSTEM, name)
        assert not report.dropped  # no shard sees a duplicate on its own
        tokenize_shard(harmony, tokenized, fast, name)
        write_megatron_shard(tokenized, root, index, name)
    tables = [documents_path(root, index) for index in shards]
    assert cross_shard_duplicates(tables) == [
        "synth_id 'b' occurs 2 times: shard_01_documents.parquet, shard_02_documents.parquet"
    ]
    assert cross_shard_duplicates([tables[0], tables[2]]) == []
    assert cross_shard_duplicates([]) == []


def test_cross_shard_duplicates_counts_repeats_and_truncates(tmp_path):
    def table(name: str, ids: list[str]) -> Path:
        path = tmp_path / name / "shard_01_documents.parquet"  # same file name in two folders
        path.parent.mkdir()
        pq.write_table(
            pa.table({"split": ["train"] * len(ids), "document_index": range(len(ids)), "synth_id": ids}), path
        )
        return path

    a = table("a", ["x", "x", "y"] + [f"z{i}" for i in range(30)])
    b = table("b", ["y", "q"] + [f"z{i}" for i in range(30)])
    problems = cross_shard_duplicates([a, b], limit=3)
    assert problems == [
        f"synth_id 'x' occurs 2 times: {a} (2x)",
        f"synth_id 'y' occurs 2 times: {a}, {b}",
        f"synth_id 'z0' occurs 2 times: {a}, {b}",
        "... and 29 more duplicated synth_ids",
    ]
    assert problems.total == 32  # every duplicated synth_id, listed or not: the check's problem_count


# --- bad files ----------------------------------------------------------------------------------


def assert_refused_cleanly(tmp_path: Path, raw: Path, *fragments: str) -> str:
    out = tmp_path / "out" / "synth_001.parquet"
    with pytest.raises(InputFileError) as caught:
        harmonize_shard(raw, out, SYSTEM, SHARD)
    message = str(caught.value)
    assert message.startswith(f"{raw}: ") and all(f in message for f in fragments), message
    assert not out.exists() and not leftovers(tmp_path)
    return message


@pytest.mark.parametrize(
    ("column", "arrow_type"),
    [
        ("query", pa.int64()),
        ("synthetic_answer", pa.list_(pa.string())),
        ("synth_id", pa.float64()),
        ("language", pa.bool_()),
        ("words", pa.timestamp("s")),
        ("words", pa.list_(pa.int64())),
    ],
)
def test_a_column_of_the_wrong_type_refuses_the_file(tmp_path, column, arrow_type):
    rows = [row("a"), row("b")]
    values = {pa.int64(): 7, pa.float64(): 1.5, pa.bool_(): True, pa.timestamp("s"): 0}
    for r in rows:
        r[column] = values.get(arrow_type, ["x"] if column != "words" else [1])
    raw = write_raw(tmp_path / "synth_001.parquet", rows, {column: arrow_type})
    expected = "string, large_string" if column != "words" else "an integer or floating type"
    stored = pq.read_schema(raw).field(column).type  # as the file holds it (e.g. timestamp[s] -> [ms])
    assert_refused_cleanly(tmp_path, raw, f"column {column!r} has type {stored}, expected {expected}")


def test_another_datasets_parquet_is_refused(tmp_path):
    raw = tmp_path / "synth_001.parquet"
    pq.write_table(pa.table({"text": ["hello"], "label": [1]}), raw)
    assert_refused_cleanly(
        tmp_path, raw, "not a PleIAs/SYNTH shard: missing columns ['synth_id'", "has ['text', 'label']"
    )
    partial = tmp_path / "synth_002.parquet"
    pq.write_table(raw_table([row("a")]).drop_columns(["query_seed_text", "words"]), partial)
    assert_refused_cleanly(tmp_path, partial, "missing columns ['query_seed_text', 'words']")
    twice = tmp_path / "synth_003.parquet"
    table = raw_table([row("a")])
    pq.write_table(table.append_column("query", pa.array(["again"])), twice)
    assert_refused_cleanly(tmp_path, twice, "column 'query' appears 2 times")


@pytest.mark.parametrize("kind", ["text file", "empty file", "truncated", "missing", "directory"])
def test_an_unreadable_file_is_refused(tmp_path, sample_shards, kind):
    raw = tmp_path / "synth_001.parquet"
    if kind == "text file":
        raw.write_text("synth_id,query\na,b\n")
    elif kind == "empty file":
        raw.write_bytes(b"")
    elif kind == "truncated":
        payload = sample_shards[0].read_bytes()
        raw.write_bytes(payload[: len(payload) // 2])
    elif kind == "directory":
        raw.mkdir()
    assert_refused_cleanly(tmp_path, raw, "not a readable Parquet file")


def test_invalid_utf8_in_a_string_column_refuses_the_file(tmp_path):
    """Parquet's STRING type is UTF-8: a file breaking that is corrupt.

    Lone surrogates cannot come from Python text, so the test writes raw bytes viewed as an Arrow string.
    """
    rows = READ_BATCH_ROWS + 7
    bad_row = READ_BATCH_ROWS + 4  # in the second batch: the row named counts from the file's first row
    table = raw_table([row(f"id{i}") for i in range(rows)])
    queries = [b"lone \xed\xa0\x80 surrogate" if i in (bad_row, bad_row + 2) else b"fine" for i in range(rows)]
    bad = pa.array(queries, pa.binary()).view(pa.string())  # unvalidated
    raw = tmp_path / "synth_001.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("query"), "query", bad), raw)
    assert_refused_cleanly(tmp_path, raw, f"column 'query' is invalid at row {bad_row} ", "UTF8")


def test_corruption_found_mid_file_leaves_the_previous_output_untouched(tmp_path):
    rows = [row(f"id{i}", synthetic_answer=f"answer {i} " * 20) for i in range(2 * READ_BATCH_ROWS)]
    raw = write_raw(tmp_path / "synth_001.parquet", rows, row_group_size=READ_BATCH_ROWS, compression="zstd")
    out = tmp_path / "out" / "synth_001.parquet"
    harmonize_shard(raw, out, SYSTEM, SHARD)  # an earlier, good build
    before = out.read_bytes()
    metadata = pq.ParquetFile(raw).metadata
    column = metadata.schema.to_arrow_schema().get_field_index("synthetic_answer")
    chunk = metadata.row_group(1).column(column)  # the first batch is read and written before this
    payload = bytearray(raw.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    payload[start : start + chunk.total_compressed_size] = bytes(chunk.total_compressed_size)
    raw.write_bytes(bytes(payload))
    with pytest.raises(InputFileError) as caught:
        harmonize_shard(raw, out, SYSTEM, SHARD)
    assert str(caught.value).startswith(f"{raw}: unreadable after row {READ_BATCH_ROWS} ("), caught.value
    assert out.read_bytes() == before and not leftovers(tmp_path)


@pytest.mark.parametrize("bad_group", [0, 6, 9])
def test_a_corrupt_row_group_inside_one_batch_names_the_rows_read_before_it(tmp_path, bad_group):
    """Row groups of 20 rows, all in the first batch: the error names the first row of the corrupt group (every
    row before it reads), not the batch's first row."""
    rows = [row(f"id{i}", synthetic_answer=f"answer {i} " * 20) for i in range(200)]
    raw = write_raw(tmp_path / "synth_001.parquet", rows, row_group_size=20, compression="zstd")
    metadata = pq.ParquetFile(raw).metadata
    chunk = metadata.row_group(bad_group).column(metadata.schema.to_arrow_schema().get_field_index("synthetic_answer"))
    payload = bytearray(raw.read_bytes())
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    payload[start : start + chunk.total_compressed_size] = bytes(chunk.total_compressed_size)
    raw.write_bytes(bytes(payload))
    with pytest.raises(InputFileError) as caught:
        harmonize_shard(raw, tmp_path / "out" / "synth_001.parquet", SYSTEM, SHARD)
    assert str(caught.value).startswith(f"{raw}: unreadable after row {20 * bad_group} ("), caught.value
    assert pq.read_table(raw, columns=["synth_id"]).num_rows == 200 and not leftovers(tmp_path)
    for group in range(bad_group):  # the rows named as read do read
        pq.ParquetFile(raw).read_row_group(group)


def test_an_output_directory_that_cannot_be_created_fails_clearly(tmp_path):
    raw = write_raw(tmp_path / "synth_001.parquet", [row("a")])
    blocker = tmp_path / "data"
    blocker.write_text("a regular file where the output directory should be")  # fails for root too
    out = blocker / "synth_harmony" / "synth_001.parquet"
    with pytest.raises(OutputFileError) as caught:
        harmonize_shard(raw, out, SYSTEM, SHARD)
    assert str(caught.value).startswith(f"{out}: cannot write output: {blocker} is not a directory"), caught.value
    assert blocker.read_text().startswith("a regular file") and not leftovers(tmp_path)


def full_disk_outcomes(tmp_path: Path, spec: dict) -> list[dict]:
    """Run tests/full_disk_child.py in a user + mount namespace of its own (real tmpfs mounts, no host
    privileges needed): one tmpfs per scenario, each filled up by the step it runs."""
    spec = {**spec, "mount_dir": str(tmp_path / "mounts")}
    script = 'py="$1"; shift; exec "$py" -m tests.full_disk_child "$@"'
    result = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", sys.executable, json.dumps(spec)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def scenario_sizes(needed: int) -> list[int]:
    """tmpfs sizes from nearly empty to just short of `needed` bytes, and one with room to spare."""
    page = 4096
    return sorted(
        {max(page, int(needed * f) // page * page) for f in (0.02, 0.3, 0.6, 0.85, 0.95, 0.99)}
        | {2 * needed + 16 * page}
    )


@pytest.fixture(scope="module")
def one_shard_stages(tmp_path_factory, fast, tokenizer_dir) -> dict:
    """synth_002 of the sample through harmony, filters, sampling (keep all) and tokens, on ordinary disk."""
    work = tmp_path_factory.mktemp("stages")
    raw = SAMPLE_RAW_DIR / "synth_002.parquet"
    harmony, filtered, sampled, tokenized = (work / f"{name}.parquet" for name in ("h", "f", "s", "t"))
    harmonize_shard(raw, harmony, SYSTEM, "synth_002")
    select_rows_shard(harmony, filtered, "synth_002", quality_drop_reasons)
    select_rows_shard(filtered, sampled, "synth_002")
    tokenize_shard(sampled, tokenized, fast, "synth_002")
    return {
        "raw": str(raw),
        "tokenized": str(tokenized),
        "sampled": str(sampled),
        "tokenizer_dir": str(tokenizer_dir),
        "work": work,
    }


def test_a_full_disk_fails_each_step_clearly_and_publishes_nothing(tmp_path, one_shard_stages, encoding):
    """Real tmpfs file systems of growing size fill up under harmonize, the Megatron trio writer and the
    DistillKit writer, at every point from the first byte to the last: each failure names the file it
    was writing, leaves no partial file, and publishes none of the shard's files (not one split's trio,
    documents table or DistillKit part without the others); with room to spare everything is written."""
    stages = one_shard_stages
    needed = {}
    expected_files = {}
    for step, root_name in (("harmony", "synth_harmony"), ("megatron", "synth_kd_v1"), ("distill", "synth_distill")):
        reference = tmp_path / "reference" / step
        if step == "harmony":
            harmonize_shard(Path(stages["raw"]), reference / root_name / "synth_002.parquet", SYSTEM, "synth_002")
        elif step == "megatron":
            write_megatron_shard(Path(stages["tokenized"]), reference / root_name, 1, "synth_002")
        else:
            write_distill_shard(
                Path(stages["tokenized"]), Path(stages["sampled"]), reference / root_name, 1, "synth_002", encoding
            )
        files = [p for p in reference.rglob("*") if p.is_file()]
        needed[step] = sum(p.stat().st_size for p in files)
        expected_files[step] = sorted(str(p.relative_to(reference)) for p in files)
    scenarios = [{"step": step, "size": size} for step in needed for size in scenario_sizes(needed[step])]
    spec = {k: v for k, v in stages.items() if k != "work"} | {"scenarios": scenarios}
    outcomes = full_disk_outcomes(tmp_path, spec)
    assert len(outcomes) == len(scenarios)
    for outcome in outcomes:
        where = f"{outcome['step']} on a {outcome['size']}-byte tmpfs"
        assert not [f for f in outcome["files"] if PARTIAL_SUFFIX in f], (
            f"{where}: partial files left: {outcome['files']}"
        )
        if outcome["size"] > needed[outcome["step"]]:
            assert outcome["error"] is None and outcome["files"] == expected_files[outcome["step"]], where
            continue
        assert outcome["error"] is not None, f"{where}: no error"
        assert outcome["error"]["type"] == "OutputFileError", (where, outcome["error"])
        message = outcome["error"]["message"]
        assert (
            message.startswith(outcome["mount"] + "/") and ": cannot write output: No space left on device" in message
        ), (where, message)
        assert outcome["files"] == [], f"{where}: published part of the shard: {outcome['files']}"


class DiskFullAfter:
    """A file that takes `capacity` bytes, then fails every write with ENOSPC, as a full disk does."""

    def __init__(self, path: Path, capacity: int) -> None:
        self.file = open(path, "wb")
        self.capacity = capacity
        self.closed = False

    def write(self, data) -> int:
        if len(data) > self.capacity:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.capacity -= len(data)
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()
        self.closed = True


class FillingDiskWriter(ParquetShardWriter):
    """The real writer (buffering, row groups, publish, cleanup), over a file that runs out of space."""

    def __init__(self, final_path: Path, schema: pa.Schema, capacity: int) -> None:
        super().__init__(final_path, schema)
        self._writer.close()
        self._sink = DiskFullAfter(self._partial, capacity)
        self._writer = pq.ParquetWriter(self._sink, schema, compression="zstd", compression_level=1)


@pytest.mark.parametrize(
    ("n_rows", "capacity"),
    [(10, 64), (3 * WRITE_ROW_GROUP_ROWS, 20_000)],
    ids=["full when closing", "full in the middle"],
)
def test_a_writer_that_runs_out_of_space_removes_its_partial_file(tmp_path, n_rows, capacity):
    out = tmp_path / "out" / "synth_001.parquet"
    table = pa.table({"synth_id": [hashlib.sha256(str(i).encode()).hexdigest() for i in range(n_rows)]})
    batches = [table.slice(start, 1000) for start in range(0, n_rows, 1000)]
    written = 0
    with pytest.raises(OutputFileError, match=f"^{out}: cannot write output: No space left on device"):
        with FillingDiskWriter(out, table.schema, capacity) as writer:
            for batch in batches:
                writer.write(batch)
                written += 1
    assert written == (len(batches) if n_rows < WRITE_ROW_GROUP_ROWS else 2)  # where the disk filled up
    assert not out.exists() and not leftovers(tmp_path)


# --- through Dagster ----------------------------------------------------------------------------


def step_failures(result) -> list[str]:
    """The innermost error message of each failed step."""
    messages = []
    for event in result.get_step_failure_events():
        error = event.step_failure_data.error
        while error.cause is not None:
            error = error.cause
        messages.append(error.message.strip())
    return messages


def test_a_bad_partition_fails_alone_with_one_message(tmp_path, sample_shards):
    raw_dir = tmp_path / "raw"
    good_rows = pq.read_table(sample_shards[0]).slice(0, 20).to_pylist()
    write_raw(raw_dir / "synth_001.parquet", good_rows + [good_rows[3]])  # one duplicate row
    bad_rows = [row("a", query=7), row("b", query=8)]
    bad = write_raw(raw_dir / "synth_002.parquet", bad_rows, {"query": pa.int64()})
    layout = SynthKDLayout(raw_dir=str(raw_dir), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        run(instance, layout, ["synth_raw_inventory"])

        failed = run(instance, layout, SCAN_STEPS, "synth_002", raise_on_error=False)
        assert not failed.success
        [message] = step_failures(failed)
        assert message == (
            f"synthkd_assets.core.parquet_io.InputFileError: {bad}: column 'query' has type int64, expected "
            "string, large_string, string_view, binary, large_binary, binary_view, dictionary<string> or null "
            "(a column of another type is not coerced: the file is refused)"
        )
        assert not failed.get_asset_materialization_events()  # synth_filtered did not run on it either

        built = run(instance, layout, SCAN_STEPS, "synth_001")
        materialized = {e.asset_key.to_user_string(): e for e in built.get_asset_materialization_events()}
        assert set(materialized) == {"synth_harmony", "synth_filtered", "synth_signatures"}
        metadata = materialized["synth_harmony"].materialization.metadata
        assert "| `duplicate_synth_id` | 1 |" in metadata["drops_by_reason"].value
        assert all(e.passed for e in built.get_asset_check_evaluations())

    paths = layout.data_layout()
    assert pq.read_table(paths.stage_output("synth_harmony", "synth_001")).num_rows == 20
    assert not paths.stage_output("synth_harmony", "synth_002").exists() and not leftovers(paths.data_root)
    [logged] = [json.loads(line) for line in paths.error_log("synth_harmony", "synth_001").read_text().splitlines()]
    assert logged | {"detail": ""} == {
        "shard": "synth_001",
        "source_row": 20,
        "synth_id": good_rows[3]["synth_id"],
        "reason": "duplicate_synth_id",
        "detail": "",
    }


# --- raw shards that change under a build ---------------------------------------------------------


def test_a_raw_shard_changed_between_the_scan_and_the_read_fails_the_step(tmp_path, sample_shards, monkeypatch):
    """The shard is rewritten right after synth_harmony's inventory scan: the step hashes the bytes it
    parses, finds they are not the scanned ones, fails naming the file and publishes nothing."""

    raw_dir = tmp_path / "raw"
    rows = pq.read_table(sample_shards[0]).slice(0, 20).to_pylist()
    raw = write_raw(raw_dir / "synth_001.parquet", rows)
    layout = SynthKDLayout(raw_dir=str(raw_dir), data_dir=str(tmp_path / "data"))
    real_scan = assets.scan_inputs

    def scan_then_rewrite(*args, **kwargs):
        shards = real_scan(*args, **kwargs)
        write_raw(raw, rows[:-1])  # a new version of the shard lands just after the scan
        return shards

    with dg.DagsterInstance.ephemeral() as instance:
        run(instance, layout, ["synth_raw_inventory"])
        monkeypatch.setattr(assets, "scan_inputs", scan_then_rewrite)
        failed = run(instance, layout, ["synth_harmony"], "synth_001", raise_on_error=False)
    assert not failed.success
    [message] = step_failures(failed)
    assert f"{raw}: raw shard changed since the inventory scan" in message, message
    paths = layout.data_layout()
    assert not paths.stage_output("synth_harmony", "synth_001").exists()
    assert not paths.stage_report("synth_harmony", "synth_001").exists()
    assert not leftovers(tmp_path)


def test_a_raw_shard_changed_after_the_inventory_fails_until_it_is_rescanned(tmp_path, sample_shards):
    """synth_raw_inventory reported the shard's hash as synth_raw's version (what the run's lineage records as
    its input); the file then changes before the scan pass: synth_harmony refuses it naming the file, publishes
    nothing, and builds it once the inventory has reported the new bytes."""
    raw_dir = tmp_path / "raw"
    rows = pq.read_table(sample_shards[0]).slice(0, 20).to_pylist()
    raw = write_raw(raw_dir / "synth_001.parquet", rows)
    layout = SynthKDLayout(raw_dir=str(raw_dir), data_dir=str(tmp_path / "data"))
    paths = layout.data_layout()
    with dg.DagsterInstance.ephemeral() as instance:
        run(instance, layout, ["synth_raw_inventory"])
        write_raw(raw, rows[:-1])  # a new version of the shard lands after the inventory
        failed = run(instance, layout, ["synth_harmony"], "synth_001", raise_on_error=False)
        assert not failed.success
        [message] = step_failures(failed)
        assert f"{raw}: raw shard changed since the inventory scan" in message, message
        assert not paths.stage_output("synth_harmony", "synth_001").exists() and not leftovers(tmp_path)
        run(instance, layout, ["synth_raw_inventory"])
        run(instance, layout, ["synth_harmony"], "synth_001")
    report = json.loads(paths.stage_report("synth_harmony", "synth_001").read_text())
    assert report["rows_in"] == 19 and report["source_sha256"] == hashlib.sha256(raw.read_bytes()).hexdigest()


def test_a_raw_shard_rewritten_in_place_while_read_publishes_nothing(tmp_path, monkeypatch):
    """Bytes appended to the open raw file after its first batch was parsed: the step fails naming the
    file, and the output it was writing is discarded (an earlier good output stays as it was)."""

    raw = write_raw(tmp_path / "synth_001.parquet", [row(f"id{i}") for i in range(10)])
    out = tmp_path / "out" / "synth_001.parquet"
    good = harmonize_shard(raw, out, SYSTEM, SHARD)
    assert (
        good.source_sha256 == hashlib.sha256(raw.read_bytes()).hexdigest() and good.source_bytes == raw.stat().st_size
    )
    before = out.read_bytes()
    real_iter_frames = stages.iter_frames

    def frames_then_append(*args, **kwargs):
        for frame in real_iter_frames(*args, **kwargs):
            yield frame
            with open(raw, "ab") as handle:  # another process writes to the file being read
                handle.write(b"more")

    monkeypatch.setattr(stages, "iter_frames", frames_then_append)
    with pytest.raises(RawShardChangedError, match=f"^{raw}: raw shard was modified while it was being read"):
        harmonize_shard(raw, out, SYSTEM, SHARD, good.source_sha256)
    assert out.read_bytes() == before and not leftovers(tmp_path)


def _append(path: Path) -> None:
    with open(path, "ab") as handle:  # another process writes to the file being read
        handle.write(b"more")


def _replace(path: Path) -> None:
    replacement = path.with_name("replacement")
    replacement.write_bytes(b"a new version")
    os.replace(replacement, path)  # a new version of the file lands by rename


@pytest.mark.parametrize("change", [_append, _replace], ids=["appended", "renamed over"])
@pytest.mark.parametrize("make_fixture", [ultrachat_200k, nemotron_math_v2], ids=["parquet", "jsonl"])
def test_an_anchor_shard_changed_while_read_publishes_nothing(tmp_path, make_fixture, change):
    """An anchor shard is hashed and parsed through one open file, as a SYNTH shard: written to, or replaced by
    rename, while the adapter runs, it fails with RawShardChangedError naming the file and publishes nothing
    (no output, no partial file); left alone, the report's sha256 is of the bytes parsed."""
    fixture = make_fixture(tmp_path / "sources")
    path, adapter = fixture.path, ADAPTERS[fixture.source]
    parsed_sha = hashlib.sha256(path.read_bytes()).hexdigest()
    out = tmp_path / "out" / "shard.parquet"
    report = harmonize_source_shard(path, out, adapter, "shard", source_sha256=parsed_sha)
    assert report.source_sha256 == parsed_sha and report.source_bytes == path.stat().st_size
    before = out.read_bytes()

    def convert_then_change(frame):
        change(path)
        return adapter.to_conversations(frame)

    changing = SourceAdapter(adapter.spec, convert_then_change)
    with pytest.raises(RawShardChangedError, match=f"^{path}: raw shard was modified while it was being read"):
        harmonize_source_shard(path, out, changing, "shard", source_sha256=parsed_sha)
    assert out.read_bytes() == before and not leftovers(tmp_path)
