"""The bundled raw SYNTH sample (data/sample/synth_raw) and its deterministic generator.

Four regular shards of 750 rows shaped like PleIAs/SYNTH as published (its dataset card and statistics: file names,
one row group per file, the nine exercise labels in the corpus's proportions, its languages, empty-reasoning
rates, constraints and answer shapes, lengths, many rows per seed text), then the bucket shard synth_005 (54
rows): every exercise several times, and conversations long enough for the C2 context bucket (over 2048 tokens,
within the 8192 of C2 and of the DistillKit max_seq_len), which the regular shards almost never reach. Then the
near-duplicate shard synth_006: planted copies of regular rows with known edits and hard negatives, checked
here against an oracle of their own (the normalization of synthkd_contract/near_dup.py written out again).
The proportions asserted here are what the sample promises: the README's figures are this sample's.
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
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
from synthkd_contract.constants import RAW_COLUMNS, RAW_STRING_COLUMNS
from synthkd_contract.schemas import RAW_SCHEMA
from synthkd_dev import make_sample_data
from tests.helpers import SAMPLE_RAW_DIR as SAMPLE_DIR

REGULAR_SHARDS = [f"synth_{i:03d}.parquet" for i in range(1, 5)]
BUCKET_SHARD = "synth_005.parquet"
NEAR_DUP_SHARD = "synth_006.parquet"
SHARD_NAMES = [*REGULAR_SHARDS, BUCKET_SHARD, NEAR_DUP_SHARD]
ROWS_PER_SHARD = 750
BUCKET_ROWS = 54
PLANTED_COPIES = 85  # 25 sources x 1..6 copies
HARD_NEGATIVES = 10
NEAR_DUP_ROWS = PLANTED_COPIES + HARD_NEGATIVES
SAMPLE_ROWS = 4 * ROWS_PER_SHARD + BUCKET_ROWS + NEAR_DUP_ROWS
# near-duplicate oracle (synthkd_contract/near_dup.py): the threshold, and the margins the planted rows keep
NEAR_DUP_JACCARD = 0.8
COPY_MIN_JACCARD = 0.85
NEGATIVE_MAX_JACCARD = 0.5
# PleIAs/SYNTH's nine exercise labels as the corpus spells them (written out again, not imported)
EXERCISES = {
    "memorization",
    "mcq",
    "math exercise",
    "constrained writing",
    "rag",
    "math mcq",
    "editing",
    "creative writing",
    "cooking",
}
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


@pytest.fixture(scope="module")
def regular(rows) -> list[dict]:
    """The four regular shards' rows: the corpus-shaped part of the sample."""
    return rows[: 4 * ROWS_PER_SHARD]


def test_shards_exist_and_are_small():
    present = sorted(p.name for p in SAMPLE_DIR.glob("*.parquet"))
    assert present == SHARD_NAMES
    total = sum((SAMPLE_DIR / n).stat().st_size for n in SHARD_NAMES)
    assert total < 4 * 1024 * 1024


def test_exact_schema_row_counts_and_one_row_group_per_file():
    """SYNTH's schema (every column string but `words` int64) and its layout: one row group per file."""
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
        assert pf.metadata.num_row_groups == 1


def test_synth_ids_unique_and_shaped_like_synths(rows):
    """All six files together; ids as SYNTH's (`memorization_94_6343`, `memorization_german_10_150696`,
    `synth_math_21_14314`, ...), the planted rows' naming their source (`<source>-nd<k>`, `<source>-neg`)."""
    ids = [r["synth_id"] for r in rows]
    assert len(ids) == len(set(ids)) == SAMPLE_ROWS
    generated, planted = ids[:-NEAR_DUP_ROWS], ids[-NEAR_DUP_ROWS:]
    shape = r"(memorization(_[a-z]+)?|synth_memory_mcq|synth_math|synth_dataset_writing|rag|mcq_math"
    shape += r"|synth_dataset_editing|creative_writing|cooking)_\d+_\d+"
    assert all(re.fullmatch(shape, i) for i in generated)
    assert all(re.fullmatch(shape + r"-(nd\d|neg)", i) for i in planted)
    german = [r["synth_id"] for r in rows[:-NEAR_DUP_ROWS] if r["exercise"] == "memorization" and r["language"] == "de"]
    assert german and all(i.startswith("memorization_german_") for i in german)


