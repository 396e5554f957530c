"""Anchor-source adapters (issue #21 items 1 and 4): every fixture row meets the fate its generator wrote down,
hand-written Harmony messages for chosen rows, ids stable under row order, the wrong-schema error, and every
conversation rendered by the real openai-harmony encoding with analysis / final spans only on assistant messages.

The oracles are independent of the adapters: expected messages are built with openai-harmony's Message objects,
content ids with hashlib over JSON written out here, row fates by hand in synthkd_dev/source_fixtures.py.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import Message, Role

from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.core.sources import ADAPTERS, harmonize_source
from synthkd_assets.core.sources.base import QUIET_REASONS
from synthkd_assets.core.synth import system_message_dict
from synthkd_contract import buckets, constants, drops, sources
from synthkd_contract.schemas import HARMONY_SCHEMA
from synthkd_dev.source_fixtures import FRENCH, GERMAN, Fixture, chatml, write_fixtures, wrong_schema_shards


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> list[Fixture]:
    return write_fixtures(tmp_path_factory.mktemp("sources"))


@pytest.fixture(scope="module")
def results(fixtures: list[Fixture]) -> dict[Path, Any]:
    return {fixture.path: harmonize_source(fixture.path, ADAPTERS[fixture.source]) for fixture in fixtures}


def _fixture(fixtures: list[Fixture], source: str, part: str = "") -> Fixture:
    return next(f for f in fixtures if f.source == source and part in str(f.path))


def _row(result, source_row: int) -> dict[str, Any]:
    rows = [r for r in result.frame.iter_rows(named=True) if r["source_row"] == source_row]
    assert len(rows) == 1, source_row
    return rows[0]


def _messages(result, source_row: int) -> list[dict[str, Any]]:
    return json.loads(_row(result, source_row)["messages_json"])["messages"]


def harmony(role: str, text: str, channel: str | None = None) -> dict[str, Any]:
    """The oracle: one message as openai-harmony's own objects serialize it."""
    message = Message.from_role_and_content(Role(role), text)
    if channel is not None:
        message = message.with_channel(channel)
    return json.loads(message.to_json())


def conversation(*messages: tuple[str, str] | tuple[str, str, str]) -> list[dict[str, Any]]:
    return [system_message_dict(), *(harmony(*m) for m in messages)]


# --- the contract --------------------------------------------------------------------------------------------
def test_every_declared_source_has_an_adapter_and_the_mix_adds_up():
    assert set(ADAPTERS) == set(sources.SOURCE_DATASETS) == set(sources.SOURCE_CATEGORY)
    assert math.isclose(sources.SYNTH_SHARE + sum(sources.ANCHOR_CATEGORY_SHARES.values()), 1.0)
    assert sources.ANCHOR_CATEGORY_SHARES == {"math": 0.08, "code": 0.06, "chat": 0.04, "personality": 0.02}
    assert sources.CATEGORY_SOURCES["personality"] == ()  # TBD in seed 002: declared, no source
    for source, cap in sources.SOURCE_TOKEN_CAPS.items():
        assert 0 < cap <= sources.ANCHOR_CATEGORY_SHARES[sources.source_category(source)]
    expected_bucket = {"math": "B2", "code": "B3", "chat": "B4", "personality": "B4"}
    for source, adapter in ADAPTERS.items():
        assert adapter.spec.key == source
        assert buckets.skill_bucket(adapter.spec.exercise) == expected_bucket[sources.source_category(source)]
    # SYNTH's own table is untouched: its config hash (and the SYNTH-only manifests' bytes) stay as they were
    assert not set(buckets.ANCHOR_EXERCISE_SKILL_BUCKET) & set(buckets.EXERCISE_SKILL_BUCKET)
    assert set(drops.DROP_REASONS_BY_STEP["source_harmony"]) >= set(QUIET_REASONS)


