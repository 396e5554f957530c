"""Parquet in and out: streaming batch reads with clear errors, deterministic atomic writes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from synthkd_assets.core.atomic import PartialFile, publish_partials
from synthkd_assets.core.ownership import OutputPathError
from synthkd_assets.core.problems import one_line

# rows per frame a step reads: what a step holds at once (~1k-token SYNTH rows: ~4 MiB of arrays, ~30 MiB of Arrow
# memory through the read at 512; 2048 held ~120 MiB); outputs do not depend on it (WRITE_ROW_GROUP_ROWS does that)
READ_BATCH_ROWS = 512
WRITE_ROW_GROUP_ROWS = 2048
# bytes of a column chunk a read holds at once: pages are streamed through a buffer this size. Unbuffered, pyarrow
# reads every column's whole chunk of a row group before the first batch: a SYNTH file is ONE row group of ~450 MB,
# all of which a worker would hold (+570 MiB on a 618 MiB one: benchmarks/README.md, "A file as SYNTH publishes them")
READ_BUFFER_BYTES = 1 << 20


class InputFileError(ValueError):
    """An input file that cannot be used at all: names the file and the reason, on one line (a control character
    in a file name is shown escaped, so that no console or log line cuts the reason off)."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message))


class RawShardChangedError(InputFileError):
    """A raw shard whose bytes are not the ones the step was scheduled for, or changed while being read."""

    @classmethod
    def since_scan(cls, path: Path, scanned_sha256: str, read_sha256: str) -> RawShardChangedError:
        """The bytes read are not the version the inventory (or the sensor, the schedule) reported: SYNTH's and
        the anchor sources' one message."""
        return cls(
            f"{path}: raw shard changed since the inventory scan (scanned sha256 {scanned_sha256[:12]}, read "
            f"{read_sha256[:12]}); rescan (synth_raw_inventory or the sensor) and rebuild this shard"
        )


class OutputFileError(OSError):
    """An output file that cannot be written (unwritable directory, full disk): names the file and the reason."""


def read_arrow_schema(path: Path, source=None) -> pa.Schema:
    """The Arrow schema of a Parquet file (footer only), or InputFileError naming the file; `source`: an
    already open file of `path` to read instead."""
    try:
        return pq.ParquetFile(path if source is None else source).schema_arrow
    except Exception as error:
        raise InputFileError(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})") from error


def streaming_parquet_file(source, buffer_size: int = READ_BUFFER_BYTES) -> pq.ParquetFile:
    """A Parquet file to stream batches from in bounded memory, whatever its row groups' size. pyarrow pre-buffers
    by default, and the cache of a batch iterator over a whole file grows with the row groups it went through
    (+75 MiB over a 77k-row synth_sampled shard); without it, and with its pages read through a `buffer_size`
    buffer per column (0 would read each column chunk whole), memory stays at about a page and a batch per
    column."""
    return pq.ParquetFile(source, buffer_size=buffer_size, pre_buffer=False)


def _is_valid(array: pa.Array) -> bool:
    try:
        array.validate(full=True)
    except Exception:
        return False
    return True


def _first_invalid(batch: pa.RecordBatch) -> tuple[str, int] | None:
    """The first column of a batch that fails full validation (e.g. a string column with invalid UTF-8) and its
    first invalid row in the batch: a binary search over the column's prefixes (a prefix of a valid prefix is
    valid), only when reading already failed."""
    for name, column in zip(batch.schema.names, batch.columns):
        if not _is_valid(column):
            valid_rows, invalid_rows = 0, len(column)  # the longest valid prefix lies in [valid_rows, invalid_rows)
            while invalid_rows - valid_rows > 1:
                middle = (valid_rows + invalid_rows) // 2
                valid_rows, invalid_rows = (
                    (middle, invalid_rows) if _is_valid(column.slice(0, middle)) else (valid_rows, middle)
                )
            return name, valid_rows
    return None


def _first_unreadable_row(parquet: pq.ParquetFile, columns: Sequence[str], rows_read: int) -> int:
    """How many rows from the start of the file read: the first row of the first row group past `rows_read` (the
    rows already delivered) that cannot be read and validated, found one row group at a time, only when reading
    already failed. A batch spans row groups, so the failing batch alone would name its own first row."""
    first = 0
    for group in range(parquet.metadata.num_row_groups):
        end = first + parquet.metadata.row_group(group).num_rows
        if end > rows_read:
            try:
                parquet.read_row_group(group, columns=list(columns)).validate(full=True)
            except Exception:
                return max(first, rows_read)
        first = end
    return rows_read


def parquet_row_count(path: Path, source=None) -> int:
    """The number of rows a Parquet file holds, from its footer: no data page is read.
    `source`: an already open file of `path` to read instead of opening `path`."""
    try:
        return pq.ParquetFile(path if source is None else source).metadata.num_rows
    except Exception as error:
        raise InputFileError(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})") from error


