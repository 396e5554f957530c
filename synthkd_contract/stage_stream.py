"""A curriculum stage as the curated stream of online KD (docs/pool.md#the-stream): which conversations, in which
order, packed into which windows.

A stage file (`<pool>/curriculum/<stage>.json`) weights the pool's cell trios (`train/<B>_<C>/shard_XX_tokens`)
so that the stage's tokens follow its ctx shares and, within each ctx bucket, the pool's skill mix. The stream
holds those shares on the tokens it actually yields, and never cuts a conversation:

1. **Quota units.** Every conversation of the stage's train blend belongs to one unit (skill bucket, ctx bucket,
   source group); a unit's share of the stage's tokens is its cell's blend weight split over the groups by their
   tokens in that cell. Skill, ctx and source-group shares then all follow from the units' shares.
2. **Stream epochs.** Epoch e has a token budget E_e: the largest at which every unit can fill its share from its
   conversations (after the cluster cap), so the scarcest unit is used once per epoch and the others partly.
   Unit u takes `share_u * E_e` tokens (plus what it fell short by in earlier epochs) from the front of its epoch
   order. The order is a weighted draw without replacement (Efraimidis-Spirakis keys) with
   `sampling_weight = exp(tau * utility_score)`; a share `epsilon` of the draws are uniform (the diversity tail);
   at most `cluster_cap` conversations of one near-duplicate cluster per epoch. The scorer whose utilities an
   epoch uses is fixed for the whole epoch: a new scorer takes effect at the next epoch (`ScorerPhase`).
3. **Interleaving.** An epoch's picks are merged unit by unit in proportion to their shares (each pick at its
   unit's token time `tokens before it / share`), so any stretch of the stream holds the mix, not only its whole.
4. **Packing.** The merged order is cut into chunks of about `chunk_windows` windows' tokens; each chunk is packed
   best-fit decreasing into windows of `seq_length` positions, whole conversations only, and its windows are
   shuffled. A conversation longer than the window gets a window of its own, cut at the window's end (counted:
   `long_conversations`): no supervised token is ever in a window without its prompt.

Everything is a function of the conversations, the seed, the policy and the scorer phases: the same inputs give
the same windows on every machine, so a run resumes at `consumed_samples` by index, as Megatron's samplers do.
numpy only: the build (`synth_curriculum`, which reports each stage's mix) and training (`synthkd_training.stream`,
which reads the windows) share it.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from synthkd_contract import constants
from synthkd_contract.buckets import CTX_BUCKETS, SKILL_BUCKETS
from synthkd_contract.indexed_dataset import read_index
from synthkd_contract.sources import SOURCE_GROUPS, dataset_group
from synthkd_contract.splits import assign_split
from synthkd_contract.trio import TOKENS_SUFFIX

TRAIN_SPLIT = constants.SPLITS[0]
SHARD_RECORDS_DIR = "shards"  # <pool>/shards/shard_XX.json: each pool shard's part and trios
TRIO_ROOT = "megatron"  # <pool>/megatron/<split>/<cell>/shard_XX_*
PART_COLUMNS = ("id", "source_dataset", "source_example_id", "skill_bucket", "ctx_bucket", "sequence_tokens")
CLUSTER_COLUMN = "cluster_id"
NO_CLUSTER = -1  # a conversation outside every cluster (the cap never applies)
MIX_TOLERANCE_PP = 1.0  # docs/pool.md#the-stream: each share within 1 percentage point of its target


# the tokenizer arguments of a stage's `.args`, by Megatron-LM's names: pre-tokenized o200k_harmony ids, whose EOD is
# 199999 (a NullTokenizer's EOD is its --vocab-size); no tokenizer is loaded
STAGE_TOKENIZER_ARGS = ("--tokenizer-type", "NullTokenizer", "--vocab-size", str(constants.EOD_TOKEN_ID))
# the comment lines a stage's `.args` starts with (`$(grep -v '^#' P1.args)` gives the arguments alone)
STAGE_ARGS_HEADER = (
    "A curriculum stage of the sequence pool (docs/pool.md#the-stream). Train on it with its loss masks and spans:",
    "  python examples/train_online_kd.py --stage-args <this file> --teacher-checkpoint <teacher> ...",
    "A stock Megatron-LM pretrain_gpt.py given these arguments, $(grep -v '^#' <this file>), reads only the",
    "..._tokens files: it ignores the loss masks and spans, trains plain next-token loss on the prompts and system",
    "text, with no teacher, and cuts conversations across its samples. With GPT-OSS's tokenizer (pad = EOD = 199999)",
    "its GPTDataset also rewrites every EOD to id 0 and drops the loss there.",
)


class StageStreamError(ValueError):
    """A stage file, or the pool beside it, that the stream cannot be made from."""


@dataclass(frozen=True)
class StreamPolicy:
    """How a stage's conversations are drawn (docs/pool.md#the-stream).

    Attributes:
        seed: every random draw's seed.
        tau: the temperature of `sampling_weight = exp(tau * utility_score)`; 0 draws uniformly.
        epsilon: the share of draws that ignore the weights (the diversity tail), in [0, 1].
        cluster_cap: the most conversations of one near-duplicate cluster in one epoch; None: no cap.
        chunk_windows: about how many windows are packed together (best fit needs choice; the mix holds per chunk).
    """

    seed: int = 0
    tau: float = 0.0
    epsilon: float = 0.0
    cluster_cap: int | None = None
    chunk_windows: int = 512

    def __post_init__(self) -> None:
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if not math.isfinite(self.tau):
            raise ValueError(f"tau must be finite, got {self.tau}")
        if not (0.0 <= self.epsilon <= 1.0):
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")
        if self.cluster_cap is not None and self.cluster_cap < 1:
            raise ValueError(f"cluster_cap must be >= 1 or None, got {self.cluster_cap}")
        if self.chunk_windows < 1:
            raise ValueError(f"chunk_windows must be >= 1, got {self.chunk_windows}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ScorerPhase:
    """Utilities from one scorer, used from stream epoch `first_epoch` on (until a later phase starts).

    Attributes:
        first_epoch: the first epoch that uses them.
        utility: one utility_score per conversation of the stage (`StageConversations` order); NaN: none (weight 1).
        scorer_sha256: the sealed scorer's sha256 (recorded in the sampling manifest); None: no scorer.
    """

    first_epoch: int
    utility: np.ndarray
    scorer_sha256: str | None = None


class PoolIds(Sequence[str]):
    """The pool row ids of a stage's conversations, held as one Arrow string array (a Python `str` each would
    cost ~4x its bytes at a pool of millions of rows); read as a sequence of `str`.

    Args:
        ids: the ids, in the conversations' order.
    """

    ITER_ROWS = 1 << 16  # ids made `str` at a time while iterating

    def __init__(self, ids: pa.Array | pa.ChunkedArray) -> None:
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks() if ids.num_chunks else pa.array([], pa.large_string())
        self.array = ids.cast(pa.large_string())

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index):  # noqa: ANN001, ANN204 - Sequence's int / slice overloads
        if isinstance(index, slice):
            return self.array[index].to_pylist()
        return self.array[index].as_py()

    def __iter__(self) -> Iterator[str]:
        for start in range(0, len(self.array), self.ITER_ROWS):
            yield from self.array.slice(start, self.ITER_ROWS).to_pylist()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PoolIds):
            return self.array.equals(other.array)
        return isinstance(other, Sequence) and not isinstance(other, str) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment] - mutable-looking, compared by value

    def __repr__(self) -> str:
        return f"PoolIds({len(self)} ids)"


@dataclass(frozen=True)
class StageConversations:
    """The train conversations of one stage, one entry per conversation, in the stage file's prefix order.

    Attributes:
        prefixes: the stage's train tokens prefixes (absolute), as its file lists them.
        prefix: the index into `prefixes` of each conversation's trio.
        document: its document index in that trio.
        length: its tokens, EOD included.
        skill, ctx, group: indices into SKILL_BUCKETS, CTX_BUCKETS, SOURCE_GROUPS.
        cluster: its near-duplicate cluster (NO_CLUSTER: none).
        ids: its pool row `id` (a sequence of `str`).
        prefix_weight: each prefix's weight in the stage file (they sum to 1).
    """

    prefixes: tuple[str, ...]
    prefix: np.ndarray
    document: np.ndarray
    length: np.ndarray
    skill: np.ndarray
    ctx: np.ndarray
    group: np.ndarray
    cluster: np.ndarray
    ids: PoolIds
    prefix_weight: np.ndarray

    def __len__(self) -> int:
        return len(self.length)

    def units(self) -> tuple[np.ndarray, np.ndarray]:
        """Each conversation's quota unit and each unit's share of the stage's tokens.

        Returns:
            (unit of every conversation, share of every unit), units numbered (skill, ctx, group) row-major; the
            shares sum to 1 over the units that hold conversations.
        """
        unit = (self.skill.astype(np.int64) * len(CTX_BUCKETS) + self.ctx) * len(SOURCE_GROUPS) + self.group
        count = len(SKILL_BUCKETS) * len(CTX_BUCKETS) * len(SOURCE_GROUPS)
        cell = unit // len(SOURCE_GROUPS)
        # a cell's weight is the sum of its prefixes' weights; its groups split it by their tokens
        prefix_cell = np.zeros(len(self.prefixes), dtype=np.int64)
        prefix_cell[self.prefix] = cell
        cell_weight = np.bincount(prefix_cell, weights=self.prefix_weight, minlength=count // len(SOURCE_GROUPS))
        unit_tokens = np.bincount(unit, weights=self.length, minlength=count)
        cell_tokens = np.bincount(cell, weights=self.length, minlength=count // len(SOURCE_GROUPS))
        unit_cell = np.arange(count) // len(SOURCE_GROUPS)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(
                cell_tokens[unit_cell] > 0, cell_weight[unit_cell] * unit_tokens / cell_tokens[unit_cell], 0.0
            )
        return unit, share / share.sum()


@dataclass(frozen=True)
class EpochRecord:
    """One stream epoch: its token budget, the scorer it drew with, and where its windows start."""

    epoch: int
    budget_tokens: float
    first_window: int
    scorer_sha256: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "budget_tokens": self.budget_tokens,
            "first_window": self.first_window,
            "scorer_sha256": self.scorer_sha256,
        }


@dataclass(frozen=True)
class StreamPlan:
    """The windows of a stage: window i holds conversations `conversations[offsets[i]:offsets[i + 1]]`, in order.

    Attributes:
        seq_length: a window's positions.
        offsets: int64, one more than the windows.
        conversations: int64 indices into `StageConversations`.
        epochs: the epochs the windows come from, in order.
        policy: the draw's settings.
    """

    seq_length: int
    offsets: np.ndarray
    conversations: np.ndarray
    epochs: tuple[EpochRecord, ...]
    policy: StreamPolicy

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def window(self, index: int) -> np.ndarray:
        """The conversations of window `index`, in their order in the window."""
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} of a stream of {len(self)}")
        return self.conversations[self.offsets[index] : self.offsets[index + 1]]


# -- reading a stage -----------------------------------------------------------------------------------------------
def _train_blend(stage_file: Path) -> tuple[list[str], np.ndarray]:
    try:
        data = json.loads(stage_file.read_text())
        blend = data["train"]
        weights = np.asarray([float(w) for w in blend[0::2]], dtype=np.float64)
        prefixes = [str(p) for p in blend[1::2]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise StageStreamError(f"{stage_file}: not a curriculum stage file ({type(error).__name__}: {error})") from None
    if not prefixes or len(prefixes) != len(weights) or not np.all(weights >= 0) or weights.sum() <= 0:
        raise StageStreamError(f"{stage_file}: its train blend has no weighted prefix")
    return prefixes, weights / weights.sum()


def _part_of_trios(pool_root: Path) -> dict[str, Path]:
    """The pool part of every trio, by the trio's tokens prefix relative to `<pool>/megatron`."""
    parts = {}
    for record_path in sorted((pool_root / SHARD_RECORDS_DIR).glob("shard_*.json")):
        record = json.loads(record_path.read_text())
        for trio in record["trios"]:
            for file in trio["files"]:
                if file["path"].endswith(f"{TOKENS_SUFFIX}.idx"):
                    parts[file["path"][: -len(".idx")]] = pool_root / record["part"]["path"]
    return parts


