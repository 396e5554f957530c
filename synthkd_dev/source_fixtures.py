"""Small shards of every anchor source in its published schema and file format, hostile rows included.

    python -m synthkd_dev.source_fixtures OUT_DIR      # writes OUT_DIR/<source key>/<file> for every source

Nothing is downloaded: the rows are written here, in the layout each dataset's card publishes (docs/sources.md),
restated independently of the adapters' own declarations so that a wrong declaration shows. Every fixture says,
per row, what must happen to it (`Fixture.expected`: source_row -> drop reason, or None when the row becomes a
conversation): the tests' oracle. The shards are never part of data/sample (the SYNTH sample's bytes stay).

Each source has good single- and multi-turn rows, reasoning-bearing rows (a separate reasoning field, `<think>`
blocks), very long and non-English rows, and hostile ones: empty / whitespace turns, NUL characters, missing
fields, unknown roles, wrong types (JSONL), duplicated ids, and for oasst1 deleted messages, orphans, broken and
multi-branch trees. `wrong_schema_shards` writes files another dataset's columns or types would give.

The schemas (`*_SCHEMA`), the row builders (`nemotron_row`, `nemotron_message`, `hendrycks_row`, `competition_row`,
`opencode_row`, `ultrachat_row`, `oasst_row`, `chatml`) and the writers (`write_parquet`, `write_jsonl`) are shared
with synthkd_dev/source_sample.py, which writes the committed sample data/sample/sources with them.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_contract import drops

LONG_TEXT = "Consider the sequence of partial sums once more. " * 800  # ~40k characters, ~8k tokens
FRENCH = "Pouvez-vous expliquer pourquoi le ciel est bleu ? Répondez en français, s'il vous plaît."
GERMAN = "Wie funktioniert die Photosynthese? Bitte erkläre es einfach."
CHINESE = "请解释一下光合作用的过程。"


@dataclass(frozen=True)
class Fixture:
    """One written shard and the fate of each of its rows (source_row -> drop reason, None: a conversation)."""

    source: str
    path: Path
    expected: dict[int, str | None]


def write_parquet(path: Path, rows: list[dict[str, Any]], schema: pa.Schema) -> None:
    """`rows` as one Parquet file in `schema`: fixed options (zstd at its default level, no Arrow schema or pandas
    metadata), so the same rows give the same bytes for a given pyarrow version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, compression="zstd", store_schema=False)


