"""A scripted trial of the Dagster UI in headless Chromium, as a user sees it after `./scripts/build.sh` and
`./scripts/build.sh --smoke` on the repository's instance (docs/ui.md): it starts `scripts/ui.sh` (the full
builds' instance) and `scripts/ui.sh --smoke` (the smoke builds', read-only), and `scripts/ui.sh` on a scenario
it builds in a temporary directory (the sample with the anchor sources, then one shard changed and rebuilt as the
raw sensor rebuilds it), opens each page the docs show, saves a screenshot of it and checks that the rendered
page says what the docs promise.

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
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq

from synthkd_assets.core.layout import DataLayout
from synthkd_assets.defs.build import materialize_steps
from synthkd_assets.defs.instances import REPO_ROOT, instance_home
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.passes import INVENTORY_STEPS, SCAN_STEPS, SHARD_STEPS
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_dev import SAMPLE_RAW_DIR, SAMPLE_SOURCES_DIR

PAGE_BUDGET_MS = 20_000  # virtual time the page gets to load and render before Chromium captures it
WINDOW = "1500,1100"
FULL, SMOKE, SCENARIO = "full", "smoke", "scenario"  # the UIs: ui.sh, ui.sh --smoke, ui.sh on the scenario's instance
SCENARIO_SHARD = "synth_003"  # the shard whose raw bytes the scenario changes
HAND_ADDED_KEY = "synth_999"  # a partition key the scenario adds by hand: no input file has that name
# the bundled anchor sample's shard whose rows are all dropped (a long partition key, as anchor sources name them)
EMPTY_SOURCE_SHARD = "deepcoder/primeintellect/train-00000-of-00001"
GROUPS = ("ingest", "tokenizer", "synth", "megatron", "distill", "validation", "pool")  # the lineage's groups


@dataclass(frozen=True)
class Page:
    """One page of the trial: where it is, the screenshot's name, and what its rendered text must hold."""

    name: str
    path: str
    ui: str  # which UI shows it: FULL, SMOKE or SCENARIO
    expect: tuple[str, ...]
    forbid: tuple[str, ...] = ()
    forbid_pattern: str | None = None  # a regular expression the rendered page must not match


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_ui(smoke: bool, log: Path, environ: dict[str, str]) -> Iterator[str]:
    """`scripts/ui.sh [--smoke]` in `environ` on a free port of 127.0.0.1 until the block ends; yields its URL."""
    port = _free_port()
    command = [str(REPO_ROOT / "scripts" / "ui.sh"), *(["--smoke"] if smoke else [])]
    command += ["-h", "127.0.0.1", "-p", str(port)]
    with log.open("w") as out:
        ui = subprocess.Popen(
            command, cwd=REPO_ROOT, env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
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


def latest_skipped_tick(home: Path, sensor: str = "synth_raw_sensor") -> tuple[int, str] | None:
    """The id and skip reason of `sensor`'s newest tick that requested no run, or None."""
    with dg.DagsterInstance.from_config(str(home)) as instance:
        for state in instance.all_instigator_state():
            if state.instigator_name == sensor:
                for tick in instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=50):
                    if tick.skip_reason:
                        return tick.tick_id, tick.skip_reason
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
            FULL,
            ("rows_out", f">{rows_full}<", "data/megatron/synth_kd_v1<"),
            (f">{rows_smoke}<", "synth_kd_v1_smoke"),
        ),
        Page(
            "1_smoke_manifest",
            "/assets/synth_kd_v1_manifest",
            SMOKE,
            ("rows_out", f">{rows_smoke}<", "synth_kd_v1_smoke"),
        ),
        Page(
            "5_sampling_plan_metadata",
            "/assets/synth_sampling_plan",
            FULL,
            # its staleness badge explained where it shows
            ("rows_kept_share", "rate_memorization", "by design, no action needed"),
            forbid_pattern=r">\d+\.\d{6,}<",  # no float shown with more than 5 decimals
        ),
        Page(
            "4_checks_tab",
            "/assets/synth_kd_v1_manifest?view=checks",
            FULL,
            ("dataset_rows_accounted", ">Execute<", "passed: "),
        ),
        Page("7_lineage_groups", "/asset-groups", FULL, tuple(f">{group}<" for group in GROUPS)),
    ]
    tick = latest_skipped_tick(home)
    if tick is not None:  # the tick history says why a tick did nothing: ?tickId= opens that tick
        tick_id, reason = tick
        listed.append(
            Page(
                "7_sensor_tick_says_why",
                f"/locations/synthkd/sensors/synth_raw_sensor?tickId={tick_id}",
                FULL,
                ("Skip reason:", reason[:60]),
            )
        )
    if run_id is not None:
        checks_only = "?logs=type%3AASSET_CHECK_EVALUATION"  # the run's event log filtered to its checks
        listed.append(
            Page("4_run_with_a_failed_check", f"/runs/{run_id}{checks_only}", FULL, ("summary", "no action needed"))
        )
    return listed


