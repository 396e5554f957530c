"""What launching a build through the Dagster instance costs: `./scripts/build.sh` on the bundled sample, as the
README runs it (fresh DAGSTER_HOME and data root, nothing else set), repeated.

Reports the build's wall time (min / median; target <= 90 s on 2 cores) and, from the instance, each run's
start-up: from its launch (the launcher starting its process) to its RUN_START (the process up, the code
location loaded), against the run's whole time from launch to end. Every run is launched the same way whoever
asks (build.sh, the UI, the sensor, a backfill: the instance's queue and launcher), so this start-up is what any
run pays. `--real-file` builds one file shaped as SYNTH publishes them instead (155,800 rows in one row group,
throughput.py's `make_real_file`) and reports each shard run's start-up as a share of that run (target <= 10%).

    .venv/bin/python benchmarks/launch_costs.py --repeats 3 [--json out.json]
    .venv/bin/python benchmarks/launch_costs.py --real-file
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg

REPO_ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 90.0
TARGET_STARTUP_SHARE = 0.10  # of a real-sized shard's run


def one_build(root: Path, raw_dir: Path = REPO_ROOT / "data" / "sample" / "synth_raw") -> dict:
    env = {
        **os.environ,
        "DAGSTER_HOME": str(root / "home"),
        "SYNTHKD_DATA_DIR": str(root / "data"),
        "SYNTHKD_RAW_DIR": str(raw_dir),
    }
    for name in ("SYNTHKD_PARALLEL_RUNS", "SYNTHKD_EXECUTOR"):
        env.pop(name, None)
    start = time.perf_counter()
    done = subprocess.run([str(REPO_ROOT / "scripts" / "build.sh")], cwd=REPO_ROOT, env=env, capture_output=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"build.sh failed ({done.returncode}): {done.stderr.decode()[-3000:]}")
    startups, totals, shard_runs = [], [], []
    with dg.DagsterInstance.from_config(str(root / "home")) as instance:
        for run in instance.get_runs():
            stats = instance.get_run_stats(run.run_id)
            if stats.launch_time and stats.start_time and stats.end_time:
                startups.append(stats.start_time - stats.launch_time)
                totals.append(stats.end_time - stats.launch_time)
                if "dagster/partition" in run.tags:
                    shard_runs.append((run.job_name, startups[-1], totals[-1]))
    return {"wall_s": wall, "runs": len(startups), "startup_s": startups, "run_s": totals, "shard_runs": shard_runs}


def real_file() -> int:
    """One real-sized file through build.sh: each shard run's start-up against the run."""
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from throughput import make_real_file

    root = Path(tempfile.mkdtemp(prefix="launch_costs_real_"))
    try:
        described = make_real_file(root / "raw")
        build = one_build(root, root / "raw")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"a real-sized file ({described['rows']} rows, {described['row_groups']} row group): {build['wall_s']:.0f} s")
    worst = 0.0
    for job, startup, total in build["shard_runs"]:
        worst = max(worst, startup / total)
        print(f"  {job}: start-up {startup:.2f} s of {total:.1f} s ({100 * startup / total:.1f}%)")
    met = worst <= TARGET_STARTUP_SHARE
    print(
        f"largest share {100 * worst:.1f}% (target <= {100 * TARGET_STARTUP_SHARE:.0f}%: {'met' if met else 'NOT met'})"
    )
    return 0 if met else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--real-file", action="store_true", help="one real-sized file instead of the sample")
    args = parser.parse_args(argv)
    if args.real_file:
        return real_file()
    builds = []
    for repeat in range(args.repeats):
        root = Path(tempfile.mkdtemp(prefix=f"launch_costs_{repeat}_"))
        try:
            builds.append(one_build(root))
        finally:
            shutil.rmtree(root, ignore_errors=True)
    walls = [build["wall_s"] for build in builds]
    startups = [s for build in builds for s in build["startup_s"]]
    runs = [s for build in builds for s in build["run_s"]]
    summary = {
        "cores": len(os.sched_getaffinity(0)),
        "wall_s": walls,
        "runs_per_build": builds[0]["runs"],
        "startup_median_s": statistics.median(startups),
        "startup_max_s": max(startups),
        "startup_share_of_run_time": sum(startups) / sum(runs),
    }
    met = min(walls) <= TARGET_S
    print(
        f"build.sh on the sample, {summary['cores']} cores: wall min {min(walls):.1f} s, median "
        f"{statistics.median(walls):.1f} s over {len(walls)} builds (target <= {TARGET_S:.0f} s: "
        f"{'met' if met else 'NOT met'}); {summary['runs_per_build']} runs each; a run's start-up (launch -> "
        f"RUN_START) median {summary['startup_median_s']:.2f} s, max {summary['startup_max_s']:.2f} s, "
        f"{100 * summary['startup_share_of_run_time']:.0f}% of the runs' time on the sample"
    )
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "builds": builds}, indent=1))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
