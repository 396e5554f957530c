"""Near-duplicate control (core/near_dup.py): normalization, signatures, clusters, the cap and the held-out
clusters, on generated prompts whose true pairs are known, against an exact-Jaccard oracle written here."""

from __future__ import annotations

import itertools
import random
import string
import tempfile
import unicodedata
from collections import Counter
from dataclasses import replace
from itertools import combinations
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rensa import RMinHash

from synthkd_assets.core import near_dup
from synthkd_assets.core.filters import quality_drop_reasons
from synthkd_assets.core.near_dup import (
    BySynthId,
    CandidateBlocks,
    ClusterSettings,
    band_keys,
    candidate_pairs,
    cluster_shards,
    cluster_summary,
    grams_of_words,
    min_equal_values,
    minhash_signatures,
    normalize_prompt,
    normalized_words,
    rank_order,
    removed_by_clusters,
    shingles,
    signature_table,
    signatures_shard,
    sorted_distinct,
    stable_argsort,
    value_slices,
    verified_pairs,
    word_grams,
)
from synthkd_assets.core.parquet_io import ParquetShardWriter
from synthkd_assets.core.stages import harmonize_shard, select_rows_shard
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.defs.near_dup import large_cluster_result
from synthkd_contract import drops
from synthkd_contract import near_dup as nd
from synthkd_contract.schemas import BAND_COLUMNS, SIGNATURES_SCHEMA
from synthkd_contract.splits import is_valid
from synthkd_dev.harmony_rows import harmony_frame
from synthkd_dev.make_sample_data import generate_rows, planted_near_duplicates, planted_negatives, rows_to_table

THRESHOLD = nd.JACCARD_THRESHOLD


def oracle_jaccard(a: str, b: str) -> float:
    """Exact Jaccard of word 3-gram sets after NFKC + casefold + whitespace collapse (written independently)."""

    def grams(text: str) -> set[tuple[str, ...]]:
        words = unicodedata.normalize("NFKC", text).casefold().split()
        return {tuple(words[i : i + 3]) for i in range(len(words) - 2)} or {tuple(words)}

    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y)


def write_signatures(rows: list[dict], path: Path) -> Path:
    with ParquetShardWriter(path, SIGNATURES_SCHEMA) as writer:
        writer.write(signature_table(harmony_frame(rows)))
    return path


WORDS = [
    "".join(random.Random(i).choices(string.ascii_lowercase, k=random.Random(-i).randint(3, 9))) for i in range(4000)
]


def planted_corpus(seed: int = 7, originals: int = 300, with_copies: int = 60) -> tuple[list[dict], list[tuple]]:
    """Random prompts, and near copies of some of them with known edits: (rows, planted (source, copy) pairs)."""
    rng = random.Random(seed)
    rows, planted = [], []
    for i in range(originals):
        rows.append({"synth_id": f"o{i:04d}", "prompt": " ".join(rng.choices(WORDS, k=rng.randint(60, 160)))})
    for i in range(with_copies):
        source = rows[i]
        for k in range(rng.randint(1, 6)):
            words = source["prompt"].split()
            edit = k % 4
            if edit == 0:  # a word substituted
                words[rng.randrange(len(words))] = rng.choice(WORDS)
            elif edit == 1:  # case and whitespace
                words = [w.upper() if rng.random() < 0.3 else w for w in words]
                words[0] = "  \n" + words[0]
            elif edit == 2:  # full-width characters NFKC folds back
                words[1] = "".join(chr(ord(c) + 0xFEE0) for c in words[1])
            else:  # a short phrase appended
                words += rng.choices(WORDS, k=2)
            copy = {"synth_id": f"{source['synth_id']}-c{k}", "prompt": " ".join(words).replace("  \n ", "  \n")}
            rows.append(copy)
            planted.append((source["synth_id"], copy["synth_id"]))
    return rows, planted


def clusters_by_id(
    rows: list[dict], shard_rows: list[list[dict]], tmp_path: Path, settings: ClusterSettings | None = None
):
    """{synth_id: (cluster_id, size, rank, decision)} of the rows written as the given shards."""
    names = [f"synth_{i:02d}" for i in range(len(shard_rows))]
    paths = [write_signatures(part, tmp_path / f"{name}.parquet") for name, part in zip(names, shard_rows)]
    clusters = cluster_shards(names, paths, settings or ClusterSettings())
    ids = [r["synth_id"] for part in shard_rows for r in part]
    found = {i: (int(c), int(s), int(k), d) for i, c, s, k, d in zip(ids, *_arrays(clusters))}
    return found, clusters, paths


# --- normalization --------------------------------------------------------------------------------------------
def test_normalization_folds_case_width_and_whitespace():
    assert normalize_prompt("  Ｈｅｌｌｏ\tWORLD\n\n again ") == "hello world again"
    assert normalize_prompt("Straße") == "strasse"  # casefold, not lower
    assert normalize_prompt("") == ""


@given(st.text(max_size=200))
def test_normalization_is_idempotent_and_blind_to_case_and_spacing(text):
    once = normalize_prompt(text)
    assert normalize_prompt(once) == once
    assert normalize_prompt(f"  {text.upper()}  ") == normalize_prompt(f"\n{text.upper()}")


@given(st.text(max_size=200), st.integers(1, 4))
def test_the_words_hashed_are_the_normalized_texts_words_and_their_grams_its_grams(text, k):
    """The signatures take their grams from `normalized_words`, never joined into the normalized text and split
    again: the same words and grams as that text's (`word_grams` reads them off the text itself)."""
    normalized = normalize_prompt(text)
    words = normalized_words(text)
    assert words == (normalized.split(" ") if normalized else [])
    expected = [" ".join(words[i : i + k]) for i in range(len(words) - k + 1)] if len(words) >= k else [normalized]
    assert grams_of_words(words, k) == word_grams(normalized, k) == expected


