"""The bundled raw SYNTH sample (data/sample/synth_raw) and its deterministic generator.

Four regular shards of 750 SYNTH-like rows, then the bucket shard synth_04 (56 rows): every exercise several
times, and conversations long enough for the C2 context bucket (over 2048 tokens, within the 8192 of C2 and of
the DistillKit max_seq_len), which the regular shards almost never reach. Then the near-duplicate shard
synth_05: planted copies of regular rows with known edits and hard negatives (#18), checked here against an
oracle of their own (the normalization of synthkd_contract/near_dup.py written out again, not imported).
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_assets.core.filters import quality_drop_reasons
from synthkd_assets.core.stages import harmonize_shard, select_rows_shard
from synthkd_assets.core.synth import system_message_dict
from synthkd_contract import constants
from synthkd_contract.buckets import EXERCISE_SKILL_BUCKET
from synthkd_contract.constants import RAW_COLUMNS, RAW_STRING_COLUMNS
from synthkd_contract.schemas import RAW_SCHEMA
from synthkd_dev import make_sample_data
from tests.helpers import SAMPLE_RAW_DIR as SAMPLE_DIR

REGULAR_SHARDS = [f"synth_{i:02d}.parquet" for i in range(4)]
BUCKET_SHARD = "synth_04.parquet"
NEAR_DUP_SHARD = "synth_05.parquet"
SHARD_NAMES = [*REGULAR_SHARDS, BUCKET_SHARD, NEAR_DUP_SHARD]
ROWS_PER_SHARD = 750
BUCKET_ROWS = 56
PLANTED_COPIES = 85  # 25 sources x 1..6 copies
HARD_NEGATIVES = 10
NEAR_DUP_ROWS = PLANTED_COPIES + HARD_NEGATIVES
SAMPLE_ROWS = 4 * ROWS_PER_SHARD + BUCKET_ROWS + NEAR_DUP_ROWS
# the files from before the near-duplicate shard: appending it changed none of their bytes
PINNED_SHA256 = {
    "synth_00.parquet": "df829783076852074fe8a27428857da13c9ae556a8f7819fcd6966c55d1cdd36",
    "synth_01.parquet": "66bb5497ba0158e8742d95dc055aa4f6a6b95e14303ca41ece317a4f00b272be",
    "synth_02.parquet": "799783a0d8bacfa49e686d8c2b2ee7e415e5c33f9a4cbded7d25f1133c86fe7b",
    "synth_03.parquet": "1c300bffd942668cad211a7c37f328873c3b563f231d658bc92919519787b544",
    "synth_04.parquet": "7282956ae7ecbd3c745a6fc0ad1f58f9ed5b88fb68487a0e79926b11bbf17ac9",
}
# near-duplicate oracle (synthkd_contract/near_dup.py): the threshold, and the margins the planted rows keep
NEAR_DUP_JACCARD = 0.8
COPY_MIN_JACCARD = 0.85
NEGATIVE_MAX_JACCARD = 0.5
# every exercise the skill table maps (but "unknown", what a null exercise becomes): the bucket shard holds each
EXERCISES = set(EXERCISE_SKILL_BUCKET) - {"unknown"}
C1_MAX_TOKENS = 2048  # the context buckets' first bound (002 §3): longer is C2 up to 8192

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
        rows = {BUCKET_SHARD: BUCKET_ROWS, NEAR_DUP_SHARD: NEAR_DUP_ROWS}.get(name, ROWS_PER_SHARD)
        assert pf.metadata.num_rows == rows
        assert pf.metadata.num_row_groups == -(-rows // 256)  # row groups of 256


def test_synth_ids_unique_across_shards(rows):
    """All six files together; the planted rows' ids name their source (`<source>-nd<k>`, `<source>-neg`)."""
    ids = [r["synth_id"] for r in rows]
    assert len(ids) == len(set(ids)) == SAMPLE_ROWS
    generated, planted = ids[:-NEAR_DUP_ROWS], ids[-NEAR_DUP_ROWS:]
    assert all(re.fullmatch(r"synth_\d{7}", i) for i in generated)
    assert all(re.fullmatch(r"synth_\d{7}-(nd\d|neg)", i) for i in planted)


def test_language_mix(rows):
    langs = Counter(r["language"] for r in rows)
    non_en = 1 - langs["en"] / len(rows)
    assert 0.12 <= non_en <= constants.NON_ENGLISH_MAX  # inside the 001 target: no language rule samples out
    assert set(langs) <= {"en", "fr", "de", "es", "it", "pl", "nl", "la"}


