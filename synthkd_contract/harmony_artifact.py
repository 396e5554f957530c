"""Seed 000's canonical input, the `synth_harmony_v1` artifact, as data: its files, columns and manifest, and the
partitions a build cuts it into (docs/contract.md, "The synth_harmony_v1 artifact").

The artifact is a directory of `synth_harmony_shard_<NN>.parquet` files (zstd, row groups of ~2,000 rows) and a
`manifest.json` listing them (rows, bytes, row groups). Its rows are SYNTH's, already Harmony messages: a build
treats them as SYNTH rows (the 001 filters, sampling plan and split apply) and renders their messages as they are,
system and developer messages included as masked context.

A file of ~19M rows is cut into partitions of `ARTIFACT_ROW_GROUPS_PER_PARTITION` consecutive row groups, keyed
`<file stem>/rg_<first>-<last>` (`synth_harmony_shard_00/rg_0000-0099`, both ends included), so that a pool of
workers gets hundreds of partitions from four files.
"""

from __future__ import annotations

import re
from typing import Final

ARTIFACT_SCHEMA_VERSION: Final = "synth_harmony_v1"
ARTIFACT_MANIFEST_FILENAME: Final = "manifest.json"
ARTIFACT_METADATA_FILENAME: Final = "metadata.json"
ARTIFACT_FILE_SUFFIX: Final = ".parquet"
ARTIFACT_FILE_STEM: Final = re.compile(r"synth_harmony_shard_(\d+)")
# every column is a string; messages_json is `{"messages": [...]}` of openai-harmony message dicts
ARTIFACT_COLUMNS: Final = (
    "messages_json",
    "metadata_json",
    "synth_id",
    "language",
    "exercise",
    "model",
    "constraints",
    "seed_license",
    "query_seed_url",
)
# the content item type each role's messages may carry (anything else is not the artifact's shape)
ARTIFACT_CONTENT_TYPES: Final = {
    "system": "system_content",
    "developer": "developer_content",
    "user": "text",
    "assistant": "text",
}

# 100 row groups of ~2,000 rows: ~200k rows a partition, about a raw SYNTH file's 155,800, so a partition costs what
# a raw shard costs (time, memory) and the 4 files of the published artifact give ~380 partitions
ARTIFACT_ROW_GROUPS_PER_PARTITION: Final = 100
RANGE_PREFIX: Final = "rg_"
_RANGE_KEY = re.compile(r"(synth_harmony_shard_(\d+))/rg_(\d+)-(\d+)")

# an artifact partition's number in the outputs named by shard number (Megatron trio `shard_<n>_*`, DistillKit and
# pool parts `part-<n>`): BASE + file number * FILE_STRIDE + first row group; above every raw SYNTH and anchor number
# (synthkd_contract/sources.py), independent of which other files or ranges exist
ARTIFACT_SHARD_INDEX_BASE: Final = 1_000_000_000
ARTIFACT_FILE_STRIDE: Final = 100_000  # more row groups than any file holds (~9,500 in the published one)
ARTIFACT_MAX_FILE_NUMBER: Final = 9_999


def range_partition_key(file_stem: str, first_row_group: int, last_row_group: int) -> str:
    """The partition key of row groups `first_row_group`..`last_row_group` (both included) of one artifact file.

    Args:
        file_stem: the file's name without `.parquet` (`synth_harmony_shard_00`).
        first_row_group: the range's first row group.
        last_row_group: the range's last row group.

    Returns:
        `<file stem>/rg_<first:04d>-<last:04d>`.
    """
    return f"{file_stem}/{RANGE_PREFIX}{first_row_group:04d}-{last_row_group:04d}"


def parse_range_key(partition_key: str) -> tuple[str, int, int] | None:
    """(file stem, first row group, last row group) of an artifact partition key, None for any other key."""
    match = _RANGE_KEY.fullmatch(partition_key)
    if match is None:
        return None
    return match.group(1), int(match.group(3)), int(match.group(4))


def is_artifact_key(partition_key: str) -> bool:
    """Whether a partition key names a row-group range of an artifact file."""
    return parse_range_key(partition_key) is not None


def artifact_shard_index(partition_key: str) -> int:
    """The shard number of an artifact partition (see ARTIFACT_SHARD_INDEX_BASE).

    Args:
        partition_key: `synth_harmony_shard_<NN>/rg_<first>-<last>`.

    Returns:
        BASE + NN * FILE_STRIDE + first.

    Raises:
        ValueError: the key is not an artifact range, or its numbers do not fit the scheme.
    """
    match = _RANGE_KEY.fullmatch(partition_key)
    if match is None:
        raise ValueError(f"{partition_key!r} is not an artifact partition key (synth_harmony_shard_NN/rg_A-B)")
    file_number, first = int(match.group(2)), int(match.group(3))
    if file_number > ARTIFACT_MAX_FILE_NUMBER or first >= ARTIFACT_FILE_STRIDE:
        raise ValueError(
            f"{partition_key!r}: file number {file_number} or first row group {first} is outside the shard "
            f"numbering (file <= {ARTIFACT_MAX_FILE_NUMBER}, row group < {ARTIFACT_FILE_STRIDE})"
        )
    return ARTIFACT_SHARD_INDEX_BASE + file_number * ARTIFACT_FILE_STRIDE + first
