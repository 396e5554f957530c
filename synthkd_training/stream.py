"""A curriculum stage of the sequence pool as the stream online KD trains on (docs/pool.md#the-stream).

`StageStream` is a map-style dataset: window `i` of a stage is the same on every machine and every run (the plan
is `synthkd_contract.stage_stream.plan_stream`, a function of the pool, the seed, the policy and the scorer
phases), so a run resumes at `consumed_samples` by index (`stream_batches`, Megatron's pretraining sampler's
order). Each window holds whole conversations only, packed best fit, each starting at position 0 of its own
segment:

- `tokens`, `labels` (`tokens` shifted by one within the conversation; the EOD's label is EOD, never learned);
- `loss_mask` (float) and `span_id` (0 prompt, 1 analysis, 2 final): the stored label-aligned arrays as they are;
- `position_ids`: 0, 1, ... restarting at every conversation (Megatron's `reset_position_ids`);
- `segment_ids`: the conversation's ordinal in the window, padding the next ordinal (`cu_seqlens` gives the
  boundaries packed attention kernels take);
- `attention_mask` (with `create_attention_mask`): [1, L, L], True where masked, causal within a conversation and
  nothing across (Megatron's `reset_attention_mask` convention).

Padding is EOD (199999, the contract's EOD and GPT-OSS's pad) with loss 0 and span 0. A stock Megatron-LM
`GPTDataset` would instead rewrite every token equal to its tokenizer's pad id to 0 and drop the loss there, and
reads only the `…_tokens` files: it trains on prompts and system text with no teacher (docs/pool.md#the-stream).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch

from synthkd_contract import constants
from synthkd_contract.buckets import CTX_BUCKETS, SKILL_BUCKETS
from synthkd_contract.sources import SOURCE_GROUPS
from synthkd_contract.stage_stream import (
    STAGE_TOKENIZER_ARGS,
    ScorerPhase,
    StageConversations,
    StageStreamError,
    StreamPlan,
    StreamPolicy,
    plan_stream,
    read_stage_conversations,
    stage_token_budget,
    stream_mix,
)
from synthkd_contract.trio import LOSSMASK_KIND, SPAN_KIND, TOKENS_KIND, open_trio
from synthkd_training.pool import stage_blends, valuation_parts
from synthkd_training.scorer import load_scorer

STREAM_MANIFEST_FORMAT = "synthkd.stream_sampling/1"
NULL_TOKENIZER = STAGE_TOKENIZER_ARGS[1]  # Megatron-LM's tokenizer of pre-tokenized data: eod = --vocab-size
HF_TOKENIZER = "HuggingFaceTokenizer"
GPT_OSS_MODEL = "gpt-oss"  # a --tokenizer-model naming GPT-OSS (openai/gpt-oss-20b, a local copy of it)


class StageArgsError(ValueError):
    """A stage's `.args` file that the stream cannot train from."""


@dataclass(frozen=True)
class StageArgs:
    """The data and tokenizer arguments of a curriculum stage, by Megatron-LM's command-line names.

    Attributes:
        per_split_data_args_path: the stage's `<stage>.json`.
        seq_length: a window's positions.
        train_samples: the stage's windows.
        data_cache_path: where Megatron-LM caches its indices (the stream keeps none).
        tokenizer_type, vocab_size: `NullTokenizer` with `--vocab-size 199999`: its EOD is 199999.
    """

    per_split_data_args_path: Path
    seq_length: int
    train_samples: int
    data_cache_path: Path | None
    tokenizer_type: str | None
    vocab_size: int | None


