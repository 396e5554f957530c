"""The fast renderer gives byte-identical tokens and masks to openai-harmony, or routes the row there."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import Conversation, Message, ReasoningEffort, Role, SystemContent

from synthkd_assets.core.render import FastRenderer, RenderError
from synthkd_assets.core.stages import harmonize_shard
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.core.tokenizer import load_tiktoken_o200k
from synthkd_contract import drops
from synthkd_dev.make_harmony_artifact import SYSTEM_MESSAGE

SYSTEM = system_message_dict()


@pytest.fixture(scope="module")
def fast(encoding, tokenizer_dir) -> FastRenderer:
    return FastRenderer(encoding, load_tiktoken_o200k(tokenizer_dir))


def assert_identical(fast: FastRenderer, reference, conversations: list[list[dict]]) -> None:
    for got, messages in zip(fast.render_many(conversations), conversations):
        want = reference.render(messages)
        assert got.tokens.dtype == want.tokens.dtype and got.span_id.dtype == want.span_id.dtype
        assert got.tokens.tobytes() == want.tokens.tobytes()
        assert got.loss_mask.tobytes() == want.loss_mask.tobytes()
        assert got.span_id.tobytes() == want.span_id.tobytes()


def test_every_sample_row_is_byte_identical(tmp_path, sample_shards, fast, renderer):
    routed = fast.routed_to_reference
    total = 0
    for shard in sample_shards:
        out = tmp_path / f"{shard.stem}.parquet"
        harmonize_shard(shard, out, SYSTEM, shard.stem)
        conversations = [json.loads(m)["messages"] for m in pl.read_parquet(out)["messages_json"]]
        assert_identical(fast, renderer, conversations)
        total += len(conversations)
    assert total == 3149 and fast.routed_to_reference == routed  # all of SYNTH's shapes take the fast path


MARKERS = [
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|return|>",
    "<|endoftext|>",
    "<|call|>",
    "<|reserved_200013|>",
]
SCRIPTS = [
    "Ünïcödé",
    "漢字かな",
    "Ελληνικά",
    "עברית",
    "العربية",
    "हिन्दी",
    "🙂",
    "👩‍🔬",
    "\u200b",
    "\r\n",
    "\t",
    "  ",
    "\x1c",
]
text = st.lists(
    st.one_of(
        st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=40),
        st.sampled_from(MARKERS + SCRIPTS),
    ),
    max_size=8,
).map("".join)
system_contents = st.builds(
    lambda effort, identity, date, cutoff: (
        SystemContent.new()
        .with_reasoning_effort(effort)
        .with_model_identity(identity)
        .with_conversation_start_date(date)
        .with_knowledge_cutoff(cutoff)
    ),
    st.sampled_from(list(ReasoningEffort)),
    st.sampled_from(["You are ChatGPT, a large language model trained by OpenAI.", "You are a student model."]),
    st.sampled_from(["2025-06-28", "2026-11-22"]),
    st.sampled_from(["2024-06", "2025-01"]),
)


def conversation(system: SystemContent, user: str, analysis: str | None, final: str) -> list[dict]:
    messages = [Message.from_role_and_content(Role.SYSTEM, system), Message.from_role_and_content(Role.USER, user)]
    if analysis is not None:
        messages.append(Message.from_role_and_content(Role.ASSISTANT, analysis).with_channel("analysis"))
    messages.append(Message.from_role_and_content(Role.ASSISTANT, final).with_channel("final"))
    return [json.loads(m.to_json()) for m in messages]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(system=system_contents, user=text, analysis=st.none() | text, final=text)
def test_generated_conversations_are_byte_identical(fast, renderer, system, user, analysis, final):
    """Whitespace at boundaries, literal special-token text, every script, emoji, empty channels, any system."""
    routed = fast.routed_to_reference
    assert_identical(fast, renderer, [conversation(system, user, analysis, final)])
    assert fast.routed_to_reference == routed


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(turns=st.lists(st.tuples(text, text), min_size=2, max_size=4), analysis=st.none() | text)
def test_multi_turn_conversations_are_byte_identical_and_supervise_only_the_last_reply(fast, renderer, turns, analysis):
    """An anchor source's history (user, assistant, user, ...): both renderers agree, and only the reply after the
    last user turn carries loss (every earlier assistant turn is context, span 0)."""
    messages = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new())]
    for user, reply in turns[:-1]:
        messages.append(Message.from_role_and_content(Role.USER, user))
        messages.append(Message.from_role_and_content(Role.ASSISTANT, reply).with_channel("final"))
    messages.append(Message.from_role_and_content(Role.USER, turns[-1][0]))
    if analysis is not None:
        messages.append(Message.from_role_and_content(Role.ASSISTANT, analysis).with_channel("analysis"))
    messages.append(Message.from_role_and_content(Role.ASSISTANT, turns[-1][1]).with_channel("final"))
    dicts = [json.loads(m.to_json()) for m in messages]
    assert_identical(fast, renderer, [dicts])
    # the oracle: where the loss sits relative to the completion prefix is exactly what it is for the single-turn
    # conversation [system, last user, reply]; the history only shifts it (so none of the history is supervised)
    reply = dicts[-2:] if analysis is not None else dicts[-1:]
    single = [dicts[0], dicts[-len(reply) - 1], *reply]
    want = supervised_around_prefix(renderer, single, len(reply))
    assert supervised_around_prefix(renderer, dicts, len(reply)) == want


def supervised_around_prefix(renderer, messages: list[dict], reply: int) -> tuple[int, int, bool]:
    """(first supervised label - completion prefix length, tokens - last supervised label, contiguous)."""
    rendered = renderer.render(messages)
    prefix = renderer.encoding.render_conversation_for_completion(
        Conversation.from_messages([Message.from_dict(m) for m in messages[:-reply]]), Role.ASSISTANT
    )
    labels = np.flatnonzero(rendered.loss_mask)
    return labels[0] - len(prefix), len(rendered.tokens) - labels[-1], len(labels) == labels[-1] - labels[0] + 1


def test_empty_contents_are_byte_identical(fast, renderer):
    assert_identical(
        fast, renderer, [conversation(SystemContent.new(), "", "", ""), conversation(SystemContent.new(), "", None, "")]
    )


def test_other_shapes_are_routed_to_the_reference_and_counted(fast, renderer):
    base = conversation(SystemContent.new(), "q", "think", "answer")
    ending_in_analysis = base[:-1]
    with_recipient = [*base[:-1], {**base[-1], "recipient": "functions.lookup"}]
    routed = fast.routed_to_reference
    assert_identical(fast, renderer, [ending_in_analysis, with_recipient])
    assert fast.routed_to_reference == routed + 2


def artifact_conversation(system: dict, instructions: str, user: str, analysis: str, final: str) -> list[dict]:
    """A synth_harmony_v1 artifact row's messages, as its converter writes the dicts (no `name` keys)."""
    return [
        system,
        {"role": "developer", "content": [{"type": "developer_content", "instructions": instructions}]},
        {"role": "user", "content": [{"type": "text", "text": user}]},
        {"role": "assistant", "content": [{"type": "text", "text": analysis}], "channel": "analysis"},
        {"role": "assistant", "content": [{"type": "text", "text": final}], "channel": "final"},
    ]