def scenario_pages(refused_run_id: str) -> list[Page]:
    """The pages of the scenario (`build_scenario`), with what each must say; `refused_run_id`: the run of the
    hand-added partition key."""
    return [
        # a shard rebuilt after the pool: the pool group's graph and the manifest's checks say it without a click
        Page(
            "2_pool_group_after_a_shard_rebuild",
            "/locations/synthkd/asset-groups/pool",
            SCENARIO,
            ("synth_pool_manifest", "3 / 5 Passed"),  # its node's checks: bucket_balance and pool_current warn
        ),
        Page(
            "2_pool_current_needs_action",
            "/assets/synth_pool_manifest?view=checks&checkDetail=pool_current",
            SCENARIO,
            (
                "pool_current",
                "needs action: the pool synth_pool_v1 predates the rebuild of 1 shard(s): " + SCENARIO_SHARD,
            ),
        ),
        # a run of a hand-added key fails saying the key names no input file (not Dagster's partition-range trace)
        Page(
            "3_hand_added_partition_refused",
            f"/runs/{refused_run_id}?logs=type%3ASTEP_FAILURE",
            SCENARIO,
            (HAND_ADDED_KEY, "names no input file"),
        ),
        # an anchor shard whose rows are all dropped warns; its long key is shown whole on its partition's page
        Page(
            "6_empty_shard_warns",
            "/assets/synth_kd_v1?view=checks&checkDetail=shard_not_empty",
            SCENARIO,
            ("shard_not_empty", ">Failed<", "WARN when the shard writes no document"),
        ),
        Page(
            "7_long_partition_key",
            f"/assets/synth_kd_v1?view=partitions&partition={urllib.parse.quote(EMPTY_SOURCE_SHARD, safe='')}",
            SCENARIO,
            (f">{EMPTY_SOURCE_SHARD}<", "Rows dropped by reason, of 0 rows in"),
        ),
    ]


AUTOMATION_SENSOR = "synth_manifests_automation"


def automation_page(run_id: str) -> Page:
    """The manifests' job page once the daemon's automation has rewritten them (run `run_id`): the run is filed
    under synth_manifests_job, launched by the sensor, not under Dagster's implicit job."""
    return Page(
        "8_manifests_rewritten_by_the_daemon",
        "/locations/synthkd/jobs/synth_manifests_job/runs",
        SCENARIO,
        (run_id[:8], AUTOMATION_SENSOR, "Latest run"),
        ("Jobless",),
    )


def finished_automation_run(home: Path, timeout_s: float = 300.0) -> str:
    """The id of the first successful run `AUTOMATION_SENSOR` requested in the instance of `home` (the daemon of
    the scenario's UI requests it: the scenario rebuilt a shard after the manifests), waited for."""
    deadline = time.monotonic() + timeout_s
    with dg.DagsterInstance.from_config(str(home)) as instance:
        while time.monotonic() < deadline:
            runs = instance.get_runs(
                dg.RunsFilter(tags={"dagster/sensor_name": AUTOMATION_SENSOR}, statuses=[dg.DagsterRunStatus.SUCCESS])
            )
            if runs:
                return runs[-1].run_id
            time.sleep(2)
    raise RuntimeError(f"no successful run of {AUTOMATION_SENSOR} in {home} within {timeout_s:.0f} s")


def build_scenario(root: Path) -> tuple[dict[str, str], str]:
    """A third instance, in `root`: `./scripts/build.sh` on a copy of the sample with the anchor sources (one of
    whose shards has every row dropped), then one shard's raw bytes changed and the shard rebuilt as the raw
    sensor rebuilds it (inventory, then its scan and build steps; the pool left to the pool pass).

    Returns:
        The scenario's environment (DAGSTER_HOME and the roots), and the id of the failed run of a partition key
        added by hand."""
    raw = root / "raw"
    shutil.copytree(SAMPLE_RAW_DIR, raw)
    environ = {
        **os.environ,
        "DAGSTER_HOME": str(root / "home"),
        "SYNTHKD_RAW_DIR": str(raw),
        "SYNTHKD_DATA_DIR": str(root / "data"),
        "SYNTHKD_SOURCES_DIR": str(SAMPLE_SOURCES_DIR),
    }
    (root / "home").mkdir()
    subprocess.run(["bash", "scripts/build.sh"], cwd=REPO_ROOT, env=environ, check=True, capture_output=True)
    shard = raw / f"{SCENARIO_SHARD}.parquet"
    table = pq.read_table(shard)
    answers = table.column("synthetic_answer").to_pylist()
    answers[0] += "\n\nEdited upstream."
    pq.write_table(
        table.set_column(table.schema.get_field_index("synthetic_answer"), "synthetic_answer", [answers]), shard
    )
    layout = SynthKDLayout(raw_dir=str(raw), data_dir=str(root / "data"), sources_dir=str(SAMPLE_SOURCES_DIR))
    with dg.DagsterInstance.from_config(str(root / "home")) as instance:
        materialize_steps(instance, layout, INVENTORY_STEPS)
        materialize_steps(instance, layout, SHARD_STEPS, SCENARIO_SHARD)
        # a partition added by hand (the launch dialog's "Add a partition"), launched before the sensor removes it
        instance.add_dynamic_partitions(SYNTH_SHARDS.name, [HAND_ADDED_KEY])
        refused = materialize_steps(instance, layout, SCAN_STEPS, HAND_ADDED_KEY, raise_on_error=False)
    return environ, refused.run_id


def run_trial(out: Path, environ: dict[str, str], browser: str, say: Callable[[str], None] = print) -> bool:
    """Every page of `pages`, screenshots in `out`; True when every check held."""
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    work = Path(tempfile.mkdtemp(prefix="ui_trial-"))  # the scenario's instance, and the UIs' own lines
    say(f"building the scenario in {work} (build.sh with the anchor sources, then {SCENARIO_SHARD} changed)")
    scenario, refused_run_id = build_scenario(work)
    listed = [*pages(environ), *scenario_pages(refused_run_id)]
    environments = {FULL: environ, SMOKE: environ, SCENARIO: scenario}
    for ui, ui_environ in environments.items():
        with running_ui(ui == SMOKE, work / f"ui_{ui}.log", ui_environ) as url:
            here = [p for p in listed if p.ui == ui]
            if ui == SCENARIO:  # the scenario's UI runs the daemon: its automation rewrites the manifests
                here.append(automation_page(finished_automation_run(Path(ui_environ["DAGSTER_HOME"]))))
            for page in here:
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