def stage_args_parser() -> argparse.ArgumentParser:
    """The Megatron-LM arguments a stage's `.args` file gives (other arguments are the run's, and left alone)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--per-split-data-args-path", type=Path, required=True)
    parser.add_argument("--seq-length", type=int, required=True)
    parser.add_argument("--train-samples", type=int, required=True)
    parser.add_argument("--data-cache-path", type=Path, default=None)
    parser.add_argument("--tokenizer-type", default=None)
    parser.add_argument("--vocab-size", type=int, default=None)
    parser.add_argument("--tokenizer-model", default=None)
    return parser


def tokenizer_problem(tokenizer_type: str | None, vocab_size: int | None, tokenizer_model: str | None) -> str | None:
    """Why Megatron-LM tokenizer arguments do not describe the data's ids (o200k_harmony, EOD 199999), or None.

    Accepted: none; `NullTokenizer` with `--vocab-size 199999` (what a stage's `.args` gives: its EOD is the vocab
    size); `HuggingFaceTokenizer` with a GPT-OSS `--tokenizer-model` (o200k_harmony; its pad is the EOD 199999,
    which the stream keeps as it is). Nothing is loaded: the data is already token ids.

    Args:
        tokenizer_type: `--tokenizer-type`.
        vocab_size: `--vocab-size`.
        tokenizer_model: `--tokenizer-model`.

    Returns:
        The problem, or None.
    """
    if tokenizer_type is None:
        return None
    if tokenizer_type == NULL_TOKENIZER and vocab_size == constants.EOD_TOKEN_ID:
        return None
    if tokenizer_type == HF_TOKENIZER and tokenizer_model is not None and GPT_OSS_MODEL in tokenizer_model.lower():
        return None
    return (
        f"--tokenizer-type {tokenizer_type} (--vocab-size {vocab_size}, --tokenizer-model {tokenizer_model}): the data "
        f"is o200k_harmony ids whose EOD is {constants.EOD_TOKEN_ID}; give {NULL_TOKENIZER} with --vocab-size "
        f"{constants.EOD_TOKEN_ID}, or {HF_TOKENIZER} with a GPT-OSS --tokenizer-model"
    )


def parse_stage_words(words: Sequence[str], where: str) -> tuple[StageArgs, list[str]]:
    """A stage's arguments among Megatron-LM command-line words, and the words left.

    Args:
        words: the command line's words.
        where: what they came from, for errors.

    Returns:
        The stage's data and tokenizer arguments, and the other words.

    Raises:
        StageArgsError: a required argument missing or not a number, or a tokenizer whose EOD is not the
            contract's.
    """
    try:
        known, rest = stage_args_parser().parse_known_args(list(words))
    except SystemExit:
        raise StageArgsError(
            f"{where}: not a stage's arguments (needs --per-split-data-args-path, --seq-length, --train-samples)"
        ) from None
    if known.seq_length < 1 or known.train_samples < 0:
        raise StageArgsError(f"{where}: --seq-length {known.seq_length}, --train-samples {known.train_samples}")
    if problem := tokenizer_problem(known.tokenizer_type, known.vocab_size, known.tokenizer_model):
        raise StageArgsError(f"{where}: {problem}")
    stage = StageArgs(
        per_split_data_args_path=known.per_split_data_args_path,
        seq_length=known.seq_length,
        train_samples=known.train_samples,
        data_cache_path=known.data_cache_path,
        tokenizer_type=known.tokenizer_type,
        vocab_size=known.vocab_size,
    )
    return stage, rest


def read_stage_args(path: Path | str) -> StageArgs:
    """A stage's `.args` file: `#` lines are comments, the rest shell words (`$(grep -v '^#' P1.args)`).

    Args:
        path: `<pool>/curriculum/<stage>.args`.

    Returns:
        The stage's data and tokenizer arguments.

    Raises:
        StageArgsError: unreadable, or what `parse_stage_words` refuses.
    """
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise StageArgsError(f"{path}: {error.strerror or error}") from None
    words = shlex.split(" ".join(line for line in lines if not line.lstrip().startswith("#")))
    return parse_stage_words(words, str(path))[0]


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class PoolUtilities:
    """A sealed scorer's utility of every pool row that has valuation features: read once, then given to every
    stage's stream (`phase`)."""

    utility: dict[str, float]
    """pool row id -> utility score."""
    tau: float
    """The scorer's own tau."""
    scorer_sha256: str
    """sha256 of the scorer's sealed manifest."""

    def phase(self, conversations: StageConversations, first_epoch: int = 0) -> ScorerPhase:
        """The utilities of a stage's conversations (NaN, weight 1, for one without features), from `first_epoch`."""
        values = np.asarray([self.utility.get(row_id, np.nan) for row_id in conversations.ids], dtype=np.float64)
        return ScorerPhase(first_epoch=first_epoch, utility=values, scorer_sha256=self.scorer_sha256)


