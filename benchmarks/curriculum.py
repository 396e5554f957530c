#!/usr/bin/env python
"""The curriculum step at scale (#45, target 4): what `synth_curriculum` computes in the pool-manifest run (each
stage's files and its stream report, `stage_stream_report`, every pool part read once for all stages), on a pool
of K copies of a built pool, at two sizes; its seconds and peak memory, and the line through the two sizes out
to SYNTH's 500 files.

    .venv/bin/python benchmarks/curriculum.py --data /path/to/a/build/data --copies 8 64
    .venv/bin/python benchmarks/curriculum.py --data data --copies 1 2   # the sample's build: a smoke run

`--data` is the data root of a finished build (its `pool/synth_pool_v1`: parts, trios, shard records), e.g.
`floor.py --files 1 --work-dir W`'s `W/data`: one file shaped as SYNTH publishes them. Each copy's parts and
trio files are hard links of the originals under new shard numbers, its shard records rewritten to name them, so
a pool of K copies holds K times the rows of the built one (the same ids: the stream draws by position). Each
measurement is a child process (peak RSS: its VmHWM above its start), REPEATS times: min and median.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from two_trees import measure_child, min_median, peak_mib_since, start_peak_window

REPO_ROOT = Path(__file__).resolve().parents[1]
POOL = Path("pool") / "synth_pool_v1"
FULL_CORPUS_FILES = 500  # real SYNTH's files (../shared/SYNTH-facts.md)
SHARD_PART = re.compile(r"part-(\d+)\.parquet")


def pool_copies(data: Path, out: Path, copies: int) -> int:
    """A data root at `out` whose pool is `copies` copies of `data`'s (hard links, shard records renumbered);
    returns how many shards it has."""
    source, pool = data / POOL, out / POOL
    records = sorted((source / "shards").glob("shard_*.json"))
    if not records:
        raise SystemExit(f"{source}: no pool shard records (run the build first)")
    (pool / "shards").mkdir(parents=True)
    (pool / "parts").mkdir()
    shards = 0
    for _ in range(copies):
        for record_path in records:
            record = json.loads(record_path.read_text())
            old = int(SHARD_PART.fullmatch(Path(record["part"]["path"]).name).group(1))
            shards += 1
            text = json.dumps(record).replace(f"part-{old:05d}.parquet", f"part-{shards:05d}.parquet")
            text = text.replace(f"shard_{old:02d}_", f"shard_{shards:02d}_")
            os.link(source / record["part"]["path"], pool / "parts" / f"part-{shards:05d}.parquet")
            for trio in record["trios"]:
                for file in trio["files"]:
                    target = pool / "megatron" / file["path"].replace(f"shard_{old:02d}_", f"shard_{shards:02d}_")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.link(source / "megatron" / file["path"], target)
            (pool / "shards" / f"shard_{shards:02d}.json").write_text(text)
    return shards


def child(tree: str, data: str) -> None:
    """One measurement in this process, with `tree`'s code: the curriculum's stage files and stream reports."""
    sys.path.insert(0, tree)
    from synthkd_assets.core.curriculum import (
        curriculum_stages,
        plan_stage,
        scan_pool_prefixes,
        stage_stream_report,
        write_stage_files,
    )

    pool = Path(data) / POOL
    start = start_peak_window()
    began = time.process_time()
    prefixes = scan_pool_prefixes(pool / "megatron")
    parts_read: dict = {}  # every part read once for all stages, as synth_curriculum reads them
    for stage in curriculum_stages():
        plan = plan_stage(stage, prefixes)
        files = write_stage_files(plan, pool / "curriculum", pool / "megatron", Path(data) / "cache")
        if files:
            stage_stream_report(files[0], plan, parts_read)
    seconds, peak = time.process_time() - began, peak_mib_since(start)
    pool_rows = sum(pq.ParquetFile(p).metadata.num_rows for p in (pool / "parts").glob("*.parquet"))
    print(json.dumps({"seconds": seconds, "peak_mib": peak, "pool_rows": pool_rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="a finished build's data root")
    parser.add_argument("--copies", type=int, nargs=2, default=(8, 64), help="the two sizes, in copies of the pool")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.data is None:
        raise SystemExit("--data: a finished build's data root")
    small, large = sorted(args.copies)
    if small == large or small < 1:
        raise SystemExit(f"--copies {small} {large}: two different sizes >= 1")
    found: dict[int, list[dict]] = {small: [], large: []}
    files = {}
    with tempfile.TemporaryDirectory(prefix="curriculum_", dir=args.data.parent) as directory:
        for copies in (small, large):
            files[copies] = pool_copies(args.data.resolve(), Path(directory) / str(copies), copies)
        for _ in range(args.repeats):
            for copies in (small, large):
                found[copies].append(measure_child(__file__, REPO_ROOT, Path(directory) / str(copies)))
    print(f"synth_curriculum's stage files and stream reports ({args.repeats} repeats, min / median)")
    for copies in (small, large):
        runs = found[copies]
        print(
            f"  {files[copies]} pool shards, {runs[0]['pool_rows']:,} pool rows: "
            f"{min_median([r['seconds'] for r in runs])} CPU s, peak {min_median([r['peak_mib'] for r in runs], 0)} MiB"
        )
    low, high = (min(r["peak_mib"] for r in found[c]) for c in (small, large))
    low_s, high_s = (min(r["seconds"] for r in found[c]) for c in (small, large))
    per_file_mib = (high - low) / (files[large] - files[small])
    per_file_s = (high_s - low_s) / (files[large] - files[small])
    print(
        f"  the line through both: {per_file_mib:.2f} MiB and {per_file_s:.3f} CPU s a shard; at "
        f"{FULL_CORPUS_FILES} shards: {(high + per_file_mib * (FULL_CORPUS_FILES - files[large])) / 1024:.2f} GiB, "
        f"{(high_s + per_file_s * (FULL_CORPUS_FILES - files[large])) / 60:.1f} min on one process"
    )


if __name__ == "__main__":
    main()