def read_stage_conversations(
    stage_file: Path | str, parts_read: MutableMapping[Path, Any] | None = None
) -> StageConversations:
    """The train conversations a stage file weights, with what the stream draws them by.

    The caller verifies the pool first (`synthkd_training.pool.stage_blends`); this reads the stage file, every
    trio's index and the pool parts beside them, and matches a trio's documents to its part's rows of the same
    cell and split, in order.

    Args:
        stage_file: `<pool>/curriculum/<stage>.json`.
        parts_read: the pool parts' rows read so far, filled in as parts are read: the stages of one pool, read
            one after another with the same mapping, read each part once.

    Returns:
        The stage's conversations.

    Raises:
        StageStreamError: a prefix outside the pool or of no part, or a trio whose documents are not its part's
            rows (other counts or lengths).
    """
    stage_file = Path(stage_file)
    pool_root = stage_file.resolve().parent.parent
    trio_root = pool_root / TRIO_ROOT
    prefixes, weights = _train_blend(stage_file)
    parts = _part_of_trios(pool_root)
    tables = {} if parts_read is None else parts_read
    columns: dict[str, list[np.ndarray]] = {
        name: [] for name in ("prefix", "document", "length", "skill", "ctx", "group", "cluster")
    }
    ids: list[pa.Array] = []
    for index, prefix in enumerate(prefixes):
        try:
            relative = Path(prefix).resolve().relative_to(trio_root.resolve()).as_posix()
        except ValueError:
            raise StageStreamError(f"{stage_file}: {prefix} is not a trio of the pool {pool_root}") from None
        part_path = parts.get(relative)
        if part_path is None:
            raise StageStreamError(f"{stage_file}: no shard record of {pool_root} lists the trio {prefix}")
        if part_path not in tables:
            tables[part_path] = _part_cells(part_path)
        cell = Path(relative).parent.name
        skill, ctx = cell.split("_")
        rows = tables[part_path].get((skill, ctx), _EMPTY_CELL)
        lengths = np.asarray(read_index(prefix).sequence_lengths, dtype=np.int64)
        if len(rows.tokens) != len(lengths) or not np.array_equal(rows.tokens, lengths):
            raise StageStreamError(
                f"{prefix}: its {len(lengths)} documents are not the {len(rows.tokens)} train rows of {part_path} in "
                f"cell {cell} (counts or lengths differ): rebuild the pool"
            )
        n = len(lengths)
        columns["prefix"].append(np.full(n, index, dtype=np.int64))
        columns["document"].append(np.arange(n, dtype=np.int64))
        columns["length"].append(lengths)
        columns["skill"].append(np.full(n, SKILL_BUCKETS.index(skill), dtype=np.int64))
        columns["ctx"].append(np.full(n, CTX_BUCKETS.index(ctx), dtype=np.int64))
        columns["group"].append(rows.group)
        columns["cluster"].append(rows.cluster)
        ids.append(rows.ids)
    arrays = {name: np.concatenate(parts_) if parts_ else np.zeros(0, np.int64) for name, parts_ in columns.items()}
    pool_ids = PoolIds(pa.chunked_array(ids, pa.large_string()))
    return StageConversations(prefixes=tuple(prefixes), ids=pool_ids, prefix_weight=weights, **arrays)


