#!/usr/bin/env python
"""The whole clustering (`cluster_shards`, what `synth_clusters` runs in the plan pass) on signatures shaped as the
real corpus's, at two sizes, against a baseline tree measured in the same run (#45, target 4): its seconds and
peak memory, and the line through the two sizes projected to the real corpus's rows.

    .venv/bin/python benchmarks/clustering.py --baseline-tree /path/to/other/checkout   # ~8 min on 2 cores
    .venv/bin/python benchmarks/clustering.py --quick   # < 1 min: a smoke run of the benchmark itself

The signatures are those the scan pass writes for one file of the sample's generator at its real lengths (--rows
rows, `throughput.py --real-file`'s file: raw -> `harmonize_shard` -> `signatures_shard`), where every row is a
candidate of some band. The two sizes are --copies copies of that file, each copy's band keys, rank keys and
held-out keys XORed with a salt of its own and its ids suffixed: each copy has the file's own candidate pairs,
and no copy's rows pair with another's. Verification's budget is scaled to each size's share of the real corpus
(`SIGNATURE_BUDGET` x rows / FULL_CORPUS_ROWS), so it reads its values in as many slices as at the real corpus's
size and the line's slope holds the values it keeps. Each measurement is a child process (VmHWM above its start,
after the imports), the trees alternately; both trees must give the same clusters.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

from two_trees import measure_child, min_median, peak_mib_since, start_peak_window, two_tree_arguments

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as `python benchmarks/clustering.py`: synthkd_dev is at the root
    sys.path.insert(0, str(REPO_ROOT))
COPIES = (8, 32)  # the two sizes, in copies of the file
QUICK_ROWS = 3_000
SALT = 0x9E3779B97F4A7C15


def signatures_file(work: Path, rows: int) -> Path:
    """One generated file's signatures, as the scan pass writes them."""
    from throughput import make_real_file

    from synthkd_assets.core.near_dup import signatures_shard
    from synthkd_assets.core.stages import harmonize_shard
    from synthkd_assets.core.synth import system_message_dict

    make_real_file(work / "raw", rows)
    harmony, signatures = work / "harmony.parquet", work / "signatures.parquet"
    harmonize_shard(work / "raw" / "synth_001.parquet", harmony, system_message_dict(), "bench")
    signatures_shard(harmony, signatures, "bench")
    return signatures


def write_copies(signatures: Path, directory: Path, copies: int) -> None:
    """`copies` salted copies of one signature file (its row groups as written), `synth_NNN.parquet`."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    file = pq.ParquetFile(signatures)
    table, group_rows = file.read(), file.metadata.row_group(0).num_rows
    keys = [name for name in table.column_names if name.startswith("band_") or name in ("rank_key", "heldout_key")]
    directory.mkdir(parents=True, exist_ok=True)
    for copy in range(copies):
        salted = table
        if copy:
            salt = np.uint64((SALT * copy) % 2**64)
            for name in keys:
                column = pa.array(table.column(name).to_numpy() ^ salt, pa.uint64())
                salted = salted.set_column(salted.schema.get_field_index(name), name, column)
            for name in ("synth_id", "near_dup_hash"):
                column = pc.binary_join_element_wise(table.column(name), pa.scalar(f"-{copy}"), "")
                salted = salted.set_column(salted.schema.get_field_index(name), name, column.cast(pa.string()))
        pq.write_table(salted, directory / f"synth_{copy + 1:03d}.parquet", row_group_size=group_rows)


def child(tree: str, directory: str) -> None:
    """One clustering in this process, with `tree`'s code: prints JSON."""
    sys.path.insert(0, tree)
    import functools

    import numpy as np
    from throughput import FULL_CORPUS_ROWS

    from synthkd_assets.core import near_dup

    paths = sorted(Path(directory).glob("synth_*.parquet"))
    rows = int(near_dup.shard_row_offsets(paths)[-1])
    budget = near_dup.SIGNATURE_BUDGET * rows // FULL_CORPUS_ROWS  # the slices of the real corpus's size
    verifying = "verified_codes" if hasattr(near_dup, "verified_codes") else "verified_pairs"
    setattr(near_dup, verifying, functools.partial(getattr(near_dup, verifying), budget=budget))
    start_rss = start_peak_window()
    started = time.perf_counter()
    clusters = near_dup.cluster_shards([path.stem for path in paths], paths, near_dup.ClusterSettings())
    seconds = time.perf_counter() - started
    peak = peak_mib_since(start_rss)  # before every row's columns are put together below, for the digest only
    every_row = clusters.every_row() if hasattr(clusters, "every_row") else clusters  # a tree before every_row
    digest = hashlib.sha256()
    for array in (every_row.cluster_id, every_row.size, every_row.rank, every_row.decision):
        digest.update(np.ascontiguousarray(array).tobytes())
    result = {
        "rows": rows,
        "seconds": seconds,
        "peak_mib": peak,
        "candidate_pairs": clusters.candidate_pairs,
        "verified_pairs": clusters.verified_pairs,
        "clusters_sha256": digest.hexdigest(),
    }
    print(json.dumps(result))


