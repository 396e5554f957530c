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

from synthkd_contract import constants, drops
from synthkd_contract.labels import supervision_arrays

RENDER_CONFIG = RenderConversationConfig(auto_drop_analysis=False)


def is_fatal(error: BaseException) -> bool:
    """Interrupts and exits must propagate; anything else a tokenizer raises (including a Rust panic,
    which pyo3 raises as a BaseException) is about the text of one conversation."""
    return isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError))


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
    counts = np.bincount(span_id, minlength=len(constants.SPAN_NAMES))
    return {name: int(counts[span]) for span, name in constants.SPAN_NAMES.items()}


def message_span(message: dict[str, Any]) -> int:
    """Span id of every token of a message: assistant analysis/final are supervised, all else prompt."""
    if message.get("role") != "assistant":
        return constants.SPAN_PROMPT
    channel = message.get("channel")
    if channel not in constants.CHANNEL_TO_SPAN:
        raise RenderError(drops.DROP_UNSUPPORTED_CHANNEL, f"assistant channel {channel!r} has no v1 span")
    return constants.CHANNEL_TO_SPAN[channel]


def message_spans(messages: list[dict[str, Any]]) -> list[int]:
    """Span id of every message of a conversation: only the completion, the assistant messages after the last
    non-assistant message, is supervised. The assistant turns of a multi-turn history (an anchor source's) are
    context, span 0, like the user turns around them: the DistillKit split is one prompt, one completion (001),
    and a teacher's KD signal is wanted on the reply being distilled. SYNTH's single turn is all completion."""
    spans = [message_span(m) for m in messages]  # every assistant channel is checked, in history too
    start = completion_start(messages)
    return [span if i >= start else constants.SPAN_PROMPT for i, span in enumerate(spans)]


def completion_start(messages: list[dict[str, Any]]) -> int:
    """The index of the completion's first message: the one after the last non-assistant message."""
    return 1 + max((i for i, m in enumerate(messages) if m.get("role") != "assistant"), default=-1)


class HarmonyRenderer:
    """The reference renderer: openai-harmony tokens, masks from message boundaries."""

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding
        self.start_id = encoding.encode("<|start|>", allowed_special="all")[0]

    def render(self, messages: list[dict[str, Any]]) -> RenderedConversation:
        spans = np.array(message_spans(messages), dtype=constants.SPAN_DTYPE)
        try:
            conversation = Conversation.from_messages([Message.from_dict(m) for m in messages])
            rendered = self.encoding.render_conversation_for_training(conversation, RENDER_CONFIG)
        except BaseException as error:  # HarmonyError, pydantic errors, and Rust panics on pathological text
            if is_fatal(error):
                raise
            raise RenderError(drops.DROP_HARMONY_RENDER_ERROR, f"{type(error).__name__}: {error}") from error
        tokens = np.empty(len(rendered) + 1, dtype=constants.TOKENS_DTYPE)
        tokens[:-1] = rendered
        tokens[-1] = constants.EOD_TOKEN_ID
        starts = np.flatnonzero(tokens == self.start_id)
        if len(starts) != len(messages) or (len(starts) and starts[0] != 0):
            raise RenderError(
                drops.DROP_MESSAGE_BOUNDARY_MISMATCH,
                f"{len(messages)} messages but {len(starts)} <|start|> tokens in the render",
            )
        lengths = np.diff(np.append(starts, len(tokens) - 1))
        token_spans = np.zeros(len(tokens), dtype=constants.SPAN_DTYPE)
        token_spans[:-1] = np.repeat(spans, lengths)
        loss_mask, span_id = supervision_arrays(token_spans)
        return RenderedConversation(tokens, loss_mask, span_id)

    def render_many(self, conversations: list[list[dict[str, Any]]]) -> list[RenderedConversation | RenderError]:
        """One by one through openai-harmony; a RenderError in the list drops that conversation."""
        results: list[RenderedConversation | RenderError] = []
        for messages in conversations:
            try:
                results.append(self.render(messages))
            except RenderError as error:
                results.append(error)
        return results

    @property
    def routed_to_reference(self) -> int:
        return 0


