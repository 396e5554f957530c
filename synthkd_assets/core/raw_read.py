"""A raw input file opened once: hashed and parsed through the same handle, so the sha256 a build records is of
the bytes it parsed (a file replaced by rename meanwhile cannot be mixed in, an in-place rewrite is caught). Used
for SYNTH shards (core/stages.py) and anchor-source shards (core/sources/base.py)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from synthkd_assets.core.parquet_io import InputFileError, RawShardChangedError


def _identity(fd: int) -> tuple[int, int, int, int]:
    stat = os.fstat(fd)
    return stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns


@dataclass
class RawRead:
    """A raw shard opened once: `file` to parse, and the sha256 / size of the bytes behind it."""

    path: Path
    file: BinaryIO
    sha256: str
    bytes: int
    _identity: tuple[int, int, int, int]

    def check_unchanged(self) -> None:
        """Raise RawShardChangedError if the open file was written to since it was hashed (size, mtime
        or ctime changed: the kernel stamps an in-place rewrite with a new ctime)."""
        if _identity(self.file.fileno()) != self._identity:
            raise RawShardChangedError(
                f"{self.path}: raw shard was modified while it was being read (sha256 {self.sha256[:12]} at the "
                "start); its output is discarded: rebuild this shard"
            )


def whole_file_digest(handle: BinaryIO) -> tuple[str, int]:
    """sha256 and size of every byte of an open file, read from its start."""
    digest = hashlib.sha256()
    size = 0
    while chunk := handle.read(1 << 20):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


@contextlib.contextmanager
def read_raw_shard(
    path: Path,
    expected_sha256: str | None = None,
    file_kind: str = "Parquet",
    digest: Callable[[BinaryIO], tuple[str, int]] = whole_file_digest,
) -> Iterator[RawRead]:
    """Open a raw shard once, hash it through that open file and yield it to be parsed from the same
    file: the recorded hash describes the bytes parsed, and a file replaced by rename meanwhile cannot
    be mixed in. RawShardChangedError naming the file when the hash is not `expected_sha256` (the
    bytes changed since the inventory scan); InputFileError "not a readable <file_kind> file" when it can't be
    opened. Call `check_unchanged()` after parsing, before publishing. `digest` hashes what the step reads (the
    whole file by default; an artifact range hashes its row groups' bytes: core/harmony_artifact.py)."""
    try:
        handle = open(path, "rb")
    except OSError as error:  # missing, a directory, unreadable
        raise InputFileError(f"{path}: not a readable {file_kind} file ({type(error).__name__}: {error})") from error
    with handle:
        identity = _identity(handle.fileno())
        sha256, size = digest(handle)
        read = RawRead(path, handle, sha256, size, identity)
        if expected_sha256 is not None and read.sha256 != expected_sha256:
            raise RawShardChangedError.since_scan(path, expected_sha256, read.sha256)
        read.check_unchanged()
        handle.seek(0)
        yield read
