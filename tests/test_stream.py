"""The curated stream of a curriculum stage (docs/pool.md#the-stream), on the sample's built pool: whole
conversations per window, position ids and attention reset per conversation, the stage's mix held on tokens,
deterministic and resumable, utility-weighted with caps and a diversity tail. The oracles read the pool's parts
(polars) and trios (megatron-core) themselves."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.core.datasets.indexed_dataset import IndexedDataset

from synthkd_contract import constants, stage_stream
from synthkd_contract.buckets import CTX_BUCKETS, SKILL_BUCKETS
from synthkd_contract.sources import dataset_group
from synthkd_contract.splits import assign_split
from synthkd_contract.stage_stream import (
    PoolIds,
    ScorerPhase,
    StageStreamError,
    StreamPolicy,
    best_fit_windows,
    epoch_order,
    plan_stream,
    read_stage_conversations,
    stream_mix,
)
from synthkd_training.pool import PoolError
from synthkd_training.stream import (
    StageArgsError,
    StageStream,
    cu_seqlens,
    read_stage_args,
    stream_batches,
    write_sampling_manifest,
)


@pytest.fixture(scope="module")
def curriculum(built_sample) -> Path:
    return built_sample[1].data_layout().curriculum_dir()


def stage_args(curriculum: Path, stage: str):
    return read_stage_args(curriculum / f"{stage}.args")


# -- packing ------------------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 120), min_size=1, max_size=60), st.integers(20, 100))
def test_best_fit_places_every_item_once_and_never_overfills(lengths, window):
    windows = best_fit_windows(lengths, window)
    placed = sorted(i for w in windows for i in w)
    assert placed == list(range(len(lengths)))
    for w in windows:
        assert len(w) == 1 or sum(lengths[i] for i in w) <= window
    # a window is opened only when no open window has room: no two windows could be merged item by item
    fits = [sum(lengths[i] for i in w) for w in windows if len(w) > 1 or lengths[w[0]] <= window]
    assert len(windows) >= -(-sum(min(n, window) for n in lengths) // window)
    smallest = min(lengths)
    assert sum(window - f >= smallest for f in fits) <= len(fits)  # sanity of the sums


# -- the windows ---------------------------------------------------------------------------------------------------
def pool_documents(pool_root: Path) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Every train document of every cell trio of the pool, read by megatron-core, by the sha256 of its tokens."""
    documents = {}
    for idx in sorted((pool_root / "megatron" / "train").glob("*/shard_*_tokens.idx")):
        prefix = str(idx)[: -len(".idx")]
        arrays = [IndexedDataset(prefix.replace("_tokens", f"_{kind}")) for kind in ("tokens", "lossmask", "span")]
        for i in range(len(arrays[0])):
            tokens, mask, span = (np.array(a[i], dtype=np.int64) for a in arrays)
            documents[hashlib.sha256(tokens.tobytes()).hexdigest()] = (tokens, mask, span)
    return documents


