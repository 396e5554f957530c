"""Harmony messages -> (tokens, loss_mask, span_id), exactly as seed 000 locks them.

Tokens are openai-harmony's `render_conversation_for_training` with analysis kept, plus one EOD.
Masks come from message boundaries: content text is always encoded as ordinary text, so every
`<|start|>` id in the rendered stream opens exactly one message, in order. The two label-aligned
arrays then describe token i+1 at position i, and the final (EOD) position carries 0/0.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from openai_harmony import Conversation, Message, RenderConversationConfig

from synthkd_assets import contracts

RENDER_CONFIG = RenderConversationConfig(auto_drop_analysis=False)


class RenderError(ValueError):
    """A conversation the v1 contract cannot render; `reason` is the drop-reason key counted."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True)
class RenderedConversation:
    tokens: np.ndarray  # int32, ends with EOD
    loss_mask: np.ndarray  # uint8, label-aligned
    span_id: np.ndarray  # uint8, label-aligned

    def span_token_counts(self) -> dict[str, int]:
        return span_token_counts(self.span_id)


def span_token_counts(span_id: np.ndarray) -> dict[str, int]:
    """Label positions per span name (prompt / analysis / final); EOD positions count as prompt."""
    counts = np.bincount(span_id, minlength=len(contracts.SPAN_NAMES))
    return {name: int(counts[span]) for span, name in contracts.SPAN_NAMES.items()}


def message_span(message: dict[str, Any]) -> int:
    """Span id of every token of a message: assistant analysis/final are supervised, all else prompt."""
    if message.get("role") != "assistant":
        return contracts.SPAN_PROMPT
    channel = message.get("channel")
    if channel not in contracts.CHANNEL_TO_SPAN:
        raise RenderError("unsupported_assistant_channel", f"assistant channel {channel!r} has no v1 span")
    return contracts.CHANNEL_TO_SPAN[channel]


def label_aligned(token_spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token-level spans (EOD included, 0) -> label-aligned (loss_mask, span_id)."""
    span_id = np.zeros(len(token_spans), dtype=contracts.SPAN_DTYPE)
    span_id[:-1] = token_spans[1:]
    loss_mask = (span_id != contracts.SPAN_PROMPT).astype(contracts.LOSSMASK_DTYPE)
    return loss_mask, span_id


class HarmonyRenderer:
    """The reference renderer: openai-harmony tokens, masks from message boundaries."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding
        self.start_id = encoding.encode("<|start|>", allowed_special="all")[0]

    def render(self, messages: list[dict[str, Any]]) -> RenderedConversation:
        spans = np.array([message_span(m) for m in messages], dtype=contracts.SPAN_DTYPE)
        try:
            conversation = Conversation.from_messages([Message.from_dict(m) for m in messages])
            rendered = self.encoding.render_conversation_for_training(conversation, RENDER_CONFIG)
        except Exception as error:  # HarmonyError and pydantic validation errors alike
            raise RenderError("harmony_render_error", f"{type(error).__name__}: {error}") from error
        tokens = np.empty(len(rendered) + 1, dtype=contracts.TOKENS_DTYPE)
        tokens[:-1] = rendered
        tokens[-1] = contracts.EOD_TOKEN_ID
        starts = np.flatnonzero(tokens == self.start_id)
        if len(starts) != len(messages) or (len(starts) and starts[0] != 0):
            raise RenderError(
                "message_boundary_mismatch",
                f"{len(messages)} messages but {len(starts)} <|start|> tokens in the render",
            )
        lengths = np.diff(np.append(starts, len(tokens) - 1))
        token_spans = np.zeros(len(tokens), dtype=contracts.SPAN_DTYPE)
        token_spans[:-1] = np.repeat(spans, lengths)
        loss_mask, span_id = label_aligned(token_spans)
        return RenderedConversation(tokens, loss_mask, span_id)

    def render_json(self, messages_json: str) -> RenderedConversation:
        return self.render(json.loads(messages_json)["messages"])
