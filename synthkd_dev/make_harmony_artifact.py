"""A synth_harmony_v1 artifact made from raw SYNTH shards the way seed 000's authors' converter writes one: the
input synthkd accepts as `SYNTHKD_HARMONY_DIR` (docs/contract.md, "The synth_harmony_v1 artifact").

Files `synth_harmony_shard_00.parquet` ... (zstd, small row groups), `manifest.json` and `metadata.json`. Each row:
`messages_json` = `{"messages": [system, developer, user, assistant analysis, assistant final]}` with a structured
system content (model identity, reasoning effort "High", dates, channel config) and developer instructions, the user
message the query alone, written with `json.dumps(..., ensure_ascii=True)`; `metadata_json` the JSON of the metadata
columns, which are also columns of their own. Rows with an empty reasoning are skipped, as that converter does.

    .venv/bin/python -m synthkd_dev.make_harmony_artifact --output-dir /tmp/synth_harmony
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_contract.harmony_artifact import (
    ARTIFACT_COLUMNS,
    ARTIFACT_MANIFEST_FILENAME,
    ARTIFACT_METADATA_FILENAME,
    ARTIFACT_SCHEMA_VERSION,
)

METADATA_FIELDS = ("synth_id", "language", "exercise", "model", "constraints", "seed_license", "query_seed_url")
SYSTEM_MESSAGE: dict[str, Any] = {
    "role": "system",
    "content": [
        {
            "type": "system_content",
            "model_identity": "You are ChatGPT, a large language model trained by OpenAI.",
            "reasoning_effort": "High",
            "conversation_start_date": "2026-01-01",
            "knowledge_cutoff": "2024-06",
            "channel_config": {"valid_channels": ["analysis", "commentary", "final"], "channel_required": True},
        }
    ],
}
DEVELOPER_MESSAGE: dict[str, Any] = {
    "role": "developer",
    "content": [
        {
            "type": "developer_content",
            "instructions": "Answer the user's question. Reason step by step in the analysis channel, "
            "then give the final answer.",
        }
    ],
}


def text_message(role: str, text: str, channel: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": role, "content": [{"type": "text", "text": text}]}
    if channel is not None:
        message["channel"] = channel
    return message


def conversation(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The converter's messages for one raw SYNTH row (its query alone as the user turn)."""
    return [
        SYSTEM_MESSAGE,
        DEVELOPER_MESSAGE,
        text_message("user", row["query"]),
        text_message("assistant", row["synthetic_reasoning"], "analysis"),
        text_message("assistant", row["synthetic_answer"], "final"),
    ]


def converted_rows(raw_files: Sequence[Path]) -> list[dict[str, str | None]]:
    """The artifact's rows for the raw files' rows, in order; rows without a query, an answer or a reasoning
    (after `strip()`) are skipped."""
    rows = []
    for path in raw_files:
        for row in pq.read_table(path).to_pylist():
            if not row.get("query") or not row.get("synthetic_answer"):
                continue
            if not (row.get("synthetic_reasoning") or "").strip():
                continue
            metadata = {field: row.get(field) for field in METADATA_FIELDS}
            rows.append(
                {
                    "messages_json": json.dumps({"messages": conversation(row)}, ensure_ascii=True),
                    "metadata_json": json.dumps(metadata, ensure_ascii=True),
                    **metadata,
                }
            )
    return rows


ARTIFACT_ARROW_SCHEMA = pa.schema([(column, pa.string()) for column in ARTIFACT_COLUMNS])


def write_artifact(
    rows: Sequence[dict[str, str | None]], output_dir: Path, num_shards: int = 2, row_group_rows: int = 8
) -> Path:
    """Write `rows` as an artifact of `num_shards` files (contiguous slices) with row groups of `row_group_rows`.

    Returns:
        The manifest's path.
    """
    output_dir.mkdir(parents=True, exist_ok=True)
    per_shard = -(-len(rows) // num_shards)
    shards = []
    for index in range(num_shards):
        path = output_dir / f"synth_harmony_shard_{index:02d}.parquet"
        chunk = rows[index * per_shard : (index + 1) * per_shard]
        table = pa.Table.from_pylist(list(chunk), schema=ARTIFACT_ARROW_SCHEMA)
        pq.write_table(table, path, compression="zstd", row_group_size=row_group_rows)
        metadata = pq.ParquetFile(path).metadata
        shards.append(
            {
                "path": str(path),
                "bytes": path.stat().st_size,
                "rows": metadata.num_rows,
                "row_groups": metadata.num_row_groups,
            }
        )
    manifest = {
        "schema_version": ARTIFACT_SCHEMA_VERSION,
        "created_unix_s": int(time.time()),
        "git_sha": "0" * 40,
        "dataset_dir": str(output_dir),
        "conversion": {
            "dataset": "PleIAs/SYNTH",
            "split": "train",
            "num_shards": num_shards,
            "metadata_fields": list(METADATA_FIELDS),
            "system_message": SYSTEM_MESSAGE,
            "developer_message": DEVELOPER_MESSAGE,
        },
        "storage": {
            "format": "parquet",
            "glob": "synth_harmony_shard_*.parquet",
            "schema_arrow": ARTIFACT_ARROW_SCHEMA.to_string(),
            "total_rows": sum(s["rows"] for s in shards),
            "total_bytes": sum(s["bytes"] for s in shards),
            "shards": shards,
        },
    }
    manifest_path = output_dir / ARTIFACT_MANIFEST_FILENAME
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    metadata_json = {"schema_version": ARTIFACT_SCHEMA_VERSION, "columns": list(ARTIFACT_COLUMNS)}
    (output_dir / ARTIFACT_METADATA_FILENAME).write_text(json.dumps(metadata_json, indent=2) + "\n")
    return manifest_path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--raw-dir", type=Path, default=Path("data/sample/synth_raw"))
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--row-group-rows", type=int, default=8)
    args = parser.parse_args(argv)
    rows = converted_rows(sorted(args.raw_dir.glob("*.parquet")))
    manifest = write_artifact(rows, args.output_dir, args.shards, args.row_group_rows)
    print(f"{len(rows)} conversations in {args.shards} files: {manifest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
