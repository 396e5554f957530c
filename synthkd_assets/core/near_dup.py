"""Near-duplicate control (docs/near-dup.md): MinHash signatures per shard, global clusters, the per-cluster cap and the
held-out clusters of the validation sets.

- signatures (per shard, the scan pass): what makes two examples redundant, the question and the answer
  (`signature_text`: the user message without its reference text, then the final answer), normalized
  (`normalize_prompt`), as word shingles, hashed by rensa's RMinHash into NUM_PERM values; LSH_BANDS band keys
  per row. SYNTH asks hundreds of different questions about one article section, so the shared reference is
  left out (docs/near-dup.md "What is compared").
- clusters (global): rows sharing a band key are candidates; a candidate pair is a near-duplicate when the
  share of equal signature values (rensa's Jaccard estimate) is >= the threshold; near-duplicates are joined
  into clusters (scipy's connected components). Identical prompts have identical signatures: exact
  duplicates are clusters like any other.
- decisions: a cluster's rows are ordered by a salted hash of synth_id (`cluster_rank`); rows past
  `max_per_cluster` are dropped as `cluster_cap`; a cluster of one is always kept (the rare tail). Whole
  clusters (none larger than `heldout_cluster_limit`) are held out for the validation sets (`heldout`), so no
  member of them is ever trained on; their signatures are kept (`heldout_prompts`) and every later build holds
  out any row matching one of them, whatever its synth_id (`heldout_matches`).

What the clustering holds grows with its near-duplicates, not with the corpus (benchmarks/README.md "The
clustering at two sizes"): the candidate pairs are found and kept on disk (`CandidateBlocks`), verified a chunk
of pairs at a time within SIGNATURE_BUDGET bytes of low bytes (their slices from a temporary file it reads the
signature files into once; the whole values of the pairs left, as many values), and only the rows of verified
pairs are held afterwards (`Clusters`); the held-out sets, the summary and the clusters files take a shard at a
time. It reads the signature files one file a core at once (`thread_map`), and verification compares one chunk
of pairs a core at once.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import importlib.resources
import json
import math
import os
import shutil
import sys
import threading
import unicodedata
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from rensa import RMinHash

from synthkd_assets.core.filters import answer_expr, constraints_expr, expected_answer
from synthkd_assets.core.gram_hashes import check_rensa_token_hash, gram_spans, token_hashes
from synthkd_assets.core.parallel import (
    available_cores,
    process_directory,
    remove_dead_process_directories,
    thread_map,
)
from synthkd_assets.core.parquet_io import iter_frames, streaming_parquet_file
from synthkd_assets.core.problems import Problems
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.steps import SHARD, Outputs, ParquetOutputs, ShardStep, Table, run_step
from synthkd_contract import constants, drops
from synthkd_contract import near_dup as nd
from synthkd_contract.schemas import BAND_COLUMNS, CLUSTERS_SCHEMA, HARMONY_SCHEMA, SIGNATURES_SCHEMA
from synthkd_contract.splits import are_valid, salted_heads

# the first user message's text, whatever precedes it: [system, user, ...] of raw SYNTH and the anchor sources,
# [system, developer, user, ...] of the synth_harmony_v1 artifact
USER_PROMPT_PATH = "$.messages[?(@.role=='user')].content[0].text"
# what separates the query from its reference text in a SYNTH user message (constants.USER_TEMPLATE)
REFERENCE_SEPARATOR = constants.USER_TEMPLATE.split("{query}")[1].split("{query_seed_text}")[0]
# candidate pairs verified per numpy batch: their gathered values (2 x uint32 + a bool per value, 9 x 128 B a pair)
# are the verification's transient, ~75 MiB at 2^16 (no slower than 2^20, which held up to 1.2 GiB)
EDGE_CHUNK = 1 << 16
SIGNATURE_READ_ROWS = 1 << 14  # rows of a signature file read at a time (8 MiB of values)
HASHED_BYTES = 1 << 16  # normalized bytes whose grams are hashed at a time (minhash_signatures)
SIGNATURE_BUDGET = 1 << 28  # bytes of signature values verification holds at once
PAIR_CHUNK = 1 << 23  # candidate pairs verified at once (~10 bytes each while they are)
VERIFY_SPILL_PREFIX = "synthkd-verify-"  # verification's temporary directory: this, the process id, a suffix
PAIRS_SPILL_PREFIX = "synthkd-pairs-"  # the candidate pairs' temporary directory: this, the process id, a suffix
BLOCK_ROWS = 1 << 20  # the candidate pairs whose low rows lie in one block of this many rows share a file
BANDS_AT_ONCE = 4  # bands whose rows are in the candidate pairs' files at once (24 bytes a row and band)
BAND_RANGE_ROWS = 1 << 20  # a band's rows sorted at once, on average (~80 bytes a row: ~80 MiB)
RANGES_AT_ONCE = 4  # ranges of one band sorted at once, a thread each
MAX_KEY_RANGES = 1 << 16  # ranges are numbered in 16 bits
KL_SET = "kl"  # the held-out KL slice
FORMAT_SET = "format"  # the format-compliance suite


# --- signatures ------------------------------------------------------------------------------------------------
FOLD_PASSES = 4  # normalize_prompt's passes at most: a fold can compose with a following mark, rarely twice


def confusables_version() -> str:
    """The installed version of the confusables table's package (hashed with the cluster settings).

    Returns:
        Its version string, e.g. "3.3.1".
    """
    return importlib.metadata.version(nd.CONFUSABLES_TABLE.replace("_", "-"))


@functools.cache
def fold_table() -> dict[str, str]:
    """What `normalize_prompt` replaces, built once from the Unicode data and the confusables table.

    Every format character (category REMOVED_CATEGORY: zero-width spaces and joiners, soft hyphens, bidi marks)
    is removed. Every non-ASCII character the confusables table lists as looking like one ASCII character is
    replaced by that character, casefolded (a letter before a digit or a symbol, then the lowest code point): a
    Cyrillic `а` by `a`; so is the small letter of such a capital when it has no lookalike of its own (Cyrillic
    `н`, of `Н`, by `h`). No ASCII character is replaced, so ASCII text is only casefolded. The table is read from
    the package's own files (never from a path the environment names).

    Returns:
        {character: its replacement, "" to remove it}.
    """
    data = json.loads((importlib.resources.files(nd.CONFUSABLES_TABLE) / "confusables.json").read_text("utf-8"))
    table: dict[str, str] = {}
    for char, entries in data.items():
        if len(char) != 1 or char.isascii():
            continue
        looks_like = {
            stripped.casefold()
            for entry in entries
            if len(stripped := "".join(c for c in entry["c"] if unicodedata.category(c) != nd.REMOVED_CATEGORY)) == 1
            and stripped.isascii()
            and stripped.isprintable()
            and not stripped.isspace()
        }
        if looks_like:
            table[char] = min(looks_like, key=lambda c: (not c.isalpha(), not c.isdigit(), ord(c)))
    # text is casefolded before it is folded: a capital drawn like a Latin one (Cyrillic `Н`, Greek `Η`) whose small
    # letter is not (`н`, `η`) folds by its small letter too
    for char, ascii_char in sorted(table.items()):
        small = char.casefold()
        if len(small) == 1 and not small.isascii() and small not in table:
            table[small] = ascii_char
    for code in range(sys.maxunicode + 1):
        if unicodedata.category(chr(code)) == nd.REMOVED_CATEGORY:
            table[chr(code)] = ""
    return table


@functools.cache
def _folded_characters() -> frozenset[str]:
    """Every character `fold_table` replaces (a text with none of them is not folded)."""
    return frozenset(fold_table())


def normalize_prompt(text: str) -> str:
    """What two prompts are compared on (docs/near-dup.md "Normalization").

    Unicode NFKC (full-width and compatibility forms fold) and casefold; then format characters removed and
    lookalikes folded to ASCII (`fold_table`), NFKC and casefold again, until no character to fold is left (a
    folded letter can compose with a combining mark after it); every run of whitespace (str.split's) one space,
    no leading or trailing space. ASCII text takes the short way, casefold and whitespace, which is all the rest
    would do to it; other text without a character to fold is read once more, by one set lookup a character.

    Args:
        text: The signature text of a row.

    Returns:
        The normalized text: normalizing it again returns it unchanged.
    """
    return " ".join(normalized_words(text))


def normalized_words(text: str) -> list[str]:
    """The words of `normalize_prompt(text)` (its space-separated parts; none for an empty text), which that
    text joins and `signature_grams` cuts its grams from.

    Args:
        text: The signature text of a row.

    Returns:
        `normalize_prompt(text).split(" ")`, but `[]` where that text is empty.
    """
    if text.isascii():
        return text.casefold().split()
    table, folded = fold_table(), _folded_characters()
    text = unicodedata.normalize(nd.UNICODE_FORM, text).casefold()
    for _ in range(FOLD_PASSES):
        if folded.isdisjoint(text):
            break
        text = unicodedata.normalize(nd.UNICODE_FORM, "".join([table.get(c, c) for c in text])).casefold()
    return text.split()


def shingles(normalized: str, k: int = nd.SHINGLE_WORDS) -> list[str]:
    """The distinct word k-grams of a normalized prompt (words: its space-separated parts); a prompt of fewer
    than k words is one shingle (itself, possibly empty)."""
    return list(dict.fromkeys(word_grams(normalized, k)))


def word_grams(normalized: str, k: int = nd.SHINGLE_WORDS) -> list[str]:
    """`shingles` with repeats left in: a MinHash is a minimum per permutation, which repeats cannot change, so
    the signatures hash every gram, repeats included."""
    return grams_of_words(normalized.split(" ") if normalized else [], k)


def grams_of_words(words: list[str], k: int = nd.SHINGLE_WORDS) -> list[str]:
    """`word_grams` of the text `" ".join(words)`, from its words (`normalized_words`)."""
    if len(words) < k:
        return [" ".join(words)]
    # zip of k shifted word lists, joined by map: ~1.5x the per-gram slice-and-join (benchmarks/near_dup.py)
    return list(map(" ".join, zip(*(words[i:] for i in range(k)))))


def signature_grams(prompt: str) -> list[str]:
    """The word grams the signatures hash for one row's signature text, as strings (`minhash_signatures` hashes
    the same grams as spans of the normalized text's bytes: core/gram_hashes.py)."""
    return grams_of_words(normalized_words(prompt))


def minhash_signatures(prompts: Sequence[str] | pl.Series) -> np.ndarray:
    """(rows, NUM_PERM) uint32 MinHash signatures of the prompts' word grams (`signature_grams`), by rensa.

    rensa is given each gram's hash (core/gram_hashes.py), not the gram: the prompts are normalized
    (`normalize_prompt`) and their grams cut and hashed on the normalized bytes. The signatures are those of the
    grams as strings (`RMinHash.digest_matrix_from_token_sets`).

    Args:
        prompts: the rows' signature texts (a null reads as an empty text).

    Returns:
        The signatures, in the prompts' order.
    """
    texts = prompts.to_list() if isinstance(prompts, pl.Series) else prompts
    if not texts:
        return np.zeros((0, nd.NUM_PERM), dtype=np.uint32)
    check_rensa_token_hash()
    normalized = [normalize_prompt(text or "").encode() for text in texts]
    offsets = np.zeros(len(normalized) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, normalized), dtype=np.int64, count=len(normalized)), out=offsets[1:])
    # rows a group of about HASHED_BYTES bytes at a time: numpy's temporaries stay in the heap malloc keeps, where
    # a whole frame's would be handed back to the kernel and faulted in again for the next
    cuts = (np.flatnonzero(np.diff(offsets[1:] // HASHED_BYTES, prepend=0)) + 1).tolist()
    signatures = np.empty((len(texts), nd.NUM_PERM), dtype=np.uint32)
    for first, end in zip([0, *cuts], [*cuts, len(texts)], strict=True):
        if first < end:
            data = np.frombuffer(b"".join(normalized[first:end]), dtype=np.uint8)
            signatures[first:end] = _signatures_of_normalized(data, offsets[first : end + 1] - offsets[first])
    return signatures


def _signatures_of_normalized(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The signatures of normalized rows (their encoded bytes end to end, and row offsets): rensa's MinHash of their
    grams' hashes."""
    starts, lengths, token_offsets = gram_spans(data, offsets)
    hashes = token_hashes(data, starts, lengths)
    matrix = RMinHash.digest_matrix_from_flat_token_hashes(hashes, token_offsets, nd.NUM_PERM, nd.MINHASH_SEED)
    return np.asarray(matrix.to_rows(), dtype=np.uint32)


_MIX = np.uint64(0x9E3779B97F4A7C15)


def band_keys(signatures: np.ndarray) -> np.ndarray:
    """(rows, LSH_BANDS) uint64: one key per band of LSH_ROWS signature values (a fixed multiply-xorshift
    mix, the same on every machine), so rows sharing a key agree on all of that band's values (up to a 2**-64
    collision)."""
    keys = np.empty((signatures.shape[0], nd.LSH_BANDS), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for band in range(nd.LSH_BANDS):
            h = np.full(signatures.shape[0], np.uint64(band + 1) * _MIX, dtype=np.uint64)
            for value in signatures[:, band * nd.LSH_ROWS : (band + 1) * nd.LSH_ROWS].T:
                h = (h ^ value.astype(np.uint64)) * _MIX
                h ^= h >> np.uint64(31)
            keys[:, band] = h
    return keys


def synth_id_columns(synth_ids: list[str]) -> dict[str, np.ndarray]:
    """The signature file's columns that come from each row's synth_id alone: its 000 split (`valid`), and the
    salted keys that order a cluster's rows (`rank_key`) and pick the held-out clusters (`heldout_key`).

    Args:
        synth_ids: the rows' ids, in order.

    Returns:
        {"valid": bool, "rank_key": uint64, "heldout_key": uint64} arrays, in the ids' order.
    """
    return {
        "valid": are_valid(synth_ids),
        "rank_key": salted_heads(nd.CLUSTER_SALT, synth_ids),
        "heldout_key": salted_heads(nd.HELDOUT_SALT, synth_ids),
    }


def question_expr() -> pl.Expr:
    """The question of a synth_harmony_v1 row: its first user message up to the first REFERENCE_SEPARATOR (a raw
    SYNTH row's `query`), or the whole user message when it has none (an artifact row's query, an anchor
    source's prompt)."""
    user = pl.col("messages_json").str.json_path_match(USER_PROMPT_PATH)
    return user.str.splitn(REFERENCE_SEPARATOR, 2).struct.field("field_0")


def signature_text_expr() -> pl.Expr:
    """`f"{question}\\n\\n{final answer}"` of each row: what the signatures compare (nulls as empty text)."""
    return pl.concat_str([question_expr().fill_null(""), pl.lit("\n\n"), answer_expr().fill_null("")])


def signature_text(query: str, answer: str) -> str:
    """The text compared for a SYNTH row's `query` and `synthetic_answer`, as `signature_text_expr` makes it."""
    return f"{query}\n\n{answer}"


def signature_table(frame: pl.DataFrame) -> pa.Table:
    """synth_harmony_v1 rows -> SIGNATURES_SCHEMA rows (same order)."""
    texts = frame.select(signature_text_expr().alias("text"))["text"]
    signatures = minhash_signatures(texts)
    keys = band_keys(signatures)
    ids = frame["synth_id"].to_list()
    forms = [expected_answer(c) for c in frame.select(constraints_expr().alias("c"))["c"].to_list()]
    columns: dict[str, Any] = {
        "synth_id": ids,
        "exercise": frame["exercise"].to_list(),
        "language": frame["language"].to_list(),
        **synth_id_columns(ids),
        "answer_form": [None if f is None else f[0] for f in forms],
        "near_dup_hash": [f"{k:016x}" for k in keys[:, 0].tolist()],
        "signature": pa.FixedSizeListArray.from_arrays(pa.array(signatures.reshape(-1)), nd.NUM_PERM),
    }
    columns.update({name: keys[:, band] for band, name in enumerate(BAND_COLUMNS)})
    return pa.table(columns, schema=SIGNATURES_SCHEMA)


class SignatureStep(ShardStep):
    """synth_filtered rows -> their signatures (every row kept: the step drops nothing)."""

    def __init__(self, in_path: Path, out_path: Path) -> None:
        self.in_path, self.out_path = in_path, out_path

    def open_outputs(self) -> Outputs:
        return ParquetOutputs({SHARD: (self.out_path, SIGNATURES_SCHEMA)})

    def frames(self) -> Iterator[pl.DataFrame]:
        return iter_frames(self.in_path, HARMONY_SCHEMA.names)

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        report.language.update(frame["language"].to_list())
        report.exercise.update(frame["exercise"].to_list())
        return {SHARD: signature_table(frame)}


def signatures_shard(in_path: Path, out_path: Path, shard: str) -> ShardReport:
    """synth_filtered Parquet -> synth_signatures Parquet (SIGNATURES_SCHEMA), one row per input row."""
    return run_step(SignatureStep(in_path, out_path), shard)


# --- clusters ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClusterSettings:
    """What the clustering and its decisions depend on (hashed into the plan and the manifests)."""

    enabled: bool = True
    threshold: float = nd.JACCARD_THRESHOLD
    max_per_cluster: int = nd.MAX_PER_CLUSTER
    heldout_per_exercise: int = nd.HELDOUT_PER_EXERCISE
    format_suite_per_form: int = nd.FORMAT_SUITE_PER_FORM
    heldout_cluster_limit: int = nd.HELDOUT_CLUSTER_LIMIT

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"near-duplicate threshold must be in (0, 1], got {self.threshold}")
        if self.max_per_cluster < 1:
            raise ValueError(f"max_per_cluster must be >= 1, got {self.max_per_cluster}")
        if self.heldout_per_exercise < 0 or self.format_suite_per_form < 0:
            raise ValueError("held-out set sizes must be >= 0")
        if self.heldout_cluster_limit < 1:
            raise ValueError(f"heldout_cluster_limit must be >= 1, got {self.heldout_cluster_limit}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "threshold": self.threshold,
            "max_per_cluster": self.max_per_cluster,
            "heldout_per_exercise": self.heldout_per_exercise,
            "format_suite_per_form": self.format_suite_per_form,
            "heldout_cluster_limit": self.heldout_cluster_limit,
            "normalization": {
                "unicode": nd.UNICODE_FORM,
                "casefold": True,
                "removed_category": nd.REMOVED_CATEGORY,
                "confusables": {"table": nd.CONFUSABLES_TABLE, "version": confusables_version(), "to": "ascii"},
                "whitespace": "collapsed",
            },
            "shingle_words": nd.SHINGLE_WORDS,
            "minhash": {"library": "rensa.RMinHash", "num_perm": nd.NUM_PERM, "seed": nd.MINHASH_SEED},
            "lsh": {"bands": nd.LSH_BANDS, "rows": nd.LSH_ROWS},
            "salts": {"rank": nd.CLUSTER_SALT, "held_out": nd.HELDOUT_SALT},
        }


def stable_argsort(values: np.ndarray) -> np.ndarray:
    """`np.argsort(values, kind="stable")` of a 1-D integer array, by two of numpy's vectorized quicksorts (its
    stable sort is timsort for 64-bit keys, ~1.5x as slow on the clustering's ~1M-row bands): the values' dense
    ranks, then the positions ordered by (rank, position), one distinct int64 each.

    Args:
        values: a 1-D integer array of fewer than 2**31 values.

    Returns:
        The positions of `values` in ascending order of value, equal values in position order (int64).

    Raises:
        ValueError: 2**31 values or more (rank x n + position would not fit an int64).
    """
    n = len(values)
    if n >= 2**31:
        raise ValueError(f"stable_argsort sorts fewer than 2**31 values, got {n}")
    order = np.argsort(values)
    ordered = values[order]
    new_value = np.empty(n, dtype=bool)
    new_value[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new_value[1:])
    del ordered
    rank_and_position = np.empty(n, dtype=np.int64)
    rank_and_position[order] = np.cumsum(new_value) - 1
    del order, new_value
    rank_and_position *= n
    rank_and_position += np.arange(n, dtype=np.int64)
    return np.argsort(rank_and_position)


def rank_order(rank_key: np.ndarray) -> np.ndarray:
    """The rows in rank_key order, ties in row order (a stable argsort): what `candidate_pairs` orders each band
    by, computed once for every band."""
    return stable_argsort(rank_key)


def candidate_pairs(keys: np.ndarray, rank_key: np.ndarray | None, by_rank: np.ndarray | None = None) -> np.ndarray:
    """(pairs, 2) int64 row indices with equal keys. Within a key's group, ordered by rank_key (a salted hash of
    synth_id, so the same on any shard layout and row order), each row is paired with the group's first row (a
    star) and with the row before it (a chain): at most two pairs per row and band, and a near-duplicate pair is
    missed only when neither its members nor their neighbours in that order verify in any band.

    Args:
        keys: one band's key of every row.
        rank_key: every row's rank_key (None when `by_rank` is given: it is not read then).
        by_rank: `rank_order(rank_key)`, when the caller has it (one band after another): the rows are then
            ordered by a stable sort of one key, the same order as by (keys, rank_key, row).

    Returns:
        The pairs, stars first, then chains.

    Raises:
        ValueError: neither `rank_key` nor `by_rank` given.
    """
    if by_rank is None:
        if rank_key is None:
            raise ValueError("candidate_pairs needs the rank keys or their order")
        by_rank = rank_order(rank_key)
    order = by_rank[stable_argsort(keys[by_rank])]
    ordered = keys[order]
    starts = np.ones(len(ordered), dtype=bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(len(ordered)), 0))
    members = np.flatnonzero(~starts)
    star = np.stack([order[first[members]], order[members]], axis=1)
    chained = members[first[members] != members - 1]  # the chain pair of the second row is its star pair
    chain = np.stack([order[chained - 1], order[chained]], axis=1)
    return np.concatenate([star, chain]).astype(np.int64)


def sorted_distinct(values: np.ndarray, in_place: bool = False, runs: bool = False) -> np.ndarray:
    """`np.unique` of a 1-D integer array (its distinct values, sorted), by a sort and a comparison of neighbours.

    numpy 2's `np.unique` hashes the values before sorting them, many times slower on the millions of pair codes
    and rows of the clustering (benchmarks/README.md, "Near-duplicate control"). Values in no order are sorted by
    numpy's default sort (its vectorized quicksort: ~10x the stable sort on millions of int64); sorted runs
    concatenated (`runs`, as a block of `CandidateBlocks` holds them) by its stable sort, timsort, which merges them
    in linear time.

    Args:
        values: a 1-D integer array.
        in_place: sort `values` itself (a temporary of the caller's) instead of a copy.
        runs: `values` is a few sorted runs one after the other.

    Returns:
        The distinct values in ascending order.
    """
    ordered = values if in_place else values.copy()
    ordered.sort(kind="stable" if runs else None)
    keep = np.empty(len(ordered), dtype=bool)
    keep[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def _pair_codes(pairs: np.ndarray, n_rows: int) -> np.ndarray:
    """Sorted distinct codes low * n_rows + high of the pairs (one int64 a pair: the unordered pair)."""
    codes = np.minimum(pairs[:, 0], pairs[:, 1]) * n_rows + np.maximum(pairs[:, 0], pairs[:, 1])
    return sorted_distinct(codes, in_place=True)


def _code_pairs(codes: np.ndarray, n_rows: int) -> np.ndarray:
    return np.stack([codes // n_rows, codes % n_rows], axis=1)


def every_shards_column(paths: Sequence[Path], column: str, offsets: np.ndarray | None = None) -> np.ndarray:
    """A column of every shard's file, in shard order (each file read on its own thread, into its own rows of the
    result: the column is held once, not once per shard and again joined).

    Args:
        paths: every shard's file, in shard order.
        column: a column of plain values (e.g. "rank_key", a band column).
        offsets: `shard_row_offsets(paths)`, when the caller has them (every footer is read otherwise).

    Returns:
        The column's values, the shards' rows in order.

    Raises:
        ValueError: a file does not hold the rows its footer gave (it changed since).
    """
    offsets = shard_row_offsets(paths) if offsets is None else offsets
    if not len(paths):
        return np.zeros(0, dtype=np.uint64)
    dtype = pq.ParquetFile(paths[0]).schema_arrow.field(column).type.to_pandas_dtype()
    out = np.empty(int(offsets[-1]), dtype=dtype)

    def read_shard(shard: int) -> None:
        values = pq.read_table(paths[shard], columns=[column]).column(column).to_numpy()
        if len(values) != offsets[shard + 1] - offsets[shard]:
            raise ValueError(f"{paths[shard]}: {len(values)} rows of {column}, not the rows its footer gave")
        out[offsets[shard] : offsets[shard + 1]] = values

    thread_map(read_shard, range(len(paths)))
    return out


def shard_row_offsets(paths: Sequence[Path]) -> np.ndarray:
    """The global row of each shard's first row, and the total last (from the files' footers).

    Args:
        paths: every shard's file, in shard order.

    Returns:
        int64 offsets, one more than the shards.
    """
    sizes = [pq.ParquetFile(path).metadata.num_rows for path in paths]
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def _signature_rows(
    paths: Sequence[Path], offsets: np.ndarray, rows: np.ndarray, values: slice = slice(None), low_bytes: bool = False
) -> np.ndarray:
    """The given signature values (a slice of the NUM_PERM) of the given global rows (sorted), reading each
    shard's signature column once, in the row groups that hold them only; with `low_bytes`, each value's low
    byte only (uint8, a quarter of the memory: equal values have equal low bytes)."""
    width = len(range(nd.NUM_PERM)[values])
    out = np.empty((len(rows), width), dtype=np.uint8 if low_bytes else np.uint32)

    def keep(first: int, block: np.ndarray) -> None:  # numpy's assignment keeps a uint32's low byte in a uint8
        out[first : first + len(block)] = block

    _each_signature_block(paths, offsets, rows, values, keep)
    return out


def _each_signature_block(
    paths: Sequence[Path],
    offsets: np.ndarray,
    rows: np.ndarray | None,
    values: slice,
    take: Callable[[int, np.ndarray], None],
) -> None:
    """Hands `take(first, block)` the signature values (the `values` slice, uint32) of the given global rows
    (sorted), a batch of a shard's rows at a time: `block` holds rows[first : first + len(block)]. Each shard's
    signature column is read once, on a thread a shard, in the row groups that hold those rows only. `rows`
    None: every row, `block` then holding rows first .. first + len(block) - 1."""

    def read_shard(shard: int) -> None:
        file = streaming_parquet_file(paths[shard])
        if rows is None:  # every row: each batch whole
            start = int(offsets[shard])
            for batch in file.iter_batches(batch_size=SIGNATURE_READ_ROWS, columns=["signature"]):
                take(start, batch.column(0).flatten().to_numpy().reshape(-1, nd.NUM_PERM)[:, values])
                start += batch.num_rows
            if start != offsets[shard + 1]:
                raise ValueError(f"{paths[shard]}: {start - offsets[shard]} signatures, not the rows its footer gave")
            return
        lo, hi = np.searchsorted(rows, [offsets[shard], offsets[shard + 1]])
        if lo == hi:
            return
        groups, wanted = rows_in_row_groups(file.metadata, rows[lo:hi] - offsets[shard])
        start = 0  # the row, among the row groups read, of the batch's first row
        batches = file.iter_batches(batch_size=SIGNATURE_READ_ROWS, row_groups=groups, columns=["signature"])
        for batch in batches:
            first, end = np.searchsorted(wanted, [start, start + batch.num_rows])
            if first < end:
                flat = batch.column(0).flatten().to_numpy().reshape(-1, nd.NUM_PERM)[:, values]
                take(int(lo + first), np.take(flat, wanted[first:end] - start, axis=0))
            start += batch.num_rows

    thread_map(read_shard, range(len(paths)))


class SignatureSpill:
    """Some rows' NUM_PERM signature values (every row's low bytes, or the whole values of the rows of the pairs
    left after them), read from the signature files once and kept value by value in a temporary file
    (`VERIFY_SPILL_PREFIX`): a slice of the values is then one read of its values' bytes, in order, where reading
    it from the signature files decodes every value of every row again. Use it as a context manager: the file is
    removed on leaving it, and a process killed before that leaves a directory the next verification removes."""

    def __init__(
        self, paths: Sequence[Path], offsets: np.ndarray, rows: np.ndarray | None = None, low_bytes: bool = True
    ) -> None:
        """Read the rows' values into the file.

        Args:
            paths: every shard's signature file, in shard order.
            offsets: the global row of each shard's first row (and the total last).
            rows: the global rows to keep, ascending (None: every row, each at its own place).
            low_bytes: keep each value's low byte (uint8), or the whole value (uint32).

        Raises:
            OSError: the file could not be written (it is named).
        """
        remove_dead_process_directories(VERIFY_SPILL_PREFIX)  # those of plans killed with SIGKILL
        self.directory = process_directory(VERIFY_SPILL_PREFIX)
        self.rows = int(offsets[-1]) if rows is None else len(rows)
        self.dtype = np.dtype(np.uint8 if low_bytes else "<u4")
        self.path = self.directory / ("low_bytes" if low_bytes else "values")
        try:
            with open(self.path, "wb") as file:
                file.truncate(self.rows * nd.NUM_PERM * self.dtype.itemsize)
                descriptor = file.fileno()

                def write(first: int, block: np.ndarray) -> None:  # value j of row i at j * rows + i
                    by_value = np.ascontiguousarray(block.astype(self.dtype).T)
                    for value, column in enumerate(by_value):
                        os.pwrite(descriptor, column, (value * self.rows + first) * self.dtype.itemsize)

                _each_signature_block(paths, offsets, rows, slice(None), write)
        except BaseException as error:
            shutil.rmtree(self.directory, ignore_errors=True)
            named = temporary_file_error(error, self.path)  # a failed write (a full disk) names no file
            if named is error:
                raise
            raise named from error

    def __enter__(self) -> SignatureSpill:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def values(self, values: slice) -> np.ndarray:
        """Some values of every row kept.

        Args:
            values: a slice of the NUM_PERM values.

        Returns:
            (values, rows), value-major as the file holds them: the values in the slice's order, the rows in the
            order given.
        """
        taken = range(nd.NUM_PERM)[values]
        out = np.empty((len(taken), self.rows), dtype=self.dtype)
        with open(self.path, "rb") as file:
            for column, value in enumerate(taken):
                out[column] = np.fromfile(
                    file, dtype=self.dtype, count=self.rows, offset=value * self.rows * self.dtype.itemsize
                )
                file.seek(0)
        return out


def rows_in_row_groups(metadata: pq.FileMetaData, rows: np.ndarray) -> tuple[list[int], np.ndarray]:
    """Where a file's rows are, by row group.

    Args:
        metadata: the Parquet file's metadata (its row groups' sizes).
        rows: rows of the file, sorted.

    Returns:
        The row groups that hold them (ascending, each once), and each row's place among those row groups' rows
        read one after another (the rows of the groups skipped left out).
    """
    sizes = np.array([metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)], dtype=np.int64)
    group_start = np.concatenate([[0], np.cumsum(sizes)])
    group_of = np.searchsorted(group_start, rows, side="right") - 1
    groups = sorted_distinct(group_of)
    skipped = group_start[groups] - np.concatenate([[0], np.cumsum(sizes[groups])[:-1]])  # rows before, not read
    return groups.tolist(), rows - skipped[np.searchsorted(groups, group_of)]


def value_slices(candidate_rows: int, budget: int = SIGNATURE_BUDGET, value_bytes: int = 4) -> int:
    """How many slices of the NUM_PERM values verification reads (a power of two), so the candidate rows'
    share of signature values in memory at once (`value_bytes` a value: 4, or 1 for their low bytes) stays within
    `budget` bytes."""
    slices = 1
    while slices < nd.NUM_PERM and candidate_rows * value_bytes * nd.NUM_PERM > budget * slices:
        slices *= 2
    return slices


def verified_pairs(
    pairs: np.ndarray, paths: Sequence[Path], offsets: np.ndarray, threshold: float, budget: int = SIGNATURE_BUDGET
) -> np.ndarray:
    """The candidate pairs whose estimated Jaccard (share of equal MinHash values) is >= threshold
    (`verified_codes`, for pairs given as rows).

    Args:
        pairs: (pairs, 2) candidate row pairs (global rows: the shards in order).
        paths: every shard's signature file, in shard order.
        offsets: the global row of each shard's first row (and the total last).
        threshold: the estimated Jaccard at or above which a pair is kept.
        budget: the most bytes of signature values held at once.

    Returns:
        The pairs kept, in their order.
    """
    rows = int(offsets[-1])
    codes = np.minimum(pairs[:, 0], pairs[:, 1]) * rows + np.maximum(pairs[:, 0], pairs[:, 1])
    kept = sorted_distinct(verified_codes(codes, rows, paths, offsets, threshold, budget))
    return pairs[in_sorted(codes, kept)]


def verified_codes(
    codes: np.ndarray | Iterable[np.ndarray],
    rows: int,
    paths: Sequence[Path],
    offsets: np.ndarray,
    threshold: float,
    budget: int = SIGNATURE_BUDGET,
    chunk: int = PAIR_CHUNK,
) -> np.ndarray:
    """The candidate pairs whose estimated Jaccard (share of equal MinHash values) is >= threshold.

    A first pass compares only each value's low byte (a quarter of the memory, and of the slices when the
    budget asks for them: `_Verification.reaching`): equal values have equal low bytes, so no pair that verifies is
    dropped there, and unrelated values share a low byte one time in 256. The pairs it leaves are then compared on
    their whole values, reading only their rows (docs/near-dup.md, "Signatures, candidates, clusters"). The pairs
    kept are those a comparison of the whole values keeps. The pairs are taken `chunk` at a time; what
    verification holds per pair of a chunk is its code, its count of equal values and whether it can still
    verify, and each part of a chunk is split into its rows as it is compared. When every row's low bytes exceed
    the budget they are read from the signature files once, into a temporary file (`SignatureSpill`), and each
    slice of the values is read from there.

    Args:
        codes: the candidate pairs as codes low * rows + high (`CandidateBlocks`' are ascending, each once): one
            array, or arrays one after another (`CandidateBlocks`' blocks).
        rows: the rows of every shard together (the codes' base).
        paths: every shard's signature file, in shard order.
        offsets: the global row of each shard's first row (and the total last).
        threshold: the estimated Jaccard at or above which a pair is kept.
        budget: the most bytes of signature values held at once.
        chunk: the most pairs verified at once.

    Returns:
        The codes of the pairs kept, in their order.

    Raises:
        OSError: the temporary file could not be written (it is named).
    """
    kept = [np.zeros(0, dtype=np.int64)]
    with contextlib.ExitStack() as stack:
        verification = _Verification(rows, paths, offsets, threshold, budget)
        if rows * nd.NUM_PERM > budget:  # every row's low bytes past the budget: read them once, into a file
            verification.spill = stack.enter_context(SignatureSpill(paths, offsets))
        for part in _chunks_of([codes] if isinstance(codes, np.ndarray) else codes, chunk):
            kept.append(part[verification.verified(part)])
    return np.concatenate(kept)


def _chunks_of(arrays: Iterable[np.ndarray], chunk: int) -> Iterator[np.ndarray]:
    """The values of `arrays`, one after another, in arrays of `chunk` values (the last shorter): small arrays
    joined, large ones cut."""
    pending: list[np.ndarray] = []
    held = 0
    for array in arrays:
        while len(array):
            taken, array = array[: chunk - held], array[chunk - held :]
            pending.append(taken)
            held += len(taken)
            if held == chunk:
                yield np.concatenate(pending)
                pending, held = [], 0
    if held:
        yield np.concatenate(pending)


@dataclass
class _Verification:
    """What verifying a chunk of pairs reads: the signature files, the threshold and the budget, and every row's
    low bytes in a temporary file when they exceed the budget (`spill`)."""

    rows: int  # the rows of every shard together (the codes' base)
    paths: Sequence[Path]
    offsets: np.ndarray
    threshold: float
    budget: int
    spill: SignatureSpill | None = None

    def verified(self, codes: np.ndarray) -> np.ndarray:
        """Which of the pairs `codes` verify (bool): their values' low bytes first (from `spill` when given), then
        their whole values."""
        alive = np.ones(len(codes), bool)
        self.reaching(codes, alive, low_bytes=True)
        return self.reaching(codes, alive)

    def reaching(self, codes: np.ndarray, alive: np.ndarray, low_bytes: bool = False) -> np.ndarray:
        """Which of the pairs `alive` marks have at least `min_equal_values(threshold)` equal values (or equal low
        bytes), counted a slice of the values at a time within `budget` (`value_slices`). After each slice a pair
        that could not reach the threshold even if every value left were equal is dropped. The low bytes are read
        from `spill` when there is one (every row's, a slice a read). The whole values are those of the rows of
        the pairs left, as many values as the low bytes get (4 bytes each: they are the near-duplicates' rows,
        few unless most rows are), read from the row groups that hold them; in more than one slice they are read
        once into a temporary file of their own, each slice then from there. An unrelated pair is compared only
        until it has differed in more values than the threshold allows (26 of 128 at 0.8). `alive` is updated in
        place and returned."""
        if not alive.any():
            return alive
        rows = self.rows
        need = min_equal_values(self.threshold)
        equal = np.zeros(len(codes), dtype=np.uint8)
        with contextlib.ExitStack() as stack:
            places: RowPlaces | None = None  # every row, at its own place: the spill of every row's low bytes
            spill = self.spill if low_bytes else None
            if spill is not None:
                width = nd.NUM_PERM // value_slices(rows, self.budget, 1)
            else:
                wanted = _rows_of_pairs(codes, rows, alive)
                width = nd.NUM_PERM // value_slices(len(wanted), self.budget, 1)
                places = RowPlaces(wanted)
                if width < nd.NUM_PERM and not low_bytes:  # the whole values in slices: read them once
                    spill = stack.enter_context(SignatureSpill(self.paths, self.offsets, wanted, low_bytes=False))
            for start in range(0, nd.NUM_PERM, width):
                taken = slice(start, start + width)
                if spill is not None:
                    values, by_value = spill.values(taken), True
                else:
                    if start:
                        wanted = _rows_of_pairs(codes, rows, alive)
                        places = RowPlaces(wanted)
                    values = _signature_rows(self.paths, self.offsets, wanted, taken, low_bytes)
                    by_value = False
                _count_equal_values(values, by_value, places, codes, rows, alive, equal)
                del values
                short = math.ceil(need - (nd.NUM_PERM - (start + width)))  # needed if every value left is equal
                if short > 0:
                    alive &= equal >= np.uint8(short)
                    if not alive.any():
                        break
        return alive


class RowPlaces:
    """Each row of `wanted` (ascending, distinct) at its place in it, looked up by row: a gather from an array
    over the rows' span when that is at most four times as long as `wanted` (the pairs of one stretch of rows),
    else a binary search (the pairs left after the low bytes, scattered over the corpus)."""

    def __init__(self, wanted: np.ndarray) -> None:
        self.wanted = wanted
        self.first = int(wanted[0]) if len(wanted) else 0
        span = int(wanted[-1]) + 1 - self.first if len(wanted) else 0
        self.place: np.ndarray | None = None
        if span <= 4 * len(wanted):
            self.place = np.empty(span, dtype=row_index_dtype(len(wanted)))
            self.place[wanted - self.first] = np.arange(len(wanted), dtype=self.place.dtype)

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        if self.place is not None:
            return self.place[rows - self.first]
        return np.searchsorted(self.wanted, rows)


def _rows_of_pairs(codes: np.ndarray, rows: int, alive: np.ndarray) -> np.ndarray:
    """The distinct rows of the pairs `alive` marks, ascending (int64)."""
    live = codes[alive]
    return sorted_distinct(np.concatenate([live // rows, live % rows]), in_place=True)


def _count_equal_values(
    values: np.ndarray,
    by_value: bool,
    places: RowPlaces | None,
    codes: np.ndarray,
    rows: int,
    alive: np.ndarray,
    equal: np.ndarray,
) -> None:
    """Adds to `equal` how many of `values` the two rows of each pair `alive` marks share, a chunk of pairs a core
    at once. `values` is (rows, values), or with `by_value` (values, rows) as `SignatureSpill.values` gives them
    (then compared a value at a time: a sum across a few values of each row costs more than the comparisons); the
    pairs' rows at their places in it by `places` (None: each row at its own place)."""
    step = max(EDGE_CHUNK // available_cores(), 1)  # one chunk a core at once: EDGE_CHUNK pairs' transient in all

    def count(lo: int) -> None:
        chunk = np.flatnonzero(alive[lo : lo + step]) + lo
        live = codes[chunk]
        a, b = live // rows, live % rows
        if places is not None:
            a, b = places(a), places(b)
        if by_value:
            same = np.zeros(len(chunk), dtype=np.uint8)
            for value in values:
                same += value[a] == value[b]
            equal[chunk] += same
        else:
            equal[chunk] += (values[a] == values[b]).sum(axis=1, dtype=np.uint8)

    thread_map(count, range(0, len(codes), step))


DECISIONS = (None, drops.DROP_HELDOUT, drops.DROP_CLUSTER_CAP)  # what `Clusters.decision`'s codes stand for
NO_DECISION, HELDOUT_DECISION, CAP_DECISION = range(len(DECISIONS))


@dataclass
class ShardClusters:
    """One shard's rows of the clusters, in its file's order (CLUSTERS_SCHEMA's cluster columns)."""

    cluster_id: np.ndarray  # int64
    size: np.ndarray  # int32
    rank: np.ndarray  # int32
    decision: np.ndarray  # int8, an index into DECISIONS: one byte a row, not a Python object

    def decision_names(self) -> pa.Array:
        """The decisions as CLUSTERS_SCHEMA's `decision` column: a drop reason, or null."""
        return pa.array(DECISIONS, pa.string()).take(pa.array(self.decision))


@dataclass
class Clusters:
    """The clusters of every row (global row order: the shards in order, each in its file's order).

    Only the rows of some verified pair (`members`) are held: every other row is a cluster of its own, named by
    its rank key, which its shard's signature file holds. A shard's rows are put together from both on demand
    (`shard`), so what the clustering keeps grows with the rows in clusters, not with the corpus
    (docs/near-dup.md, "Signatures, candidates, clusters")."""

    shards: list[str]
    paths: list[Path]  # each shard's signature file
    offsets: np.ndarray  # rows of shard i are offsets[i]:offsets[i+1]
    members: np.ndarray  # the global rows of some verified pair, ascending (int64)
    member_cluster_id: np.ndarray  # int64, the members' in their order
    member_size: np.ndarray  # int32
    member_rank: np.ndarray  # int32
    heldout_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # ascending
    cap: int | None = None  # max_per_cluster, when the cap is on
    heldout: list[dict[str, Any]] = field(default_factory=list)  # the held-out clusters' representatives
    over_limit: dict[str, int] = field(default_factory=dict)  # clusters too large to hold out: never chosen
    candidate_pairs: int = 0
    verified_pairs: int = 0

    @property
    def rows(self) -> int:
        return int(self.offsets[-1])

    def shard(self, index: int) -> ShardClusters:
        """Shard `index`'s rows: its rank keys read from its signature file, its members' clusters placed over
        them, then the decisions (the held-out clusters, then the cap on what is left).

        Args:
            index: the shard's place in `shards`.

        Returns:
            Its rows' cluster_id, size, rank and decision, in its file's order.

        Raises:
            ValueError: the signature file does not hold the rows it held when the clusters were made.
        """
        lo, hi = int(self.offsets[index]), int(self.offsets[index + 1])
        rank_key = every_shards_column([self.paths[index]], "rank_key", np.array([0, hi - lo], dtype=np.int64))
        cluster_id = (rank_key >> np.uint64(1)).astype(np.int64)
        del rank_key
        size = np.ones(hi - lo, dtype=np.int32)
        rank = np.zeros(hi - lo, dtype=np.int32)
        first, end = np.searchsorted(self.members, [lo, hi])
        local = self.members[first:end] - lo
        cluster_id[local] = self.member_cluster_id[first:end]
        size[local] = self.member_size[first:end]
        rank[local] = self.member_rank[first:end]
        decision = np.zeros(hi - lo, dtype=np.int8)
        decision[in_sorted(cluster_id, self.heldout_ids)] = HELDOUT_DECISION
        if self.cap is not None:
            decision[(rank >= self.cap) & (decision == NO_DECISION)] = CAP_DECISION
        return ShardClusters(cluster_id, size, rank, decision)

    def every_row(self) -> ShardClusters:
        """Every row's columns, the shards' rows in order: for tests and small corpora (the build takes a
        shard at a time)."""
        parts = [self.shard(index) for index in range(len(self.shards))]
        if not parts:
            empty = np.zeros(0, dtype=np.int32)
            return ShardClusters(empty.astype(np.int64), empty, empty, empty.astype(np.int8))
        return ShardClusters(*(np.concatenate([getattr(p, name) for p in parts]) for name in _SHARD_COLUMNS))


_SHARD_COLUMNS = ("cluster_id", "size", "rank", "decision")


def key_ranges(rows: int) -> int:
    """How many ranges of band keys a band's rows are cut into: the least power of two that leaves at most
    BAND_RANGE_ROWS rows a range on average (band keys are uniform hashes), and at least one a thread."""
    ranges = 1
    while (rows > BAND_RANGE_ROWS * ranges or ranges < min(available_cores(), RANGES_AT_ONCE)) and (
        ranges < MAX_KEY_RANGES
    ):
        ranges *= 2
    return ranges


def row_index_dtype(rows: int) -> type:
    """The narrowest of int32 and int64 that numbers `rows` rows: the clustering's per-row index arrays."""
    return np.int32 if rows < 2**31 else np.int64


_BAND_RECORD = np.dtype([("key", "<u8"), ("rank", "<u8"), ("row", "<i8")])  # a row of one band, spilled


def temporary_file_error(error: BaseException, path: Path) -> BaseException:
    """An OSError that names no file (a failed write: a full disk) as one naming the temporary file `path`; any
    other error as it is."""
    if isinstance(error, OSError) and error.errno is not None and error.filename is None:
        return OSError(error.errno, f"the clustering's temporary file {path}: {error.strerror}")
    return error


@contextlib.contextmanager
def _appending(path: Path) -> Iterator[BinaryIO]:
    """`path` opened to append to, a failed write (a full disk) naming it (`temporary_file_error`)."""
    try:
        with open(path, "ab") as file:
            yield file
    except OSError as error:
        named = temporary_file_error(error, path)
        if named is error:
            raise
        raise named from error


class CandidateBlocks:
    """Every distinct pair of rows that share a band key in any band (`candidate_pairs`), over every shard, as
    codes low * rows + high kept in temporary files (`PAIRS_SPILL_PREFIX`), not in memory.

    BANDS_AT_ONCE bands at a time: each shard's rows of them (key, rank key, row), its columns read once for them
    all, are appended to the file of their band's key range (`key_ranges`: a key's rows all lie in one range);
    then each range, RANGES_AT_ONCE at a time, is read back, its pairs found and their codes appended to the file
    of their low row's block (BLOCK_ROWS rows). Each block's codes are then made distinct. What is held at once is
    a shard's rows and a few ranges' pairs: it does not grow with the corpus (docs/near-dup.md, "Signatures,
    candidates, clusters"). Use it as a context manager:
    the files are removed on leaving it, and a process killed before that leaves a directory the next clustering
    removes."""

    def __init__(self, paths: Sequence[Path], offsets: np.ndarray) -> None:
        """Find the pairs and write their codes.

        Args:
            paths: every shard's signature file, in shard order.
            offsets: `shard_row_offsets(paths)`.

        Raises:
            ValueError: a file does not hold the rows its offsets give (it changed since).
            OSError: a temporary file could not be written (it is named).
        """
        remove_dead_process_directories(PAIRS_SPILL_PREFIX)  # those of plans killed with SIGKILL
        self.directory = process_directory(PAIRS_SPILL_PREFIX)
        self.rows = int(offsets[-1])
        self.blocks = max(1, -(-self.rows // BLOCK_ROWS))
        self.count = 0  # distinct pairs
        self._locks = [threading.Lock() for _ in range(self.blocks)]
        try:
            ranges = key_ranges(self.rows)
            for first in range(0, len(BAND_COLUMNS), BANDS_AT_ONCE):
                columns = BAND_COLUMNS[first : first + BANDS_AT_ONCE]
                for files in self._band_records(paths, offsets, columns, ranges):  # a band's ranges at a time
                    thread_map(self._range_pairs, files, RANGES_AT_ONCE)
            for block in range(self.blocks):
                path = self.block_path(block)
                if path.exists():
                    codes = sorted_distinct(np.fromfile(path, dtype=np.int64), in_place=True, runs=True)
                    path.unlink()
                    with _appending(path) as file:
                        codes.tofile(file)
                    self.count += len(codes)
        except BaseException:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def __enter__(self) -> CandidateBlocks:
        return self

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def block_path(self, block: int) -> Path:
        """The file of the pairs whose low row is in [block * BLOCK_ROWS, (block + 1) * BLOCK_ROWS)."""
        return self.directory / f"block_{block:06d}"

    def __iter__(self) -> Iterator[np.ndarray]:
        """Each block's codes, ascending and distinct, the blocks in order (so every code ascending)."""
        for block in range(self.blocks):
            path = self.block_path(block)
            yield np.fromfile(path, dtype=np.int64) if path.exists() else np.zeros(0, dtype=np.int64)

    def _band_records(
        self, paths: Sequence[Path], offsets: np.ndarray, columns: Sequence[str], ranges: int
    ) -> list[list[Path]]:
        """Every shard's rows of some bands appended to the files of their key ranges, each shard's columns read
        once for them all (a shard a thread at once).

        Returns:
            Each band's range files, in the order of `columns`.
        """
        files = [[self.directory / f"{column}_range_{index:05d}" for index in range(ranges)] for column in columns]
        locks = [[threading.Lock() for _ in range(ranges)] for _ in columns]
        shift = np.uint64(64 - (ranges.bit_length() - 1))

        def append_shard(shard: int) -> None:
            table = pq.read_table(paths[shard], columns=[*columns, "rank_key"], use_threads=False)
            if table.num_rows != offsets[shard + 1] - offsets[shard]:
                raise ValueError(f"{paths[shard]}: {table.num_rows} rows, not the rows its footer gave")
            rank_key = table.column("rank_key").to_numpy()
            for band, column in enumerate(columns):
                keys = table.column(column).to_numpy()
                label = (keys >> shift).astype(np.uint16) if ranges > 1 else np.zeros(len(keys), dtype=np.uint16)
                order = np.argsort(label, kind="stable")  # a radix sort of 16-bit labels
                records = np.empty(len(keys), dtype=_BAND_RECORD)
                records["key"] = keys[order]
                records["rank"] = rank_key[order]
                records["row"] = order + offsets[shard]
                bounds = np.searchsorted(label[order], np.arange(ranges + 1))
                for index in np.flatnonzero(np.diff(bounds)).tolist():
                    with locks[band][index], _appending(files[band][index]) as file:
                        records[bounds[index] : bounds[index + 1]].tofile(file)

        thread_map(append_shard, range(len(paths)))
        return files

    def _range_pairs(self, path: Path) -> None:
        """One key range's candidate pairs, their codes appended to their blocks' files."""
        if not path.exists():
            return
        records = np.fromfile(path, dtype=_BAND_RECORD)
        path.unlink()
        by_rank = np.argsort(records["rank"])  # by (rank key, row), as `rank_order`
        ranks = records["rank"][by_rank]
        if (ranks[1:] == ranks[:-1]).any():  # rank keys repeat (a synth_id twice): their rows in row order
            by_rank = np.lexsort((records["row"], records["rank"]))
        del ranks
        rows = records["row"]
        codes = _pair_codes(rows[candidate_pairs(records["key"], None, by_rank)], self.rows)
        del records, by_rank, rows
        block_starts = np.arange(self.blocks + 1, dtype=np.int64) * BLOCK_ROWS * self.rows
        bounds = np.searchsorted(codes, block_starts)
        for block in np.flatnonzero(np.diff(bounds)).tolist():
            with self._locks[block], _appending(self.block_path(block)) as file:
                codes[bounds[block] : bounds[block + 1]].tofile(file)


def distinct_candidate_codes(paths: Sequence[Path]) -> np.ndarray:
    """Every distinct candidate pair's code (`CandidateBlocks`), in memory: for tests and benchmarks (the
    clustering reads them a block at a time).

    Args:
        paths: every shard's signature file, in shard order.

    Returns:
        The pairs' codes low * rows + high (`_pair_codes`), ascending, each pair once.
    """
    with CandidateBlocks(paths, shard_row_offsets(paths)) as blocks:
        return np.concatenate([np.zeros(0, dtype=np.int64), *blocks])


def distinct_candidate_pairs(paths: Sequence[Path]) -> np.ndarray:
    """`distinct_candidate_codes` as (pairs, 2) global rows, sorted by their pair code."""
    return _code_pairs(distinct_candidate_codes(paths), int(shard_row_offsets(paths)[-1]))


def member_clusters(member_keys: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The clusters of the rows of the verified pairs: the connected components of the pairs, each named by its
    lowest rank key.

    Args:
        member_keys: the rank key (uint64) of each row of some pair, in row order.
        edges: (pairs, 2) places of the pairs' rows in `member_keys`.

    Returns:
        (cluster_id, size, rank) per member: the component's lowest rank key >> 1 (int64), its rows (int32), and
        the row's place in it by rank key, then row order (int32, 0 for the representative).
    """
    # scipy loads here, in the plan pass, not in every run worker that imports this module (its import is part of
    # each run's start-up otherwise: benchmarks/README.md, "Launching through the instance")
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    m = len(member_keys)
    cluster_id = np.empty(m, dtype=np.int64)
    rank = np.empty(m, dtype=np.int32)
    if not m:
        return cluster_id, np.zeros(0, dtype=np.int32), rank
    graph = coo_matrix((np.ones(len(edges), dtype=np.int8), (edges[:, 0], edges[:, 1])), shape=(m, m))
    _, labels = connected_components(graph, directed=False)
    order = np.lexsort((member_keys, labels))  # by component, then rank key, then row (the sort is stable)
    ordered = labels[order]
    starts = np.ones(m, dtype=bool)
    starts[1:] = ordered[1:] != ordered[:-1]
    first = np.maximum.accumulate(np.where(starts, np.arange(m), 0))
    rank[order] = np.arange(m) - first
    size = np.bincount(labels)[labels].astype(np.int32)
    cluster_id[order] = (member_keys[order[first]] >> np.uint64(1)).astype(np.int64)
    return cluster_id, size, rank


def column_at_rows(paths: Sequence[Path], offsets: np.ndarray, column: str, rows: np.ndarray) -> np.ndarray:
    """A column's values at some global rows, each shard's file read only when it holds some of them.

    Args:
        paths: every shard's file, in shard order.
        offsets: `shard_row_offsets(paths)`.
        column: a column of plain values (e.g. "rank_key").
        rows: global rows, ascending.

    Returns:
        The values, in the rows' order.

    Raises:
        ValueError: a file does not hold the rows its offsets give (it changed since).
    """
    dtype = pq.ParquetFile(paths[0]).schema_arrow.field(column).type.to_pandas_dtype() if len(paths) else np.uint64
    out = np.empty(len(rows), dtype=dtype)

    def read_shard(shard: int) -> None:
        first, end = np.searchsorted(rows, [offsets[shard], offsets[shard + 1]])
        if first < end:
            bounds = offsets[shard : shard + 2] - offsets[shard]
            out[first:end] = every_shards_column([paths[shard]], column, bounds)[rows[first:end] - offsets[shard]]

    thread_map(read_shard, range(len(paths)))
    return out


def cluster_shards(shards: Sequence[str], paths: Sequence[Path], settings: ClusterSettings) -> Clusters:
    """Clusters over every shard's signature file; then the held-out clusters and the cap.

    Args:
        shards: the shards' names, in order.
        paths: each shard's signature file, in the same order.
        settings: the threshold, the cap and the held-out sets' sizes.

    Returns:
        The clusters: the members' held, every other row's read from its shard when asked (`Clusters.shard`).

    Raises:
        ValueError: a signature file changed while it was read.
    """
    offsets = shard_row_offsets(paths)
    n = int(offsets[-1])
    candidates = 0
    edges = np.zeros((0, 2), dtype=np.int64)
    if n:  # clusters are computed (and reported) with the cap off too; `enabled` decides only the cap
        with CandidateBlocks(paths, offsets) as blocks:  # the pairs on disk, a block of them at a time in memory
            candidates = blocks.count
            edges = _code_pairs(verified_codes(blocks, n, paths, offsets, settings.threshold), n)
    # only the rows of some verified pair are held: their rank keys, read again here, name their clusters
    members = sorted_distinct(edges.ravel())
    keys = column_at_rows(paths, offsets, "rank_key", members)
    cluster_id, size, rank = member_clusters(keys, np.searchsorted(members, edges))
    clusters = Clusters(list(shards), list(paths), offsets, members, cluster_id, size, rank)
    clusters.candidate_pairs, clusters.verified_pairs = candidates, len(edges)
    _hold_out(clusters, settings)
    clusters.cap = settings.max_per_cluster if settings.enabled else None
    return clusters


def owned(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with its own copy of its strings. A filter or gather of polars' strings keeps views into the whole
    source column's buffers, so a few rows kept from each of 500 shards would hold every shard's strings (~26 B a
    row of the signature files' ids and labels, 1.2 GiB at 40M rows); a pass through Arrow's contiguous strings
    copies only the rows kept.

    Args:
        frame: a frame, typically a few rows taken from a large one.

    Returns:
        The same rows and schema, sharing no buffer with the source.
    """
    return pl.from_arrow(frame.to_arrow())


def _hold_out(clusters: Clusters, settings: ClusterSettings) -> None:
    """Pick whole clusters for the validation sets by their representative (rank 0) row: per exercise the
    `heldout_per_exercise` first by heldout_key (the KL slice), then per checkable answer form the
    `format_suite_per_form` first among the rest (the format suite); mark every member `heldout`. A cluster of
    more than `heldout_cluster_limit` rows is never picked (it would keep as many rows from training for one
    validation prompt): those clusters and their rows are counted in `clusters.over_limit`.

    The first k of a group over all shards are among the union of each shard's first k of it, so each shard
    contributes only those (two passes: the KL slice, then the format suite without it): memory does not grow
    with the corpus."""
    over = (clusters.member_rank == 0) & (clusters.member_size > settings.heldout_cluster_limit)
    clusters.over_limit = {"clusters": int(over.sum()), "rows": int(clusters.member_size[over].sum())}
    if clusters.rows == 0:
        return

    def representatives(index: int) -> pl.DataFrame:
        own = clusters.shard(index)
        columns = ["synth_id", "exercise", "language", "answer_form", "heldout_key"]
        return (
            pl.read_parquet(clusters.paths[index], columns=columns)
            .with_columns(
                shard=pl.lit(clusters.shards[index]),
                cluster_id=pl.Series(own.cluster_id),
                cluster_size=pl.Series(own.size),
                cluster_rank=pl.Series(own.rank),
            )
            .filter((pl.col("cluster_rank") == 0) & (pl.col("cluster_size") <= settings.heldout_cluster_limit))
        )

    def first(frame: pl.DataFrame, by: str, k: int) -> pl.DataFrame:  # a few rows of a shard's: their own strings
        return owned(frame.sort("heldout_key", "synth_id").filter(pl.int_range(pl.len()).over(by) < k))

    shards = range(len(clusters.shards))
    kl = first(
        pl.concat([first(representatives(i), "exercise", settings.heldout_per_exercise) for i in shards]),
        "exercise",
        settings.heldout_per_exercise,
    )
    taken = kl["cluster_id"].implode()

    def forms(index: int) -> pl.DataFrame:
        rest = representatives(index).filter(~pl.col("cluster_id").is_in(taken))
        return first(rest.filter(pl.col("answer_form").is_not_null()), "answer_form", settings.format_suite_per_form)

    form = first(pl.concat([forms(i) for i in shards]), "answer_form", settings.format_suite_per_form)
    chosen = pl.concat([kl.with_columns(set=pl.lit(KL_SET)), form.with_columns(set=pl.lit(FORMAT_SET))])
    clusters.heldout_ids = np.unique(chosen["cluster_id"].to_numpy().astype(np.int64))
    clusters.heldout = chosen.select(
        "set", "synth_id", "shard", "exercise", "language", "answer_form", "cluster_id", "cluster_size"
    ).to_dicts()


def in_sorted(values: np.ndarray, wanted: np.ndarray, chunk: int = EDGE_CHUNK * 16) -> np.ndarray:
    """`np.isin(values, wanted)` for a few wanted values among many: a binary search of each value in `wanted`,
    a chunk of values at a time, where np.isin sorts every value with the wanted ones (~50 bytes a value).

    Args:
        values: any 1-D array (e.g. every row's cluster id).
        wanted: the values looked for, ascending.
        chunk: values looked up at once.

    Returns:
        A bool per value: whether it is among `wanted`.
    """
    found = np.zeros(len(values), dtype=bool)
    if len(wanted):
        for lo in range(0, len(values), chunk):
            part = values[lo : lo + chunk]
            found[lo : lo + chunk] = wanted[np.minimum(np.searchsorted(wanted, part), len(wanted) - 1)] == part
    return found


def shard_clusters_table(clusters: Clusters, shard_index: int, signatures_path: Path) -> pa.Table:
    """One shard's rows of `clusters` as CLUSTERS_SCHEMA (synth_id and near_dup_hash from its signatures)."""
    own = pq.read_table(signatures_path, columns=["synth_id", "near_dup_hash"])
    rows = clusters.shard(shard_index)
    return pa.table(
        {
            "synth_id": own.column("synth_id"),
            "cluster_id": rows.cluster_id,
            "cluster_size": rows.size,
            "cluster_rank": rows.rank,
            "near_dup_hash": own.column("near_dup_hash"),
            "decision": rows.decision_names(),
        },
        schema=CLUSTERS_SCHEMA,
    )


def cluster_summary(clusters: Clusters, paths: Sequence[Path], top: int = 5) -> dict[str, Any]:
    """What the UI and the plan need: size histogram, largest clusters, share of rows in clusters of size > 1,
    diversity, the clusters crossing the 000 split, and the rows each decision removes per (exercise,
    language) cell of every shard (the sampling plan counts rows after them).

    A shard at a time: the rows in no cluster of more than one, most of the corpus, are counted from the
    members alone, and a shard's rows are read only for its members and its rows with a decision."""
    n = clusters.rows
    representatives = clusters.member_size[clusters.member_rank == 0]
    singles = n - len(clusters.members)  # every row of no verified pair is a cluster of its own
    values, counts = np.unique(representatives, return_counts=True)
    if singles:
        values, counts = np.concatenate([[1], values]), np.concatenate([[singles], counts])
    dropped: dict[str, int] = {}
    parts: list[pl.DataFrame] = []
    held: list[dict[str, Any]] = []
    for index, path in enumerate(paths):
        rows = clusters.shard(index)
        for reason, count in decision_counts(rows.decision).items():  # each reason in the order it first occurs
            dropped[reason] = dropped.get(reason, 0) + count
        parts.append(_summary_rows(clusters, index, path, rows))
        held.extend(_heldout_prompts_of(clusters, index, path, rows))
    table = pl.concat(
        parts or [pl.DataFrame(schema={"synth_id": pl.String, "exercise": pl.String, "language": pl.String})]
    )
    largest = _largest(table, top) if n else []
    crossing = 0
    if n:
        kept = table.filter(pl.col("decision").is_null() & (pl.col("cluster_size") > 1))
        crossing = kept.group_by("cluster_id").agg(pl.col("valid").n_unique()).filter(pl.col("valid") > 1).height
    removed: dict[str, dict[str, dict[str, dict[str, int]]]] = {}
    if n:
        for shard, reason, exercise, language, count in (
            table.filter(pl.col("decision").is_not_null())
            .group_by("shard", "decision", "exercise", "language")
            .len()
            .sort("shard", "decision", "exercise", "language")
            .iter_rows()
        ):
            removed.setdefault(shard, {}).setdefault(reason, {}).setdefault(exercise, {})[language] = count
    in_clusters = int((clusters.member_size > 1).sum())
    clusters_count = singles + len(representatives)
    largest_size = int(values.max()) if len(values) else 0
    return {
        "rows": n,
        "clusters": clusters_count,
        "candidate_pairs": clusters.candidate_pairs,
        "verified_pairs": clusters.verified_pairs,
        "rows_in_clusters_over_1": in_clusters,
        "share_in_clusters_over_1": in_clusters / n if n else 0.0,
        "distinct_share": float(clusters_count) / n if n else 1.0,
        "largest_cluster_share": float(largest_size) / n if n and largest_size > 1 else 0.0,  # a cluster of 2+
        "size_histogram": {str(size): count for size, count in zip(values.tolist(), counts.tolist())},
        "largest": largest,
        "clusters_crossing_split": crossing,
        "dropped": dropped,
        "removed_cells": removed,
        "heldout_clusters": clusters.heldout,
        "heldout_over_limit": clusters.over_limit,
        "heldout_prompts": held,
    }


def decision_counts(decision: np.ndarray) -> dict[str, int]:
    """Rows per decision (drop reason), in the order each first occurs among the rows.

    Args:
        decision: the rows' decision codes (`ShardClusters.decision`).

    Returns:
        {drop reason: rows}, the rows with no decision left out.
    """
    codes, first = np.unique(decision, return_index=True)
    counts = np.bincount(decision, minlength=len(DECISIONS))
    in_order = codes[np.argsort(first)].tolist()
    return {DECISIONS[code]: int(counts[code]) for code in in_order if code != NO_DECISION}


def heldout_prompts(clusters: Clusters, paths: Sequence[Path]) -> list[dict[str, Any]]:
    """What every later build checks its rows against, whatever their synth_ids (docs/near-dup.md "Rebuilds"):
    each row the clusters hold out, with its MinHash signature as kept when the clusters were made.

    Args:
        clusters: The clusters with their decisions.
        paths: Each shard's synth_signatures file, in the clusters' shard order.

    Returns:
        One entry a held-out row (shards in order, each in its file's order): synth_id, shard, cluster_id and
        `signature` (its NUM_PERM uint32 values, little-endian, as hex).
    """
    return [entry for i, p in enumerate(paths) for entry in _heldout_prompts_of(clusters, i, p, clusters.shard(i))]


def _heldout_prompts_of(clusters: Clusters, index: int, path: Path, rows: ShardClusters) -> list[dict[str, Any]]:
    """`heldout_prompts`' entries of one shard, whose rows are `rows`."""
    held = np.flatnonzero(rows.decision == HELDOUT_DECISION)
    if not len(held):
        return []
    signatures = _signature_rows([path], np.array([0, len(rows.decision)]), held).astype("<u4")
    ids = pl.read_parquet(path, columns=["synth_id"])["synth_id"].gather(held)
    return [
        {
            "synth_id": synth_id,
            "shard": clusters.shards[index],
            "cluster_id": int(rows.cluster_id[row]),
            "signature": signature.tobytes().hex(),
        }
        for row, synth_id, signature in zip(held.tolist(), ids.to_list(), signatures)
    ]


def _summary_rows(clusters: Clusters, index: int, path: Path, rows: ShardClusters) -> pl.DataFrame:
    """One shard's rows that the summary's tables use: in a cluster of more than one, or with a decision (the
    rest, most of the corpus, is counted from the members alone)."""
    keep = np.flatnonzero((rows.size > 1) | (rows.decision != NO_DECISION))
    table = owned(pl.read_parquet(path, columns=["synth_id", "exercise", "language", "valid"])[keep])
    return table.with_columns(
        shard=pl.lit(clusters.shards[index]),
        cluster_id=pl.Series(rows.cluster_id[keep]),
        cluster_size=pl.Series(rows.size[keep]),
        cluster_rank=pl.Series(rows.rank[keep]),
        decision=pl.Series(rows.decision_names().take(pa.array(keep)), dtype=pl.String),
    )


def _largest(table: pl.DataFrame, top: int) -> list[dict[str, Any]]:
    biggest = (
        table.filter(pl.col("cluster_size") > 1)
        .sort("cluster_size", "cluster_id", "cluster_rank", descending=[True, False, False])
        .group_by("cluster_id", maintain_order=True)
        .agg(pl.col("cluster_size").first(), pl.col("synth_id").head(3), pl.col("shard").head(3))
        .head(top)
    )
    return biggest.to_dicts()


def removed_by_clusters(
    summary: Mapping[str, Any], shards: Collection[str] | None = None
) -> dict[tuple[str, str], int]:
    """Rows the clusters' decisions remove per (exercise, language), summed over `shards` (default: all the
    clusters saw; a shard removed since is not counted)."""
    cells: Counter[tuple[str, str]] = Counter()
    for shard, by_reason in summary.get("removed_cells", {}).items():
        if shards is not None and shard not in shards:
            continue
        for by_exercise in by_reason.values():
            for exercise, by_language in by_exercise.items():
                for language, count in by_language.items():
                    cells[(exercise, language)] += count
    return dict(cells)


def prompt_of(filtered_path: Path, synth_id: str) -> str:
    """One row's question and answer, as the signatures saw them before normalization (for the UI's example
    pair). Streamed: the shard's whole messages column is never held for one row of it."""
    columns = ("synth_id", "messages_json")
    frame = pl.concat([f.filter(pl.col("synth_id") == synth_id) for f in iter_frames(filtered_path, columns)])
    return frame.select(signature_text_expr()).item()


class BySynthId:
    """A shard's table (unique synth_id) whose rows are looked up by synth_id, batch after batch.

    The table stays columnar, with a sorted array of 64-bit hashes of its ids to search (~50 B a row in all): a
    dict of Python objects holds ~300 B a row, and a join per batch builds a hash table of the whole shard each
    time. A found row's id is compared with the one asked for, so a hash collision never returns a wrong row."""

    def __init__(self, table: pl.DataFrame) -> None:
        if table["synth_id"].is_duplicated().any():
            raise ValueError("synth_ids repeat in a synth_clusters file")
        self.table = table
        keys = self._hashes(table["synth_id"])
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]

    @staticmethod
    def _hashes(ids: pl.Series) -> np.ndarray:
        return ids.hash(seed=0).to_numpy()

    def rows(self, synth_ids: list[str]) -> pl.DataFrame:
        """The rows for `synth_ids`, in their order: nulls for an id the table does not have."""
        wanted = pl.Series("synth_id", synth_ids, dtype=pl.String)
        keys = self._hashes(wanted)
        lo, hi = np.searchsorted(self.keys, keys, "left"), np.searchsorted(self.keys, keys, "right")
        positions = np.full(len(wanted), -1, dtype=np.int64)
        hit = np.flatnonzero(hi > lo)
        positions[hit] = self.order[lo[hit]]
        ids = self.table["synth_id"]
        differ = hit[(ids.gather(positions[hit]) != wanted.gather(hit)).to_numpy()]
        for i in differ.tolist():  # a hash shared by other ids (or by none in the table): look at all of them
            match = [int(r) for r in self.order[lo[i] : hi[i]] if ids[int(r)] == synth_ids[i]]
            positions[i] = match[0] if match else -1
        index = pl.Series(positions, dtype=pl.Int64)
        return self.table.select(pl.all().gather(pl.when(index >= 0).then(index)))


def shard_cluster_columns(path: Path) -> BySynthId:
    """synth_id, cluster_id, near_dup_hash of one shard's synth_clusters file (the pool's
    docs/pool.md#what-the-pool-holds columns), by synth_id."""
    return BySynthId(pl.read_parquet(path, columns=["synth_id", "cluster_id", "near_dup_hash"]))


def ids_unseen_by_clusters(rows_path: Path, clusters_path: Path) -> tuple[pl.Series, int]:
    """(the synth_ids of `rows_path` the clusters file never saw, rows in all): the rows `clusters_rule` keeps
    without a decision. No clusters file: every row. Reads the synth_id columns only."""
    ids = pl.read_parquet(rows_path, columns=["synth_id"])
    if not clusters_path.is_file():
        return ids["synth_id"], ids.height
    seen = pl.read_parquet(clusters_path, columns=["synth_id"])
    return ids.join(seen, on="synth_id", how="anti")["synth_id"], ids.height


def min_equal_values(threshold: float) -> float:
    """How many of two signatures' NUM_PERM values must be equal for their rows to be near duplicates.

    Args:
        threshold: The estimated Jaccard similarity at or above which two rows are near duplicates.

    Returns:
        threshold x NUM_PERM, less a rounding margin (0.8 x 128 is not exactly 102.4 in floating point).
    """
    return threshold * nd.NUM_PERM - 1e-9


def signed_row_for_row(rows_path: Path, signatures_path: Path) -> bool:
    """Whether a signatures file is the one of these rows: its synth_ids are theirs, in their order (the signature
    step writes one row per input row).

    Args:
        rows_path: A synth_filtered Parquet.
        signatures_path: The shard's synth_signatures Parquet.

    Returns:
        True when both hold the same synth_ids in the same order.
    """
    rows = pl.read_parquet(rows_path, columns=["synth_id"])["synth_id"]
    return rows.equals(pl.read_parquet(signatures_path, columns=["synth_id"])["synth_id"])


def heldout_matches(signatures_path: Path, heldout: Sequence[Mapping[str, Any]], threshold: float) -> set[str]:
    """The rows of a shard whose prompt is a held-out one, whatever their synth_ids (docs/near-dup.md "Rebuilds").

    A row matches when its MinHash signature (the shard's synth_signatures, as they are now) and a held-out row's
    signature as the clusters kept it (`heldout_prompts`) share at least `threshold` of their values: the test
    that joins two rows into one cluster, so an exact copy, a copy under new synth_ids and a near copy all match.
    Only rows sharing an LSH band key with a held-out row are compared (their signatures alone are read).

    Args:
        signatures_path: The shard's synth_signatures Parquet.
        heldout: The clusters' `heldout_prompts` entries (a `signature` each).
        threshold: The clusters' near-duplicate threshold.

    Returns:
        The synth_ids of the matching rows.
    """
    if not heldout:
        return set()
    held = np.stack([np.frombuffer(bytes.fromhex(entry["signature"]), dtype="<u4") for entry in heldout])
    held = held.astype(np.uint32)
    keys = band_keys(held)
    bands = pl.read_parquet(signatures_path, columns=["synth_id", *BAND_COLUMNS])
    shares_a_key = pl.any_horizontal(
        [pl.col(name).is_in(pl.Series(keys[:, band]).implode()) for band, name in enumerate(BAND_COLUMNS)]
    )
    rows = np.flatnonzero(bands.select(shares_a_key.alias("hit"))["hit"].to_numpy())
    if not len(rows):
        return set()
    signatures = _signature_rows([signatures_path], np.array([0, bands.height], dtype=np.int64), rows)
    near = np.zeros(len(rows), dtype=bool)
    step = max(1, EDGE_CHUNK // len(held))  # candidate rows compared at once, with every held-out row
    for lo in range(0, len(rows), step):
        equal = (signatures[lo : lo + step, None, :] == held[None, :, :]).sum(axis=2)
        near[lo : lo + step] = (equal >= min_equal_values(threshold)).any(axis=1)
    return set(bands["synth_id"].gather(rows[near]).to_list())


class ClustersTooOld(ValueError):
    """A clusters summary written before held-out prompts were kept in it."""


def summary_heldout_prompts(summary: Mapping[str, Any], summary_path: Path) -> tuple[list[dict[str, Any]], float]:
    """The held-out prompts a clusters summary keeps, and the threshold they are matched at.

    Args:
        summary: A synth_clusters summary (clusters.json), as read.
        summary_path: Where it was read (named in the error).

    Returns:
        (its `heldout_prompts`, its settings' Jaccard threshold).

    Raises:
        ClustersTooOld: the summary has no `heldout_prompts` (written by an earlier version): naming the file and
            the pass that rewrites it.
    """
    if "heldout_prompts" not in summary:
        raise ClustersTooOld(
            f"{summary_path} keeps no held-out prompts (an earlier version wrote it), so no row can be checked "
            "against the validation sets: run the plan pass again (./scripts/build.sh, or dg launch --job "
            "synth_plan_job), then this step"
        )
    return summary["heldout_prompts"], summary["settings"]["threshold"]


def heldout_prompts_trained(
    document_tables: Sequence[Path],
    signature_files: Sequence[Path],
    summary: Mapping[str, Any],
    summary_path: Path,
    matched: Collection[str] = (),
) -> Problems:
    """Rows a dataset trains on whose prompt is a held-out one, by content (`heldout_matches`), whatever their
    synth_ids: the validation sets' guarantee checked on what was written.

    Args:
        document_tables: The dataset's documents tables (a synth_id column: the rows it trains on).
        signature_files: The synth_signatures Parquet of every shard whose matches are not in `matched` (where a
            row's signature is read).
        summary: The clusters summary in force (its `heldout_prompts` and the threshold in its `settings`).
        summary_path: Where the summary was read.
        matched: The matches of the other shards, found by `heldout_matches` on their signatures as they are now
            under this summary (each shard's synth_sampled records them: docs/near-dup.md "Rebuilds").

    Returns:
        One line a trained row matching a held-out prompt (the first 20 listed, all counted); one line naming the
        summary when it keeps no held-out prompts (`summary_heldout_prompts`): then nothing can be checked.
    """
    try:
        held, threshold = summary_heldout_prompts(summary, summary_path)
    except ClustersTooOld as error:
        return Problems([str(error)])
    present = [path for path in signature_files if path.is_file()]
    found_now = thread_map(lambda path: heldout_matches(path, held, threshold), present)
    matched = set(matched).union(*found_now)
    if not matched or not document_tables:
        return Problems()
    trained = pl.concat(
        pl.read_parquet(path, columns=["synth_id"]).with_columns(table=pl.lit(path.name)) for path in document_tables
    )
    found = trained.join(pl.DataFrame({"synth_id": sorted(matched)}, schema={"synth_id": pl.String}), on="synth_id")
    found = found.sort("synth_id", "table")
    listed = [
        f"synth_id {synth_id!r} in {table} has the prompt of a held-out row (a copy of a validation prompt)"
        for synth_id, table in found.head(20).iter_rows()
    ]
    return Problems(listed, total=found.height)


def synth_ids_rule(synth_ids: Collection[str], reason: str) -> Callable[[pl.DataFrame], pl.Series]:
    """A RowRule dropping exactly `synth_ids` with `reason`."""
    wanted = sorted(synth_ids)

    def reasons(frame: pl.DataFrame) -> pl.Series:
        hit = pl.col("synth_id").is_in(wanted)
        return frame.select(pl.when(hit).then(pl.lit(reason, dtype=pl.String)).alias("reason"))["reason"]

    return reasons


def clusters_rule(path: Path) -> Callable[[pl.DataFrame], pl.Series]:
    """One shard's cap / held-out decisions (its synth_clusters file) as a RowRule over synth_harmony_v1 frames:
    the drop reason by synth_id. A row the clusters never saw (its shard changed after they were computed: the
    raw sensor rebuilds a changed shard under the clusters in force, like under the sampling plan) is kept
    until the next re-plan (docs/near-dup.md "Rebuilds")."""
    decisions = BySynthId(pl.read_parquet(path, columns=["synth_id", "decision"]))

    def reasons(frame: pl.DataFrame) -> pl.Series:
        return decisions.rows(frame["synth_id"].to_list())["decision"].alias("reason")

    return reasons
