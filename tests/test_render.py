"""Stored tokens equal openai-harmony's own render plus EOD; masks equal an independent derivation."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import Conversation, Message

from synthkd_assets.core.render import RENDER_CONFIG, RenderError
from synthkd_assets.core.stages import harmonize_shard
from synthkd_assets.core.synth import messages_json_expr, reference_messages, system_message_dict
from synthkd_contract import constants, drops

SYSTEM = system_message_dict()
TEXT_COLUMNS = ("query", "query_seed_text", "synthetic_reasoning", "synthetic_answer")


def independent_masks(encoding, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Render every message on its own and label each of its tokens: the oracle for the masks."""
    token_spans: list[int] = []
    for message in messages:
        n = len(encoding.render(Message.from_dict(message)))
        if message["role"] == "assistant":
            span = {"analysis": 1, "final": 2}[message["channel"]]
        else:
            span = 0
        token_spans.extend([span] * n)
    token_spans.append(0)  # EOD
    labels = token_spans[1:] + [0]  # position i describes token i + 1; the EOD position is 0/0
    span_id = np.array(labels, dtype=np.uint8)
    return (span_id > 0).astype(np.uint8), span_id


def harmony_tokens(encoding, messages: list[dict]) -> list[int]:
    conversation = Conversation.from_messages([Message.from_dict(m) for m in messages])
    return encoding.render_conversation_for_training(conversation, RENDER_CONFIG) + [constants.EOD_TOKEN_ID]


def assert_matches_reference(encoding, renderer, messages: list[dict]) -> None:
    rendered = renderer.render(messages)
    assert (
        rendered.tokens.dtype == np.int32
        and rendered.loss_mask.dtype == np.uint8
        and rendered.span_id.dtype == np.uint8
    )
    assert rendered.tokens.tolist() == harmony_tokens(encoding, messages)
    loss_mask, span_id = independent_masks(encoding, messages)
    np.testing.assert_array_equal(rendered.span_id, span_id)
    np.testing.assert_array_equal(rendered.loss_mask, loss_mask)
    assert len(rendered.tokens) == len(rendered.loss_mask) == len(rendered.span_id)
    assert rendered.tokens[-1] == constants.EOD_TOKEN_ID and rendered.loss_mask[-1] == 0 and rendered.span_id[-1] == 0
    # the token predicted at the last supervised position is <|return|>, whose label position is 0 (it predicts EOD)
    assert encoding.decode([int(rendered.tokens[-2])]) == "<|return|>" and rendered.loss_mask[-2] == 0


def one_row_messages(row: dict[str, str]) -> list[dict]:
    """Messages as the pipeline builds them: the vectorized polars expression over a one-row frame."""
    frame = pl.DataFrame({c: [row[c]] for c in TEXT_COLUMNS}, schema={c: pl.String for c in TEXT_COLUMNS})
    return json.loads(frame.select(messages_json_expr(SYSTEM)).item())["messages"]


def test_sample_rows_render_exactly(tmp_path, sample_shards, encoding, renderer):
    """Hundreds of real sample rows: polars messages == harmony objects, tokens == harmony render + EOD."""
    checked = 0
    for shard in sample_shards:
        out = tmp_path / f"{shard.stem}.parquet"
        harmonize_shard(shard, out, SYSTEM, shard.stem)
        raw = pl.read_parquet(shard).with_row_index("source_row")
        built = pl.read_parquet(out).join(raw, on="source_row", suffix="_raw")
        for row in built.head(120).iter_rows(named=True):
            clean = {c: row[c].replace("\x00", "") for c in TEXT_COLUMNS}
            messages = json.loads(row["messages_json"])["messages"]
            assert messages == reference_messages(clean, SYSTEM)
            assert_matches_reference(encoding, renderer, messages)
            checked += 1
    assert checked >= 400


def test_reasoning_rule_uses_python_strip(encoding, renderer):
    """Blank reasoning (any Python whitespace, including \\x1c-\\x1f) gives no analysis message."""
    for reasoning, expect_analysis in [("", False), (" \n\t", False), ("\x1c\x1f\u3000", False), (" x ", True)]:
        messages = one_row_messages(
            {"query": "q", "query_seed_text": "s", "synthetic_reasoning": reasoning, "synthetic_answer": "a"}
        )
        assert any(m.get("channel") == "analysis" for m in messages) == expect_analysis
        assert_matches_reference(encoding, renderer, messages)


def test_user_content_template():
    messages = one_row_messages(
        {"query": "Q?", "query_seed_text": "Seed.", "synthetic_reasoning": "", "synthetic_answer": "A"}
    )
    assert messages[1]["content"][0]["text"] == "Q?\n\nReference:\nSeed."
    assert messages[0] == SYSTEM and [m["role"] for m in messages] == ["system", "user", "assistant"]


def test_unsupported_assistant_channel_is_a_counted_render_error(renderer):
    messages = one_row_messages(
        {"query": "q", "query_seed_text": "s", "synthetic_reasoning": "", "synthetic_answer": "a"}
    )
    messages[-1]["channel"] = "commentary"
    with pytest.raises(RenderError) as info:
        renderer.render(messages)
    assert info.value.reason == drops.DROP_UNSUPPORTED_CHANNEL


HARMONY_MARKERS = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
    "<|endoftext|>",
    "<|call|>",
    "<|constrain|>",
]
surrogate_free_text = st.text(
    alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=60
)
tricky_text = st.lists(
    st.one_of(surrogate_free_text, st.sampled_from(HARMONY_MARKERS + [" ", "\n", "\t", "🙂", "👩‍🔬", "漢字"])),
    max_size=6,
).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(query=tricky_text, seed=tricky_text, reasoning=tricky_text, answer=tricky_text)
def test_generated_text_renders_exactly(encoding, renderer, query, seed, reasoning, answer):
    row = {"query": query, "query_seed_text": seed, "synthetic_reasoning": reasoning, "synthetic_answer": answer}
    messages = one_row_messages(row)
    assert messages == reference_messages(row, SYSTEM)
    assert_matches_reference(encoding, renderer, messages)
