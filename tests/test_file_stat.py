"""A file's sha256 is trusted without reading it only while its stat is the one it had when it was hashed."""

from __future__ import annotations

import os
import time
from pathlib import Path

from synthkd_contract.manifest_seal import HashedFile, file_stat, sha256_file, sha256_files, unchanged_since_hashed


def _hashed(path: Path) -> HashedFile:
    return HashedFile(sha256_file(path), file_stat(path))


def _rewrite_keeping_size_and_mtime(path: Path) -> None:
    """Flip a byte in place and set the mtime back: only the ctime (which user space cannot set) still tells."""
    before = path.stat()
    time.sleep(0.05)  # past the kernel's timestamp tick
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as handle:
        handle.write(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size and path.stat().st_mtime_ns == before.st_mtime_ns


def test_a_file_with_its_recorded_stat_keeps_the_recorded_sha256_unread(tmp_path):
    """The recorded sha256 is returned as it is, however wrong, while the stat holds: proof that the file is not
    read. Files without a record, or whose stat changed, are hashed."""
    trusted, unknown = tmp_path / "a.bin", tmp_path / "b.bin"
    trusted.write_bytes(b"a" * 1000)
    unknown.write_bytes(b"b" * 1000)
    recorded = {trusted: HashedFile("recorded when written", file_stat(trusted))}
    assert sha256_files([trusted, unknown], recorded) == ["recorded when written", sha256_file(unknown)]
    assert unchanged_since_hashed(trusted, "recorded when written", recorded)
    assert not unchanged_since_hashed(trusted, sha256_file(trusted), recorded)  # another sha256 than the record's
    assert not unchanged_since_hashed(unknown, sha256_file(unknown), recorded)  # no record
    assert sha256_files([trusted, unknown]) == [sha256_file(trusted), sha256_file(unknown)]


def test_a_byte_rewritten_in_place_with_the_mtime_set_back_is_read_again(tmp_path):
    path = tmp_path / "shard_00_tokens.bin"
    path.write_bytes(os.urandom(4096))
    recorded = {path: _hashed(path)}
    _rewrite_keeping_size_and_mtime(path)
    assert not unchanged_since_hashed(path, recorded[path].sha256, recorded)
    assert sha256_files([path], recorded) == [sha256_file(path)] != [recorded[path].sha256]


def test_a_file_replaced_by_a_copy_of_its_old_stat_is_read_again(tmp_path):
    """A replacement (a new inode: a copy with the old mtime, a rename over it) is not the file that was hashed."""
    path, other = tmp_path / "part-00000.parquet", tmp_path / "other"
    path.write_bytes(b"x" * 100)
    recorded = {path: _hashed(path)}
    other.write_bytes(b"y" * 100)
    os.utime(other, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))
    other.replace(path)
    assert not unchanged_since_hashed(path, recorded[path].sha256, recorded)
    assert sha256_files([path], recorded) == [sha256_file(path)]
    path.unlink()
    assert not unchanged_since_hashed(path, recorded[path].sha256, recorded)  # gone: nothing vouches for it