def write_jsonl(path: Path, lines: list[str]) -> None:
    """Each line (a JSON text, or anything else a hostile shard holds) followed by a newline, UTF-8."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _fixture(source: str, path: Path, fates: list[str | None]) -> Fixture:
    return Fixture(source, path, dict(enumerate(fates)))


# --- nvidia/Nemotron-Math-v2 (JSONL) -----------------------------------------------------------------------
def nemotron_row(uuid: Any, messages: Any, **overrides: Any) -> dict[str, Any]:
    row = {
        "problem": "problem text",
        "expected_answer": "4",
        "original_expected_answer": None,
        "changed_answer_to_majority": False,
        "data_source": "aops",
        "messages": messages,
        "metadata": {"reason_high_with_tool": {"count": 16, "pass": 12, "accuracy": 0.75}},
        "license": "cc-by-4.0",
        "used_in": ["nano_v3"],
        "uuid": uuid,
        "url": "https://artofproblemsolving.com/community/c6h1",
        "user_url": "https://artofproblemsolving.com/community/user/1",
        "user_name": "solver",
        "tools": [],
    }
    row.update(overrides)
    return row


def nemotron_message(role: str, content: Any, reasoning: Any = None) -> dict[str, Any]:
    message = {"role": role, "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def nemotron_math_v2(root: Path) -> Fixture:
    msg = nemotron_message
    user = "Solve the following math problem. What is $2+2$? Put the final answer in \\boxed{}."
    lines_and_fates: list[tuple[str, str | None]] = []

    def add(row: Any, fate: str | None) -> None:
        lines_and_fates.append((row if isinstance(row, str) else json.dumps(row, ensure_ascii=False), fate))

    add(nemotron_row("u-1", [msg("user", user), msg("assistant", "The answer is $\\boxed{4}$.", "2+2=4.")]), None)
    add(nemotron_row("u-1", [msg("user", user), msg("assistant", "$\\boxed{4}$", "Add: 2 and 2 make 4.")]), None)
    add(nemotron_row("u-1", [msg("user", user), msg("assistant", "The answer is $\\boxed{4}$.", "2+2=4.")]),
        drops.DROP_DUPLICATE_SYNTH_ID)  # fmt: skip
    tool_call = [
        msg("user", user),
        msg("assistant", "", "Let me compute with Python."),
        msg("tool", "4"),
        msg("assistant", "$\\boxed{4}$", "The tool says 4."),
    ]
    add(nemotron_row("u-2", tool_call, tools=[{"type": "function", "function": {"name": "stateful_python"}}]),
        drops.DROP_UNSUPPORTED_ROLE)  # fmt: skip
    add(nemotron_row("u-3", [msg("user", user), msg("assistant", " \n\t ", "thinking")]), drops.DROP_EMPTY_TURN)
    add(nemotron_row("u-4", [msg("user", "Compute\x00 $3 \\cdot 3$."), msg("assistant", "$\\boxed{9}$", "")]), None)
    add(nemotron_row("u-5", "not a list of messages"), drops.DROP_WRONG_TYPE)
    add('{"problem": "unterminated', drops.DROP_INVALID_JSON_LINE)
    add("[1, 2, 3]", drops.DROP_INVALID_JSON_LINE)
    no_messages = nemotron_row("u-6", None)
    del no_messages["messages"]
    add(no_messages, drops.DROP_EMPTY_CONVERSATION)
    add(nemotron_row("u-7", [msg("user", user), msg("assistant", "$\\boxed{4}$", LONG_TEXT)]), None)
    no_uuid = nemotron_row(None, [msg("user", user), msg("assistant", "$\\boxed{4}$", "ok")])
    add(no_uuid, drops.DROP_MISSING_SOURCE_ID)
    think = "<think>Two and two: 4.</think>\n\nThe answer is $\\boxed{4}$."
    add(nemotron_row("u-8", [msg("user", user), msg("assistant", think)]), None)
    truncated = "<think>Two and two make"  # a reasoning trace cut off before its answer
    add(nemotron_row("u-11", [msg("user", user), msg("assistant", truncated)]), drops.DROP_UNTERMINATED_THINK)
    add(nemotron_row("u-9", [{"role": 5, "content": user}, msg("assistant", "4")]), drops.DROP_WRONG_TYPE)
    add(nemotron_row("u-10", [msg("user", user), msg("assistant", "4")], data_source=17), drops.DROP_WRONG_TYPE)
    add('{"a": ' * 5000 + "1" + "}" * 5000, drops.DROP_INVALID_JSON_LINE)  # nested past Python's recursion limit
    lone = nemotron_row("u-12", [msg("user", "half a pair: \ud800"), msg("assistant", "4")])
    add(json.dumps(lone), drops.DROP_INVALID_JSON_LINE)  # the escape "\ud800": JSON syntax, not Unicode text
    path = root / "nemotron_math_v2" / "low.jsonl"
    lines = [line for line, _ in lines_and_fates]
    lines.insert(3, "")  # a blank line is no row
    write_jsonl(path, lines)
    return _fixture("nemotron_math_v2", path, [fate for _, fate in lines_and_fates])


# --- PrimeIntellect/Hendrycks-Math (Parquet) ----------------------------------------------------------------
HENDRYCKS_SCHEMA = pa.schema(
    [
        ("question", pa.string()),
        ("answer", pa.string()),
        ("info", pa.struct([("problem_id", pa.string()), ("task_type", pa.string())])),
        ("difficulty", pa.float64()),
    ]
)


def hendrycks_row(
    question: Any, answer: Any, problem_id: Any, info: bool = True, difficulty: float = 0.4
) -> dict[str, Any]:
    """A Hendrycks-Math row; `info=False` leaves the whole info struct null."""
    return {
        "question": question,
        "answer": answer,
        "info": {"problem_id": problem_id, "task_type": "verifiable_math"} if info else None,
        "difficulty": difficulty,
    }


def hendrycks_math(root: Path) -> Fixture:
    row = hendrycks_row
    rows = [
        (row("Calculate: $(243)^{\\frac35}$", "27", "hm-1"), None),
        (row("Find the slope of the line perpendicular to $2x + 3y = 6$.", "\\frac{3}{2}", "hm-2"), None),
        (row("Calculate: $(243)^{\\frac35}$ again", "27", "hm-1"), drops.DROP_DUPLICATE_SYNTH_ID),
        (row("What is $1+1$?", None, "hm-3"), drops.DROP_EMPTY_TURN),
        (row("What is $2+1$?", "3", None), drops.DROP_MISSING_SOURCE_ID),
        (row("  \n ", "3", "hm-4"), drops.DROP_EMPTY_TURN),
        (row("What is\x00 $5-2$?", "3", "hm-5"), None),
        (row(LONG_TEXT + "What is $1+1$?", "2", "hm-6"), None),
        (row("What is $4/2$?", "2", None, info=False), drops.DROP_MISSING_SOURCE_ID),
    ]
    path = root / "hendrycks_math" / "train-00000-of-00001.parquet"
    write_parquet(path, [r for r, _ in rows], HENDRYCKS_SCHEMA)
    return _fixture("hendrycks_math", path, [fate for _, fate in rows])


# --- qwedsacf/competition_math (Parquet) --------------------------------------------------------------------
COMPETITION_SCHEMA = pa.schema([(name, pa.string()) for name in ("problem", "level", "type", "solution")])


def competition_row(problem: Any, solution: Any, level: str = "Level 2", kind: str = "Algebra") -> dict[str, Any]:
    return {"problem": problem, "level": level, "type": kind, "solution": solution}


def competition_math(root: Path) -> Fixture:
    row = competition_row
    ceil = "Evaluate $\\left\\lceil-\\sqrt{\\frac{49}{4}}\\right\\rceil$."
    solution = "Since $-\\sqrt{\\frac{49}{4}} = -\\frac72$, the smallest integer above it is $\\boxed{-3}$."
    rows = [
        (row(ceil, solution), None),
        (row("What is $3!$?", "$3! = 6$, so the answer is $\\boxed{6}$.", "Level 1", "Counting & Probability"), None),
        (row(ceil, solution), drops.DROP_DUPLICATE_SYNTH_ID),
        (row("What is $0!$?", None), drops.DROP_EMPTY_TURN),
        (row(None, "$\\boxed{1}$"), drops.DROP_EMPTY_TURN),
        (row("What is $2^{10}$?\x00", "$2^{10} = \\boxed{1024}$."), None),
        (row("Sum the series. " + LONG_TEXT, "$\\boxed{0}$"), None),
    ]
    path = root / "competition_math" / "train-00000-of-00001.parquet"
    write_parquet(path, [r for r, _ in rows], COMPETITION_SCHEMA)
    return _fixture("competition_math", path, [fate for _, fate in rows])


# --- nvidia/OpenCodeInstruct (Parquet) ----------------------------------------------------------------------
OPENCODE_COLUMNS = (
    "id",
    "input",
    "output",
    "domain",
    "generation_algorithm",
    "llm_judgement",
    "unit_tests",
    "tests_execution_status",
    "average_test_score",
)
OPENCODE_SCHEMA = pa.schema([(name, pa.string()) for name in OPENCODE_COLUMNS])


def opencode_row(row_id: Any, instruction: Any, output: Any, **overrides: Any) -> dict[str, Any]:
    """An OpenCodeInstruct row (every column a string); `overrides` replace the optional columns' values."""
    row = {
        "id": row_id,
        "input": instruction,
        "output": output,
        "domain": "generic",
        "generation_algorithm": "self-instruct",
        "llm_judgement": '{"requirement_conformance": {"score": 5}}',
        "unit_tests": '["assert find_mode([1, 2, 2]) == 2"]',
        "tests_execution_status": '["pass"]',
        "average_test_score": "1",
    }
    row.update(overrides)
    return row