# --- accounting: every row's fate ------------------------------------------------------------------------------
def test_every_fixture_row_meets_its_expected_fate(fixtures, results):
    for fixture in fixtures:
        result = results[fixture.path]
        report = result.report
        expected_drops = Counter(fate for fate in fixture.expected.values() if fate is not None)
        kept_rows = sorted(row for row, fate in fixture.expected.items() if fate is None)
        assert report.rows_in == len(fixture.expected), fixture.path
        assert report.rows_in == report.rows_out + sum(report.dropped.values()), fixture.path
        assert dict(report.dropped) == dict(expected_drops), fixture.path
        assert sorted(result.frame["source_row"].to_list()) == kept_rows, fixture.path
        logged = {(e["source_row"], e["reason"]) for e in report.errors}
        named = {(row, fate) for row, fate in fixture.expected.items() if fate and fate not in QUIET_REASONS}
        assert logged == named, fixture.path
        assert all(e["shard"] == f"{fixture.source}/{fixture.path.name}" for e in report.errors)
        assert set(report.dropped) <= set(drops.DROP_REASONS_BY_STEP["source_harmony"])


def test_every_hostile_case_is_exercised(fixtures):
    """The fixtures drop rows under every source_harmony reason, so each rule is tested by at least one row."""
    seen = {fate for fixture in fixtures for fate in fixture.expected.values() if fate is not None}
    # smoke_cap is the graph's (a smoke build's cap on the rows written), not a fate of a row's content
    assert seen == set(drops.DROP_REASONS_BY_STEP["source_harmony"]) - {drops.DROP_SMOKE_CAP}


def test_output_rows_are_synth_harmony_v1_rows_of_their_source(fixtures, results):
    for fixture in fixtures:
        frame = results[fixture.path].frame
        assert frame.to_arrow().cast(HARMONY_SCHEMA).schema.equals(HARMONY_SCHEMA), fixture.path
        assert frame.schema == pl.from_arrow(HARMONY_SCHEMA.empty_table()).schema, fixture.path
        spec = ADAPTERS[fixture.source].spec
        for row in frame.iter_rows(named=True):
            metadata = json.loads(row["metadata_json"])
            assert row["synth_id"] == f"{fixture.source}:{metadata['source_example_id']}"
            assert row["exercise"] == sources.source_exercise(fixture.source)
            assert metadata["dataset"] == sources.SOURCE_DATASETS[fixture.source] == spec.dataset
            assert metadata["source_file"] == fixture.path.name and metadata["source_row"] == row["source_row"]
            assert "\x00" not in row["messages_json"]
        assert frame["synth_id"].is_unique().all()


def test_sanitizations_are_counted(results, fixtures):
    ultrachat = results[_fixture(fixtures, "ultrachat_200k").path].report.sanitized
    assert ultrachat == {drops.SANITIZED_NUL_IN_TURN_TEXT: 1, drops.SANITIZED_SOURCE_SYSTEM_TURN: 1}
    assert results[_fixture(fixtures, "oasst1").path].report.sanitized == {drops.SANITIZED_NUL_IN_TURN_TEXT: 1}


# --- hand-written expected conversations -------------------------------------------------------------------------
def test_nemotron_reasoning_becomes_analysis_and_think_blocks_are_split(fixtures, results):
    result = results[_fixture(fixtures, "nemotron_math_v2").path]
    user = "Solve the following math problem. What is $2+2$? Put the final answer in \\boxed{}."
    assert _messages(result, 0) == conversation(
        ("user", user), ("assistant", "2+2=4.", "analysis"), ("assistant", "The answer is $\\boxed{4}$.", "final")
    )
    assert _messages(result, 12) == conversation(
        ("user", user),
        ("assistant", "Two and two: 4.", "analysis"),
        ("assistant", "The answer is $\\boxed{4}$.", "final"),
    )
    # an empty reasoning_content is no analysis; the NUL is removed from the prompt
    nine = conversation(("user", "Compute $3 \\cdot 3$."), ("assistant", "$\\boxed{9}$", "final"))
    assert _messages(result, 5) == nine
    assert _row(result, 0)["language"] == "en"
    # one problem (uuid u-1), two trajectories: two ids, each "<uuid>-<sha256 of the content>[:16]"
    content = {"reasoning": "2+2=4.", "turns": [["user", user], ["assistant", "The answer is $\\boxed{4}$."]]}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert _row(result, 0)["synth_id"] == f"nemotron_math_v2:u-1-{digest[:16]}"
    assert _row(result, 1)["synth_id"].startswith("nemotron_math_v2:u-1-")
    assert _row(result, 1)["synth_id"] != _row(result, 0)["synth_id"]


