"""The raw input inventory: which SYNTH shards exist, and a content hash for each.

Hashing 500 shards of ~1 GB is minutes of I/O, so hashes are cached by (size, mtime_ns): an
unchanged file is never re-read, a touched or rewritten one is.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

from synthkd_assets.core.atomic import atomic_write_text
from synthkd_assets.core.manifest import sha256_file
from synthkd_assets.core.parquet_io import InputFileError

RAW_GLOB = "*.parquet"
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class InputManifestError(ValueError):
    """The user's input manifest is malformed, or disagrees with the raw files; the message says where."""


@dataclass(frozen=True)
class RawShard:
    """One raw SYNTH Parquet file; `name` (the file stem) is its Dagster partition key."""

    name: str
    path: str
    bytes: int
    mtime_ns: int
    sha256: str


def partition_key_for(path: Path) -> str:
    return path.stem


def scan_raw_dir(raw_dir: Path, cache_path: Path | None = None) -> list[RawShard]:
    """Every `*.parquet` under `raw_dir` (sorted), hashed, reusing cached hashes of unchanged files."""
    if not raw_dir.is_dir():
        raise FileNotFoundError(f"raw SYNTH directory {raw_dir} does not exist")
    cache = _load_cache(cache_path)
    shards = []
    for path in sorted(raw_dir.glob(RAW_GLOB)):
        stat = path.stat()
        cached = cache.get(str(path.resolve()))
        if cached and cached["bytes"] == stat.st_size and cached["mtime_ns"] == stat.st_mtime_ns:
            digest = cached["sha256"]
        else:
            digest = sha256_file(path)
        shards.append(RawShard(partition_key_for(path), str(path), stat.st_size, stat.st_mtime_ns, digest))
    updated = {str(Path(s.path).resolve()): asdict(s) for s in shards}
    if cache_path is not None and updated != cache:  # steps of one run may scan at the same time
        atomic_write_text(cache_path, json.dumps(updated, indent=1, sort_keys=True), shared=True)
    return shards


def _load_cache(cache_path: Path | None) -> dict[str, dict]:
    if cache_path is None or not cache_path.is_file():
        return {}
    try:
        return json.loads(cache_path.read_text())
    except json.JSONDecodeError:
        return {}  # a damaged cache only costs a re-hash


def partition_changes(registered: list[str], shards: list[RawShard]) -> tuple[list[str], list[str]]:
    """(to add, to remove) so that the registered partitions are exactly the files present."""
    present = {s.name for s in shards}
    return sorted(present - set(registered)), sorted(set(registered) - present)


def shards_to_rebuild(last_seen: dict[str, str], shards: list[RawShard], built_from: dict[str, str | None]) -> list[str]:
    """Shards whose bytes differ from what their current synth_harmony output was built from.

    `last_seen` (the sensor cursor) suppresses asking twice for the same content while a run is in
    flight; `built_from` (source hashes recorded in the step reports on disk) means a fresh cursor
    does not rebuild shards that are already up to date.
    """
    return sorted(
        s.name for s in shards if last_seen.get(s.name) != s.sha256 and built_from.get(s.name) != s.sha256
    )


class RawShardChangedError(InputFileError):
    """A raw shard whose bytes are not the ones the step was scheduled for, or changed while being read."""


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


@contextlib.contextmanager
def read_raw_shard(path: Path, expected_sha256: str | None = None) -> Iterator[RawRead]:
    """Open a raw shard once, hash it through that open file and yield it to be parsed from the same
    file: the recorded hash describes the bytes parsed, and a file replaced by rename meanwhile cannot
    be mixed in. RawShardChangedError naming the file when the hash is not `expected_sha256` (the
    bytes changed since the inventory scan). Call `check_unchanged()` after parsing, before publishing."""
    try:
        handle = open(path, "rb")
    except OSError as error:  # missing, a directory, unreadable
        raise InputFileError(f"{path}: not a readable Parquet file ({type(error).__name__}: {error})") from error
    with handle:
        identity = _identity(handle.fileno())
        digest = hashlib.sha256()
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
        read = RawRead(path, handle, digest.hexdigest(), identity[1], identity)
        if expected_sha256 is not None and read.sha256 != expected_sha256:
            raise RawShardChangedError(
                f"{path}: raw shard changed since the inventory scan (scanned sha256 {expected_sha256[:12]}, "
                f"read {read.sha256[:12]}); rescan (synth_raw_inventory or the sensor) and rebuild this shard"
            )
        read.check_unchanged()
        handle.seek(0)
        yield read


def read_input_manifest(path: Path) -> dict[str, str] | None:
    """`{file name: sha256}` listed by a user-provided input manifest, or None when `path` does not exist.

    Format (README "Scheduled rebuilds"): `{"shards": [{"file": "synth_00.parquet", "sha256": "<64 hex>"}, ...]}`,
    file names relative to the raw directory.
    """
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputManifestError(f"{path}: not a JSON input manifest ({exc})") from exc
    entries = data.get("shards") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise InputManifestError(f'{path}: expected {{"shards": [{{"file": "<name>.parquet", "sha256": "<hex>"}}, ...]}}')
    listed: dict[str, str] = {}
    for i, entry in enumerate(entries):
        file, sha = (entry.get("file"), entry.get("sha256")) if isinstance(entry, dict) else (None, None)
        if not isinstance(file, str) or Path(file).name != file or not Path(file).match(RAW_GLOB):
            raise InputManifestError(f"{path}: shards[{i}]: 'file' must name a *.parquet file in the raw directory, got {file!r}")
        if not isinstance(sha, str) or not SHA256_HEX.fullmatch(sha):
            raise InputManifestError(f"{path}: shards[{i}] ({file}): 'sha256' must be 64 lowercase hex digits, got {sha!r}")
        if file in listed:
            raise InputManifestError(f"{path}: shards[{i}]: {file} is listed twice")
        listed[file] = sha
    return listed


def input_manifest_disagreements(listed: dict[str, str], shards: list[RawShard]) -> list[str]:
    """Where the raw directory is not what the input manifest lists: one line per file, sorted."""
    on_disk = {Path(s.path).name: s.sha256 for s in shards}
    problems = []
    for file in sorted(set(listed) | set(on_disk)):
        if file not in on_disk:
            problems.append(f"{file}: listed (sha256 {listed[file]}) but not in the raw directory")
        elif file not in listed:
            problems.append(f"{file}: in the raw directory but not listed")
        elif listed[file] != on_disk[file]:
            problems.append(f"{file}: listed sha256 {listed[file]}, the file's is {on_disk[file]}")
    return problems
