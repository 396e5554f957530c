"""What a run costs when the UI launches it, against the same run launched as `./scripts/build.sh` launches it.

After one `./scripts/build.sh` on the bundled sample (fresh DAGSTER_HOME and data root, nothing else set), on a
webserver and daemon of that instance (`synthkd_assets.launch.launch_services`, as the build uses them), with the
build's roots in their environment as the README's `dg dev` has them:

1. one shard's scan assets (`synth_harmony, synth_filtered, synth_signatures` and their checks), launched
   alternately as the build launches them (a run of `synth_scan_job`, its partition tagged) and as the UI's asset
   graph does ("Materialize" on those assets for that partition: a run of Dagster's implicit `__ASSET_JOB` with
   that asset selection), `--repeats` times each; each run's launch -> end and launch -> RUN_START from the
   instance (the target: the UI's run costs what the build's does);
2. "Materialize all" from the global asset graph: the backfill the UI's dialog launches over every asset and
   every partition (`launchPartitionBackfill`, all partitions), its wall time to completion, against the
   build's wall time.

    .venv/bin/python benchmarks/ui_launch_costs.py --repeats 5 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

from launch_costs import one_build  # noqa: E402

from synthkd_assets.defs.passes import SCAN_STEPS  # noqa: E402
from synthkd_assets.defs.tags import PARTITION_TAG  # noqa: E402
from synthkd_assets.launch import (  # noqa: E402
    LOCATION_NAME,
    REPOSITORY_NAME,
    LaunchFailed,
    launch_run,
    launch_services,
    shard_partitions,
)

IMPLICIT_ASSET_JOB = "__ASSET_JOB"  # the job the UI's asset graph launches (Dagster's hidden asset job)
TARGET_RATIO = 1.25  # the UI's run against the build's, median launch -> end
BACKFILL_TIMEOUT_S = 1800.0
_CHECKS = """
query($job: PipelineSelector!) {
  pipelineOrError(params: $job) {
    ... on Pipeline { repository { assetNodes { assetKey { path } isMaterializable
      assetChecksOrError { ... on AssetChecks { checks { name assetKey { path } } } } } } }
  }
}"""
_BACKFILL = """
mutation($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
  }
}"""


def _selector(job: str) -> dict:
    return {"repositoryLocationName": LOCATION_NAME, "repositoryName": REPOSITORY_NAME, "pipelineName": job}


def _backfill_id(result: dict) -> str:
    if result["__typename"] != "LaunchBackfillSuccess":
        raise LaunchFailed(f"{result['__typename']}: {result.get('message', '')}")
    return result["backfillId"]


def asset_graph(server) -> tuple[list[dict], list[dict]]:
    """Every asset key of the code location, and the checks of the scan assets (what the UI selects with them)."""
    nodes = server.query(_CHECKS, {"job": _selector(IMPLICIT_ASSET_JOB)})["pipelineOrError"]["repository"]
    keys, scan_checks = [], []
    for node in nodes["assetNodes"]:
        if node["isMaterializable"]:  # what "Materialize all" selects (not synth_raw, which is observed)
            keys.append({"path": node["assetKey"]["path"]})
        if node["assetKey"]["path"][-1] in SCAN_STEPS:
            checks = node["assetChecksOrError"].get("checks", [])
            scan_checks += [{"name": c["name"], "assetKey": {"path": c["assetKey"]["path"]}} for c in checks]
    return keys, scan_checks


def launch(server, job: str, partition: str, scan_checks: list[dict]) -> str:
    selection = None
    if job == IMPLICIT_ASSET_JOB:  # the asset graph's "Materialize" on the three scan assets, one partition
        selection = {"assetSelection": [{"path": [step]} for step in SCAN_STEPS], "assetCheckSelection": scan_checks}
    return launch_run(server, job, {}, {PARTITION_TAG: partition}, selection)


def finished(instance: dg.DagsterInstance, run_id: str, keep) -> dict:
    while True:
        run = instance.get_run_by_id(run_id)
        if run is not None and run.is_finished:
            break
        keep()
        time.sleep(0.2)
    if run.status != dg.DagsterRunStatus.SUCCESS:
        raise RuntimeError(f"run {run_id} of {run.job_name}: {run.status}")
    stats = instance.get_run_stats(run_id)
    return {"run_s": stats.end_time - stats.launch_time, "startup_s": stats.start_time - stats.launch_time}


def backfill_runs(instance: dg.DagsterInstance, backfill_id: str, started: float, wall: float) -> dict:
    """The backfill's runs: how many, their median launch -> end, and how long no run of it was running (waiting
    for the backfill daemon's next iteration to submit the next assets' runs)."""
    spans = []
    for run in instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id})):
        stats = instance.get_run_stats(run.run_id)
        spans.append((stats.launch_time or stats.start_time, stats.end_time))
    busy, reach = 0.0, started
    for begin, end in sorted(spans):
        if end > reach:
            busy += end - max(begin, reach)
            reach = end
    return {
        "runs": len(spans),
        "run_median_s": statistics.median(end - begin for begin, end in spans),
        "idle_s": wall - busy,
    }


def materialize_all(server, instance: dg.DagsterInstance, keys: list[dict], keep) -> dict:
    """The global asset graph's "Materialize all" over every partition: its backfill's wall time to completion,
    and its runs (`backfill_runs`)."""
    started_at = time.time()
    start = time.perf_counter()
    params = {"assetSelection": keys, "allPartitions": True}
    backfill_id = _backfill_id(server.query(_BACKFILL, {"params": params})["launchPartitionBackfill"])
    while time.perf_counter() - start < BACKFILL_TIMEOUT_S:
        backfill = instance.get_backfill(backfill_id)
        if backfill.status.value != "REQUESTED":  # its status enum is not exported by dagster
            break
        keep()
        time.sleep(1.0)
    wall = time.perf_counter() - start
    if backfill.status.value != "COMPLETED_SUCCESS":
        raise RuntimeError(f"backfill {backfill_id}: {backfill.status} after {wall:.0f} s: {backfill.error}")
    return {"wall_s": wall, **backfill_runs(instance, backfill_id, started_at, wall)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="ui_launch_costs_"))
    saved = dict(os.environ)
    try:
        build = one_build(root)
        os.environ.update(
            DAGSTER_HOME=str(root / "home"),
            SYNTHKD_DATA_DIR=str(root / "data"),
            SYNTHKD_RAW_DIR=str(REPO_ROOT / "data" / "sample" / "synth_raw"),
        )
        with dg.DagsterInstance.get() as instance, launch_services(instance) as (server, daemon):
            partition = shard_partitions(instance)[0]
            keys, scan_checks = asset_graph(server)
            runs: dict[str, list[dict]] = {"synth_scan_job": [], IMPLICIT_ASSET_JOB: []}
            for _ in range(args.repeats):
                for job in runs:
                    runs[job].append(finished(instance, launch(server, job, partition, scan_checks), daemon.keep))
            backfill = materialize_all(server, instance, keys, daemon.keep)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        shutil.rmtree(root, ignore_errors=True)
    medians = {job: statistics.median(r["run_s"] for r in measured) for job, measured in runs.items()}
    ratio = medians[IMPLICIT_ASSET_JOB] / medians["synth_scan_job"]
    for job, measured in runs.items():
        times = [r["run_s"] for r in measured]
        startups = [r["startup_s"] for r in measured]
        print(
            f"{job} run of one shard's scan assets: launch -> end min {min(times):.2f} s, median "
            f"{statistics.median(times):.2f} s; start-up median {statistics.median(startups):.2f} s ({len(times)} runs)"
        )
    met = ratio <= TARGET_RATIO
    verdict = "met" if met else "NOT met"
    print(f"the UI's run / the build's run (medians): {ratio:.2f} (target <= {TARGET_RATIO}: {verdict})")
    print(
        f"build.sh on the sample: {build['wall_s']:.1f} s ({build['runs']} runs); the UI's Materialize all (a "
        f"backfill): {backfill['wall_s']:.1f} s ({backfill['runs']} runs, median {backfill['run_median_s']:.2f} s "
        f"each; {backfill['idle_s']:.0f} s with none of them running)"
    )
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "build": build, "backfill": backfill}, indent=1))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
