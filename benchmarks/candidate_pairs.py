#!/usr/bin/env python
"""The clustering's candidate pairs at scale (#45, target 4): `distinct_candidate_pairs`, what `synth_clusters`
runs over every shard's 16 band keys before verification, on N generated rows; its seconds and peak memory against
a baseline tree measured in the same run, each tree's code in a child process, alternately, REPEATS times.

    .venv/bin/python benchmarks/candidate_pairs.py --rows 8000000 --baseline-tree /path/to/other/checkout
    .venv/bin/python benchmarks/candidate_pairs.py --quick   # < 1 min: a smoke run of the benchmark itself

The files hold what the step reads: `rank_key` and `band_00`..`band_15` (uint64), FILES files. A PLANTED share of
the rows are in groups of GROUP rows that share every band's key (near-duplicates), the rest have keys of their
own. Peak memory is the child's VmHWM above its start, after the files are listed and the modules imported.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

from two_trees import measure_child, min_median, peak_mib_since, start_peak_window, two_tree_arguments

REPO_ROOT = Path(__file__).resolve().parents[1]
PLANTED = 0.2  # rows in groups of near-duplicates (the near-duplicate benchmark's planted share)
GROUP = 4


def write_files(directory: Path, rows: int, files: int) -> None:
    """FILES signature stubs: rank keys and band keys, PLANTED of the rows in groups sharing their keys."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(45)
    for f in range(files):
        n = rows // files + (f < rows % files)
        grouped = int(n * PLANTED) // GROUP * GROUP
        columns = {"rank_key": rng.integers(0, 2**64, n, dtype=np.uint64)}
        for band in range(16):
            keys = rng.integers(0, 2**64, n, dtype=np.uint64)
            keys[:grouped] = np.repeat(rng.integers(0, 2**64, grouped // GROUP, dtype=np.uint64), GROUP)
            columns[f"band_{band:02d}"] = keys
        pq.write_table(pa.table(columns), directory / f"synth_{f:03d}.parquet")


def child(tree: str, directory: str) -> None:
    """One measurement in this process, with `tree`'s code: prints JSON."""
    sys.path.insert(0, tree)
    from synthkd_assets.core import near_dup

    paths = sorted(Path(directory).glob("synth_*.parquet"))
    start_rss = start_peak_window()
    started = time.perf_counter()
    if "rank_key" in inspect.signature(near_dup.distinct_candidate_pairs).parameters:  # a tree before the blocks
        pairs = near_dup.distinct_candidate_pairs(paths, near_dup.every_shards_column(paths, "rank_key"))
    else:
        pairs = near_dup.distinct_candidate_pairs(paths)
    seconds = time.perf_counter() - started
    result = {
        "seconds": seconds,
        "peak_mib": peak_mib_since(start_rss),
        "pairs": len(pairs),
        "pairs_sha256": hashlib.sha256(pairs.tobytes()).hexdigest(),
    }
    print(json.dumps(result))


def measure(tree: Path, directory: Path) -> dict:
    return measure_child(__file__, tree, directory)


def main() -> None:
    parser = two_tree_arguments(__doc__, 8_000_000, 16)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.quick:
        args.rows, args.repeats = 200_000, 1
    trees = {"this tree": REPO_ROOT}
    if args.baseline_tree:
        trees = {"baseline": args.baseline_tree.resolve(), **trees}
    found: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory(prefix="candidate_pairs_") as directory:
        write_files(Path(directory), args.rows, args.files)
        for _ in range(args.repeats):
            for name, tree in trees.items():
                found[name].append(measure(tree, Path(directory)))
    if len({runs[0]["pairs_sha256"] for runs in found.values()}) > 1:
        raise SystemExit(f"the trees' candidate pairs differ: {found}")
    first = next(iter(found.values()))[0]
    print(
        f"candidate pairs over {args.rows:,} rows in {args.files} files, {PLANTED:.0%} in groups of {GROUP} "
        f"({first['pairs']:,} distinct pairs, the same from every tree; {args.repeats} repeats, min / median)"
    )
    for name, runs in found.items():
        seconds = [run["seconds"] for run in runs]
        peak = [run["peak_mib"] for run in runs]
        print(
            f"  {name}: {min_median(seconds)} s; peak {min_median(peak, 0)} MiB "
            f"({min(peak) * 2**20 / args.rows:.0f} B a row)"
        )
    if args.baseline_tree:
        base, this = found["baseline"], found["this tree"]
        time_ratio = min(r["seconds"] for r in this) / min(r["seconds"] for r in base)
        peak_ratio = min(r["peak_mib"] for r in this) / min(r["peak_mib"] for r in base)
        print(f"  this tree / baseline: time {time_ratio:.2f}x, peak memory {peak_ratio:.2f}x (the same pairs)")


if __name__ == "__main__":
    main()