# --- LSH candidates -------------------------------------------------------------------------------------------
@given(st.lists(st.tuples(st.integers(0, 6), st.one_of(st.integers(0, 3), st.integers(0, 2**64 - 1))), max_size=60))
def test_candidate_pairs_star_and_chain_each_keys_group_in_rank_order(rows):
    """Ties of rank_key (possible only for repeated synth_ids) are broken by row, with or without the rank order
    computed once for every band (the rank keys themselves not read then)."""
    keys = np.array([k for k, _ in rows], dtype=np.uint64)
    ranks = np.array([r for _, r in rows], dtype=np.uint64)
    expected = set()  # brute force: per key, the rows by rank then row; each to the first and to the one before it
    for key in set(keys.tolist()):
        group = sorted((r, i) for i, (k, r) in enumerate(rows) if k == key)
        for j in range(1, len(group)):
            expected |= {tuple(sorted((group[0][1], group[j][1]))), tuple(sorted((group[j - 1][1], group[j][1])))}
    for pairs in (candidate_pairs(keys, ranks), candidate_pairs(keys, None, rank_order(ranks))):
        assert {tuple(sorted(map(int, pair))) for pair in pairs} == expected
    with pytest.raises(ValueError, match="needs the rank keys or their order"):
        candidate_pairs(keys, None)


