"""The DistillKit/TRL dataset (001's schema) on the bundled sample: a row by hand, invariants on every row,
`datasets.load_dataset`, the manifest, length drops, render-failure log and the blocking checks."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil

import dagster as dg
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from openai_harmony import Conversation, Message, RenderConversationConfig, Role, SystemContent

from synthkd_assets.core import distill_io
from synthkd_assets.core.distill_io import (
    distill_part_problems,
    distill_split,
    parts_checked_when_written,
    rows_valid_for,
    split_leakage,
)
from synthkd_assets.core.parquet_io import list_column_rows
from synthkd_assets.core.tokenizer import load_harmony_encoding
from synthkd_assets.defs import checks
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout, synthkd_resources
from synthkd_contract import constants
from synthkd_contract.manifest_seal import sha256_file
from synthkd_contract.schemas import DISTILL_SCHEMA
from tests.helpers import ALL_ASSETS, SAMPLE_RAW_DIR, check_outcomes, rows_after_clusters, run, stage_shard_files

DISTILL_CHECKS = {
    "distill_labels_match_input_ids",
    "distill_spans_consistent",
    "distill_max_length_respected",
    "distill_no_split_leakage",
    "distill_manifest_provenance",
    "distill_dataset_rows_accounted",
}


@pytest.fixture(scope="module")
def distill(built_sample):
    _, layout, _ = built_sample
    paths = layout.data_layout()
    root = paths.distill_root()
    rows = pl.concat(
        [
            pl.read_parquet(path).with_columns(split=pl.lit(split))
            for split in constants.DISTILL_SPLITS
            for path in sorted((root / split).glob("*.parquet"))
        ]
    )
    return root, rows, json.loads(paths.distill_manifest().read_text())


def by_hand(raw: dict, encoding) -> dict:
    """001's recipe written out with openai-harmony objects, independent of the pipeline."""
    system = Message.from_role_and_content(Role.SYSTEM, SystemContent.new())
    user = Message.from_role_and_content(Role.USER, f"{raw['query']}\n\nReference:\n{raw['query_seed_text']}")
    assistant = []
    if raw["synthetic_reasoning"].strip():
        assistant.append(
            Message.from_role_and_content(Role.ASSISTANT, raw["synthetic_reasoning"]).with_channel("analysis")
        )
    assistant.append(Message.from_role_and_content(Role.ASSISTANT, raw["synthetic_answer"]).with_channel("final"))
    full = encoding.render_conversation_for_training(
        Conversation.from_messages([system, user, *assistant]), RenderConversationConfig(auto_drop_analysis=False)
    )
    prefix = encoding.render_conversation_for_completion(Conversation.from_messages([system, user]), Role.ASSISTANT)
    header = len(prefix) - len(encoding.render(system)) - len(encoding.render(user))  # <|start|>assistant
    lengths = [len(encoding.render(m)) for m in assistant]
    lengths[0] -= header
    return {
        "id": f"pleias_synth:{raw['synth_id']}",
        "source": {
            "dataset": "PleIAs/SYNTH",
            "synth_id": raw["synth_id"],
            "exercise": raw["exercise"],
            "language": raw["language"],
        },
        "input_ids": full,
        "labels": [-100] * len(prefix) + full[len(prefix) :],
        "attention_mask": [1] * len(full),
        "spans": {
            "assistant_token_start": len(prefix),
            "analysis_token_count": lengths[0] if len(assistant) == 2 else 0,
            "final_token_count": lengths[-1],
        },
    }


@pytest.mark.parametrize(
    ("synth_id", "with_reasoning"),
    [("memorization_76_3", True), ("synth_dataset_writing_16_73", False)],  # SYNTH leaves constrained writing's empty
)
def test_one_row_by_hand(distill, encoding, synth_id, with_reasoning):
    _, rows, _ = distill
    raw = (
        pl.read_parquet(SAMPLE_RAW_DIR / "synth_001.parquet").filter(pl.col("synth_id") == synth_id).row(0, named=True)
    )
    assert bool(raw["synthetic_reasoning"].strip()) == with_reasoning
    row = rows.filter(pl.col("id") == f"pleias_synth:{synth_id}").drop("split").row(0, named=True)
    assert row == by_hand(raw, encoding)
    assert header_tokens(encoding) == ["<|start|>", "assistant"]


