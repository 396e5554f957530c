"""Skill and context buckets (002 §2-§3): the contract's tables, the harmonize step's refusal of an exercise
no bucket maps, the per-row counts (core/buckets.py) and the (skill, ctx) grid the tokenize step reports.

The bucket functions are checked against oracles written out here (a chain of comparisons for the ctx
bounds, plain loops for the counts); the refusal and the grid run through the real steps on real
Parquet files, and once through Dagster on a real instance.
"""

from __future__ import annotations

import math
import re
import uuid
from collections import Counter

import dagster as dg
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synthkd_assets.cli import build_run_config
from synthkd_assets.core.buckets import bucket_counts, grid_from_nested, grids_from_reports, nested_grid
from synthkd_assets.core.parquet_io import READ_BATCH_ROWS, InputFileError
from synthkd_assets.core.quota_rows import QuotaRow, tokenized_quota_rows
from synthkd_assets.core.render import FastRenderer
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.stages import harmonize_shard, select_rows_shard, tokenize_shard
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.core.tokenizer import load_tiktoken_o200k
from synthkd_assets.core.validation import UnknownExerciseError, exercise_labels
from synthkd_assets.definitions import build_definitions
from synthkd_assets.defs.resources import BUILD_CONFIG_ENV, SynthKDBuildConfig, SynthKDLayout
from synthkd_contract import constants
from synthkd_contract.buckets import (
    CTX_BUCKET_MAX_TOKENS,
    CTX_BUCKETS,
    CURRICULUM_STAGES,
    EXERCISE_SKILL_BUCKET,
    POOL_ID_NAMESPACE,
    SKILL_BUCKET_NAMES,
    SKILL_BUCKETS,
    SKILL_MIX,
    UnknownExercise,
    ctx_bucket,
    ctx_codes,
    exercise_skill_table,
    pool_row_id,
    skill_bucket,
    unknown_exercise_message,
)
from synthkd_contract.settings import Settings
from tests.helpers import SCAN_STEPS, build_all, quota_rows_of, run
from tests.test_bad_input import leftovers, row, step_failures, write_raw

SYSTEM = system_message_dict()
SHARD = "synth_004"
EXERCISES = sorted(EXERCISE_SKILL_BUCKET)


def ctx_oracle(length: int) -> str:
    """002 §3 spelled out: C1 <= 2048 < C2 <= 8192 < C3 <= 32768 < C4."""
    if length <= 2048:
        return "C1"
    if length <= 8192:
        return "C2"
    if length <= 32768:
        return "C3"
    return "C4"


# --- the contract's tables ----------------------------------------------------------------------


def test_every_exercise_maps_to_exactly_one_known_bucket_and_the_null_default_is_mapped():
    assert set(EXERCISE_SKILL_BUCKET.values()) <= set(SKILL_BUCKETS)
    assert constants.NULL_DEFAULTS["exercise"] in EXERCISE_SKILL_BUCKET
    assert constants.MEMORIZATION_EXERCISE in EXERCISE_SKILL_BUCKET
    assert set(SKILL_BUCKET_NAMES) == set(SKILL_MIX) == set(SKILL_BUCKETS)
    assert math.isclose(math.fsum(SKILL_MIX.values()), 1.0) and min(SKILL_MIX.values()) > 0
    assert list(CTX_BUCKET_MAX_TOKENS) == list(CTX_BUCKETS[:-1])
    assert list(CTX_BUCKET_MAX_TOKENS.values()) == sorted(CTX_BUCKET_MAX_TOKENS.values())


def test_curriculum_stages_name_only_ctx_buckets_and_their_shares_sum_to_one():
    assert [s["stage"] for s in CURRICULUM_STAGES] == ["P1", "P2", "P3", "P4"]
    for stage in CURRICULUM_STAGES:
        assert set(stage["ctx_mix"]) <= set(CTX_BUCKETS)
        assert math.isclose(math.fsum(stage["ctx_mix"].values()), 1.0)
        # a stage's sequences hold its ctx buckets: no bucket's bound exceeds the stage's sequence length
        assert all(CTX_BUCKET_MAX_TOKENS.get(c, stage["seq_length"]) <= stage["seq_length"] for c in stage["ctx_mix"])


