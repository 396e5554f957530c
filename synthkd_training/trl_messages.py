"""The DistillKit dataset (synth_distill) in the conversational format of TRL's GKD and GOLD trainers.

TRL's `GKDTrainer` and `GOLDTrainer` (trl.experimental) do not train on pre-tokenized rows: their collator
(`DataCollatorForChatML`) renders a `messages` column with the tokenizer's chat template and takes the prompt as
`messages[:-1]` with a generation prompt; GOLD also takes `prompt` + `completion` (the completion is the last
assistant message). Both treat the last message as the completion, so one assistant reply must be one message:
its analysis channel goes in `thinking` (the field GPT-OSS's chat template renders as the analysis message), its
final channel in `content`.

The messages are read off each row's own tokens: `input_ids` is openai-harmony's training render of the
conversation (analysis kept, without the EOD), so `parse_messages_from_completion_tokens` gives the messages back,
and rendering them again gives `input_ids` exactly (checked with `verify`). Nothing is re-tokenized. `id` and
`source` are kept; the tokens, `labels`, `attention_mask` and `spans` are not: the trainer rebuilds tokens and the
completion mask from the chat template of its tokenizer (docs/distillation.md, "TRL's GKD and GOLD trainers").

openai-harmony (a dependency of the package) is all a row needs; `datasets` (the `test` extra, with TRL) only
`convert_dataset`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from openai_harmony import Conversation, HarmonyEncoding, Message, RenderConversationConfig, Role, TextContent

from synthkd_contract import constants

if TYPE_CHECKING:
    import datasets

TrlFormat = Literal["messages", "prompt_completion"]
TRL_FORMATS: tuple[str, ...] = ("messages", "prompt_completion")
KEPT_COLUMNS: tuple[str, ...] = ("id", "source")  # carried over from the DistillKit row unchanged
READ_COLUMNS: tuple[str, ...] = ("id", "input_ids", "labels", "spans")  # what a conversion reads
# the DistillKit render (synthkd_assets/core/render.py): the training render with every analysis message kept
RENDER_CONFIG = RenderConversationConfig(auto_drop_analysis=False)
ANALYSIS, FINAL = "analysis", "final"
CONTEXT_ROLES: tuple[str, ...] = ("system", "developer", "user")  # the other roles a DistillKit prompt holds


class DistillRowError(ValueError):
    """A DistillKit row that cannot be converted; the message names the row's id and the reason.

    Attributes:
        row_id: The row's `id` (`"<no id>"` when the row has none).
        reason: Why the row cannot be converted.
    """

    def __init__(self, row_id: str, reason: str) -> None:
        super().__init__(f"DistillKit row {row_id!r}: {reason}")
        self.row_id = row_id
        self.reason = reason


def harmony_messages(row: Mapping[str, Any], encoding: HarmonyEncoding, *, verify: bool = True) -> list[Message]:
    """The Harmony messages a DistillKit row's `input_ids` render, parsed back with openai-harmony.

    Always checked: `labels` is -100 before `spans.assistant_token_start` and `input_ids` from there on, the tokens
    parse (strictly) into text messages of the roles and channels a DistillKit conversation has, the completion
    (the assistant messages after the last non-assistant one) is one reply, an optional analysis then a final, and
    `assistant_token_start` is where its `<|start|>assistant` header ends.

    Args:
        row: A DistillKit row: `id`, `input_ids`, `labels` and `spans` (as `datasets` or pyarrow's `to_pylist`
            give it).
        encoding: openai-harmony's GPT-OSS encoding (`load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)`;
            offline, `synthkd_assets.core.tokenizer.load_harmony_encoding(tokenizer_dir)`).
        verify: Also render the messages back: the training render must be `input_ids` exactly and the
            completion render of the prompt messages its first `assistant_token_start` tokens. Costs about as
            much as the parse.

    Returns:
        The messages, in order (system, user, ..., then the completion's analysis and final).

    Raises:
        DistillRowError: The row is not a well-formed DistillKit row (the message says why).
    """
    row_id = str(row.get("id", "<no id>"))
    try:
        ids = [int(token) for token in row["input_ids"]]
        labels = [int(label) for label in row["labels"]]
        start = int(row["spans"]["assistant_token_start"])
    except (KeyError, TypeError, ValueError) as error:
        raise DistillRowError(row_id, f"not a DistillKit row (input_ids, labels, spans): {error!r}") from error
    _check_labels(row_id, ids, labels, start)
    try:
        messages = encoding.parse_messages_from_completion_tokens(ids, None, strict=True)
    except BaseException as error:  # HarmonyError, and a Rust panic (a BaseException) on a malformed sequence
        if isinstance(error, (KeyboardInterrupt, SystemExit, GeneratorExit, MemoryError)):
            raise
        raise DistillRowError(
            row_id, f"input_ids do not parse as Harmony messages: {type(error).__name__}: {error}"
        ) from error
    for index, message in enumerate(messages):
        _check_message(row_id, index, message)
    first = completion_index(messages)
    _check_completion(row_id, messages[first:])
    _check_completion_start(row_id, encoding, ids, start, first)
    if verify:
        _verify_render(row_id, encoding, ids, start, messages, first)
    return messages


def completion_index(messages: Sequence[Message]) -> int:
    """The index of the completion's first message: the one after the last non-assistant message (the split of
    synthkd_assets/core/render.py's `completion_start`).

    Args:
        messages: A conversation's Harmony messages.

    Returns:
        The index (`len(messages)` when the last message is not an assistant's).
    """
    return 1 + max((i for i, m in enumerate(messages) if m.author.role != Role.ASSISTANT), default=-1)


def chat_messages(messages: Sequence[Message]) -> list[dict[str, str]]:
    """Harmony messages as chat messages `{role, content[, thinking]}`: each assistant reply (an optional analysis
    message, then a final one) becomes one assistant message with the analysis text in `thinking` and the final
    text in `content`; the other messages keep their role and text. `thinking` is left out when the reply has no
    analysis (not set to ""), so a template that tests for the key renders no analysis message.

    Args:
        messages: Messages that `harmony_messages` accepted.

    Returns:
        The chat messages, in order.

    Raises:
        ValueError: An analysis message not followed by a final one.
    """
    chat: list[dict[str, str]] = []
    thinking: str | None = None
    for message in messages:
        text = message.content[0].text
        if message.author.role != Role.ASSISTANT:
            if thinking is not None:
                raise ValueError("an analysis message is not followed by a final one")
            chat.append({"role": message.author.role.value, "content": text})
        elif message.channel == ANALYSIS:
            if thinking is not None:
                raise ValueError("two analysis messages in one assistant reply")
            thinking = text
        else:
            reply = {"role": "assistant", "content": text}
            if thinking is not None:
                reply["thinking"] = thinking
            chat.append(reply)
            thinking = None
    if thinking is not None:
        raise ValueError("an analysis message is not followed by a final one")
    return chat


def convert_row(
    row: Mapping[str, Any], encoding: HarmonyEncoding, *, format: TrlFormat = "messages", verify: bool = True
) -> dict[str, Any]:
    """One DistillKit row in TRL's conversational format, with its `id` and `source`.

    Args:
        row: A DistillKit row (`id`, `source`, `input_ids`, `labels`, `spans`, ...).
        encoding: openai-harmony's GPT-OSS encoding.
        format: `"messages"`: `{id, source, messages}` (GKD and GOLD); `"prompt_completion"`:
            `{id, source, prompt, completion}`, the completion being the one assistant message (GOLD, SFT; not
            GKD, whose collator reads a `prompt` column as already formatted text).
        verify: Render the parsed messages back and compare with the row's tokens (`harmony_messages`).

    Returns:
        The converted row: plain dicts and strings, `thinking` present only on replies with an analysis.

    Raises:
        DistillRowError: The row is not a well-formed DistillKit row.
        ValueError: `format` is not one of `TRL_FORMATS`.
    """
    if format not in TRL_FORMATS:
        raise ValueError(f"format must be one of {TRL_FORMATS}, not {format!r}")
    messages = harmony_messages(row, encoding, verify=verify)
    try:
        chat = chat_messages(messages)
    except ValueError as error:  # an assistant reply of the history that is not (analysis,) final
        raise DistillRowError(str(row.get("id", "<no id>")), str(error)) from error
    kept = {column: row.get(column) for column in KEPT_COLUMNS}
    if format == "messages":
        return {**kept, "messages": chat}
    return {**kept, "prompt": chat[:-1], "completion": chat[-1:]}


def convert_dataset(
    dataset: datasets.Dataset | datasets.DatasetDict,
    encoding: HarmonyEncoding,
    *,
    format: TrlFormat = "messages",
    verify: bool = True,
) -> datasets.Dataset | datasets.DatasetDict:
    """A verified DistillKit dataset (or one split of it) in TRL's conversational format.

    Load and verify the dataset first (`examples/train_trl_sft.py`'s `load_distillkit`: the root must verify
    against its sealed manifest before `datasets` reads it). The result has the columns `id`, `source` and
    `messages` (or `prompt` and `completion`). In a `datasets` table every message has a `thinking` field: None on
    a reply without analysis (Arrow has no optional keys). One process: the encoding cannot be pickled.

    Args:
        dataset: The DistillKit dataset as `datasets` reads it: a `DatasetDict` of splits, or one `Dataset`.
        encoding: openai-harmony's GPT-OSS encoding.
        format: `"messages"` or `"prompt_completion"` (`convert_row`).
        verify: Render each row's messages back and compare with its tokens (`harmony_messages`).

    Returns:
        The converted dataset, of the same kind as `dataset`, rows in the same order.

    Raises:
        DistillRowError: A row is not a well-formed DistillKit row (the first one met stops the conversion).
        ValueError: A column the conversion reads is missing, or `format` is unknown.
    """
    import datasets  # the test extra's (with TRL); a row needs openai-harmony only

    if format not in TRL_FORMATS:
        raise ValueError(f"format must be one of {TRL_FORMATS}, not {format!r}")
    if isinstance(dataset, datasets.DatasetDict):
        return datasets.DatasetDict(
            {split: convert_dataset(part, encoding, format=format, verify=verify) for split, part in dataset.items()}
        )
    missing = [column for column in (*READ_COLUMNS, *KEPT_COLUMNS) if column not in dataset.column_names]
    if missing:
        raise ValueError(f"not a DistillKit dataset: no column {', '.join(sorted(set(missing)))}")
    message = {name: datasets.Value("string") for name in ("role", "content", "thinking")}
    added = ("messages",) if format == "messages" else ("prompt", "completion")
    features = datasets.Features(
        {
            **{column: dataset.features[column] for column in KEPT_COLUMNS},
            **{column: datasets.List(message) for column in added},
        }
    )

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        converted = convert_row(row, encoding, format=format, verify=verify)
        return {column: [{"thinking": None, **m} for m in converted[column]] for column in added}

    return dataset.map(
        convert,
        remove_columns=[column for column in dataset.column_names if column not in KEPT_COLUMNS],
        features=features,
        new_fingerprint=_fingerprint(dataset, encoding, format, verify),
        desc=f"DistillKit -> TRL {format}",
    )


def _fingerprint(dataset: datasets.Dataset, encoding: HarmonyEncoding, format: str, verify: bool) -> str:
    """The converted dataset's `datasets` fingerprint: the input's, the settings and this module's source (the
    encoding cannot be hashed by `datasets`, which would otherwise pick a random one and never reuse its cache)."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(f"{dataset._fingerprint}|{encoding.name}|{format}|{verify}".encode())
    return digest.hexdigest()[:32]


def _check_labels(row_id: str, ids: list[int], labels: list[int], start: int) -> None:
    """DistillKit's labels: -100 on the prompt (before `start`), the tokens themselves on the completion."""
    if not ids:
        raise DistillRowError(row_id, "input_ids is empty")
    if len(labels) != len(ids):
        raise DistillRowError(row_id, f"{len(labels)} labels for {len(ids)} input_ids")
    if not 0 < start < len(ids):
        raise DistillRowError(row_id, f"assistant_token_start {start} is outside the {len(ids)} input_ids")
    ignored = constants.LABEL_IGNORE_ID
    if any(label != ignored for label in labels[:start]) or labels[start:] != ids[start:]:
        raise DistillRowError(
            row_id,
            f"labels are not {ignored} before assistant_token_start ({start}) and input_ids from there on",
        )


def _check_message(row_id: str, index: int, message: Message) -> None:
    """A message a chat message can hold: one text content, no author name or recipient, and a role (and for an
    assistant a channel) of a DistillKit conversation."""
    role, channel = message.author.role.value, message.channel
    where = f"message {index} ({role}{'/' + channel if channel else ''})"
    if len(message.content) != 1 or not isinstance(message.content[0], TextContent):
        raise DistillRowError(row_id, f"{where} is not one text content")
    if message.author.name or message.recipient or message.content_type:
        raise DistillRowError(row_id, f"{where} has an author name, recipient or content type: no chat field for it")
    if role == Role.ASSISTANT.value:
        if channel not in (ANALYSIS, FINAL):
            raise DistillRowError(row_id, f"{where}: assistant channel {channel!r} is neither analysis nor final")
    elif role not in CONTEXT_ROLES or channel is not None:
        raise DistillRowError(row_id, f"{where}: not a system, developer or user message without a channel")


def _check_completion(row_id: str, completion: Sequence[Message]) -> None:
    """The completion is one assistant reply: an optional analysis, then a final."""
    channels = [message.channel for message in completion]
    if channels not in ([FINAL], [ANALYSIS, FINAL]):
        raise DistillRowError(
            row_id, f"the completion is not one assistant reply (analysis, final or final): channels {channels}"
        )


def _check_completion_start(row_id: str, encoding: HarmonyEncoding, ids: list[int], start: int, first: int) -> None:
    """`assistant_token_start` ends the completion's `<|start|>assistant` header: message `first` opens at the
    `first`-th `<|start|>` (a strict parse leaves no special token in a content)."""
    header = encoding.render_conversation_for_completion(Conversation.from_messages([]), Role.ASSISTANT)
    opens = [i for i, token in enumerate(ids) if token == header[0]]
    if len(opens) <= first:
        raise DistillRowError(row_id, f"{len(opens)} <|start|> tokens for a completion at message {first}")
    end = opens[first] + len(header)
    if ids[opens[first] : end] != header or end != start:
        raise DistillRowError(
            row_id,
            f"assistant_token_start is {start}, but the completion's <|start|>assistant header ends at token {end}",
        )


def _verify_render(
    row_id: str, encoding: HarmonyEncoding, ids: list[int], start: int, messages: list[Message], first: int
) -> None:
    """openai-harmony renders the parsed messages back to the row's tokens, and their prompt to its prompt."""
    rendered = encoding.render_conversation_for_training(Conversation.from_messages(messages), RENDER_CONFIG)
    if rendered != ids:
        at = next((i for i, (a, b) in enumerate(zip(rendered, ids)) if a != b), min(len(rendered), len(ids)))
        raise DistillRowError(
            row_id,
            f"input_ids are not openai-harmony's render of their own messages ({len(ids)} tokens, the render "
            f"{len(rendered)}; first difference at token {at})",
        )
    prompt = Conversation.from_messages(messages[:first])
    if encoding.render_conversation_for_completion(prompt, Role.ASSISTANT) != ids[:start]:
        raise DistillRowError(
            row_id, "the prompt messages' completion render is not the first assistant_token_start tokens"
        )