def unit_interval(salt: str, key: str) -> float:
    """001's salted hash: the first 8 bytes of sha256(f"{salt}:{key}") as a big-endian fraction of 2**64."""
    return int.from_bytes(hashlib.sha256(f"{salt}:{key}".encode()).digest()[:8], "big") / 2**64


def rows_the_plan_sees(paths) -> pl.DataFrame:
    """synth_id, exercise and language of the synth_filtered rows the near-duplicate clusters keep."""
    frames = []
    for filtered in sorted(paths.stage_dir("synth_filtered").glob("*.parquet")):
        decisions = pl.read_parquet(
            paths.stage_output("synth_clusters", filtered.stem), columns=["synth_id", "decision"]
        )
        rows = pl.read_parquet(filtered, columns=["synth_id", "exercise", "language"])
        frames.append(rows.join(decisions, on="synth_id", how="left").filter(pl.col("decision").is_null()))
    return pl.concat(frames).drop("decision")


def header_tokens(encoding) -> list[str]:
    prefix = encoding.render_conversation_for_completion(Conversation.from_messages([]), Role.ASSISTANT)
    return [encoding.decode([t]) for t in prefix]


def test_every_row_keeps_the_contract(distill, built_sample):
    root, rows, manifest = distill
    paths = built_sample[1].data_layout()
    assert pq.read_schema(root / "train" / "part-00001.parquet").equals(DISTILL_SCHEMA)
    assert rows["id"].n_unique() == rows.height == manifest["totals"]["rows_out"]
    tokenized = pl.concat([pl.read_parquet(p) for p in stage_shard_files(paths, "synth_tokenized")])
    tokens = dict(zip(tokenized["synth_id"].to_list(), list_column_rows(tokenized.to_arrow().column("tokens"))))
    spans_of = dict(zip(tokenized["synth_id"].to_list(), list_column_rows(tokenized.to_arrow().column("span_id"))))
    for row in rows.iter_rows(named=True):
        synth_id = row["source"]["synth_id"]
        ids, labels, spans = np.array(row["input_ids"]), np.array(row["labels"]), row["spans"]
        start = spans["assistant_token_start"]
        assert row["id"] == "pleias_synth:" + synth_id and row["split"] == distill_split(synth_id)
        np.testing.assert_array_equal(ids, tokens[synth_id][:-1])  # synth_kd_v1's tokens without the EOD
        assert (labels[:start] == -100).all() and (labels[start:] == ids[start:]).all()
        assert row["attention_mask"] == [1] * len(ids) and len(ids) <= constants.MAX_SEQ_LEN
        assert spans["analysis_token_count"] + spans["final_token_count"] == len(ids) - start
        # the one difference to synth_kd_v1: its spans already supervise the first assistant <|start|>assistant
        token_span = np.concatenate([[0], spans_of[synth_id][:-1]])[: len(ids)]
        assert (token_span[start - 2 : start] != 0).all() and (token_span[: start - 2] == 0).all()
        assert np.count_nonzero(token_span[start:] == 1) == spans["analysis_token_count"]
    # one code path: exactly the conversations of synth_kd_v1 (no sample row is over 8192 tokens)
    documents = pl.concat([pl.read_parquet(paths.documents_table(s["shard_index"])) for s in manifest["shards"]])
    assert set(documents["synth_id"].to_list()) == set(rows["source"].struct.field("synth_id").to_list())
    counts = rows.group_by("split").len()
    assert dict(counts.iter_rows()) == manifest["totals"]["rows_per_split"]
    assert 0 < manifest["totals"]["rows_per_split"]["validation"] < 0.03 * rows.height