def test_skill_bucket_follows_the_table_and_refuses_an_unknown_exercise_by_name():
    assert [skill_bucket(e) for e in EXERCISES] == [EXERCISE_SKILL_BUCKET[e] for e in EXERCISES]
    with pytest.raises(UnknownExercise) as caught:
        skill_bucket("code_review")
    assert str(caught.value) == (
        "exercise 'code_review' has no skill bucket in synthkd_contract/buckets.py EXERCISE_SKILL_BUCKET; map it with "
        "the build resource's exercise_skill_buckets (e.g. SYNTHKD_BUILD_CONFIG="
        """'{"exercise_skill_buckets": {"code_review": "B1"}}')"""
    )
    assert skill_bucket("code_review", exercise_skill_table({"code_review": "B3"})) == "B3"


@pytest.mark.parametrize(
    ("length", "bucket"),
    [(0, "C1"), (1, "C1"), (2048, "C1"), (2049, "C2"), (8192, "C2"), (8193, "C3"), (32768, "C3"), (32769, "C4")],
)
def test_ctx_bucket_bounds_are_inclusive(length, bucket):
    assert ctx_bucket(length) == bucket


@given(st.integers(0, 10**6))
def test_ctx_bucket_agrees_with_the_spelled_out_bounds(length):
    assert ctx_bucket(length) == ctx_oracle(length)


def test_ctx_bucket_refuses_a_negative_length():
    with pytest.raises(ValueError, match="sequence length -1 < 0"):
        ctx_bucket(-1)


def test_pool_ids_are_uuid5_of_source_and_synth_id():
    a = pool_row_id(constants.SOURCE_DATASET, "synth_1")
    assert a == pool_row_id(constants.SOURCE_DATASET, "synth_1")
    assert a == str(uuid.uuid5(POOL_ID_NAMESPACE, f"{constants.SOURCE_DATASET}:synth_1"))
    assert uuid.UUID(a).version == 5
    assert a != pool_row_id(constants.SOURCE_DATASET, "synth_2") != pool_row_id("other", "synth_1")


# --- per-row counts ------------------------------------------------------------------------------

rows_strategy = st.lists(
    st.tuples(st.sampled_from(EXERCISES), st.sampled_from(["en", "fr", "unknown"]), st.integers(1, 70000)),
    max_size=60,
)


@given(rows_strategy)
def test_bucket_counts_agree_with_plain_loops(rows):
    counts = bucket_counts(rows)
    for measure, size in (("tokens", lambda n: n), ("rows", lambda n: 1)):
        expected = {name: Counter() for name in ("skill", "ctx", "language", "exercise", "cell")}
        for exercise, language, length in rows:
            expected["skill"][EXERCISE_SKILL_BUCKET[exercise]] += size(length)
            expected["ctx"][ctx_oracle(length)] += size(length)
            expected["language"][language] += size(length)
            expected["exercise"][exercise] += size(length)
            expected["cell"][EXERCISE_SKILL_BUCKET[exercise], ctx_oracle(length)] += size(length)
        got = counts[measure]
        assert got["skill"] == {b: expected["skill"][b] for b in SKILL_BUCKETS}  # every bucket, zeros included
        assert got["ctx"] == {c: expected["ctx"][c] for c in CTX_BUCKETS}
        assert got["language"] == dict(expected["language"]) and got["exercise"] == dict(expected["exercise"])
        assert got["cell"] == {b: {c: expected["cell"][b, c] for c in CTX_BUCKETS} for b in SKILL_BUCKETS}
        total = sum(size(length) for _, _, length in rows)
        for name in ("skill", "ctx", "language", "exercise"):
            assert sum(got[name].values()) == total


def test_bucket_counts_refuse_an_unknown_exercise():
    with pytest.raises(UnknownExercise, match="'code_review'"):
        bucket_counts([("rag", "en", 10), ("code_review", "en", 10)])


def test_quota_rows_are_every_files_rows_in_order_with_each_rows_own_buckets(tmp_path):
    """tokenized_quota_rows (a file at a time, each bucket asked once per exercise and length) gives, file by
    file and row by row, what the bucket functions give for that row; an exercise no table maps is refused."""
    exercises = ["rag", "memorization", "math exercise", "mcq", "creative writing"]
    lengths = [1, 2048, 2049, 8192, 8193, 40000, 7]
    paths, expected = [], []
    for f in range(3):
        rows = [(f"s{f}_{i}", exercises[(i + f) % 5], lengths[(i * 3 + f) % 7]) for i in range(5000 + f)]
        table = pa.table(
            {
                "synth_id": [r[0] for r in rows],
                "exercise": [r[1] for r in rows],
                "loss_mask": pa.array([[1] * n for _, _, n in rows], pa.list_(pa.uint8())),
            }
        )
        paths.append(tmp_path / f"synth_{f}.parquet")
        pq.write_table(table, paths[-1])
        expected += [QuotaRow(i, skill_bucket(e), ctx_bucket(n), n) for i, e, n in rows]
    assert quota_rows_of(paths) == expected
    pq.write_table(pa.table({"synth_id": ["x"], "exercise": ["code_review"], "loss_mask": [[1]]}), paths[1])
    with pytest.raises(UnknownExercise, match="'code_review'"):
        tokenized_quota_rows(paths)


