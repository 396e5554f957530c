"""The Harmony round-trip (docs/contract.md#checks): the tokens written for a conversation, parsed back by
openai-harmony, give exactly the messages of synth_harmony it was rendered from. It catches a renderer (fast or
reference) that drifts from Harmony. The build checks the arrays it writes (`stages.TokenizeStep` with a checker);
`round_trip_shard` checks a written file, read back."""

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
CONVERSATIONS_PER_BATCH = 1024  # checked the fast way at once
DECODE_TOKENS = 1 << 15  # content tokens decoded by one gather: its index (~1 MiB) stays in the heap malloc keeps
# each special token's part in a conversation's structure (RoundTripChecker._confirmed)
START, HEADER, MESSAGE, END, RETURN, EOD, OTHER = range(7)
ALLOWED = np.zeros((7, 7), dtype=bool)  # which special may follow which, within one conversation
for _before, _after in [
    (START, HEADER),
    (START, MESSAGE),
    (HEADER, HEADER),
    (HEADER, MESSAGE),
    (MESSAGE, END),
    (MESSAGE, RETURN),
    (END, START),
    (END, EOD),
    (RETURN, EOD),
]:
    ALLOWED[_before, _after] = True
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

    def plus(self, later: RoundTrip) -> RoundTrip:
        """This check followed by `later`'s (its conversations come after these)."""
        return RoundTrip(self.conversations + later.conversations, [*self.mismatches, *later.mismatches])