def opencodeinstruct(root: Path) -> Fixture:
    row = opencode_row
    task = "You are given a list of integers `numbers`. Implement `find_mode` returning the most frequent element."
    code = "```python\ndef find_mode(numbers):\n    return max(set(numbers), key=numbers.count)\n```"
    add = "```python\ndef add(a, b):\n    return a + b\n```"
    rows = [
        (row("oci-1", task, code), None),
        (row("oci-2", "Write `add(a, b)` returning the sum.", add), None),
        (row("oci-1", task + " Again.", code), drops.DROP_DUPLICATE_SYNTH_ID),
        (row("   ", task, code), drops.DROP_MISSING_SOURCE_ID),
        (row("oci-3", task, None), drops.DROP_EMPTY_TURN),
        (row("oci-4", task, "```python\n" + "x = 1\n" * 6000 + "```"), None),
        (row("oci-5", "Écrivez une fonction `carre(x)` qui renvoie le carré.", "def carre(x):\n    return x**2"), None),
    ]
    path = root / "opencodeinstruct" / "train-00000-of-00001.parquet"
    write_parquet(path, [r for r, _ in rows], OPENCODE_SCHEMA)
    return _fixture("opencodeinstruct", path, [fate for _, fate in rows])


# --- agentica-org/DeepCoder-Preview-Dataset (Parquet) -------------------------------------------------------
DEEPCODER_SCHEMA = pa.schema([("problem", pa.string()), ("tests", pa.string()), ("metadata", pa.string())])
DEEPCODER_DERIVED_SCHEMA = DEEPCODER_SCHEMA.append(pa.field("solutions", pa.list_(pa.string())))


