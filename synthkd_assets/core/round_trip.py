"""The Harmony round-trip (seed 002 §12): the tokens written for a conversation, parsed back by openai-harmony,
give exactly the messages of synth_harmony it was rendered from. It catches a renderer (fast or reference)
that drifts from Harmony, and any token of a written conversation changed on its way to disk."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from openai_harmony import Message, Role

from synthkd_assets.core.parquet_io import iter_frames, list_column_rows
from synthkd_assets.core.render import is_fatal
from synthkd_contract import constants

SHOWN_CHARS = 60  # of a differing value, in a mismatch's text
TEXT_CONTEXT = 20  # characters quoted either side of the first difference of two texts
WHOLE = -1  # the message index of a mismatch about the whole conversation (EOD, terminator, parse, pairing)
MessageKey = tuple[str, str | None, str | None, str | None, str | None, tuple[str, ...]]
KEY_FIELDS = ("role", "name", "channel", "recipient", "content_type", "text")


@dataclass(frozen=True)
class Mismatch:
    """One difference between a written conversation and its synth_harmony messages."""

    synth_id: str
    message_index: int  # WHOLE for the conversation as a whole
    field: str  # a KEY_FIELDS name (text: `text at char <i>`), or messages / eod / terminator / parse / pairing
    expected: str
    got: str

    def __str__(self) -> str:
        where = "" if self.message_index == WHOLE else f" message {self.message_index}"
        return f"{self.synth_id}{where}: {self.field} expected {_short(self.expected)}, got {_short(self.got)}"


def _field_mismatch(synth_id: str, index: int, name: str, want: Any, got: Any) -> Mismatch:
    """Texts are quoted around their first difference (they can be long); other fields whole."""
    if name != "text":
        return Mismatch(synth_id, index, name, str(want), str(got))
    want, got = "\x1e".join(want), "\x1e".join(got)  # contents joined by a separator for the quote only
    at = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
    start = max(0, at - TEXT_CONTEXT)
    return Mismatch(
        synth_id, index, f"text at char {at}", want[start : at + TEXT_CONTEXT], got[start : at + TEXT_CONTEXT]
    )


def _short(value: str) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


@dataclass(frozen=True)
class RoundTrip:
    """What a check of many conversations found: how many were checked, and every mismatch in order."""

    conversations: int
    mismatches: list[Mismatch]


class RoundTripChecker:
    """Parses written tokens back with `encoding` and compares them message by message.

    What "exactly the messages" means: the tokens must end with one EOD (`EOD_TOKEN_ID`, not a message,
    stripped), preceded by `<|return|>` when the last message is an assistant `final` (the training render's
    terminator) and `<|end|>` otherwise; the rest must parse (`parse_messages_from_completion_tokens`,
    strict, from the first `<|start|>`) into as many messages as synth_harmony has, each equal in role,
    name, channel, recipient, content_type and the exact text of each content (no normalization of whitespace,
    NUL, markers or Unicode). A system message is stored as structured `SystemContent` but rendered as text:
    its expected text is what openai-harmony renders for that stored message, parsed back alone.
    """

    def __init__(self, encoding: Any) -> None:
        self.encoding = encoding
        self.end_id, self.return_id = (encoding.encode(t, allowed_special="all")[0] for t in ("<|end|>", "<|return|>"))
        self._rendered_keys: dict[str, MessageKey] = {}

    def _expected_key(self, message: dict[str, Any]) -> MessageKey:
        contents = message.get("content") or []
        if all(c.get("type") == "text" for c in contents):
            texts = tuple(c["text"] for c in contents)
            fields = (message.get(name) for name in KEY_FIELDS[1:-1])
            return (message["role"], *fields, texts)
        cache_key = json.dumps(message, sort_keys=True)
        if cache_key not in self._rendered_keys:  # structured content (the system message): as harmony renders it
            [parsed] = self.encoding.parse_messages_from_completion_tokens(
                self.encoding.render(Message.from_dict(message)), None
            )
            self._rendered_keys[cache_key] = message_key(parsed)
        return self._rendered_keys[cache_key]

    def _terminator(self, messages: list[dict[str, Any]]) -> int:
        last = messages[-1] if messages else {}
        final = last.get("role") == Role.ASSISTANT.value and last.get("channel") == "final"
        return self.return_id if final else self.end_id

    def check(self, synth_id: str, tokens: Sequence[int], messages: list[dict[str, Any]]) -> list[Mismatch]:
        """The mismatches of one conversation (empty when it round-trips)."""
        tokens = np.asarray(tokens).tolist()
        if not tokens or tokens[-1] != constants.EOD_TOKEN_ID:
            got = str(tokens[-1]) if tokens else "no tokens"
            return [Mismatch(synth_id, WHOLE, "eod", str(constants.EOD_TOKEN_ID), got)]
        body = tokens[:-1]
        problems = []
        terminator = self._terminator(messages)
        if messages and (not body or body[-1] != terminator):
            problems.append(Mismatch(synth_id, WHOLE, "terminator", str(terminator), str(body[-1] if body else None)))
        try:
            parsed = [message_key(m) for m in self.encoding.parse_messages_from_completion_tokens(body, None)]
        except BaseException as error:  # HarmonyError, or a Rust panic raised by pyo3 as a BaseException
            if is_fatal(error):
                raise
            return [*problems, Mismatch(synth_id, WHOLE, "parse", "messages", f"{type(error).__name__}: {error}")]
        expected = [self._expected_key(m) for m in messages]
        if len(parsed) != len(expected):
            problems.append(Mismatch(synth_id, WHOLE, "messages", str(len(expected)), str(len(parsed))))
        for index, (want, got) in enumerate(zip(expected, parsed)):
            problems.extend(
                _field_mismatch(synth_id, index, name, w, g) for name, w, g in zip(KEY_FIELDS, want, got) if w != g
            )
        return problems

    def check_many(self, conversations: Iterable[tuple[str, Sequence[int], list[dict[str, Any]] | None]]) -> RoundTrip:
        """Every (synth_id, tokens, messages) in turn; messages None = no synth_harmony row for that synth_id."""
        count, mismatches = 0, []
        for synth_id, tokens, messages in conversations:
            count += 1
            if messages is None:
                mismatches.append(Mismatch(synth_id, WHOLE, "pairing", "a synth_harmony row", "none (in order)"))
                continue
            mismatches.extend(self.check(synth_id, tokens, messages))
        return RoundTrip(count, mismatches)


def message_key(message: Message) -> MessageKey:
    """What the round-trip compares of a parsed message: role, name, channel, recipient, content_type, texts."""
    texts = tuple(getattr(c, "text", repr(c)) for c in message.content)
    author = message.author
    return (author.role.value, author.name, message.channel, message.recipient, message.content_type, texts)


def paired_conversations(
    tokenized_path: Path, harmony_path: Path
) -> Iterator[tuple[str, np.ndarray, list[dict[str, Any]] | None]]:
    """(synth_id, tokens, messages) of every synth_tokenized row with the messages_json of its synth_harmony_v1 row
    (synth_harmony, or a row subset of it such as synth_sampled). Both files stream: the tokenized rows are an
    ordered subset of the harmony rows (every step keeps row order), so one forward walk pairs them."""
    harmony = (row for frame in iter_frames(harmony_path, ("synth_id", "messages_json")) for row in frame.iter_rows())
    exhausted = False
    for frame in iter_frames(tokenized_path, ("synth_id", "tokens")):
        tokens = list_column_rows(frame.select("tokens").to_arrow().column(0))
        for synth_id, row_tokens in zip(frame["synth_id"], tokens):
            messages = None
            while not exhausted:
                candidate = next(harmony, None)
                if candidate is None:
                    exhausted = True
                elif candidate[0] == synth_id:
                    messages = json.loads(candidate[1])["messages"]
                    break
            yield synth_id, row_tokens, messages


def round_trip_shard(tokenized_path: Path, harmony_path: Path, encoding: Any) -> RoundTrip:
    """The round-trip of every conversation of a synth_tokenized file against its synth_harmony_v1 rows."""
    return RoundTripChecker(encoding).check_many(paired_conversations(tokenized_path, harmony_path))
