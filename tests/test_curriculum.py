"""Curriculum stages as Megatron-LM data arguments: weights, budgets, feasibility, and the files a run reads.

Oracles: megatron-core's own `get_blend_from_list` (through Megatron-LM's per-split JSON reader, restated
below because megatron.training is not installed), real IndexedDataset files built with megatron-core's
`IndexedDatasetBuilder`, and megatron-core's `BlendedMegatronDatasetBuilder` drawing the stage's samples.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
from megatron.core.datasets.utils import get_blend_from_list

from synthkd_assets.core.curriculum import (
    CurriculumStage,
    curriculum_stages,
    plan_stage,
    remove_other_stages_files,
    scan_pool_prefixes,
    stage_file_paths,
    write_stage_files,
)
from synthkd_contract import constants
from synthkd_contract.buckets import CTX_BUCKETS, CURRICULUM_STAGES, SKILL_BUCKETS
from synthkd_training.dataset import O200kHarmonyIds


def read_per_split_data_args(path: Path) -> list:
    """Megatron-LM's `get_blend_and_blend_per_split` (megatron/training/utils.py) for --per-split-data-args-path,
    restated: json.load, a split given as a string is split on whitespace, each of train/valid/test goes through
    megatron-core's get_blend_from_list (None stays None; a missing key is a KeyError there too)."""
    with open(path) as handle:
        per_split = json.load(handle)
    for split in ["train", "valid", "test"]:
        if isinstance(per_split[split], str):
            per_split[split] = per_split[split].split()
    return [get_blend_from_list(per_split["train"]), get_blend_from_list(per_split["valid"]),
            get_blend_from_list(per_split["test"])]  # fmt: skip


