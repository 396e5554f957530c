"""dagster-webserver as a subprocess on 127.0.0.1, asked over GraphQL: Dagster's public view of a code location
(stale status, checks, partitions) as the UI shows it."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from tests.helpers import REPO_ROOT

WEBSERVER = Path(sys.executable).parent / "dagster-webserver"


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        payload = json.loads(response.read())
    assert "errors" not in payload, payload
    return payload["data"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_webserver(env: Mapping[str, str], *location: str) -> Iterator[int]:
    """dagster-webserver on `location` (`-m module` or `-f file`) with environment `env`; yields its port."""
    port = free_port()
    server = subprocess.Popen(
        [str(WEBSERVER), *location, "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO_ROOT,
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5)
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "dagster-webserver did not come up"
                time.sleep(1)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)