WHOLE_MESSAGE_ROLES = ("system", "developer")  # rendered whole by openai-harmony (context: span prompt)
WHOLE_MESSAGE_CACHE = 1024  # distinct whole messages a FastRenderer keeps rendered


class FastRenderer:
    """The production renderer: byte-identical to `HarmonyRenderer`, at raw-BPE speed.

    Harmony renders each message as wrapper tokens around the ordinary BPE encoding of its text, and
    the training render only swaps the last final message's `<|end|>` for `<|return|>`. So the
    wrappers (`<|start|>role<|channel|>channel<|message|>`) are taken once from openai-harmony itself,
    whole system messages are rendered once per distinct message, and the contents of a batch are
    encoded together with tiktoken (same pinned ranks). System and developer messages (the
    synth_harmony_v1 artifact's structured `system_content` / `developer_content`) are rendered whole by
    openai-harmony, once per distinct message. Conversations outside that shape (tools, recipients,
    several contents, not ending in a final) go to the reference renderer and are counted in
    `routed_to_reference`.
    """

    def __init__(self, encoding: Any, bpe: Any, num_threads: int = 1) -> None:
        self.reference = HarmonyRenderer(encoding)
        self.encoding = encoding
        self.bpe = bpe
        self.num_threads = num_threads
        self.end_id, self.return_id = (encoding.encode(t, allowed_special="all")[0] for t in ("<|end|>", "<|return|>"))
        self._headers: dict[tuple[str, str | None], np.ndarray] = {}
        self._whole_messages: dict[str, np.ndarray] = {}
        self.routed_to_reference = 0

    def _header(self, role: str, channel: str | None) -> np.ndarray:
        """`<|start|>{role}[<|channel|>{channel}]<|message|>`: harmony's render of an empty message, minus `<|end|>`."""
        key = (role, channel)
        if key not in self._headers:
            message = {"role": role, "name": None, "content": [{"type": "text", "text": ""}]}
            if channel is not None:
                message["channel"] = channel
            rendered = self.encoding.render(Message.from_dict(message))
            if rendered[-1] != self.end_id:
                detail = f"harmony renders an empty {key} message as {rendered}"
                raise RenderError(drops.DROP_MESSAGE_BOUNDARY_MISMATCH, detail)
            self._headers[key] = np.array(rendered[:-1], dtype=constants.TOKENS_DTYPE)
        return self._headers[key]

    def _whole_message(self, message: dict[str, Any]) -> np.ndarray:
        """openai-harmony's render of a system or developer message, cached per distinct message (at most
        WHOLE_MESSAGE_CACHE of them: a corpus whose every row has its own would render each without keeping it)."""
        key = json.dumps(message, sort_keys=True)
        cached = self._whole_messages.get(key)
        if cached is None:
            try:
                rendered = self.encoding.render(Message.from_dict(message))
            except BaseException as error:  # a system content openai-harmony refuses (pydantic, HarmonyError)
                if is_fatal(error):
                    raise
                raise RenderError(drops.DROP_HARMONY_RENDER_ERROR, f"{type(error).__name__}: {error}") from error
            cached = np.array(rendered, dtype=constants.TOKENS_DTYPE)
            if len(self._whole_messages) < WHOLE_MESSAGE_CACHE:
                self._whole_messages[key] = cached
        return cached

    @staticmethod
    def _plain_text(message: dict[str, Any]) -> str | None:
        """The text of a single-text-content message without recipient/name/content type, else None."""
        content = message.get("content")
        if message.get("recipient") or message.get("name") or message.get("content_type"):
            return None
        if not isinstance(content, list) or len(content) != 1 or content[0].get("type") != "text":
            return None
        return content[0]["text"]

    def _plan(self, messages: list[dict[str, Any]], texts: list[str]) -> list[tuple[np.ndarray | int, int]] | None:
        """Pieces of one conversation: fixed token arrays, or indices into `texts`; None = use the reference."""
        last = messages[-1] if messages else {}
        if last.get("role") != "assistant" or last.get("channel") != "final":
            return None
        pieces: list[tuple[np.ndarray | int, int]] = []
        spans = message_spans(messages)
        for position, message in enumerate(messages):
            role = message.get("role")
            if role in WHOLE_MESSAGE_ROLES:
                if self._plain_text(message) is None and len(message.get("content", [])) != 1:
                    return None
                pieces.append((self._whole_message(message), constants.SPAN_PROMPT))
                continue
            text = self._plain_text(message)
            if text is None or role not in ("user", "assistant"):
                return None
            channel = message.get("channel")
            if role == "user" and channel is not None:
                return None
            span = spans[position]
            pieces.append((self._header(role, channel), span))
            texts.append(text)
            pieces.append((len(texts) - 1, span))
            terminator = self.return_id if position == len(messages) - 1 else self.end_id
            pieces.append((np.array([terminator], dtype=constants.TOKENS_DTYPE), span))
        return pieces

    def _encode(self, texts: list[str]) -> list[np.ndarray | RenderError]:
        """Ordinary BPE of every text (special-token text encoded as text, as harmony does).

        A text the tokenizer cannot encode (tiktoken's regex overflows its stack on ~1M identical
        characters) becomes a RenderError for its conversation only."""
        if self.num_threads > 1:
            try:
                batches = self.bpe.encode_ordinary_batch(texts, num_threads=self.num_threads)
                return [np.array(t, dtype=constants.TOKENS_DTYPE) for t in batches]
            except BaseException as error:
                if is_fatal(error):
                    raise
                # one bad text fails the whole batch call: redo it text by text to find which
        encoded: list[np.ndarray | RenderError] = []
        for text in texts:
            try:
                # straight into numpy, without a thread pool future and a Python list per text
                encoded.append(self.bpe.encode_to_numpy(text, disallowed_special=()))
            except BaseException as error:
                if is_fatal(error):
                    raise
                encoded.append(RenderError(drops.DROP_TOKENIZER_ERROR, f"{type(error).__name__}: {str(error)[:200]}"))
        return encoded

    def render_many(self, conversations: list[list[dict[str, Any]]]) -> list[RenderedConversation | RenderError]:
        """Render a batch; each item is the rendered conversation or the RenderError that drops it."""
        texts: list[str] = []
        plans: list[list[tuple[np.ndarray | int, int]] | None | RenderError] = []
        for messages in conversations:
            try:
                plans.append(self._plan(messages, texts))
            except RenderError as error:
                plans.append(error)
        encoded = self._encode(texts)
        eod = np.array([constants.EOD_TOKEN_ID], dtype=constants.TOKENS_DTYPE)
        results: list[RenderedConversation | RenderError] = []
        for messages, plan in zip(conversations, plans):
            if isinstance(plan, RenderError):
                results.append(plan)
                continue
            if plan is None:
                self.routed_to_reference += 1
                try:
                    results.append(self.reference.render(messages))
                except RenderError as error:
                    results.append(error)
                continue
            arrays = [encoded[piece] if isinstance(piece, int) else piece for piece, _ in plan]
            failed = next((a for a in arrays if isinstance(a, RenderError)), None)
            if failed is not None:
                results.append(failed)
                continue
            tokens = np.concatenate([*arrays, eod], dtype=constants.TOKENS_DTYPE, casting="unsafe")
            token_spans = np.zeros(len(tokens), dtype=constants.SPAN_DTYPE)
            token_spans[:-1] = np.repeat(
                np.array([span for _, span in plan], dtype=constants.SPAN_DTYPE), [len(a) for a in arrays]
            )
            loss_mask, span_id = supervision_arrays(token_spans)
            results.append(RenderedConversation(tokens, loss_mask, span_id))
        return results