class RoundTripChecker:
    """Parses written tokens back with `encoding` and compares them message by message.

    Given `bpe` (the tiktoken encoding of the same ranks), a conversation is first checked the fast way
    (`_fast_keys`: openai-harmony's parse of each distinct message header, cached, and tiktoken's decode of each
    content): openai-harmony's parse costs ~0.2 ms per message whatever its length, ~3 us per token. Anything
    the fast way does not confirm goes through the full openai-harmony parse of the conversation, whose answer
    is the one reported: the fast way can only confirm a match, never report one (tests/test_round_trip.py
    checks both agree on hostile text and on corruptions).

    What "exactly the messages" means: the tokens must end with one EOD (`EOD_TOKEN_ID`, not a message, stripped),
    preceded by the training render's terminator (`<|return|>` after an assistant `final`, `<|call|>` after another
    assistant message with a recipient, `<|end|>` otherwise); the rest must parse
    (`parse_messages_from_completion_tokens`, strict, from the first `<|start|>`) into as many messages as
    synth_harmony has, each equal in role, name, channel, recipient, content_type and the exact text of each content
    (no normalization of whitespace, NUL, markers or Unicode). A system message is stored as structured
    `SystemContent` but rendered as text: its expected text is what openai-harmony renders for that stored message,
    parsed back alone.
    """

    def __init__(self, encoding: Any, bpe: Any = None) -> None:
        self.encoding = encoding
        self.bpe = bpe
        self.start_id, self.end_id, self.return_id, self.call_id, self.message_id = (
            encoding.encode(t, allowed_special="all")[0]
            for t in ("<|start|>", "<|end|>", "<|return|>", "<|call|>", "<|message|>")
        )
        self._rendered_keys: dict[str, MessageKey] = {}
        self._parsed_headers: dict[tuple[int, ...], MessageKey | None] = {}
        self.checked_fast = 0  # conversations the fast way confirmed (the rest took the full parse)
        if bpe is not None:
            ids = {t: encoding.encode(t, allowed_special="all")[0] for t in ("<|channel|>", "<|constrain|>")}
            self._codes = {
                START: [self.start_id],
                HEADER: list(ids.values()),
                MESSAGE: [self.message_id],
                END: [self.end_id],
                RETURN: [self.return_id, self.call_id],
                EOD: [constants.EOD_TOKEN_ID],
            }
            # every ordinary token's bytes, laid end to end in rank order: a content decodes by one numpy gather
            tokens = list(bpe._mergeable_ranks)  # each ordinary token's bytes
            ranks = np.fromiter(bpe._mergeable_ranks.values(), dtype=np.int64, count=len(tokens))
            self._token_bytes = np.zeros(constants.ORDINARY_VOCAB_SIZE, dtype=np.int64)
            self._token_bytes[ranks] = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
            in_rank_order = map(tokens.__getitem__, np.argsort(ranks, kind="stable").tolist())
            self._vocabulary_bytes = np.frombuffer(b"".join(in_rank_order), dtype=np.uint8)
            self._token_offset = np.zeros(constants.ORDINARY_VOCAB_SIZE, dtype=np.int64)
            np.cumsum(self._token_bytes[:-1], out=self._token_offset[1:])

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
        """The training render's last terminator: `<|return|>` after an assistant `final`, `<|call|>` after any
        other assistant message with a recipient (a tool call), `<|end|>` otherwise."""
        last = messages[-1] if messages else {}
        if last.get("role") != Role.ASSISTANT.value:
            return self.end_id
        if last.get("channel") == "final":
            return self.return_id
        return self.call_id if last.get("recipient") else self.end_id

    def _header_key(self, header: tuple[int, ...]) -> MessageKey | None:
        """openai-harmony's parse of one content-less message (`<|start|>...<|message|>` + terminator), cached:
        role, name, channel, recipient, content_type and its empty text; None when it is not one such message."""
        if header not in self._parsed_headers:
            parsed = self._parse(list(header))
            key = message_key(parsed[0]) if parsed and len(parsed) == 1 else None
            self._parsed_headers[header] = key if key is not None and key[-1] == ("",) else None
        return self._parsed_headers[header]

    def _confirmed(self, batch: Sequence[tuple[np.ndarray, list[dict[str, Any]] | None]]) -> np.ndarray:
        """Which conversations of the batch are confirmed the fast way, vectorized over the whole batch.

        A conversation is confirmed when it is exactly `[<|start|> header <|message|> content <|end|>]` per
        message but the last, whose terminator is the expected one, then EOD, with nothing between messages and
        no special token in a content; each distinct header parses (openai-harmony, cached) to the expected role,
        name, channel, recipient and content type; and the tiktoken decode of every content is byte for byte the
        UTF-8 of the expected text. For that shape harmony's parse is the concatenation of its parses of each
        message, and its parse of a content is the UTF-8 decode of its tokens."""
        n = len(batch)
        confirmed = np.zeros(n, dtype=bool)
        if self.bpe is None or n == 0:
            return confirmed
        lengths = np.fromiter((len(tokens) for tokens, _ in batch), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate([np.asarray(tokens, dtype=np.int64) for tokens, _ in batch]) if offsets[-1] else None
        if flat is None:
            return confirmed
        pos = np.flatnonzero(flat >= constants.ORDINARY_VOCAB_SIZE)
        if len(pos) == 0:
            return confirmed
        conv = np.searchsorted(offsets, pos, side="right") - 1
        code = np.full(len(pos), OTHER, dtype=np.int8)
        for kind, ids in self._codes.items():
            code[np.isin(flat[pos], ids)] = kind
        ok = np.array([bool(m) for _, m in batch])
        ok[np.searchsorted(offsets, np.flatnonzero(flat < 0), side="right") - 1] = False  # not a token at all
        # consecutive specials of one conversation: allowed transitions, terminators adjacent to what follows
        same = conv[:-1] == conv[1:]
        adjacent = pos[1:] == pos[:-1] + 1
        bad = same & (~ALLOWED[code[:-1], code[1:]] | (((code[:-1] == END) | (code[:-1] == RETURN)) & ~adjacent))
        ok[conv[:-1][bad]] = False
        first = np.flatnonzero(np.r_[True, ~same])
        last = np.r_[first[1:] - 1, len(pos) - 1]
        has = np.zeros(n, dtype=bool)
        has[conv[first]] = True
        ok &= has
        ok[conv[first][(code[first] != START) | (pos[first] != offsets[conv[first]])]] = False
        ok[conv[last][(code[last] != EOD) | (pos[last] != offsets[conv[last] + 1] - 1) | (last == first)]] = False
        # the terminator before the EOD is the expected one; one <|message|> per expected message
        before_eod = np.maximum(last - 1, 0)
        expected_terminator = np.array([self._terminator(m) if m else -1 for _, m in batch], dtype=np.int64)
        ok[conv[last][flat[pos[before_eod]] != expected_terminator[conv[last]]]] = False
        opened = np.flatnonzero(code == MESSAGE)
        counts = np.bincount(conv[opened], minlength=n)
        ok &= counts == np.array([len(m) if m else -1 for _, m in batch])
        if not ok.any():
            return confirmed
        # every message of the conversations still standing: header (from its <|start|>) and content bounds
        opened = opened[ok[conv[opened]]]
        start_index = np.maximum.accumulate(np.where(code == START, np.arange(len(pos)), 0))[opened]
        content_from, content_to = pos[opened] + 1, pos[opened + 1]
        headers = [
            (*flat[a : b + 1].tolist(), int(flat[c]))
            for a, b, c in zip(pos[start_index].tolist(), pos[opened].tolist(), content_to.tolist())
        ]
        # contents: decoded together (one gather from the vocabulary's bytes), cut per message by byte lengths
        marks = np.zeros(len(flat) + 1, dtype=np.int64)
        np.add.at(marks, content_from, 1)
        np.add.at(marks, content_to, -1)
        content = flat[np.cumsum(marks[:-1]) > 0]
        decoded = self._decode(content)
        byte_at = np.zeros(len(content) + 1, dtype=np.int64)  # bytes decoded before each content token
        np.cumsum(self._token_bytes[content], out=byte_at[1:])
        message_bytes_end = byte_at[np.cumsum(content_to - content_from)]
        message_bytes_start = np.r_[0, message_bytes_end[:-1]]
        owner = conv[opened]  # the conversation of each message still standing
        wants = [self._expected_key(message) for index in np.unique(owner).tolist() for message in batch[index][1]]
        texts = [want[-1][0].encode("utf-8", "surrogatepass") if len(want[-1]) == 1 else None for want in wants]
        keys = [self._header_key(header) for header in headers]
        good = np.fromiter(
            (
                key is not None and text is not None and key[:-1] == want[:-1]
                for key, want, text in zip(keys, wants, texts)
            ),
            dtype=bool,
            count=len(wants),
        )
        good &= message_bytes_end - message_bytes_start == [-1 if text is None else len(text) for text in texts]
        # the texts compared all at once; only a batch whose bytes differ is compared message by message
        if not (good.all() and decoded == b"".join(texts)):
            for at in np.flatnonzero(good).tolist():
                good[at] = decoded[message_bytes_start[at] : message_bytes_end[at]] == texts[at]
        ok[owner[~good]] = False
        return ok

    def _decode(self, content: np.ndarray) -> bytes:
        """tiktoken's `decode_bytes` of ordinary tokens, without a Python int per token: each token's bytes gathered
        from the vocabulary laid end to end, DECODE_TOKENS tokens at a time (the gather's index stays small)."""
        parts = []
        for first in range(0, len(content), DECODE_TOKENS):
            chunk = content[first : first + DECODE_TOKENS]
            lengths = self._token_bytes[chunk]
            index = np.repeat(self._token_offset[chunk] - (np.cumsum(lengths) - lengths), lengths)
            index += np.arange(len(index))
            parts.append(self._vocabulary_bytes[index].tobytes())
        return b"".join(parts)

    def _parse(self, tokens: list[int]) -> list[Message] | None:
        try:
            return self.encoding.parse_messages_from_completion_tokens(tokens, None)
        except BaseException as error:  # HarmonyError, or a Rust panic raised by pyo3 as a BaseException
            if is_fatal(error):
                raise
            return None

    def check(self, synth_id: str, tokens: Sequence[int], messages: list[dict[str, Any]]) -> list[Mismatch]:
        """The mismatches of one conversation (empty when it round-trips)."""
        array = np.asarray(tokens)
        if self._confirmed([(array, messages)])[0]:
            self.checked_fast += 1
            return []
        return self._check_full(synth_id, array, messages)

    def _check_full(self, synth_id: str, tokens: Sequence[int], messages: list[dict[str, Any]]) -> list[Mismatch]:
        """openai-harmony's parse of the whole conversation, compared field by field: what every mismatch reports."""
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
        count, mismatches, batch = 0, [], []
        for conversation in conversations:
            count += 1
            batch.append(conversation)
            if len(batch) == CONVERSATIONS_PER_BATCH:
                mismatches.extend(self._check_batch(batch))
                batch = []
        mismatches.extend(self._check_batch(batch))
        return RoundTrip(count, mismatches)

    def _check_batch(self, batch: list[tuple[str, Sequence[int], list[dict[str, Any]] | None]]) -> list[Mismatch]:
        """The fast way over the batch at once; the full parse, in order, for every conversation it leaves."""
        confirmed = self._confirmed([(np.asarray(tokens), messages) for _, tokens, messages in batch])
        self.checked_fast += int(confirmed.sum())
        mismatches = []
        for (synth_id, tokens, messages), fast in zip(batch, confirmed):
            if messages is None:
                mismatches.append(Mismatch(synth_id, WHOLE, "pairing", "a synth_harmony row", "none (in order)"))
            elif not fast:
                mismatches.extend(self._check_full(synth_id, tokens, messages))
        return mismatches


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


def round_trip_shard(tokenized_path: Path, harmony_path: Path, encoding: Any, bpe: Any = None) -> RoundTrip:
    """The round-trip of every conversation of a synth_tokenized file against its synth_harmony_v1 rows
    (`bpe`: the fast way first, see RoundTripChecker)."""
    return RoundTripChecker(encoding, bpe).check_many(paired_conversations(tokenized_path, harmony_path))