@hypothesis_settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 63), st.integers(0, 3), st.integers(0, 3) | st.integers(0, 2**64 - 1)), max_size=200
    ),
    st.sampled_from([2, 4, 64, 1024]),
    st.sampled_from([1, 3, 1 << 20]),
    st.integers(1, 4),
)
def test_the_candidate_blocks_hold_the_whole_bands_pairs(tmp_path_factory, rows, ranges, block_rows, files):
    """Keys spread over every range (their top bits) and shared within a range, repeated rank keys, the rows in
    several files: the pair codes the blocks hold, found a key range at a time from the spilled rows, are those of
    each whole band at once, ascending, each once, whatever the ranges, the blocks and the files."""
    directory = tmp_path_factory.mktemp("blocks")
    n = len(rows)
    keys = np.array([(top << 58) | low for top, low, _ in rows], dtype=np.uint64)
    ranks = np.array([rank for _, _, rank in rows], dtype=np.uint64)
    columns = {"rank_key": ranks}
    expected = np.zeros(0, dtype=np.int64)
    for band, column in enumerate(BAND_COLUMNS):  # each band's keys a permutation of band_00's
        band_keys = np.roll(keys, band) if band % 2 else keys ^ np.uint64(band)
        columns[column] = band_keys
        expected = np.union1d(expected, near_dup._pair_codes(candidate_pairs(band_keys, ranks), n))
    bounds = np.linspace(0, n, files + 1).astype(int)
    paths = []
    for i in range(files):
        paths.append(directory / f"synth_{i}.parquet")
        pq.write_table(pa.table({c: v[bounds[i] : bounds[i + 1]] for c, v in columns.items()}), paths[-1])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(near_dup, "key_ranges", lambda rows: ranges)
        patch.setattr(near_dup, "BLOCK_ROWS", block_rows)
        patch.setattr(tempfile, "tempdir", str(directory))
        with CandidateBlocks(paths, near_dup.shard_row_offsets(paths)) as blocks:
            held = list(blocks)
            assert blocks.count == len(expected)
            assert len(held) == max(1, -(-n // block_rows))
            spill = blocks.directory
        assert not spill.exists()
    assert np.array_equal(np.concatenate([np.zeros(0, dtype=np.int64), *held]), expected.astype(np.int64))
    for block, codes in enumerate(held):  # each block holds the pairs whose low row is in its rows
        assert ((codes // max(n, 1)) // block_rows == block).all()


@given(st.lists(st.one_of(st.integers(0, 5), st.integers(0, 2**64 - 1)), max_size=300))
def test_stable_argsort_is_numpys_stable_argsort(values):
    """The two quicksorts (dense rank, then rank and position) order as numpy's stable sort: equal keys (a band's
    candidates) by position, over the whole uint64 range."""
    array = np.array(values, dtype=np.uint64)
    assert np.array_equal(stable_argsort(array), np.argsort(array, kind="stable"))


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=200), st.lists(st.integers(0, 50), max_size=200))
def test_sorted_distinct_and_merged_codes_are_numpys_unique_and_union(values, more):
    """The clustering's own unique and unions (numpy 2's hash first; the insert of the values not yet there)
    give exactly what np.unique and np.union1d give, for any int64 values, repeated or not, and for any two
    sorted distinct code arrays, either way round, equal or empty."""
    array = np.array(values, dtype=np.int64)
    before = array.copy()
    assert np.array_equal(sorted_distinct(array), np.unique(array)) and np.array_equal(array, before)
    assert np.array_equal(sorted_distinct(array.copy(), in_place=True), np.unique(array))
    assert np.array_equal(sorted_distinct(np.sort(array), runs=True), np.unique(array))
    codes, other = np.unique(array), np.unique(np.array(more, dtype=np.int64))  # a block's runs, one after another
    merged = sorted_distinct(np.concatenate([codes, other, codes]), runs=True)
    assert merged.dtype == np.int64 and np.array_equal(merged, np.union1d(codes, other))


def test_a_pair_hidden_behind_a_dissimilar_first_row_is_found_on_any_layout(tmp_path):
    """A shares only band 0 with B and C; B and C agree on 113 of 128 values (Jaccard estimate 0.88) but share
    no other band. The pair is verified whatever the rows' order (star + chain in rank order)."""
    rng = np.random.default_rng(3)
    b = rng.integers(0, 2**32, nd.NUM_PERM, dtype=np.uint32)
    c = b.copy()
    for band in range(1, nd.LSH_BANDS):  # one differing value in each of bands 1..15: 113 equal values
        c[band * nd.LSH_ROWS] ^= 1
    a = rng.integers(0, 2**32, nd.NUM_PERM, dtype=np.uint32)
    a[: nd.LSH_ROWS] = b[: nd.LSH_ROWS]
    table = signature_table(harmony_frame([{"synth_id": i, "prompt": i} for i in ("a", "b", "c")]))
    signatures = np.stack([a, b, c])
    keys = band_keys(signatures)
    columns = {"signature": pa.FixedSizeListArray.from_arrays(pa.array(signatures.reshape(-1)), nd.NUM_PERM)}
    columns |= {name: keys[:, band] for band, name in enumerate(BAND_COLUMNS)}
    for name, values in columns.items():
        table = table.set_column(
            table.schema.get_field_index(name), name, pa.array(values, table.schema.field(name).type)
        )
    settings = ClusterSettings(heldout_per_exercise=0, format_suite_per_form=0)
    for order in ([0, 1, 2], [1, 0, 2], [2, 1, 0], [0, 2, 1]):
        path = tmp_path / f"{''.join(map(str, order))}.parquet"
        pq.write_table(table.take(order), path)
        clusters = cluster_shards(["s"], [path], settings)
        ids = [table["synth_id"][i].as_py() for i in order]
        cluster = dict(zip(ids, clusters.every_row().cluster_id.tolist()))
        assert cluster["b"] == cluster["c"] != cluster["a"], order


def test_signatures_and_band_keys_do_not_depend_on_batch_or_order():
    prompts = [" ".join(random.Random(i).choices(WORDS, k=40)) for i in range(20)]
    whole = minhash_signatures(prompts)
    parts = np.concatenate([minhash_signatures(prompts[:7]), minhash_signatures(prompts[7:])])
    assert whole.shape == (20, nd.NUM_PERM) and (whole == parts).all()
    assert (band_keys(whole[::-1]) == band_keys(whole)[::-1]).all()
    assert (minhash_signatures(["A  b C d"]) == minhash_signatures(["a b c d"])).all()


@given(st.lists(st.sampled_from(["a", "b", "c", "dd", "é"]), min_size=0, max_size=30))
def test_repeated_word_grams_change_no_signature(words):
    """word_grams keeps repeats (cheaper); the signature is the one of the distinct shingles."""
    normalized = " ".join(words)
    assert sorted(set(word_grams(normalized))) == sorted(shingles(normalized))
    by_set = RMinHash.digest_matrix_from_token_sets([shingles(normalized)], nd.NUM_PERM, nd.MINHASH_SEED)
    assert (minhash_signatures([normalized]) == np.asarray(by_set.to_rows(), dtype=np.uint32)).all()


# --- clusters -----------------------------------------------------------------------------------------------
def test_planted_near_duplicates_are_found_with_recall_and_precision_at_least_095(tmp_path):
    rows, planted = planted_corpus()
    texts = {r["synth_id"]: r["prompt"] for r in rows}
    assert all(oracle_jaccard(texts[a], texts[b]) >= 0.85 for a, b in planted)  # the edits are near copies
    found, _, _ = clusters_by_id(rows, [rows], tmp_path)
    recall = sum(found[a][0] == found[b][0] for a, b in planted) / len(planted)
    predicted = [
        (a, b) for a, b in combinations(texts, 2) if found[a][0] == found[b][0]
    ]  # every pair the clusters join
    precise = sum(oracle_jaccard(texts[a], texts[b]) >= THRESHOLD for a, b in predicted)
    assert recall >= 0.95
    assert predicted and precise / len(predicted) >= 0.95


def test_the_clusters_hold_only_the_rows_of_verified_pairs_and_name_a_shard_changed_since(tmp_path):
    """What the clustering keeps grows with the rows in clusters: every other row's columns come from its shard."""
    rows, planted = planted_corpus(seed=5)
    found, clusters, paths = clusters_by_id(rows, [rows[:120], rows[120:]], tmp_path)
    in_clusters = [i for i, r in enumerate(rows) if found[r["synth_id"]][1] > 1]
    assert len(in_clusters) >= len(planted)  # the planted pairs, at least
    assert clusters.members.tolist() == in_clusters  # no other row is held
    assert len(clusters.member_cluster_id) == len(clusters.member_size) == len(clusters.member_rank) == len(in_clusters)
    every = clusters.every_row()
    second = clusters.shard(1)
    assert second.cluster_id.tolist() == every.cluster_id[120:].tolist()
    assert second.decision.tolist() == every.decision[120:].tolist()
    pq.write_table(pq.read_table(paths[1]).slice(1), paths[1])  # a row fewer than when it was clustered
    with pytest.raises(ValueError, match=str(paths[1])):
        clusters.shard(1)


def test_exact_duplicates_and_empty_prompts_are_clusters(tmp_path):
    rows = [
        {"synth_id": "a", "prompt": "the same prompt here and there"},
        {"synth_id": "b", "prompt": "The   same prompt HERE and there"},
        {"synth_id": "c", "prompt": ""},
        {"synth_id": "d", "prompt": "  "},
        {"synth_id": "e", "prompt": "something else entirely, with other words"},
    ]
    found, _, _ = clusters_by_id(rows, [rows], tmp_path, ClusterSettings(heldout_per_exercise=0))
    assert found["a"][:2] == found["b"][:2] and found["a"][1] == 2
    assert found["c"][:2] == found["d"][:2]
    assert found["e"][1] == 1


def test_cap_keeps_min_size_cap_rows_per_cluster_independent_of_shard_layout(tmp_path):
    rows, _ = planted_corpus(seed=11)
    cap = 2
    settings = ClusterSettings(max_per_cluster=cap, heldout_per_exercise=0, format_suite_per_form=0)
    one, _, _ = clusters_by_id(rows, [rows], tmp_path / "one", settings)
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    three, _, _ = clusters_by_id(
        rows, [shuffled[:100], shuffled[100:101], shuffled[101:]], tmp_path / "three", settings
    )
    assert one == three  # cluster ids, sizes, ranks and decisions: the same on any layout and row order
    by_cluster: dict[int, list] = {}
    for cluster_id, size, rank, decision in one.values():
        by_cluster.setdefault(cluster_id, []).append((size, rank, decision))
    assert any(len(members) > cap for members in by_cluster.values())
    for members in by_cluster.values():
        kept = [m for m in members if m[2] is None]
        assert len(kept) == min(len(members), cap)
        assert sorted(rank for _, rank, _ in members) == list(range(len(members)))
        assert all(decision == drops.DROP_CLUSTER_CAP for _, rank, decision in members if rank >= cap)


def test_off_switch_reports_clusters_and_caps_nothing(tmp_path):
    rows, _ = planted_corpus(seed=5, originals=50, with_copies=20)
    off = ClusterSettings(enabled=False, max_per_cluster=1, heldout_per_exercise=0, format_suite_per_form=0)
    found, _, _ = clusters_by_id(rows, [rows], tmp_path / "off", off)
    on, _, _ = clusters_by_id(rows, [rows], tmp_path / "on", replace(off, enabled=True))
    assert max(size for _, size, _, _ in found.values()) > 1
    assert {i: f[:3] for i, f in found.items()} == {i: f[:3] for i, f in on.items()}  # the same clusters
    assert {decision for *_, decision in found.values()} == {None}
    assert drops.DROP_CLUSTER_CAP in {decision for *_, decision in on.values()}


@pytest.mark.parametrize("threshold", [0.0, 1.5])
def test_a_threshold_outside_0_1_is_refused(threshold):
    with pytest.raises(ValueError, match="threshold"):
        ClusterSettings(threshold=threshold)


# --- held-out clusters -------------------------------------------------------------------------------------
def test_held_out_clusters_are_whole_and_per_exercise(tmp_path):
    rows, _ = planted_corpus(seed=13)
    for i, row in enumerate(rows):
        row["exercise"] = ["mcq", "rag", "math exercise"][i % 3]
        row["constraints"] = "result:B" if row["exercise"] == "mcq" else ("result:12" if i % 3 == 2 else "")
    settings = ClusterSettings(heldout_per_exercise=3, format_suite_per_form=2)
    found, clusters, paths = clusters_by_id(rows, [rows[:200], rows[200:]], tmp_path, settings)
    chosen = clusters.heldout
    kl = [h for h in chosen if h["set"] == "kl"]
    fmt = [h for h in chosen if h["set"] == "format"]
    assert sorted(h["exercise"] for h in kl) == sorted(["mcq", "rag", "math exercise"] * 3)
    assert sorted(h["answer_form"] for h in fmt) == ["mcq_letter", "mcq_letter", "number", "number"]
    held = {h["cluster_id"] for h in chosen}
    assert len(held) == len(chosen)  # a cluster serves one set once
    for cluster_id, _, _, decision in found.values():
        # every member of a held-out cluster leaves training; no other row is held out
        assert (decision == drops.DROP_HELDOUT) == (cluster_id in held)
    summary = cluster_summary(clusters, paths)
    assert summary["dropped"][drops.DROP_HELDOUT] == sum(h["cluster_size"] for h in chosen)


def test_warn_checks_fire_on_a_large_cluster_and_a_cluster_across_the_split(tmp_path):
    valid_id = next(f"v{i}" for i in range(100_000) if is_valid(f"v{i}"))
    prompt = " ".join(random.Random(1).choices(WORDS, k=50))
    rows = [{"synth_id": valid_id, "prompt": prompt}, {"synth_id": "t0", "prompt": prompt + " again"}]
    rows += [{"synth_id": f"r{i}", "prompt": " ".join(random.Random(i + 9).choices(WORDS, k=50))} for i in range(60)]
    settings = ClusterSettings(heldout_per_exercise=0, format_suite_per_form=0)
    _, clusters, paths = clusters_by_id(rows, [rows], tmp_path, settings)
    summary = cluster_summary(clusters, paths)
    assert summary["clusters_crossing_split"] == 1
    assert summary["largest_cluster_share"] == 2 / 62 > nd.LARGE_CLUSTER_SHARE
    result = large_cluster_result(summary, {})
    assert not result.passed and result.severity.value == "WARN" and "2 rows" in result.description


# --- the bundled sample's planted near-duplicates (synth_006) -------------------------------------------------------
@pytest.fixture(scope="module")
def sample_clusters(tmp_path_factory, sample_shards):
    """The sample through harmonize -> 001 filters -> signatures -> clusters, with the default settings."""
    out = tmp_path_factory.mktemp("sample_clusters")
    names, signatures = [], []
    for raw in sample_shards:
        name = raw.stem
        harmony, filtered, sig = (out / f"{stage}_{name}.parquet" for stage in ("h", "f", "s"))
        harmonize_shard(raw, harmony, system_message_dict(), name)
        select_rows_shard(harmony, filtered, name, quality_drop_reasons)
        signatures_shard(filtered, sig, name)
        names.append(name)
        signatures.append(sig)
    clusters = cluster_shards(names, signatures, ClusterSettings())
    ids = pl.concat([pl.read_parquet(p, columns=["synth_id"]) for p in signatures])["synth_id"].to_list()
    return {i: (int(c), int(s), int(k), d) for i, c, s, k, d in zip(ids, *_arrays(clusters))}


def _arrays(clusters):
    rows = clusters.every_row()
    return rows.cluster_id, rows.size, rows.rank, rows.decision_names().to_pylist()


def test_the_samples_planted_near_duplicates_are_found_with_recall_and_precision_at_least_095(sample_clusters):
    planted = planted_near_duplicates()
    truth: dict[str, str] = {}  # row -> its planted group (the source)
    for copy in planted:
        truth[copy.source_id] = truth[copy.copy_id] = copy.source_id
    found = sample_clusters
    recall = sum(found[c.source_id][0] == found[c.copy_id][0] for c in planted) / len(planted)
    by_cluster: dict[int, list[str]] = {}
    for synth_id, (cluster_id, *_) in found.items():
        by_cluster.setdefault(cluster_id, []).append(synth_id)
    predicted = [pair for members in by_cluster.values() for pair in combinations(sorted(members), 2)]
    correct = sum(a in truth and truth.get(a) == truth.get(b) for a, b in predicted)
    assert recall >= 0.95
    assert predicted and correct / len(predicted) >= 0.95
    for negative in planted_negatives():  # same query, another seed text: not a near-duplicate
        assert found[negative.source_id][0] != found[negative.negative_id][0]


def test_the_sample_cap_keeps_exactly_min_size_cap_per_planted_cluster(sample_clusters):
    kept: Counter[int] = Counter()
    sizes: dict[int, int] = {}
    for cluster_id, size, _, decision in sample_clusters.values():
        sizes[cluster_id] = size
        kept[cluster_id] += decision is None
    held = {c for c, _, _, d in sample_clusters.values() if d == drops.DROP_HELDOUT}
    assert max(sizes.values()) > nd.MAX_PER_CLUSTER  # the sample plants clusters over the cap
    for cluster_id, size in sizes.items():
        assert kept[cluster_id] == (0 if cluster_id in held else min(size, nd.MAX_PER_CLUSTER))


def test_bounded_memory_paths_change_nothing(tmp_path):
    """The full corpus's memory bounds (docs: benchmarks/README.md "Near-duplicate control"): verification in
    slices of the signature values, and the held-out sets and summary picked shard by shard, decide exactly
    what one pass over whole signatures in one shard decides."""
    rows, _ = planted_corpus(seed=17)
    for i, row in enumerate(rows):
        row["exercise"] = ["mcq", "rag", "math exercise"][i % 3]
        row["constraints"] = "result:B" if row["exercise"] == "mcq" else ("result:12" if i % 3 == 2 else "")
    settings = ClusterSettings(max_per_cluster=2, heldout_per_exercise=3, format_suite_per_form=2)
    one, whole, paths = clusters_by_id(rows, [rows], tmp_path / "one", settings)
    shuffled = rows[:]
    random.Random(5).shuffle(shuffled)
    five, sharded, five_paths = clusters_by_id(rows, [shuffled[i::5] for i in range(5)], tmp_path / "five", settings)
    assert one == five
    without_shard = lambda held: [{k: v for k, v in h.items() if k != "shard"} for h in held]  # noqa: E731
    assert without_shard(whole.heldout) == without_shard(sharded.heldout)
    a, b = cluster_summary(whole, paths), cluster_summary(sharded, five_paths)
    assert removed_by_clusters(a) == removed_by_clusters(b)
    for key in ("rows", "clusters", "size_histogram", "dropped", "clusters_crossing_split"):
        assert a[key] == b[key]

    rank_key = near_dup.every_shards_column(paths, "rank_key")  # the bands' rows in ranges of keys: the same pairs
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(near_dup, "key_ranges", lambda rows: 1)
        whole_bands = near_dup.distinct_candidate_pairs(paths)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(near_dup, "BAND_RANGE_ROWS", 16)
        patch.setattr(near_dup, "BLOCK_ROWS", 7)
        assert near_dup.key_ranges(len(rank_key)) > 8
        assert np.array_equal(near_dup.distinct_candidate_pairs(paths), whole_bands)

    band = pl.read_parquet(paths[0], columns=["band_00", "rank_key"])
    pairs = candidate_pairs(band["band_00"].to_numpy(), band["rank_key"].to_numpy())
    assert len(pairs) and value_slices(len(np.unique(pairs)), budget=1 << 10) > 1
    sliced = verified_pairs(pairs, paths, whole.offsets, THRESHOLD, budget=1 << 10)
    assert (sliced == verified_pairs(pairs, paths, whole.offsets, THRESHOLD)).all()


def test_verification_reads_the_row_groups_of_its_rows_only_and_decides_as_the_whole_signatures(tmp_path, monkeypatch):
    """Signature files of many row groups, pairs whose rows leave most of them out (and pairs across files):
    each pair is verified on its own rows' values, as counted here over the whole signature arrays."""
    rows, planted = planted_corpus(seed=23)
    index = {row["synth_id"]: i for i, row in enumerate(rows)}
    parts = [rows[:200], rows[200:]]
    paths = []
    for i, part in enumerate(parts):
        whole = tmp_path / f"whole_{i}.parquet"
        write_signatures(part, whole)
        paths.append(tmp_path / f"synth_{i}.parquet")
        pq.write_table(pq.read_table(whole), paths[-1], row_group_size=7)
    assert pq.ParquetFile(paths[0]).metadata.num_row_groups > 20
    offsets = np.array([0, len(parts[0]), len(rows)], dtype=np.int64)
    values = np.array([v for p in paths for v in pq.read_table(p)["signature"].to_pylist()], dtype=np.uint32)
    rng = random.Random(3)
    some = [(index[a], index[b]) for a, b in rng.sample(planted, 12)] + [
        tuple(rng.sample(range(len(rows)), 2)) for _ in range(12)
    ]
    pairs = np.array(some, dtype=np.int64)
    equal = (values[pairs[:, 0]] == values[pairs[:, 1]]).sum(axis=1)
    expected = {tuple(p) for p, e in zip(pairs.tolist(), equal) if e >= min_equal_values(THRESHOLD)}
    assert 0 < len(expected) < len(pairs)
    read: dict[str, set[int]] = {}

    class Recorded(pq.ParquetFile):  # what verification's reader reads
        def __init__(self, source, **kwargs):
            super().__init__(source, **kwargs)
            self.name = Path(source).name

        def iter_batches(self, *args, row_groups=None, **kwargs):
            if row_groups is None:  # the whole file: every row's low bytes, into the temporary file
                whole_reads.append(self.name)
            else:
                read.setdefault(self.name, set()).update(row_groups)
            return super().iter_batches(*args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(near_dup, "streaming_parquet_file", Recorded)
    groups = {p.name: set() for p in paths}  # the row groups (7 rows each) of the pairs' rows
    for row in pairs.ravel().tolist():
        shard = int(row >= offsets[1])
        groups[paths[shard].name].add((row - offsets[shard]) // 7)
    assert len(groups["synth_0.parquet"]) < pq.ParquetFile(paths[0]).metadata.num_row_groups / 2
    whole_reads: list[str] = []
    read.clear()  # within the budget: the pairs' rows only, in the row groups that hold them
    found = verified_pairs(pairs, paths, offsets, THRESHOLD, budget=1 << 30)
    assert {tuple(p) for p in found.tolist()} == expected
    assert read == groups and whole_reads == []
    read.clear()  # past it: every row's low bytes once, then the rows of the pairs left, slice by slice
    found = verified_pairs(pairs, paths, offsets, THRESHOLD, budget=1 << 10)
    assert {tuple(p) for p in found.tolist()} == expected
    assert sorted(whole_reads) == sorted(p.name for p in paths)
    assert all(read[name] <= groups[name] for name in read) and read


def test_a_verification_past_its_budget_reads_the_low_bytes_once_and_drops_pairs_that_can_no_longer_verify(
    tmp_path, monkeypatch
):
    """Planted near-duplicate pairs beside unrelated ones, a budget their whole values exceed: every candidate
    row's low bytes are read from the signature file once into verification's temporary file, and compared from
    there slice by slice; once an unrelated pair has differed in more of them than the threshold allows it is no
    longer compared, and only the pairs left are read on their whole values. The pairs kept are those counted
    here over the whole signature arrays; the temporary directory is gone afterwards, and one left by a process
    that no longer runs is removed."""
    import subprocess
    import tempfile

    rows, planted = planted_corpus(seed=29)
    index = {row["synth_id"]: i for i, row in enumerate(rows)}
    path = tmp_path / "synth_0.parquet"
    write_signatures(rows, path)
    offsets = np.array([0, len(rows)], dtype=np.int64)
    rng = random.Random(4)
    near = [(index[a], index[b]) for a, b in rng.sample(planted, 6)]
    pairs = np.array(near + [tuple(rng.sample(range(len(rows)), 2)) for _ in range(30)], dtype=np.int64)
    values = np.array(pq.read_table(path)["signature"].to_pylist(), dtype=np.uint32)
    whole = pairs[(values[pairs[:, 0]] == values[pairs[:, 1]]).sum(axis=1) >= min_equal_values(THRESHOLD)]
    read: list[tuple[np.ndarray, bool]] = []  # what was read from the signature file, and whether low bytes
    spilled: list[np.ndarray] = []  # the rows of each temporary file of low bytes
    slices: list[slice] = []
    real_read, real_spill, real_values = (
        near_dup._signature_rows,
        near_dup.SignatureSpill,
        near_dup.SignatureSpill.values,
    )

    def recorded_read(paths, offsets, wanted, values=slice(None), low_bytes=False):
        read.append((wanted.copy(), low_bytes))
        return real_read(paths, offsets, wanted, values, low_bytes)

    class RecordedSpill(real_spill):
        def __init__(self, paths, offsets, kept=None, low_bytes=True):
            assert kept is None and low_bytes  # every row's low bytes: the whole values of so few rows fit
            spilled.append(int(offsets[-1]))
            super().__init__(paths, offsets, kept, low_bytes)
            assert self.path.stat().st_size == len(rows) * nd.NUM_PERM  # every row's
            assert self.directory.parent == tmp_path / "temporary"

        def values(self, taken):
            slices.append(taken)
            low = real_values(self, taken)
            assert np.array_equal(low, (values[:, taken].T & 0xFF).astype(np.uint8))  # value by value
            return low

    (tmp_path / "temporary").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporary"))
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now
    killed = tmp_path / "temporary" / f"{near_dup.VERIFY_SPILL_PREFIX}{gone.pid}-x1"
    killed.mkdir()
    monkeypatch.setattr(near_dup, "_signature_rows", recorded_read)
    monkeypatch.setattr(near_dup, "SignatureSpill", RecordedSpill)
    budget = 1 << 13
    candidates = len(np.unique(pairs))
    width = nd.NUM_PERM // value_slices(len(rows), budget, value_bytes=1)  # every row's low bytes, a slice a read
    assert value_slices(candidates, budget) > 1 and width < nd.NUM_PERM // 2  # whole values, and low bytes, sliced
    sliced = verified_pairs(pairs, [path], offsets, THRESHOLD, budget=budget)
    assert sliced.tolist() == whole.tolist() and len(whole)
    assert spilled == [len(rows)]  # the low bytes, read once
    assert [s.start for s in slices] == list(range(0, nd.NUM_PERM, width))
    assert read and not any(low for _, low in read)  # the signature file again for whole values only
    assert len(read[0][0]) < candidates and set(read[0][0].tolist()) >= set(whole.ravel().tolist())
    assert list((tmp_path / "temporary").iterdir()) == []  # its own directory removed, and the dead one


class SameHash(BySynthId):
    """Every id hashes alike: each lookup must fall back to comparing ids."""

    @staticmethod
    def _hashes(ids: pl.Series) -> np.ndarray:
        return np.zeros(len(ids), dtype=np.uint64)


@pytest.mark.parametrize("index", [BySynthId, SameHash])
@given(
    table_ids=st.lists(st.text(min_size=1, max_size=6), unique=True, max_size=30),
    asked=st.lists(st.text(min_size=1, max_size=6), max_size=30),
)
def test_rows_by_synth_id_are_a_dict_lookup(index, table_ids, asked):
    """The rows of the asked ids in their order, nulls for ids the table lacks: what a dict gave."""
    table = pl.DataFrame(
        {"synth_id": table_ids, "value": list(range(len(table_ids)))}, schema={"synth_id": pl.String, "value": pl.Int64}
    )
    asked = asked + table_ids[::2]
    as_dict = dict(zip(table_ids, range(len(table_ids))))
    assert index(table).rows(asked)["value"].to_list() == [as_dict.get(i) for i in asked]


def test_repeated_synth_ids_are_refused():
    with pytest.raises(ValueError, match="repeat"):
        BySynthId(pl.DataFrame({"synth_id": ["a", "b", "a"]}))


# --- real SYNTH: many questions about one article section -------------------------------------------------------
def test_rows_sharing_a_seed_text_but_asking_other_questions_are_not_near_duplicates(tmp_path):
    """SYNTH amplifies each Wikipedia section into hundreds of rows whose seed text (usually ~4x the question)
    is the same: those rows are different examples. Rows of the real-shaped generator that share a seed text and
    ask different questions land in different clusters, while their planted copies (question and answer edited
    slightly) still cluster with them."""
    rows = generate_rows(900, seed=11)
    raw = tmp_path / "synth_001.parquet"
    pq.write_table(rows_to_table(rows), raw)
    harmony, filtered, signatures = (tmp_path / f"{stage}.parquet" for stage in ("h", "f", "s"))
    harmonize_shard(raw, harmony, system_message_dict(), "synth_001")
    select_rows_shard(harmony, filtered, "synth_001", quality_drop_reasons)
    signatures_shard(filtered, signatures, "synth_001")
    clusters = cluster_shards(["synth_001"], [signatures], ClusterSettings())
    ids = pl.read_parquet(signatures, columns=["synth_id"])["synth_id"].to_list()
    cluster_of = dict(zip(ids, list(clusters.every_row().cluster_id), strict=True))
    by_id = {r["synth_id"]: r for r in rows}
    sharing = [
        (a, b)
        for a, b in combinations(ids, 2)
        if by_id[a]["query_seed_text"] == by_id[b]["query_seed_text"] and by_id[a]["query"] != by_id[b]["query"]
    ]
    assert len(sharing) > 500  # the sample's structure: many rows per seed text
    assert [(a, b) for a, b in sharing if cluster_of[a] == cluster_of[b]] == []
    assert drops.DROP_CLUSTER_CAP not in clusters.every_row().decision_names().to_pylist()


@given(
    st.integers(1, 60).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(0, 7) | st.integers(0, 2**64 - 1), min_size=n, max_size=n),
            st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n),
        )
    )
)
def test_member_clusters_are_the_components_of_every_row_ranked_by_key(case):
    """Only the rows of a verified pair enter the graph (`member_clusters`); whatever the pairs and repeated rank
    keys, each member's cluster id, size and rank are the brute force's: components of every row by union-find,
    each ranked by (rank key, row), named by its first row's rank key >> 1. Every other row is, by the brute force
    too, a cluster of its own named by its rank key (what `Clusters.shard` gives it)."""
    keys, pairs = case
    rank_key = np.array(keys, dtype=np.uint64)
    parent = list(range(len(keys)))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a, b in pairs:
        parent[root(a)] = root(b)
    components: dict[int, list[int]] = {}
    for row in range(len(keys)):
        components.setdefault(root(row), []).append(row)
    expected = [None] * len(keys)
    for rows in components.values():
        ranked = sorted(rows, key=lambda row: (keys[row], row))
        for place, row in enumerate(ranked):
            expected[row] = (keys[ranked[0]] >> 1, len(rows), place)
    edges = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    members = sorted_distinct(edges.ravel())
    cluster_id, size, rank = near_dup.member_clusters(rank_key[members], np.searchsorted(members, edges))
    assert (cluster_id.dtype, size.dtype, rank.dtype) == (np.int64, np.int32, np.int32)
    assert list(zip(cluster_id.tolist(), size.tolist(), rank.tolist())) == [expected[m] for m in members.tolist()]
    others = sorted(set(range(len(keys))) - set(members.tolist()))
    assert [expected[row] for row in others] == [(keys[row] >> 1, 1, 0) for row in others]


