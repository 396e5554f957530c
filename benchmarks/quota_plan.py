#!/usr/bin/env python
"""The quota plan at scale (#45, targets 3 and 4): `tokenized_quota_rows` + `plan_quota_selection`, what
`synth_quota_plan` computes over every shard's row sizes, on N generated rows in F files and on half of them (the
same rows a file); its seconds and peak memory, against a baseline tree measured in the same run, and the
projection to the full corpus: the line through the two sizes' figures.

    .venv/bin/python benchmarks/quota_plan.py --rows 4000000 --baseline-tree /path/to/other/checkout
    .venv/bin/python benchmarks/quota_plan.py --quick   # < 1 min: a smoke run of the benchmark itself
    .venv/bin/python benchmarks/quota_plan.py --anchors ...   # and the source mix over SYNTH's kept rows

The rows are generated as the tokenize steps leave them: FILES synth_tokenized shards, each with its row sizes
(`<key>.rows.parquet`, their footer recording the shard's sha256, so `current_row_sizes` reads them), exercises
drawn with SYNTH's mix after 001's sampling (memorization at its cap, the other labels as FACTS_OTHER_ROWS) and
lognormal token counts. Each measurement is a child process (one tree's code; peak RSS is its VmHWM above the
process's start), run alternately with the baseline, REPEATS times: min and median.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from two_trees import measure_child, min_median, peak_mib_since, start_peak_window, two_tree_arguments

REPO_ROOT = Path(__file__).resolve().parents[1]
FULL_CORPUS_ROWS = 77_900_000  # real SYNTH's rows (../shared/SYNTH-facts.md); the quota sees fewer, after 001
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


def anchor_rows(synth_tokens: float) -> dict[str, list[tuple[str, int]]]:
    """Two anchor sources, each ~1% of SYNTH's kept tokens: scarce beside their shares, so SYNTH is downsampled
    and the source mix selects SYNTH's rows exactly."""
    import random

    rng = random.Random(45)
    rows: dict[str, list[tuple[str, int]]] = {}
    for source in ("nemotron_math_v2", "opencodeinstruct"):
        rows[source], held = [], 0
        while held < synth_tokens / 100:
            rows[source].append((f"{source}_{len(rows[source])}", rng.randint(200, 4000)))
            held += rows[source][-1][1]
    return rows


def child(tree: str, directory: str, anchors: bool) -> None:
    """One measurement in this process, with `tree`'s code: prints JSON."""
    sys.path.insert(0, tree)
    from synthkd_assets.core.quota import QuotaTargets, excluded_ids, plan_quota_selection
    from synthkd_assets.core.source_mix import SourceMixTargets, plan_source_mix
    from synthkd_contract.sources import SOURCE_MIX_SALT

    try:  # the rows by hash bin, spilled to disk
        from synthkd_assets.core.quota_rows import tokenized_quota_rows
    except ImportError:  # a tree before them: every row's columns in memory
        from synthkd_assets.core.quota import tokenized_quota_rows

    paths = sorted(Path(directory).glob("synth_*[0-9].parquet"))
    start_rss = start_peak_window()
    started = time.perf_counter()
    rows = tokenized_quota_rows(paths)
    read = time.perf_counter()
    selected = plan_quota_selection(rows, QuotaTargets())
    plan = selected[0] if isinstance(selected, tuple) else selected  # a tree before the spill: (plan, kept)
    done = time.perf_counter()
    mix: dict = {}
    if anchors:  # as `quota_plan_of` does with anchor sources: SYNTH's kept rows to the source mix
        synth_tokens = math.fsum(plan["skill_tokens"]["expected"].values())
        synth_rows = math.fsum(n for cells in plan["expected"]["rows"].values() for n in cells.values())
        given = anchor_rows(synth_tokens)
        tokens = {"synth": synth_tokens, **{s: float(sum(n for _, n in r)) for s, r in given.items()}}
        counts = {"synth": synth_rows, **{s: float(len(r)) for s, r in given.items()}}
        if isinstance(selected, tuple):  # a tree before the bins: the kept rows as a list
            kept = selected[1]
            given["synth"] = list(zip(rows.ids(kept), rows.tokens[kept].tolist()))
            mix = plan_source_mix(tokens, counts, SourceMixTargets(), given)
        else:
            from synthkd_assets.core.source_mix import BinnedRows

            with rows.kept(plan["rates"], excluded_ids(plan), SOURCE_MIX_SALT, one_bucket=True) as kept:
                mix = plan_source_mix(tokens, counts, SourceMixTargets(), {**given, "synth": BinnedRows(kept)})
    mixed = time.perf_counter()
    getattr(rows, "close", lambda: None)()
    result = {
        "read_s": read - started,
        "plan_s": done - read,
        "mix_s": mixed - done,
        "seconds": mixed - started,
        "peak_mib": peak_mib_since(start_rss),
        "kept": sum(n for cells in plan["expected"]["rows"].values() for n in cells.values()),
        "plan_sha256": hashlib.sha256(json.dumps([plan, mix]).encode()).hexdigest(),
    }
    print(json.dumps(result))


