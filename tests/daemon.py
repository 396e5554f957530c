"""A real `dagster-daemon run` on a persistent sqlite DAGSTER_HOME, for the tests of what the daemon automates.

`dagster_home(tmp)` makes an instance directory configured by the repository's dagster.yaml (`cli instance-yaml`);
`running_daemon(home, env)` starts the daemon on workspace.yaml (as `dagster dev` does, its code location in a
code server subprocess) in its own process group and always terminates that group; `wait_for` polls with a
bound and says what it was waiting for, with the daemon's log tail, when the bound is hit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import dagster as dg

from synthkd_assets.defs.instances import local_instance_yaml
from synthkd_dev import REPO_ROOT

DAGSTER_DAEMON = Path(sys.executable).parent / "dagster-daemon"
T = TypeVar("T")


def dagster_home(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "dagster.yaml").write_text(local_instance_yaml())
    return directory


def open_instance(home: Path) -> dg.DagsterInstance:
    """The instance the daemon uses (same DAGSTER_HOME, same dagster.yaml), opened in this process."""
    return dg.DagsterInstance.from_config(str(home))


class Daemon:
    def __init__(self, process: subprocess.Popen, log: Path):
        self.process = process
        self.log = log

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.is_file() else ""

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float = 1.0) -> T:
        """Poll `probe` until it returns something truthy; fail after `timeout_s`, or at once if the daemon died."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = probe()
            if value:
                return value
            if self.process.poll() is not None:
                raise AssertionError(
                    f"dagster-daemon exited ({self.process.returncode}) while waiting for {what}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {timeout_s:.0f} s; daemon log tail:\n{self.log_tail()}")
            time.sleep(every_s)


@contextmanager
def running_daemon(home: Path, env: Mapping[str, str], log: Path) -> Iterator[Daemon]:
    """`dagster-daemon run -w workspace.yaml` with DAGSTER_HOME=home and `env` (the data roots, ...); its
    process group (code server, run workers, step processes) is terminated on exit, whatever happened."""
    environment = {**os.environ, **env, "DAGSTER_HOME": str(home)}
    with open(log, "w") as out:
        process = subprocess.Popen(
            [str(DAGSTER_DAEMON), "run", "-w", str(REPO_ROOT / "workspace.yaml")],
            cwd=REPO_ROOT,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield Daemon(process, log)
    finally:
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        # children (run workers) may outlive the daemon itself: make sure none of the group is left
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
