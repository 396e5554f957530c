"""rensa's token hashes of the signatures' word grams, computed on byte arrays (docs/near-dup.md, "Signatures,
candidates, clusters").

The signatures hash each row's word k-grams (`near_dup.signature_grams`). Handing rensa those grams as Python
strings costs more than rensa's MinHash itself: one `str` a gram (~250 a SYNTH row). rensa also takes the
tokens' 64-bit hashes instead (`RMinHash.digest_matrix_from_flat_token_hashes`, one flat buffer and row
offsets), and a MinHash of the hashes is the MinHash of the tokens. This module computes, with numpy over a
whole batch of rows at once, the hash rensa gives a `str` token (its UTF-8 bytes through rensa's
`calculate_hash_fast`, rustc-hash's byte hash), for every gram, without making the grams:

- the rows' normalized text (`near_dup.normalize_prompt`), encoded, one row after another;
- each gram's bytes are a span of that text (`gram_spans`): from a word's first byte to the end of the word
  k - 1 words on, the single spaces between them included;
- each span's hash (`token_hashes`).

rensa==0.5.0 is pinned (pyproject.toml); `check_rensa_token_hash` compares this hash with rensa's own
(`RMinHash.hash_token_sets`) on tokens of every length branch before the first use, so a rensa whose token hash
differs is refused instead of writing other signatures.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Callable

import numpy as np
from rensa import RMinHash

from synthkd_contract import near_dup as nd

# rensa's byte hash (src/utils.rs: hash_bytes, calculate_hash_fast on 64-bit targets)
_SEED1 = np.uint64(0x243F_6A88_85A3_08D3)
_SEED2 = np.uint64(0x1319_8A2E_0370_7344)
_ZERO_COLLAPSE = np.uint64(0xA409_3822_299F_31D0)
_FX_K = np.uint64(0xF135_7AEA_2E62_A9C5)
_ROTATE = 26
_LOW32 = np.uint64(0xFFFF_FFFF)
_SPACE = ord(" ")
_SHIFTS = {n: np.uint64(n) for n in (8, 32, _ROTATE, 64 - _ROTATE)}


def _multiply_mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """rensa's `multiply_mix`: the low and high 64 bits of the 128-bit product x * y, xored (numpy has no
    128-bit integers: the high half from 32-bit limbs, in place where a temporary allows)."""
    x_lo, x_hi = x & _LOW32, x >> _SHIFTS[32]
    y_lo, y_hi = y & _LOW32, y >> _SHIFTS[32]
    mixed = x * y  # the low half
    lo_hi = x_lo * y_hi
    cross = x_lo * y_lo
    cross >>= _SHIFTS[32]
    np.bitwise_and(lo_hi, _LOW32, out=x_lo)  # x_lo reused: the middle term's low half
    cross += x_lo
    y_lo *= x_hi  # x_hi * y_lo
    cross += y_lo  # < 2**64: no carry is lost
    x_hi *= y_hi
    lo_hi >>= _SHIFTS[32]
    x_hi += lo_hi
    cross >>= _SHIFTS[32]
    x_hi += cross  # the high half
    mixed ^= x_hi
    return mixed


def _reader(data: np.ndarray, dtype: str) -> Callable[[np.ndarray], np.ndarray]:
    """Little-endian `dtype` values read at any byte offsets of `data` (an unaligned view, one byte apart)."""
    width = np.dtype(dtype).itemsize
    if len(data) < width:
        return lambda offsets: np.zeros(len(offsets), dtype=np.uint64)
    view = np.ndarray((len(data) - width + 1,), dtype=dtype, buffer=data, offset=0, strides=(1,))
    return lambda offsets: view[offsets].astype(np.uint64)


def token_hashes(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """rensa's hash of each token `data[start : start + length]`: what `RMinHash.hash_token_sets` gives a `str`
    token whose UTF-8 bytes those are.

    Args:
        data: uint8 bytes holding the tokens.
        starts: int64 byte offset of each token in `data`.
        lengths: int64 byte length of each token.

    Returns:
        uint64, one hash a token, in their order.
    """
    data = np.ascontiguousarray(data, dtype=np.uint8)
    read64, read32 = _reader(data, "<u8"), _reader(data, "<u4")
    s0, s1 = np.full(len(starts), _SEED1), np.full(len(starts), _SEED2)
    with np.errstate(over="ignore"):
        # up to 16 bytes: the first and the last 8 (or 4) bytes, or three single bytes
        for low, high, read, width in ((8, 16, read64, 8), (4, 7, read32, 4)):
            chosen = np.flatnonzero((lengths >= low) & (lengths <= high))
            at = starts[chosen]
            s0[chosen] ^= read(at)
            s1[chosen] ^= read(at + lengths[chosen] - width)
        tiny = np.flatnonzero((lengths >= 1) & (lengths <= 3))
        at, length = starts[tiny], lengths[tiny]
        s0[tiny] ^= data[at].astype(np.uint64)
        s1[tiny] ^= (data[at + length - 1].astype(np.uint64) << _SHIFTS[8]) | data[at + length // 2].astype(np.uint64)
        # longer: 16 bytes at a time while more than 16 are left, then the last 16
        long = np.flatnonzero(lengths > 16)
        active, offset = long, 0
        while len(active):
            at = starts[active] + offset
            mixed = _multiply_mix(s0[active] ^ read64(at), _ZERO_COLLAPSE ^ read64(at + 8))
            s0[active] = s1[active]
            s1[active] = mixed
            offset += 16
            active = active[offset < lengths[active] - 16]
        at = starts[long] + lengths[long] - 16
        s0[long] ^= read64(at)
        s1[long] ^= read64(at + 8)
        hashes = _multiply_mix(s0, s1) ^ lengths.astype(np.uint64)
        hashes *= _FX_K
        return (hashes << _SHIFTS[_ROTATE]) | (hashes >> _SHIFTS[64 - _ROTATE])


def gram_spans(text: np.ndarray, offsets: np.ndarray, k: int = nd.SHINGLE_WORDS) -> tuple[np.ndarray, ...]:
    """Where each row's word k-grams (`near_dup.grams_of_words`) are in its normalized text: a gram runs from a
    word's first byte to the last byte of the word k - 1 words on; a row of fewer than k words is one gram, its
    whole text (possibly empty).

    Args:
        text: uint8 normalized rows (words separated by one space, none leading or trailing), one after another.
        offsets: int64 offset of each row's first byte in `text`, and the end last.
        k: words a gram.

    Returns:
        (starts, lengths, token_offsets): int64 byte offset and length of every gram, the rows' grams in order,
        and the index of each row's first gram (and the total last).
    """
    space = text == _SPACE
    nonempty = offsets[1:] > offsets[:-1]
    starts_word = np.zeros(len(text) + 1, dtype=bool)  # a byte after a space, or a row's first
    starts_word[1:] = space
    starts_word[offsets[:-1][nonempty]] = True
    ends_word = np.zeros(len(text) + 1, dtype=bool)  # a space, or a row's end
    ends_word[:-1] = space
    ends_word[offsets[1:][nonempty]] = True
    word_starts, word_ends = np.flatnonzero(starts_word), np.flatnonzero(ends_word)
    words = np.diff(np.searchsorted(word_starts, offsets))
    after_last_word = np.cumsum(words)
    opens_gram = np.ones(len(word_starts), dtype=bool)  # a word with k - 1 more words after it in its row
    for back in range(1, k):
        opens_gram[(after_last_word - back)[words >= back]] = False
    first_words = np.flatnonzero(opens_gram)
    short = words < k  # one gram: the whole row
    grams = np.where(short, 1, words - k + 1)
    token_offsets = np.zeros(len(words) + 1, dtype=np.int64)
    np.cumsum(grams, out=token_offsets[1:])
    if not short.any():
        return word_starts[first_words], word_ends[first_words + k - 1] - word_starts[first_words], token_offsets
    starts = np.empty(token_offsets[-1], dtype=np.int64)
    ends = np.empty_like(starts)
    of_short = np.zeros(len(starts), dtype=bool)
    of_short[token_offsets[:-1][short]] = True
    starts[of_short], ends[of_short] = offsets[:-1][short], offsets[1:][short]
    starts[~of_short], ends[~of_short] = word_starts[first_words], word_ends[first_words + k - 1]
    return starts, ends - starts, token_offsets


@functools.cache
def check_rensa_token_hash() -> None:
    """Checks, once a process, that `token_hashes` is the installed rensa's own token hash, on tokens of every
    length branch (0 to 97 bytes, ASCII and not): signatures from another hash would silently differ.

    Raises:
        RuntimeError: the installed rensa hashes a string token otherwise.
    """
    tokens = ["".join(chr(ord("a") + (i * 7 + j) % 26) for j in range(n)) for i, n in enumerate(range(50))]
    tokens += ["é", "naïve café", "日本語のテキスト", "x" * 97]
    encoded = [t.encode("utf-8") for t in tokens]
    lengths = np.array([len(e) for e in encoded], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    ours = token_hashes(np.frombuffer(b"".join(encoded), dtype=np.uint8), starts, lengths)
    (theirs,) = RMinHash.hash_token_sets([tokens])
    if ours.tolist() != list(theirs):
        raise RuntimeError(
            f"rensa {importlib.metadata.version('rensa')} hashes string tokens differently from the hash "
            "core/gram_hashes.py computes (rensa 0.5.0's): pin rensa==0.5.0 (pyproject.toml)"
        )