def deepcoder(root: Path) -> list[Fixture]:
    """The published layout (no solution: every row is no_reference_answer) and a derived one with `solutions`."""
    problem = "Monocarp is opening his own IT company. Print the skill of the team for each candidate."
    tests = json.dumps([{"input": "1\n1 0\n2 1\n1 2\n", "output": "2 1\n", "testtype": "stdin"}])
    published = [{"problem": problem, "tests": tests, "metadata": "{}"} for _ in range(2)]
    published.append({"problem": "Count the ordered pairs (a, b).", "tests": tests, "metadata": None})
    path = root / "deepcoder" / "primeintellect" / "train-00000-of-00001.parquet"
    write_parquet(path, published, DEEPCODER_SCHEMA)
    fixtures = [_fixture("deepcoder", path, [drops.DROP_NO_REFERENCE_ANSWER] * len(published))]
    solution = "```python\nt = int(input())\nprint(t)\n```"
    derived = [
        ({"problem": problem, "tests": tests, "metadata": "{}", "solutions": [solution, "print(0)"]}, None),
        ({"problem": problem, "tests": tests, "metadata": "{}", "solutions": []}, drops.DROP_NO_REFERENCE_ANSWER),
        ({"problem": problem, "tests": tests, "metadata": "{}", "solutions": [" "]}, drops.DROP_EMPTY_TURN),
    ]
    path = root / "deepcoder" / "derived" / "train-00000-of-00001.parquet"
    write_parquet(path, [r for r, _ in derived], DEEPCODER_DERIVED_SCHEMA)
    fixtures.append(_fixture("deepcoder", path, [fate for _, fate in derived]))
    return fixtures


