"""The Harmony round-trip: written tokens parse back (openai-harmony) to exactly their synth_harmony messages, on
the built sample and on hostile text; one corrupted token fails it, and the blocking check names the synth_id."""

from __future__ import annotations

import copy
import json
import shutil

import dagster as dg
import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import ReasoningEffort, SystemContent

from synthkd_assets.core import round_trip
from synthkd_assets.core.render import FastRenderer, RenderError
from synthkd_assets.core.round_trip import WHOLE, RoundTripChecker, paired_conversations, round_trip_shard
from synthkd_assets.core.stages import TokenizeStep
from synthkd_assets.core.steps import run_step
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.core.tokenizer import load_tiktoken_o200k
from synthkd_assets.defs.passes import INVENTORY_STEPS, PLAN_STEPS, SCAN_STEPS
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract import constants
from tests.helpers import SAMPLE_RAW_DIR, run
from tests.test_fast_render import conversation, system_contents
from tests.test_fast_render import text as hostile_text
from tests.test_fuzz import messages as any_structure

SMALL_SHARD = "synth_005"  # 54 rows, 51 pass the filters: every exercise, final with or without analysis


@pytest.fixture(scope="module")
def fast(encoding, tokenizer_dir) -> FastRenderer:
    return FastRenderer(encoding, load_tiktoken_o200k(tokenizer_dir))


@pytest.fixture(scope="module")
def checker(encoding, tokenizer_dir) -> RoundTripChecker:
    """The build's checker: the fast way first (cached headers, tiktoken decode), the full parse for the rest."""
    return RoundTripChecker(encoding, load_tiktoken_o200k(tokenizer_dir))


def token_id(encoding, text: str) -> int:
    [token] = encoding.encode(text, allowed_special="all")
    return token


def test_every_conversation_of_the_built_sample_round_trips(built_sample, encoding):
    """Against synth_harmony's own file (the rows before filtering and sampling), and as the build's check saw it."""
    instance, layout, _ = built_sample
    paths = layout.data_layout()
    checked = 0
    for shard in sorted(p.stem for p in SAMPLE_RAW_DIR.glob("*.parquet")):
        tokenized = paths.stage_output("synth_tokenized", shard)
        result = round_trip_shard(tokenized, paths.stage_output("synth_harmony", shard), encoding)
        assert result.mismatches == [] and result.conversations == pl.read_parquet(tokenized).height
        checked += result.conversations
    assert checked == 1153  # every row the build wrote (rows_out of the sample's datasets)
    key = dg.AssetCheckKey(dg.AssetKey("synth_tokenized"), "harmony_round_trip")
    latest = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
    assert latest.event.dagster_event.event_specific_data.passed


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    system=system_contents,
    user=hostile_text,
    analysis=st.none() | hostile_text,
    final=hostile_text | st.just("\x00<|start|>assistant<|channel|>final<|message|>\x00<|return|>"),
)
def test_hostile_text_round_trips(fast, checker, system, user, analysis, final):
    """Literal Harmony markers, NUL, CJK, emoji, every whitespace, any system content: parsed back verbatim, and
    confirmed the fast way (no conversation of the build's shape needs the full parse)."""
    messages = conversation(system, user, analysis, final)
    [rendered] = fast.render_many([messages])
    confirmed = checker.checked_fast
    assert checker.check("hostile", rendered.tokens, messages) == []
    assert checker.checked_fast == confirmed + 1
    assert checker._check_full("hostile", rendered.tokens, messages) == []


SPECIAL_IDS = st.sampled_from([constants.EOD_TOKEN_ID, *range(constants.ORDINARY_VOCAB_SIZE + 2, 200019)])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    system=system_contents,
    user=hostile_text,
    analysis=st.none() | hostile_text,
    final=hostile_text,
    edits=st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, constants.ORDINARY_VOCAB_SIZE - 1) | SPECIAL_IDS),
        min_size=1,
        max_size=3,
    ),
    cut=st.none() | st.floats(0, 1),
)
def test_the_fast_way_agrees_with_the_full_parse_on_corrupted_tokens(
    fast, checker, system, user, analysis, final, edits, cut
):
    """Any token changed (ordinary or special: a content cut short, a terminator moved, an id past the BPE, half a
    UTF-8 character) or the conversation truncated: exactly the full openai-harmony parse's mismatches. The fast
    way can only confirm, so this fails only if it confirms a conversation the full parse rejects."""
    messages = conversation(system, user, analysis, final)
    [rendered] = fast.render_many([messages])
    tokens = np.array(rendered.tokens, copy=True)
    for where, value in edits:
        tokens[int(where * len(tokens))] = value
    if cut is not None:
        tokens = tokens[: int(cut * len(tokens))]
    assert checker.check("corrupted", tokens, messages) == checker._check_full("corrupted", tokens, messages)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.lists(st.integers(0, constants.ORDINARY_VOCAB_SIZE - 1), max_size=40), chunk=st.integers(1, 8))
