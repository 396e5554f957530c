"""Where the DistillKit completion starts (`assistant_token_start`): read off each tokenized row's own arrays by
`CompletionPrefixes`, equal to openai-harmony's `render_conversation_for_completion` (the oracle) for every
conversation shape, and confirmed by openai-harmony on the rows the rule names."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openai_harmony import Message, Role, SystemContent

from synthkd_assets.core.distill_io import CompletionPrefixes, DistillContractError, completion_prefix
from synthkd_contract import constants
from synthkd_contract.labels import token_align

text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


def chat(turns: list[tuple[str, str]], analysis: str | None, history_analysis: bool = False) -> list[dict]:
    """system, then (user, assistant final) turns; the last turn's reply optionally opens with analysis."""
    messages = [Message.from_role_and_content(Role.SYSTEM, SystemContent.new())]
    for number, (user, reply) in enumerate(turns):
        messages.append(Message.from_role_and_content(Role.USER, user))
        last = number == len(turns) - 1
        if (last and analysis is not None) or (not last and history_analysis):
            thought = analysis if last else "thinking"
            messages.append(Message.from_role_and_content(Role.ASSISTANT, thought).with_channel("analysis"))
        messages.append(Message.from_role_and_content(Role.ASSISTANT, reply).with_channel("final"))
    return [json.loads(m.to_json()) for m in messages]


def row_arrays(renderer, messages: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, per-token spans) as synth_distill reads them from synth_tokenized."""
    rendered = renderer.render(messages)
    spans = token_align(rendered.span_id)[:-1]
    return rendered.tokens[:-1].astype(np.int32), spans


def oracle_start(encoding, messages: list[dict]) -> int:
    return len(completion_prefix(encoding, messages))


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(turns=st.lists(st.tuples(text, text), min_size=1, max_size=4), analysis=st.none() | text)
def test_the_derived_start_is_openai_harmonys_completion_render(encoding, renderer, turns, analysis):
    """Single and multi-turn, with and without analysis, any text (literal special-token text included): the
    start read off the arrays equals openai-harmony's, on the checked first row of the shape and on an unchecked
    later row of the same shape."""
    messages = chat(turns, analysis)
    input_ids, spans = row_arrays(renderer, messages)
    prefixes = CompletionPrefixes(encoding, check_every=1_000_000)
    want = oracle_start(encoding, messages)
    assert prefixes.prefix(input_ids, spans, lambda: messages) == want
    assert prefixes.checked == 1

    def unread() -> list[dict]:
        raise AssertionError("a row of a shape already confirmed is not rendered again")

    assert prefixes.prefix(input_ids, spans, unread) == want
    assert prefixes.checked == 1
    assert [int(t) for t in input_ids[want - 2 : want]] == prefixes.assistant_header.tolist()
    assert spans[want - 2] != constants.SPAN_PROMPT and not spans[: want - 2].any()  # the completion's first token


def test_a_header_rule_of_openai_harmony_is_caught_on_the_first_row_of_its_shape(encoding, renderer):
    """openai-harmony's completion render drops the analysis of earlier assistant turns: the head of the
    training render is then not the completion prefix. Only the headers tell, and a new header sequence is
    always rendered by openai-harmony, so the very first such row stops the step."""
    messages = chat([("hi", "hello"), ("and now?", "done")], None, history_analysis=True)
    input_ids, spans = row_arrays(renderer, messages)
    prefix = completion_prefix(encoding, messages)
    assert not np.array_equal(input_ids[: len(prefix)], prefix)  # openai-harmony's rule, as the test assumes it
    with pytest.raises(DistillContractError, match="is not the head of input_ids"):
        CompletionPrefixes(encoding).prefix(input_ids, spans, lambda: messages)


def test_every_nth_row_and_every_new_shape_are_rendered(encoding, renderer):
    """130 rows of one shape: the first, the 64th and the 128th are rendered; a row of another shape adds one."""
    single = chat([("question", "answer")], "because")
    input_ids, spans = row_arrays(renderer, single)
    prefixes = CompletionPrefixes(encoding, check_every=64)
    for _ in range(130):
        prefixes.prefix(input_ids, spans, lambda: single)
    assert (prefixes.rows, prefixes.checked) == (130, 3)
    other = chat([("question", "answer"), ("more", "sure")], None)  # two turns: another header sequence
    prefixes.prefix(*row_arrays(renderer, other), lambda: other)
    assert prefixes.checked == 4


def test_a_row_openai_harmony_renders_otherwise_is_refused(encoding, renderer):
    """The messages behind a checked row are not what its tokens say (a stale synth_sampled, say): refused."""
    messages = chat([("question", "answer")], None)
    input_ids, spans = row_arrays(renderer, messages)
    other = chat([("another question", "answer")], None)
    with pytest.raises(DistillContractError, match="is not the head of input_ids"):
        CompletionPrefixes(encoding).prefix(input_ids, spans, lambda: other)


def test_spans_that_do_not_start_at_the_assistant_header_are_refused(encoding, renderer):
    messages = chat([("question", "answer")], None)
    input_ids, spans = row_arrays(renderer, messages)
    shifted = np.roll(spans, 1)
    with pytest.raises(DistillContractError, match="does not open with"):
        CompletionPrefixes(encoding).prefix(input_ids, shifted, lambda: messages)
    with pytest.raises(DistillContractError, match="does not open with"):
        CompletionPrefixes(encoding).prefix(input_ids, np.full_like(spans, constants.SPAN_PROMPT), lambda: messages)