def stage_token_budget(stage_file: Path | str) -> int:
    """A stage's token budget, as the curriculum's plan (`plan.json` beside the stage file, sealed with it) says.

    Args:
        stage_file: `<pool>/curriculum/<stage>.json`.

    Returns:
        The stage's `tokens`.

    Raises:
        StageStreamError: no plan, or no stage of that name in it.
    """
    stage_file = Path(stage_file)
    plan_file = stage_file.parent / constants.CURRICULUM_PLAN_FILENAME
    try:
        stages = json.loads(plan_file.read_text())["stages"]
        return int(next(stage["tokens"] for stage in stages if stage["stage"] == stage_file.stem))
    except (OSError, ValueError, KeyError, TypeError, StopIteration):
        raise StageStreamError(f"{plan_file} gives no token budget for the stage {stage_file.stem}") from None


@dataclass(frozen=True)
class _PartCell:
    """The train rows of one pool part in one cell, in part order: the trio's documents, in the same order."""

    ids: pa.Array
    tokens: np.ndarray
    group: np.ndarray
    cluster: np.ndarray


_NO_ROWS = np.zeros(0, np.int64)
_EMPTY_CELL = _PartCell(pa.array([], pa.large_string()), _NO_ROWS, _NO_ROWS, _NO_ROWS)