def test_the_fast_way_decodes_contents_as_tiktoken_does(checker, tokenizer_dir, tokens, chunk, monkeypatch):
    """The fast way's gather from the vocabulary's bytes is tiktoken's own decode, across its chunk boundaries."""
    monkeypatch.setattr(round_trip, "DECODE_TOKENS", chunk)
    expected = load_tiktoken_o200k(tokenizer_dir).decode_bytes(tokens)
    assert checker._decode(np.array(tokens, dtype=np.int64)) == expected


def test_a_negative_token_is_never_confirmed(checker, sample_row):
    """No token id is negative; numpy would wrap one round the vocabulary, so the fast way leaves it to the full
    parse, which rejects it."""
    synth_id, tokens, messages = sample_row
    broken = np.array(tokens, dtype=np.int64)
    broken[-3] = -1 - constants.ORDINARY_VOCAB_SIZE + int(tokens[-3])  # wraps round to the same token
    confirmed = checker.checked_fast
    mismatches = checker.check(synth_id, broken, messages)
    assert (
        checker.checked_fast == confirmed
        and mismatches
        and mismatches == checker._check_full(synth_id, broken, messages)
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(
        st.tuples(
            hostile_text,
            st.none() | hostile_text,
            hostile_text,
            st.none() | st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 200018)),
            st.booleans(),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_batch_reports_exactly_the_full_parse_of_each_conversation_in_order(fast, checker, rows):
    """Good, corrupted and unpaired conversations mixed in one batch: one conversation's shape never confirms or
    condemns another, and the mismatches come in conversation order."""
    batch, expected = [], []
    for index, (user, analysis, final, edit, paired) in enumerate(rows):
        messages = conversation(SystemContent.new(), user, analysis, final)
        [rendered] = fast.render_many([messages])
        tokens = np.array(rendered.tokens, copy=True)
        if edit is not None:
            tokens[int(edit[0] * len(tokens))] = edit[1]
        synth_id = f"row{index}"
        batch.append((synth_id, tokens, messages if paired else None))
        if paired:
            expected.extend(checker._check_full(synth_id, tokens, messages))
        else:
            expected.append(("pairing", synth_id))
    got = checker.check_many(batch)
    assert got.conversations == len(rows)
    assert [("pairing", m.synth_id) if m.field == "pairing" else m for m in got.mismatches] == expected


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(messages=any_structure())
def test_any_structure_the_renderer_accepts_round_trips(renderer, checker, messages):
    """Roles, channels and recipients SYNTH never has: whatever the reference renderer writes parses back."""
    try:
        rendered = renderer.render(messages)
    except RenderError:
        return
    assert checker.check("structure", rendered.tokens, messages) == []


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(structure=any_structure(), system=system_contents, user=hostile_text, final=hostile_text)
def test_rendering_leaves_the_messages_the_step_checks_against_unchanged(fast, structure, system, user, final):
    """The tokenize step checks the tokens against the very message dicts the renderer read
    (`TokenizeStep` with a checker): rendering them, by the fast way or handed to openai-harmony's, changes none."""
    batch = [structure, conversation(system, user, None, final)]
    before = copy.deepcopy(batch)
    fast.render_many(batch)
    assert batch == before


@pytest.mark.parametrize("recipient", [None, "functions.lookup"])
@pytest.mark.parametrize("channel", [None, "analysis", "commentary", "final"])
@pytest.mark.parametrize("role", ["assistant", "user", "tool"])
def test_every_last_message_shape_round_trips_with_harmonys_terminator(renderer, checker, role, channel, recipient):
    """The terminator before the EOD is openai-harmony's for the last message: <|return|> after an assistant
    final, <|call|> after another assistant message with a recipient (a tool call), <|end|> otherwise (the case
    hypothesis found: an assistant analysis message to functions.lookup, expected <|end|>, rendered <|call|>)."""
    last = {"role": role, "name": None, "content": [{"type": "text", "text": "x"}]}  # as tests/test_fuzz.py draws
    last.update({key: value for key, value in (("channel", channel), ("recipient", recipient)) if value})
    messages = [{"role": "user", "name": None, "content": [{"type": "text", "text": "q"}]}, last]
    try:
        rendered = renderer.render(messages)
    except RenderError:  # a shape the v1 render refuses (an assistant channel with no span): nothing written
        return
    assert checker.check("last", rendered.tokens, messages) == []
    if role == "assistant" and channel == "final":
        terminator = checker.return_id
    elif role == "assistant" and recipient:
        terminator = checker.call_id
    else:
        terminator = checker.end_id
    assert rendered.tokens[-2] == terminator


@pytest.fixture(scope="module")
def sample_row(built_sample):
    """A built conversation with analysis and final: (synth_id, tokens, messages)."""
    _, layout, _ = built_sample
    paths = layout.data_layout()
    pairs = paired_conversations(
        paths.stage_output("synth_tokenized", "synth_001"), paths.stage_output("synth_harmony", "synth_001")
    )
    return next(
        (sid, tokens, m) for sid, tokens, m in pairs if [x.get("channel") for x in m][2:] == ["analysis", "final"]
    )


def corrupted(tokens: np.ndarray, at: int, value: int) -> np.ndarray:
    copy = np.array(tokens, copy=True)
    copy[at] = value
    return copy


def test_a_changed_content_token_is_a_text_mismatch_of_its_message(encoding, checker, sample_row):
    synth_id, tokens, messages = sample_row
    assert checker.check(synth_id, tokens, messages) == []
    # the last token of the final answer: before <|return|> and the EOD
    [mismatch] = checker.check(synth_id, corrupted(tokens, -3, tokens[-3] + 1), messages)
    assert (mismatch.synth_id, mismatch.message_index, mismatch.field.split()[0]) == (synth_id, 3, "text")
    assert mismatch.expected != mismatch.got and synth_id in str(mismatch)


def test_a_changed_channel_token_is_a_channel_mismatch(encoding, checker, sample_row):
    synth_id, tokens, messages = sample_row
    final, analysis, channel = (token_id(encoding, t) for t in ("final", "analysis", "<|channel|>"))
    at = int(np.flatnonzero((tokens[:-1] == channel) & (tokens[1:] == final))[0]) + 1
    [mismatch] = checker.check(synth_id, corrupted(tokens, at, analysis), messages)
    assert (mismatch.message_index, mismatch.field, mismatch.expected, mismatch.got) == (
        3,
        "channel",
        "final",
        "analysis",
    )


def test_a_changed_wrapper_token_fails_the_parse(encoding, checker, sample_row):
    synth_id, tokens, messages = sample_row
    at = int(np.flatnonzero(tokens == token_id(encoding, "<|message|>"))[1])  # the user message's
    [mismatch] = checker.check(synth_id, corrupted(tokens, at, token_id(encoding, "<|end|>")), messages)
    assert (mismatch.message_index, mismatch.field) == (WHOLE, "parse")


def test_the_end_of_the_conversation_is_checked(encoding, checker, sample_row):
    synth_id, tokens, messages = sample_row
    [no_eod] = checker.check(synth_id, tokens[:-1], messages)
    assert (no_eod.field, no_eod.expected) == ("eod", str(constants.EOD_TOKEN_ID))
    [end] = checker.check(synth_id, corrupted(tokens, -2, token_id(encoding, "<|end|>")), messages)
    want, got = (str(token_id(encoding, t)) for t in ("<|return|>", "<|end|>"))
    assert (end.field, end.expected, end.got) == ("terminator", want, got)


def test_a_missing_or_extra_message_is_named(encoding, checker, sample_row):
    synth_id, tokens, messages = sample_row
    without_analysis = [m for m in messages if m.get("channel") != "analysis"]
    found = checker.check(synth_id, tokens, without_analysis)
    assert found[0].field == "messages" and (found[0].expected, found[0].got) == ("3", "4")
    assert found[1].message_index == 2 and found[1].field == "channel"


def test_the_system_message_is_compared_as_harmony_renders_it(encoding, checker, sample_row):
    """A different stored system message (another reasoning effort) no longer matches the written tokens."""
    synth_id, tokens, messages = sample_row
    assert messages[0] == system_message_dict()
    other = system_message_dict(SystemContent.new().with_reasoning_effort(ReasoningEffort.HIGH))
    [mismatch] = checker.check(synth_id, tokens, [other, *messages[1:]])
    assert (mismatch.message_index, mismatch.field.split()[0]) == (0, "text")
    assert "Reasoning: medium" in mismatch.got and "Reasoning: high" in mismatch.expected


def test_the_steps_round_trip_is_the_one_of_its_file_read_back(tmp_path, built_sample, encoding, fast, checker):
    """The step checks the arrays it writes; read back from the written file and paired with its input by synth_id
    (`round_trip_shard`), the same conversations give the same result, a corrupted one included."""
    _, layout, _ = built_sample
    sampled = layout.data_layout().stage_output("synth_sampled", SMALL_SHARD)
    render_many = fast.render_many

    def corrupting(conversations):
        results = render_many(conversations)
        results[7].tokens[-3] += 1
        return results

    fast.render_many = corrupting
    try:
        step = TokenizeStep(sampled, tmp_path / "t.parquet", fast, checker=checker)
        report, in_step = run_step(step, SMALL_SHARD), step.round_trip
    finally:
        del fast.render_many
    read_back = round_trip_shard(tmp_path / "t.parquet", sampled, encoding)
    assert in_step == read_back and in_step.conversations == report.rows_out > 10
    assert [m.synth_id for m in in_step.mismatches] == [pl.read_parquet(sampled)["synth_id"][7]]


def test_a_tokenized_row_without_its_harmony_row_is_a_pairing_mismatch(tmp_path, built_sample, encoding):
    _, layout, _ = built_sample
    paths = layout.data_layout()
    harmony = pl.read_parquet(paths.stage_output("synth_harmony", SMALL_SHARD))
    tokenized = paths.stage_output("synth_tokenized", SMALL_SHARD)
    missing = pl.read_parquet(tokenized, columns=["synth_id"])["synth_id"][5]  # a written row
    harmony.filter(pl.col("synth_id") != missing).write_parquet(tmp_path / "harmony.parquet")
    result = round_trip_shard(tokenized, tmp_path / "harmony.parquet", encoding)
    assert result.mismatches[0].synth_id == missing and result.mismatches[0].field == "pairing"


@pytest.fixture
def sampled_small_shard(tmp_path):
    """A fresh instance and data root holding one raw shard built up to synth_sampled."""
    raw = tmp_path / "raw"
    raw.mkdir()
    shutil.copy(SAMPLE_RAW_DIR / f"{SMALL_SHARD}.parquet", raw)
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(tmp_path / "data"))
    with dg.DagsterInstance.ephemeral() as instance:
        run(instance, layout, INVENTORY_STEPS)
        run(instance, layout, SCAN_STEPS, SMALL_SHARD)
        run(instance, layout, PLAN_STEPS)
        run(instance, layout, ["synth_sampled"], SMALL_SHARD)
        yield instance, layout