def test_every_shards_column_reads_each_file_into_its_rows_and_names_a_file_whose_rows_moved(tmp_path, monkeypatch):
    """Each shard's column lands in its own rows of one array, the shards in order (the oracle: the files read one
    by one and joined); a file whose rows are not those its footer gave is named."""
    rows, _ = planted_corpus(seed=31)
    paths = [write_signatures(part, tmp_path / f"synth_{i}.parquet") for i, part in enumerate((rows[:150], rows[150:]))]
    for column in ("rank_key", "band_03"):
        joined = np.concatenate([pq.read_table(path, columns=[column]).column(column).to_numpy() for path in paths])
        read = near_dup.every_shards_column(paths, column)
        assert read.dtype == np.uint64 and np.array_equal(read, joined)
    assert len(near_dup.every_shards_column([], "rank_key")) == 0
    monkeypatch.setattr(near_dup, "shard_row_offsets", lambda paths: np.array([0, 149, len(rows)], dtype=np.int64))
    with pytest.raises(ValueError, match="synth_0.parquet: 150 rows of rank_key"):
        near_dup.every_shards_column(paths, "rank_key")


def test_verified_codes_keep_the_pairs_verified_pairs_keeps(tmp_path, monkeypatch):
    """The clustering verifies its candidates as codes (low * rows + high), in chunks of pairs, from one array or a
    block after another: it keeps the pairs whose whole signatures (counted here) share enough values, within any
    budget, in code order. Past a small budget, every row's low bytes and the whole values of the pairs left are
    each read once into a temporary file, which holds those rows' values."""
    rows, _ = planted_corpus(seed=37)
    path = write_signatures(rows, tmp_path / "synth_0.parquet")
    offsets = near_dup.shard_row_offsets([path])
    candidates = near_dup.distinct_candidate_codes([path])
    pairs = near_dup.distinct_candidate_pairs([path])
    assert np.array_equal(near_dup._code_pairs(candidates, len(rows)), pairs) and len(pairs)
    values = np.array(pq.read_table(path)["signature"].to_pylist(), dtype=np.uint32)
    rng = np.random.default_rng(5)  # and unrelated pairs, which do not verify
    unrelated = np.sort(rng.choice(len(rows), size=(40, 2), replace=True), axis=1)
    unrelated = unrelated[unrelated[:, 0] < unrelated[:, 1]]
    codes = np.union1d(candidates, sorted_distinct(unrelated[:, 0] * len(rows) + unrelated[:, 1]))
    pairs = near_dup._code_pairs(codes, len(rows))
    expected = pairs[(values[pairs[:, 0]] == values[pairs[:, 1]]).sum(axis=1) >= min_equal_values(THRESHOLD)]
    blocks = np.array_split(codes, [5, 6, 40])  # as `CandidateBlocks` gives them: some short, one empty
    spilled: list[tuple[bool, bool]] = []  # (every row, low bytes) of each temporary file

    class CheckedSpill(near_dup.SignatureSpill):
        def __init__(self, paths, offsets, kept=None, low_bytes=True):
            super().__init__(paths, offsets, kept, low_bytes)
            spilled.append((kept is None, low_bytes))
            held = values if kept is None else values[kept]
            assert np.array_equal(self.values(slice(None)), (held & 0xFF if low_bytes else held).T)

    monkeypatch.setattr(near_dup, "SignatureSpill", CheckedSpill)
    for budget, chunk, as_given in itertools.product(
        (near_dup.SIGNATURE_BUDGET, 1 << 11), (1 << 23, 7), (codes, blocks)
    ):
        kept = near_dup.verified_codes(as_given, len(rows), [path], offsets, THRESHOLD, budget=budget, chunk=chunk)
        assert 0 < len(kept) < len(codes)
        assert np.array_equal(near_dup._code_pairs(kept, len(rows)), expected)
        assert np.array_equal(verified_pairs(pairs, [path], offsets, THRESHOLD, budget=budget), expected)
    assert set(spilled) == {(True, True), (False, False)}  # only past the small budget: both kinds