def _part_cells(part_path: Path) -> dict[tuple[str, str], _PartCell]:
    """A pool part's train rows by (skill, ctx) cell, read and split once for every trio of the part (the split
    hashed per row, the rest by Arrow and numpy over the columns)."""
    table = pq.read_table(part_path, columns=[*PART_COLUMNS, CLUSTER_COLUMN])
    example_ids = table.column("source_example_id").to_pylist()
    table = table.filter(pa.array([assign_split(synth_id) == TRAIN_SPLIT for synth_id in example_ids], pa.bool_()))
    datasets = pc.unique(table.column("source_dataset"))
    group_of = np.asarray([SOURCE_GROUPS.index(dataset_group(name)) for name in datasets.to_pylist()], np.int64)
    group = group_of[pc.index_in(table.column("source_dataset"), value_set=datasets).to_numpy()]
    tokens = table.column("sequence_tokens").to_numpy().astype(np.int64)
    cluster = pc.fill_null(table.column(CLUSTER_COLUMN), NO_CLUSTER).to_numpy().astype(np.int64)
    cell_names = pc.binary_join_element_wise(table.column("skill_bucket"), table.column("ctx_bucket"), "_")
    cells = pc.unique(cell_names)
    cell_of_row = pc.index_in(cell_names, value_set=cells).to_numpy()
    row_ids = table.column("id").combine_chunks().cast(pa.large_string())
    found = {}
    for index, name in enumerate(cells.to_pylist()):
        rows = np.flatnonzero(cell_of_row == index)
        skill, ctx = name.split("_")
        found[skill, ctx] = _PartCell(
            ids=row_ids.take(rows), tokens=tokens[rows], group=group[rows], cluster=cluster[rows]
        )
    return found


