"""The validation sets (docs/near-dup.md#validation-sets), from the clusters synth_clusters held out: the held-out KL
slice (Harmony prompts a fixed number per exercise) and the format-compliance suite (prompts whose answer form SYNTH's
own `result:` constraint makes checkable, the expectation stored beside each). Every member of their clusters is
dropped from training as `heldout`, so both are cluster-disjoint from everything trained on."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa

from synthkd_assets.core.distill_io import completion_prefix, prompt_messages
from synthkd_assets.core.filters import constraints_expr, expected_answer
from synthkd_assets.core.near_dup import FORMAT_SET, KL_SET
from synthkd_assets.core.parquet_io import iter_frames
from synthkd_contract.schemas import VALIDATION_SCHEMA


def validation_rows(
    heldout: Sequence[Mapping[str, Any]], filtered: Mapping[str, Path], encoding: Any
) -> dict[str, list[dict[str, Any]]]:
    """The rows of each set ({KL_SET: [...], FORMAT_SET: [...]}, VALIDATION_SCHEMA fields), in the order the
    clusters chose them; `filtered`: each shard's synth_filtered Parquet, where the messages are read from."""
    wanted: dict[str, list[str]] = {}
    for entry in heldout:
        wanted.setdefault(entry["shard"], []).append(entry["synth_id"])
    found: dict[str, dict[str, Any]] = {}
    for shard, ids in wanted.items():
        # streamed: a whole synth_filtered shard (its messages) would be held at once for a few rows of it
        for frame in iter_frames(filtered[shard], ("synth_id", "messages_json", "metadata_json")):
            frame = frame.filter(pl.col("synth_id").is_in(ids)).with_columns(constraints_expr().alias("constraints"))
            for row in frame.select("synth_id", "messages_json", "constraints").iter_rows(named=True):
                found[row["synth_id"]] = row
    sets: dict[str, list[dict[str, Any]]] = {KL_SET: [], FORMAT_SET: []}
    for entry in heldout:
        row = found[entry["synth_id"]]
        messages = json.loads(row["messages_json"])["messages"]
        prompt = prompt_messages(messages)
        form = expected_answer(row["constraints"])
        sets[entry["set"]].append(
            {
                "synth_id": entry["synth_id"],
                "exercise": entry["exercise"],
                "language": entry["language"],
                "cluster_id": entry["cluster_id"],
                "cluster_size": entry["cluster_size"],
                "prompt_messages": json.dumps(prompt, ensure_ascii=False),
                "prompt_tokens": completion_prefix(encoding, messages),
                "reference_messages": json.dumps(messages[len(prompt) :], ensure_ascii=False),
                "answer_form": None if form is None else form[0],
                "expected_answer": None if form is None else form[1],
            }
        )
    return sets


def validation_table(rows: list[dict[str, Any]]) -> pa.Table:
    """One set's rows as a VALIDATION_SCHEMA table."""
    return pa.Table.from_pylist(rows, schema=VALIDATION_SCHEMA)