def test_ultrachat_multi_turn_history_system_turn_and_think_in_history(fixtures, results):
    result = results[_fixture(fixtures, "ultrachat_200k").path]
    assert _messages(result, 0) == conversation(
        ("user", "Can you explain the organizational structure of the Habsburg imperial court?"),
        ("assistant", "The court was organised around the Obersthofmeister.", "final"),
        ("user", "And the role of the chamberlain?"),
        ("assistant", "The Oberstkämmerer ran the emperor's private household.", "final"),
    )
    assert _messages(result, 5) == conversation(("user", "Name a colour."), ("assistant", "Blue.", "final"))
    # a history turn's <think> is dropped (Harmony keeps no past analysis); the last one's becomes the analysis
    assert _messages(result, 9) == conversation(
        ("user", "Think first: 2+3?"),
        ("assistant", "5.", "final"),
        ("user", "And 2+4?"),
        ("assistant", "Add 2 to 4.", "analysis"),
        ("assistant", "6.", "final"),
    )
    assert _messages(result, 10)[1] == harmony("user", FRENCH)
    assert _row(result, 0)["synth_id"] == "ultrachat_200k:uc-1"


def test_oasst1_best_ranked_path_per_tree(fixtures, results):
    result = results[_fixture(fixtures, "oasst1").path]
    # tree A branches twice: rank 0 wins over rank 1, and over an unranked sibling
    assert _messages(result, 5) == conversation(
        ("user", "Can you write a short introduction about monopsony?"),
        ("assistant", "A monopsony is a market in which a single buyer dominates.", "final"),
        ("user", "Now cite research on labour markets."),
        ("assistant", "Card and Krueger (1994) study minimum wages.", "final"),
    )
    # tree B: its favourite reply is deleted, so the next-ranked one; the language is the tree's
    assert _messages(result, 11) == conversation(
        ("user", GERMAN), ("assistant", "Mit Chlorophyll und Sonnenlicht entsteht Glukose.", "final")
    )
    assert _row(result, 11)["language"] == "de" and _row(result, 5)["language"] == "en"
    # tree G ends with a prompter: the conversation stops at the last assistant reply
    assert _messages(result, 22) == conversation(
        ("user", "Tell me a joke."), ("assistant", "Why did the chicken cross the road?", "final")
    )
    metadata = json.loads(_row(result, 5)["metadata_json"])
    assert metadata["source_fields"] == {"message_tree_id": "A", "path_message_ids": ["A0", "A2", "A3", "A5"]}
    assert sorted(result.frame["synth_id"].to_list()) == [f"oasst1:{m}" for m in ("A5", "B3", "F2", "G1", "J1")]


def test_single_turn_sources(fixtures, results):
    hendrycks = results[_fixture(fixtures, "hendrycks_math").path]
    assert _messages(hendrycks, 0) == conversation(
        ("user", "Calculate: $(243)^{\\frac35}$"), ("assistant", "27", "final")
    )
    assert _row(hendrycks, 0)["synth_id"] == "hendrycks_math:hm-1"
    competition = results[_fixture(fixtures, "competition_math").path]
    problem = "What is $3!$?"
    solution = "$3! = 6$, so the answer is $\\boxed{6}$."
    assert _messages(competition, 1) == conversation(("user", problem), ("assistant", solution, "final"))
    turns = [["user", problem], ["assistant", solution]]
    content = json.dumps({"reasoning": None, "turns": turns}, sort_keys=True, separators=(",", ":"))
    assert _row(competition, 1)["synth_id"] == "competition_math:" + hashlib.sha256(content.encode()).hexdigest()
    code = results[_fixture(fixtures, "opencodeinstruct").path]
    assert _messages(code, 1)[1:] == [
        harmony("user", "Write `add(a, b)` returning the sum."),
        harmony("assistant", "```python\ndef add(a, b):\n    return a + b\n```", "final"),
    ]
    deepcoder = results[_fixture(fixtures, "deepcoder", "derived").path]
    assert _messages(deepcoder, 0)[2] == harmony("assistant", "```python\nt = int(input())\nprint(t)\n```", "final")


