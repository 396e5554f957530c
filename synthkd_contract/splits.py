"""Stable hashing of `synth_id`: the 000 split and the mixture sampling never depend on row order or sharding.

Shared by the build (which assigns every conversation its split) and training (which finds a pool row's trio by
the split the build gave it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from synthkd_contract import constants


def stable_unit_interval(salt: str, key: str) -> float:
    """Uniform in [0, 1): the first 8 bytes of sha256(f"{salt}:{key}") as a big-endian fraction of 2**64.

    Args:
        salt: the rule's salt (`constants.SPLIT_SALT`, a sampling rule's own).
        key: the conversation's `synth_id`.

    Returns:
        A float in [0, 1), the same for the same (salt, key) on every machine.
    """
    digest = hashlib.sha256(f"{salt}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def stable_unit_intervals(salt: str, keys: Iterable[str]) -> np.ndarray:
    """`stable_unit_interval(salt, key)` of every key, as one array: the digests' first 8 bytes gathered, then
    converted and scaled by numpy (a uint64 rounded to the nearest float64, then divided by 2**64, exactly as
    Python's int division rounds the quotient).

    Args:
        salt: the rule's salt.
        keys: the conversations' `synth_id`s.

    Returns:
        A float64 array of values in [0, 1), in the keys' order.
    """
    return salted_heads(salt, keys).astype(np.float64) / 2.0**64


def salted_heads(salt: str, keys: Iterable[str]) -> np.ndarray:
    """The first 8 bytes of sha256(f"{salt}:{key}") of every key, big-endian, as one uint64 array: the salted
    hashes the rules compare and order rows by (`stable_unit_intervals` scales them into [0, 1)).

    Args:
        salt: the rule's salt.
        keys: the conversations' `synth_id`s.

    Returns:
        A uint64 array, in the keys' order.
    """
    prefix, sha256 = f"{salt}:", hashlib.sha256
    heads = b"".join([sha256((prefix + key).encode()).digest()[:8] for key in keys])
    return np.frombuffer(heads, dtype=">u8").astype(np.uint64)


def is_valid(synth_id: str, salt: str = constants.SPLIT_SALT, valid_fraction: float = constants.VALID_FRACTION) -> bool:
    """Whether the split rule (`constants.SPLIT_RULE`) puts a conversation in the valid split.

    Args:
        synth_id: the conversation's id.
        salt: the split's salt.
        valid_fraction: the share of conversations that go to valid.

    Returns:
        True for valid, False for train.
    """
    return stable_unit_interval(salt, synth_id) < valid_fraction


def assign_split(
    synth_id: str, salt: str = constants.SPLIT_SALT, valid_fraction: float = constants.VALID_FRACTION
) -> str:
    """'valid' or 'train' for one conversation, by the locked rule in `constants.SPLIT_RULE`.

    Args:
        synth_id: the conversation's id.
        salt: the split's salt.
        valid_fraction: the share of conversations that go to valid.

    Returns:
        The split's name, one of `constants.SPLITS`.
    """
    return constants.SPLITS[1] if is_valid(synth_id, salt, valid_fraction) else constants.SPLITS[0]


def are_valid(
    synth_ids: Iterable[str], salt: str = constants.SPLIT_SALT, valid_fraction: float = constants.VALID_FRACTION
) -> np.ndarray:
    """`is_valid` of every synth_id, as one bool array (hashed by `stable_unit_intervals`).

    Args:
        synth_ids: the conversations' ids.
        salt: the split's salt.
        valid_fraction: the share of conversations that go to valid.

    Returns:
        True for valid, False for train, in the ids' order.
    """
    return stable_unit_intervals(salt, synth_ids) < valid_fraction
