"""Curriculum stages (docs/pool.md#curriculum) as the data arguments a stock Megatron-LM run takes.

A stage says which share of its token budget comes from each context bucket (P1: C1 only, 300M tokens at
sequence length 2048; P2: 80% C1 + 20% C2 at 8192; ...). Megatron blends *prefixes* with weights, so the
pool is laid out with one trio per (skill, ctx) cell and shard, beside synth_kd_v1 (whose files stay as
they are):

    data/megatron/synth_pool_v1/{train,valid}/<B>_<C>/shard_XX_{tokens,lossmask,span}.{bin,idx}

and the Megatron prefix of a cell shard is `<split>/<B>_<C>/shard_XX_tokens` under that root.

Weights. Inside one split, prefix p of ctx bucket c gets `share_c * tokens_p / tokens_c` (tokens_c: the
tokens of all of c's prefixes in that split). They sum to 1 over the stage; Megatron's `BlendedDataset`
draws samples by weight, and a GPT sample is always `seq_length` tokens packed across documents, so sample
shares are token shares: the blend reproduces the stage's ctx shares on tokens, and inside each ctx bucket
every cell and shard keeps its own token share, i.e. the bucket's skill mix as the quota grid left it
(the skill mix is the quota plan's job, the ctx mix the curriculum's: docs/pool.md#the-quota-grid-on-tokens). The valid
blend uses the same rule over the valid tokens; a ctx bucket without valid tokens is left out of it (noted).

Budget. Megatron-LM counts training in samples of `--seq-length` tokens, so the token budget becomes
`expected_sequences = ceil(tokens / seq_length)` (P1: ceil(300e6 / 2048) = 146,485), passed as
`--train-samples` (overshoot < one sequence). Where a ctx bucket holds fewer tokens than its share of the
budget, Megatron repeats it (its GPTDataset builds more epochs): `epochs_needed = share * budget / tokens`
says how many, per bucket. A bucket with share > 0 and no train tokens makes the stage infeasible: no data
arguments at all rather than a blend that silently drops that bucket's share.

Files, per stage that is feasible and has a budget > 0 (`write_stage_files`; the files of a stage no longer
configured are removed, `remove_other_stages_files`):

- `<stage>.json`: the `--per-split-data-args-path` file, exactly the keys Megatron-LM's
  `get_blend_and_blend_per_split` reads: {"train": [w, prefix, ...], "valid": [...] or null, "test": null},
  prefixes absolute;
- `<stage>.args`: comment lines (`STAGE_ARGS_HEADER`: a stock run ignores the masks and spans), then one line,
  `--per-split-data-args-path <abs>/<stage>.json --seq-length N --train-samples S --data-cache-path <abs cache
  dir> --tokenizer-type NullTokenizer --vocab-size 199999` (shell-quoted), to append to a `pretrain_gpt.py`
  command line (`$(grep -v '^#' P1.args)`) or give to the stream (docs/pool.md#the-stream). The cache directory
  (`stage_cache_dir`) is the building user's, outside the data root: Megatron-LM's default, next to the `.bin`
  files, writes index caches into the sealed pool, which then no longer verifies, and a cache in a shared root is
  one anyone can plant a pickle in (megatron-core loads it with `allow_pickle=True`).

Why per-split and not `--data-path`: Megatron-LM given `--data-path` without `--split` falls back to
`--split 969,30,1` and carves validation and test out of the *train* blend, leaving the pool's own valid
split (the 000 hash split) unused. With `--per-split-data-args-path` the train and valid blends are
explicit; do not also pass `--split` (megatron-core asserts "split and blend_per_split are incompatible")
or `--train-iters` (Megatron-LM takes one of `--train-iters` / `--train-samples`; with samples, give the
LR schedule in samples too: `--lr-decay-samples`, `--lr-warmup-samples`). Model and run arguments
(`--max-position-embeddings` >= the stage's `--seq-length`, batch sizes, tokenizer) are the run's, not the
data's. The plan still carries `data_path`, the train blend
as the string `--data-path` takes, for a run that prefers it together with `--split 100,0,0`.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Any

import numpy as np

from synthkd_assets.core.atomic import atomic_write_text
from synthkd_assets.core.layout import CURRICULUM_PLAN_FILENAME
from synthkd_assets.core.ownership import remove_replaced_output
from synthkd_contract.buckets import CTX_BUCKETS, CURRICULUM_STAGES, SKILL_BUCKETS
from synthkd_contract.constants import SPLITS
from synthkd_contract.indexed_dataset import read_index
from synthkd_contract.stage_stream import (
    STAGE_ARGS_HEADER,
    STAGE_TOKENIZER_ARGS,
    StreamPolicy,
    plan_stream,
    read_stage_conversations,
    stream_mix,
)
from synthkd_contract.trio import megatron_cache_dir

# the splits of Megatron's blend_per_split, in its order (megatron.core.datasets.utils.Split)
MEGATRON_SPLITS = ("train", "valid", "test")
TRAIN_SPLIT, VALID_SPLIT = SPLITS
SHARE_TOLERANCE = 1e-9  # a stage's ctx shares must sum to 1 within this
STAGE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")  # it names files: <stage>.json / <stage>.args
STAGE_FILE_SUFFIXES = (".json", ".args")
PLAN_STEM = PurePosixPath(CURRICULUM_PLAN_FILENAME).stem  # no stage may be called this: its .json is the plan
CELL_DIR = re.compile(r"(B\d+)_(C\d+)")
TOKENS_PREFIX_GLOB = "shard_*_tokens.idx"

Prefixes = Mapping[str, Mapping[str, Sequence[tuple[str, int]]]]  # split -> ctx -> [(prefix, tokens)]


@dataclass(frozen=True)
class CurriculumStage:
    """One curriculum stage (docs/pool.md#curriculum): where its tokens come from, how many, at which sequence
    length."""

    stage: str
    """Its name (P1, ...); also the stem of its files, so letters, digits, '_' and '-' only."""
    ctx_mix: Mapping[str, float]
    """ctx bucket -> share of the stage's tokens; keys in CTX_BUCKETS, shares >= 0 summing to 1."""
    tokens: int
    """The token budget (0 disables the stage: nothing is written for it)."""
    seq_length: int
    """Megatron's --seq-length for the stage."""
    optional: bool = False
    """An optional stage (P4) is reported like the others; the flag is for the reader of the plan."""

    def __post_init__(self) -> None:
        name = f"curriculum stage {self.stage!r}"
        if not isinstance(self.stage, str) or not STAGE_NAME.fullmatch(self.stage):
            raise ValueError(f"{name}: the name must match {STAGE_NAME.pattern} (it names the stage's files)")
        if self.stage == PLAN_STEM:
            raise ValueError(f"{name}: the name is taken by {CURRICULUM_PLAN_FILENAME}, every stage's plan")
        unknown = sorted(set(self.ctx_mix) - set(CTX_BUCKETS))
        if unknown:
            raise ValueError(f"{name}: ctx_mix names unknown ctx buckets {unknown}; expected some of {CTX_BUCKETS}")
        for ctx, share in self.ctx_mix.items():
            if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
                raise ValueError(f"{name}: ctx_mix[{ctx!r}] = {share!r} is not a share in [0, 1]")
        total = math.fsum(self.ctx_mix.values())
        if abs(total - 1.0) > SHARE_TOLERANCE:
            raise ValueError(f"{name}: ctx_mix shares sum to {total!r}, not 1")
        for attr, low in (("tokens", 0), ("seq_length", 1)):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}: {attr} = {value!r} is not an integer >= {low}")
        if not isinstance(self.optional, bool):
            raise ValueError(f"{name}: optional = {self.optional!r} is not a bool")
        # a private, read-only copy in CTX_BUCKETS order: the stage stays immutable, its dict form order-free
        ordered = {c: float(self.ctx_mix[c]) for c in CTX_BUCKETS if c in self.ctx_mix}
        object.__setattr__(self, "ctx_mix", MappingProxyType(ordered))

    def share(self, ctx: str) -> float:
        return self.ctx_mix.get(ctx, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "ctx_mix": dict(self.ctx_mix),
            "tokens": self.tokens,
            "seq_length": self.seq_length,
            "optional": self.optional,
        }


