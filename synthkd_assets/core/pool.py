"""The sequence pool (docs/pool.md#what-the-pool-holds): every conversation the B x C quota grid keeps, per shard.

From synth_tokenized (the arrays synth_kd_v1 is made of) and synth_sampled (the Harmony messages), one
step writes, together or not at all:

- `<pool>/parts/part-XXXXX.parquet`: one pool row per kept conversation (`POOL_SCHEMA`): a UUID derived from
  source and synth_id, the buckets, the full Harmony conversation (the pool holds full sequences), the exact
  prompt token count, the analysis / final token ranges, a uniform `sampling_weight` of 1.0 (uniform within
  quotas until a scorer exists) and the columns nothing computes yet as nulls;
- `<pool>/megatron/<split>/<B>_<C>/shard_XX_{tokens,lossmask,span}.{bin,idx}`: the same conversations as
  Megatron trios per cell and split (the 000 split of synth_kd_v1), so a Megatron blend can weight the
  cells by prefix (core/curriculum.py). A cell a shard has nothing for publishes no file.

A conversation the quota grid does not keep is dropped and counted (`over_quota`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from synthkd_assets.core.caps import NO_CAPS, BuildCaps
from synthkd_assets.core.distill_io import SampledMessages
from synthkd_assets.core.megatron_io import MegatronShardWriter, ShardSplitInventory, commit_shard
from synthkd_assets.core.near_dup import BySynthId, shard_cluster_columns
from synthkd_assets.core.parquet_io import ParquetShardWriter
from synthkd_assets.core.quota import quota_keep
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.source_mix import source_mix_keep
from synthkd_assets.core.stages import DatasetStep, TokenizedRow
from synthkd_assets.core.steps import Outputs, Table, run_step
from synthkd_contract import constants, drops, sources
from synthkd_contract.buckets import (
    CTX_BUCKETS,
    EXERCISE_SKILL_BUCKET,
    SKILL_BUCKETS,
    ctx_bucket,
    pool_row_id,
    skill_bucket,
)
from synthkd_contract.labels import token_align
from synthkd_contract.schemas import POOL_NULL_COLUMNS, POOL_SCHEMA
from synthkd_contract.splits import assign_split

# uniform within the quotas until a scorer sets exp(tau * utility) (docs/pool.md#what-the-pool-holds)
POOL_SAMPLING_WEIGHT = 1.0


def cell_dir_name(skill: str, ctx: str) -> str:
    """`B1_C1`: the directory of one cell's trios in a split."""
    return f"{skill}_{ctx}"


def token_ranges(per_token_spans: np.ndarray, span: int) -> list[dict[str, int]]:
    """The [start, end) runs of tokens whose span is `span`, in order."""
    inside = np.concatenate([[False], per_token_spans == span, [False]])
    edges = np.flatnonzero(inside[1:] != inside[:-1])
    return [{"start": int(a), "end": int(b)} for a, b in zip(edges[::2], edges[1::2])]


@dataclass(frozen=True)
class PoolRow:
    """One kept conversation: its cell and what its pool row says about its tokens."""

    index: int  # in its frame
    synth_id: str
    exercise: str
    language: str
    skill: str
    ctx: str
    messages: str
    prompt_tokens: int
    sequence_tokens: int
    analysis: list[dict[str, int]]
    final: list[dict[str, int]]


def pool_row(row: TokenizedRow, messages: str, exercise_table: Mapping[str, str] | None = None) -> PoolRow:
    """The pool's view of one tokenized conversation. The prompt is every token before the first supervised
    one (the assistant's `<|start|>`); the spans are token ranges into the rendered sequence (EOD included)."""
    spans = token_align(np.asarray(row.span_id, dtype=constants.SPAN_DTYPE))
    supervised = np.flatnonzero(spans != constants.SPAN_PROMPT)
    prompt = int(supervised[0]) if len(supervised) else len(spans)
    return PoolRow(
        row.index,
        row.synth_id,
        row.exercise,
        row.language,
        skill_bucket(row.exercise, exercise_table),
        ctx_bucket(len(row.tokens)),
        messages,
        prompt,
        len(row.tokens),
        token_ranges(spans, constants.SPAN_ANALYSIS),
        token_ranges(spans, constants.SPAN_FINAL),
    )


