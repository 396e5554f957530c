"""Held out means held out (docs/near-dup.md "Normalization", "Validation sets", "Rebuilds"): copies of a held-out
prompt that differ only by format characters or lookalike letters are the same prompt; a dominant cluster is
never held out whole; a held-out prompt renamed in place (same content, new synth_ids) and rebuilt is not trained
on, and the blocking check finds such a row by its content."""

from __future__ import annotations

import json
import random
import shutil
import unicodedata

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from synthkd_assets.core import manifest as mf
from synthkd_assets.core import near_dup
from synthkd_assets.core.near_dup import (
    ClusterSettings,
    cluster_summary,
    heldout_matches,
    heldout_prompts_trained,
    normalize_prompt,
)
from synthkd_assets.core.validation_sets import row_groups_holding
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_assets.defs.upstream import shard_names
from synthkd_contract import drops
from synthkd_contract import near_dup as nd
from synthkd_contract.manifest_seal import sha256_file
from tests.helpers import SAMPLE_RAW_DIR, check_evaluations, run
from tests.test_bad_input import step_failures
from tests.test_near_dup import WORDS, clusters_by_id, write_signatures

ZWSP, SOFT_HYPHEN, ZWJ, WORD_JOINER, BOM = "\u200b", "\u00ad", "\u200d", "\u2060", "\ufeff"
# the test's own oracle of lookalikes (the Cyrillic and Greek letters drawn like Latin ones), not the library's table
LOOKALIKES = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "p": "\u0440", "c": "\u0441", "x": "\u0445"}
LOOKALIKES |= {"y": "\u0443", "i": "\u0456", "s": "\u0455", "j": "\u0458", "h": "\u04bb", "v": "\u03bd"}


def zero_width(text: str) -> str:
    """A zero-width space after every second character of every word."""
    return " ".join("".join(c + (ZWSP if i % 2 else "") for i, c in enumerate(w)) for w in text.split(" "))