def test_datasets_load_dataset_reads_it(distill, tmp_path):
    import datasets

    root, rows, manifest = distill
    loaded = datasets.load_dataset("parquet", data_dir=str(root), cache_dir=str(tmp_path / "hf"))
    assert set(loaded) == {"train", "validation"}
    assert {split: loaded[split].num_rows for split in loaded} == manifest["totals"]["rows_per_split"]
    features = loaded["train"].features
    assert features["input_ids"].feature.dtype == "int32" and features["labels"].feature.dtype == "int32"
    first = loaded["train"][0]
    start = first["spans"]["assistant_token_start"]
    assert first["labels"][:start] == [-100] * start and first["labels"][start:] == first["input_ids"][start:]
    assert first == rows.filter(pl.col("id") == first["id"]).drop("split").row(0, named=True)


def nearest_rank(lengths: list[int], p: int) -> int:
    ordered = sorted(lengths)
    return ordered[max(0, -(-p * len(ordered) // 100) - 1)]


def test_manifest_records_config_plan_mix_lengths_and_drops(distill, built_sample):
    root, rows, manifest = distill
    paths = built_sample[1].data_layout()
    for key in (
        "git_sha",
        "config",
        "config_hash",
        "tokenizer",
        "input_manifest",
        "split",
        "sampling",
        "token_lengths",
        "totals",
    ):
        assert key in manifest
    assert manifest["config"]["max_seq_len"] == 8192 and manifest["config"]["split"]["valid_fraction"] == 0.01
    for split in constants.DISTILL_SPLITS:
        lengths = [len(ids) for ids in rows.filter(pl.col("split") == split)["input_ids"].to_list()]
        stats = manifest["token_lengths"][split]
        assert stats["min"] == min(lengths) and stats["max"] == max(lengths) and stats["tokens"] == sum(lengths)
        assert [stats[f"p{p}"] for p in (50, 90, 99)] == [nearest_rank(lengths, p) for p in (50, 90, 99)]
    sampling = manifest["sampling"]
    assert sampling["plan_sha256"] == sha256_file(paths.sampling_plan())
    assert sampling["feasible"] and sampling["plan_counts_current"]  # achieved_meets_targets: below
    # the rows the plan sees (the synth_filtered rows the clusters keep, counted here): memorization is over the 70%
    # cap and non-English under 30%, so memorization alone is sampled, to the cap in expectation, and English is
    # not sampled out (the non-English lower bound is opt-in)
    filtered = rows_the_plan_sees(paths)
    memorization = filtered.filter(pl.col("exercise") == "memorization")
    other = filtered.height - memorization.height
    non_english = filtered.filter(pl.col("language") != "en")
    assert memorization.height / filtered.height > 0.70 and non_english.height / filtered.height < 0.30
    rate = 0.70 / 0.30 * other / memorization.height  # rate * memorization / (rate * memorization + other) = 0.70
    assert sampling["rates"] == {"memorization": pytest.approx(rate), "non_english": 1.0, "english": 1.0, "global": 1.0}
    expected = sampling["expected_after"]
    assert expected["rows"] == pytest.approx(rate * memorization.height + other)
    assert expected["memorization_share"] == pytest.approx(0.70)
    non_english_memorization = non_english.filter(pl.col("exercise") == "memorization").height
    assert expected["non_english_share"] == pytest.approx(
        (rate * non_english_memorization + non_english.height - non_english_memorization) / expected["rows"]
    )
    # achieved: the rows the salted hash keeps (001's rule, computed here from the synth_ids) are the dataset's rows
    salt = constants.SAMPLING_SALTS["memorization"]
    kept_memorization = {s for s in memorization["synth_id"].to_list() if unit_interval(salt, s) < rate}
    kept = filtered.filter((pl.col("exercise") != "memorization") | pl.col("synth_id").is_in(list(kept_memorization)))
    assert set(kept["synth_id"].to_list()) == set(rows["source"].struct.field("synth_id").to_list())
    achieved = sampling["achieved_after"]
    assert achieved["rows"] == kept.height == rows.height
    assert achieved["memorization_share"] == pytest.approx(len(kept_memorization) / kept.height)
    assert achieved["non_english_share"] == pytest.approx(kept.filter(pl.col("language") != "en").height / kept.height)
    # hash decisions, not draws: achieved is expected up to binomial noise, and the flag says whether it is in bounds
    noise = (memorization.height * rate * (1 - rate)) ** 0.5
    assert abs(len(kept_memorization) - rate * memorization.height) < 4 * noise
    in_bounds = achieved["memorization_share"] <= 0.70 and achieved["non_english_share"] <= 0.30
    assert sampling["achieved_meets_targets"] is in_bounds
    dropped = manifest["totals"]["dropped"]
    for reason in ("empty_synthetic_answer", "result_failed_after_max_attempts", "result_inconsistent_with_answer"):
        assert dropped[reason] > 0
    assert dropped["sampled_out_memorization"] == memorization.height - len(kept_memorization)
    assert [reason for reason in dropped if reason.startswith("sampled_out_")] == ["sampled_out_memorization"]
    assert manifest["totals"]["rows_in"] == 3149 == manifest["totals"]["rows_out"] + sum(dropped.values())
    kd = json.loads(paths.megatron_manifest().read_text())
    assert kd["sampling"] == sampling and kd["config"]["selection"] == manifest["config"]["selection"]


def test_a_non_english_minimum_is_opt_in(built_sample, own_instance, tmp_path):
    """non_english_min > 0 samples English down to reach it. On the sample memorization is capped too: with rates
    m (memorization), e (English) and 1 (non-English), m(e em + nm) / (e eo + no) = 0.7 / 0.3 and
    (m nm + no) / (e (m em + eo)) = 0.25 / 0.75, solved here by bisection on e."""
    instance, (_, built, _) = own_instance, built_sample
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path / "data"))
    paths = layout.data_layout()
    for stage in ("synth_filtered", "synth_clusters"):
        shutil.copytree(built.data_layout().stage_dir(stage), paths.stage_dir(stage))
    filtered = rows_after_clusters(paths, ["language", "exercise"])

    def count(memorization: bool, english: bool) -> int:
        return filtered.filter(
            ((pl.col("exercise") == "memorization") == memorization) & ((pl.col("language") == "en") == english)
        ).height

    em, nm, eo, no = count(True, True), count(True, False), count(False, True), count(False, False)

    def memorization_rate(e: float) -> float:
        return 0.7 / 0.3 * (e * eo + no) / (e * em + nm)

    def excess_non_english(e: float) -> float:  # > 0 while the non-English share is over 0.25
        m = memorization_rate(e)
        return 3 * (m * nm + no) - e * (m * em + eo)

    low, high = 1e-6, 1.0
    assert excess_non_english(low) > 0 > excess_non_english(high)  # the cap alone leaves non-English under 0.25
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if excess_non_english(middle) > 0 else (low, middle)
    english = (low + high) / 2
    run(instance, layout, ["synth_sampling_plan"], build=SynthKDBuildConfig(non_english_min=0.25))
    plan = json.loads(paths.sampling_plan().read_text())
    assert plan["rates"]["english"] == pytest.approx(english)
    assert plan["rates"]["memorization"] == pytest.approx(memorization_rate(english))
    assert plan["rates"]["non_english"] == 1.0 and plan["feasible"]
    assert plan["expected_after"]["non_english_share"] == pytest.approx(0.25)
    assert plan["expected_after"]["memorization_share"] == pytest.approx(0.70)


def test_long_conversations_and_render_failures_are_dropped_counted_and_logged(built_sample, own_instance, tmp_path):
    instance, (_, _, data_dir) = own_instance, built_sample
    copy = tmp_path / "data"
    layout = SynthKDLayout(
        raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(copy), encoding_errors_log=str(tmp_path / "enc.jsonl")
    )
    paths = layout.data_layout()
    datasets = (paths.megatron_root(), paths.distill_root())
    dataset_dirs = {root.relative_to(paths.data_root).parts[0] for root in datasets}
    shutil.copytree(data_dir, copy, ignore=shutil.ignore_patterns(*dataset_dirs))
    # one conversation the renderer must refuse: an assistant channel v1 has no span for
    sampled = paths.stage_output("synth_sampled", "synth_004")
    table = pq.read_table(sampled)
    messages = table.column("messages_json").to_pylist()
    bad_id = table.column("synth_id")[0].as_py()
    messages[0] = messages[0].replace('"channel":"final"', '"channel":"commentary"')
    pq.write_table(
        table.set_column(table.schema.get_field_index("messages_json"), "messages_json", [messages]), sampled
    )
    build = SynthKDBuildConfig(max_seq_len=1000)
    run(instance, layout, ["synth_tokenized"], "synth_004", build=build)
    for key in ("synth_001", "synth_002", "synth_003", "synth_004", "synth_005", "synth_006"):
        run(instance, layout, ["synth_distill"], key, build=build)
    result = run(instance, layout, ["synth_distill_manifest"], build=build)
    assert set(check_outcomes(result).values()) == {True}
    manifest = json.loads(paths.distill_manifest().read_text())
    tokenized = pl.concat([pl.read_parquet(p) for p in stage_shard_files(paths, "synth_tokenized")])
    too_long = tokenized.filter(pl.col("tokens").list.len() - 1 > 1000).height
    assert too_long > 0 and manifest["totals"]["dropped"]["over_max_seq_len"] == too_long
    assert manifest["totals"]["rows_out"] == tokenized.height - too_long
    assert max(manifest["token_lengths"][s]["max"] for s in constants.DISTILL_SPLITS) <= 1000
    assert manifest["totals"]["dropped"]["unsupported_assistant_channel"] == 1
    logged = [json.loads(line) for line in (tmp_path / "enc.jsonl").read_text().splitlines()]
    assert [(e["synth_id"], e["reason"]) for e in logged] == [(bad_id, "unsupported_assistant_channel")]
    assert manifest["encoding_errors_log"] == {"path": str(tmp_path / "enc.jsonl"), "records": 1}
    over = [json.loads(line) for line in paths.error_log(paths.distill_name(), "synth_001").read_text().splitlines()]
    assert over and {e["reason"] for e in over} == {"over_max_seq_len"}


@pytest.mark.parametrize("broken", [None, "labels", "spans"])
def test_the_shard_check_on_the_rows_as_written_finds_what_reading_the_parts_back_finds(
    built_sample, tmp_path, monkeypatch, broken
):
    """distill_rows_valid checks the tables synth_distill hands to Parquet, not the parts decoded again: on a sound
    shard and on one whose rows were broken before they were written, it lists exactly what reading the written
    parts back lists."""
    _, layout, _ = built_sample
    paths = layout.data_layout()
    split_row, made = distill_io._split_row, []

    def breaking(input_ids, spans, start, synth_id):
        row = split_row(input_ids, spans, start, synth_id)
        made.append(synth_id)
        if len(made) in (3, 40) and broken == "labels":
            row.labels[start + 1] += 1
        if len(made) in (3, 40) and broken == "spans":
            row = dataclasses.replace(row, analysis_token_count=row.analysis_token_count + 1)
        return row

    monkeypatch.setattr(distill_io, "_split_row", breaking)
    tokenized, sampled = (paths.stage_output(stage, "synth_002") for stage in ("synth_tokenized", "synth_sampled"))
    encoding = load_harmony_encoding(paths.tokenizer_dir())
    result = distill_io.write_distill_shard(tokenized, sampled, tmp_path / "root", 2, "synth_002", encoding)
    read_back = []
    for record in result.files:
        part = tmp_path / "root" / record["path"]
        for problems in distill_part_problems(part, record["split"], constants.MAX_SEQ_LEN, 0.01).values():
            read_back += problems
    assert sorted(result.row_problems) == sorted(read_back)
    assert len(read_back) == (0 if broken is None else 2) and len(made) > 40


# --- the blocking checks on a corrupted copy -------------------------------------------------------


def run_checks(instance, layout: SynthKDLayout, build: SynthKDBuildConfig | None = None) -> dict[str, bool]:
    result = dg.materialize(
        ALL_ASSETS,
        selection=dg.AssetSelection.checks_for_assets("synth_distill_manifest"),
        instance=instance,
        resources=synthkd_resources(layout, build),
        raise_on_error=False,
    )
    return check_outcomes(result)


@pytest.fixture
def corruptible(built_sample, own_instance, tmp_path):
    instance, (_, built, _) = own_instance, built_sample
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path / "data"))
    source, paths = built.data_layout(), layout.data_layout()
    shutil.copytree(source.distill_root(), paths.distill_root())
    # what the provenance check reads besides the parts
    shutil.copytree(source.tokenizer_dir(), paths.tokenizer_dir())
    shutil.copytree(source.stage_dir("synth_harmony"), paths.stage_dir("synth_harmony"))
    return instance, layout, paths.distill_root()


