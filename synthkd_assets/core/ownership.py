"""What the build wrote, known from its own record: the only files it ever removes (docs/design.md, "What the
build owns").

Every file the build publishes (core/atomic.py) is recorded, before it takes its final name, in the written
ledger of the output root it lies under (`<root>/.synthkd/written.jsonl`, one JSON line per publication: the
path relative to the root, the size and the modification time in nanoseconds). A file is the build's when its
path and what `lstat` says now match a line: a user's file (a note, a backup, a copy put in place of an output)
is not, whatever its name, and neither is anything reached through a symbolic link. A copy of a whole data root
that keeps modification times (`cp -a`, `rsync -a`, `shutil.copytree`) stays the build's. Removal asks the
ledger; a file it does not know stays where it is.

Output roots are registered by the layout (`DataLayout`) of the process: writes below a root never go through a
directory symlink planted inside it (`refuse_symlinked_dirs`), so neither outputs nor deletions can land outside
it. The root itself may be a link (a data root on another disk).

The ledger is appended with one `write` per line (O_APPEND), so concurrent writers never interleave; a line lost
to a crash only leaves a file unremovable (never a foreign file removable).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

# the written ledger of an output root, relative to it (listed with every path in core/layout.py)
WRITTEN_LEDGER = Path(".synthkd") / "written.jsonl"

_OUTPUT_ROOTS: dict[Path, Path] = {}  # absolute root -> its ledger; the deepest containing root wins


class OutputPathError(OSError):
    """An output path that would leave the output root: a directory symlink planted inside it."""


def register_output_root(root: Path, ledger: Path | None = None) -> None:
    """Make `root` an output root of this process: what is written below it is recorded in its ledger, and
    never through a symlinked directory.

    Args:
        root: a data root (or a DistillKit root given apart from it), relative to the working directory or not.
        ledger: where its ledger is; default `<root>/.synthkd/written.jsonl` (a dataset root, whose files its
            manifest lists, keeps its ledger outside itself: `dataset_ledger_path`).
    """
    absolute = Path(os.path.abspath(root))
    _OUTPUT_ROOTS[absolute] = Path(os.path.abspath(ledger)) if ledger is not None else absolute / WRITTEN_LEDGER


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
    """The written ledger of an output root.

    Args:
        root: an output root (registered or not).

    Returns:
        Where its ledger is: registered with it, else `<root>/.synthkd/written.jsonl`.
    """
    absolute = Path(os.path.abspath(root))
    return _OUTPUT_ROOTS.get(absolute, absolute / WRITTEN_LEDGER)


def dataset_ledger_path(data_root: Path, dataset_root: Path) -> Path:
    """The ledger of a dataset root given apart from the data root (a DistillKit root elsewhere), kept outside
    the dataset so that nothing its manifest does not list lands in it.

    Args:
        data_root: the build's data root.
        dataset_root: the dataset root given apart.

    Returns:
        `<data_root>/.synthkd/written-<sha256 of the dataset root's absolute path, 16 hex>.jsonl`.
    """
    name = hashlib.sha256(os.path.abspath(dataset_root).encode()).hexdigest()[:16]
    return Path(os.path.abspath(data_root)) / WRITTEN_LEDGER.parent / f"written-{name}.jsonl"


def refuse_symlinked_dirs(path: Path) -> None:
    """Refuse a path below a registered output root whose directories, between the root and `path`'s parent,
    include a symbolic link; directories not there yet are fine (they are created as real ones).

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
                f"{path}: not written: {current} is a symbolic link (to {os.readlink(current)}) inside the output "
                f"root {root}; the build writes and removes files only in real directories there: replace the link "
                "by a directory"
            )
        if not stat.S_ISDIR(mode):
            return  # creating the file fails, naming it (core/parquet_io.py, output_errors_named)


def _identity(path: str, status: os.stat_result) -> tuple[str, int, int]:
    return path, status.st_size, status.st_mtime_ns


_BEING_WRITTEN = -1  # size and mtime of a partial file's line: its unique name (core/atomic.py) is the build's


def record_written(final_path: Path, written: Path, partial: bool = False) -> None:
    """Record that the build publishes `written` (a complete file, its bytes final) under `final_path`: before the
    rename, so that a crash after it never leaves an output the ledger does not know. With `partial`, record the
    partial file `written` itself as it is created (`final_path` is `written`): a partial a killed writer left
    behind is the build's to remove too.

    Args:
        final_path: the output's final name (or the partial's own, with `partial`).
        written: the file that will be renamed onto it (same size and modification time after the rename).
        partial: whether `written` is a partial file still being written.
    """
    root = output_root_of(final_path)
    if root is None:
        return
    relative = Path(os.path.abspath(final_path)).relative_to(root).as_posix()
    identity = (relative, _BEING_WRITTEN, _BEING_WRITTEN) if partial else _identity(relative, os.lstat(written))
    line = json.dumps(dict(zip(("path", "size", "mtime_ns"), identity, strict=True)))
    with _locked_ledger(ledger_path(root), fcntl.LOCK_SH) as fd:
        os.write(fd, (line + "\n").encode())