def test_exercises_as_spelled_in_the_corpus_proportions(regular):
    """The nine labels, memorization ~90% (the corpus: 90.6-90.8%), so 001's 70% memorization cap binds; the others
    in the corpus's order of frequency, the rarest (cooking) still present."""
    counts = Counter(r["exercise"] for r in regular)
    assert set(counts) == EXERCISES
    assert 0.87 <= counts["memorization"] / len(regular) <= 0.93
    assert counts["memorization"] / len(regular) > constants.MEMORIZATION_CAP
    assert min(counts.values()) >= 10
    assert counts["mcq"] > counts["math mcq"] and counts["math exercise"] > counts["cooking"]


def test_generator_models_per_exercise(regular):
    models = {(r["exercise"], r["model"]) for r in regular}
    assert ("math exercise", "deepseek-prover-drafter+deepseek-prover-solving") in models
    assert ("cooking", "qwen-3-8b-memorization+seed rewriting with Qwen3") in models
    assert len(models) == len(EXERCISES)  # one generator per exercise


def test_language_mix(regular):
    """English ~81%, fr / de / es / it / pl ~3% each, nl and la ~1.5%, a few nulls (the corpus: ~0.15%)."""
    langs = Counter(r["language"] for r in regular)
    assert 0.77 <= langs["en"] / len(regular) <= 0.85
    for language in ("fr", "de", "es", "it", "pl"):
        assert 0.02 <= langs[language] / len(regular) <= 0.045, language
    for language in ("nl", "la"):
        assert 0.008 <= langs[language] / len(regular) <= 0.025, language
    assert langs[None] >= 1
    assert set(langs) == {"en", "fr", "de", "es", "it", "pl", "nl", "la", None}


def test_empty_reasoning_rates_per_exercise(regular):
    """Constrained writing and editing never have a reasoning; math mcq and creative writing sometimes not
    (9.6%, 6.8% in the corpus); the others always have one."""
    empty: dict[str, list[bool]] = defaultdict(list)
    for r in regular:
        empty[r["exercise"]].append(not r["synthetic_reasoning"].strip())
    assert all(empty["constrained writing"]) and all(empty["editing"])
    for exercise in ("mcq", "math exercise", "rag", "cooking"):
        assert not any(empty[exercise]), exercise
    assert sum(empty["memorization"]) <= 2
    assert (
        0.01
        <= sum(e for x in ("math mcq", "creative writing") for e in empty[x])
        / (len(empty["math mcq"]) + len(empty["creative writing"]))
        <= 0.2
    )


def test_constraints_and_answer_shapes_per_exercise(regular):
    """As the corpus writes them: `result:<number>` and `**Answer: 15 systems**` (math exercise), a signed
    `result:` and `A. 74.5%` (math mcq), comma-separated key:value items and `C. the 1960s` (mcq), the sources
    in `<source_1>` (rag), the writing exercises' own items, empty for memorization and cooking."""
    by = defaultdict(list)
    for r in regular:
        by[r["exercise"]].append(r)
    failed = constants.FAILED_RESULT_MARKER
    for r in by["math exercise"]:
        assert re.fullmatch(r"result:-?[\d.]+", r["constraints"]) or r["constraints"] == failed
        assert re.match(r"\*\*Answer: \S+ [a-z]+\*\*\n\n", r["synthetic_answer"]) or not r["synthetic_answer"].strip()
    assert any(r["constraints"] == "result:0.25" for r in by["math exercise"]) or any(
        "/" in r["synthetic_answer"].split("\n")[0] for r in by["math exercise"]
    )
    assert any(r["constraints"].startswith("result:-") for r in by["math mcq"])
    for r in by["math mcq"]:
        assert re.fullmatch(r"result:-?[\d.]+", r["constraints"]) or r["constraints"] == failed
        assert re.match(r"[A-D]\. [\d.]+%", r["synthetic_answer"]) or not r["synthetic_answer"].strip()
    for r in by["mcq"]:
        assert re.fullmatch(
            r"domain:[a-z ]+, exercise:[a-z ]+, answer_shape:\w+, exercise_pattern:\w+", r["constraints"]
        )
        assert re.match(r"[A-D]\. ", r["synthetic_answer"]) or not r["synthetic_answer"].strip()
    for r in by["rag"]:
        assert r["constraints"] == f"<source_1>\n{r['query_seed_text']}\n</source_1>"
    for exercise, key in (
        ("constrained writing", "combination:"),
        ("editing", "quality:"),
        ("creative writing", "form:"),
    ):
        assert all(r["constraints"].startswith(key) for r in by[exercise]), exercise
    assert all(r["constraints"] == "" for r in by["memorization"] + by["cooking"])
    assert all(r["seed_license"] == "CC-By-SA (4.0)" for r in regular)


