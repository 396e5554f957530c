"""scripts/ui.sh (the README's `dg dev`) started in the background as a script or a service manager starts it,
with SIGINT ignored: SIGTERM stops it, its webserver, daemon and code servers with it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

STOP_WITHIN_S = 60.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    # zombies are gone processes not yet reaped by init
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def _can_launch(port: int) -> bool:
    """Whether the UI offers "Launch run" (a read-only webserver does not)."""
    query = json.dumps({"query": "{ permissions { permission value } }"}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", data=query, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        permissions = json.loads(response.read())["data"]["permissions"]
    return {p["permission"]: p["value"] for p in permissions}["launch_pipeline_execution"]


@pytest.mark.parametrize(("signum", "smoke"), [(signal.SIGTERM, False), (signal.SIGINT, False), (signal.SIGTERM, True)])
def test_the_ui_started_in_the_background_stops_on_sigterm_and_sigint(tmp_path, signum, smoke):
    """`--smoke`: the smoke builds' own instance ($DAGSTER_HOME/smoke/), read-only, without a daemon."""
    port = _free_port()
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "DAGSTER_HOME": str(home), "SYNTHKD_DATA_DIR": str(tmp_path / "data")}
    log = (tmp_path / "ui.log").open("w")
    ui = subprocess.Popen(
        [str(REPO_ROOT / "scripts" / "ui.sh"), *(["--smoke"] if smoke else []), "-h", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # what `&` in a script (or nohup for SIGHUP) gives the command: SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
                    break
            except OSError:
                assert ui.poll() is None, (tmp_path / "ui.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "the UI did not answer"
                time.sleep(1)
        served = home / "smoke" if smoke else home
        assert (served / "dagster.yaml").is_file()  # the repository's settings, written into a new DAGSTER_HOME
        if smoke:
            assert "builds: smoke" in (served / "dagster.yaml").read_text()
        assert _can_launch(port) is not smoke
        os.kill(ui.pid, signum)  # the main process only, as `kill <pid>` or a service manager's stop does
        ui.wait(timeout=STOP_WITHIN_S)
        deadline = time.monotonic() + STOP_WITHIN_S
        while _group_alive(ui.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _group_alive(ui.pid), "a process of the UI outlived it"
        if not smoke:  # dg dev's last line; the smoke UI is the webserver alone
            assert "Dagster services shut down." in (tmp_path / "ui.log").read_text()
    finally:
        if ui.poll() is None or _group_alive(ui.pid):
            os.killpg(ui.pid, signal.SIGKILL)
        log.close()