def main() -> None:
    parser = two_tree_arguments(__doc__, 155_800, 1)  # --files: one file, copied
    parser.add_argument("--signatures", type=Path, help="a signature file to copy, instead of generating one")
    parser.add_argument("--copies", type=int, nargs=2, default=COPIES, help="the two sizes, in copies of the file")
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    from throughput import FULL_CORPUS_ROWS

    copies = (2, 4) if args.quick else tuple(sorted(args.copies))
    if copies[0] == copies[1]:
        parser.error("--copies takes two different sizes")
    if args.quick:
        args.rows, args.repeats = QUICK_ROWS, 1
    trees = {"this tree": REPO_ROOT}
    if args.baseline_tree:
        trees = {"baseline": args.baseline_tree.resolve(), **trees}
    found: dict[tuple[str, int], list[dict]] = {(name, n): [] for name in trees for n in copies}
    with tempfile.TemporaryDirectory(prefix="clustering_") as work:
        signatures = args.signatures or signatures_file(Path(work), args.rows)
        write_copies(signatures, Path(work) / f"copies_{copies[1]}", copies[1])  # the smaller size: its first files
        (Path(work) / f"copies_{copies[0]}").mkdir()
        for file in sorted((Path(work) / f"copies_{copies[1]}").glob("synth_*.parquet"))[: copies[0]]:
            (Path(work) / f"copies_{copies[0]}" / file.name).symlink_to(file)
        for _ in range(args.repeats):
            for n in copies:
                for name, tree in trees.items():
                    found[name, n].append(measure_child(__file__, tree, Path(work) / f"copies_{n}"))
    for n in copies:
        if len({found[name, n][0]["clusters_sha256"] for name in trees}) > 1:
            raise SystemExit(f"the trees' clusters differ at {n} copies: {found}")
    print(f"cluster_shards over copies of one file's signatures ({args.repeats} repeats, min / median):")
    for n in copies:
        first = found[next(iter(trees)), n][0]
        print(
            f"  {n} copies: {first['rows']:,} rows, {first['candidate_pairs']:,} candidate pairs "
            f"({first['candidate_pairs'] / first['rows']:.2f} a row), {first['verified_pairs']:,} verified"
        )
        for name in trees:
            runs = found[name, n]
            print(
                f"    {name}: {min_median([r['seconds'] for r in runs])} s; "
                f"peak {min_median([r['peak_mib'] for r in runs], 0)} MiB"
            )
    small, large = copies
    for name in trees:
        peak = {n: min(r["peak_mib"] for r in found[name, n]) for n in copies}
        rows = {n: found[name, n][0]["rows"] for n in copies}
        slope = (peak[large] - peak[small]) / (rows[large] - rows[small])  # MiB a row
        projected = peak[small] + slope * (FULL_CORPUS_ROWS - rows[small])
        print(
            f"  {name}: {slope * 2**20:.0f} B a row between the sizes; projected to {FULL_CORPUS_ROWS:,} rows: "
            f"{projected / 1024:.1f} GiB"
        )
    if args.baseline_tree:
        for n in copies:
            base, this = found["baseline", n], found["this tree", n]
            time_ratio = min(r["seconds"] for r in this) / min(r["seconds"] for r in base)
            peak_ratio = min(r["peak_mib"] for r in this) / min(r["peak_mib"] for r in base)
            print(f"  {n} copies, this tree / baseline: time {time_ratio:.2f}x, peak {peak_ratio:.2f}x")


if __name__ == "__main__":
    main()