def curriculum_stages(config: Sequence[Mapping[str, Any]] = CURRICULUM_STAGES) -> tuple[CurriculumStage, ...]:
    """The stages of a curriculum config (default: the contract's P1-P4), validated, in the config's order.

    Each entry holds exactly the fields of CurriculumStage; stage names must be unique (they name files)."""
    stages = []
    names: set[str] = set()
    for index, entry in enumerate(config):
        keys = set(entry)
        expected = {"stage", "ctx_mix", "tokens", "seq_length", "optional"}
        if not {"stage", "ctx_mix", "tokens", "seq_length"} <= keys <= expected:
            raise ValueError(f"curriculum entry {index}: keys {sorted(keys)}, expected {sorted(expected)}")
        stage = CurriculumStage(
            stage=entry["stage"],
            ctx_mix=dict(entry["ctx_mix"]),
            tokens=entry["tokens"],
            seq_length=entry["seq_length"],
            optional=entry.get("optional", False),
        )
        if stage.stage in names:
            raise ValueError(f"curriculum entry {index}: stage {stage.stage!r} appears twice")
        names.add(stage.stage)
        stages.append(stage)
    return tuple(stages)


def _checked_prefixes(prefixes: Prefixes) -> tuple[dict[str, dict[str, list[tuple[str, int]]]], list[str]]:
    """split -> ctx -> sorted [(prefix, tokens > 0)], every split and ctx present; and notes on what was left out."""
    unknown_splits = sorted(set(prefixes) - set(SPLITS))
    if unknown_splits:
        raise ValueError(f"prefixes: unknown splits {unknown_splits}; expected some of {SPLITS}")
    table: dict[str, dict[str, list[tuple[str, int]]]] = {}
    notes = []
    seen: set[str] = set()
    for split in SPLITS:
        by_ctx = prefixes.get(split, {})
        unknown = sorted(set(by_ctx) - set(CTX_BUCKETS))
        if unknown:
            raise ValueError(f"prefixes[{split!r}]: unknown ctx buckets {unknown}; expected some of {CTX_BUCKETS}")
        table[split] = {}
        for ctx in CTX_BUCKETS:
            kept = []
            for prefix, tokens in sorted(by_ctx.get(ctx, ())):  # notes in prefix order, whatever the input's
                path = PurePosixPath(prefix)
                if not prefix or path.is_absolute() or ".." in path.parts or str(path) != prefix:
                    raise ValueError(f"prefix {prefix!r}: expected a normalized path relative to the dataset root")
                if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
                    raise ValueError(f"prefix {prefix!r}: tokens = {tokens!r} is not an integer >= 0")
                if prefix in seen:
                    raise ValueError(f"prefix {prefix!r} is listed twice")
                seen.add(prefix)
                if tokens == 0:  # megatron-core cannot memory-map an empty .bin, and its weight would be 0
                    notes.append(f"{split}/{ctx}: prefix {prefix} holds no tokens and is left out")
                else:
                    kept.append((prefix, tokens))
            table[split][ctx] = sorted(kept)
    return table, notes