def test_report_counters_nest_like_exercise_language_and_are_absent_while_empty():
    report = ShardReport("synth_001")
    assert "bucket_tokens" not in report.to_dict() and "bucket_rows" not in report.to_dict()
    assert report.to_dict()["exercise_language"] == {}  # the older counters keep their empty entries
    report.bucket_tokens.update({("B1", "C1"): 100, ("B1", "C2"): 3000, ("B4", "C1"): 7})
    report.bucket_rows.update({("B1", "C1"): 1, ("B1", "C2"): 1, ("B4", "C1"): 1})
    as_dict = report.to_dict()
    assert as_dict["bucket_tokens"] == {"B1": {"C1": 100, "C2": 3000}, "B4": {"C1": 7}}
    assert grid_from_nested(as_dict["bucket_tokens"]) == dict(report.bucket_tokens)
    tokens, rows = grids_from_reports([as_dict, as_dict, ShardReport("synth_002").to_dict()])
    assert tokens == {cell: 2 * n for cell, n in report.bucket_tokens.items()}
    assert rows == {cell: 2 for cell in report.bucket_rows}
    assert nested_grid(tokens)["B2"] == {c: 0 for c in CTX_BUCKETS}


# --- the tokenize step's grid ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fast(encoding, tokenizer_dir) -> FastRenderer:
    return FastRenderer(encoding, load_tiktoken_o200k(tokenizer_dir))


def test_tokenize_reports_tokens_and_rows_per_skill_and_ctx_cell(tmp_path, fast):
    """Every exercise of the table (a null one becomes "unknown"), two conversations long enough for C2:
    the report's grid is what the written tokens say, cell by cell, and no other step reports one."""
    rows = [
        row(f"{exercise}_{i}", exercise=exercise) for exercise in EXERCISES if exercise != "unknown" for i in (0, 1)
    ]
    rows += [row("null_exercise", exercise=None)]
    rows += [row(f"long_{i}", exercise=e, synthetic_answer="lorem ipsum " * 1500) for i, e in enumerate(("rag", "mcq"))]
    raw = write_raw(tmp_path / "synth_001.parquet", rows)
    harmony, filtered, tokenized = (tmp_path / name / "synth_001.parquet" for name in ("h", "f", "t"))
    harmonize_report = harmonize_shard(raw, harmony, SYSTEM, "synth_001")
    select_report = select_rows_shard(harmony, filtered, "synth_001")
    report = tokenize_shard(filtered, tokenized, fast, "synth_001")

    written = pq.read_table(tokenized, columns=["exercise", "language", "tokens"]).to_pylist()
    assert len(written) == len(rows) and {r["exercise"] for r in written} == set(EXERCISES)
    expected_tokens, expected_rows = Counter(), Counter()
    for r in written:
        cell = (EXERCISE_SKILL_BUCKET[r["exercise"]], ctx_oracle(len(r["tokens"])))
        expected_tokens[cell] += len(r["tokens"])
        expected_rows[cell] += 1
    assert report.bucket_tokens == expected_tokens and report.bucket_rows == expected_rows
    assert expected_rows["B1", "C2"] == 2 and sum(expected_tokens.values()) == sum(report.span_tokens.values())
    as_dict = report.to_dict()
    breakdown = bucket_counts((r["exercise"], r["language"], len(r["tokens"])) for r in written)
    assert grids_from_reports([as_dict]) == (dict(expected_tokens), dict(expected_rows))
    assert all(
        as_dict["bucket_tokens"][b][c] == n
        for b, ctxs in breakdown["tokens"]["cell"].items()
        for c, n in ctxs.items()
        if n
    )
    for other in (harmonize_report, select_report):  # their report files keep the keys they had
        assert "bucket_tokens" not in other.to_dict() and "bucket_rows" not in other.to_dict()


# --- the harmonize step refuses an exercise without a bucket -------------------------------------------