# --- HuggingFaceH4/ultrachat_200k (Parquet) -----------------------------------------------------------------
ULTRACHAT_SCHEMA = pa.schema(
    [
        ("prompt", pa.string()),
        ("prompt_id", pa.string()),
        ("messages", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
    ]
)


def ultrachat_row(prompt_id: Any, *turns: tuple[str, Any]) -> dict[str, Any]:
    """An ultrachat_200k row: `prompt` is the first user turn's text, `messages` every (role, text) turn."""
    messages = [{"content": text, "role": role} for role, text in turns]
    first_user = next((text for role, text in turns if role == "user"), None)
    return {"prompt": first_user, "prompt_id": prompt_id, "messages": messages}


def ultrachat_200k(root: Path) -> Fixture:
    row = ultrachat_row
    habsburg = "Can you explain the organizational structure of the Habsburg imperial court?"
    rows = [
        (
            row(
                "uc-1",
                ("user", habsburg),
                ("assistant", "The court was organised around the Obersthofmeister."),
                ("user", "And the role of the chamberlain?"),
                ("assistant", "The Oberstkämmerer ran the emperor's private household."),
            ),
            None,
        ),
        (row("uc-2", ("user", "What is SEIU?"), ("assistant", "A labour union.")), None),
        (row("uc-3", ("assistant", "Hello."), ("user", "Hi.")), drops.DROP_BAD_TURN_ORDER),
        (row("uc-4", ("user", "Hi."), ("assistant", "Hello."), ("user", "Bye?")), drops.DROP_BAD_TURN_ORDER),
        (row("uc-5", ("user", "Hi."), ("narrator", "Then..."), ("assistant", "Hi.")), drops.DROP_UNSUPPORTED_ROLE),
        (row("uc-6", ("system", "Be brief."), ("user", "Name a colour."), ("assistant", "Blue.")), None),
        (row("uc-7"), drops.DROP_EMPTY_CONVERSATION),
        (row("uc-2", ("user", "What is SEIU, again?"), ("assistant", "A union.")), drops.DROP_DUPLICATE_SYNTH_ID),
        (row("uc-8", ("user", "Say\x00 hi."), ("assistant", "Hi\x00!")), None),
        (
            row(
                "uc-9",
                ("user", "Think first: 2+3?"),
                ("assistant", "<think>2 and 3.</think>\n5."),
                ("user", "And 2+4?"),
                ("assistant", "<think>\nAdd 2 to 4.\n</think>\n\n6."),
            ),
            None,
        ),
        (row("uc-10", ("user", FRENCH), ("assistant", "Parce que la diffusion de Rayleigh...")), None),
        (row("uc-11", ("user", "Hi."), ("assistant", None)), drops.DROP_EMPTY_TURN),
        (row(None, ("user", "Hi."), ("assistant", "Hello.")), drops.DROP_MISSING_SOURCE_ID),
        (row("uc\x0012", ("user", "Hi."), ("assistant", "Hello.")), drops.DROP_NUL_IN_SYNTH_ID),
    ]
    path = root / "ultrachat_200k" / "train_sft-00000-of-00001.parquet"
    write_parquet(path, [r for r, _ in rows], ULTRACHAT_SCHEMA)
    return _fixture("ultrachat_200k", path, [fate for _, fate in rows])


# --- OpenAssistant/oasst1 (Parquet) -------------------------------------------------------------------------
DETOXIFY = pa.struct(
    [
        (name, pa.float64())
        for name in (
            "toxicity",
            "severe_toxicity",
            "obscene",
            "identity_attack",
            "insult",
            "threat",
            "sexual_explicit",
        )
    ]
)
OASST_SCHEMA = pa.schema(
    [
        ("message_id", pa.string()),
        ("parent_id", pa.string()),
        ("user_id", pa.string()),
        ("created_date", pa.string()),
        ("text", pa.string()),
        ("role", pa.string()),
        ("lang", pa.string()),
        ("review_count", pa.int32()),
        ("review_result", pa.bool_()),
        ("deleted", pa.bool_()),
        ("rank", pa.int32()),
        ("synthetic", pa.bool_()),
        ("model_name", pa.string()),
        ("detoxify", DETOXIFY),
        ("message_tree_id", pa.string()),
        ("tree_state", pa.string()),
        ("emojis", pa.struct([("name", pa.list_(pa.string())), ("count", pa.list_(pa.int32()))])),
        (
            "labels",
            pa.struct(
                [("name", pa.list_(pa.string())), ("value", pa.list_(pa.float64())), ("count", pa.list_(pa.int32()))]
            ),
        ),
    ]
)


def oasst_row(
    message_id: str | None,
    parent_id: str | None,
    role: str,
    text: str | None,
    tree: str,
    lang: str = "en",
    rank: int | None = None,
    deleted: bool = False,
    review_result: bool | None = True,
    tree_state: str = "ready_for_export",
) -> dict[str, Any]:
    return {
        "message_id": message_id,
        "parent_id": parent_id,
        "user_id": "user-1",
        "created_date": "2023-02-05T14:23:50.983374+00:00",
        "text": text,
        "role": role,
        "lang": lang,
        "review_count": 3,
        "review_result": review_result,
        "deleted": deleted,
        "rank": rank,
        "synthetic": False,
        "model_name": None,
        "detoxify": None,
        "message_tree_id": tree,
        "tree_state": tree_state,
        "emojis": {"name": ["+1"], "count": [2]},
        "labels": {"name": ["spam"], "value": [0.0], "count": [3]},
    }


# the oasst1 fixture, by row: (message, fate). Tree A is multi-branch (the best path takes rank 0 twice), B is
# German with a deleted favourite, C not exported, D has no reply, E starts with an assistant, F has a child with its
# parent's role, G ends with a prompter; then an orphan, a repeated id and hostile single messages; K has two roots,
# L's reply says it is of tree M.
OASST_ROWS: tuple[tuple[dict[str, Any], str | None], ...] = (
    (oasst_row("A0", None, "prompter", "Can you write a short introduction about monopsony?", "A"),
     drops.DROP_FOLDED_INTO_CONVERSATION),
    (oasst_row("A1", "A0", "assistant", "Monopsony is a market with one buyer.", "A", rank=1),
     drops.DROP_OFF_BEST_PATH),
    (oasst_row("A2", "A0", "assistant", "A monopsony is a market in which a single buyer dominates.", "A", rank=0),
     drops.DROP_FOLDED_INTO_CONVERSATION),
    (oasst_row("A3", "A2", "prompter", "Now cite research on labour markets.", "A"),
     drops.DROP_FOLDED_INTO_CONVERSATION),
    (oasst_row("A4", "A3", "assistant", "See Manning (2003), Monopsony in Motion.", "A"), drops.DROP_OFF_BEST_PATH),
    (oasst_row("A5", "A3", "assistant", "Card and Krueger (1994)\x00 study minimum wages.", "A", rank=0), None),
    (oasst_row("A6", "A1", "prompter", "   ", "A"), drops.DROP_EMPTY_TURN),
    (oasst_row("A7", "A6", "assistant", "An answer to a blank prompt.", "A"), drops.DROP_ORPHAN_MESSAGE),
    (oasst_row("B0", None, "prompter", GERMAN, "B", lang="de"), drops.DROP_FOLDED_INTO_CONVERSATION),
    (oasst_row("B1", "B0", "assistant", "Pflanzen wandeln Licht in Zucker um.", "B", lang="de", rank=0, deleted=True),
     drops.DROP_DELETED_MESSAGE),
    (oasst_row("B2", "B1", "prompter", "Und nachts?", "B", lang="de"), drops.DROP_ORPHAN_MESSAGE),
    (oasst_row("B3", "B0", "assistant", "Mit Chlorophyll und Sonnenlicht entsteht Glukose.", "B", lang="de", rank=1),
     None),
    (oasst_row("B4", "B0", "assistant", "Schlechte Antwort.", "B", lang="de", review_result=False),
     drops.DROP_FAILED_REVIEW),
    (oasst_row("C0", None, "prompter", "A prompt waiting for replies.", "C", tree_state="prompt_lottery_waiting"),
     drops.DROP_TREE_NOT_READY),
    (oasst_row("D0", None, "prompter", CHINESE, "D", lang="zh"), drops.DROP_NO_REFERENCE_ANSWER),
    (oasst_row("E0", None, "assistant", "I start the tree but I am an assistant.", "E"), drops.DROP_BROKEN_TREE),
    (oasst_row("F0", None, "prompter", "What is 2+2?", "F"), drops.DROP_FOLDED_INTO_CONVERSATION),
    (oasst_row("F1", "F0", "prompter", "A prompter answering a prompter.", "F"), drops.DROP_BROKEN_TREE),
    (oasst_row("F2", "F0", "assistant", "4.", "F"), None),
    (oasst_row("F3", "F0", "moderator", "Please be civil.", "F"), drops.DROP_UNSUPPORTED_ROLE),
    (oasst_row("F2", "F0", "assistant", "Four.", "F"), drops.DROP_DUPLICATE_SYNTH_ID),
    (oasst_row("G0", None, "prompter", "Tell me a joke.", "G"), drops.DROP_FOLDED_INTO_CONVERSATION),
    (oasst_row("G1", "G0", "assistant", "Why did the chicken cross the road?", "G"), None),
    (oasst_row("G2", "G1", "prompter", "Why?", "G"), drops.DROP_OFF_BEST_PATH),
    (oasst_row("H1", "no-such-parent", "assistant", "A reply to a message not in the file.", "H"),
     drops.DROP_ORPHAN_MESSAGE),
    (oasst_row(" ", None, "prompter", "A message without an id.", "I"), drops.DROP_MISSING_SOURCE_ID),
    (oasst_row("J0", None, "prompter", "Explain entropy. " + LONG_TEXT, "J"), drops.DROP_FOLDED_INTO_CONVERSATION),
    (oasst_row("J1", "J0", "assistant", "Entropy measures disorder. " + LONG_TEXT, "J"), None),
    (oasst_row("K0", None, "prompter", "Which root is the tree's?", "K"), drops.DROP_BROKEN_TREE),
    (oasst_row("K1", None, "prompter", "A second root of tree K.", "K"), drops.DROP_BROKEN_TREE),
    (oasst_row("K2", "K0", "assistant", "A reply under one of them.", "K"), drops.DROP_ORPHAN_MESSAGE),
    (oasst_row("L0", None, "prompter", "Name a prime number.", "L"), drops.DROP_NO_REFERENCE_ANSWER),
    (oasst_row("L1", "L0", "assistant", "Seven, says a reply filed under tree M.", "M"), drops.DROP_BROKEN_TREE),
    (oasst_row("L2", "L1", "prompter", "And another?", "M"), drops.DROP_ORPHAN_MESSAGE),
)  # fmt: skip


def oasst1(root: Path) -> Fixture:
    path = root / "oasst1" / "train-00000-of-00001.parquet"
    write_parquet(path, [row for row, _ in OASST_ROWS], OASST_SCHEMA)
    return _fixture("oasst1", path, [fate for _, fate in OASST_ROWS])


# --- bcui19/chat-v2-anthropic-helpfulness (Parquet) ---------------------------------------------------------
HELPFULNESS_SCHEMA = pa.schema([("prompt", pa.string()), ("response", pa.string())])


def chatml(*turns: tuple[str, str]) -> str:
    """A chat-v2 prompt: ChatML turns, then the assistant's opening."""
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns) + "<|im_start|>assistant\n"