def _blend(stage: CurriculumStage, by_ctx: Mapping[str, Sequence[tuple[str, int]]]) -> list[float | str] | None:
    """[w, prefix, w, prefix, ...] over the ctx buckets with a share (w = share x prefix tokens / ctx tokens)."""
    blend: list[float | str] = []
    for ctx in CTX_BUCKETS:
        share = stage.share(ctx)
        total = sum(tokens for _, tokens in by_ctx[ctx])
        if share <= 0 or total == 0:
            continue
        for prefix, tokens in by_ctx[ctx]:
            blend += [share * tokens / total, prefix]
    return blend or None


def plan_stage(stage: CurriculumStage, prefixes: Prefixes) -> dict[str, Any]:
    """The stage's data plan: budget, per-ctx availability and epochs, and its Megatron blends.

    `prefixes`: split ("train" / "valid") -> ctx bucket -> [(prefix relative to the dataset root, tokens)];
    prefixes with 0 tokens are left out (noted). The result is JSON-able and does not depend on the order of
    `prefixes` (see the module docstring for the weights and the budget):

    {"stage", "optional", "ctx_mix", "tokens", "seq_length", "expected_sequences", "enabled",
     "ctx": {C: {"share", "target_tokens", "available_tokens", "valid_tokens", "prefixes": {"train", "valid"},
                 "epochs_needed"}} for every ctx bucket,
     "feasible", "infeasible": [{"ctx", "share", "reason"}], "reason", "notes",
     "per_split_data_args": {"train": [w, p, ...], "valid": [...] | None, "test": None} | None,
     "data_path": "w p w p ..." | None}
    """
    table, notes = _checked_prefixes(prefixes)
    ctx_plan = {}
    infeasible = []
    for ctx in CTX_BUCKETS:
        share = stage.share(ctx)
        available = sum(tokens for _, tokens in table[TRAIN_SPLIT][ctx])
        target = share * stage.tokens
        ctx_plan[ctx] = {
            "share": share,
            "target_tokens": target,
            "available_tokens": available,
            "valid_tokens": sum(tokens for _, tokens in table[VALID_SPLIT][ctx]),
            "prefixes": {split: len(table[split][ctx]) for split in SPLITS},
            "epochs_needed": target / available if available else None,
        }
        if share > 0 and available == 0:
            infeasible.append(
                {"ctx": ctx, "share": share, "reason": f"{ctx} has share {share} in {stage.stage} but no train tokens"}
            )
        elif share > 0 and target > available:
            epochs = target / available
            notes.append(f"{ctx}: {available} train tokens for a target of {target:.0f}: {epochs:.2f} epochs")
        if share > 0 and available and not table[VALID_SPLIT][ctx]:
            notes.append(f"{ctx}: no valid tokens; the valid blend leaves it out")
    feasible = not infeasible
    enabled = stage.tokens > 0
    reasons = [] if enabled else [f"{stage.stage} has a budget of 0 tokens: nothing to train on"]
    reasons += [] if feasible else ["infeasible: " + "; ".join(item["reason"] for item in infeasible)]
    reason = "; ".join(reasons) or None
    per_split = None
    data_path = None
    if reason is None:
        train = _blend(stage, table[TRAIN_SPLIT])
        valid = _blend(stage, table[VALID_SPLIT])
        if valid is None:
            notes.append("no valid tokens in any ctx bucket of the stage: the valid blend is null (no evaluation)")
        per_split = {"train": train, "valid": valid, "test": None}
        data_path = blend_string(train)
    return {
        **stage.to_dict(),
        "expected_sequences": math.ceil(stage.tokens / stage.seq_length),
        "enabled": enabled,
        "ctx": ctx_plan,
        "feasible": feasible,
        "infeasible": infeasible,
        "reason": reason,
        "notes": notes,
        "per_split_data_args": per_split,
        "data_path": data_path,
    }