def megatron_lm_args(text: str) -> argparse.Namespace:
    """The Megatron-LM options a .args file sets, as `$(grep -v '^#' P1.args)` passes them, declared as
    megatron/training/arguments.py does."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--per-split-data-args-path", type=str, default=None)
    parser.add_argument("--seq-length", type=int, default=None)
    parser.add_argument("--train-samples", type=int, default=None)
    parser.add_argument("--data-cache-path", type=str, default=None)
    parser.add_argument("--data-path", nargs="*", default=None)
    parser.add_argument("--split", type=str, default=None)
    parser.add_argument("--tokenizer-type", type=str, default=None)
    parser.add_argument("--vocab-size", type=int, default=None)
    line = " ".join(row for row in text.splitlines() if not row.startswith("#"))
    return parser.parse_args(shlex.split(line))


def stage(ctx_mix, tokens=1000, seq_length=32, name="S"):
    return CurriculumStage(stage=name, ctx_mix=ctx_mix, tokens=tokens, seq_length=seq_length)


# --- the stages -------------------------------------------------------------------------------


def test_default_stages_are_002s():
    stages = {s.stage: s for s in curriculum_stages()}
    assert list(stages) == ["P1", "P2", "P3", "P4"]
    assert stages["P1"].to_dict() == CURRICULUM_STAGES[0]
    assert [s.to_dict() for s in stages.values()] == list(CURRICULUM_STAGES)
    assert stages["P4"].optional and stages["P4"].tokens == 0 and stages["P4"].seq_length >= 65536


def test_p1_expects_146k_sequences():
    plan = plan_stage(curriculum_stages()[0], {"train": {"C1": [("train/B1_C1/shard_00_tokens", 10**9)]}})
    # 300M tokens at 2048 per sample: 146,484.375, rounded up so the budget is met
    assert plan["expected_sequences"] == 146_485
    assert plan["tokens"] == 300_000_000 and plan["seq_length"] == 2048
    assert plan["ctx"]["C1"]["epochs_needed"] == pytest.approx(0.3)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"ctx_mix": {"C9": 1.0}}, r"unknown ctx buckets \['C9'\]"),
        ({"ctx_mix": {"C1": 0.5, "C2": 0.4}}, r"sum to 0.9"),
        ({"ctx_mix": {"C1": 1.5, "C2": -0.5}}, r"ctx_mix\['C1'\] = 1.5 is not a share"),
        ({"ctx_mix": {"C1": float("nan")}}, r"is not a share"),
        ({"tokens": -1}, r"tokens = -1 is not an integer >= 0"),
        ({"tokens": 1.5}, r"tokens = 1.5"),
        ({"seq_length": 0}, r"seq_length = 0 is not an integer >= 1"),
        ({"stage": "../P1"}, r"the name must match"),
        ({"stage": "plan"}, r"the name is taken by plan.json"),
        ({"optional": "no"}, r"optional = 'no' is not a bool"),
        ({"extra": 1}, r"keys .*'extra'"),
    ],
)
def test_bad_stage_config_is_refused_by_name(entry, message):
    config = [{**CURRICULUM_STAGES[0], **entry}]
    with pytest.raises(ValueError, match=message):
        curriculum_stages(config)


def test_duplicate_stage_names_are_refused():
    with pytest.raises(ValueError, match="stage 'P1' appears twice"):
        curriculum_stages([CURRICULUM_STAGES[0], CURRICULUM_STAGES[0]])


def test_stage_is_immutable_and_ordered():
    s = stage({"C3": 0.9, "C1": 0.1})
    assert list(s.ctx_mix) == ["C1", "C3"]
    with pytest.raises(TypeError):
        s.ctx_mix["C1"] = 1.0  # type: ignore[index]


# --- weights for every token table (hypothesis) -------------------------------------------------

token_counts = st.integers(min_value=0, max_value=10**10)
tables = st.fixed_dictionaries(
    {
        split: st.fixed_dictionaries({ctx: st.lists(token_counts, max_size=4) for ctx in CTX_BUCKETS})
        for split in constants.SPLITS
    }
)
mixes = st.dictionaries(st.sampled_from(CTX_BUCKETS), st.integers(min_value=1, max_value=1000), min_size=1).map(
    lambda raw: {ctx: n / sum(raw.values()) for ctx, n in raw.items()}
)


def as_prefixes(table) -> dict:
    """Token lists -> prefixes in the pool layout (skill buckets cycled, one shard each)."""
    return {
        split: {
            ctx: [(f"{split}/{SKILL_BUCKETS[i % 4]}_{ctx}/shard_{i:02d}_tokens", n) for i, n in enumerate(counts)]
            for ctx, counts in by_ctx.items()
        }
        for split, by_ctx in table.items()
    }


def pairs(blend):
    prefixes, weights = blend
    return dict(zip(prefixes, weights))


@settings(max_examples=300, deadline=None)
@given(tables, mixes, st.randoms(use_true_random=False))
def test_weights_reproduce_the_ctx_shares_on_tokens(table, mix, rng):
    # the sum of the mix is 1 up to rounding: renormalize with fsum so the stage accepts it
    total = math.fsum(mix.values())
    s = stage({ctx: share / total for ctx, share in mix.items()}, tokens=10**9, seq_length=4096)
    prefixes = as_prefixes(table)
    plan = plan_stage(s, prefixes)
    train_tokens = {ctx: sum(table["train"][ctx]) for ctx in CTX_BUCKETS}
    starved = [ctx for ctx in CTX_BUCKETS if s.share(ctx) > 0 and train_tokens[ctx] == 0]
    assert plan["feasible"] == (not starved)
    assert sorted(item["ctx"] for item in plan["infeasible"]) == starved
    for ctx in CTX_BUCKETS:
        expected = s.share(ctx) * s.tokens / train_tokens[ctx] if train_tokens[ctx] else None
        assert plan["ctx"][ctx]["epochs_needed"] == (pytest.approx(expected) if expected is not None else None)
    # the same plan, bytes included, whatever the order of the input lists and mappings
    shuffled = {
        split: dict(rng.sample(list(by_ctx.items()), len(by_ctx))) for split, by_ctx in reversed(list(prefixes.items()))
    }
    shuffled = {split: {c: rng.sample(v, len(v)) for c, v in by_ctx.items()} for split, by_ctx in shuffled.items()}
    assert json.dumps(plan_stage(s, shuffled), sort_keys=True) == json.dumps(plan, sort_keys=True)
    if starved:
        assert plan["per_split_data_args"] is None and plan["data_path"] is None and plan["reason"]
        return
    args = plan["per_split_data_args"]
    train = get_blend_from_list(args["train"])
    # the string form (--data-path) parses to exactly the same blend
    assert get_blend_from_list(plan["data_path"].split()) == train
    assert math.fsum(train[1]) == pytest.approx(1.0, abs=1e-12)
    weights = pairs(train)
    for ctx in CTX_BUCKETS:
        named = {p: n for p, n in prefixes["train"][ctx] if n > 0}
        if s.share(ctx) == 0:
            assert not set(named) & set(weights)
            continue
        assert set(named) <= set(weights)
        # the ctx's share of the blend, split over its prefixes by their tokens
        assert math.fsum(weights[p] for p in named) == pytest.approx(s.share(ctx), rel=1e-12)
        for p, n in named.items():
            assert weights[p] == pytest.approx(s.share(ctx) * n / train_tokens[ctx], rel=1e-12)
    assert set(weights) <= {p for by_ctx in prefixes["train"].values() for p, n in by_ctx if n > 0}
    # valid: the same rule over the valid tokens of the ctx buckets that have some
    valid_tokens = {ctx: sum(table["valid"][ctx]) for ctx in CTX_BUCKETS}
    if not any(valid_tokens[c] for c in CTX_BUCKETS if s.share(c) > 0):
        assert args["valid"] is None
    else:
        for p, w in pairs(get_blend_from_list(args["valid"])).items():
            ctx = p.split("/")[1].split("_")[1]
            assert w == pytest.approx(s.share(ctx) * dict(prefixes["valid"][ctx])[p] / valid_tokens[ctx], rel=1e-12)
    assert args["test"] is None


@pytest.mark.parametrize(
    "bad",
    [
        {"train": {"C1": [("/abs/train/B1_C1/shard_00_tokens", 5)]}},
        {"train": {"C1": [("train/../x/shard_00_tokens", 5)]}},
        {"train": {"C1": [("train/B1_C1/shard_00_tokens", -5)]}},
        {"train": {"C1": [("train/B1_C1/shard_00_tokens", 5), ("train/B1_C1/shard_00_tokens", 6)]}},
        {"train": {"C7": [("train/B1_C7/shard_00_tokens", 5)]}},
        {"test": {"C1": [("test/B1_C1/shard_00_tokens", 5)]}},
    ],
)
def test_bad_prefix_tables_are_refused(bad):
    with pytest.raises(ValueError):
        plan_stage(stage({"C1": 1.0}), bad)


def test_empty_ctx_bucket_makes_the_stage_infeasible():
    p3 = {s.stage: s for s in curriculum_stages()}["P3"]
    plan = plan_stage(p3, {"train": {"C1": [("train/B1_C1/shard_00_tokens", 100)]}})
    assert not plan["feasible"] and plan["per_split_data_args"] is None and plan["data_path"] is None
    assert plan["ctx"]["C3"]["epochs_needed"] is None and plan["ctx"]["C3"]["available_tokens"] == 0
    assert plan["infeasible"] == [{"ctx": "C3", "share": 0.9, "reason": "C3 has share 0.9 in P3 but no train tokens"}]
    assert "C3" in plan["reason"]


def test_zero_budget_stage_has_no_data_arguments():
    plan = plan_stage(stage({"C1": 1.0}, tokens=0), {"train": {"C1": [("train/B1_C1/shard_00_tokens", 100)]}})
    assert plan["feasible"] and not plan["enabled"] and plan["per_split_data_args"] is None
    assert plan["expected_sequences"] == 0 and "budget of 0 tokens" in plan["reason"]


# --- real files ---------------------------------------------------------------------------------

# (split, skill, ctx) -> document lengths of shard 00; C3 and C4 empty, B3_C1 / B4_C2 missing
POOL = {
    ("train", "B1", "C1"): [40, 90, 300, 75],
    ("train", "B2", "C1"): [120, 60],
    ("train", "B4", "C1"): [33],
    ("train", "B1", "C2"): [400, 250],
    ("train", "B3", "C2"): [150],
    ("valid", "B1", "C1"): [50, 20],
    ("valid", "B2", "C2"): [260],
}


def write_pool(root: Path) -> dict[str, int]:
    """The pool's per-cell trios (shard 00) with megatron-core's builder; prefix -> tokens."""
    rng = np.random.default_rng(0)
    written = {}
    for (split, skill, ctx), lengths in POOL.items():
        cell = root / split / f"{skill}_{ctx}"
        cell.mkdir(parents=True)
        for kind, dtype in constants.ARRAY_DTYPES.items():
            builder = IndexedDatasetBuilder(str(cell / f"shard_00_{kind}.bin"), dtype=dtype)
            for n in lengths:
                values = rng.integers(0, 1000, n) if kind == "tokens" else np.zeros(n)
                builder.add_document(np.asarray(values, dtype=dtype), [n])
            builder.finalize(str(cell / f"shard_00_{kind}.idx"))
        written[f"{split}/{skill}_{ctx}/shard_00_tokens"] = sum(lengths)
    return written


@pytest.fixture
def pool(tmp_path) -> tuple[Path, dict[str, int]]:
    root = tmp_path / "megatron" / "synth_pool_v1"
    return root, write_pool(root)


def test_scan_reads_every_cell_prefix_and_its_tokens(pool):
    root, written = pool
    scanned = scan_pool_prefixes(root)
    found = {p: n for by_ctx in scanned.values() for entries in by_ctx.values() for p, n in entries}
    assert found == written
    assert {ctx for ctx in scanned["train"]} == {"C1", "C2"}
    assert all(p.split("/")[1].endswith(ctx) for by_ctx in scanned.values() for ctx, e in by_ctx.items() for p, _ in e)


def test_stage_files_load_in_megatron_and_name_only_existing_prefixes(pool, tmp_path):
    root, written = pool
    p2 = curriculum_stages()[1]
    small = stage(dict(p2.ctx_mix), tokens=32 * 2000, seq_length=32, name="P2")  # P2's mix, a budget the test can draw
    plan = plan_stage(small, scan_pool_prefixes(root))
    assert plan["feasible"] and plan["expected_sequences"] == 2000
    out = tmp_path / "curriculum"
    paths = write_stage_files(plan, out, root, tmp_path / "cache")
    assert paths == list(stage_file_paths("P2", out)) and all(p.is_file() for p in paths)

    train, valid, test = read_per_split_data_args(paths[0])
    assert test is None
    for blend in (train, valid):
        for prefix in blend[0]:
            assert Path(prefix).is_absolute()
            assert len(IndexedDataset(prefix)) > 0  # a real IndexedDataset, opened by megatron-core
    by_ctx = Counter()
    for prefix, weight in pairs(train).items():
        relative = Path(prefix).relative_to(root.absolute()).as_posix()
        ctx = relative.split("/")[1].split("_")[1]
        by_ctx[ctx] += weight
    assert by_ctx == pytest.approx({"C1": 0.8, "C2": 0.2})
    # valid holds C1 (B1) and C2 (B2): the same shares
    assert sorted(pairs(valid).values()) == pytest.approx([0.2, 0.8])

    args = megatron_lm_args(paths[1].read_text())
    assert args.per_split_data_args_path == str(paths[0].absolute())
    assert (args.seq_length, args.train_samples) == (32, 2000)
    assert args.data_path is None and args.split is None  # megatron-core refuses split with blend_per_split
    assert (args.tokenizer_type, args.vocab_size) == ("NullTokenizer", constants.EOD_TOKEN_ID)  # its EOD: 199999
    assert "ignores the loss masks" in paths[1].read_text().split("\n--")[0]  # said before the arguments
    assert Path(args.data_cache_path) == (tmp_path / "cache").absolute() and not (tmp_path / "cache").is_relative_to(
        root
    )

    # megatron-core draws the stage: per-prefix sample shares follow the weights (each sample is seq_length tokens)
    # with the .args' cache path, as pretrain_gpt.py passes it: the sealed pool gets no file of megatron-core's
    pool_files = sorted(root.rglob("*"))
    config = GPTDatasetConfig(
        random_seed=1,
        sequence_length=args.seq_length,
        blend_per_split=[train, valid, test],
        path_to_cache=args.data_cache_path,
        tokenizer=O200kHarmonyIds(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
    )
    created = not dist.is_initialized()  # megatron-core asks for the rank when it caches
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        train_ds, valid_ds, _ = BlendedMegatronDatasetBuilder(
            GPTDataset, [args.train_samples, 16, None], lambda: True, config
        ).build()
    finally:
        if created:
            dist.destroy_process_group()
    assert sorted(root.rglob("*")) == pool_files and any((tmp_path / "cache").rglob("*.npy"))
    assert len(train_ds) >= args.train_samples
    drawn = Counter(int(i) for i in train_ds.dataset_index[: args.train_samples])
    for i, weight in enumerate(train[1]):
        assert drawn[i] / args.train_samples == pytest.approx(weight / sum(train[1]), abs=2 / args.train_samples)
    assert valid_ds is not None


def test_infeasible_stage_writes_nothing_and_removes_old_files(pool, tmp_path):
    root, _ = pool
    out = tmp_path / "curriculum"
    feasible = plan_stage(stage({"C1": 1.0}, name="P3"), scan_pool_prefixes(root))
    assert len(write_stage_files(feasible, out, root, tmp_path / "cache")) == 2
    p3 = {s.stage: s for s in curriculum_stages()}["P3"]  # needs C3: the pool has none
    plan = plan_stage(p3, scan_pool_prefixes(root))
    assert not plan["feasible"] and plan["ctx"]["C3"]["epochs_needed"] is None
    assert write_stage_files(plan, out, root, tmp_path / "cache") == []
    assert list(out.iterdir()) == []


def test_the_files_of_a_stage_taken_out_of_the_curriculum_are_removed(pool, tmp_path):
    """A stage no longer configured leaves no blend naming prefixes the pool may have lost; the configured
    stages' files, the plan and files that are not stage files stay."""
    root, _ = pool
    out = tmp_path / "curriculum"
    for name in ("P1", "S1"):
        write_stage_files(
            plan_stage(stage({"C1": 1.0}, name=name), scan_pool_prefixes(root)), out, root, tmp_path / "cache"
        )
    (out / "plan.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    removed = remove_other_stages_files(out, ["P1", "P2"])
    assert removed == sorted(stage_file_paths("S1", out))
    assert sorted(p.name for p in out.iterdir()) == ["P1.args", "P1.json", "notes.txt", "plan.json"]
    assert remove_other_stages_files(out, ["P1"]) == [] and remove_other_stages_files(tmp_path / "none", []) == []


def test_missing_prefix_is_named_and_nothing_is_written(pool, tmp_path):
    root, _ = pool
    prefixes = scan_pool_prefixes(root)
    prefixes["train"]["C1"].append(("train/B3_C1/shard_07_tokens", 10))
    plan = plan_stage(stage({"C1": 1.0}), prefixes)
    out = tmp_path / "curriculum"
    with pytest.raises(FileNotFoundError, match="B3_C1/shard_07_tokens"):
        write_stage_files(plan, out, root, tmp_path / "cache")
    assert not out.exists() or list(out.iterdir()) == []


def test_files_are_deterministic(pool, tmp_path):
    root, _ = pool
    plan = plan_stage(curriculum_stages()[1], scan_pool_prefixes(root))
    first = [p.read_bytes() for p in write_stage_files(plan, tmp_path / "a", root, tmp_path / "cache")]
    again = plan_stage(curriculum_stages()[1], scan_pool_prefixes(root))
    assert json.dumps(again, sort_keys=True) == json.dumps(plan, sort_keys=True)
    second = [p.read_bytes() for p in write_stage_files(again, tmp_path / "a", root, tmp_path / "cache")]
    assert first == second
