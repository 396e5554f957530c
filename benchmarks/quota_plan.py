#!/usr/bin/env python
"""The quota plan at scale (#45, targets 3 and 4): `tokenized_quota_rows` + `plan_quota_selection`, what
`synth_quota_plan` computes over every shard's row sizes, on N generated rows; its seconds and peak memory per
million rows, against a baseline tree measured in the same run, and the projection to the full corpus.

    .venv/bin/python benchmarks/quota_plan.py --rows 4000000 --baseline-tree /path/to/other/checkout
    .venv/bin/python benchmarks/quota_plan.py --quick   # < 1 min: a smoke run of the benchmark itself

The rows are generated as the tokenize steps leave them: FILES synth_tokenized shards, each with its row sizes
(`<key>.rows.parquet`, their footer recording the shard's sha256, so `current_row_sizes` reads them), exercises
drawn with SYNTH's mix after 001's sampling (memorization at its cap, the other labels as FACTS_OTHER_ROWS) and
lognormal token counts. Each measurement is a child process (one tree's code; peak RSS is its VmHWM above the
process's start), run alternately with the baseline, REPEATS times: min and median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FULL_CORPUS_ROWS = 77_900_000  # real SYNTH's rows (../shared/SYNTH-facts.md); the quota sees fewer, after 001
REPEATS = 3
# the rows the quota sees, after 001's sampling: memorization at its cap (MEMORIZATION_CAP of the rows), every
# other label in the proportions of ../shared/SYNTH-facts.md's 20k-row sample of 5 files
FACTS_OTHER_ROWS = {
    "mcq": 414,
    "math exercise": 333,
    "constrained writing": 316,
    "rag": 206,
    "math mcq": 177,
    "editing": 159,
    "creative writing": 148,
    "cooking": 95,
}


def _status_bytes(field: str) -> int:
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))


def write_shards(directory: Path, rows: int, files: int) -> list[Path]:
    """FILES synth_tokenized shard stubs with their row sizes: what `tokenized_quota_rows` reads."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from synthkd_assets.core.layout import rows_summary_path
    from synthkd_contract.constants import MEMORIZATION_CAP, MEMORIZATION_EXERCISE
    from synthkd_contract.manifest_seal import sha256_file
    from synthkd_contract.schemas import ROWS_OF_SHA256_KEY, TOKENIZED_ROWS_SCHEMA

    others = sum(FACTS_OTHER_ROWS.values())
    mix = {
        MEMORIZATION_EXERCISE: MEMORIZATION_CAP,
        **{name: (1 - MEMORIZATION_CAP) * rows / others for name, rows in FACTS_OTHER_ROWS.items()},
    }
    rng = np.random.default_rng(45)
    names = list(mix)
    paths = []
    for f in range(files):
        n = rows // files + (f < rows % files)
        shard = directory / f"synth_{f:03d}.parquet"
        shard.write_bytes(f"stub {f}".encode())  # the row sizes are trusted by this file's sha256
        tokens = rng.lognormal(7.2, 1.0, n).astype(np.int64) + 16
        table = pa.table(
            {
                "synth_id": pa.array([f"synth_{f:03d}_{i:09d}" for i in range(n)]),
                "language": pa.array(["en"] * n),
                "exercise": pa.array(np.array(names)[rng.choice(len(names), n, p=list(mix.values()))]),
                "tokens": tokens,
                **{name: tokens // 3 for name in TOKENIZED_ROWS_SCHEMA.names[4:]},
            },
            schema=TOKENIZED_ROWS_SCHEMA,
        )
        table = table.replace_schema_metadata({ROWS_OF_SHA256_KEY: sha256_file(shard)})
        pq.write_table(table, rows_summary_path(shard))
        paths.append(shard)
    return paths


def child(tree: str, directory: str) -> None:
    """One measurement in this process, with `tree`'s code: prints JSON."""
    sys.path.insert(0, tree)
    from synthkd_assets.core.quota import QuotaTargets, plan_quota_selection, tokenized_quota_rows

    paths = sorted(Path(directory).glob("synth_*[0-9].parquet"))
    Path("/proc/self/clear_refs").write_text("5")
    start_rss = _status_bytes("VmRSS:")
    started = time.perf_counter()
    rows = tokenized_quota_rows(paths)
    read = time.perf_counter()
    plan, kept = plan_quota_selection(rows, QuotaTargets())
    done = time.perf_counter()
    result = {
        "read_s": read - started,
        "plan_s": done - read,
        "seconds": done - started,
        "peak_mib": (_status_bytes("VmHWM:") - start_rss) / 2**20,
        "kept": len(kept),
        "rates": plan["rates"],
    }
    print(json.dumps(result))


def measure(tree: Path, directory: Path) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(tree), str(directory)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=REPEATS)
    parser.add_argument("--baseline-tree", type=Path, help="another checkout, measured alternately with this one")
    parser.add_argument("--quick", action="store_true", help="200,000 rows, one repeat")
    parser.add_argument("--child", nargs=2, metavar=("TREE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.quick:
        args.rows, args.repeats = 200_000, 1
    sys.path.insert(0, str(REPO_ROOT))
    trees = {"this tree": REPO_ROOT}
    if args.baseline_tree:
        trees = {"baseline": args.baseline_tree.resolve(), **trees}
    with tempfile.TemporaryDirectory(prefix="quota_plan_") as directory:
        write_shards(Path(directory), args.rows, args.files)
        found: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.repeats):
            for name, tree in trees.items():
                found[name].append(measure(tree, Path(directory)))
    rates = {name: json.dumps(runs[0]["rates"]) for name, runs in found.items()}
    if len(set(rates.values())) > 1:
        raise SystemExit(f"the trees' plans differ: {rates}")
    millions = args.rows / 1e6
    print(f"quota plan over {args.rows:,} rows in {args.files} shards ({args.repeats} repeats, min / median)")
    for name, runs in found.items():
        seconds = [run["seconds"] for run in runs]
        peak = [run["peak_mib"] for run in runs]
        full = FULL_CORPUS_ROWS / args.rows  # the projection: linear in the rows
        print(
            f"  {name}: {min(seconds):.2f} / {statistics.median(seconds):.2f} s "
            f"(read {min(r['read_s'] for r in runs):.2f}, plan {min(r['plan_s'] for r in runs):.2f}); "
            f"peak {min(peak):.0f} / {statistics.median(peak):.0f} MiB; "
            f"per million rows {min(seconds) / millions:.2f} s, {min(peak) / millions:.0f} MiB; "
            f"projected to {FULL_CORPUS_ROWS / 1e6:.1f}M rows on one process: {min(seconds) * full / 60:.1f} min, "
            f"{min(peak) * full / 1024:.1f} GiB"
        )
    if args.baseline_tree:
        base, this = found["baseline"], found["this tree"]
        time_ratio = min(r["seconds"] for r in this) / min(r["seconds"] for r in base)
        peak_ratio = min(r["peak_mib"] for r in this) / min(r["peak_mib"] for r in base)
        print(f"  this tree / baseline: time {time_ratio:.2f}x, peak memory {peak_ratio:.2f}x (the same plan)")


if __name__ == "__main__":
    main()
