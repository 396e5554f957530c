"""What the build wrote, known from its own record: the only files it ever removes (docs/design.md, "What the
build owns").

Every file the build publishes (core/atomic.py) is recorded, before it takes its final name, in the written
ledger of the output root it lies under (`<root>/.synthkd/written.jsonl`, one JSON line per publication: the
path relative to the root, the inode, the size and the modification time). A file is the build's when its path
and what `lstat` says now match a line: a user's file (a note, a backup, a copy put in place of an output) is
not, whatever its name, and neither is anything reached through a symbolic link. Removal asks the ledger; a file
it does not know stays where it is.

Output roots are registered by the layout (`DataLayout`) of the process: writes below a root never go through a
directory symlink planted inside it (`refuse_symlinked_dirs`), so neither outputs nor deletions can land outside
it. The root itself may be a link (a data root on another disk).

The ledger is appended with one `write` per line (O_APPEND), so concurrent writers never interleave; a line lost
to a crash only leaves a file unremovable (never a foreign file removable).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path

# the written ledger of an output root, relative to it (listed with every path in core/layout.py)
WRITTEN_LEDGER = Path(".synthkd") / "written.jsonl"

_OUTPUT_ROOTS: dict[Path, None] = {}  # absolute, insertion-ordered; the deepest containing root wins


class OutputPathError(OSError):
    """An output path that would leave the output root: a directory symlink planted inside it, or a link or a
    non-directory where the build needs a directory."""


def register_output_root(root: Path) -> None:
    """Make `root` an output root of this process: what is written below it is recorded in its ledger, and
    never through a symlinked directory.

    Args:
        root: a data root (or a DistillKit root given apart from it), relative to the working directory or not.
    """
    _OUTPUT_ROOTS[Path(os.path.abspath(root))] = None


def output_root_of(path: Path) -> Path | None:
    """The registered output root `path` lies below (the deepest one), compared as written, links unresolved.

    Args:
        path: any path.

    Returns:
        The root, or None when `path` is under no registered root.
    """
    absolute = Path(os.path.abspath(path))
    below = [root for root in _OUTPUT_ROOTS if absolute == root or root in absolute.parents]
    return max(below, key=lambda root: len(root.parts)) if below else None


def ledger_path(root: Path) -> Path:
    """The written ledger of the output root `root`."""
    return root / WRITTEN_LEDGER


def refuse_symlinked_dirs(path: Path) -> None:
    """Refuse a path below a registered output root whose directories, between the root and `path`'s parent,
    include a symbolic link (or something that is not a directory); directories not there yet are fine (they are
    created as real ones).

    Args:
        path: a file about to be written or removed.

    Raises:
        OutputPathError: naming the link, where it points and the root.
    """
    root = output_root_of(path)
    if root is None:
        return
    current = root
    for part in Path(os.path.abspath(path)).relative_to(root).parts[:-1]:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise OutputPathError(
                f"{current} is a symbolic link (to {os.readlink(current)}) inside the output root {root}: the "
                "build writes and removes files only in real directories there; replace the link by a directory"
            )
        if not stat.S_ISDIR(mode):
            raise OutputPathError(f"{current} is not a directory, but the build writes {path} below it")


def _identity(path: str, status: os.stat_result) -> tuple[str, int, int, int]:
    return path, status.st_ino, status.st_size, status.st_mtime_ns


_BEING_WRITTEN = -1  # size and mtime of a partial file's line: it is the build's by path and inode alone


def record_written(final_path: Path, written: Path, partial: bool = False) -> None:
    """Record that the build publishes `written` (a complete file, its bytes final) under `final_path`: before the
    rename, so that a crash after it never leaves an output the ledger does not know. With `partial`, record the
    partial file `written` itself as it is created (`final_path` is `written`): a partial a killed writer left
    behind is the build's to remove too.

    Args:
        final_path: the output's final name (or the partial's own, with `partial`).
        written: the file that will be renamed onto it (same inode, size and modification time after the rename).
        partial: whether `written` is a partial file still being written.
    """
    root = output_root_of(final_path)
    if root is None:
        return
    relative = Path(os.path.abspath(final_path)).relative_to(root).as_posix()
    identity = _identity(relative, os.lstat(written))
    if partial:
        identity = (relative, identity[1], _BEING_WRITTEN, _BEING_WRITTEN)
    line = json.dumps(dict(zip(("path", "ino", "size", "mtime_ns"), identity, strict=True)))
    ledger = ledger_path(root)
    refuse_symlinked_dirs(ledger)
    ledger.parent.mkdir(exist_ok=True)
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def _ledger_entries(root: Path) -> set[tuple[str, int, int, int]]:
    try:
        text = ledger_path(root).read_text(encoding="utf-8")
    except FileNotFoundError:
        return set()
    entries = set()
    for line in text.splitlines():
        try:
            entry = json.loads(line)
            entries.add((entry["path"], entry["ino"], entry["size"], entry["mtime_ns"]))
        except (ValueError, KeyError, TypeError):  # a torn last line of a crashed writer: no file of its own
            continue
    return entries


class WrittenFiles:
    """The files the build wrote, as its ledgers record them, read once (for one cleanup)."""

    def __init__(self) -> None:
        self._entries: dict[Path, set[tuple[str, int, int, int]]] = {}

    def owns(self, path: Path) -> bool:
        """Whether `path` is a regular file the build wrote and nobody replaced since, reached through no
        symlinked directory below its output root.

        Args:
            path: any path.

        Returns:
            False for a file under no registered root, a link, a file the ledger does not know (by path, inode,
            size and modification time), or one below a symlinked directory.
        """
        root = output_root_of(path)
        if root is None:
            return False
        try:
            refuse_symlinked_dirs(path)
            status = os.lstat(path)
        except OSError:
            return False
        if not stat.S_ISREG(status.st_mode):
            return False
        if root not in self._entries:
            self._entries[root] = _ledger_entries(root)
        relative = Path(os.path.abspath(path)).relative_to(root).as_posix()
        entries = self._entries[root]
        partial = (relative, status.st_ino, _BEING_WRITTEN, _BEING_WRITTEN)
        return _identity(relative, status) in entries or partial in entries


def written_by_build(paths: Iterable[Path]) -> list[Path]:
    """The paths among `paths` that the build wrote (`WrittenFiles.owns`), in their order.

    Args:
        paths: candidate files.

    Returns:
        Those the ledgers record as the build's, unchanged since.
    """
    written = WrittenFiles()
    return [path for path in paths if written.owns(path)]


def remove_written(paths: Iterable[Path]) -> list[Path]:
    """Remove the files among `paths` that the build wrote (`written_by_build`); leave every other one.

    Args:
        paths: files to remove if they are the build's.

    Returns:
        The files removed.
    """
    removed = written_by_build(paths)
    for path in removed:
        path.unlink(missing_ok=True)
    return removed
