"""OpenAssistant/oasst1: crowd-sourced message trees, one message per row (Parquet, data/{train,validation}-*;
message_id, parent_id, text, role prompter / assistant, lang, review_result, deleted, rank, message_tree_id,
tree_state, ...). A tree is rooted at a prompter message (parent_id null); roles alternate along every path.

Policy (deterministic, order-free): one conversation per tree, its best-ranked path. From the root, descend to the
child with the lowest `rank` (0 = the crowd's favourite; unranked children after ranked ones; ties by message_id),
until a message has no usable child; trailing prompter messages are cut so the path ends on an assistant reply.
The conversation's row is that last reply (its message_id is the id, its tree's root `lang` the language); the
other messages of the path are `folded_into_conversation`, the usable ones off the path `off_best_path` (both
counted, not logged). Unusable messages drop with a reason, and their subtrees become `orphan_message`:
deleted, review_result false, tree_state not `ready_for_export`, a role that is neither, blank text, a blank
or repeated message_id, a message that breaks its tree (`broken_tree`: a root that is not a prompter, one of two or
more roots of one message_tree_id, a child with its parent's role or of another message_tree_id than its parent's),
a parent absent from the file. A tree whose root has no usable reply drops its root as no_reference_answer.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import polars as pl
import pyarrow as pa

from synthkd_assets.core.sources.base import ID_DATASET, PARQUET, TURN_TYPE, Column, SourceAdapter, SourceSpec
from synthkd_assets.core.synth import python_whitespace
from synthkd_contract import drops

READY = "ready_for_export"
ROLES = {"prompter": "user", "assistant": "assistant"}
SPEC = SourceSpec(
    key="oasst1",
    file_format=PARQUET,
    columns=(
        Column("message_id", pa.string()),
        Column("parent_id", pa.string()),
        Column("user_id", pa.string(), required=False),
        Column("created_date", pa.string(), required=False),
        Column("text", pa.string()),
        Column("role", pa.string()),
        Column("lang", pa.string()),
        Column("review_count", pa.int32(), required=False),
        Column("review_result", pa.bool_(), required=False),
        Column("deleted", pa.bool_(), required=False),
        Column("rank", pa.int32(), required=False),
        Column("synthetic", pa.bool_(), required=False),
        Column("model_name", pa.string(), required=False),
        Column("message_tree_id", pa.string()),
        Column("tree_state", pa.string()),
    ),
    id_rule=ID_DATASET,
    cited=(
        "https://huggingface.co/datasets/OpenAssistant/oasst1/blob/main/README.md (dataset_info features; "
        "'Dataset Structure': trees, rank 0 = most preferred, roles strictly alternating)",
    ),
)


def _message_reasons(frame: pl.DataFrame) -> pl.Series:
    """A message's own reason to be unusable (first that applies), null when usable on its own."""
    blank = pl.col("text").str.strip_chars(python_whitespace()).str.len_bytes() == 0
    no_id = pl.col("message_id").is_null() | (pl.col("message_id").str.strip_chars() == "")
    first_row = pl.col("source_row").min().over("message_id")
    repeated = pl.col("message_id").is_duplicated() & (pl.col("source_row") != first_row)
    return frame.select(
        pl.when(no_id)
        .then(pl.lit(drops.DROP_MISSING_SOURCE_ID))
        .when(repeated)
        .then(pl.lit(drops.DROP_DUPLICATE_SYNTH_ID))
        .when(pl.col("deleted").fill_null(False))
        .then(pl.lit(drops.DROP_DELETED_MESSAGE))
        .when(~pl.col("review_result").fill_null(True))
        .then(pl.lit(drops.DROP_FAILED_REVIEW))
        .when(pl.col("tree_state").is_null() | (pl.col("tree_state") != READY))
        .then(pl.lit(drops.DROP_TREE_NOT_READY))
        .when(~pl.col("role").is_in(list(ROLES)).fill_null(False))
        .then(pl.lit(drops.DROP_UNSUPPORTED_ROLE))
        .when(pl.col("text").is_null() | blank)
        .then(pl.lit(drops.DROP_EMPTY_TURN))
        .alias("reason")
    )["reason"]


def _rank_key(message: dict[str, Any]) -> tuple[bool, int, str]:
    return (message["rank"] is None, message["rank"] or 0, message["message_id"])