def round_trip_evaluation(result: dg.ExecuteInProcessResult):
    [evaluation] = [e for e in result.get_asset_check_evaluations() if e.check_name == "harmony_round_trip"]
    return evaluation


def test_the_blocking_check_passes_in_the_tokenize_step(sampled_small_shard):
    instance, layout = sampled_small_shard
    result = run(instance, layout, ["synth_tokenized"], SMALL_SHARD)
    evaluation = round_trip_evaluation(result)
    # every conversation synth_sampled kept (the shard alone: its held-out clusters leave it)
    written = pl.read_parquet(layout.data_layout().stage_output("synth_sampled", SMALL_SHARD)).height
    assert written > 10 and evaluation.passed and evaluation.metadata["conversations_checked"].value == written
    assert evaluation.metadata["mismatches"].value == 0
    assert (
        evaluation.description
        == f"partition {SMALL_SHARD}: passed: {written} conversations parse back to their " + ("synth_harmony messages")
    )


def test_a_corrupted_token_fails_the_blocking_check_and_stops_downstream(sampled_small_shard, monkeypatch):
    """The renderer writes one wrong content token into the 4th conversation (the last token of its final answer):
    the check fails naming its synth_id and its final message, and synth_kd_v1 of the same run never runs."""
    instance, layout = sampled_small_shard
    render_many = FastRenderer.render_many

    def corrupting(self, conversations):
        results = render_many(self, conversations)
        results[3].tokens[-3] += 1
        return results

    monkeypatch.setattr(FastRenderer, "render_many", corrupting)
    result = run(instance, layout, ["synth_tokenized", "synth_kd_v1"], SMALL_SHARD, raise_on_error=False)
    evaluation = round_trip_evaluation(result)
    sampled = pl.read_parquet(layout.data_layout().stage_output("synth_sampled", SMALL_SHARD))
    corrupted_id = sampled["synth_id"][3]
    messages = json.loads(sampled["messages_json"][3])["messages"]
    final = len(messages) - 1  # system, user, [analysis,] final: SYNTH leaves some reasoning empty
    assert messages[final]["channel"] == "final"
    assert not evaluation.passed and evaluation.metadata["mismatches"].value == 1
    assert evaluation.description.startswith(
        f"partition {SMALL_SHARD}: FAILED, 1 problem: {corrupted_id} message {final}: text "
    )
    assert evaluation.metadata["first_mismatches"].records[0].data["synth_id"] == corrupted_id  # a table in the UI
    materialized = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    assert "synth_kd_v1" not in materialized and not result.success
