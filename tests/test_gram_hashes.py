"""core/gram_hashes.py held to rensa itself: each token's hash to what rensa gives the token as a `str`, the
gram spans to the grams near_dup cuts from the normalized words, and the signatures to rensa's MinHash of those
grams as strings (the way the signatures were made before: the oracle)."""

from __future__ import annotations

from unittest import mock

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rensa import RMinHash

from synthkd_assets.core import gram_hashes, near_dup
from synthkd_assets.core.gram_hashes import check_rensa_token_hash, gram_spans, token_hashes
from synthkd_assets.core.near_dup import grams_of_words, minhash_signatures, normalized_words, signature_grams
from synthkd_contract import near_dup as nd

# any text a str can encode (no lone surrogates), with the whitespace and case the normalization folds
TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=120)
SPACED = st.lists(st.one_of(TEXT, st.sampled_from([" ", "  ", "\t", "\n\x0b", "\x1c", "\u3000", "Ǆ", "ﬁ"])))


def _packed(tokens: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    encoded = [token.encode() for token in tokens]
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), starts, lengths


@given(st.lists(st.one_of(TEXT, st.text("ab ", max_size=70)), max_size=30))
def test_each_tokens_hash_is_rensas_hash_of_the_token_as_a_string(tokens):
    """Every length branch: empty, 1-3, 4-7, 8-16 bytes and longer (16 bytes at a time, then the last 16)."""
    data, starts, lengths = _packed(tokens)
    expected = RMinHash.hash_token_sets([tokens])[0] if tokens else []
    assert token_hashes(data, starts, lengths).tolist() == list(expected)


@given(st.lists(SPACED.map("".join), max_size=12), st.integers(1, 4))
def test_gram_spans_are_the_grams_of_the_normalized_words(texts, k):
    normalized = [" ".join(normalized_words(text)).encode() for text in texts]
    offsets = np.concatenate([[0], np.cumsum([len(n) for n in normalized])]).astype(np.int64)
    data = b"".join(normalized)
    starts, lengths, token_offsets = gram_spans(np.frombuffer(data, dtype=np.uint8), offsets, k)
    assert token_offsets[0] == 0 and token_offsets[-1] == len(starts) == len(lengths)
    spans = [
        [data[s : s + n].decode() for s, n in zip(starts[a:b].tolist(), lengths[a:b].tolist(), strict=True)]
        for a, b in zip(token_offsets[:-1].tolist(), token_offsets[1:].tolist(), strict=True)
    ]
    assert spans == [grams_of_words(normalized_words(text), k) for text in texts]


@given(st.lists(SPACED.map("".join), min_size=1, max_size=12), st.sampled_from([1, 40, near_dup.HASHED_BYTES]))
def test_the_signatures_are_rensas_minhash_of_the_grams_as_strings(texts, hashed_bytes):
    """In whatever groups of rows the grams are hashed (a row a group, a few, all)."""
    grams = [signature_grams(text) for text in texts]
    expected = np.asarray(RMinHash.digest_matrix_from_token_sets(grams, nd.NUM_PERM, nd.MINHASH_SEED).to_rows())
    with mock.patch.object(near_dup, "HASHED_BYTES", hashed_bytes):
        assert np.array_equal(minhash_signatures(texts), expected)
        assert np.array_equal(minhash_signatures(pl.Series(texts, dtype=pl.String)), expected)


def test_a_frame_of_real_sized_texts_is_hashed_in_groups_with_the_same_signatures():
    """~1.6 KB texts as SYNTH's: a 512-row frame spans a dozen groups of HASHED_BYTES."""
    words = [f"w{i % 997}x" for i in range(400_000)]
    texts = [" ".join(words[i * 270 : (i + 1) * 270]) for i in range(512)]
    assert sum(map(len, texts)) > 10 * near_dup.HASHED_BYTES
    grams = [signature_grams(text) for text in texts]
    expected = np.asarray(RMinHash.digest_matrix_from_token_sets(grams, nd.NUM_PERM, nd.MINHASH_SEED).to_rows())
    assert np.array_equal(minhash_signatures(texts), expected)


def test_a_null_text_is_signed_as_an_empty_one():
    assert np.array_equal(minhash_signatures(pl.Series([None, "a b"])), minhash_signatures(["", "a b"]))
    assert minhash_signatures([]).shape == (0, nd.NUM_PERM)


def test_a_rensa_that_hashes_strings_otherwise_is_refused(monkeypatch):
    """The signatures would silently change: the check compares with rensa before the first signature."""

    class OtherHash:
        @staticmethod
        def hash_token_sets(token_sets):
            return [[value ^ 1 for value in row] for row in RMinHash.hash_token_sets(token_sets)]

    check_rensa_token_hash.cache_clear()
    monkeypatch.setattr(gram_hashes, "RMinHash", OtherHash)
    try:
        with pytest.raises(RuntimeError, match="pin rensa==0.5.0"):
            minhash_signatures(["a b c d"])
    finally:
        check_rensa_token_hash.cache_clear()
    monkeypatch.undo()
    check_rensa_token_hash()  # rensa's own passes