def test_lengths_follow_the_corpus(regular):
    """Median characters within 30% of the corpus's (query 159, seed text 702, reasoning 2,252, answer 1,417),
    a long tail in query and seed text (p90 at least 2.5x the median, as in the corpus)."""
    for column, median in (
        ("query", 159),
        ("query_seed_text", 702),
        ("synthetic_reasoning", 2252),
        ("synthetic_answer", 1417),
    ):
        lengths = sorted(len(r[column]) for r in regular if r[column].strip())
        assert 0.7 * median <= statistics.median(lengths) <= 1.3 * median, column
    for column in ("query", "query_seed_text"):
        lengths = sorted(len(r[column]) for r in regular)
        assert lengths[int(0.9 * len(lengths))] >= 2.5 * statistics.median(lengths), column


def test_many_rows_share_one_article_section(regular):
    """SYNTH amplifies each Wikipedia section into many rows: seed texts open with the section heading, and rows
    asking different questions about one section share its text (or most of it, its first paragraphs)."""
    assert all(re.match(r"[A-Z][a-z]+\n\n", r["query_seed_text"]) for r in regular)
    by_text = Counter(r["query_seed_text"] for r in regular)
    assert len(regular) / len(by_text) >= 5
    shared = [text for text, n in by_text.items() if n >= 2]
    queries = {text: {r["query"] for r in regular if r["query_seed_text"] == text} for text in shared[:20]}
    assert all(len(q) >= 2 for q in queries.values())