def pool_utilities(scorer_dir: Path | str, valuation_root: Path | str) -> PoolUtilities:
    """A sealed scorer's utilities of the pool's rows, from the pool's sealed valuation features.

    Args:
        scorer_dir: `save_scorer`'s directory (verified by `load_scorer`).
        valuation_root: the pool's valuation features (verified by `valuation_parts`).

    Returns:
        Every featured row's utility, the scorer's tau and its manifest's sha256.

    Raises:
        ManifestError / PoolError: the scorer or the features do not verify.
    """
    scorer = load_scorer(scorer_dir)
    features = pl.concat([pl.read_parquet(part) for part in valuation_parts(valuation_root)], how="vertical_relaxed")
    utility = dict(zip(features["id"].to_list(), scorer.predict(features).astype(np.float64).tolist()))
    sha = file_sha256(Path(scorer_dir) / constants.MANIFEST_FILENAME)
    return PoolUtilities(utility=utility, tau=scorer.config.tau, scorer_sha256=sha)


def scorer_phase(
    scorer_dir: Path | str, valuation_root: Path | str, conversations: StageConversations, first_epoch: int = 0
) -> tuple[ScorerPhase, float]:
    """A sealed scorer's utilities for one stage's conversations (`pool_utilities(...).phase(...)`; for several
    stages, read the utilities once with `pool_utilities`).

    Args:
        scorer_dir: `save_scorer`'s directory (verified by `load_scorer`).
        valuation_root: the pool's valuation features (verified by `valuation_parts`).
        conversations: the stage's conversations.
        first_epoch: the first stream epoch that draws with them.

    Returns:
        The phase (a conversation without features gets NaN: weight 1) and the scorer's tau.

    Raises:
        ManifestError / PoolError: the scorer or the features do not verify.
    """
    utilities = pool_utilities(scorer_dir, valuation_root)
    return utilities.phase(conversations, first_epoch), utilities.tau