def blend_string(blend: Sequence[float | str]) -> str:
    """A blend list as the space-separated string `--data-path` (and a per-split JSON string) takes.

    Weights are written with repr, which float() reads back exactly."""
    return " ".join(repr(item) if isinstance(item, float) else str(item) for item in blend)


def absolute_blend(blend: Sequence[float | str] | None, dataset_root: Path) -> list[float | str] | None:
    """The blend with each prefix made absolute under `dataset_root` (weights unchanged)."""
    if blend is None:
        return None
    root = dataset_root.absolute()
    return [item if isinstance(item, float) else str(root / item) for item in blend]


def stage_cache_dir(pool_name: str, environ: Mapping[str, str] | None = None) -> Path:
    """The `--data-cache-path` of the pool's stage files: the per-user megatron-core index cache
    (`synthkd_contract.trio.megatron_cache_dir`: `$SYNTHKD_CACHE_DIR`, else `$XDG_CACHE_HOME/synthkd`, else
    `~/.cache/synthkd`), one directory per pool, never inside the shared data root.

    Args:
        pool_name: the pool's dataset name (full or smoke build).
        environ: the environment to read; None: the process's.

    Returns:
        The absolute cache directory.
    """
    return (megatron_cache_dir() if environ is None else megatron_cache_dir(environ)) / pool_name


def stage_file_paths(stage: str, out_dir: Path) -> tuple[Path, Path]:
    """(<out_dir>/<stage>.json, <out_dir>/<stage>.args)."""
    json_suffix, args_suffix = STAGE_FILE_SUFFIXES
    return out_dir / f"{stage}{json_suffix}", out_dir / f"{stage}{args_suffix}"


def stage_files(out_dir: Path) -> list[Path]:
    """Every stage file (`<name>.json`, `<name>.args`) in `out_dir`: not the plan, nor any other file."""
    if not out_dir.is_dir():
        return []
    return [
        path
        for path in sorted(out_dir.iterdir())
        if path.is_file() and path.suffix in STAGE_FILE_SUFFIXES and path.name != CURRICULUM_PLAN_FILENAME
    ]


def remove_other_stages_files(out_dir: Path, stages: Sequence[str]) -> list[Path]:
    """Remove the stage files of every stage not in `stages` (one taken out of the configured curriculum) and
    return them: their blends would name prefixes the pool may no longer have, and the pool manifest seals every
    file of the directory. The plan, any other file and any file the build did not write (core/ownership.py)
    stay."""
    return remove_replaced_output(path for path in stage_files(out_dir) if path.stem not in stages)