def test_an_unknown_exercise_refuses_the_shard_by_name_and_publishes_nothing(tmp_path):
    """The unknown exercise sits in the second read batch, after the first batch was written: the step
    fails naming file, row and exercise, and an earlier good output of the shard stays as it was."""
    rows = [row(f"id{i}", exercise=EXERCISES[i % len(EXERCISES)]) for i in range(READ_BATCH_ROWS + 40)]
    raw = write_raw(tmp_path / f"{SHARD}.parquet", rows)
    out = tmp_path / "out" / f"{SHARD}.parquet"
    harmonize_shard(raw, out, SYSTEM, SHARD)  # an earlier, good build
    before = out.read_bytes()
    bad_row = READ_BATCH_ROWS + 17
    rows[bad_row]["exercise"] = "code_review"
    rows[bad_row + 5]["exercise"] = "code_review"
    rows[bad_row + 9]["exercise"] = "translation"
    rows[bad_row - 2]["synthetic_answer"] = None  # dropped (missing answer) before the check: not named
    rows[bad_row - 2]["exercise"] = "dropped_anyway"
    write_raw(raw, rows)
    with pytest.raises(UnknownExerciseError) as caught:
        harmonize_shard(raw, out, SYSTEM, SHARD)
    assert isinstance(caught.value, InputFileError) and isinstance(caught.value, UnknownExercise)
    assert str(caught.value) == (
        f"{raw}: row {bad_row}: {unknown_exercise_message('code_review')} (shard {SHARD}; it maps "
        f"{', '.join(map(repr, EXERCISES))})"
    )
    assert out.read_bytes() == before and not leftovers(tmp_path)


def test_a_null_exercise_is_unknown_and_accepted(tmp_path):
    raw = write_raw(tmp_path / "synth_001.parquet", [row("a", exercise=None), row("b")])
    report = harmonize_shard(raw, tmp_path / "out.parquet", SYSTEM, "synth_001")
    assert report.exercise == Counter({"unknown": 1, "rag": 1}) and report.sanitized["null_exercise"] == 1


