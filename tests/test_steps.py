"""The step loop every per-shard step runs (core/steps.py): counts, all outputs published together or none,
and the error log of the dropped rows."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_assets.core import parquet_io, stages
from synthkd_assets.core.parquet_io import READ_BATCH_ROWS, ParquetShardWriter, iter_frames, publish_together
from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.stages import first_reason, harmonize_shard, select_rows_shard
from synthkd_assets.core.steps import OUTPUT_WINDOW_ROWS, Outputs, ParquetOutputs, ShardStep, Table, run_step
from synthkd_assets.core.synth import system_message_dict
from synthkd_dev.make_sample_data import generate_rows, rows_to_table

SCHEMA = pa.schema([("n", pa.int64())])


class EvenOdd(ShardStep):
    """Even numbers to one file, odd ones to another, negative ones dropped; fails on `fail_at`."""

    def __init__(self, root: Path, frames: list[list[int]], fail_at: int | None = None) -> None:
        self.root, self.batches, self.fail_at = root, frames, fail_at

    def open_outputs(self) -> Outputs:
        return ParquetOutputs({name: (self.root / f"{name}.parquet", SCHEMA) for name in ("even", "odd")})

    def frames(self) -> Iterator[pl.DataFrame]:
        return (pl.DataFrame({"n": batch}) for batch in self.batches)

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        if self.fail_at is not None and self.fail_at in frame["n"].to_list():
            raise ValueError(f"{self.fail_at} breaks the rule")
        for n in frame.filter(pl.col("n") < 0)["n"]:
            report.drop("negative", n, None)
        kept = frame.filter(pl.col("n") >= 0)
        return {"even": kept.filter(pl.col("n") % 2 == 0), "odd": kept.filter(pl.col("n") % 2 == 1)}


def test_the_loop_counts_publishes_every_output_and_logs_the_drops(tmp_path):
    log = tmp_path / "errors" / "s.jsonl"
    report = run_step(EvenOdd(tmp_path, [[0, 1, -2], [3, -4, 5]]), "s", log)
    assert (report.rows_in, report.rows_out, dict(report.dropped)) == (6, 4, {"negative": 2})
    assert pl.read_parquet(tmp_path / "even.parquet")["n"].to_list() == [0]
    assert pl.read_parquet(tmp_path / "odd.parquet")["n"].to_list() == [1, 3, 5]
    assert [json.loads(line)["source_row"] for line in log.read_text().splitlines()] == [-2, -4]
    run_step(EvenOdd(tmp_path, [[0, 1]]), "s", log)  # a rebuild that drops nothing leaves no stale log
    assert not log.exists()


def test_a_rule_that_fails_publishes_nothing_and_leaves_no_partial(tmp_path):
    with pytest.raises(ValueError, match="3 breaks the rule"):
        run_step(EvenOdd(tmp_path, [[0, 1], [2, 3]], fail_at=3), "s", tmp_path / "s.jsonl")
    assert list(tmp_path.iterdir()) == []  # neither file, and no partial file (*.partial) either


# -- output bytes against the read batch size --------------------------------------------------------------------
STRINGS = pa.schema([("s", pa.string()), ("n", pa.int64())])


class OneFile(Outputs):
    """Two outputs interleaved into one file, as the pool's splits go into one part."""

    def __init__(self, path: Path) -> None:
        self.writer = ParquetShardWriter(path, STRINGS)

    def write(self, name: str, table: Table) -> None:
        self.writer.write(table)

    def publish(self) -> None:
        publish_together([self.writer])

    def discard(self) -> None:
        self.writer._discard()


class Parity(ShardStep):
    """Rows of a Parquet file (streamed like every step's input) to `odd` / `even` by n, multiples of 7 dropped."""

    def __init__(self, source: Path, out: Path) -> None:
        self.source, self.out = source, out

    def open_outputs(self) -> Outputs:
        return OneFile(self.out)

    def frames(self) -> Iterator[pl.DataFrame]:
        return iter_frames(self.source, STRINGS.names)

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        kept = frame.filter(pl.col("n") % 7 != 0)
        return {name: kept.filter(pl.col("n") % 2 == parity) for name, parity in (("odd", 1), ("even", 0))}