def test_memorization_is_majority(rows):
    ex = Counter(r["exercise"] for r in rows)
    # a majority, under the 001 cap, so the sampling plan keeps every row (rates 1.0)
    assert len(rows) / 2 < ex["memorization"] <= constants.MEMORIZATION_CAP * len(rows)
    assert set(ex) == EXERCISES


def test_bucket_shard_holds_every_exercise_several_times():
    rows = pq.read_table(SAMPLE_DIR / BUCKET_SHARD).to_pylist()
    assert Counter(r["exercise"] for r in rows) == {exercise: BUCKET_ROWS // len(EXERCISES) for exercise in EXERCISES}
    assert [r["synth_id"] for r in rows] == [f"synth_{i:07d}" for i in range(3000, 3000 + BUCKET_ROWS)]


@pytest.fixture(scope="module")
def bucket_shard_lengths(tmp_path_factory, renderer) -> dict[str, int]:
    """Rendered length (tokens incl. EOD, what synth_tokenized stores) of each bucket-shard conversation the
    001 filters keep: the project's own harmony step and filters, lengths from openai-harmony's reference render."""
    work = tmp_path_factory.mktemp("bucket_shard")
    shard = Path(BUCKET_SHARD).stem
    harmonize_shard(SAMPLE_DIR / BUCKET_SHARD, work / "harmony.parquet", system_message_dict(), shard)
    report = select_rows_shard(work / "harmony.parquet", work / "filtered.parquet", shard, quality_drop_reasons)
    assert report.rows_in == BUCKET_ROWS and report.rows_out >= BUCKET_ROWS - 5  # drops as rare as elsewhere
    kept = pl.read_parquet(work / "filtered.parquet")
    return {
        synth_id: len(renderer.render(json.loads(messages)["messages"]).tokens)
        for synth_id, messages in zip(kept["synth_id"], kept["messages_json"])
    }


def test_bucket_shard_reaches_the_second_context_bucket(bucket_shard_lengths):
    """At least 6 kept conversations are longer than 2048 tokens (C2), none reaches max_seq_len, so the
    DistillKit output drops none of them."""
    long = [n for n in bucket_shard_lengths.values() if n > C1_MAX_TOKENS]
    assert len(long) >= 6
    assert max(bucket_shard_lengths.values()) <= constants.MAX_SEQ_LEN


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
    """`python -m synthkd_dev.make_sample_data` with its defaults rewrites the committed sample byte for byte,
    the bucket and near-duplicate shards included; appending them left the earlier files unchanged (pinned)."""
    assert make_sample_data.main(["--output-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == SHARD_NAMES
    for name in SHARD_NAMES:
        assert _sha256(tmp_path / name) == _sha256(SAMPLE_DIR / name), name
    assert {name: _sha256(SAMPLE_DIR / name) for name in PINNED_SHA256} == PINNED_SHA256


def test_rows_do_not_depend_on_sharding():
    whole = make_sample_data.generate_rows(40, seed=7)
    parts = make_sample_data.generate_rows(15, seed=7) + make_sample_data.generate_rows(25, seed=7, start_index=15)
    assert whole == parts
    assert list(whole[0]) == list(RAW_COLUMNS)


def test_bucket_rows_are_numbered_after_the_regular_shards_and_optional(tmp_path):
    """--bucket-rows 0 writes only the regular shards; the bucket shard's rows follow them in synth_id."""
    small = ["--shards", "2", "--rows-per-shard", "5", "--near-dup-sources", "0"]
    assert make_sample_data.main(["--output-dir", str(tmp_path), *small]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synth_00.parquet", "synth_01.parquet", "synth_02.parquet"]
    bucket = pq.read_table(tmp_path / "synth_02.parquet").to_pylist()
    assert bucket[0]["synth_id"] == "synth_0000010" and len(bucket) == BUCKET_ROWS
    only = tmp_path / "only"
    regular_only = ["--shards", "1", "--bucket-rows", "0", "--near-dup-sources", "0"]
    assert make_sample_data.main(["--output-dir", str(only), *regular_only]) == 0
    assert [p.name for p in only.iterdir()] == ["synth_00.parquet"]


def test_near_dup_shard_is_the_next_file_and_copies_what_there_is(tmp_path):
    """Without a bucket shard the near-duplicate shard follows the regular ones; a tiny layout plants what its
    eligible rows allow, ids unique."""
    args = ["--output-dir", str(tmp_path), "--shards", "1", "--rows-per-shard", "30", "--bucket-rows", "0"]
    assert make_sample_data.main(args) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synth_00.parquet", "synth_01.parquet"]
    planted = pq.read_table(tmp_path / "synth_01.parquet").column("synth_id").to_pylist()
    regular = pq.read_table(tmp_path / "synth_00.parquet").column("synth_id").to_pylist()
    assert planted and len(set(planted)) == len(planted) and not set(planted) & set(regular)


# --- planted near-duplicates (#18): an oracle of the test's own -------------------------------------------------


def _shingles(row: dict) -> frozenset[tuple[str, ...]]:
    """The rendered user prompt, NFKC, casefolded, split on whitespace, word 3-grams."""
    prompt = row["query"] + "\n\nReference:\n" + row["query_seed_text"]
    words = unicodedata.normalize("NFKC", prompt).casefold().split()
    return frozenset(tuple(words[i : i + 3]) for i in range(max(1, len(words) - 2)))


def _jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b)


@pytest.fixture(scope="module")
def by_id(rows) -> dict[str, dict]:
    return {r["synth_id"]: r for r in rows}


@pytest.fixture(scope="module")
def clusters() -> dict[str, list[str]]:
    """Planted source -> its copies, from the generator's ground truth."""
    members: dict[str, list[str]] = defaultdict(list)
    for copy in make_sample_data.planted_near_duplicates():
        members[copy.source_id].append(copy.copy_id)
    return dict(members)


def test_ground_truth_names_exactly_the_near_dup_shard(clusters):
    planted = pq.read_table(SAMPLE_DIR / NEAR_DUP_SHARD).column("synth_id").to_pylist()
    negatives = [n.negative_id for n in make_sample_data.planted_negatives()]
    assert planted == [c for copies in clusters.values() for c in copies] + negatives
    assert len(planted) - len(negatives) == PLANTED_COPIES and len(negatives) == HARD_NEGATIVES


def test_planted_clusters_spread_and_exceed_the_cap(clusters, by_id):
    """25 sources over the four regular shards and every exercise, kept by the 001 filters; cluster sizes
    (source included) 2..7, several over 5, i.e. over a cap of 4 by more than one row."""
    sources = [by_id[s] for s in clusters]
    assert len(sources) == 25
    assert {int(s["synth_id"][6:]) // ROWS_PER_SHARD for s in sources} == {0, 1, 2, 3}
    assert {s["exercise"] for s in sources} == EXERCISES
    for s in sources:
        assert s["synthetic_answer"].strip() and "failed after maximum attempts" not in s["constraints"].lower()
    sizes = Counter(1 + len(copies) for copies in clusters.values())
    assert set(sizes) == {2, 3, 4, 5, 6, 7} and sizes[6] + sizes[7] >= 4


def test_planted_copies_are_near_duplicates_of_source_and_siblings(clusters, by_id):
    """Exact Jaccard >= 0.85 between any two members of a planted cluster; a copy differs from its source only
    in query / seed text."""
    for source_id, copies in clusters.items():
        members = [source_id, *copies]
        shingles = [_shingles(by_id[m]) for m in members]
        for i in range(len(members)):
            for j in range(i + 1, len(members)):
                assert _jaccard(shingles[i], shingles[j]) >= COPY_MIN_JACCARD, (members[i], members[j])
        source = by_id[source_id]
        for copy_id in copies:
            copy = by_id[copy_id]
            assert (copy["query"], copy["query_seed_text"]) != (source["query"], source["query_seed_text"])
            same = {k: v for k, v in copy.items() if k not in ("synth_id", "query", "query_seed_text")}
            assert same == {k: source[k] for k in same}, copy_id


def test_hard_negatives_share_the_query_and_are_near_duplicates_of_nothing(by_id, rows):
    """Same query as their source, exact Jaccard < 0.5 to it, and under the 0.8 threshold with every row."""
    all_shingles = {r["synth_id"]: _shingles(r) for r in rows}
    for negative in make_sample_data.planted_negatives():
        row, source = by_id[negative.negative_id], by_id[negative.source_id]
        assert row["query"] == source["query"] and row["query_seed_text"] != source["query_seed_text"]
        own = all_shingles[negative.negative_id]
        assert _jaccard(own, all_shingles[negative.source_id]) < NEGATIVE_MAX_JACCARD
        closest = max(_jaccard(own, other) for i, other in all_shingles.items() if i != negative.negative_id)
        assert closest < NEAR_DUP_JACCARD, negative.negative_id