def anthropic_helpfulness(root: Path) -> Fixture:
    system = ("system", "- You are a helpful assistant chatbot.")
    rows = [
        ({"prompt": chatml(system, ("user", "How do I teach my kids to speak French?")),
          "response": "Start with songs and picture books."}, None),
        ({"prompt": chatml(("user", "I'm incorporating a business in Maine."), ("assistant", "Congratulations!"),
                           ("user", "What papers do I file?")),
          "response": "File Articles of Incorporation with the Secretary of State."}, None),
        ({"prompt": "How do I boil an egg?", "response": "Simmer it for nine minutes."}, None),
        ({"prompt": chatml(("user", "Hi")), "response": None}, drops.DROP_EMPTY_TURN),
        ({"prompt": "How do I boil an egg?", "response": "Simmer it for nine minutes."}, drops.DROP_DUPLICATE_SYNTH_ID),
        ({"prompt": chatml(("human", "Hi")), "response": "Hello."}, drops.DROP_UNSUPPORTED_ROLE),
    ]  # fmt: skip
    path = root / "anthropic_helpfulness" / "train-00000-of-00001.parquet"
    write_parquet(path, [r for r, _ in rows], HELPFULNESS_SCHEMA)
    return _fixture("anthropic_helpfulness", path, [fate for _, fate in rows])


