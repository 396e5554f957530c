"""One build per data root: an exclusive `flock` on its lock file (`DataLayout.build_lock()`).

A second build on the same root stops at once with "another build holds <lock>" instead of
interleaving writes of the same `.partial` names. The lock belongs to the open file, so the kernel
drops it when the last process holding it dies (a SIGKILLed build never leaves a stale lock).
A build launched through the instance (`python -m synthkd_assets.cli build`, what scripts/build.sh runs) and
the in-process build (`defs.build.build_all`) take it with `build_lock`; the sensor and the manifests'
automation wait while it is held (`build_in_progress`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from synthkd_assets.core.ownership import OutputPathError, refuse_symlinked_dirs


class BuildLockHeld(RuntimeError):
    """Another build holds the data root's lock."""


def checked_lock_path(path: Path) -> Path:
    """`path`, the build lock, unless it is a symbolic link (opening it would create or lock a file wherever the
    link points, outside the data root).

    Args:
        path: the data root's lock file (`DataLayout.build_lock`).

    Returns:
        `path`.

    Raises:
        OutputPathError: naming the link and its target.
    """
    if path.is_symlink():
        raise OutputPathError(
            f"{path} is a symbolic link (to {os.readlink(path)}): the build lock is a regular file of the data root; "
            "remove the link"
        )
    refuse_symlinked_dirs(path)
    return path


def lock_fd(fd: int, path: Path) -> None:
    """Lock the open file `fd`, the lock file `path` (which stays empty).

    Args:
        fd: an open file descriptor of the lock file.
        path: the lock file's path (`DataLayout.build_lock`).

    Raises:
        BuildLockHeld: another build holds it.
        OutputPathError: `fd` is not the regular file at `path` (a link put there between the check and the open).
    """
    opened, there = os.fstat(fd), os.lstat(path)
    if (opened.st_dev, opened.st_ino) != (there.st_dev, there.st_ino) or not stat.S_ISREG(there.st_mode):
        raise OutputPathError(f"{path} is not the regular file the build opened as its lock: run the build again")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise BuildLockHeld(f"another build holds {path}: wait for it to finish, or stop it") from None


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[Path]:
    """Hold the lock file `path` for the body; raises BuildLockHeld at once if another build has it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(checked_lock_path(path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        lock_fd(fd, path)
        yield path
    finally:
        os.close(fd)  # releases the lock


def build_in_progress(path: Path) -> bool:
    """Whether a build holds the lock file `path` now (asked without taking it for longer than the test)."""
    if path.is_symlink() or not path.is_file():  # a link is no build's lock (build.sh refuses to take one)
        return False
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the test lock when it was taken
    return False