def rewrite(path, edit) -> None:
    rows = pq.read_table(path).to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=DISTILL_SCHEMA), path)


def test_checks_pass_on_the_sound_copy(corruptible):
    instance, layout, _ = corruptible
    assert run_checks(instance, layout) == dict.fromkeys(DISTILL_CHECKS, True)


def test_a_wrong_label_fails_the_labels_check(corruptible):
    instance, layout, root = corruptible

    def edit(rows):
        start = rows[3]["spans"]["assistant_token_start"]
        rows[3]["labels"][start + 5] += 1

    rewrite(root / "train" / "part-00002.parquet", edit)
    outcome = run_checks(instance, layout)
    assert outcome["distill_labels_match_input_ids"] is False and outcome["distill_manifest_provenance"] is False
    assert outcome["distill_spans_consistent"] is True and outcome["distill_no_split_leakage"] is True


def test_inconsistent_spans_fail_the_spans_check(corruptible):
    instance, layout, root = corruptible

    def edit(rows):
        rows[0]["spans"]["final_token_count"] -= 1  # counts no longer add up
        rows[1]["labels"][rows[1]["spans"]["assistant_token_start"]] = -100  # -100 past the start

    rewrite(root / "train" / "part-00003.parquet", edit)
    found = distill_part_problems(root / "train" / "part-00003.parquet", "train", 8192, 0.01)
    assert len(found["spans"]) == 2 and found["labels"] == [] and found["split"] == []
    outcome = run_checks(instance, layout)
    assert outcome["distill_spans_consistent"] is False and outcome["distill_labels_match_input_ids"] is True