def write_fixtures(root: Path) -> list[Fixture]:
    """Every source's shards under `root/<source key>/`; returns them with their expected row fates."""
    return [
        nemotron_math_v2(root),
        hendrycks_math(root),
        competition_math(root),
        opencodeinstruct(root),
        *deepcoder(root),
        ultrachat_200k(root),
        oasst1(root),
        anthropic_helpfulness(root),
    ]


def wrong_schema_shards(root: Path) -> dict[str, tuple[Path, str, str, str]]:
    """Files another dataset (or a broken export) would give: source -> (file, column, expected, actual)."""
    root.mkdir(parents=True, exist_ok=True)
    missing = root / "ultrachat_missing_messages.parquet"
    pq.write_table(pa.table({"prompt": ["hi"], "prompt_id": ["p"]}), missing)
    wrong = root / "hendrycks_int_question.parquet"
    info = pa.array([{"problem_id": "x", "task_type": "t"}], HENDRYCKS_SCHEMA.field("info").type)
    pq.write_table(pa.table({"question": [1], "answer": ["1"], "info": info}), wrong)
    nested = root / "oasst1_rank_text.parquet"
    columns = {name: ["x"] for name in ("message_id", "text", "role", "lang", "message_tree_id", "tree_state")}
    pq.write_table(pa.table({**columns, "parent_id": [None], "rank": ["first"]}), nested)
    jsonl = root / "nemotron_no_messages.jsonl"
    jsonl.write_text(json.dumps({"problem": "p", "expected_answer": "1", "uuid": "u"}) + "\n", encoding="utf-8")
    return {
        "ultrachat_200k": (missing, "messages", "list<item: struct<content: string, role: string>>", "absent"),
        "hendrycks_math": (wrong, "question", "string", "int64"),
        "oasst1": (nested, "rank", "int32", "string"),
        "nemotron_math_v2": (jsonl, "messages", "list<item: struct<", "absent from all 1 lines"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output_dir", type=Path)
    args = parser.parse_args(argv)
    for fixture in write_fixtures(args.output_dir):
        kept = sum(fate is None for fate in fixture.expected.values())
        print(f"{fixture.path}: {len(fixture.expected)} rows, {kept} conversations expected")


if __name__ == "__main__":
    main()
