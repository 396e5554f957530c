"""An anchor JSONL shard is read in bounded batches (core/sources/base.py `read_jsonl_source`), not whole.

A reader holding the file's bytes, a list of its lines and every line parsed into Python objects at once peaks at
several times the file's size. The oracle is tracemalloc's peak of Python allocations while a generated ~24 MB
file is read: a few batches' worth; and the rows read are exactly the lines written.
"""

from __future__ import annotations

import json
import tracemalloc

from synthkd_assets.core.report import ShardReport
from synthkd_assets.core.sources.base import JSONL_BATCH_ROWS, read_jsonl_source
from synthkd_assets.core.sources.nemotron_math_v2 import SPEC


def nemotron_line(i: int) -> dict:
    reasoning = f"Step {i}: " + "we expand the product and collect terms. " * 60
    return {
        "problem": f"Compute {i} + {i}.",
        "expected_answer": str(2 * i),
        "messages": [
            {"role": "user", "content": f"Compute {i} + {i}.", "reasoning_content": None},
            {"role": "assistant", "content": f"**{2 * i}**", "reasoning_content": reasoning},
        ],
        "metadata": {"difficulty": i % 5},
        "uuid": f"u-{i}",
    }


def test_a_large_jsonl_shard_is_read_with_bounded_python_memory(tmp_path):
    path = tmp_path / "high.part_00.jsonl"
    rows = 9000
    with path.open("w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps(nemotron_line(i)) + "\n")
            if i == 10:
                out.write("not json\n\n")  # a bad line and a blank one, counted as before
    size = path.stat().st_size
    assert size > 20_000_000

    warm = tmp_path / "warm.jsonl"  # the first read imports modules lazily: not the reader's memory
    warm.write_text(json.dumps(nemotron_line(0)) + "\n")
    read_jsonl_source(warm, SPEC, ShardReport(shard="warm"))
    report = ShardReport(shard="nemotron_math_v2/high.part_00.jsonl")
    tracemalloc.start()
    try:
        table = read_jsonl_source(path, SPEC, report)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert table.num_rows == rows and report.rows_in == 1 and report.dropped["invalid_json_line"] == 1
    assert table.column("uuid").to_pylist()[rows - 1] == f"u-{rows - 1}"
    assert table.column("source_row").to_pylist()[:12] == [*range(11), 12]  # line 11 was the bad one
    batch_bytes = size / rows * JSONL_BATCH_ROWS
    assert peak < 3 * batch_bytes < size / 2, (peak, size)  # reading it whole held five times `size`
