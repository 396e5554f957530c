"""How many runs a build runs at once, the build's child processes' tie to it, and threads for per-file work.

A build uses every core it may run on by default: the process's CPU affinity (what `taskset` or a container's
cpuset allows), else os.cpu_count(). $SYNTHKD_PARALLEL_RUNS overrides it for the local instance's run queue
(`python -m synthkd_assets.cli instance-yaml`, which build.sh writes into a new $DAGSTER_HOME); the multiprocess
executor follows the core count.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import psutil

from synthkd_contract.settings import Settings

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # Ctrl-C, kill, the terminal closing
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
Item, Result = TypeVar("Item"), TypeVar("Result")


def available_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no sched_getaffinity on this platform (macOS)
        return os.cpu_count() or 1


def parallel_runs(settings: Settings) -> int:
    """Shard runs at once: $SYNTHKD_PARALLEL_RUNS when set (`settings.parallel_runs`), else every available core."""
    return settings.parallel_runs or available_cores()


def thread_map(function: Callable[[Item], Result], items: Iterable[Item], threads: int | None = None) -> list[Result]:
    """`function` of each item, in order, on one thread per available core (at most `threads`): for work that
    releases the GIL, the per-file work of a global step (reading Parquet, hashing, counting in polars or numpy) or
    the chunks of one numpy computation (the clustering's pair comparison), so that a global step uses the
    machine's cores instead of one."""
    items = list(items)
    workers = min(len(items), available_cores(), threads or len(items))
    if workers < 2:
        return [function(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(function, items))


def die_with_parent(signum: int, parent: int) -> None:
    """Have the kernel send `signum` to this process when its parent process (pid `parent`) exits, however it
    exits (Linux's PR_SET_PDEATHSIG; elsewhere nothing): a worker never outlives the build that started it."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signum)
    if os.getppid() != parent:  # the parent died before the request was made
        os.kill(os.getpid(), signum)


def watch_stop_signals(handler: Callable) -> Callable[[], int | None]:
    """Handle SIGINT, SIGTERM and SIGHUP with `handler`; returns a function that says which of them this process
    received first (None: none yet). It asks the signal wakeup file descriptor, not the handler: Dagster swaps
    the Python handlers of SIGINT and SIGTERM while it executes a run (either then interrupts the run) and
    afterwards gives SIGTERM the SIGINT handler. Call from the main thread."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    received: list[int] = []

    def first() -> int | None:
        try:
            received.extend(signum for signum in os.read(read, 4096) if signum in STOP_SIGNALS)
        except BlockingIOError:  # nothing written since the last call
            pass
        return received[0] if received else None

    return first


def process_directory(prefix: str) -> Path:
    """A new temporary directory named after this process (`<prefix><pid>-<suffix>`), for files that live as long
    as it: `remove_dead_process_directories` removes it once the process is gone without removing it itself.

    Args:
        prefix: what the directory's name starts with, one per kind of directory.

    Returns:
        The directory, in Python's temporary directory.
    """
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))


def remove_dead_process_directories(prefix: str, temporary: Path | None = None) -> list[Path]:
    """Remove the directories `process_directory(prefix)` made for processes that no longer run: one killed with
    SIGKILL cannot remove its own. A directory whose process is gone is removed, any other left alone.

    Args:
        prefix: the kind of directory (`process_directory`'s prefix).
        temporary: where the directories are (default: Python's temporary directory).

    Returns:
        The directories removed.
    """
    removed = []
    for directory in Path(temporary or tempfile.gettempdir()).glob(f"{prefix}*-*"):
        pid = directory.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and directory.is_dir() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(directory, ignore_errors=True)  # another user's stays (not ours to remove)
            if not directory.exists():
                removed.append(directory)
    return removed