def _walk(messages: list[dict[str, Any]], reasons: list[str | None]) -> dict[int, dict[str, Any]]:
    """Every message's outcome by source_row: {"reason"} or, for a conversation's last reply, {"path"}."""
    outcome: dict[int, dict[str, Any]] = {}
    usable = {}
    for message, reason in zip(messages, reasons):
        if reason is None:
            usable[message["message_id"]] = message
        else:
            outcome[message["source_row"]] = {"reason": reason}
    children: dict[str, list[dict[str, Any]]] = defaultdict(list)
    roots = []
    for message in usable.values():
        if message["parent_id"] is None:
            roots.append(message)
        else:
            children[message["parent_id"]].append(message)
    roots_per_tree = Counter(root["message_tree_id"] for root in roots)
    for root in roots:  # which of a tree's roots is its own can't be told: none of them makes a conversation
        if roots_per_tree[root["message_tree_id"]] > 1:
            outcome[root["source_row"]] = {"reason": drops.DROP_BROKEN_TREE}
    for siblings in children.values():
        siblings.sort(key=_rank_key)
    reached: set[str] = set()
    for root in sorted(roots, key=lambda m: m["message_id"]):
        if root["role"] != "prompter" or root["source_row"] in outcome:
            continue
        stack = [root]
        while stack:  # the messages of the tree its roles reach; a child with its parent's role breaks there
            node = stack.pop()
            reached.add(node["message_id"])
            for child in children.get(node["message_id"], ()):
                if child["role"] == node["role"] or child["message_tree_id"] != node["message_tree_id"]:
                    outcome[child["source_row"]] = {"reason": drops.DROP_BROKEN_TREE}
                else:
                    stack.append(child)
        path = [root]
        while True:
            following = [c for c in children.get(path[-1]["message_id"], ()) if c["source_row"] not in outcome]
            if not following:
                break
            path.append(following[0])
        while path and path[-1]["role"] != "assistant":
            outcome[path.pop()["source_row"]] = {"reason": drops.DROP_OFF_BEST_PATH}
        if not path:
            outcome[root["source_row"]] = {"reason": drops.DROP_NO_REFERENCE_ANSWER}
            continue
        for message in path[:-1]:
            outcome[message["source_row"]] = {"reason": drops.DROP_FOLDED_INTO_CONVERSATION}
        outcome[path[-1]["source_row"]] = {"path": path, "lang": root["lang"]}
    for message in usable.values():
        if message["source_row"] in outcome:
            continue
        if message["parent_id"] is None and message["role"] != "prompter":
            outcome[message["source_row"]] = {"reason": drops.DROP_BROKEN_TREE}
        elif message["message_id"] in reached:
            outcome[message["source_row"]] = {"reason": drops.DROP_OFF_BEST_PATH}
        else:
            outcome[message["source_row"]] = {"reason": drops.DROP_ORPHAN_MESSAGE}
    return outcome


def to_conversations(frame: pl.DataFrame) -> pl.DataFrame:
    reasons = _message_reasons(frame).to_list()
    columns = ["source_row", "message_id", "parent_id", "text", "role", "lang", "rank", "message_tree_id"]
    outcome = _walk(frame.select(columns).to_dicts(), reasons)
    rows = []
    for message in frame.select(columns).iter_rows(named=True):
        result = outcome[message["source_row"]]
        path = result.get("path")
        rows.append(
            {
                "source_row": message["source_row"],
                "drop_reason": result.get("reason"),
                "example_id": message["message_id"],
                "language": result.get("lang"),
                "turns": None if path is None else [{"role": ROLES[m["role"]], "text": m["text"]} for m in path],
                "reasoning": None,
                "extra": {
                    "message_tree_id": message["message_tree_id"],
                    "path_message_ids": None if path is None else [m["message_id"] for m in path],
                },
            }
        )
    schema = {
        "source_row": pl.Int64,
        "drop_reason": pl.String,
        "example_id": pl.String,
        "language": pl.String,
        "turns": TURN_TYPE,
        "reasoning": pl.String,
        "extra": pl.Struct({"message_tree_id": pl.String, "path_message_ids": pl.List(pl.String)}),
    }
    return pl.DataFrame(rows, schema=schema)


ADAPTER = SourceAdapter(SPEC, to_conversations)
