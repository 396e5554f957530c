"""A raw file as SYNTH publishes them, ONE row group (~450 MB a file), is read page by page: a step's memory does not
grow with the row group's column chunks (issue #42; benchmarks/README.md, line 9)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import REPO_ROOT

MIB = 1 << 20
ROWS = 40_000
TEXT_BYTES = 2_000  # incompressible text a row: a ~60 MiB zstd column chunk, ~76 MiB of strings

READER = """
import hashlib, json, sys
from pathlib import Path

from synthkd_assets.core.parquet_io import iter_frames

def status(field):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))

path = Path(sys.argv[1])
digest, rows = hashlib.sha256(), 0
for frame in iter_frames(path, ["synth_id", "text"], max_rows=4096):  # warm up: thread pools, allocators
    frame["text"].to_list()
with open(path, "rb") as source:  # as read_raw_shard hands it over: an open file, already hashed
    frames = iter_frames(path, ["synth_id", "text"], source=source)
    base = status("VmRSS:")
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS: the peak from here on
    for frame in frames:
        digest.update("".join(f"{t}\\0" for t in frame["text"].to_list()).encode())
        rows += frame.height
print(json.dumps({"rows": rows, "sha256": digest.hexdigest(), "growth": status("VmHWM:") - base}))
"""


def one_row_group_file(path: Path) -> tuple[int, str]:
    """ROWS rows of incompressible text in ONE row group, zstd, as SYNTH's files are; (the text column's compressed
    chunk bytes, sha256 of its values as the reader hashes them)."""
    text = base64.b64encode(os.urandom(ROWS * TEXT_BYTES * 3 // 4)).decode()
    texts = [text[i * TEXT_BYTES : (i + 1) * TEXT_BYTES] for i in range(ROWS)]
    table = pa.table({"synth_id": [f"r{i}" for i in range(ROWS)], "text": texts})
    pq.write_table(table, path, row_group_size=ROWS, compression="zstd")
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_row_groups == 1
    chunk = metadata.row_group(0).column(1).total_compressed_size
    return chunk, hashlib.sha256("".join(f"{t}\0" for t in texts).encode()).hexdigest()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_a_one_row_group_file_is_read_in_memory_far_below_its_column_chunks(tmp_path):
    path = tmp_path / "synth_001.parquet"
    chunk, expected = one_row_group_file(path)
    assert chunk > 50 * MIB
    done = subprocess.run(
        [sys.executable, "-c", READER, str(path)], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert (read["rows"], read["sha256"]) == (ROWS, expected)  # every row, every byte, in file order
    # read whole, the text's column chunk alone (~58 MiB) is held at once (+63 MiB here before pages were streamed);
    # streamed, a page and a batch (+7-13 MiB)
    assert read["growth"] < chunk / 2, (
        f"reading grew RSS by {read['growth'] / MIB:.1f} MiB ({chunk / MIB:.0f} MiB chunk)"
    )
