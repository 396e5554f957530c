"""The locked split rule and the tokenizer pin."""

from __future__ import annotations

import hashlib
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synthkd_assets import contracts
from synthkd_assets.core.sampling import assign_split, stable_unit_interval
from synthkd_assets.core.tokenizer import TokenizerPinError, load_harmony_encoding, materialize_tokenizer, verify_tokenizer


@given(st.text(min_size=1, max_size=40))
def test_split_is_the_documented_formula(synth_id):
    value = int.from_bytes(hashlib.sha256(f"synth_kd_v1/split:{synth_id}".encode()).digest()[:8], "big") / 2**64
    assert stable_unit_interval(contracts.SPLIT_SALT, synth_id) == value
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
    assert path.name == contracts.TOKENIZER_FILENAME
    assert verify_tokenizer(path) == contracts.TOKENIZER_SHA256
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
    assert verify_tokenizer(path) == contracts.TOKENIZER_SHA256


def test_eod_and_vocab_constants_match_the_encoding(encoding):
    assert encoding.encode("<|endoftext|>", allowed_special="all") == [contracts.EOD_TOKEN_ID]
    emitted = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|endoftext|>"]
    assert max(encoding.encode(t, allowed_special="all")[0] for t in emitted) < contracts.PADDED_VOCAB_SIZE
