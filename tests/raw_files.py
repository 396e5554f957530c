"""Changing raw shards in tests, as a user would."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq


def edit_shard(path: Path) -> None:
    """Rewrite a raw shard with its first answer changed (new bytes, same rows)."""
    table = pq.read_table(path)
    answers = table.column("synthetic_answer").to_pylist()
    answers[0] = answers[0] + "\n\nEdited upstream."
    pq.write_table(table.set_column(table.schema.get_field_index("synthetic_answer"), "synthetic_answer", [answers]), path)