def measure(tree: Path, directory: Path, anchors: bool) -> dict:
    return measure_child(__file__, tree, directory, *(["--anchors"] if anchors else []))


def main() -> None:
    parser = two_tree_arguments(__doc__, 4_000_000, 8)
    parser.add_argument(
        "--anchors", action="store_true", help="two scarce anchor sources: the source mix selects SYNTH's kept rows"
    )
    args = parser.parse_args()
    if args.child:
        child(*args.child, args.anchors)
        return
    if args.quick:
        args.rows, args.repeats = 200_000, 1
    sys.path.insert(0, str(REPO_ROOT))
    trees = {"this tree": REPO_ROOT}
    if args.baseline_tree:
        trees = {"baseline": args.baseline_tree.resolve(), **trees}
    if args.files < 2 or args.files % 2:
        raise SystemExit(f"--files {args.files}: an even number >= 2 (half of them are the smaller size)")
    # two sizes, half the files and all of them, the same rows a file: the projection is the line through both,
    # out to the full corpus's files
    sizes = {"half": args.rows // 2, "full": args.rows}
    files = {"half": args.files // 2, "full": args.files}
    found: dict[tuple[str, str], list[dict]] = {(name, size): [] for name in trees for size in sizes}
    with tempfile.TemporaryDirectory(prefix="quota_plan_") as directory:
        for size, rows in sizes.items():
            (Path(directory) / size).mkdir()
            write_shards(Path(directory) / size, rows, files[size])
        for _ in range(args.repeats):
            for size in sizes:
                for name, tree in trees.items():
                    found[name, size].append(measure(tree, Path(directory) / size, args.anchors))
    for size in sizes:
        plans = {name: found[name, size][0]["plan_sha256"] for name in trees}
        if len(set(plans.values())) > 1:
            raise SystemExit(f"the trees' plans differ at {sizes[size]:,} rows: {plans}")
    print(
        f"quota plan over {args.rows:,} rows in {args.files} shards, and over half of them ({args.repeats} repeats, "
        "min / median; the same plan bytes from every tree)"
        + ("; with the source mix of two scarce anchor sources" if args.anchors else "")
    )
    for name in trees:
        runs, halves = found[name, "full"], found[name, "half"]
        seconds = [run["seconds"] for run in runs]
        peak = [run["peak_mib"] for run in runs]
        half_peak, half_seconds = min(r["peak_mib"] for r in halves), min(r["seconds"] for r in halves)
        # the line through the two sizes' minima, at the full corpus's rows
        slope_peak = (min(peak) - half_peak) / (args.rows - sizes["half"])
        slope_seconds = (min(seconds) - half_seconds) / (args.rows - sizes["half"])
        projected_peak = min(peak) + slope_peak * (FULL_CORPUS_ROWS - args.rows)
        projected_seconds = min(seconds) + slope_seconds * (FULL_CORPUS_ROWS - args.rows)
        print(
            f"  {name}: {min_median(seconds)} s "
            f"(read {min(r['read_s'] for r in runs):.2f}, plan {min(r['plan_s'] for r in runs):.2f}"
            + (f", source mix {min(r['mix_s'] for r in runs):.2f}" if args.anchors else "")
            + "); "
            f"peak {min_median(peak, 0)} MiB ({half_peak:.0f} MiB at half the rows); "
            f"projected to {FULL_CORPUS_ROWS / 1e6:.1f}M rows on one process: {projected_seconds / 60:.1f} min, "
            f"{projected_peak / 1024:.2f} GiB"
        )
    if args.baseline_tree:
        base, this = found["baseline", "full"], found["this tree", "full"]
        time_ratio = min(r["seconds"] for r in this) / min(r["seconds"] for r in base)
        peak_ratio = min(r["peak_mib"] for r in this) / min(r["peak_mib"] for r in base)
        print(f"  this tree / baseline: time {time_ratio:.2f}x, peak memory {peak_ratio:.2f}x (the same plan)")


if __name__ == "__main__":
    main()