def iter_frames(
    path: Path,
    columns: Sequence[str],
    batch_rows: int | None = None,
    max_rows: int | None = None,
    source=None,
    row_groups: Sequence[int] | None = None,
) -> Iterator[pl.DataFrame]:
    """Stream `columns` of a Parquet file as polars frames of at most `batch_rows` rows (READ_BATCH_ROWS by default).

    Every batch is fully validated first: a `string` column holding invalid UTF-8 (which Parquet's
    STRING type forbids, and which would panic inside polars) refuses the whole file, naming the
    column; only `binary` columns may carry arbitrary bytes, for the caller to judge row by row.

    Pages are streamed, never a whole column chunk: memory does not grow with a row group's size (SYNTH's
    files are one row group each). `max_rows` reads only the first rows, in file order, and stops: batches no
    larger than needed, and nothing after the prefix read or validated.
    `source`: an already open file of `path` to read instead of opening `path`; `row_groups`: only those row groups,
    in that order (an artifact range, core/harmony_artifact.py).
    """
    try:
        # pages streamed (READ_BUFFER_BYTES), never whole column chunks: a SYNTH file is one ~450 MB row group, and
        # a capped read stops after its prefix's pages; no pre-buffering: its cache keeps what it read of the file
        # until the reader is gone (~2 MiB a row group of long rows)
        parquet = streaming_parquet_file(path if source is None else source)
    except Exception as error:
        raise InputFileError(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})") from error
    missing = [c for c in columns if c not in parquet.schema_arrow.names]
    if missing:
        raise InputFileError(f"{path}: missing required columns {missing} (has {parquet.schema_arrow.names})")
    batch_rows = READ_BATCH_ROWS if batch_rows is None else batch_rows
    if max_rows is not None:
        batch_rows = max(1, min(batch_rows, max_rows))
    batches = parquet.iter_batches(batch_size=batch_rows, columns=list(columns), row_groups=row_groups)
    rows_read = 0
    while max_rows is None or rows_read < max_rows:
        batch = None
        try:
            batch = next(batches)
            if max_rows is not None and rows_read + batch.num_rows > max_rows:
                batch = batch.slice(0, max_rows - rows_read)  # the rows after the prefix are not looked at
            # pyarrow does not check string bytes on read; invalid UTF-8 would panic later inside polars
            batch.validate(full=True)
            frame = pl.from_arrow(batch)
        except StopIteration:
            return
        except Exception as error:  # corrupt pages, bad encodings, truncation found mid-file
            invalid = _first_invalid(batch) if batch is not None else None
            if invalid is not None:
                where = f"column {invalid[0]!r} is invalid at row {rows_read + invalid[1]}"
            else:
                where = f"unreadable after row {_first_unreadable_row(parquet, columns, rows_read)}"
            raise InputFileError(f"{path}: {where} ({type(error).__name__}: {error})") from error
        rows_read += frame.height
        yield frame


