"""Parquet outputs depend on the rows only, not on how the input was chunked into row groups."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from synthkd_assets.core.parquet_io import (
    WRITE_ROW_GROUP_ROWS,
    ParquetShardWriter,
    list_column_flat,
    list_column_rows,
    rows_at,
    write_tables_together,
)
from synthkd_assets.core.stages import harmonize_shard
from synthkd_assets.core.synth import system_message_dict

SCHEMA = pa.schema([("a", pa.int64())])


def written_bytes(path, chunks: list[int]) -> bytes:
    with ParquetShardWriter(path, SCHEMA) as writer:
        start = 0
        for size in chunks:
            writer.write(pa.table({"a": list(range(start, start + size))}, schema=SCHEMA))
            start += size
    return path.read_bytes()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 3000), min_size=1, max_size=6))
def test_row_groups_do_not_depend_on_batch_sizes(tmp_path_factory, chunks):
    directory = tmp_path_factory.mktemp("pq")
    total = sum(chunks)
    expected = written_bytes(directory / "one.parquet", [total])
    assert written_bytes(directory / "many.parquet", chunks) == expected
    groups = pq.ParquetFile(directory / "many.parquet").metadata
    sizes = [groups.row_group(i).num_rows for i in range(groups.num_row_groups)]
    assert all(size == WRITE_ROW_GROUP_ROWS for size in sizes[:-1]) and sum(sizes) == total


def test_stage_output_is_independent_of_input_row_groups(tmp_path, sample_shards):
    table = pq.read_table(sample_shards[0])
    digests = set()
    for row_group_size in (37, 256, 100_000):
        raw = tmp_path / f"raw_{row_group_size}.parquet"
        pq.write_table(table, raw, row_group_size=row_group_size)
        out = tmp_path / f"harmony_{row_group_size}.parquet"
        harmonize_shard(raw, out, system_message_dict(), "synth_001")
        digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
    assert len(digests) == 1


def test_tables_written_together_are_all_published_or_none(tmp_path):
    schema = pa.schema([("x", pa.int64())])
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    write_tables_together([(first, schema, pa.table({"x": [1]})), (second, schema, pa.table({"x": [2]}))])
    assert pq.read_table(first)["x"].to_pylist() == [1] and pq.read_table(second)["x"].to_pylist() == [2]
    with pytest.raises(pa.ArrowInvalid):  # the second table cannot be cast: neither file is replaced
        write_tables_together([(first, schema, pa.table({"x": [3]})), (second, schema, pa.table({"x": ["no"]}))])
    assert pq.read_table(first)["x"].to_pylist() == [1] and pq.read_table(second)["x"].to_pylist() == [2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.parquet"]


def test_tables_written_together_from_a_generator_are_held_one_at_a_time(tmp_path):
    """The clusters write 500 shards' tables: each must be written and let go before the next is made."""
    schema = pa.schema([("x", pa.int64())])
    rows = 1 << 20  # 8 MiB a table
    held: list[int] = []

    def tables(fail_at: int | None = None):
        for index in range(4):
            held.append(pa.total_allocated_bytes())  # what Arrow holds before the next table is made
            if index == fail_at:
                raise OSError("the generator failed")
            yield (
                tmp_path / f"{index}.parquet",
                schema,
                pa.table({"x": pc.add(np.arange(rows), index)}),
            )  # Arrow's memory

    write_tables_together(tables())
    assert [pq.read_table(tmp_path / f"{i}.parquet")["x"][0].as_py() for i in range(4)] == [0, 1, 2, 3]
    assert max(held) - held[0] < rows * 8 // 2  # not one earlier table is still held
    with pytest.raises(OSError, match="the generator failed"):  # a failure part way: nothing replaced or left
        write_tables_together((path, schema, table.slice(0, 1)) for path, schema, table in tables(fail_at=2))
    assert pq.read_table(tmp_path / "1.parquet").num_rows == rows
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{i}.parquet" for i in range(4)]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5), max_size=6), min_size=1, max_size=4),
    st.integers(0, 3),
)
def test_a_list_columns_rows_and_flat_view_are_its_values(chunks, cut):
    """`list_column_rows` and `list_column_flat` of a column of several chunks, sliced (offsets not starting at
    0), against pyarrow's own `to_pylist`."""
    column = pa.chunked_array([pa.array(chunk, pa.list_(pa.int32())) for chunk in chunks], pa.list_(pa.int32()))
    column = column.slice(min(cut, len(column)))
    want = column.to_pylist()
    assert [row.tolist() for row in list_column_rows(column)] == want
    lengths, values = list_column_flat(column)
    assert lengths.tolist() == [len(row) for row in want] and values.tolist() == [v for row in want for v in row]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.lists(st.integers(0, 39), max_size=30), st.booleans())
def test_rows_at_are_the_rows_take_gives(rows, places, increasing):
    """`rows_at` against `Table.take`: the same rows, list and string columns included; increasing places are
    slices of the table (one chunk a run of consecutive rows, no copy), any other order is taken."""
    table = pa.table(
        {
            "id": pa.array([f"row {i}" for i in range(rows)]),
            "tokens": pa.array([list(range(i % 5)) for i in range(rows)], pa.list_(pa.int32())),
        }
    )
    places = [p for p in places if p < rows]
    if increasing:
        places = sorted(set(places))
    chosen = rows_at(table, places)
    assert chosen.to_pylist() == table.take(pa.array(places, pa.int64())).to_pylist()
    if increasing and places:
        runs = 1 + sum(1 for a, b in zip(places, places[1:]) if b != a + 1)
        assert chosen.column("tokens").num_chunks == runs
        # a slice shares the table's value buffer
        assert chosen.column("tokens").chunk(0).values.buffers()[1].address == (
            table.column("tokens").chunk(0).values.buffers()[1].address
        )
