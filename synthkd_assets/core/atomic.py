"""Crash-safe file publication: write under a `.partial` name, fsync, then rename into place.

A file only ever appears under its final name complete, so a crash (SIGKILL, full disk) never
leaves something that a reader or an asset check would take for finished output.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

PARTIAL_SUFFIX = ".partial"


def partial_path(final_path: Path) -> Path:
    return final_path.with_name(final_path.name + PARTIAL_SUFFIX)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(partials_to_finals: Sequence[tuple[Path, Path]]) -> None:
    """fsync every partial file, then rename each onto its final name, in the order given."""
    for partial, _ in partials_to_finals:
        fsync_path(partial)
    for partial, final in partials_to_finals:
        os.replace(partial, final)
    for directory in {final.parent for _, final in partials_to_finals}:
        fsync_path(directory)


@contextlib.contextmanager
def atomic_output(final_path: Path, shared: bool = False) -> Iterator[Path]:
    """Yield a `.partial` path to write; on success it replaces `final_path`, on error it is removed.

    `shared=True` is for files several processes may rewrite at once (the raw hash cache): each writer
    gets its own partial name, and the last rename wins."""
    final_path.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(final_path)
    if shared:
        partial = partial.with_name(f"{final_path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}{PARTIAL_SUFFIX}")
    try:
        yield partial
        publish([(partial, final_path)])
    finally:
        partial.unlink(missing_ok=True)


def atomic_write_bytes(final_path: Path, payload: bytes, shared: bool = False) -> None:
    with atomic_output(final_path, shared) as partial:
        partial.write_bytes(payload)


def atomic_write_text(final_path: Path, text: str, shared: bool = False) -> None:
    atomic_write_bytes(final_path, text.encode("utf-8"), shared)
