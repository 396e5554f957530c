#!/usr/bin/env python
"""What a build costs against what its work cannot avoid (issue #45, target 1): the CPU seconds of every process
of `./scripts/build.sh` over the floor measured in the same run on the same rows.

    .venv/bin/python benchmarks/floor.py                       # one file shaped as SYNTH publishes them
    .venv/bin/python benchmarks/floor.py --files 7 --repeats 2  # ~1.1M rows, twice (each build fresh)
    .venv/bin/python benchmarks/floor.py --rows 20000          # a few minutes: the same path, small

1. writes `--files` raw files shaped as SYNTH publishes them (`--rows` rows each, default 155,800, in ONE row
   group, zstd: the sample's generator at its real lengths and mix, `write_shards`, as benchmarks/throughput.py
   --real-file does).
2. runs `./scripts/build.sh` on fresh SYNTHKD_RAW_DIR / SYNTHKD_DATA_DIR / DAGSTER_HOME (every pass, every
   check), with this process as the child subreaper of its tree, so every process of the build (the driver,
   webserver, daemon, code servers, run workers) is reaped here: **cost** = the user + system CPU seconds of
   all of them (getrusage of the reaped children). Its process tree is also sampled from /proc (CPU per process
   kind: where the rest goes), and the instance gives each step's seconds.
3. measures the **floor** in this process, on the same rows, each part once per repeat (CPU seconds):
   - reading the input: every raw file decoded once (`pq.read_table`);
   - the near-duplicate signatures: rensa's `digest_matrix_from_token_sets` of every input row's signature text
     (its word grams, as the signatures step hashes them; building the grams is not counted);
   - the BPE: tiktoken's `encode_ordinary_batch` on one thread of the texts of the conversations the build
     wrote (synth_kd_v1's documents read back with megatron-core's IndexedDataset and decoded, special tokens
     left out).
4. prints cost / floor (min and median over repeats) and where the cost goes, and with `--json` writes it all.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
for path in (REPO_ROOT, Path(__file__).resolve().parent):  # synthkd_dev at the root, scale_run beside this
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from scale_run import fresh_build_environment, load_average, run_build, step_times  # noqa: E402
from throughput import REAL_FILE_ROWS, REAL_FILE_SEED  # noqa: E402

PR_SET_CHILD_SUBREAPER = 36  # prctl(2): orphaned descendants are reparented to this process
TARGET_RATIO = 2.0  # issue #45: cost <= 2.0x floor


def become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def reap_all() -> None:
    """Wait for every descendant reparented to this process (a code server's run workers, say)."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_by_kind(memory_report: dict) -> dict[str, float]:
    """Sampled CPU seconds per process kind (scale_run's names): each process's last sample, so a process's
    last moments and processes shorter than a sample interval are missed (the reaped total is exact)."""
    kinds: dict[str, float] = {}
    for process in memory_report["processes"]:
        kinds[process["kind"]] = kinds.get(process["kind"], 0.0) + process["cpu_seconds_sampled"]
    return dict(sorted(kinds.items(), key=lambda item: -item[1]))


def build_cost(raw_dir: Path, work: Path, interval: float) -> dict:
    data_dir, home = work / "data", work / "home"
    env = fresh_build_environment(raw_dir, data_dir, home)
    home.mkdir(parents=True)
    reap_all()
    before = children_cpu()
    build = run_build(env, work / "build.log", interval, echo=False)
    reap_all()
    cost = children_cpu() - before
    if build["returncode"] != 0:
        raise SystemExit("build failed:\n" + "\n".join(build["tail"]))
    return {
        "cost_cpu_s": cost,
        "wall_s": build["seconds"],
        "cpu_by_kind_sampled": cpu_by_kind(build["memory"]),
        "passes": build["passes"],
        "steps": step_times(home),
        "data_dir": data_dir,
    }


def _cpu(function, *args) -> tuple[float, object]:
    """CPU seconds of this process (every thread) spent in `function(*args)`, and its value."""
    start = time.process_time()
    value = function(*args)
    return time.process_time() - start, value


def floor_read(raw_files: list[Path]) -> float:
    import pyarrow.parquet as pq

    return sum(_cpu(pq.read_table, path)[0] for path in raw_files)


FLOOR_BATCH_ROWS = 8192  # rows hashed or encoded at a time: a whole file's word grams as Python strings are ~8 GB


def floor_minhash(raw_files: list[Path]) -> tuple[float, int]:
    import pyarrow.parquet as pq
    from rensa import RMinHash

    from synthkd_assets.core.near_dup import signature_grams, signature_text
    from synthkd_contract import near_dup as nd

    seconds, rows = 0.0, 0
    for path in raw_files:
        for batch in pq.ParquetFile(path).iter_batches(FLOOR_BATCH_ROWS, columns=["query", "synthetic_answer"]):
            pairs = zip(batch.column("query").to_pylist(), batch.column("synthetic_answer").to_pylist(), strict=True)
            grams = [signature_grams(signature_text(q or "", a or "")) for q, a in pairs]
            spent, _ = _cpu(RMinHash.digest_matrix_from_token_sets, grams, nd.NUM_PERM, nd.MINHASH_SEED)
            seconds, rows = seconds + spent, rows + len(grams)
    return seconds, rows


def floor_bpe(data_dir: Path, raw_dir: Path) -> tuple[float, int, int]:
    """CPU seconds of one-thread BPE of the texts of every synth_kd_v1 document (decoded without their special
    tokens, a batch at a time), the tokens it made and the documents."""
    import numpy as np

    warnings.filterwarnings("ignore", message="Transformer Engine and Apex")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from synthkd_assets.core.layout import DataLayout
    from synthkd_assets.core.tokenizer import load_tiktoken_o200k
    from synthkd_contract.trio import TOKENS_SUFFIX

    layout = DataLayout(raw_dir, data_dir)
    encoding = load_tiktoken_o200k(layout.tokenizer_dir())  # the build's own, verified
    ordinary = min(map(encoding.encode_single_token, encoding.special_tokens_set))  # ids below: mergeable ranks
    seconds, tokens, documents = 0.0, 0, 0
    for bin_path in sorted(layout.megatron_root().rglob(f"*{TOKENS_SUFFIX}.bin")):  # not the masks and spans
        dataset = IndexedDataset(str(bin_path.with_suffix("")))
        for first in range(0, len(dataset), FLOOR_BATCH_ROWS):
            texts = []
            for i in range(first, min(first + FLOOR_BATCH_ROWS, len(dataset))):
                ids = np.asarray(dataset[i])
                texts.append(encoding.decode_bytes(ids[ids < ordinary].tolist()).decode("utf-8", "replace"))
            spent, encoded = _cpu(lambda batch=texts: encoding.encode_ordinary_batch(batch, num_threads=1))
            seconds, tokens, documents = seconds + spent, tokens + sum(map(len, encoded)), documents + len(texts)
    return seconds, tokens, documents


def spread(values: list[float]) -> str:
    return f"min {min(values):.2f}, median {statistics.median(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=REAL_FILE_ROWS, help="rows per raw file")
    parser.add_argument("--files", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="fresh builds, each with its own floor")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between /proc samples")
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    from synthkd_dev.make_sample_data import write_shards

    become_subreaper()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="synthkd-floor-"))
    raw_dir = work / "raw"
    if not sorted(raw_dir.glob("*.parquet")):
        print(f"generating {args.files} x {args.rows:,} rows under {raw_dir} ...", flush=True)
        write_shards(raw_dir, args.files, args.rows, REAL_FILE_SEED)
    raw_files = sorted(raw_dir.glob("*.parquet"))
    runs = []
    for repeat in range(args.repeats):
        print(f"build {repeat + 1}/{args.repeats} (load {load_average()}) ...", flush=True)
        cost = build_cost(raw_dir, work, args.interval)
        read_s = floor_read(raw_files)
        minhash_s, rows = floor_minhash(raw_files)
        bpe_s, tokens, documents = floor_bpe(cost["data_dir"], raw_dir)
        floor = read_s + minhash_s + bpe_s
        runs.append(
            {
                **{k: v for k, v in cost.items() if k != "data_dir"},
                "floor_cpu_s": floor,
                "floor_parts_cpu_s": {"read": read_s, "minhash": minhash_s, "bpe": bpe_s},
                "input_rows": rows,
                "documents": documents,
                "bpe_tokens": tokens,
                "ratio": cost["cost_cpu_s"] / floor,
                "load_after": load_average(),
            }
        )
        last = runs[-1]
        print(
            f"  cost {last['cost_cpu_s']:.1f} CPU s (wall {last['wall_s']:.1f} s), floor {floor:.1f} CPU s "
            f"(read {read_s:.1f}, MinHash {minhash_s:.1f}, BPE {bpe_s:.1f}: {tokens:,} tokens of "
            f"{documents:,} documents): ratio {last['ratio']:.2f}",
            flush=True,
        )
    ratios = [run["ratio"] for run in runs]
    verdict = "met" if max(ratios) <= TARGET_RATIO else "NOT met"
    print(f"cost / floor over {len(runs)} builds of {len(raw_files)} x {args.rows:,} rows: {spread(ratios)}")
    print(f"  target <= {TARGET_RATIO}x: {verdict}")
    last = runs[-1]
    print("  CPU by process kind (sampled, last build):")
    for kind, seconds in list(last["cpu_by_kind_sampled"].items())[:10]:
        print(f"    {kind:<40} {seconds:8.1f} s")
    print("  step seconds (Dagster's step events, last build):")
    for step, figures in list(last["steps"].items())[:15]:
        print(f"    {step:<40} {figures['seconds']:8.1f} s over {figures['runs']} runs")
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "files": args.files, "runs": runs}, indent=2) + "\n")
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