@pytest.mark.parametrize("rows", [5000, 2048, 300])
def test_outputs_do_not_depend_on_the_read_batch_size(tmp_path, monkeypatch, rows):
    """Frames of 512 rows or of 2048 (or 128): the same bytes, string columns and interleaved outputs included
    (each window of OUTPUT_WINDOW_ROWS input rows is written as one table per output, in first-seen order)."""
    source = tmp_path / "in.parquet"
    texts = [f"row {i} " + "x" * (i % 97) for i in range(rows)]
    pq.write_table(pa.table({"s": texts, "n": list(range(rows))}, schema=STRINGS), source, row_group_size=1000)
    digests = {}
    for batch_rows in (OUTPUT_WINDOW_ROWS, READ_BATCH_ROWS, 128):
        monkeypatch.setattr(parquet_io, "READ_BATCH_ROWS", batch_rows)
        out = tmp_path / f"out_{batch_rows}.parquet"
        report = run_step(Parity(source, out), "s")
        assert report.rows_in == rows
        digests[batch_rows] = hashlib.sha256(out.read_bytes()).hexdigest()
    assert len(set(digests.values())) == 1, digests


def test_the_real_steps_write_the_same_bytes_whatever_the_read_batch_size(tmp_path, monkeypatch):
    """harmonize (polars tables), select and tokenize (Arrow tables) on a 5000-row shard: three output windows.
    Harmonize and select read frames of EXPRESSION_FRAME_ROWS (the other steps READ_BATCH_ROWS): both varied."""
    raw = tmp_path / "raw.parquet"
    pq.write_table(rows_to_table(generate_rows(5000, seed=7)), raw, row_group_size=700)
    digests: dict[str, set[str]] = {}
    for batch_rows in (OUTPUT_WINDOW_ROWS, READ_BATCH_ROWS, 256):
        monkeypatch.setattr(parquet_io, "READ_BATCH_ROWS", batch_rows)
        monkeypatch.setattr(stages, "EXPRESSION_FRAME_ROWS", batch_rows)
        out = tmp_path / str(batch_rows)
        harmonize_shard(raw, out / "harmony.parquet", system_message_dict(), "synth_001")
        rule = first_reason(lambda f: pl.Series([None if i % 5 else "x" for i in f["source_row"]], dtype=pl.String))
        select_rows_shard(out / "harmony.parquet", out / "selected.parquet", "synth_001", rule)
        for name in ("harmony.parquet", "selected.parquet"):
            digests.setdefault(name, set()).add(hashlib.sha256((out / name).read_bytes()).hexdigest())
    assert {name: len(found) for name, found in digests.items()} == {"harmony.parquet": 1, "selected.parquet": 1}


def test_a_frame_straddling_an_output_window_is_refused(tmp_path):
    with pytest.raises(ValueError, match="straddles two output windows"):
        run_step(EvenOdd(tmp_path, [list(range(OUTPUT_WINDOW_ROWS - 1)), [1, 2]]), "s")
    assert list(tmp_path.iterdir()) == []


class NullsFirst(Parity):
    """Arrow tables whose string column, in a frame of only nulls, is typed null (as pa.array infers it)."""

    def apply(self, frame: pl.DataFrame, report: ShardReport) -> dict[str, Table]:
        texts = [None if n < 600 else s for s, n in frame.select("s", "n").iter_rows()]
        return {"all": pa.table({"s": pa.array(texts), "n": frame["n"].to_arrow()})}


def test_a_window_whose_frames_type_a_column_differently_is_written_as_one_frame_would_be(tmp_path, monkeypatch):
    source = tmp_path / "in.parquet"
    pq.write_table(pa.table({"s": [f"t{i}" for i in range(3000)], "n": list(range(3000))}, schema=STRINGS), source)
    digests = set()
    for batch_rows in (OUTPUT_WINDOW_ROWS, 256):
        monkeypatch.setattr(parquet_io, "READ_BATCH_ROWS", batch_rows)
        run_step(NullsFirst(source, tmp_path / f"out_{batch_rows}.parquet"), "s")
        digests.add(hashlib.sha256((tmp_path / f"out_{batch_rows}.parquet").read_bytes()).hexdigest())
    assert len(digests) == 1
