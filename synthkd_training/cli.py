"""Command-line options the training examples share."""

from __future__ import annotations

import argparse


def add_no_hash_argument(parser: argparse.ArgumentParser, checked: str) -> None:
    """`--no-hash`: verify `checked` (the trios, the Parquet parts) against the dataset's manifest by size only.
    Hashing every byte is the default because a same-size corrupted file is otherwise trained on."""
    parser.add_argument(
        "--no-hash",
        action="store_true",
        help=f"check {checked} against the manifest by size only, not sha256 (a large dataset, checked before)",
    )
