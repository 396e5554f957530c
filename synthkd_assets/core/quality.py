"""Distribution checks (docs/contract.md#checks): analysis / final lengths per conversation, per language and exercise.

A conversation's analysis (final) tokens are its label positions with span_id == SPAN_ANALYSIS (SPAN_FINAL):
exactly the tokens of its analysis (final) message, Harmony wrappers included, the counts the manifests' tokens per
span add up. Percentiles are nearest-rank, as the DistillKit manifest's token lengths, so the two read alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from synthkd_assets.core.manifest_builders import PERCENTILES
from synthkd_assets.core.parallel import thread_map
from synthkd_assets.core.parquet_io import iter_frames
from synthkd_assets.core.row_sizes import current_row_sizes
from synthkd_contract import constants
from synthkd_contract.manifest_seal import HashedFile
from synthkd_contract.schemas import SPAN_SIZE_COLUMNS

GROUP_COLUMNS = ("language", "exercise")
LENGTH_SPANS = (constants.SPAN_ANALYSIS, constants.SPAN_FINAL)
STATS = ("min", *(f"p{p}" for p in PERCENTILES), "max")


def stat_column(span: int, stat: str) -> str:
    """e.g. `analysis_tokens_p50`: the metadata key Dagster plots over materializations."""
    return f"{constants.SPAN_NAMES[span]}_tokens_{stat}"


STAT_COLUMNS = tuple(stat_column(span, stat) for span in LENGTH_SPANS for stat in STATS)


@dataclass(frozen=True)
class LengthStats:
    groups: pl.DataFrame  # language, exercise, rows, then STAT_COLUMNS; sorted by language, exercise
    overall: dict[str, int | None]  # rows and STAT_COLUMNS over every conversation (None when there is none)


def _nearest_rank(column: str, p: int) -> pl.Expr:
    """The smallest value with at least p% of the rows at or below it (integer arithmetic, no interpolation)."""
    rank = (pl.len().cast(pl.Int64) * p + 99) // 100
    return pl.col(column).sort().get(rank - 1, null_on_oob=True)


def _aggregations() -> list[pl.Expr]:
    exprs = [pl.len().cast(pl.Int64).alias("rows")]
    for span in LENGTH_SPANS:
        name = constants.SPAN_NAMES[span]
        exprs.append(pl.col(name).min().alias(stat_column(span, "min")))
        exprs.extend(_nearest_rank(name, p).alias(stat_column(span, f"p{p}")) for p in PERCENTILES)
        exprs.append(pl.col(name).max().alias(stat_column(span, "max")))
    return exprs


def span_lengths(tokenized: pl.LazyFrame) -> pl.LazyFrame:
    """language, exercise and the analysis / final token counts of every synth_tokenized row."""
    counts = {constants.SPAN_NAMES[s]: pl.col("span_id").list.count_matches(s).cast(pl.Int64) for s in LENGTH_SPANS}
    return tokenized.select(*GROUP_COLUMNS, **counts)


def length_stats(tokenized_paths: Sequence[Path], hashed: Mapping[Path, HashedFile] | None = None) -> LengthStats:
    """Rows and min / pXX / max of analysis and final tokens per conversation, per (language, exercise) and
    overall, over synth_tokenized files (one thread per core). Each file's counts are read from its row sizes
    (`current_row_sizes`, written with it; the file's sha256 taken from `hashed` while its stat is unchanged); a
    file without current ones (written before they existed, or replaced since) has its span ids counted as they are
    read, so only the per-row counts are ever held (polars' streaming scan of the span_id column held ~0.15 GiB)."""
    schema = {"language": pl.String, "exercise": pl.String, "span_id": pl.List(pl.UInt8)}
    sizes = {constants.SPAN_NAMES[s]: SPAN_SIZE_COLUMNS[s] for s in LENGTH_SPANS}  # a count's name: its column

    def counted_file(path: Path) -> list[pl.DataFrame]:
        if (rows := current_row_sizes(path, hashed)) is not None:
            frame = pl.read_parquet(rows, columns=[*GROUP_COLUMNS, *sizes.values()])
            return [frame.select(*GROUP_COLUMNS, *(pl.col(column).alias(name) for name, column in sizes.items()))]
        return [span_lengths(frame.lazy().select(*schema)).collect() for frame in iter_frames(path, tuple(schema))]

    counted = [frame for frames in thread_map(counted_file, tokenized_paths) for frame in frames]
    lengths = (pl.concat(counted) if counted else span_lengths(pl.LazyFrame(schema=schema)).collect()).lazy()
    groups = lengths.group_by(*GROUP_COLUMNS).agg(_aggregations()).sort(*GROUP_COLUMNS)
    overall = lengths.select(_aggregations())
    groups, overall = pl.collect_all([groups, overall], engine="streaming")
    return LengthStats(groups, overall.row(0, named=True))


def markdown_table(stats: LengthStats) -> str:
    """The groups and the overall row as a markdown table (`all` in both key columns for the overall row)."""
    columns = [*GROUP_COLUMNS, "rows", *STAT_COLUMNS]
    overall = {**dict.fromkeys(GROUP_COLUMNS, "all"), **stats.overall}
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(GROUP_COLUMNS) + "---:|" * (len(columns) - 2)]
    for row in [*stats.groups.iter_rows(named=True), overall]:
        lines.append("| " + " | ".join("-" if row[c] is None else str(row[c]) for c in columns) + " |")
    return "\n".join(lines)