# -- drawing -------------------------------------------------------------------------------------------------------
def _rng(seed: int, *keys: int) -> np.random.Generator:
    return np.random.default_rng([seed, *keys])


def epoch_order(
    members: np.ndarray, weights: np.ndarray, clusters: np.ndarray, policy: StreamPolicy, rng: np.random.Generator
) -> np.ndarray:
    """One epoch's order of a unit's conversations: weighted without replacement (Efraimidis-Spirakis keys
    `log(u) / w`, largest first: successive sampling, the first pick is i with probability w_i / sum(w)), an
    `epsilon` share of the draws uniform, at most `cluster_cap` per cluster (the first ones in the order).

    Args:
        members: the unit's conversations (indices).
        weights: every conversation's sampling weight (indexed by conversation).
        clusters: every conversation's cluster (NO_CLUSTER: none).
        policy: epsilon and the cluster cap.
        rng: the epoch's and unit's generator.

    Returns:
        The order, a permutation of the members the cap leaves.
    """
    n = len(members)
    keys = np.log(rng.random(n)) / weights[members]  # Efraimidis-Spirakis: larger key first
    weighted = members[np.argsort(-keys, kind="stable")]
    if policy.epsilon > 0:
        uniform = members[rng.permutation(n)]
        from_uniform = rng.random(2 * n) < policy.epsilon
        taken_u, taken_w = np.cumsum(from_uniform), np.cumsum(~from_uniform)
        usable = (taken_u <= n) & (taken_w <= n)
        picks = np.where(from_uniform, uniform[np.minimum(taken_u, n) - 1], weighted[np.minimum(taken_w, n) - 1])
        picks = np.concatenate([picks[usable], weighted])
        _, first = np.unique(picks, return_index=True)
        order = picks[np.sort(first)]
    else:
        order = weighted
    if policy.cluster_cap is not None:
        order = order[within_cluster_cap(order, clusters, policy.cluster_cap)]
    return order


def within_cluster_cap(order: np.ndarray, clusters: np.ndarray, cap: int) -> np.ndarray:
    """Which conversations of `order` the cluster cap keeps: the first `cap` of each cluster in the order, and
    every conversation of no cluster.

    Args:
        order: conversations (indices), in order.
        clusters: every conversation's cluster (NO_CLUSTER: none).
        cap: conversations kept per cluster.

    Returns:
        A boolean mask over `order`.
    """
    n = len(order)
    cluster = clusters[order]
    by_cluster = np.lexsort((np.arange(n), cluster))
    sorted_cluster = cluster[by_cluster]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_cluster)) + 1]
    rank_sorted = np.arange(n) - np.repeat(starts, np.diff(np.r_[starts, n]))
    rank = np.empty(n, dtype=np.int64)
    rank[by_cluster] = rank_sorted
    return (cluster == NO_CLUSTER) | (rank < cap)


