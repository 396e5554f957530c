"""The one loop every per-shard step runs: read frames -> apply the rule -> count -> publish -> error log.

A step (harmonize, filter, sample, tokenize, the Megatron trio, the DistillKit parts) is a `ShardStep`:
where its frames come from, the rule that turns each frame into the tables it keeps (counting every
dropped, sanitized or capped row in the `ShardReport`), and the outputs those tables go to. `run_step`
does the rest the same way for all of them: every output is written under a partial name and all of
a shard's outputs are published together, or, on any error (bad input, full disk, a broken contract),
none of them and no partial file; then the error log names the dropped rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from pathlib import Path

import polars as pl
import pyarrow as pa

from synthkd_assets.core.parquet_io import READ_BATCH_ROWS, ParquetShardWriter, publish_together
from synthkd_assets.core.report import ShardReport

Table = pa.Table | pl.DataFrame

# Input rows whose outputs are written together, as one table per output. An output's bytes depend on how its
# rows arrive, not only on the rows: each table written is one Arrow chunk and Parquet pages follow chunks, and
# a step with several outputs into one file (the pool's splits) interleaves them per write. Steps read frames of
# READ_BATCH_ROWS (fewer rows held at once), and run_step writes what the frames of each window of
# OUTPUT_WINDOW_ROWS input rows produced: the bytes are those of one frame per window, whatever READ_BATCH_ROWS.
OUTPUT_WINDOW_ROWS = 2048
# the frames of the steps whose rule is polars expressions over whole frames (Harmony's JSON, the filters, the
# sampling): one per output window, so that polars plans each window's query once instead of once per
# READ_BATCH_ROWS (the same bytes, a little more memory: benchmarks/README.md)
EXPRESSION_FRAME_ROWS = OUTPUT_WINDOW_ROWS
SHARD = "shard"  # the output name of the steps that write one file per shard
assert OUTPUT_WINDOW_ROWS % READ_BATCH_ROWS == 0, "a frame must never straddle two output windows"


class Outputs(ABC):
    """The files one step writes for one shard, under partial names until `publish`."""

    # whether `write` is handed a window's rows with every column one chunk (joined, a copy); False: the frames'
    # tables chained as they are, for outputs whose bytes do not depend on the chunks (the Megatron trios)
    joins_chunks: bool = True

    @abstractmethod
    def write(self, name: str, table: Table) -> None:
        """Append rows to the output called `name`."""

    @abstractmethod
    def publish(self) -> None:
        """Finish every file and rename them all into place together (none of them if one fails)."""

    @abstractmethod
    def discard(self) -> None:
        """Remove every partial file, whatever state it is in."""


class ParquetOutputs(Outputs):
    """Parquet files by name (`{name: (final path, schema)}`), published together."""

    def __init__(self, files: Mapping[str, tuple[Path, pa.Schema]]) -> None:
        self.writers: dict[str, ParquetShardWriter] = {}
        try:
            for name, (path, schema) in files.items():
                self.writers[name] = ParquetShardWriter(path, schema)
        except BaseException:
            self.discard()  # e.g. a full disk on the second file: the first one's partial goes too
            raise

    def write(self, name: str, table: Table) -> None:
        self.writers[name].write(table)

    def publish(self) -> None:
        publish_together(list(self.writers.values()))

    def discard(self) -> None:
        for writer in self.writers.values():
            writer._discard()


class ShardStep(ABC):
    """One per-shard step, as `run_step` runs it. `summary_outputs`: the names of outputs that only describe rows
    another output holds (a row's sizes): their rows are not counted again in the report's `rows_out`."""

    summary_outputs: frozenset[str] = frozenset()

    @abstractmethod
    def open_outputs(self) -> Outputs:
        """Create the step's outputs (partial files); called before the first frame is read."""

    @abstractmethod
    def frames(self) -> Iterator[pl.DataFrame]:
        """The input, in batches."""

    @abstractmethod
    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        """The rule: the rows of `frame` to keep, by output name; every row not kept counted in `report`."""

    def finish(self, report: ShardReport) -> None:  # noqa: B027 - a hook most steps do without
        """After the last frame, before anything is published: final counts and checks."""


def run_step(step: ShardStep, shard: str, errors_log: Path | None = None) -> ShardReport:
    """Run `step` over one shard and publish what it keeps; `errors_log`: where to write the dropped rows.

    The tables the frames of one window of OUTPUT_WINDOW_ROWS input rows keep are written together: per output,
    in the order the window first produced them, concatenated into one table."""
    report = ShardReport(shard)
    outputs = step.open_outputs()
    try:
        window: dict[str, list[Table]] = {}
        window_end = OUTPUT_WINDOW_ROWS
        for frame in step.frames():
            report.rows_in += frame.height
            if report.rows_in > window_end:
                raise ValueError(f"{shard}: a frame of {frame.height} rows straddles two output windows")
            for name, table in step.apply(frame, report).items():
                if name not in step.summary_outputs:
                    report.rows_out += table.num_rows if isinstance(table, pa.Table) else table.height
                window.setdefault(name, []).append(table)
            if report.rows_in == window_end:
                _write_window(outputs, window)
                window_end += OUTPUT_WINDOW_ROWS
        _write_window(outputs, window)
        step.finish(report)
        outputs.publish()
    except BaseException:
        outputs.discard()
        raise
    if errors_log is not None:
        report.write_errors(errors_log)
    return report


def _write_window(outputs: Outputs, window: dict[str, list[Table]]) -> None:
    """Write (and forget) one window's tables: one table per output, each column one chunk (or the tables
    chained, where the outputs do not join chunks)."""
    for name, tables in window.items():
        outputs.write(name, _concatenated(tables) if outputs.joins_chunks else _chained(tables))
    window.clear()


def _chained(tables: list[Table]) -> pa.Table:
    """The rows of `tables` as one Arrow table of their chunks, nothing copied (a column typed null where it held
    only nulls takes the type the other tables give it)."""
    return pa.concat_tables([t if isinstance(t, pa.Table) else t.to_arrow() for t in tables], promote_options="default")


def _concatenated(tables: list[Table]) -> Table:
    """One table of the rows of `tables`, each column one chunk; a column typed null in a frame where it held only
    nulls takes the type the other frames give it (as one frame of all the rows would have)."""
    if len(tables) == 1:
        return tables[0]
    if all(isinstance(t, pl.DataFrame) for t in tables):
        return pl.concat(tables, how="vertical_relaxed", rechunk=True)
    return _chained(tables).combine_chunks()
