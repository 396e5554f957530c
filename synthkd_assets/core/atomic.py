"""Crash-safe file publication: write under a fresh `.partial` name, fsync, then rename into place.

A file only ever appears under its final name complete, so a crash (SIGKILL, full disk) never
leaves something that a reader or an asset check would take for finished output.

Every published file is recorded in its output root's written ledger first (core/ownership.py): what the
build may later remove.

Partial names are unpredictable and created exclusively (`<name>.<random>.partial`, O_CREAT|O_EXCL|O_NOFOLLOW,
so an existing name, a planted symlink included, is never opened or followed), each recorded in the written
ledger before it is created (a kill between the two leaves no partial the build cannot claim), and each is
`flock`ed by its writer while it lives. A partial left by a killed writer (its lock
died with it) is removed by the next writer of the same file; a live writer's is left alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from synthkd_assets.core.ownership import output_root_of, owns, record_written, refuse_symlinked_dirs
from synthkd_contract.constants import PARTIAL_SUFFIX  # the writers' partial files end with it


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# published files get the mode a plain open() would give them (partials are created 0600)
FILE_MODE = 0o666 & ~_umask()


def partial_glob(final_path: Path) -> str:
    """The glob matching every partial name of `final_path` (in its directory)."""
    return f"{final_path.name}.*{PARTIAL_SUFFIX}"


class PartialFile:
    """A new, uniquely named, exclusively created file next to `final_path`, locked until released.

    Writers that open files by path (pyarrow, synthkd_contract's IndexedDatasetWriter) open `path`,
    which this object created as a regular file, so they never follow a link planted by someone else.
    """

    def __init__(self, final_path: Path) -> None:
        self.final = final_path
        refuse_symlinked_dirs(final_path)  # below an output root, never through a planted directory link
        final_path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(final_path)
        self.path, fd = _create_recorded_partial(final_path)
        self._fd: int | None = fd
        try:
            os.fchmod(fd, FILE_MODE)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            self.discard()
            raise

    def release(self) -> None:
        """Drop the lock (after the rename, or once the file is gone)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def discard(self) -> None:
        """Remove the partial file (whatever state it is in) and drop the lock."""
        try:
            self.path.unlink(missing_ok=True)
        finally:
            self.release()


def _create_recorded_partial(final_path: Path) -> tuple[Path, int]:
    """A fresh partial name of `final_path`, recorded in the written ledger and then created exclusively (never
    following a link): a writer killed at any point leaves either no file or one the ledger names as the build's."""
    while True:
        path = final_path.with_name(f"{final_path.name}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}")
        record_written(path, path, partial=True)  # a line for a file never created is dropped by compaction
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return path, os.open(path, flags, 0o600)
        except FileExistsError:
            continue


def remove_stale_partials(final_path: Path) -> list[Path]:
    """Remove the partial files of `final_path` whose writer is gone (their lock is free).

    Only regular files are touched: a symlink or anything else at a partial name is left as it is, and so is a
    file below an output root that the build's written ledger does not record (core/ownership.py)."""
    removed = []
    for candidate in final_path.parent.glob(partial_glob(final_path)):
        try:
            fd = os.open(candidate, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:  # a symlink (ELOOP), vanished meanwhile, unreadable: not ours to judge
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live writer holds it
            if output_root_of(candidate) is not None and not owns(candidate):
                continue  # below an output root, only a partial the build created (its written ledger)
            candidate.unlink(missing_ok=True)
            removed.append(candidate)
        finally:
            os.close(fd)
    return removed


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(partials_to_finals: Sequence[tuple[Path, Path]]) -> None:
    """fsync every partial file, record it in its output root's written ledger (core/ownership.py), then rename
    each onto its final name, in the order given."""
    for partial, final in partials_to_finals:
        fsync_path(partial)
        record_written(final, partial)
    for partial, final in partials_to_finals:
        os.replace(partial, final)
    for directory in {final.parent for _, final in partials_to_finals}:
        fsync_path(directory)


def publish_partials(partials: Sequence[PartialFile]) -> None:
    """`publish` a group of PartialFiles together (in the order given), then release their locks."""
    try:
        publish([(p.path, p.final) for p in partials])
    finally:
        for p in partials:
            p.release()


def discard_all(partials: Sequence[PartialFile]) -> None:
    """Remove every partial of the group, even if removing one fails; the first error is raised after."""
    first: BaseException | None = None
    for p in partials:
        try:
            p.discard()
        except BaseException as error:  # noqa: BLE001 - keep removing the others
            first = first or error
    if first is not None:
        raise first


@contextlib.contextmanager
def atomic_output(final_path: Path, shared: bool = False) -> Iterator[Path]:
    """Yield a fresh partial path to write; on success it replaces `final_path`, on error it is removed.

    Several processes may write the same file at once (`shared`, e.g. the raw hash cache): each has
    its own partial, and the last rename wins. (Every partial name is unique, so `shared` is implied.)"""
    partial = PartialFile(final_path)
    try:
        yield partial.path
        publish_partials([partial])
    finally:
        partial.discard()


def atomic_write_bytes(final_path: Path, payload: bytes, shared: bool = False) -> None:
    partial = PartialFile(final_path)
    try:
        with os.fdopen(os.dup(partial._fd), "wb") as handle:  # the created file itself, not a path lookup
            handle.write(payload)
        publish_partials([partial])
    finally:
        partial.discard()


def atomic_write_text(final_path: Path, text: str, shared: bool = False) -> None:
    atomic_write_bytes(final_path, text.encode("utf-8"), shared)