class StageStream(torch.utils.data.Dataset):
    """The windows of one curriculum stage (module docstring), after verifying the pool they come from.

    Args:
        stage_file: `<pool>/curriculum/<stage>.json`.
        seq_length: a window's positions.
        num_windows: that many windows; None: up to the token budget.
        token_budget: the real tokens the stream holds (it stops in the window that reaches them); None with
            `num_windows` None: the stage's own budget (`stage_token_budget`, the curriculum's plan).
        policy: the draw's settings; None: `StreamPolicy()`.
        scorer_phases: the scorers' utilities, by the epoch they start at.
        create_attention_mask: add the [1, L, L] mask (off for long windows: use `segment_ids` / `cu_seqlens`).
        hash_files: hash every trio file the stage names when verifying the pool.

    Raises:
        PoolError: the pool or the stage file does not verify.
        StageStreamError: the stage cannot be streamed.
    """

    def __init__(
        self,
        stage_file: Path | str,
        seq_length: int,
        num_windows: int | None = None,
        policy: StreamPolicy | None = None,
        scorer_phases: Sequence[ScorerPhase] = (),
        create_attention_mask: bool = True,
        hash_files: bool = True,
        token_budget: int | None = None,
    ) -> None:
        self.stage_file = Path(stage_file)
        stage_blends(self.stage_file, hash_files=hash_files)
        self.conversations = read_stage_conversations(self.stage_file)
        self.scorer_phases = tuple(scorer_phases)
        if num_windows is None and token_budget is None:
            token_budget = stage_token_budget(self.stage_file)
        self.num_windows, self.token_budget = num_windows, token_budget
        self.seq_length = seq_length
        self.plan: StreamPlan = self._planned(policy, self.scorer_phases)
        self.create_attention_mask = create_attention_mask
        self._trios: dict[int, dict] = {}
        self._causal: torch.Tensor | None = None

    @classmethod
    def from_args(cls, args: StageArgs, **kwargs: Any) -> StageStream:
        """The stream a stage's `.args` describe (`read_stage_args`), to the stage's token budget unless
        `num_windows` or `token_budget` is given."""
        return cls(args.per_split_data_args_path, args.seq_length, **kwargs)

    def _planned(self, policy: StreamPolicy | None, phases: Sequence[ScorerPhase]) -> StreamPlan:
        return plan_stream(
            self.conversations, self.seq_length, self.num_windows, policy, phases, token_budget=self.token_budget
        )

    def __len__(self) -> int:
        return len(self.plan)

    def redraw(self, policy: StreamPolicy, scorer_phases: Sequence[ScorerPhase] = ()) -> None:
        """Plan the stream again with another policy or scorers (before training on it: windows change).

        Args:
            policy: the draw's settings.
            scorer_phases: the scorers' utilities, by the epoch they start at.
        """
        self.scorer_phases = tuple(scorer_phases)
        self.plan = self._planned(policy, self.scorer_phases)

    def epoch_of(self, sample: int) -> int:
        """The stream epoch window `sample` belongs to."""
        starts = [record.first_window for record in self.plan.epochs]
        return max(0, int(np.searchsorted(starts, sample, side="right")) - 1)

    def switch_scorer(self, phase: ScorerPhase, consumed_samples: int) -> int:
        """Draw with a new scorer's utilities from the epoch after the one `consumed_samples` is in: the windows
        up to that epoch's end stay exactly as they were (a run that resumes finds what it trained on), and the
        switch is recorded in `sampling_manifest()`.

        Args:
            phase: the new scorer's utilities (`scorer_phase`); its `first_epoch` is replaced.
            consumed_samples: the windows trained on so far.

        Returns:
            The epoch the new scorer starts at.

        Raises:
            StageStreamError: the windows already drawn would change (never for a plan of the same inputs).
        """
        first_epoch = self.epoch_of(consumed_samples) + 1
        kept = self.plan.offsets[min(len(self.plan), self._first_window(first_epoch))]
        phases = (
            *[p for p in self.scorer_phases if p.first_epoch < first_epoch],
            replace(phase, first_epoch=first_epoch),
        )
        plan = self._planned(self.plan.policy, phases)
        if not np.array_equal(plan.conversations[:kept], self.plan.conversations[:kept]):
            raise StageStreamError("switching the scorer would change windows already drawn")
        self.plan, self.scorer_phases = plan, phases
        return first_epoch

    def _first_window(self, epoch: int) -> int:
        return self.plan.epochs[epoch].first_window if epoch < len(self.plan.epochs) else len(self.plan)

    def _trio(self, prefix_index: int) -> dict:
        if prefix_index not in self._trios:
            self._trios[prefix_index] = open_trio(self.conversations.prefixes[prefix_index])
        return self._trios[prefix_index]

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        length = self.seq_length
        tokens = np.full(length, constants.EOD_TOKEN_ID, dtype=np.int64)
        labels = np.full(length, constants.EOD_TOKEN_ID, dtype=np.int64)
        loss_mask = np.zeros(length, dtype=np.float32)
        span_id = np.zeros(length, dtype=np.int64)
        position_ids = np.zeros(length, dtype=np.int64)
        segment_ids = np.zeros(length, dtype=np.int64)
        at = 0
        window = self.plan.window(index)
        for ordinal, conversation in enumerate(window.tolist()):
            trio = self._trio(int(self.conversations.prefix[conversation]))
            document = int(self.conversations.document[conversation])
            text = np.asarray(trio[TOKENS_KIND][document], dtype=np.int64)
            n = min(len(text), length - at)  # less only for a conversation longer than the window, alone in it
            tokens[at : at + n] = text[:n]
            labels[at : at + n] = np.append(text[1:], constants.EOD_TOKEN_ID)[:n]
            loss_mask[at : at + n] = trio[LOSSMASK_KIND][document][:n]
            span_id[at : at + n] = trio[SPAN_KIND][document][:n]
            position_ids[at : at + n] = np.arange(n)
            segment_ids[at : at + n] = ordinal
            at += n
        position_ids[at:] = np.arange(length - at)
        segment_ids[at:] = len(window)
        item = {
            "tokens": torch.from_numpy(tokens),
            "labels": torch.from_numpy(labels),
            "loss_mask": torch.from_numpy(loss_mask),
            "span_id": torch.from_numpy(span_id),
            "position_ids": torch.from_numpy(position_ids),
            "segment_ids": torch.from_numpy(segment_ids),
        }
        if self.create_attention_mask:
            item["attention_mask"] = self._attention_mask(item["segment_ids"])
        return item

    def _attention_mask(self, segment_ids: torch.Tensor) -> torch.Tensor:
        """[1, L, L], True where masked: the causal mask, and every position blind to the segments before its own."""
        if self._causal is None:
            self._causal = torch.ones(self.seq_length, self.seq_length, dtype=torch.bool).triu(1)
        mask = self._causal.clone()
        for start in cu_seqlens(segment_ids)[1:-1].tolist():
            mask[start:, :start] = True
        return mask.unsqueeze(0)

    def sampling_manifest(self) -> dict[str, Any]:
        """What the stream draws and how (docs/pool.md#the-stream): the stage and pool it reads (sha256), the
        quota grid (each unit's target share), the policy (seed, tau, epsilon, cluster cap), the scorer of every
        epoch, and the mix its windows hold against the targets."""
        pool_root = self.stage_file.resolve().parent.parent
        unit, share = self.conversations.units()

        groups, ctxs = len(SOURCE_GROUPS), len(CTX_BUCKETS)
        grid = [
            {
                "skill_bucket": SKILL_BUCKETS[u // (ctxs * groups)],
                "ctx_bucket": CTX_BUCKETS[(u // groups) % ctxs],
                "source_group": SOURCE_GROUPS[u % groups],
                "target_share": float(share[u]),
            }
            for u in np.flatnonzero(share > 0).tolist()
        ]
        return {
            "format": STREAM_MANIFEST_FORMAT,
            "stage": self.stage_file.stem,
            "stage_file": str(self.stage_file),
            "stage_sha256": file_sha256(self.stage_file),
            "curriculum_plan_sha256": file_sha256(self.stage_file.parent / constants.CURRICULUM_PLAN_FILENAME),
            "pool_manifest_sha256": file_sha256(pool_root / constants.MANIFEST_FILENAME),
            "seq_length": self.seq_length,
            "windows": len(self),
            "token_budget": self.token_budget,
            "policy": self.plan.policy.to_dict(),
            "quota_grid": grid,
            "scorers": [
                {"first_epoch": phase.first_epoch, "scorer_sha256": phase.scorer_sha256} for phase in self.scorer_phases
            ],
            "epochs": [record.to_dict() for record in self.plan.epochs],
            "mix": stream_mix(self.plan, self.conversations),
        }


def cu_seqlens(segment_ids: torch.Tensor) -> torch.Tensor:
    """The segment boundaries of one window (0, end of segment 0, ..., L), int32, as packed attention takes them.

    Args:
        segment_ids: one window's `segment_ids`.

    Returns:
        The cumulative sequence lengths, padding a segment of its own.
    """
    ends = torch.nonzero(segment_ids[1:] != segment_ids[:-1]).flatten() + 1
    return torch.cat([torch.zeros(1, dtype=torch.int64), ends, torch.tensor([len(segment_ids)])]).to(torch.int32)


def stream_batches(
    length: int,
    micro_batch_size: int,
    consumed_samples: int = 0,
    data_parallel_rank: int = 0,
    data_parallel_size: int = 1,
    drop_last: bool = True,
) -> Iterator[list[int]]:
    """The sample indices of each micro batch from `consumed_samples` on, in Megatron-LM's pretraining sampler's
    order: global batches of `micro_batch_size * data_parallel_size` consecutive samples, each rank its slice; a
    last incomplete global batch is dropped unless `drop_last` is False (as `MegatronPretrainingSampler`'s), when
    each rank gets what is left of its slice (nothing when that is empty).

    Args:
        length: the stream's windows.
        micro_batch_size: samples per rank per step.
        consumed_samples: samples every rank together has consumed (a resumed run's count).
        data_parallel_rank, data_parallel_size: this rank and the ranks.
        drop_last: drop a last incomplete global batch (a stage trained to its budget keeps it).

    Yields:
        This rank's micro batch indices.

    Raises:
        ValueError: a bad size or rank, or consumed_samples outside the stream.
    """
    if micro_batch_size < 1 or data_parallel_size < 1 or not 0 <= data_parallel_rank < data_parallel_size:
        raise ValueError(f"micro_batch_size {micro_batch_size}, rank {data_parallel_rank} of {data_parallel_size}")
    if not 0 <= consumed_samples <= length:
        raise ValueError(f"consumed_samples {consumed_samples} is outside the stream's {length} samples")
    global_batch = micro_batch_size * data_parallel_size
    for start in range(consumed_samples, length - global_batch + 1 if drop_last else length, global_batch):
        first = start + data_parallel_rank * micro_batch_size
        if batch := list(range(first, min(first + micro_batch_size, length))):
            yield batch


RUN_MANIFEST_FORMAT = "synthkd.run_sampling/1"
SAMPLING_MANIFEST_FILENAME = "sampling_manifest.json"  # beside a checkpoint (export_run_manifests)
DATA_MANIFEST_FILENAME = "data_manifest.json"  # beside a checkpoint: the pool's sealed manifest, as it was


def write_sampling_manifest(path: Path | str, stages: Sequence[tuple[StageStream, int]]) -> Path:
    """A run's sampling manifest: every stage's `sampling_manifest()` and the samples it consumed, in the order
    trained, as JSON written to a temporary file and renamed into place.

    Args:
        path: where (a training run's directory, never inside the sealed pool).
        stages: (stream, consumed samples) per stage, in order.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    manifest = {
        "format": RUN_MANIFEST_FORMAT,
        "stages": [{**stream.sampling_manifest(), "consumed_samples": consumed} for stream, consumed in stages],
    }
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    partial.replace(path)
    return path


def export_run_manifests(directory: Path | str, stages: Sequence[tuple[StageStream, int]]) -> list[Path]:
    """The full data and sampling manifest beside a checkpoint (002's export): `sampling_manifest.json` (every
    stage, what it drew and consumed) and `data_manifest.json`, the pool's sealed manifest the stages were read
    from (its sha256 is each stage's `pool_manifest_sha256`).

    Args:
        directory: the checkpoint's directory.
        stages: (stream, consumed samples) per stage, in order.

    Returns:
        The two paths.
    """
    directory = Path(directory)
    pool_manifest = stages[0][0].stage_file.resolve().parent.parent / constants.MANIFEST_FILENAME
    data = directory / DATA_MANIFEST_FILENAME
    partial = data.with_name(f".{data.name}.partial")
    partial.write_bytes(pool_manifest.read_bytes())
    partial.replace(data)
    return [write_sampling_manifest(directory / SAMPLING_MANIFEST_FILENAME, stages), data]