def test_bucket_shard_holds_every_exercise_several_times():
    rows = pq.read_table(SAMPLE_DIR / BUCKET_SHARD).to_pylist()
    assert Counter(r["exercise"] for r in rows) == {exercise: BUCKET_ROWS // len(EXERCISES) for exercise in EXERCISES}
    assert [int(r["synth_id"].rsplit("_", 1)[1]) for r in rows] == list(range(3000, 3000 + BUCKET_ROWS))


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


def test_words_counts_the_generated_text(rows):
    """`words` (the corpus: mean ~515) counts the reasoning's and the answer's words (a planted copy keeps its
    source's, as any other column it does not edit)."""
    generated = rows[:-NEAR_DUP_ROWS]
    assert all(r["words"] == len(f"{r['synthetic_reasoning']} {r['synthetic_answer']}".split()) for r in generated)
    assert 400 <= statistics.mean(r["words"] for r in rows) <= 650


def test_regeneration_is_byte_identical(tmp_path, capsys):
    """`python -m synthkd_dev.make_sample_data` with its defaults rewrites the committed sample byte for byte,
    the bucket and near-duplicate shards included."""
    assert make_sample_data.main(["--output-dir", str(tmp_path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == SHARD_NAMES
    for name in SHARD_NAMES:
        assert _sha256(tmp_path / name) == _sha256(SAMPLE_DIR / name), name


def test_rows_do_not_depend_on_sharding():
    whole = make_sample_data.generate_rows(40, seed=7)
    parts = make_sample_data.generate_rows(15, seed=7) + make_sample_data.generate_rows(25, seed=7, start_index=15)
    assert whole == parts
    assert list(whole[0]) == list(RAW_COLUMNS)


def test_bucket_rows_are_numbered_after_the_regular_shards_and_optional(tmp_path):
    """--bucket-rows 0 writes only the regular shards; the bucket shard's rows follow them in synth_id."""
    small = ["--shards", "2", "--rows-per-shard", "5", "--near-dup-sources", "0"]
    assert make_sample_data.main(["--output-dir", str(tmp_path), *small]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synth_001.parquet", "synth_002.parquet", "synth_003.parquet"]
    bucket = pq.read_table(tmp_path / "synth_003.parquet").to_pylist()
    assert bucket[0]["synth_id"].endswith("_10") and len(bucket) == BUCKET_ROWS
    only = tmp_path / "only"
    regular_only = ["--shards", "1", "--bucket-rows", "0", "--near-dup-sources", "0"]
    assert make_sample_data.main(["--output-dir", str(only), *regular_only]) == 0
    assert [p.name for p in only.iterdir()] == ["synth_001.parquet"]


def test_near_dup_shard_is_the_next_file_and_copies_what_there_is(tmp_path):
    """Without a bucket shard the near-duplicate shard follows the regular ones; a tiny layout plants what its
    eligible rows allow, ids unique."""
    args = ["--output-dir", str(tmp_path), "--shards", "1", "--rows-per-shard", "30", "--bucket-rows", "0"]
    assert make_sample_data.main(args) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synth_001.parquet", "synth_002.parquet"]
    planted = pq.read_table(tmp_path / "synth_002.parquet").column("synth_id").to_pylist()
    regular = pq.read_table(tmp_path / "synth_001.parquet").column("synth_id").to_pylist()
    assert planted and len(set(planted)) == len(planted) and not set(planted) & set(regular)


# --- planted near-duplicates (#18): an oracle of the test's own -------------------------------------------------


def _shingles(row: dict) -> frozenset[tuple[str, ...]]:
    """The question and the answer (what the signatures compare), NFKC, casefolded, split on whitespace, word
    3-grams."""
    prompt = row["query"] + "\n\n" + row["synthetic_answer"]
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
    assert {int(s["synth_id"].rsplit("_", 1)[1]) // ROWS_PER_SHARD for s in sources} == {0, 1, 2, 3}
    assert {s["exercise"] for s in sources} == EXERCISES
    for s in sources:
        assert s["synthetic_answer"].strip() and "failed after maximum attempts" not in s["constraints"].lower()
    sizes = Counter(1 + len(copies) for copies in clusters.values())
    assert set(sizes) == {2, 3, 4, 5, 6, 7} and sizes[6] + sizes[7] >= 4


def test_planted_copies_are_near_duplicates_of_source_and_siblings(clusters, by_id):
    """Exact Jaccard >= 0.85 between any two members of a planted cluster; a copy differs from its source only
    in query / answer."""
    for source_id, copies in clusters.items():
        members = [source_id, *copies]
        shingles = [_shingles(by_id[m]) for m in members]
        for i in range(len(members)):
            for j in range(i + 1, len(members)):
                assert _jaccard(shingles[i], shingles[j]) >= COPY_MIN_JACCARD, (members[i], members[j])
        source = by_id[source_id]
        for copy_id in copies:
            copy = by_id[copy_id]
            assert (copy["query"], copy["synthetic_answer"]) != (source["query"], source["synthetic_answer"])
            same = {k: v for k, v in copy.items() if k not in ("synth_id", "query", "synthetic_answer")}
            assert same == {k: source[k] for k in same}, copy_id


def test_hard_negatives_share_the_query_and_are_near_duplicates_of_nothing(by_id, rows):
    """Same query as their source, about another section (seed text and answer), exact Jaccard < 0.5 to it, and
    under the 0.8 threshold with every row."""
    all_shingles = {r["synth_id"]: _shingles(r) for r in rows}
    for negative in make_sample_data.planted_negatives():
        row, source = by_id[negative.negative_id], by_id[negative.source_id]
        assert row["query"] == source["query"] and row["synthetic_answer"] != source["synthetic_answer"]
        own = all_shingles[negative.negative_id]
        assert _jaccard(own, all_shingles[negative.source_id]) < NEGATIVE_MAX_JACCARD
        closest = max(_jaccard(own, other) for i, other in all_shingles.items() if i != negative.negative_id)
        assert closest < NEAR_DUP_JACCARD, negative.negative_id
