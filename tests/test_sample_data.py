"""The bundled raw SYNTH sample (data/sample/synth_raw) and its deterministic generator."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_contract.constants import RAW_COLUMNS, RAW_STRING_COLUMNS
from synthkd_contract.schemas import RAW_SCHEMA
from synthkd_dev import make_sample_data
from tests.helpers import SAMPLE_RAW_DIR as SAMPLE_DIR

SHARD_NAMES = [f"synth_{i:02d}.parquet" for i in range(4)]
ROWS_PER_SHARD = 750

CJK_RE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
EMOJI_RE = re.compile(r"[\U0001F300-\U0001FAFF]")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return pa.concat_tables([pq.read_table(SAMPLE_DIR / name) for name in SHARD_NAMES])


@pytest.fixture(scope="module")
def rows(table: pa.Table) -> list[dict]:
    return table.to_pylist()


def test_shards_exist_and_are_small():
    present = sorted(p.name for p in SAMPLE_DIR.glob("*.parquet"))
    assert present == SHARD_NAMES
    total = sum((SAMPLE_DIR / n).stat().st_size for n in SHARD_NAMES)
    assert total < 4 * 1024 * 1024


def test_exact_schema_and_row_counts():
    for name in SHARD_NAMES:
        pf = pq.ParquetFile(SAMPLE_DIR / name)
        schema = pf.schema_arrow
        assert schema.names == list(RAW_COLUMNS)
        assert [f.type for f in schema] == [f.type for f in RAW_SCHEMA], name
        for col in RAW_STRING_COLUMNS:
            assert schema.field(col).type == pa.string()  # not large_string
        assert (schema.metadata or {}).get(b"pandas") is None
        assert pf.metadata.num_rows == ROWS_PER_SHARD
        assert pf.metadata.num_row_groups > 1


def test_synth_ids_unique_across_shards(rows):
    ids = [r["synth_id"] for r in rows]
    assert len(ids) == len(set(ids)) == len(SHARD_NAMES) * ROWS_PER_SHARD
    assert all(re.fullmatch(r"synth_\d{7}", i) for i in ids)


def test_language_mix(rows):
    langs = Counter(r["language"] for r in rows)
    non_en = 1 - langs["en"] / len(rows)
    assert 0.12 <= non_en <= 0.30
    assert set(langs) <= {"en", "fr", "de", "es", "it", "pl", "nl", "la"}


def test_memorization_is_majority(rows):
    ex = Counter(r["exercise"] for r in rows)
    assert ex["memorization"] > len(rows) / 2
    assert {"rag", "mcq", "arithmetic", "creative_writing", "editing", "constrained_writing"} <= set(ex)


def test_special_cases_present(rows):
    texts = [r["query"] + r["synthetic_reasoning"] + r["synthetic_answer"] for r in rows]
    reasoning = [r["synthetic_reasoning"] for r in rows]
    assert any(t == "" for t in reasoning), "empty reasoning"
    assert any(t != "" and t.strip() == "" for t in reasoning), "whitespace-only reasoning"
    assert any(r["synthetic_answer"].strip() == "" for r in rows), "blank answer"
    assert any("<|start|>" in t for t in texts), "literal harmony marker"
    assert any("\x00" in r["query"] + r["synthetic_answer"] for r in rows), "NUL"
    assert any("failed after maximum attempts" in r["constraints"].lower() for r in rows)
    assert any(CJK_RE.search(t) for t in texts), "CJK"
    assert any(EMOJI_RE.search(t) for t in texts), "emoji"
    assert any("\u200d" in t for t in texts), "ZWJ emoji sequence"


def test_result_constraints_mostly_consistent(rows):
    def norm(s: str) -> str:
        s = s.strip().lower().replace(",", "")
        s = s.split(")")[0].strip()
        return s.rstrip("0").rstrip(".") if "." in s else s

    same = total = 0
    for r in rows:
        if r["exercise"] not in ("mcq", "arithmetic"):
            continue
        m = re.search(r"result:([^;]*)", r["constraints"], re.IGNORECASE)
        first = r["synthetic_answer"].strip().split("\n")[0]
        if not m or "failed" in m.group(1).lower() or not first:
            continue
        total += 1
        same += norm(m.group(1)) == norm(first)
    assert total > 100
    assert 0.85 < same / total < 1.0  # mostly consistent, a few deliberately not


def test_words_is_answer_word_count(rows):
    assert all(r["words"] == len(r["synthetic_answer"].split()) for r in rows)


def test_regeneration_is_byte_identical(tmp_path, capsys):
    """`python -m synthkd_dev.make_sample_data` with its defaults rewrites the committed sample byte for byte."""
    assert make_sample_data.main(["--output-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == SHARD_NAMES
    for name in SHARD_NAMES:
        assert _sha256(tmp_path / name) == _sha256(SAMPLE_DIR / name), name


def test_rows_do_not_depend_on_sharding():
    whole = make_sample_data.generate_rows(40, seed=7)
    parts = make_sample_data.generate_rows(15, seed=7) + make_sample_data.generate_rows(25, seed=7, start_index=15)
    assert whole == parts
    assert list(whole[0]) == list(RAW_COLUMNS)
