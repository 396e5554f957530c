"""Changing raw shards and the optional input manifest in tests, as a user would."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from synthkd_contract import constants
from synthkd_contract.manifest_seal import sha256_file


def edit_shard(path: Path) -> None:
    """Rewrite a raw shard with its first answer changed (new bytes, same rows)."""
    table = pq.read_table(path)
    answers = table.column("synthetic_answer").to_pylist()
    answers[0] = answers[0] + "\n\nEdited upstream."
    pq.write_table(
        table.set_column(table.schema.get_field_index("synthetic_answer"), "synthetic_answer", [answers]), path
    )


def current_shas(raw: Path) -> dict[str, str]:
    return {p.stem: sha256_file(p) for p in sorted(raw.glob("*.parquet"))}


def write_input_manifest(raw: Path, shas: dict[str, str]) -> None:
    entries = [{"file": f"{name}.parquet", "sha256": sha} for name, sha in sorted(shas.items())]
    (raw / constants.INPUT_MANIFEST_FILENAME).write_text(json.dumps({"shards": entries}, indent=1))
