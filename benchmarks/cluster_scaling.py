#!/usr/bin/env python
"""2 Celery workers vs 1 on the local PostgreSQL + Redis + Celery cluster (issue #19: >= 1.7x building 4 shards).

    .venv/bin/python benchmarks/cluster_scaling.py                        # 4 x 10k long rows, 3 repeats each
    .venv/bin/python benchmarks/cluster_scaling.py --rows 400 --repeats 1 # a smoke run of the benchmark
    .venv/bin/python benchmarks/cluster_scaling.py --embedded             # no cluster: SYNTHKD_PARALLEL_RUNS 1 vs 2
    .venv/bin/python benchmarks/cluster_scaling.py --rows 400000 --repeats 2 [--pin-workers]   # 4 x 100k rows

Generates `--shards` raw shards of long SYNTH-like rows once (benchmarks/scale_run.py's generator: distinct
prompts, a few planted near-duplicates), then builds them with `./scripts/build.sh` alternately on a cluster
with 1 and with 2 Celery workers (synthkd_dev.local_cluster: PostgreSQL, Redis, `dagster-celery worker` with
`--concurrency=1`, so a worker is one process), `--repeats` times each. Every build starts from nothing: a new
cluster (fresh PostgreSQL database, so fresh runs), a fresh data root and DAGSTER_HOME; the cluster's start is
not timed, and each build first waits (at most 3 min) for the 1-minute load average to fall under 0.5.
build.sh runs with SYNTHKD_EXECUTOR=celery and SYNTHKD_PARALLEL_RUNS = the shard count, so every shard's run is
submitted at once and its steps queue in Redis for whichever worker is free. With `--pin-workers` each worker
runs on one core of its own (a one-core machine): unpinned, a lone worker's steps also use the second core
(polars' and the hashing threads), so on a 2-core machine 1 worker is more than one core's worth.

What is compared: the shard passes (scan, build, pool: one run per shard, the part that workers parallelize),
timed from each pass's first to its last console line. The global steps between them (inventory, the
near-duplicate plan, the manifests, the quota plan, the pool manifests) are one run of a chain of steps each,
serial by nature: with one step at a time a second worker has nothing to take; they are reported, not compared.
Prints every build, then min and median per worker count and the ratios of the medians and of the mins
(1 worker's time over 2 workers'); exits 1 if the ratio of medians is under `--target` (default 1.7).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCHMARKS))

from scale_run import REPO_ROOT, RawPlan, load_average, make_raw, run_build  # noqa: E402

SHARD_PASSES = ("scan", "build", "pool")
TARGET = 1.7
QUIET_LOAD = 0.5  # 1-minute load average a build waits for (the previous build's cluster winding down)
QUIET_WAIT_S = 180  # at most this long; the load each build started at is printed either way


def wait_until_quiet(limit: float = QUIET_LOAD, most_s: float = QUIET_WAIT_S) -> str:
    """Wait (bounded) for the 1-minute load average to fall under `limit`, so that neither worker count's builds
    start on what the one before left running; returns the load average the build starts at."""
    deadline = time.monotonic() + most_s
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(5)
    return load_average()


def worker_tasks(state: Path) -> dict[str, dict[str, float]]:
    """Per worker, the Celery tasks (steps) its log says it received and the seconds they took (`succeeded in`):
    how much of the build the workers were busy, against the wall time."""
    out = {}
    for log in sorted(state.glob("worker-*.log")):
        text = log.read_text(errors="replace")
        seconds = sum(float(s) for s in re.findall(r"Task execute_plan\[[0-9a-f-]+\] succeeded in ([0-9.]+)s", text))
        received = len(re.findall(r"Task execute_plan\[[0-9a-f-]+\] received", text))
        out[log.stem.removeprefix("worker-")] = {"steps": received, "busy_s": round(seconds, 1)}
    return out


def one_build(
    mode: str, workers: int, raw_dir: Path, state: Path, shards: int, echo: bool, pin_workers: bool = False
) -> dict:
    """A fresh build of every raw shard: a new cluster with `workers` Celery workers (or, embedded, build.sh's
    own executor with SYNTHKD_PARALLEL_RUNS = workers), a fresh data root and DAGSTER_HOME."""
    from synthkd_dev.local_cluster import LocalCluster

    shutil.rmtree(state, ignore_errors=True)
    state.mkdir(parents=True)
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    cluster = None
    try:
        if mode == "celery":
            cluster = LocalCluster(state, raw_dir, state / "data")
            up = time.monotonic()
            cluster.up(workers=workers, pin_workers=pin_workers)
            worker_cores = {name: sorted(os.sched_getaffinity(proc.pid)) for name, proc in cluster.workers.items()}
            env = {**os.environ, **cluster.env(), "SYNTHKD_PARALLEL_RUNS": str(shards), "PYTHONPATH": pythonpath}
            env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
            started_in = time.monotonic() - up
        else:
            env = {
                **os.environ,
                "SYNTHKD_RAW_DIR": str(raw_dir),
                "SYNTHKD_DATA_DIR": str(state / "data"),
                "DAGSTER_HOME": str(state / "dagster_home"),
                "SYNTHKD_PARALLEL_RUNS": str(workers),
                "PYTHONPATH": pythonpath,
            }
            env.pop("SYNTHKD_EXECUTOR", None)
            started_in = 0.0
            worker_cores = {}
        build = run_build(env, state / "build.log", interval=None, echo=echo)
        tasks = worker_tasks(state) if mode == "celery" else {}
    finally:
        if cluster is not None:
            cluster.down()
    if build["returncode"] != 0:
        tail = "\n".join(build["tail"])
        raise RuntimeError(f"build with {workers} worker(s) failed ({build['returncode']}); log {state}:\n{tail}")
    passes = {name: build["passes"][name]["wall_s"] for name in SHARD_PASSES if name in build["passes"]}
    return {
        "workers": workers,
        "seconds": build["seconds"],
        "shard_passes_s": sum(passes.values()),
        "passes_s": passes,
        "global_steps_s": {name: step["wall_s"] for name, step in build["steps"].items()},
        "tasks_per_worker": tasks,
        "cluster_start_s": started_in,
        "worker_cores": worker_cores,  # the cores each worker process may run on
    }


def summary(builds: list[dict], key: str) -> dict:
    by = {n: [b[key] for b in builds if b["workers"] == n] for n in (1, 2)}
    out = {
        f"{n}_worker{'s' if n > 1 else ''}": {"each": v, "min": min(v), "median": statistics.median(v)}
        for n, v in by.items()
    }
    one, two = out["1_worker"], out["2_workers"]
    out["ratio_of_medians"] = one["median"] / two["median"]
    out["ratio_of_mins"] = one["min"] / two["min"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40_000, help="raw rows in all (default 40000: 4 x 10k)")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="builds per worker count, alternating (default 3)")
    parser.add_argument("--embedded", action="store_true", help="no cluster: build.sh's own executor")
    parser.add_argument(
        "--pin-workers",
        action="store_true",
        help="each Celery worker on one core of its own (worker i on core i): one worker cannot borrow the idle core",
    )
    parser.add_argument("--target", type=float, default=TARGET, help="ratio of medians to reach (default 1.7)")
    parser.add_argument("--work-dir", type=Path, help="default: a temporary directory, removed at the end")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--echo", action="store_true", help="echo the builds' console lines")
    args = parser.parse_args(argv)
    mode = "embedded" if args.embedded else "celery"
    if mode == "celery":
        from synthkd_dev.local_cluster import services_available

        if missing := services_available():
            print(f"cannot start the local cluster: {missing}", file=sys.stderr)
            return 2

    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="synthkd-cluster-scaling-"))).resolve()
    raw_dir = work / "raw"
    cores = len(os.sched_getaffinity(0))
    try:
        raw = make_raw(RawPlan(args.rows, args.shards, 4, 0.02, 2026), raw_dir, work / "scratch", cores)
        print(
            f"{mode}: {args.rows:,} long rows in {args.shards} shards ({raw['raw_bytes'] / 2**20:.0f} MiB); "
            f"{cores} cores; load {load_average()}",
            flush=True,
        )
        builds = []
        for repeat in range(args.repeats):
            for workers in (1, 2) if repeat % 2 == 0 else (2, 1):  # alternating, neither always first
                load_before = wait_until_quiet()
                build = one_build(
                    mode, workers, raw_dir, work / f"build-{workers}", args.shards, args.echo, args.pin_workers
                )
                build["load_before"] = load_before
                builds.append(build)
                per_worker = build["tasks_per_worker"].items()
                tasks = "".join(
                    f"; {name} {t['steps']} steps, busy {t['busy_s']:.0f} s, cores {build['worker_cores'].get(name)}"
                    for name, t in per_worker
                )
                print(
                    f"  repeat {repeat + 1}, {workers} worker(s): shard passes {build['shard_passes_s']:.1f} s ("
                    + ", ".join(f"{k} {v:.1f}" for k, v in build["passes_s"].items())
                    + f"), whole build {build['seconds']:.1f} s{tasks}; load before {build['load_before']}",
                    flush=True,
                )
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    passes, whole = summary(builds, "shard_passes_s"), summary(builds, "seconds")
    for name, s in (("shard passes", passes), ("whole build (global steps included)", whole)):
        print(
            f"{name}: 1 worker min {s['1_worker']['min']:.1f} s / median {s['1_worker']['median']:.1f} s; "
            f"2 workers min {s['2_workers']['min']:.1f} s / median {s['2_workers']['median']:.1f} s; "
            f"ratio of medians {s['ratio_of_medians']:.2f}x, of mins {s['ratio_of_mins']:.2f}x"
        )
    met = passes["ratio_of_medians"] >= args.target
    print(f"target: 2 workers >= {args.target}x 1 worker on the shard passes (medians): {'met' if met else 'NOT MET'}")
    if args.json:
        figures = {"mode": mode, "rows": args.rows, "shards": args.shards, "cores": cores, "builds": builds}
        figures["pin_workers"] = args.pin_workers
        args.json.write_text(json.dumps({**figures, "shard_passes": passes, "whole_build": whole}, indent=2) + "\n")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