@contextlib.contextmanager
def _locked_ledger(ledger: Path, mode: int) -> Iterator[int]:
    """The ledger file open for appending, under a shared (appending) or exclusive (compacting) `flock`, on the file
    that is at the path once the lock is held (a compaction renames a new file into place: a writer that opened the
    old one opens the new one)."""
    refuse_symlinked_dirs(ledger)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(ledger, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, mode)
            try:
                current = os.lstat(ledger).st_ino
            except FileNotFoundError:
                current = None
            if current == os.fstat(fd).st_ino:
                yield fd
                return
        finally:
            os.close(fd)  # drops the lock


def compact_ledger(root: Path) -> int:
    """Rewrite the ledger of the output root `root` with only the lines of files still there as recorded (the
    others can never match again): run at the start of a build, so the ledger holds what the build has on disk,
    not every file it ever wrote. Writers append meanwhile under a shared lock; this takes it exclusively.

    Args:
        root: a registered output root (a data root).

    Returns:
        How many lines were dropped.
    """
    root = Path(os.path.abspath(root))
    ledger = ledger_path(root)
    if not ledger.is_file():
        return 0
    with _locked_ledger(ledger, fcntl.LOCK_EX) as fd:
        lines = _read_from(fd, 0).splitlines()
        kept = []
        for line in lines:
            identity = _parse(line)
            if identity is None:
                continue
            try:
                status = os.lstat(root / identity[0])
            except OSError:
                continue
            if identity[1] == _BEING_WRITTEN or _identity(identity[0], status) == identity:
                kept.append(line)
        if len(kept) < len(lines):
            fresh = ledger.with_name(f"{ledger.name}.{os.getpid()}.compacting")
            fresh.write_bytes(b"".join(line + b"\n" for line in kept))
            os.replace(fresh, ledger)
    return len(lines) - len(kept)


def _read_from(fd: int, offset: int) -> bytes:
    os.lseek(fd, offset, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(line: bytes) -> tuple[str, int, int] | None:
    try:
        entry = json.loads(line)
        return entry["path"], entry["size"], entry["mtime_ns"]
    except (ValueError, KeyError, TypeError):  # a torn line of a crashed writer: no file of its own
        return None


class _Ledger:
    """One output root's ledger as read so far: each query reads only the lines appended since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._reset(None)

    def _reset(self, inode: int | None) -> None:
        self.inode, self.offset = inode, 0
        self.entries: set[tuple[str, int, int]] = set()

    def refresh(self) -> _Ledger:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:  # none yet (or a link planted there: no record of the build's)
            self._reset(None)
            return self
        try:
            status = os.fstat(fd)
            if status.st_ino != self.inode or status.st_size < self.offset:
                self._reset(status.st_ino)
            appended = _read_from(fd, self.offset)
        finally:
            os.close(fd)
        complete = appended[: appended.rfind(b"\n") + 1]  # a line being appended is read next time
        self.offset += len(complete)
        self.entries.update(identity for line in complete.splitlines() if (identity := _parse(line)) is not None)
        return self


_LEDGERS: dict[Path, _Ledger] = {}


def _ledger(root: Path) -> _Ledger:
    if root not in _LEDGERS:
        _LEDGERS[root] = _Ledger(ledger_path(root))
    return _LEDGERS[root].refresh()


def owns(path: Path) -> bool:
    """Whether `path` is a regular file the build wrote and nobody replaced since, reached through no symlinked
    directory below its output root.

    Args:
        path: any path.

    Returns:
        False for a file under no registered root, a link, a file the ledger does not know (by path, size and
        modification time), or one below a symlinked directory.
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
    entries = _ledger(root).entries
    relative = Path(os.path.abspath(path)).relative_to(root).as_posix()
    return _identity(relative, status) in entries or (relative, _BEING_WRITTEN, _BEING_WRITTEN) in entries


def written_by_build(paths: Iterable[Path]) -> list[Path]:
    """The paths among `paths` that the build wrote (`owns`), in their order.

    Args:
        paths: candidate files.

    Returns:
        Those the ledgers record as the build's, unchanged since.
    """
    return [path for path in paths if owns(path)]


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


def remove_replaced_output(paths: Iterable[Path]) -> list[Path]:
    """Remove a writer's own earlier outputs at these names, which the build must clear (before it publishes new
    ones, or to take a publication back): below a registered output root the build's (`owns`), and a file there
    it did not write is refused rather than left in place; elsewhere (a writer used on its own, with no layout,
    such as a test's directory) the files at those names.

    Args:
        paths: the names the writer must clear.

    Returns:
        The files removed.

    Raises:
        OutputPathError: a file at one of the names, below an output root, that the build's written ledger does
            not record (a user's file, an edited or copied output, a data root built before the ledger), named.
    """
    paths = [path for path in paths if os.path.lexists(path)]
    foreign = [path for path in paths if output_root_of(path) is not None and not owns(path)]
    if foreign:
        raise OutputPathError(
            f"{foreign[0]}: the build must replace or remove it, but did not write it (its written ledger "
            f"{ledger_path(output_root_of(foreign[0]))} does not record this file: edited, copied without its "
            f"times, or from a build before the ledger){f' (and {len(foreign) - 1} more)' if len(foreign) > 1 else ''}"
            ": move it away, then run again"
        )
    for path in paths:
        path.unlink(missing_ok=True)
    return sorted(paths)