def soft_hyphens(text: str) -> str:
    """A soft hyphen in the middle of every word of 4+ letters."""
    return " ".join(w[: len(w) // 2] + SOFT_HYPHEN + w[len(w) // 2 :] if len(w) > 3 else w for w in text.split(" "))


def cyrillic(text: str) -> str:
    """Every letter that has a Cyrillic or Greek lookalike replaced by it."""
    return "".join(LOOKALIKES.get(c, c) for c in text)


# --- normalization ----------------------------------------------------------------------------------------------
@given(st.text(max_size=300))
def test_normalization_is_idempotent_and_leaves_no_format_character(text):
    once = normalize_prompt(text)
    assert normalize_prompt(once) == once
    assert not [c for c in once if unicodedata.category(c) == "Cf"]


@given(st.text(max_size=200), st.lists(st.tuples(st.integers(0, 200), st.sampled_from([ZWSP, SOFT_HYPHEN, ZWJ]))))
def test_format_characters_anywhere_change_nothing(text, inserts):
    marked = text
    for position, char in sorted(inserts, reverse=True):
        marked = marked[:position] + char + marked[position:]
    assert normalize_prompt(marked) == normalize_prompt(text)


@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ.,", max_size=200))
def test_lookalike_letters_fold_to_the_latin_ones(text):
    assert normalize_prompt(cyrillic(text)) == normalize_prompt(text)


def test_the_lookalike_table_is_the_unicode_confusables_and_ascii_text_is_only_casefolded():
    assert normalize_prompt("\u0422\u041d\u0415 \u0421\u0410\u0422") == "the cat"  # Cyrillic capitals
    assert normalize_prompt("\u0397\u0395\u03a1\u039f") == "hepo"  # Greek capitals
    assert normalize_prompt("P\u0430r\u0456s" + WORD_JOINER + BOM) == "paris"
    assert normalize_prompt("  Ｈｅｌｌｏ\tWORLD\n\n again ") == "hello world again"
    assert normalize_prompt("Straße, tête, ñandú") == "strasse, tête, ñandú"  # accents are not lookalikes
    ascii_text = "I1l|O0 rn m -- 'quoted' \"text\""
    assert normalize_prompt(ascii_text) == " ".join(ascii_text.casefold().split())


# --- 3b: copies differing only by format characters or lookalikes are one cluster, held out together ------------------
def test_zero_width_soft_hyphen_and_cyrillic_copies_are_one_cluster_and_held_out_together(tmp_path):
    rng = random.Random(3)
    prompt = " ".join(rng.choices(WORDS, k=80))
    rows = [{"synth_id": "orig", "prompt": prompt, "exercise": "rag"}]
    rows += [
        {"synth_id": name, "prompt": edit(prompt), "exercise": "rag"}
        for name, edit in [("zwsp", zero_width), ("shy", soft_hyphens), ("cyr", cyrillic)]
    ]
    rows.append({"synth_id": "all", "prompt": cyrillic(soft_hyphens(zero_width(prompt))), "exercise": "rag"})
    settings = ClusterSettings(heldout_per_exercise=1, format_suite_per_form=0)
    found, clusters, paths = clusters_by_id(rows, [rows], tmp_path, settings)
    assert len({cluster for cluster, *_ in found.values()}) == 1
    assert {decision for *_, decision in found.values()} == {drops.DROP_HELDOUT}
    # a rebuilt shard matching the held-out prompts (`heldout_matches`) finds every variant under any synth_id
    held = [entry for entry in cluster_summary(clusters, paths)["heldout_prompts"] if entry["synth_id"] == "orig"]
    renamed = [{**row, "synth_id": f"{row['synth_id']}-renamed"} for row in rows]
    renamed.append({"synth_id": "other", "prompt": " ".join(rng.choices(WORDS, k=80))})
    shard = write_signatures(renamed, tmp_path / "rebuilt.parquet")
    assert heldout_matches(shard, held, nd.JACCARD_THRESHOLD) == {r["synth_id"] for r in renamed[:-1]}


# --- 3c: a dominant cluster is never held out --------------------------------------------------------------------
def test_a_dominant_cluster_is_never_held_out_and_is_counted(tmp_path):
    rng = random.Random(5)
    dominant = " ".join(rng.choices(WORDS, k=60))
    rows = [{"synth_id": f"d{i:03d}", "prompt": dominant, "exercise": "cooking"} for i in range(400)]
    small = [" ".join(rng.choices(WORDS, k=60)) for _ in range(3)]
    rows += [{"synth_id": f"s{k}-{i}", "prompt": p, "exercise": "cooking"} for k, p in enumerate(small) for i in (0, 1)]
    settings = ClusterSettings(heldout_per_exercise=4, format_suite_per_form=0)
    found, clusters, paths = clusters_by_id(rows, [rows[:250], rows[250:]], tmp_path, settings)
    summary = cluster_summary(clusters, paths)
    dominant_decisions = [found[f"d{i:03d}"][3] for i in range(400)]
    assert dominant_decisions.count(None) == nd.MAX_PER_CLUSTER  # trained on, capped like any cluster
    assert dominant_decisions.count(drops.DROP_CLUSTER_CAP) == 400 - nd.MAX_PER_CLUSTER
    assert sorted(h["cluster_size"] for h in clusters.heldout) == [2, 2, 2]  # the small clusters instead
    assert all(h["cluster_size"] <= settings.heldout_cluster_limit for h in clusters.heldout)
    assert summary["dropped"][drops.DROP_HELDOUT] == 6
    assert summary["heldout_over_limit"] == {"clusters": 1, "rows": 400}
    assert settings.to_dict()["heldout_cluster_limit"] == nd.HELDOUT_CLUSTER_LIMIT  # hashed with the settings
    assert len(summary["heldout_prompts"]) == 6


@pytest.mark.parametrize("limit", [0, -1])
def test_a_held_out_cluster_limit_below_one_is_refused(limit):
    with pytest.raises(ValueError, match="heldout_cluster_limit"):
        ClusterSettings(heldout_cluster_limit=limit)


# --- 3a: held-out rows renamed in place and rebuilt are not trained on ----------------------------------------------
@pytest.fixture
def copy_of_build(built_sample, own_instance, tmp_path):
    _, _, data_dir = built_sample
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    raw = tmp_path / "raw"
    shutil.copytree(SAMPLE_RAW_DIR, raw)
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(copy))
    return own_instance, layout, layout.data_layout(), raw


def trained_ids(paths) -> set[str]:
    ids: set[str] = set()
    for table in (paths.megatron_root() / "shards").glob("*_documents.parquet"):
        ids |= set(pq.read_table(table, columns=["synth_id"]).column("synth_id").to_pylist())
    return ids


@given(st.integers(1, 40), st.integers(1, 9), st.sets(st.integers(0, 45), max_size=8))
def test_the_validation_sets_read_only_the_row_groups_holding_their_rows(tmp_path_factory, rows, group_rows, wanted):
    """`row_groups_holding` (the validation sets read the messages of those row groups only) names exactly the
    row groups that hold a wanted synth_id, by brute force over the file's row groups; ids not in the file name
    none."""
    path = tmp_path_factory.mktemp("groups") / "filtered.parquet"
    pq.write_table(pa.table({"synth_id": [f"id-{i}" for i in range(rows)]}), path, row_group_size=group_rows)
    file = pq.ParquetFile(path)
    expected = [
        group
        for group in range(file.metadata.num_row_groups)
        if {f"id-{i}" for i in wanted} & set(file.read_row_group(group, columns=["synth_id"])["synth_id"].to_pylist())
    ]
    assert row_groups_holding(path, {f"id-{i}" for i in wanted}) == expected


def test_held_out_rows_renamed_in_place_and_rebuilt_are_never_trained_on(copy_of_build, monkeypatch):
    instance, layout, paths, raw = copy_of_build
    summary = mf.read_json(paths.clusters_summary())
    shard = summary["heldout_prompts"][0]["shard"]
    held = {e["synth_id"] for e in summary["heldout_prompts"] if e["shard"] == shard}
    table = pl.read_parquet(raw / f"{shard}.parquet")
    renamed = pl.when(pl.col("synth_id").is_in(sorted(held))).then(pl.col("synth_id") + "_renamed")
    table.with_columns(synth_id=renamed.otherwise(pl.col("synth_id"))).write_parquet(raw / f"{shard}.parquet")
    run(instance, layout, ["synth_raw_inventory"])
    steps = ["synth_harmony", "synth_filtered", "synth_signatures", "synth_sampled", "synth_tokenized", "synth_kd_v1"]
    result = run(instance, layout, steps, shard)
    new_ids = {f"{i}_renamed" for i in held}
    assert held and not new_ids & trained_ids(paths)
    errors = [json.loads(line) for line in paths.error_log("synth_sampled", shard).read_text().splitlines()]
    assert {e["synth_id"] for e in errors if e["reason"] == drops.DROP_HELDOUT} == new_ids
    [warning] = [e for e in result.get_asset_check_evaluations() if e.check_name == "near_dup_controlled"]
    assert not warning.passed and warning.metadata["heldout_copies"].value == len(held)
    assert f"{len(held)} rows outside the held-out clusters have a held-out prompt" in warning.description

    # the blocking check finds a trained copy by its content, whatever its synth_id: one renamed row put back
    run(instance, layout, ["synth_kd_v1_manifest"])
    assert check_evaluations(instance, layout, "synth_kd_v1_manifest")["validation_sets_not_trained"].passed
    documents = sorted((paths.megatron_root() / "shards").glob("*_documents.parquet"))
    leaked = sorted(new_ids)[0]

    # the rebuilt shard's synth_sampled recorded its matches under these clusters and signatures: the check takes
    # them from there (and matches only the shards this instance never sampled), and still finds the copy
    matched_now: list[str] = []

    def counted(signatures_path, *args):
        matched_now.append(signatures_path.stem)
        return heldout_matches(signatures_path, *args)

    table, kept = documents[0], documents[0].read_bytes()
    rows = pl.read_parquet(table)
    pl.concat([rows, rows.head(1).with_columns(synth_id=pl.lit(leaked))]).write_parquet(table)
    with monkeypatch.context() as patched:
        patched.setattr(near_dup, "heldout_matches", counted)
        check = check_evaluations(instance, layout, "synth_kd_v1_manifest")["validation_sets_not_trained"]
    assert not check.passed and f"synth_id {leaked!r} in {table.name}" in check.description
    assert shard not in matched_now and sorted(matched_now) == sorted(set(shard_names(paths)) - {shard})
    table.write_bytes(kept)
    signatures = [paths.stage_output("synth_signatures", name) for name in shard_names(paths)]
    forged = paths.data_root / "forged_documents.parquet"
    pl.DataFrame({"synth_id": [leaked]}).write_parquet(forged)
    problems = heldout_prompts_trained([*documents, forged], signatures, summary, paths.clusters_summary())
    assert problems.total == 1 and f"synth_id {leaked!r} in forged_documents.parquet" in problems[0]
    assert heldout_prompts_trained(documents, signatures, summary, paths.clusters_summary()).total == 0

    # clusters written by an earlier version keep no held-out prompts: the check fails, and a shard's sampling
    # stops, each naming the file and the pass that rewrites it (never a KeyError, never a silent pass)
    older = {key: value for key, value in summary.items() if key != "heldout_prompts"}
    [problem] = heldout_prompts_trained(documents, signatures, older, paths.clusters_summary())
    assert f"{paths.clusters_summary()} keeps no held-out prompts" in problem and "synth_plan_job" in problem
    paths.clusters_summary().write_text(json.dumps(older))
    plan = json.loads(paths.sampling_plan().read_text())  # as that version's plan, made after those clusters
    plan["near_dup"]["clusters_sha256"] = sha256_file(paths.clusters_summary())
    paths.sampling_plan().write_text(json.dumps(plan))
    failed = run(instance, layout, ["synth_sampled"], shard, raise_on_error=False)
    assert any("keeps no held-out prompts" in failure for failure in step_failures(failed)), step_failures(failed)