def test_candidate_blocks_that_fail_while_written_are_removed_and_a_dead_processs_are_too(tmp_path, monkeypatch):
    """A full disk while the candidate pairs are written raises, naming the temporary file, and so does a signature
    file that changed since its rows were counted, naming it; neither leaves a directory. A directory left by a
    process that no longer runs is removed by the next clustering."""
    import errno
    import os
    import subprocess

    rows, _ = planted_corpus(seed=43)
    path = write_signatures(rows, tmp_path / "synth_0.parquet")
    (tmp_path / "temporary").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporary"))
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now
    (tmp_path / "temporary" / f"{near_dup.PAIRS_SPILL_PREFIX}{gone.pid}-x1").mkdir()
    with CandidateBlocks([path], near_dup.shard_row_offsets([path])) as blocks:
        assert list((tmp_path / "temporary").iterdir()) == [blocks.directory]  # the dead one gone
        assert blocks.count == len(near_dup.distinct_candidate_codes([path]))
    assert list((tmp_path / "temporary").iterdir()) == []
    with pytest.raises(ValueError, match=f"{path}: {len(rows)} rows, not the rows its footer gave"):
        CandidateBlocks([path], np.array([0, len(rows) + 1]))  # the file changed since its footer was read
    assert list((tmp_path / "temporary").iterdir()) == []
    real_open = open
    written: list[str] = []

    def full_disk(file, mode="r", *args, **kwargs):
        if "a" in mode and written:  # the first append goes through, the next finds the disk full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(near_dup, "open", full_disk, raising=False)
    with pytest.raises(OSError, match=r"the clustering's temporary file .*synthkd-pairs-.*: No space left on device"):
        CandidateBlocks([path], near_dup.shard_row_offsets([path]))
    assert written and list((tmp_path / "temporary").iterdir()) == []


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 20), max_size=300),
    st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 20), max_size=20),
    st.integers(1, 50),
)
def test_in_sorted_is_numpys_isin(values, wanted, chunk):
    """The held-out clusters' members are found by a binary search a chunk at a time: np.isin's answer, for any
    int64 values, repeated or not, any wanted values (none too) and any chunk."""
    array, looked_for = np.array(values, dtype=np.int64), np.unique(np.array(wanted, dtype=np.int64))
    assert np.array_equal(near_dup.in_sorted(array, looked_for, chunk), np.isin(array, looked_for))