def test_anthropic_helpfulness_chatml_history(fixtures, results):
    result = results[_fixture(fixtures, "anthropic_helpfulness").path]
    assert _messages(result, 0) == conversation(
        ("user", "How do I teach my kids to speak French?"),
        ("assistant", "Start with songs and picture books.", "final"),
    )
    assert _messages(result, 1) == conversation(
        ("user", "I'm incorporating a business in Maine."),
        ("assistant", "Congratulations!", "final"),
        ("user", "What papers do I file?"),
        ("assistant", "File Articles of Incorporation with the Secretary of State.", "final"),
    )
    assert _messages(result, 2) == conversation(
        ("user", "How do I boil an egg?"), ("assistant", "Simmer it for nine minutes.", "final")
    )
    assert chatml(("user", "x")) == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


# --- ids do not depend on row order ----------------------------------------------------------------------------
def _content(result) -> set[tuple[str, str, str, str]]:
    return {
        (r["synth_id"], r["messages_json"], r["language"], r["exercise"]) for r in result.frame.iter_rows(named=True)
    }


def _reorder(fixture: Fixture, order: list[int], target: Path) -> Path:
    """The fixture's rows in `order` (indices into its rows without the duplicated-id ones, whose kept twin
    depends on order by design), written as the same format."""
    rows = [row for row, fate in sorted(fixture.expected.items()) if fate != drops.DROP_DUPLICATE_SYNTH_ID]
    if fixture.path.suffix == ".jsonl":
        lines = [line for line in fixture.path.read_text(encoding="utf-8").split("\n") if line.strip()]
        target.write_text("".join(lines[rows[i]] + "\n" for i in order), encoding="utf-8")
    else:
        table = pq.read_table(fixture.path)
        pq.write_table(table.take(pa.array([rows[i] for i in order])), target)
    return target


SHUFFLED = ("nemotron_math_v2", "competition_math", "ultrachat_200k", "oasst1", "anthropic_helpfulness")


@pytest.mark.parametrize("source", SHUFFLED)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_ids_and_content_do_not_depend_on_row_order(source, fixtures, tmp_path, data):
    fixture = _fixture(fixtures, source)
    n = sum(fate != drops.DROP_DUPLICATE_SYNTH_ID for fate in fixture.expected.values())
    order = data.draw(st.permutations(range(n)))
    adapter = ADAPTERS[source]
    baseline = harmonize_source(_reorder(fixture, list(range(n)), tmp_path / f"a{fixture.path.suffix}"), adapter)
    shuffled = harmonize_source(_reorder(fixture, order, tmp_path / f"b{fixture.path.suffix}"), adapter)
    assert _content(shuffled) == _content(baseline)
    assert shuffled.report.dropped == baseline.report.dropped


# --- files in the wrong schema ---------------------------------------------------------------------------------
def test_a_file_in_the_wrong_schema_is_refused_naming_file_column_expected_and_actual(tmp_path):
    for source, (path, column, expected, actual) in wrong_schema_shards(tmp_path).items():
        with pytest.raises(InputFileError) as caught:
            harmonize_source(path, ADAPTERS[source])
        message = str(caught.value)
        assert str(path) in message and repr(column) in message, message
        assert expected in message and actual in message, message


def test_unreadable_files_are_refused_naming_the_file(tmp_path):
    not_parquet = tmp_path / "x.parquet"
    not_parquet.write_text("not parquet")
    with pytest.raises(InputFileError, match="not a readable Parquet file"):
        harmonize_source(not_parquet, ADAPTERS["oasst1"])
    with pytest.raises(InputFileError, match="not a readable JSONL file"):
        harmonize_source(tmp_path / "absent.jsonl", ADAPTERS["nemotron_math_v2"])


def test_a_file_that_is_not_json_lines_is_refused_whole(fixtures, tmp_path):
    """A gzip-compressed JSONL file, or one JSON array pretty-printed over many lines: no line is a JSON object,
    so the file is refused (naming it) instead of every line being dropped as invalid_json_line."""
    fixture = _fixture(fixtures, "nemotron_math_v2")
    rows = [json.loads(line) for line in fixture.path.read_text().splitlines()[:2]]
    for name, data in [
        ("low.jsonl", gzip.compress(fixture.path.read_bytes())),
        ("array.jsonl", json.dumps(rows, indent=2).encode()),
    ]:
        path = tmp_path / name
        path.write_bytes(data)
        with pytest.raises(InputFileError, match=f"{path}: not a JSONL file: none of its .* lines is a JSON object"):
            harmonize_source(path, ADAPTERS["nemotron_math_v2"])


