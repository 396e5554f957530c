"""synth_tokenized's row sizes (docs/contract.md "Files of a build"): written with each shard, read by the global
steps that need only each row's token counts (the quota plan, the manifest's length statistics), and only while
they still describe the shard's bytes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pyarrow.parquet as pq

from synthkd_assets.core.layout import rows_summary_path
from synthkd_contract.manifest_seal import HashedFile, sha256_files
from synthkd_contract.schemas import ROWS_OF_SHA256_KEY


def current_row_sizes(tokenized_path: Path, hashed: Mapping[Path, HashedFile] | None = None) -> Path | None:
    """The row sizes beside a synth_tokenized shard, when they describe the shard as it is now.

    The tokenize step records the sha256 of the shard it finished in the row sizes' footer (ROWS_OF_SHA256_KEY);
    a shard replaced or edited since has other bytes, and its row sizes are then not used. The shard's sha256 is
    the one `hashed` records while its stat is unchanged (`sha256_files`), else it is read and hashed.

    Args:
        tokenized_path: a synth_tokenized shard's `<key>.parquet`.
        hashed: what the tokenize steps hashed as they wrote their shards, by path (none: every shard is hashed).

    Returns:
        The path of its row sizes (`rows_summary_path`), or None when there are none, they record no shard, or the
        shard's bytes are not the ones they record: then the caller reads the shard's own token lists.
    """
    rows = rows_summary_path(tokenized_path)
    if not rows.is_file():
        return None
    recorded = (pq.read_metadata(rows).metadata or {}).get(ROWS_OF_SHA256_KEY.encode())
    if recorded is None or recorded.decode() != sha256_files([tokenized_path.resolve()], hashed)[0]:
        return None
    return rows
