"""The step loop every per-shard step runs (core/steps.py): counts, all outputs published together or none,
and the error log of the dropped rows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.steps import Outputs, ParquetOutputs, ShardStep, Table, run_step

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