def list_column(values: Sequence[np.ndarray], dtype: np.dtype) -> pa.Array:
    """A pyarrow list<dtype> array from per-row numpy arrays, built from one offsets/values pair."""
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(values).astype(dtype, copy=False) if values else np.empty(0, dtype=dtype)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def list_column_flat(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list column as (each row's length, every row's values one after another), without a view per row."""
    if isinstance(column, pa.ChunkedArray):  # one chunk (a frame's) is read in place; more are joined
        array = column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    else:
        array = column
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return np.diff(offsets), values


def rows_at(table: pa.Table, rows: Sequence[int]) -> pa.Table:
    """The rows of `table` at `rows`, as `table.take(rows)` gives them, but each run of consecutive rows a slice
    of `table` (nothing copied) where `rows` increase; otherwise taken.

    Args:
        table: the rows to choose from.
        rows: the places of the rows wanted, in their order.

    Returns:
        A table of those rows (one chunk a run of consecutive rows, or one chunk when taken).
    """
    places = np.asarray(rows, dtype=np.int64)
    if len(places) == 0 or (len(places) > 1 and bool((np.diff(places) <= 0).any())):
        return table.take(pa.array(places, pa.int64()))
    breaks = np.flatnonzero(np.diff(places) != 1) + 1
    starts, ends = places[np.r_[0, breaks]], places[np.r_[breaks - 1, len(places) - 1]] + 1
    return pa.concat_tables([table.slice(a, b - a) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)])


def list_column_rows(column: pa.ChunkedArray | pa.Array) -> list[np.ndarray]:
    """The inverse of `list_column`: zero-copy numpy views, one per row."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    rows: list[np.ndarray] = []
    for chunk in chunks:
        lengths, values = list_column_flat(chunk)
        ends = np.cumsum(lengths).tolist()
        rows.extend(values[end - length : end] for length, end in zip(lengths.tolist(), ends))
    return rows


@contextlib.contextmanager
def output_errors_named(final: Path) -> Iterator[None]:
    """An OSError of the write side (ENOSPC, EIO, a regular file where a directory should be...) as an
    OutputFileError naming the final file and the reason."""
    try:
        yield
    except (OutputFileError, OutputPathError):  # they name the file and the reason already
        raise
    except OSError as error:
        blocker = next((p for p in final.parents if p.exists() and not p.is_dir()), None)
        if blocker is not None:
            reason = f"{blocker} is not a directory"
        else:
            reason = os.strerror(error.errno) if error.errno else str(error)
        raise OutputFileError(f"{final}: cannot write output: {reason} ({type(error).__name__}: {error})") from error


class ParquetShardWriter:
    """Writes one Parquet shard under a `.partial` name and publishes it on `close()`.

    Rows are buffered into row groups of exactly WRITE_ROW_GROUP_ROWS (the last one shorter) with
    fixed compression and no pandas metadata. The row groups do not depend on the sizes of the tables
    written; the bytes of some column types (strings) do: each written table is one Arrow chunk, and a
    row group made of several is paged differently than one made of one (run_step writes one table per
    window of input rows for that reason, core/steps.py). Leaving the context with an exception deletes
    the partial file.
    """

    def __init__(self, final_path: Path, schema: pa.Schema) -> None:
        self.final_path = final_path
        self.schema = schema
        with self._errors_named():
            self._partial_file = PartialFile(final_path)
        self._partial = self._partial_file.path
        self._finished = False
        self.published = False
        # zstd level 1: token lists barely compress further at higher levels, and writing is on the hot path
        try:  # the writer writes the magic bytes at once: a full disk fails here already
            with self._errors_named():
                self._writer = pq.ParquetWriter(self._partial, schema, compression="zstd", compression_level=1)
        except BaseException:
            self._partial_file.discard()
            raise
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self.rows = 0

    def _errors_named(self) -> contextlib.AbstractContextManager[None]:
        return output_errors_named(self.final_path)

    def write(self, table: pa.Table | pl.DataFrame) -> None:
        if isinstance(table, pl.DataFrame):
            table = table.to_arrow()
        if not table.num_rows:
            return
        self._pending.append(table.cast(self.schema))
        self._pending_rows += table.num_rows
        self.rows += table.num_rows
        if self._pending_rows >= WRITE_ROW_GROUP_ROWS:
            with self._errors_named():
                self._flush(final=False)

    def _flush(self, final: bool) -> None:
        buffered = pa.concat_tables(self._pending) if self._pending else self.schema.empty_table()
        whole = buffered.num_rows if final else buffered.num_rows - buffered.num_rows % WRITE_ROW_GROUP_ROWS
        for start in range(0, whole, WRITE_ROW_GROUP_ROWS):
            self._writer.write_table(buffered.slice(start, min(WRITE_ROW_GROUP_ROWS, whole - start)))
        rest = buffered.slice(whole)
        self._pending, self._pending_rows = ([rest] if rest.num_rows else []), rest.num_rows

    @property
    def partial_path(self) -> Path:
        """Where the file is written until it is published (finished, it holds the file's final bytes)."""
        return self._partial

    def add_footer_metadata(self, metadata: Mapping[str, str]) -> None:
        """Key-value metadata for the file's footer; before `finish`."""
        self._writer.add_key_value_metadata(metadata)

    def finish(self) -> None:
        """Write the last row group and the footer; the file stays under its partial name (see `publish_together`)."""
        with self._errors_named():
            self._flush(final=True)
            self._writer.close()
        self._finished = True

    def close(self) -> None:
        if not self.published:
            publish_together([self])

    def __enter__(self) -> ParquetShardWriter:
        return self

    def _discard(self) -> None:
        """Close what can be closed and remove the partial file: nothing of a failed write remains."""
        try:
            self._writer.close()
        except Exception:  # e.g. the disk is still full: the partial file goes anyway
            pass
        self._partial_file.discard()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            try:
                self.close()  # the last row group, the footer and the fsync can fail too (full disk)
            except BaseException:
                self._discard()
                raise
        else:
            self._discard()


def publish_together(writers: Sequence[ParquetShardWriter]) -> None:
    """Finish every writer, then rename all their files into place together: one that fails to finish
    (full disk) publishes none of them, and removes every partial."""
    try:
        for writer in writers:
            if not writer._finished:
                writer.finish()
        with writers[0]._errors_named():
            publish_partials([writer._partial_file for writer in writers])
        for writer in writers:
            writer.published = True
    except BaseException:
        for writer in writers:
            writer._discard()
        raise


def write_tables_together(tables: Iterable[tuple[Path, pa.Schema, pa.Table]]) -> None:
    """Write several whole tables (path, schema, rows) and publish them together: after a failure none of the
    files is in place (old versions stay as they were) and no partial file remains.

    Each table is written and its file finished (under its partial name) before the next is taken, so a
    generator of tables holds one at a time: the clusters' 500 shard tables are never all in memory.

    Args:
        tables: (final path, schema, table) of each file, in any iterable.

    Raises:
        OutputFileError: a file could not be written (it names the file and the reason); nothing is published.
    """
    writers: list[ParquetShardWriter] = []
    try:
        for path, schema, table in tables:
            writers.append(ParquetShardWriter(path, schema))
            writers[-1].write(table)
            del table
            writers[-1].finish()
    except BaseException:
        for writer in writers:
            writer._discard()
        raise
    if writers:
        publish_together(writers)