def test_a_jsonl_shard_with_a_byte_order_mark_gives_the_same_rows(fixtures, results, tmp_path):
    """A UTF-8 BOM some editors write before the first line is not part of it (json.loads would refuse it)."""
    fixture = _fixture(fixtures, "nemotron_math_v2")
    marked = tmp_path / fixture.path.name
    marked.write_bytes(b"\xef\xbb\xbf" + fixture.path.read_bytes())
    result = harmonize_source(marked, ADAPTERS[fixture.source], shard=f"{fixture.source}/{fixture.path.name}")
    assert result.frame.equals(results[fixture.path].frame)
    assert result.report.dropped == results[fixture.path].report.dropped


def test_other_arrow_encodings_of_the_published_types_give_the_same_rows(fixtures, results, tmp_path):
    """large_string, dictionary-encoded and all-null columns are read as the published strings."""
    fixture = _fixture(fixtures, "competition_math")
    table = pq.read_table(fixture.path)
    recoded = pa.table(
        {
            "problem": table["problem"].cast(pa.large_string()),
            "level": table["level"].dictionary_encode(),
            "type": pa.nulls(table.num_rows, pa.null()),
            "solution": table["solution"],
        }
    )
    path = tmp_path / "recoded.parquet"
    pq.write_table(recoded, path)
    result = harmonize_source(path, ADAPTERS["competition_math"])
    assert _content(result) == _content(results[fixture.path])
    assert result.report.dropped == results[fixture.path].report.dropped


# --- every conversation renders, masks on assistant messages only ----------------------------------------------
def test_every_conversation_renders_and_masks_only_the_last_assistant_reply(results, renderer, encoding):
    start = encoding.encode("<|start|>", allowed_special="all")[0]
    with_analysis = 0
    for result in results.values():
        for row in result.frame.iter_rows(named=True):
            messages = json.loads(row["messages_json"])["messages"]
            rendered = renderer.render(messages)
            tokens = rendered.tokens
            starts = np.flatnonzero(tokens == start)
            assert len(starts) == len(messages) and tokens[-1] == constants.EOD_TOKEN_ID
            owner = np.searchsorted(starts, np.arange(len(tokens) - 1), side="right") - 1
            # only the reply after the last user turn is supervised: history assistant turns are context
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            for position in range(1, len(tokens) - 1):  # label position p describes token p + 1
                message = messages[owner[position]]
                expected = constants.SPAN_PROMPT
                if message["role"] == "assistant" and owner[position] > last_user:
                    expected = constants.CHANNEL_TO_SPAN[message["channel"]]
                assert rendered.span_id[position - 1] == expected, (row["synth_id"], position)
                assert rendered.loss_mask[position - 1] == (expected != constants.SPAN_PROMPT)
            for message, begin, end in zip(messages, starts, [*starts[1:], len(tokens) - 1]):
                text = encoding.decode(tokens[begin:end].tolist())
                assert message["content"][0]["text"] in text if message["role"] != "system" else True
            counts = rendered.span_token_counts()
            assert counts["final"] > 0
            has_analysis = any(m.get("channel") == "analysis" for m in messages)
            assert (counts["analysis"] > 0) == has_analysis
            with_analysis += has_analysis
    assert with_analysis >= 4  # the reasoning-bearing rows (separate field, <think> blocks) render analysis


def test_a_wrong_type_names_the_nested_field_and_a_bad_line_its_reason(fixtures, results):
    """The error log says which item of which field has which JSON type, not only the top-level column."""
    result = results[_fixture(fixtures, "nemotron_math_v2").path]
    details = {(e["reason"], e["detail"]) for e in result.report.errors}
    assert (drops.DROP_WRONG_TYPE, "'messages'[0]['role'] is a JSON number, expected string") in details
    assert any(detail.startswith("'messages' is a JSON string, expected list<") for _, detail in details)
    assert (drops.DROP_INVALID_JSON_LINE, "not Unicode text: a string holds the lone surrogate '\\ud800'") in details
    assert any(reason == drops.DROP_INVALID_JSON_LINE and "recursion" in detail for reason, detail in details)