def best_fit_windows(lengths: Sequence[int] | np.ndarray, seq_length: int) -> list[list[int]]:
    """Best-fit decreasing: each item (longest first) goes into the open window it fills most tightly.

    Args:
        lengths: the items' lengths.
        seq_length: a window's capacity; a longer item gets a window of its own.

    Returns:
        The windows, each a list of item indices (longest first).
    """
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    windows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, window), sorted
    for item in order.tolist():
        need = int(lengths[item])
        at = bisect.bisect_left(free, (need, -1))
        if at < len(free):
            room, window = free.pop(at)
            windows[window].append(item)
            if room - need > 0:
                bisect.insort(free, (room - need, window))
        else:
            windows.append([item])
            if seq_length - need > 0:
                bisect.insort(free, (seq_length - need, len(windows) - 1))
    return windows


def _phase_at(phases: Sequence[ScorerPhase], epoch: int) -> ScorerPhase | None:
    current = None
    for phase in phases:
        if phase.first_epoch <= epoch:
            current = phase
    return current


def plan_stream(
    conversations: StageConversations,
    seq_length: int,
    num_windows: int | None,
    policy: StreamPolicy | None = None,
    scorer_phases: Sequence[ScorerPhase] = (),
    token_budget: int | None = None,
) -> StreamPlan:
    """A stage's stream (module docstring, steps 1-4): its first `num_windows` windows, or the windows up to the one
    in which the real tokens reach `token_budget` (the stage's budget: it stops there, less than a window over).

    Args:
        conversations: the stage's conversations (`read_stage_conversations`).
        seq_length: a window's positions (the stage's `--seq-length`).
        num_windows: how many windows (the stage's `--train-samples`); None: up to `token_budget`.
        policy: the draw's settings; None: `StreamPolicy()`.
        scorer_phases: the utilities each epoch draws with, by first epoch; none: every weight 1.
        token_budget: the real tokens the windows hold at least, with `num_windows` None.

    Returns:
        The plan.

    Raises:
        StageStreamError: not exactly one of `num_windows` and `token_budget`, no conversation, or a scorer phase
            whose utilities are not one per conversation.
    """
    policy = policy or StreamPolicy()
    if (num_windows is None) == (token_budget is None):
        raise StageStreamError("give the stream its windows or its token budget, one of them")
    if seq_length < 1 or (num_windows or 0) < 0 or (token_budget or 0) < 0:
        raise StageStreamError(
            f"seq_length must be >= 1, num_windows and token_budget >= 0: {seq_length}, {num_windows}, {token_budget}"
        )
    if len(conversations) == 0:
        raise StageStreamError("the stage has no train conversation")
    for phase in scorer_phases:
        if len(phase.utility) != len(conversations):
            raise StageStreamError(
                f"the scorer phase from epoch {phase.first_epoch} has {len(phase.utility)} utilities for "
                f"{len(conversations)} conversations"
            )
    unit, share = conversations.units()
    lengths = conversations.length
    members = {u: np.flatnonzero(unit == u) for u in np.flatnonzero(share > 0).tolist()}
    carry = dict.fromkeys(members, 0.0)
    chunk_tokens = policy.chunk_windows * seq_length
    offsets, flat, epochs = [0], [], []
    held = 0  # real tokens in the windows so far

    def done() -> bool:
        return len(offsets) - 1 == num_windows if token_budget is None else held >= token_budget

    epoch = 0
    while not done():
        phase = _phase_at(scorer_phases, epoch)
        utility = np.zeros(len(lengths)) if phase is None else np.nan_to_num(np.asarray(phase.utility, float))
        weights = np.exp(policy.tau * utility)
        orders = {
            u: epoch_order(idx, weights, conversations.cluster, policy, _rng(policy.seed, epoch, u))
            for u, idx in members.items()
        }
        budget = min(lengths[order].sum() / share[u] for u, order in orders.items())
        picked, times = [], []
        for u, order in orders.items():
            target = share[u] * budget + carry[u]
            cumulative = np.cumsum(lengths[order])
            take = int(np.count_nonzero(cumulative - lengths[order] / 2 <= target))
            carry[u] = target - (float(cumulative[take - 1]) if take else 0.0)
            picked.append(order[:take])
            times.append((cumulative[:take] - lengths[order[:take]] / 2) / share[u])
        merged = np.concatenate(picked)
        merged = merged[np.argsort(np.concatenate(times), kind="stable")]
        if policy.cluster_cap is not None:  # per epoch, also for a cluster that spans units: the first ones stay
            kept = within_cluster_cap(merged, conversations.cluster, policy.cluster_cap)
            dropped = merged[~kept]
            for u in np.unique(unit[dropped]).tolist():  # what a unit lost, its next epoch makes up
                carry[u] += float(lengths[dropped[unit[dropped] == u]].sum())
            merged = merged[kept]
        epochs.append(
            EpochRecord(epoch, float(budget), len(offsets) - 1, None if phase is None else phase.scorer_sha256)
        )
        boundaries = np.searchsorted(
            np.cumsum(lengths[merged]), np.arange(chunk_tokens, lengths[merged].sum(), chunk_tokens)
        )
        for chunk_index, chunk in enumerate(np.split(merged, boundaries)):
            if len(chunk) == 0:
                continue
            windows = best_fit_windows(lengths[chunk], seq_length)
            for w in _rng(policy.seed, epoch, 1_000_000 + chunk_index).permutation(len(windows)).tolist():
                flat.extend(chunk[windows[w]].tolist())
                offsets.append(len(flat))
                held += int(np.minimum(lengths[chunk[windows[w]]], seq_length).sum())
                if done():
                    break
            if done():
                break
        epoch += 1
    return StreamPlan(
        seq_length=seq_length,
        offsets=np.asarray(offsets, dtype=np.int64),
        conversations=np.asarray(flat, dtype=np.int64),
        epochs=tuple(epochs),
        policy=policy,
    )