def test_the_scan_pass_fails_on_an_unknown_exercise_and_materializes_nothing(tmp_path):
    """A shard registered without the inventory's label check (as the raw sensor registers a new file): the
    harmonize step refuses it, naming file, row, label and setting."""
    raw_dir = tmp_path / "raw"
    raw = write_raw(raw_dir / f"{SHARD}.parquet", [row("a"), row("b", exercise="code_review")])
    layout = SynthKDLayout(raw_dir=str(raw_dir), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions("synth_shards", [SHARD])
        failed = run(instance, layout, SCAN_STEPS, SHARD, raise_on_error=False)
    assert not failed.success and not failed.get_asset_materialization_events()
    [message] = step_failures(failed)
    assert message.startswith(
        f"synthkd_assets.core.validation.UnknownExerciseError: {raw}: row 1: exercise 'code_review' has no skill "
        "bucket in synthkd_contract/buckets.py EXERCISE_SKILL_BUCKET; map it with the build resource's "
        "exercise_skill_buckets"
    ), message
    paths = layout.data_layout()
    assert not paths.stage_output("synth_harmony", SHARD).exists()
    assert not paths.stage_report("synth_harmony", SHARD).exists()
    assert not leftovers(tmp_path)


# --- a label the contract does not know: found before any shard is scanned, mapped by config --------------------
def test_an_unknown_label_stops_the_inventory_naming_it_its_files_and_the_setting(tmp_path):
    """Two labels SYNTH's table does not hold, in two files: the inventory (the first pass of a build) fails
    naming each label, its rows and files and the setting that maps it, and registers no partition, so a
    500-shard build never stops hours in. Mapped through the build resource's config, the same files build to the
    end and the rows land in the buckets given; the mapping is in the manifests' config hash."""
    raw_dir = tmp_path / "raw"
    first = write_raw(raw_dir / "synth_001.parquet", [row("a"), row("b", exercise="code review"), row("c")])
    second = write_raw(raw_dir / "synth_002.parquet", [row("d", exercise="code review"), row("e", exercise="poetry")])
    layout = SynthKDLayout(raw_dir=str(raw_dir), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        failed = run(instance, layout, ["synth_raw_inventory"], raise_on_error=False)
        assert not failed.success and instance.get_dynamic_partitions("synth_shards") == []
        [message] = step_failures(failed)
        assert message == (
            "dagster._core.definitions.events.Failure: 2 exercise labels of the raw SYNTH shards have no skill bucket "
            "in synthkd_contract/buckets.py EXERCISE_SKILL_BUCKET, nothing was scanned: "
            f"'code review': 2 rows in {first} (1 rows), {second} (1 rows); 'poetry': 1 rows in {second} (1 rows); "
            "map each to B1..B4 with the build resource's exercise_skill_buckets, e.g. "
            """SYNTHKD_BUILD_CONFIG='{"exercise_skill_buckets": {"code review": "B1", "poetry": "B1"}}'"""
        )
        mapped = SynthKDBuildConfig(exercise_skill_buckets={"code review": "B3", "poetry": "B4"})
        build_all(instance, layout, mapped, outputs=["synth_kd_v1"])
    report = pl.read_parquet(layout.data_layout().stage_dir("synth_tokenized") / "synth_002.parquet")
    assert set(report["exercise"]) <= {"code review", "poetry"}
    assert mapped.kd_config() != SynthKDBuildConfig().kd_config()
    with pytest.raises(ValueError, match="exercise 'poetry' -> 'B9', not a skill bucket"):
        SynthKDBuildConfig(exercise_skill_buckets={"poetry": "B9"})


@pytest.mark.parametrize(
    "column",
    [
        pa.array(["rag", "code review", None, "rag"], pa.string()),
        pa.array(["rag", "code review", None, "rag"], pa.large_string()),
        pa.array(["rag", "code review", None, "rag"]).dictionary_encode(),
        pa.array([b"rag", b"code review", None, b"rag"], pa.binary()),
    ],
)
def test_the_inventory_reads_labels_of_every_text_type_the_scan_accepts(tmp_path, column):
    """A file's labels from its `exercise` column alone, as the harmonize step will read them: null is `unknown`; a
    binary label that is not UTF-8 (its row dropped as invalid_utf8_exercise there) is no label."""
    rows = [row(f"id{i}") for i in range(4)]
    table = pa.Table.from_pylist(rows).set_column(2, "exercise", column)
    pq.write_table(table, tmp_path / "synth_001.parquet")
    assert exercise_labels(tmp_path / "synth_001.parquet") == {"rag": 2, "code review": 1, "unknown": 1}
    if pa.types.is_binary(column.type):
        bad = pa.array([b"rag", b"\xff\xfe", None, b"rag"], pa.binary())
        pq.write_table(table.set_column(2, "exercise", bad), tmp_path / "synth_002.parquet")
        assert exercise_labels(tmp_path / "synth_002.parquet") == {"rag": 2, "unknown": 1}


def test_the_build_config_variable_maps_labels_for_build_sh_dg_and_the_code_location():
    """SYNTHKD_BUILD_CONFIG (a JSON object of build settings) is read by the code location (sensors, `dg`), the
    build driver and build.sh's run config alike; a bad value is refused naming the variable and the reason."""
    environ = {BUILD_CONFIG_ENV: '{"exercise_skill_buckets": {"code review": "B3"}}'}
    assert SynthKDBuildConfig.from_settings(Settings.read(environ)).exercise_table()["code review"] == "B3"
    assert SynthKDBuildConfig.from_settings(Settings.read(environ), smoke=True).smoke
    location = build_definitions(environ).resources["build"]
    assert location.exercise_table()["code review"] == "B3"
    assert build_run_config(Settings.read(environ), smoke=True) == {
        "resources": {"build": {"config": {"exercise_skill_buckets": {"code review": "B3"}, "smoke": True}}}
    }
    assert build_run_config(Settings.read({}), smoke=False) == {}
    for text, says in [
        ('{"exercise_skill_buckets": ', "is not JSON"),
        ("[1]", "must be a JSON object of build settings"),
        ('{"exercise_skill_bucket": {}}', "names no build setting ['exercise_skill_bucket']"),
        ('{"exercise_skill_buckets": {"x": "B7"}}', "exercise 'x' -> 'B7', not a skill bucket"),
    ]:
        with pytest.raises(ValueError, match=re.escape(says)) as caught:
            build_run_config(Settings.read({BUILD_CONFIG_ENV: text}), smoke=False)
        assert str(caught.value).startswith(f"${BUILD_CONFIG_ENV}")


@settings(max_examples=200)
@given(st.lists(st.integers(0, 100_000) | st.sampled_from([2047, 2048, 2049, 8192, 8193, 32768, 32769]), max_size=50))
def test_ctx_codes_are_ctx_bucket_of_every_length(lengths):
    """The vectorized ctx buckets (`ctx_codes`, the quota's) against `ctx_bucket` row by row, bounds included."""
    codes = ctx_codes(np.array(lengths, dtype=np.int64))
    assert [CTX_BUCKETS[code] for code in codes.tolist()] == [ctx_bucket(n) for n in lengths]


def test_ctx_codes_refuse_a_negative_length():
    with pytest.raises(ValueError, match="-3"):
        ctx_codes(np.array([5, -3], dtype=np.int64))
