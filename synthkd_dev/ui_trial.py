"""A scripted trial of the Dagster UI in headless Chromium, as a user sees it after `./scripts/build.sh` and
`./scripts/build.sh --smoke` on the repository's instance (docs/ui.md): it starts `scripts/ui.sh` (the full
builds' instance) and `scripts/ui.sh --smoke` (the smoke builds', read-only), opens each page the docs show, saves
a screenshot of it and checks that the rendered page says what the docs promise.

    .venv/bin/python -m synthkd_dev.ui_trial --out docs/ui

Prints one line per check (`ok` / `FAILED`) and exits 1 when one fails. Needs `chromium` on PATH (or
`--chromium PATH`); nothing is installed or fetched.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from synthkd_assets.core.layout import DataLayout
from synthkd_assets.defs.instances import REPO_ROOT, instance_home

PAGE_BUDGET_MS = 20_000  # virtual time the page gets to load and render before Chromium captures it
WINDOW = "1500,1100"
GROUPS = ("ingest", "tokenizer", "synth", "megatron", "distill", "validation", "pool")  # the lineage's groups


@dataclass(frozen=True)
class Page:
    """One page of the trial: where it is, the screenshot's name, and what its rendered text must hold."""

    name: str
    path: str
    smoke: bool
    expect: tuple[str, ...]
    forbid: tuple[str, ...] = ()
    forbid_pattern: str | None = None  # a regular expression the rendered page must not match


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_ui(smoke: bool, log: Path) -> Iterator[str]:
    """`scripts/ui.sh [--smoke]` on a free port of 127.0.0.1 until the block ends; yields its base URL."""
    port = _free_port()
    command = [str(REPO_ROOT / "scripts" / "ui.sh"), *(["--smoke"] if smoke else [])]
    command += ["-h", "127.0.0.1", "-p", str(port)]
    with log.open("w") as out:
        ui = subprocess.Popen(command, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 180
            while True:
                try:
                    with urllib.request.urlopen(f"{url}/server_info", timeout=5):
                        break
                except OSError:
                    if ui.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{' '.join(command)} did not start: {log}") from None
                    time.sleep(1)
            yield url
        finally:
            os.killpg(ui.pid, signal.SIGTERM)
            ui.wait(timeout=60)


def find_chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        raise SystemExit("chromium not found on PATH: install it or pass --chromium")
    return found


def render(browser: str, url: str, screenshot: Path) -> str:
    """Chromium's (`browser`'s) screenshot of `url` into `screenshot`, and the page's rendered DOM."""
    flags = [browser, "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={WINDOW}"]
    flags.append(f"--virtual-time-budget={PAGE_BUDGET_MS}")
    subprocess.run([*flags, f"--screenshot={screenshot}", url], capture_output=True, timeout=180, check=True)
    done = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=180, check=True)
    return done.stdout


def latest_failed_check_run(home: Path) -> str | None:
    """The run id of the newest run in which a check failed (the sample's bucket_balance WARN), or None."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for run in instance.get_runs(limit=200):
            for entry in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
                if not entry.dagster_event.event_specific_data.passed:
                    return run.run_id
    return None


def pages(environ: dict[str, str]) -> list[Page]:
    """The pages docs/ui.md shows, with what each must say, from the builds on disk."""
    full, smoke = DataLayout.from_environ(environ), DataLayout.from_environ(environ, smoke=True)
    rows_full = json.loads(full.megatron_manifest().read_text())["totals"]["rows_out"]
    rows_smoke = json.loads(smoke.megatron_manifest().read_text())["totals"]["rows_out"]
    home = instance_home(environ.get("DAGSTER_HOME"))
    run_id = latest_failed_check_run(home)
    listed = [
        Page(
            "1_full_manifest",
            "/assets/synth_kd_v1_manifest",
            False,
            ("rows_out", f">{rows_full}<", "data/megatron/synth_kd_v1<"),
            (f">{rows_smoke}<", "synth_kd_v1_smoke"),
        ),
        Page(
            "1_smoke_manifest",
            "/assets/synth_kd_v1_manifest",
            True,
            ("rows_out", f">{rows_smoke}<", "synth_kd_v1_smoke"),
        ),
        Page(
            "5_sampling_plan_metadata",
            "/assets/synth_sampling_plan",
            False,
            ("rows_kept_share", "rate_memorization"),
            forbid_pattern=r">\d+\.\d{6,}<",  # no float shown with more than 5 decimals
        ),
        Page("7_lineage_groups", "/asset-groups", False, tuple(f">{group}<" for group in GROUPS)),
    ]
    if run_id is not None:
        checks_only = "?logs=type%3AASSET_CHECK_EVALUATION"  # the run's event log filtered to its checks
        listed.append(
            Page("4_run_with_a_failed_check", f"/runs/{run_id}{checks_only}", False, ("summary", "no action needed"))
        )
    return listed


def run_trial(out: Path, environ: dict[str, str], browser: str, say: Callable[[str], None] = print) -> bool:
    """Every page of `pages`, screenshots in `out`; True when every check held."""
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    listed = pages(environ)
    logs = Path(tempfile.mkdtemp(prefix="ui_trial-"))  # the UIs' own lines, named when one does not start
    for smoke in (False, True):
        with running_ui(smoke, logs / f"ui{'_smoke' if smoke else ''}.log") as url:
            for page in (p for p in listed if p.smoke == smoke):
                dom = render(browser, url + page.path, out / f"{page.name}.png")
                missing = [text for text in page.expect if text not in dom]
                present = [text for text in page.forbid if text in dom]
                if page.forbid_pattern and (match := re.search(page.forbid_pattern, dom)):
                    present.append(match.group(0))
                held = not missing and not present
                ok &= held
                why = f" (missing {missing}, present {present})" if not held else ""
                say(f"{'ok' if held else 'FAILED'}  {page.name}: {page.path}{why}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m synthkd_dev.ui_trial", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs" / "ui", help="where the screenshots go")
    parser.add_argument("--chromium", help="the Chromium binary (default: chromium on PATH)")
    args = parser.parse_args(argv)
    return 0 if run_trial(args.out, dict(os.environ), args.chromium or find_chromium()) else 1


if __name__ == "__main__":
    sys.exit(main())