def pool_table(
    rows: list[PoolRow], clusters: BySynthId | None = None, dataset: str = constants.SOURCE_DATASET
) -> pa.Table:
    """The pool rows (docs/pool.md#what-the-pool-holds) of kept conversations of one `dataset` (POOL_SCHEMA), nulls
    where nothing computes a column yet; `clusters`: synth_id, cluster_id, near_dup_hash from synth_clusters (null
    columns without it)."""
    n = len(rows)
    if clusters is None:
        cluster_ids, hashes = [None] * n, [None] * n
    else:
        found = clusters.rows([r.synth_id for r in rows])
        cluster_ids, hashes = found["cluster_id"].to_list(), found["near_dup_hash"].to_list()
    columns: dict[str, Any] = {
        "id": [pool_row_id(dataset, r.synth_id) for r in rows],
        "source_dataset": [dataset] * n,
        "source_subset": [r.exercise for r in rows],
        "source_example_id": [r.synth_id for r in rows],
        "language": [r.language for r in rows],
        "skill_bucket": [r.skill for r in rows],
        "ctx_bucket": [r.ctx for r in rows],
        "messages": [r.messages for r in rows],
        "prompt_tokens_est": [r.prompt_tokens for r in rows],
        "sequence_tokens": [r.sequence_tokens for r in rows],
        "sampling_weight": [POOL_SAMPLING_WEIGHT] * n,
        "analysis_span": [r.analysis for r in rows],
        "final_span": [r.final for r in rows],
    }
    columns.update({name: [None] * n for name in POOL_NULL_COLUMNS})
    columns.update(cluster_id=cluster_ids, near_dup_hash=hashes)
    return pa.table({column.name: pa.array(columns[column.name], column.type) for column in POOL_SCHEMA})


class PoolOutputs(Outputs):
    """The pool part of one shard and its trios per (split, cell), published together by `commit_shard`.
    A written table (named by its split) carries the pool row's columns plus `cell` and the three
    arrays for the trios."""

    def __init__(self, part_path: Path, trio_root: Path, shard_index: int) -> None:
        self.writers: dict[tuple[str, str], MegatronShardWriter] = {}
        self.part: ParquetShardWriter | None = None
        self.inventories: dict[tuple[str, str], ShardSplitInventory] = {}
        try:
            for split in constants.SPLITS:
                for skill in SKILL_BUCKETS:
                    for ctx in CTX_BUCKETS:
                        cell = cell_dir_name(skill, ctx)
                        self.writers[(split, cell)] = MegatronShardWriter(
                            trio_root / split / cell, shard_index, split, relative_to=trio_root
                        )
            self.part = ParquetShardWriter(part_path, POOL_SCHEMA)
        except BaseException:
            self.discard()
            raise

    def write(self, name: str, table: Table) -> None:
        cells = table.column("cell").combine_chunks().dictionary_encode()
        codes = cells.indices.to_numpy(zero_copy_only=False)
        for code, cell in enumerate(cells.dictionary.to_pylist()):  # each cell's rows, in their order
            self.writers[(name, cell)].add_table(table.take(pa.array(np.flatnonzero(codes == code))))
        self.part.write(table.select(POOL_SCHEMA.names))

    def publish(self) -> None:
        keys = list(self.writers)
        published = commit_shard([self.writers[key] for key in keys], [self.part])
        self.inventories = dict(zip(keys, published))

    def discard(self) -> None:
        for writer in self.writers.values():
            writer.abort()
        if self.part is not None:
            self.part._discard()


@dataclass(frozen=True)
class PoolShard:
    """What one shard's pool is made from and where it goes."""

    tokenized_path: Path  # synth_tokenized: the arrays
    sampled_path: Path  # synth_sampled: the Harmony messages
    part_path: Path  # <pool>/parts/part-XXXXX.parquet
    trio_root: Path  # <pool>/megatron
    shard_index: int
    shard: str
    rates: dict[str, dict[str, float]]  # the quota plan's {skill: {ctx: keep rate}}
    caps: BuildCaps = NO_CAPS
    clusters_path: Path | None = None  # synth_clusters of the shard: fills cluster_id and near_dup_hash
    source_rates: dict[str, float] | None = None  # the quota plan's source mix {source: keep rate}; None: SYNTH only
    exercise_table: Mapping[str, str] = field(default_factory=lambda: dict(EXERCISE_SKILL_BUCKET))  # the build's
    quota_excluded: frozenset[str] = frozenset()  # the quota plan's rows dropped by id (core/quota.py)
    source_excluded: frozenset[str] = frozenset()  # the source mix's rows dropped by id


