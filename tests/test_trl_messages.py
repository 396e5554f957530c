"""The DistillKit dataset of the sample in TRL's conversational format (synthkd_training/trl_messages.py): every
row's messages render back, with openai-harmony, to exactly its tokens and its supervised tokens; TRL's GKD and
GOLD trainers, given a tokenizer whose chat template renders that Harmony format, rebuild exactly the row's
tokens and labels from them and train a tiny student against a tiny teacher for a step or two on CPU."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import trl
from openai_harmony import Conversation, Message, RenderConversationConfig, Role
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter
from trl.experimental.gkd import GKDConfig, GKDTrainer
from trl.experimental.gold import GOLDConfig, GOLDTrainer

from examples import train_trl_sft
from synthkd_assets.core.tokenizer import load_tiktoken_o200k
from synthkd_contract import constants
from synthkd_training.trl_messages import DistillRowError, convert_dataset, convert_row

IGNORE = constants.LABEL_IGNORE_ID
# The Harmony format of the DistillKit render, as a chat template: openai-harmony's training render with every
# analysis message kept (`thinking` -> the analysis channel, `content` -> final; the last reply ends with <|return|>)
HARMONY_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message.role == 'assistant' -%}"
    "{%- if message.thinking is defined and message.thinking is not none -%}"
    "<|start|>assistant<|channel|>analysis<|message|>{{ message.thinking }}<|end|>"
    "{%- endif -%}"
    "<|start|>assistant<|channel|>final<|message|>{{ message.content }}"
    "{{ '<|return|>' if loop.last and not add_generation_prompt else '<|end|>' }}"
    "{%- else -%}"
    "<|start|>{{ message.role }}<|message|>{{ message.content }}<|end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)
PAD = "<|endoftext|>"  # EOD_TOKEN_ID, as in examples/train_trl_sft.py
GPT_OSS_TEMPLATE = Path(trl.__file__).parent / "chat_templates" / "gptoss.jinja"  # "Original GPT-OSS chat template"


@pytest.fixture(scope="module")
def splits(built_sample, tmp_path_factory):
    """The sample's DistillKit dataset, verified against its manifest and read with `datasets`."""
    root = built_sample[1].data_layout().distill_root()
    return train_trl_sft.load_distillkit(root, tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def converted(splits, encoding):
    return convert_dataset(splits, encoding, verify=False)  # the oracle below renders every row itself


class _PinnedO200k(TikTokenConverter):
    """transformers' tiktoken converter reading the ranks of the verified local vocabulary (nothing fetched)."""

    def __init__(self, ranks: dict[bytes, int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.ranks = ranks

    def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:
        return self.ranks


@pytest.fixture(scope="module")
def harmony_tokenizer(tokenizer_dir, encoding) -> PreTrainedTokenizerFast:
    """o200k_harmony as a Hugging Face tokenizer (the way GPT-OSS's own was made: transformers' tiktoken
    converter, the special tokens at their ids) with the Harmony chat template above."""
    bpe = load_tiktoken_o200k(tokenizer_dir)
    specials = sorted(encoding.special_tokens_set, key=lambda t: encoding.encode(t, allowed_special="all")[0])
    backend = _PinnedO200k(bpe._mergeable_ranks, pattern=bpe._pat_str, extra_special_tokens=specials).converted()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=HARMONY_TEMPLATE, pad_token=PAD)
    tokenizer.model_max_length = constants.MAX_SEQ_LEN
    for name in (PAD, "<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>"):
        assert tokenizer.convert_tokens_to_ids(name) == encoding.encode(name, allowed_special="all")[0]
    return tokenizer


def harmony(chat: list[dict]) -> list[Message]:
    """The oracle's own reading of chat messages as Harmony messages (not the module's)."""
    messages = []
    for m in chat:
        if m["role"] != "assistant":
            messages.append(Message.from_role_and_content(Role(m["role"]), m["content"]))
            continue
        if m.get("thinking") is not None:
            messages.append(Message.from_role_and_content(Role.ASSISTANT, m["thinking"]).with_channel("analysis"))
        messages.append(Message.from_role_and_content(Role.ASSISTANT, m["content"]).with_channel("final"))
    return messages


def test_every_row_renders_back_to_its_tokens_and_its_supervised_tokens(splits, converted, encoding):
    config = RenderConversationConfig(auto_drop_analysis=False)
    with_analysis = 0
    for split, rows in splits.items():
        assert converted[split]["id"] == rows["id"] and converted[split]["source"] == rows["source"]
        for row, out in zip(rows, converted[split]):
            chat, ids, labels = out["messages"], row["input_ids"], row["labels"]
            assert [m["role"] for m in chat] == ["system", "user", "assistant"], row["id"]
            rendered = encoding.render_conversation_for_training(Conversation.from_messages(harmony(chat)), config)
            assert rendered == ids, row["id"]  # the row's tokens, without the EOD the build does not write
            # the supervised tokens are the reply's, after openai-harmony's completion render of the prompt
            prompt = Conversation.from_messages(harmony(chat[:-1]))
            start = len(encoding.render_conversation_for_completion(prompt, Role.ASSISTANT))
            assert [i for i, label in enumerate(labels) if label != IGNORE] == list(range(start, len(ids)))
            assert [label for label in labels if label != IGNORE] == ids[start:]
            reply = encoding.parse_messages_from_completion_tokens(ids[start:], Role.ASSISTANT)
            assert [(m.channel, m.content[0].text) for m in reply] == [
                *([("analysis", chat[-1]["thinking"])] if chat[-1]["thinking"] is not None else []),
                ("final", chat[-1]["content"]),
            ]
            with_analysis += chat[-1]["thinking"] is not None
    rows = sum(len(rows) for rows in splits.values())
    assert 0 < with_analysis < rows  # both shapes: with and without an analysis message


def test_the_formats_of_one_row(splits, encoding):
    row = splits["train"][0]
    messages = convert_row(row, encoding)
    assert messages.keys() == {"id", "source", "messages"} and messages["id"] == row["id"]
    pair = convert_row(row, encoding, format="prompt_completion")
    assert pair["prompt"] + pair["completion"] == messages["messages"] and len(pair["completion"]) == 1
    no_analysis = next(r for r in splits["train"] if r["spans"]["analysis_token_count"] == 0)
    assert "thinking" not in convert_row(no_analysis, encoding)["messages"][-1]  # absent, not ""
    with pytest.raises(ValueError, match="format must be one of"):
        convert_row(row, encoding, format="text")


def test_a_multi_turn_row_keeps_its_history_as_context(encoding):
    """An anchor source's shape (not in the SYNTH sample): the replies of the history are assistant messages of the
    prompt, the completion is the last reply."""
    turns = [
        Message.from_role_and_content(Role.USER, "Name a prime."),
        Message.from_role_and_content(Role.ASSISTANT, "7").with_channel("final"),
        Message.from_role_and_content(Role.USER, "And an even one?"),
        Message.from_role_and_content(Role.ASSISTANT, "the only one is 2").with_channel("analysis"),
        Message.from_role_and_content(Role.ASSISTANT, "2").with_channel("final"),
    ]
    ids = encoding.render_conversation_for_training(
        Conversation.from_messages(turns), RenderConversationConfig(auto_drop_analysis=False)
    )
    start = len(encoding.render_conversation_for_completion(Conversation.from_messages(turns[:3]), Role.ASSISTANT))
    row = {
        "id": "anchor:1",
        "source": {"dataset": "anchor"},
        "input_ids": ids,
        "labels": [IGNORE] * start + ids[start:],
        "spans": {"assistant_token_start": start},
    }
    assert convert_row(row, encoding, format="prompt_completion") == {
        "id": "anchor:1",
        "source": {"dataset": "anchor"},
        "prompt": [
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "And an even one?"},
        ],
        "completion": [{"role": "assistant", "content": "2", "thinking": "the only one is 2"}],
    }


def noncanonical(encoding, ids: list[int], start: int) -> list[int]:
    """`ids` with one token of the reply (a word of ASCII letters) split in two tokens: the same text, so it
    parses to the same messages, but not openai-harmony's render of them."""
    for i in range(start, len(ids)):
        text = encoding.decode([ids[i]])
        if len(text) >= 2 and text.isascii() and text.isalpha():
            head, tail = encoding.encode(text[:1]), encoding.encode(text[1:])
            if len(head) == len(tail) == 1:
                return ids[:i] + head + tail + ids[i + 1 :]
    raise AssertionError("no token of the reply to split")


def test_a_bad_row_is_named_with_its_reason(splits, encoding):
    row = dict(splits["train"][0])
    ids, labels, spans = row["input_ids"], row["labels"], row["spans"]
    start, end_id = spans["assistant_token_start"], encoding.encode("<|end|>", allowed_special="all")[0]
    user = Message.from_role_and_content(Role.USER, "hi")
    commentary = [
        Message.from_role_and_content(Role.ASSISTANT, "a note").with_channel("commentary"),
        Message.from_role_and_content(Role.ASSISTANT, "hello").with_channel("final"),
    ]
    other = encoding.render_conversation_for_training(Conversation.from_messages([user, *commentary]))
    other_start = len(encoding.render_conversation_for_completion(Conversation.from_messages([user]), Role.ASSISTANT))
    cases = {
        "labels are not -100 before assistant_token_start": {"labels": [ids[0]] + labels[1:]},
        "labels are not -100 before assistant_token_start .* and input_ids from there on": {
            "labels": labels[:start] + [IGNORE] + labels[start + 1 :]
        },
        "assistant_token_start 0 is outside": {"spans": {**spans, "assistant_token_start": 0}},
        "input_ids do not parse as Harmony messages": {
            "input_ids": ids[: start + 3] + [end_id] + ids[start + 4 :],
            "labels": labels[: start + 3] + [end_id] + labels[start + 4 :],
        },
        r"\d+ labels for \d+ input_ids": {"labels": labels[:-1]},
        "assistant channel 'commentary' is neither analysis nor final": {
            "input_ids": other,
            "labels": [IGNORE] * other_start + other[other_start:],
            "spans": {**spans, "assistant_token_start": other_start},
        },
    }
    for reason, change in cases.items():
        with pytest.raises(DistillRowError, match=f"DistillKit row '{row['id']}': .*{reason}"):
            convert_row({**row, **change}, encoding)
    # the header check: assistant_token_start one token late, labels consistent with it
    late = {
        "labels": labels[:start] + [IGNORE] + labels[start + 1 :],
        "spans": {**spans, "assistant_token_start": start + 1},
    }
    with pytest.raises(DistillRowError, match=f"assistant_token_start is {start + 1}, but .* ends at token {start}"):
        convert_row({**row, **late}, encoding)
    # tokens that parse to the same messages but are not their render: only `verify` sees them
    split = noncanonical(encoding, ids, start)
    odd = {**row, "input_ids": split, "labels": labels[:start] + split[start:]}
    assert convert_row(odd, encoding, verify=False) == convert_row(row, encoding)
    with pytest.raises(DistillRowError, match="not openai-harmony's render of their own messages"):
        convert_row(odd, encoding)
    # a dataset stops at its first bad row, naming it
    bad = splits["validation"].map(lambda r, i: {"labels": r["labels"][i == 3 :]}, with_indices=True)
    with pytest.raises(DistillRowError, match=f"DistillKit row '{splits['validation'][3]['id']}': "):
        convert_dataset(bad, encoding)
    with pytest.raises(ValueError, match="not a DistillKit dataset: no column labels"):
        convert_dataset(splits["validation"].remove_columns("labels"), encoding)


def tiny_pair():
    """A tiny student and a tiny teacher (random Llamas over the padded o200k_harmony vocabulary, from a config)."""
    return train_trl_sft.tiny_model(seed=0), train_trl_sft.tiny_model(seed=1)


def recording(trainer) -> list[dict]:
    """The batches the trainer computes its loss on, recorded through its `compute_loss`."""
    batches, compute_loss = [], trainer.compute_loss

    def record(model, inputs, *args, **kwargs):
        batches.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = record
    return batches


def common(tmp_path, steps: int) -> dict:
    return dict(
        output_dir=str(tmp_path / "out"),
        max_length=constants.MAX_SEQ_LEN,  # None would be 1024 in TRL's ChatML collator: long rows cut
        max_steps=steps,
        per_device_train_batch_size=1,
        learning_rate=1e-2,
        lmbda=0.0,  # off-policy only: the dataset's replies, no sampling from the random student
        beta=0.0,  # the forward KL: the cheapest of the generalized JSD losses over 201,088 classes on CPU
        bf16=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
    )


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: pin_memory without an accelerator
def test_gkd_trains_on_the_rows_tokens_and_labels(splits, converted, harmony_tokenizer, tmp_path):
    rows = train_trl_sft.shortest_rows(splits["train"], 2)
    train = converted["train"].select([converted["train"]["id"].index(i) for i in rows["id"]])
    student, teacher = tiny_pair()
    config = GKDConfig(**common(tmp_path, steps=2))
    trainer = GKDTrainer(
        model=student, teacher_model=teacher, args=config, train_dataset=train, processing_class=harmony_tokenizer
    )
    batches = recording(trainer)
    initial = {name: p.detach().clone() for name, p in student.named_parameters()}
    result = trainer.train()

    by_ids = {tuple(r["input_ids"]): r for r in rows}
    assert len(batches) == 2
    seen = set()
    for batch in batches:
        n = int(batch["attention_mask"][0].sum())  # left padding; batch of one: none
        ids = batch["input_ids"][0, -n:].tolist()
        row = by_ids[tuple(ids)]  # the written row's tokens, rebuilt from its messages by the chat template
        assert batch["labels"][0, -n:].tolist() == row["labels"]
        assert batch["prompts"][0].tolist() == ids[: row["spans"]["assistant_token_start"]]
        seen.add(row["id"])
    assert seen == set(rows["id"])
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert result.global_step == 2 and len(losses) == 2 and all(math.isfinite(x) and x > 0 for x in losses)
    assert all(not torch.equal(initial[name], p.detach()) for name, p in student.named_parameters())


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_gold_prepares_the_rows_tokens_from_either_format_and_trains(
    splits, converted, encoding, harmony_tokenizer, tmp_path
):
    rows = train_trl_sft.shortest_rows(splits["train"], 2)
    picked = [converted["train"]["id"].index(i) for i in rows["id"]]
    pairs = convert_dataset(splits["train"].select(picked), encoding, format="prompt_completion")
    for train, steps in ((converted["train"].select(picked), 1), (pairs, 0)):
        student, teacher = tiny_pair()
        config = GOLDConfig(**common(tmp_path, steps=max(steps, 1)), max_completion_length=16)
        trainer = GOLDTrainer(
            model=student, teacher_model=teacher, args=config, train_dataset=train, processing_class=harmony_tokenizer
        )
        # GOLD tokenizes with the chat template up front: exactly the row's tokens, its completion where labels are
        prepared = {r["id"]: r for r in trainer.train_dataset}
        for row in rows:
            assert prepared[row["id"]]["input_ids"] == row["input_ids"]
            assert prepared[row["id"]]["completion_mask"] == [int(label != IGNORE) for label in row["labels"]]
        if steps:
            batches = recording(trainer)
            result = trainer.train()
            assert result.global_step == 1 and len(batches) == 1
            n = int(batches[0]["attention_mask"][0].sum())
            assert batches[0]["labels"][0, -n:].tolist() in [r["labels"] for r in rows]
            assert math.isfinite(result.training_loss)


def test_the_gpt_oss_template_renders_the_reply_as_written_and_its_own_system_block(
    splits, converted, encoding, harmony_tokenizer
):
    """A GPT-OSS student's own chat template (the one TRL ships as gpt-oss's original): given the messages without
    the system message, it renders the row's text but for the date line of the system block it writes itself; a
    system message would become developer instructions. A reply without analysis reads `thinking: None` from the
    dataset, which transformers renders as no analysis message."""
    template = GPT_OSS_TEMPLATE.read_text(encoding="utf-8")
    rows = {r["spans"]["analysis_token_count"] > 0: r for r in splits["validation"]}
    assert rows.keys() == {True, False}
    index = converted["validation"]["id"].index
    for row in rows.values():
        chat = converted["validation"][index(row["id"])]["messages"]
        text = harmony_tokenizer.apply_chat_template(chat[1:], chat_template=template, tokenize=False)
        assert re.sub(r"Current date: \d{4}-\d{2}-\d{2}\n", "", text, count=1) == encoding.decode(row["input_ids"])
        with_system = harmony_tokenizer.apply_chat_template(chat, chat_template=template, tokenize=False)
        assert f"<|start|>developer<|message|># Instructions\n\n{chat[0]['content']}\n\n<|end|>" in with_system