# -- what the stream holds -----------------------------------------------------------------------------------------
def _shares(tokens: np.ndarray) -> np.ndarray:
    total = tokens.sum()
    return tokens / total if total > 0 else tokens


def stream_mix(plan: StreamPlan, conversations: StageConversations) -> dict[str, Any]:
    """The tokens a stream's windows hold, by skill bucket, ctx bucket and source group, against the stage's targets.

    Args:
        plan: the stream's windows.
        conversations: the conversations it was planned from.

    Returns:
        `{"windows", "seq_length", "real_token_fraction", "long_conversations", "conversations", "epochs",
        "by": {dimension: {name: {"tokens", "share", "target"}}}, "max_deviation_pp", "within_tolerance"}`; a
        conversation longer than the window counts the tokens its window holds.
    """
    held = np.minimum(conversations.length[plan.conversations], plan.seq_length)
    unit, share = conversations.units()
    dims = {
        "skill_bucket": (conversations.skill, SKILL_BUCKETS, len(CTX_BUCKETS) * len(SOURCE_GROUPS)),
        "ctx_bucket": (conversations.ctx, CTX_BUCKETS, len(SOURCE_GROUPS)),
        "source_group": (conversations.group, SOURCE_GROUPS, 1),
    }
    by: dict[str, dict[str, dict[str, float]]] = {}
    deviation = 0.0
    for dimension, (values, names, stride) in dims.items():
        tokens = np.bincount(values[plan.conversations], weights=held, minlength=len(names))
        unit_value = (np.arange(len(share)) // stride) % len(names)
        target = np.bincount(unit_value, weights=share, minlength=len(names))
        achieved = _shares(tokens)
        by[dimension] = {
            name: {"tokens": int(tokens[i]), "share": float(achieved[i]), "target": float(target[i])}
            for i, name in enumerate(names)
            if tokens[i] > 0 or target[i] > 0
        }
        deviation = max(deviation, float(np.max(np.abs(achieved - target))) * 100 if len(plan) else 0.0)
    return {
        "windows": len(plan),
        "seq_length": plan.seq_length,
        "real_token_fraction": float(held.sum() / (len(plan) * plan.seq_length)) if len(plan) else 0.0,
        "long_conversations": int(np.count_nonzero(conversations.length[plan.conversations] > plan.seq_length)),
        "conversations": len(plan.conversations),
        "epochs": len(plan.epochs),
        "by": by,
        "max_deviation_pp": deviation,
        "within_tolerance": deviation <= MIX_TOLERANCE_PP,
    }