class PoolStep(DatasetStep):
    """Tokenized conversations -> the pool rows and trios of the ones the quota grid keeps."""

    def __init__(self, shard: PoolShard) -> None:
        super().__init__(shard.tokenized_path, shard.caps)
        self.shard, self.rates, self.source_rates = shard.shard, shard.rates, shard.source_rates
        self.source = sources.partition_source(shard.shard)
        if self.source != sources.SYNTH_SOURCE and self.source_rates is None:
            raise ValueError(f"{shard.shard}: an anchor source's shard needs the quota plan's source mix rates")
        self.where = shard
        self.messages = SampledMessages(shard.sampled_path, shard.shard)
        self.outputs: PoolOutputs | None = None
        self.clusters = shard_cluster_columns(shard.clusters_path) if shard.clusters_path is not None else None

    def open_outputs(self) -> Outputs:
        self.outputs = PoolOutputs(self.where.part_path, self.where.trio_root, self.where.shard_index)
        return self.outputs

    def keep(self, row: TokenizedRow, report: ShardReport) -> tuple[str, PoolRow] | None:
        messages = self.messages.advance(row.source_row)
        skill, ctx = skill_bucket(row.exercise, self.where.exercise_table), ctx_bucket(len(row.tokens))
        # the skill quota grid is SYNTH's; every source's share of the whole then comes from the source mix
        quota_excluded, source_excluded = self.where.quota_excluded, self.where.source_excluded
        if self.source == sources.SYNTH_SOURCE and not quota_keep(row.synth_id, skill, ctx, self.rates, quota_excluded):
            rate = self.rates[skill][ctx]
            why = "excluded by id: too long for its bucket's budget" if row.synth_id in quota_excluded else "rate"
            report.drop(drops.DROP_OVER_QUOTA, row.source_row, row.synth_id, f"cell {skill}/{ctx} {why} {rate}")
            return None
        if self.source_rates is not None and not source_mix_keep(
            row.synth_id, self.source, self.source_rates, source_excluded
        ):
            rate = self.source_rates[self.source]
            why = "excluded by id: too long for its planned tokens" if row.synth_id in source_excluded else "rate"
            report.drop(drops.DROP_OVER_SOURCE_SHARE, row.source_row, row.synth_id, f"{self.source} {why} {rate}")
            return None
        kept = pool_row(row, messages(), self.where.exercise_table)  # its spans and messages: for kept rows only
        report.count_sequence(row.exercise, row.language, kept.sequence_tokens, self.where.exercise_table)
        report.exercise_language[(row.exercise, row.language)] += 1
        return assign_split(row.synth_id), kept

    def tables(self, arrow: pa.Table, kept: dict[str, list[PoolRow]]) -> dict[str, Table]:
        out = {}
        for split, rows in kept.items():
            table = pool_table(rows, self.clusters, sources.source_dataset(self.source))
            indices = [r.index for r in rows]
            for column in ("tokens", "loss_mask", "span_id"):
                table = table.append_column(column, arrow.column(column).take(indices))
            out[split] = table.append_column("cell", pa.array([cell_dir_name(r.skill, r.ctx) for r in rows]))
        return out


@dataclass
class PoolShardResult:
    report: ShardReport
    inventories: dict[tuple[str, str], ShardSplitInventory]

    def record(self, partition: str, shard_index: int, part: dict[str, Any]) -> dict[str, Any]:
        """The per-shard record the pool manifest is built from: report, the part, every published trio."""
        trios = [
            {"split": split, "cell": cell, **inventory.to_dict()}
            for (split, cell), inventory in sorted(self.inventories.items())
            if inventory.sequences
        ]
        return {
            "partition": partition,
            "shard_index": shard_index,
            "report": self.report.to_dict(),
            "part": part,
            "trios": trios,
        }


def write_pool_shard(shard: PoolShard, errors_log: Path | None = None) -> PoolShardResult:
    """One shard's pool part and per-cell trios under the quota plan's rates; rows over quota counted."""
    step = PoolStep(shard)
    report = run_step(step, shard.shard, errors_log)
    return PoolShardResult(report, step.outputs.inventories)