artifact_systems = st.builds(
    lambda effort, identity, date, cutoff, channels: {
        "role": "system",
        "content": [
            {
                "type": "system_content",
                "model_identity": identity,
                "reasoning_effort": effort,
                "conversation_start_date": date,
                "knowledge_cutoff": cutoff,
                "channel_config": {"valid_channels": channels, "channel_required": True},
            }
        ],
    },
    st.sampled_from(["Low", "Medium", "High"]),
    st.sampled_from(["You are ChatGPT, a large language model trained by OpenAI.", "Tu es un modèle étudiant."]),
    st.sampled_from(["2026-01-01", "2025-06-28"]),
    st.sampled_from(["2024-06", "2025-01"]),
    st.sampled_from([["analysis", "commentary", "final"], ["analysis", "final"]]),
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(system=artifact_systems, instructions=text, user=text, analysis=text, final=text)
def test_artifact_conversations_with_system_and_developer_are_rendered_fast_and_identical(
    fast, renderer, system, instructions, user, analysis, final
):
    """The synth_harmony_v1 artifact's shape (structured system content, developer instructions): the fast path
    takes it, byte-identical to openai-harmony, system and developer tokens masked."""
    routed = fast.routed_to_reference
    messages = artifact_conversation(system, instructions, user, analysis, final)
    assert_identical(fast, renderer, [messages])
    assert fast.routed_to_reference == routed
    rendered = fast.render_many([messages])[0]
    context = len(renderer.encoding.render(Message.from_dict(system))) + len(
        renderer.encoding.render(Message.from_dict(messages[1]))
    )
    assert not rendered.loss_mask[: context - 1].any() and not rendered.span_id[: context - 1].any()


def test_render_errors_match_the_reference(fast):
    bad = conversation(SystemContent.new(), "q", None, "a")
    bad[-1]["channel"] = "commentary"
    [result] = fast.render_many([bad])
    assert isinstance(result, RenderError) and result.reason == drops.DROP_UNSUPPORTED_CHANNEL


def test_text_the_tokenizer_cannot_encode_drops_only_its_conversation(fast):
    """tiktoken's regex overflows on ~1M identical whitespace characters: that row is a counted
    RenderError, its neighbours render normally."""
    good = conversation(SystemContent.new(), "q", None, "fine")
    bad = conversation(SystemContent.new(), "q", None, " " * 1_000_000)
    results = fast.render_many([good, bad, good])
    assert not isinstance(results[0], RenderError) and not isinstance(results[2], RenderError)
    assert isinstance(results[1], RenderError) and results[1].reason == drops.DROP_TOKENIZER_ERROR


def test_a_system_or_developer_message_harmony_refuses_drops_only_its_conversation(fast, renderer):
    """A structured system content openai-harmony cannot parse (an artifact row's `reasoning_effort: "Extreme"`)
    is that conversation's render error, as the reference renderer says, not a failed step."""
    good = artifact_conversation(SYSTEM_MESSAGE, "Be brief.", "q", "think", "answer")
    bad_system = {"role": "system", "content": [{**SYSTEM_MESSAGE["content"][0], "reasoning_effort": "Extreme"}]}
    bad = [bad_system, *good[1:]]
    got = fast.render_many([good, bad])
    assert not isinstance(got[0], RenderError)
    assert isinstance(got[1], RenderError) and got[1].reason == drops.DROP_HARMONY_RENDER_ERROR
    with pytest.raises(RenderError):
        renderer.render(bad)
