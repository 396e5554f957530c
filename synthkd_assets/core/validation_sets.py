"""The validation sets (docs/near-dup.md#validation-sets), from the clusters synth_clusters held out: the held-out KL
slice (Harmony prompts a fixed number per exercise) and the format-compliance suite (prompts whose answer form SYNTH's
own `result:` constraint makes checkable, the expectation stored beside each). Every member of their clusters is
dropped from training as `heldout`, so both are cluster-disjoint from everything trained on."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from synthkd_assets.core.distill_io import completion_prefix, prompt_messages
from synthkd_assets.core.filters import constraints_expr, expected_answer
from synthkd_assets.core.near_dup import FORMAT_SET, KL_SET, rows_in_row_groups
from synthkd_assets.core.parallel import thread_map
from synthkd_assets.core.parquet_io import iter_frames, streaming_parquet_file
from synthkd_contract.schemas import VALIDATION_SCHEMA


def validation_rows(
    heldout: Sequence[Mapping[str, Any]], filtered: Mapping[str, Path], encoding: Any
) -> dict[str, list[dict[str, Any]]]:
    """The rows of each set ({KL_SET: [...], FORMAT_SET: [...]}, VALIDATION_SCHEMA fields), in the order the
    clusters chose them; `filtered`: each shard's synth_filtered Parquet, where the messages are read from."""
    wanted: dict[str, list[str]] = {}
    for entry in heldout:
        wanted.setdefault(entry["shard"], []).append(entry["synth_id"])

    def shard_rows(shard: str) -> list[dict[str, Any]]:
        # streamed: a whole synth_filtered shard (its messages) would be held at once for a few rows of it; and
        # only the row groups holding those rows are read past their synth_id
        ids = wanted[shard]
        groups = row_groups_holding(filtered[shard], ids)
        rows: list[dict[str, Any]] = []
        for frame in iter_frames(filtered[shard], ("synth_id", "messages_json", "metadata_json"), row_groups=groups):
            frame = frame.filter(pl.col("synth_id").is_in(ids)).with_columns(constraints_expr().alias("constraints"))
            rows += frame.select("synth_id", "messages_json", "constraints").iter_rows(named=True)
        return rows

    found = {row["synth_id"]: row for rows in thread_map(shard_rows, wanted) for row in rows}  # a shard a core
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


def row_groups_holding(path: Path, synth_ids: Collection[str]) -> list[int]:
    """The row groups of the Parquet file `path` that hold a row whose `synth_id` is one of `synth_ids`, in file
    order, found by reading its `synth_id` column alone.

    Args:
        path: a Parquet file with a `synth_id` column (synth_filtered's).
        synth_ids: the ids looked for.

    Returns:
        Row group indices, ascending, each once.

    Raises:
        InputFileError: the file is unreadable or has no `synth_id` column (`iter_frames`).
    """
    ids = [frame["synth_id"] for frame in iter_frames(path, ("synth_id",))]
    if not ids:
        return []
    rows = np.flatnonzero(pl.concat(ids).is_in(list(synth_ids)).to_numpy())
    return rows_in_row_groups(streaming_parquet_file(path).metadata, rows)[0]


def validation_table(rows: list[dict[str, Any]]) -> pa.Table:
    """One set's rows as a VALIDATION_SCHEMA table."""
    return pa.Table.from_pylist(rows, schema=VALIDATION_SCHEMA)