def test_a_leaked_row_fails_the_leakage_check(corruptible):
    instance, layout, root = corruptible
    leaked = pq.read_table(root / "train" / "part-00001.parquet").slice(0, 1).to_pylist()
    rewrite(root / "validation" / "part-00001.parquet", lambda rows: rows.extend(leaked))
    outcome = run_checks(instance, layout)
    assert outcome["distill_no_split_leakage"] is False and outcome["distill_labels_match_input_ids"] is True


def test_a_too_long_row_fails_the_max_length_check(corruptible):
    instance, layout, root = corruptible
    longest = max(
        len(ids) for ids in pq.read_table(root / "train" / "part-00004.parquet").column("input_ids").to_pylist()
    )
    outcome = run_checks(instance, layout, SynthKDBuildConfig(max_seq_len=longest - 1))
    assert outcome["distill_max_length_respected"] is False
    assert outcome["distill_manifest_provenance"] is False  # and max_seq_len is part of the config hash
    assert outcome["distill_labels_match_input_ids"] is True


def test_split_leakage_names_the_parts_an_id_is_in(tmp_path):
    """A repeated or leaked id is named with every part file it is in, to be found without a search."""
    parts = {}
    for split, name, ids in [
        ("train", "part-00001.parquet", ["a", "b"]),
        ("train", "part-00006.parquet", ["b"]),
        ("validation", "part-00004.parquet", ["a"]),
    ]:
        path = tmp_path / split / name
        path.parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": ids}), path)
        parts.setdefault(split, []).append(path)
    problems = split_leakage(parts)
    assert list(problems) == [
        "a is in 2 splits (train/part-00001.parquet, validation/part-00004.parquet)",
        "a appears 2 times (train/part-00001.parquet, validation/part-00004.parquet)",
        "b appears 2 times (train/part-00001.parquet, train/part-00006.parquet)",
    ]