def test_windows_hold_whole_conversations_from_their_first_token(curriculum):
    args = stage_args(curriculum, "P1")
    stream = StageStream.from_args(args)
    pool_root = curriculum.parent
    by_start: dict[bytes, list] = defaultdict(list)
    for tokens, mask, span in pool_documents(pool_root).values():
        by_start[tokens[:16].tobytes()].append((tokens, mask, span))
    causal = torch.ones(args.seq_length, args.seq_length, dtype=torch.bool).tril()
    supervised_without_prompt = 0
    for index in range(0, len(stream), max(1, len(stream) // 150)):
        item = stream[index]
        assert set(item) >= {"tokens", "labels", "loss_mask", "span_id", "position_ids", "segment_ids"}
        segments = item["segment_ids"]
        bounds = cu_seqlens(segments).tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            tokens = item["tokens"][start:end].numpy()
            assert item["position_ids"][start:end].tolist() == list(range(end - start))
            if end == bounds[-1] and item["loss_mask"][start:end].sum() == 0 and tokens[0] == constants.EOD_TOKEN_ID:
                assert (tokens == constants.EOD_TOKEN_ID).all() and (item["span_id"][start:end] == 0).all()
                continue  # padding
            matches = [d for d in by_start[tokens[:16].tobytes()] if np.array_equal(d[0], tokens)]
            if not matches:  # a window's supervised tokens whose conversation does not start in it
                supervised_without_prompt += int(item["loss_mask"][start:end].sum())
                continue
            document, mask, span = matches[0]
            assert np.array_equal(item["labels"][start:end].numpy(), np.append(document[1:], constants.EOD_TOKEN_ID))
            assert np.array_equal(item["loss_mask"][start:end].numpy(), mask.astype(np.float32))
            assert np.array_equal(item["span_id"][start:end].numpy(), span)
        # attention: causal, and nothing across two conversations (brute force)
        same = segments[:, None] == segments[None, :]
        assert torch.equal(item["attention_mask"][0], ~(causal & same))
    assert supervised_without_prompt == 0
    mix = stream_mix(stream.plan, stream.conversations)
    assert mix["long_conversations"] == 0 and mix["real_token_fraction"] >= 0.95


def measured_mix(stream: StageStream, pool_root: Path) -> dict[str, Counter]:
    """Tokens by skill, ctx and source group over every window, each segment looked up by its tokens in the
    pool's parts and trios (not through the stream's plan)."""
    by_hash: dict[tuple[bytes, int], tuple[str, str, str]] = {}  # (first 64 tokens, length) -> skill, ctx, group
    for idx in sorted((pool_root / "megatron" / "train").glob("*/shard_*_tokens.idx")):
        prefix = str(idx)[: -len(".idx")]
        skill, ctx = idx.parent.name.split("_")
        shard = int(idx.name.split("_")[1])
        part = pl.read_parquet(pool_root / "parts" / f"part-{shard:05d}.parquet")
        rows = [
            r
            for r in part.iter_rows(named=True)
            if (r["skill_bucket"], r["ctx_bucket"]) == (skill, ctx) and assign_split(r["source_example_id"]) == "train"
        ]
        tokens = IndexedDataset(prefix)
        assert len(rows) == len(tokens)
        for i, row in enumerate(rows):
            document = np.array(tokens[i], dtype=np.int64)
            key = (document[:64].tobytes(), len(document))
            assert by_hash.get(key, (skill, ctx))[:2] == (skill, ctx)  # a key names one cell
            by_hash[key] = (skill, ctx, dataset_group(row["source_dataset"]))
    measured = {"skill_bucket": Counter(), "ctx_bucket": Counter(), "source_group": Counter()}
    for index in range(len(stream)):
        item = stream[index]
        bounds = cu_seqlens(item["segment_ids"]).tolist()
        for start, end in zip(bounds[:-1], bounds[1:]):
            tokens = item["tokens"][start:end].numpy()
            key = by_hash.get((tokens[:64].astype(np.int64).tobytes(), end - start))
            if key is None:
                assert item["loss_mask"][start:end].sum() == 0  # padding only
                continue
            for dimension, value in zip(measured, key):
                measured[dimension][value] += end - start
    return measured


def stage_targets(stage_file: Path, pool_root: Path) -> dict[str, dict[str, float]]:
    """The stage's target shares from its file's weights: a prefix's weight goes to its cell's skill and ctx, and
    to the source groups of its trio's rows in proportion to their tokens."""
    blend = json.loads(stage_file.read_text())["train"]
    weights = dict(zip(blend[1::2], blend[0::2]))
    total = sum(weights.values())
    targets = {"skill_bucket": Counter(), "ctx_bucket": Counter(), "source_group": Counter()}
    cell_groups: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for part in sorted((pool_root / "parts").glob("*.parquet")):
        for row in pl.read_parquet(part).iter_rows(named=True):
            if assign_split(row["source_example_id"]) == "train":
                cell_groups[(row["skill_bucket"], row["ctx_bucket"])][dataset_group(row["source_dataset"])] += row[
                    "sequence_tokens"
                ]
    cell_weight: Counter = Counter()
    for prefix, weight in weights.items():
        skill, ctx = Path(prefix).parent.name.split("_")
        cell_weight[(skill, ctx)] += weight / total
    for (skill, ctx), weight in cell_weight.items():
        targets["skill_bucket"][skill] += weight
        targets["ctx_bucket"][ctx] += weight
        groups = cell_groups[(skill, ctx)]
        for group, tokens in groups.items():
            targets["source_group"][group] += weight * tokens / sum(groups.values())
    return targets


@pytest.mark.parametrize("stage", ["P1", "P2"])
def test_every_window_of_a_stage_drawn_holds_its_mix_within_one_point(curriculum, stage):
    args = stage_args(curriculum, stage)
    stream = StageStream.from_args(args, create_attention_mask=False)
    pool_root = curriculum.parent
    measured = measured_mix(stream, pool_root)
    targets = stage_targets(curriculum / f"{stage}.json", pool_root)
    for dimension, tokens in measured.items():
        total = sum(tokens.values())
        for name in set(tokens) | set(targets[dimension]):
            assert abs(tokens[name] / total - targets[dimension][name]) * 100 <= 1.0, (stage, dimension, name)
    # the curriculum's plan (sealed in the pool manifest) reports the same mix
    plan = {s["stage"]: s for s in json.loads((curriculum / "plan.json").read_text())["stages"]}[stage]
    reported = plan["stream"]
    assert reported["within_tolerance"] and reported["windows"] == len(stream)
    for dimension, tokens in measured.items():
        assert {name: entry["tokens"] for name, entry in reported["by"][dimension].items()} == {
            name: count for name, count in tokens.items() if count
        }
    assert sum(measured["ctx_bucket"].values()) / (len(stream) * args.seq_length) >= 0.95


def test_the_stream_is_deterministic_and_resumes_at_consumed_samples(curriculum):
    args = stage_args(curriculum, "P2")
    first = StageStream.from_args(args, create_attention_mask=False, hash_files=False)
    again = StageStream.from_args(args, create_attention_mask=False, hash_files=False)
    assert np.array_equal(first.plan.conversations, again.plan.conversations)
    assert np.array_equal(first.plan.offsets, again.plan.offsets)
    whole = list(stream_batches(len(first), micro_batch_size=2, data_parallel_size=2, data_parallel_rank=1))
    resumed = list(stream_batches(len(first), 2, consumed_samples=40, data_parallel_rank=1, data_parallel_size=2))
    assert resumed == whole[10:]
    # a stage trained to its budget keeps the last incomplete global batch: every window once, over the ranks
    kept = [b for rank in range(2) for b in stream_batches(7, 2, 1, rank, 2, drop_last=False)]
    assert sorted(kept) == [[1, 2], [3, 4], [5, 6]] and list(stream_batches(7, 2, 1, 0, 2)) == [[1, 2]]
    assert list(stream_batches(9, 2, 0, 1, 2, drop_last=False)) == [[2, 3], [6, 7]]  # rank 1's last slice is empty
    for batch in resumed[:3]:
        for index in batch:
            assert torch.equal(first[index]["tokens"], again[index]["tokens"])
    other_seed = plan_stream(first.conversations, args.seq_length, len(first), StreamPolicy(seed=1))
    assert not np.array_equal(other_seed.conversations, first.plan.conversations)


def test_utility_weights_caps_and_the_tail_decide_a_partial_epoch(curriculum):
    conversations = read_stage_conversations(curriculum / "P2.json")
    # C1 is drawn partly in every epoch of P2 (C2 is the scarce bucket): plant a utility on half its rows
    c1 = conversations.ctx == CTX_BUCKETS.index("C1")
    favoured = c1 & (np.arange(len(conversations)) % 2 == 0)
    utility = np.where(favoured, 1.0, 0.0)
    phase = ScorerPhase(0, utility, "a" * 64)
    weighted = plan_stream(conversations, 8192, 400, StreamPolicy(tau=20.0), [phase])
    uniform = plan_stream(conversations, 8192, 400, StreamPolicy(tau=0.0), [phase])

    def favoured_share(plan) -> float:
        picked = plan.conversations[c1[plan.conversations]]
        return float(favoured[picked].mean())

    assert favoured_share(weighted) > 0.9 > 0.6 > favoured_share(uniform)
    tail = plan_stream(conversations, 8192, 400, StreamPolicy(tau=20.0, epsilon=0.5), [phase])
    assert favoured_share(weighted) > favoured_share(tail) > favoured_share(uniform)
    for plan in (weighted, tail):  # the quota units still hold the mix
        assert stream_mix(plan, conversations)["max_deviation_pp"] <= 1.0
    assert {e.scorer_sha256 for e in weighted.epochs} == {"a" * 64}

    # a scorer from epoch 2 changes nothing before epoch 2's first window
    later = plan_stream(conversations, 8192, 400, StreamPolicy(tau=20.0), [ScorerPhase(2, utility, "b" * 64)])
    plain = plan_stream(conversations, 8192, 400, StreamPolicy(tau=20.0))
    boundary = later.epochs[2].first_window
    assert np.array_equal(
        later.conversations[: later.offsets[boundary]], plain.conversations[: plain.offsets[boundary]]
    )
    assert [e.scorer_sha256 for e in later.epochs[:3]] == [None, None, "b" * 64]


@pytest.mark.parametrize("spread", ["within one unit", "across every unit"])
def test_the_cluster_cap_holds_per_epoch(curriculum, spread):
    conversations = read_stage_conversations(curriculum / "P1.json")
    unit, _ = conversations.units()
    planted = conversations.cluster.copy()
    if spread == "within one unit":
        planted[: len(planted) // 2] = 7  # one huge cluster
    else:  # near-duplicates in several skill / ctx / source-group units: the cap is the epoch's, not a unit's
        planted[[np.flatnonzero(unit == u)[i] for u in np.unique(unit).tolist() for i in range(4)]] = 7
        assert len(np.unique(unit[planted == 7])) > 1
    capped = type(conversations)(**{**conversations.__dict__, "cluster": planted})
    plan = plan_stream(capped, 2048, 3000, StreamPolicy(cluster_cap=3))
    bounds = [e.first_window for e in plan.epochs] + [len(plan)]
    assert len(bounds) > 2  # several epochs
    for first, end in zip(bounds[:-1], bounds[1:]):
        members = plan.conversations[plan.offsets[first] : plan.offsets[end]]
        assert np.count_nonzero(planted[members] == 7) <= 3


def test_stage_args_name_megatrons_arguments_and_say_a_stock_run_ignores_the_masks(curriculum, tmp_path):
    text = (curriculum / "P1.args").read_text()
    comments = [line for line in text.splitlines() if line.startswith("#")]
    assert any("ignores the loss masks" in line for line in comments)
    args = read_stage_args(curriculum / "P1.args")
    assert args.per_split_data_args_path == curriculum / "P1.json"
    assert (args.tokenizer_type, args.vocab_size) == ("NullTokenizer", constants.EOD_TOKEN_ID)
    bad = tmp_path / "bad.args"
    bad.write_text(text.replace("--vocab-size 199999", "--vocab-size 50000"))
    with pytest.raises(StageArgsError, match="EOD is 199999"):
        read_stage_args(bad)
    bad.write_text(
        text.replace("NullTokenizer --vocab-size 199999", "HuggingFaceTokenizer --tokenizer-model x/gpt-oss-20b")
    )
    assert read_stage_args(bad).tokenizer_type == "HuggingFaceTokenizer"
    bad.write_text("# nothing\n--seq-length 8\n")
    with pytest.raises(StageArgsError, match="per-split-data-args-path"):
        read_stage_args(bad)


def test_the_sampling_manifest_records_grid_policy_scorers_and_mix(curriculum, tmp_path):
    args = stage_args(curriculum, "P2")
    conversations = read_stage_conversations(args.per_split_data_args_path)
    phase = ScorerPhase(1, np.zeros(len(conversations)), "c" * 64)
    stream = StageStream.from_args(
        args, policy=StreamPolicy(tau=2.0, epsilon=0.1, cluster_cap=4), scorer_phases=[phase]
    )
    path = write_sampling_manifest(tmp_path / "run" / "sampling.json", [(stream, 12)])
    run = json.loads(path.read_text())
    assert run["format"] == "synthkd.run_sampling/1" and run["stages"][0]["consumed_samples"] == 12
    manifest = run["stages"][0]
    assert manifest["policy"] == {"seed": 0, "tau": 2.0, "epsilon": 0.1, "cluster_cap": 4, "chunk_windows": 512}
    assert manifest["scorers"] == [{"first_epoch": 1, "scorer_sha256": "c" * 64}]
    assert sum(unit["target_share"] for unit in manifest["quota_grid"]) == pytest.approx(1.0)
    assert {u["ctx_bucket"] for u in manifest["quota_grid"]} == {"C1", "C2"}
    assert manifest["epochs"][0]["scorer_sha256"] is None and manifest["epochs"][1]["scorer_sha256"] == "c" * 64
    assert manifest["mix"]["within_tolerance"] and manifest["windows"] == len(stream)
    # the stage stops at its token budget: the last window reaches it, the one before does not
    budget = manifest["token_budget"]
    assert budget == 150_000_000 and stream.plan.policy.tau == 2.0
    held = np.minimum(stream.conversations.length[stream.plan.conversations], args.seq_length)
    before_last = held[: stream.plan.offsets[-2]].sum()
    assert before_last < budget <= held.sum()
    assert manifest["stage_sha256"] == hashlib.sha256(args.per_split_data_args_path.read_bytes()).hexdigest()
    assert all(b in SKILL_BUCKETS for b in manifest["mix"]["by"]["skill_bucket"])


def test_a_stream_is_made_only_of_a_pool_that_verifies(built_sample, tmp_path):
    """StageStream verifies the pool first (`stage_blends`: seal, blocking checks, the stage file and its trios):
    a copied pool whose stage file names another root's trios, and an edited stage file, are refused."""
    copy = tmp_path / "data"
    shutil.copytree(built_sample[2], copy)
    stage = copy / built_sample[1].data_layout().curriculum_dir().relative_to(built_sample[2]) / "P1.json"
    with pytest.raises(PoolError, match="outside the pool"):
        StageStream(stage, 2048, 10)
    blends = json.loads(stage.read_text())
    blends["train"] = [str(entry).replace(str(built_sample[2]), str(copy)) for entry in blends["train"]]
    stage.write_text(json.dumps(blends))
    with pytest.raises(PoolError, match="differs|has"):
        StageStream(stage, 2048, 10)
    bad = tmp_path / "P9.json"
    bad.write_text('{"train": []}')
    with pytest.raises(StageStreamError, match="no weighted prefix"):
        read_stage_conversations(bad)


def test_a_new_scorer_takes_effect_at_the_next_epoch_and_is_recorded(curriculum):
    args = stage_args(curriculum, "P2")
    stream = StageStream.from_args(args, policy=StreamPolicy(tau=20.0), create_attention_mask=False)
    before = [stream[i]["tokens"] for i in range(0, 40)]
    consumed = stream.plan.epochs[1].first_window + 3  # in epoch 1
    conversations = stream.conversations
    utility = np.where(conversations.ctx == CTX_BUCKETS.index("C1"), np.arange(len(conversations)) % 2, 0.0)
    first_epoch = stream.switch_scorer(ScorerPhase(0, utility, "d" * 64), consumed_samples=consumed)
    assert first_epoch == 2
    assert all(torch.equal(stream[i]["tokens"], before[i]) for i in range(40) if i < stream.plan.epochs[2].first_window)
    manifest = stream.sampling_manifest()
    assert manifest["scorers"] == [{"first_epoch": 2, "scorer_sha256": "d" * 64}]
    assert [e["scorer_sha256"] for e in manifest["epochs"][:3]] == [None, None, "d" * 64]
    assert manifest["stage"] == "P2" and len(manifest["curriculum_plan_sha256"]) == 64


# -- the weighted draw (Efraimidis-Spirakis), against numpy's successive sampling ----------------------------------
def test_a_single_pick_follows_the_weights():
    """The first of an epoch's order is conversation i with probability w_i / sum(w): over 1600 seeds every
    frequency lies within 0.05 of it (over 4 standard deviations)."""
    weights = np.array([1.0, 2.0, 5.0])
    members, clusters = np.arange(3), np.full(3, -1)
    firsts = Counter(
        int(epoch_order(members, weights, clusters, StreamPolicy(), np.random.default_rng(seed))[0])
        for seed in range(1600)
    )
    for i, w in enumerate(weights):
        assert abs(firsts[i] / 1600 - w / weights.sum()) < 0.05


def test_heavier_conversations_come_first_as_often_as_successive_sampling_picks_them():
    """The mean number of heavy conversations among the first 40 of 200 agrees with numpy's weighted choice
    without replacement; with epsilon 1 the order ignores the weights."""
    weights = np.array([math.e**2] * 100 + [1.0] * 100)
    members, clusters = np.arange(200), np.full(200, -1)
    mine = [
        int((epoch_order(members, weights, clusters, StreamPolicy(), np.random.default_rng(s))[:40] < 100).sum())
        for s in range(200)
    ]
    oracle = np.random.default_rng(0)
    numpy_counts = [(oracle.choice(200, 40, replace=False, p=weights / weights.sum()) < 100).sum() for _ in range(600)]
    assert abs(np.mean(mine) - np.mean(numpy_counts)) < 1.0 and np.mean(mine) > 30
    uniform = [
        int(
            (
                epoch_order(members, weights, clusters, StreamPolicy(epsilon=1.0), np.random.default_rng(s))[:40] < 100
            ).sum()
        )
        for s in range(200)
    ]
    assert abs(np.mean(uniform) - 20) < 1.5


def test_the_stages_of_one_pool_read_each_part_once_and_draw_the_same_conversations(curriculum, monkeypatch):
    """Two stages read with one `parts_read` mapping read each pool part once, and each stage's conversations are
    those it reads alone (field by field)."""
    alone = [read_stage_conversations(curriculum / f"{stage}.json") for stage in ("P1", "P2")]
    opened: list[str] = []
    real_read = stage_stream.pq.read_table

    def counted(path, *args, **kwargs):
        opened.append(Path(path).name)
        return real_read(path, *args, **kwargs)

    monkeypatch.setattr(stage_stream.pq, "read_table", counted)
    parts_read: dict = {}
    shared = [read_stage_conversations(curriculum / f"{stage}.json", parts_read) for stage in ("P1", "P2")]
    assert opened and sorted(opened) == sorted(set(opened)) and len(parts_read) == len(opened)
    for one, other in zip(alone, shared):
        assert one.ids == other.ids and one.prefixes == other.prefixes
        for name in ("prefix", "document", "length", "skill", "ctx", "group", "cluster"):
            assert np.array_equal(getattr(one, name), getattr(other, name)), name


def test_a_stages_ids_are_its_documents_pool_rows_as_strings(curriculum):
    """`StageConversations.ids` (one Arrow array, `PoolIds`) reads as the `str` ids of the pool rows behind each
    conversation's trio document: the part rows of its cell and the train split, in part order (an oracle read
    from the part files row by row)."""
    import pyarrow.parquet as pq

    conversations = read_stage_conversations(curriculum / "P1.json")
    pool_root = curriculum.parent
    expected = []
    for prefix in conversations.prefixes:
        cell = Path(prefix).parent.name
        shard = Path(prefix).name.split("_")[1]
        record = json.loads((pool_root / "shards" / f"shard_{shard}.json").read_text())
        rows = pq.read_table(pool_root / record["part"]["path"]).to_pylist()
        expected += [
            row["id"]
            for row in rows
            if f"{row['skill_bucket']}_{row['ctx_bucket']}" == cell
            and assign_split(row["source_example_id"]) == constants.SPLITS[0]
        ]
    ids = conversations.ids
    assert len(ids) == len(conversations) == len(expected) > 0
    assert list(ids) == expected and all(type(i) is str for i in ids)
    assert ids[0] == expected[0] and ids[-1] == expected[-1] and ids[1:4] == expected[1:4]
    assert ids == expected and ids == tuple(expected) and ids != expected[:-1]
    with pytest.MonkeyPatch.context() as patch:  # iterated a block at a time, the same ids
        patch.setattr(PoolIds, "ITER_ROWS", 3)
        assert list(ids) == expected