def write_stage_files(plan: Mapping[str, Any], out_dir: Path, dataset_root: Path, cache_dir: Path) -> list[Path]:
    """Write the stage's `<stage>.json` and `<stage>.args` into `out_dir` (each atomically); return their paths.

    A plan without data arguments (infeasible, or a 0-token budget) writes nothing and removes the stage's
    files left by an earlier build, so no stale blend is ever on disk. Every prefix must exist under
    `dataset_root` as an IndexedDataset (its .bin and .idx) before anything is written: a FileNotFoundError
    names the missing ones."""
    json_path, args_path = stage_file_paths(plan["stage"], out_dir)
    per_split = plan["per_split_data_args"]
    if per_split is None:
        remove_replaced_output([json_path, args_path])
        return []
    absolute = {split: absolute_blend(per_split[split], dataset_root) for split in MEGATRON_SPLITS}
    missing = [
        prefix
        for blend in absolute.values()
        for prefix in (blend or [])[1::2]
        if not all(Path(f"{prefix}{ext}").is_file() for ext in (".bin", ".idx"))
    ]
    if missing:
        raise FileNotFoundError(f"stage {plan['stage']}: no IndexedDataset (.bin + .idx) at prefixes {missing}")
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(json_path, json.dumps(absolute, indent=1) + "\n")
    args = [
        "--per-split-data-args-path",
        str(json_path.absolute()),
        "--seq-length",
        str(plan["seq_length"]),
        "--train-samples",
        str(plan["expected_sequences"]),
        "--data-cache-path",
        str(cache_dir.absolute()),
        *STAGE_TOKENIZER_ARGS,
    ]
    header = "".join(f"# {line}\n" for line in STAGE_ARGS_HEADER)
    atomic_write_text(args_path, header + shlex.join(args) + "\n")
    return [json_path, args_path]


def stage_stream_report(
    stage_file: Path, plan: Mapping[str, Any], parts_read: MutableMapping[Path, Any] | None = None
) -> dict[str, Any]:
    """What the stage's stream (docs/pool.md#the-stream) holds with the default policy: its windows' tokens by skill
    bucket, ctx bucket and source group against the stage's targets, the share of real tokens, the conversations
    longer than the window.

    Args:
        stage_file: the stage's `.json`, written (`write_stage_files`) beside the pool's parts and trios.
        plan: the stage's plan (`plan_stage`): its `seq_length` and token budget (`tokens`).
        parts_read: the pool parts read for an earlier stage's report (`read_stage_conversations`).

    Returns:
        The policy and `stream_mix`'s report.
    """
    conversations = read_stage_conversations(stage_file, parts_read)
    policy = StreamPolicy()
    stream = plan_stream(conversations, plan["seq_length"], None, policy, token_budget=plan["tokens"])
    return {"policy": policy.to_dict(), **stream_mix(stream, conversations)}


def scan_pool_prefixes(dataset_root: Path) -> dict[str, dict[str, list[tuple[str, int]]]]:
    """`plan_stage`'s `prefixes` from a pool on disk: every `<split>/<B>_<C>/shard_XX_tokens` trio's token count.

    Token counts come from each tokens `.idx` (the sum of its sequence lengths, read as megatron-core's
    IndexedDataset reads them, without importing it: `synthkd_contract.indexed_dataset.read_index`), the number
    Megatron itself will sample from."""
    prefixes: dict[str, dict[str, list[tuple[str, int]]]] = {}
    for split in SPLITS:
        by_ctx: dict[str, list[tuple[str, int]]] = {}
        split_dir = dataset_root / split
        cells = sorted(split_dir.iterdir()) if split_dir.is_dir() else []
        for cell in cells:
            match = CELL_DIR.fullmatch(cell.name)
            if not cell.is_dir() or match is None:
                continue
            skill, ctx = match.groups()
            if skill not in SKILL_BUCKETS or ctx not in CTX_BUCKETS:
                raise ValueError(f"{cell}: not a cell of {SKILL_BUCKETS} x {CTX_BUCKETS}")
            for idx in sorted(cell.glob(TOKENS_PREFIX_GLOB)):
                prefix = idx.with_suffix("")
                tokens = int(read_index(prefix).sequence_lengths.sum(dtype=np.int64))
                by_ctx.setdefault(ctx, []).append((prefix.relative_to(dataset_root).as_posix(), tokens))
        prefixes[split] = by_ctx
    return prefixes