# --- the manifest's row checks read only what no shard's check passed on ---------------------------------------


def test_a_part_is_taken_as_checked_only_for_the_bytes_and_settings_its_check_passed_on():
    settings = rows_valid_for(8192, 0.01)
    listed = {"train/part-00001.parquet": "a", "validation/part-00001.parquet": "b"}
    written = dict(listed)
    assert parts_checked_when_written(listed, dict(listed), written, settings, settings) == set(listed)
    changed = {**listed, "train/part-00001.parquet": "edited"}
    assert parts_checked_when_written(listed, changed, written, settings, settings) == {"validation/part-00001.parquet"}
    rewritten = {**written, "validation/part-00001.parquet": "another build"}
    kept = parts_checked_when_written(listed, dict(listed), rewritten, settings, settings)
    assert kept == {"train/part-00001.parquet"}
    assert parts_checked_when_written(listed, dict(listed), written, None, settings) == set()  # its check failed
    assert parts_checked_when_written(listed, dict(listed), written, rows_valid_for(4096, 0.01), settings) == set()


def test_the_manifests_row_checks_read_only_parts_no_shard_check_passed_on(
    built_sample, own_instance, tmp_path, monkeypatch
):
    """Built in this instance, every part's bytes are those its shard's distill_rows_valid passed on: the four row
    checks read none of them. One part edited since (a label): that part alone is read, and the labels check fails."""
    instance, (_, _, data_dir) = own_instance, built_sample
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path / "data"))
    paths = layout.data_layout()
    shutil.copytree(data_dir, paths.data_root, ignore=shutil.ignore_patterns(paths.distill_root().parent.name))
    for key in ("synth_001", "synth_002", "synth_003", "synth_004", "synth_005", "synth_006"):
        run(instance, layout, ["synth_distill"], key)
    run(instance, layout, ["synth_distill_manifest"])

    def not_read(*args, **kwargs):
        raise AssertionError("a part was read again")

    with monkeypatch.context() as patched:
        patched.setattr(checks, "distill_part_problems", not_read)
        result = dg.materialize(
            ALL_ASSETS,
            selection=dg.AssetSelection.checks_for_assets("synth_distill_manifest"),
            instance=instance,
            resources=synthkd_resources(layout),
        )
    row_checks = [e for e in result.get_asset_check_evaluations() if e.check_name in checks.DISTILL_ROW_CHECKS]
    assert len(row_checks) == 4 and all(e.passed and e.metadata["parts_read"].value == 0 for e in row_checks)

    def edit(rows):
        start = rows[3]["spans"]["assistant_token_start"]
        rows[3]["labels"][start + 5] += 1

    rewrite(paths.distill_root() / "train" / "part-00002.parquet", edit)
    result = dg.materialize(
        ALL_ASSETS,
        selection=dg.AssetSelection.checks_for_assets("synth_distill_manifest"),
        instance=instance,
        resources=synthkd_resources(layout),
        raise_on_error=False,
    )
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert not evaluations["distill_labels_match_input_ids"].passed
    assert evaluations["distill_spans_consistent"].passed
    assert {evaluations[name].metadata["parts_read"].value for name in checks.DISTILL_ROW_CHECKS} == {1}


def test_sampled_messages_advance_in_order_and_read_only_the_rows_asked(tmp_path):
    """The tokenized rows are synth_sampled's in order, some dropped: each is found past the last one found,
    across frames, its messages_json read when asked; a row not among those left is a contract error."""
    path = tmp_path / "sampled.parquet"
    rows = list(range(0, 5000, 3))
    pq.write_table(pa.table({"source_row": rows, "messages_json": [f"m{r}" for r in rows]}), path, row_group_size=700)
    messages = distill_io.SampledMessages(path, "synth_009")
    asked = [3, 30, 2097, 2100, 4998]  # 2097 ends the first row group of 700 rows, 2100 opens the second
    payloads = [messages.advance(row) for row in asked]
    assert [payload() for payload in payloads] == [f"m{r}" for r in asked]
    with pytest.raises(distill_io.DistillContractError, match="synth_009: tokenized source_row 30 is not in"):
        messages.advance(30)  # behind the last row found
