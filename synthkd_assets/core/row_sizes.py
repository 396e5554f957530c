"""synth_tokenized's row sizes (docs/contract.md "Files of a build"): written with each shard, read by the global
steps that need only each row's token counts (the quota plan, the manifest's length statistics), and only while
they still describe the shard's bytes."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from synthkd_assets.core.layout import rows_summary_path
from synthkd_contract.manifest_seal import sha256_file
from synthkd_contract.schemas import ROWS_OF_SHA256_KEY


def current_row_sizes(tokenized_path: Path) -> Path | None:
    """The row sizes beside a synth_tokenized shard, when they describe the shard as it is now.

    The tokenize step records the sha256 of the shard it finished in the row sizes' footer (ROWS_OF_SHA256_KEY);
    a shard replaced or edited since has other bytes, and its row sizes are then not used.

    Args:
        tokenized_path: a synth_tokenized shard's `<key>.parquet`.

    Returns:
        The path of its row sizes (`rows_summary_path`), or None when there are none, they record no shard, or the
        shard's bytes are not the ones they record: then the caller reads the shard's own token lists.
    """
    rows = rows_summary_path(tokenized_path)
    if not rows.is_file():
        return None
    recorded = (pq.read_metadata(rows).metadata or {}).get(ROWS_OF_SHA256_KEY.encode())
    if recorded is None or recorded.decode() != sha256_file(tokenized_path):
        return None
    return rows
