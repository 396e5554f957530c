"""Stable hashing of `synth_id`: the split (and, later, sampling) never depend on row order or sharding."""

from __future__ import annotations

import hashlib

from synthkd_assets import contracts


def stable_unit_interval(salt: str, key: str) -> float:
    """Uniform in [0, 1): the first 8 bytes of sha256(f"{salt}:{key}") as a big-endian fraction of 2**64."""
    digest = hashlib.sha256(f"{salt}:{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def is_valid(synth_id: str, salt: str = contracts.SPLIT_SALT, valid_fraction: float = contracts.VALID_FRACTION) -> bool:
    return stable_unit_interval(salt, synth_id) < valid_fraction


def assign_split(synth_id: str, salt: str = contracts.SPLIT_SALT, valid_fraction: float = contracts.VALID_FRACTION) -> str:
    """'valid' or 'train' for one conversation, by the locked rule in `contracts.SPLIT_RULE`."""
    return contracts.SPLITS[1] if is_valid(synth_id, salt, valid_fraction) else contracts.SPLITS[0]