def test_a_low_bytes_file_that_fails_while_written_is_removed(tmp_path, monkeypatch):
    """A read that fails while verification writes its temporary file (a signature file gone bad), or a full
    disk, raises, naming the file, and leaves no directory behind."""
    import errno
    import os
    import tempfile

    real_blocks = near_dup._each_signature_block

    rows, _ = planted_corpus(seed=41)
    path = write_signatures(rows, tmp_path / "synth_0.parquet")
    (tmp_path / "temporary").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporary"))

    def failing(paths, offsets, rows, values, take):
        take(0, np.zeros((2, nd.NUM_PERM), dtype=np.uint32))
        raise OSError(f"{paths[0]}: unreadable")

    monkeypatch.setattr(near_dup, "_each_signature_block", failing)
    with pytest.raises(OSError, match="unreadable"):
        near_dup.SignatureSpill([path], near_dup.shard_row_offsets([path]))
    assert list((tmp_path / "temporary").iterdir()) == []

    def full_disk(descriptor, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(near_dup, "_each_signature_block", real_blocks)
    monkeypatch.setattr(near_dup.os, "pwrite", full_disk)
    with pytest.raises(OSError, match=r"the clustering's temporary file .*low_bytes: No space left on device"):
        near_dup.SignatureSpill([path], near_dup.shard_row_offsets([path]))
    assert list((tmp_path / "temporary").iterdir()) == []


KEPT_FROM_LARGE_FRAMES = """
import sys
import polars as pl
from synthkd_assets.core.near_dup import owned

def resident_mib():
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS")) / 1024

keep = owned if sys.argv[1] == "owned" else (lambda frame: frame)
before, kept = resident_mib(), []
for copy in range(12):  # 12 frames of ~24 MiB of long strings, three rows kept of each
    ids = pl.Series("synth_id", [f"memorization_{copy}_{row:08d}_" + "x" * 64 for row in range(300_000)])
    kept.append(keep(pl.DataFrame([ids])[[0, 7, 299_999]]))
    del ids
assert [frame["synth_id"][1] for frame in kept] == [f"memorization_{c}_00000007_" + "x" * 64 for c in range(12)]
print(resident_mib() - before)
"""


def test_a_few_rows_owned_hold_none_of_their_sources_strings():
    """The held-out sets and the summary keep a few rows of every shard's ids: kept as polars' views, each would
    hold its whole shard's strings (1.2 GiB at 40M rows); `owned` copies only the rows kept. Each way in a process
    of its own, so that neither reuses what the other freed."""
    import subprocess
    import sys

    def growth(mode: str) -> float:
        run = subprocess.run([sys.executable, "-c", KEPT_FROM_LARGE_FRAMES, mode], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return float(run.stdout)

    as_views = growth("views")
    assert as_views > 150  # the views hold every frame's strings: what `owned` is for
    assert growth("owned") < as_views / 3
