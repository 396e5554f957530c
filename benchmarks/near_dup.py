#!/usr/bin/env python
"""Near-duplicate control (#18): the MinHash library, signatures and clustering per million rows, and what that
means for the full corpus; every ratio against a baseline measured in the same run.

    .venv/bin/python benchmarks/near_dup.py           # ~8 min on 2 cores
    .venv/bin/python benchmarks/near_dup.py --quick   # < 1 min: a smoke run of the benchmark itself

Prints:
  1. rensa vs datasketch (MinHash.bulk; LeanMinHash for memory) on the same shingle sets of SYNTH-like prompts,
     128 permutations: signatures/s and peak memory per 100k prompts, best of 3; Jaccard estimates vs exact
  2. the pipeline's signatures (`signatures_shard`: Parquet in and out) per million rows on one core, peak RSS,
     and where `signature_table`'s time goes (prompt extraction, shingling, rensa, band keys, the rest)
  3. `cluster_shards` + `cluster_summary` over K signature files with planted near-duplicates, wall time and peak
     RSS per million rows, peak memory by phase (bytes per row above the process's start)
  4. projection to 79.6M rows: one machine, a Celery pool of W workers, and the clustering's peak memory
Every memory figure comes from a child process (VmHWM, reset between phases through /proc/self/clear_refs),
so one measurement never sees another's garbage.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as `python benchmarks/near_dup.py`: synthkd_dev is at the root
    sys.path.insert(0, str(REPO_ROOT))
if os.environ.get("SYNTHKD_BASELINE_TREE"):  # a child measuring --baseline-tree's code
    sys.path.insert(0, os.environ["SYNTHKD_BASELINE_TREE"])
sys.path.insert(0, str(Path(__file__).resolve().parent))

from throughput import FULL_CORPUS_ROWS, GIB, make_shard  # noqa: E402

MEMORY_LIMIT = 24 * GIB  # the clustering must fit on one 24 GiB machine
REPEATS = 3
BASE_SHARDS = 2  # signature files of the planted base corpus; a corpus of c copies has 2c shards
SPLIT_ROWS = 20_000  # rows of the in-process split of signature_table's time (best of REPEATS)
POOL_WORKERS = (8, 32)  # Celery pools the projection is printed for (one core each)
LIBRARIES = ("rensa", "datasketch", "datasketch_lean")


# --- process memory ------------------------------------------------------------------------------------------
def _status_bytes(field: str) -> int:
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(field))


class Peaks:
    """Peak RSS per phase of one process: `mark(name)` closes the phase since the last mark (its peak above the
    RSS the process had at the start) and resets the kernel's high-water mark for the next one."""

    def __init__(self) -> None:
        self.start = _status_bytes("VmRSS:")
        self.phases: dict[str, dict[str, float]] = {}
        self.peak = self.start
        self._reset()

    def _reset(self) -> None:
        Path("/proc/self/clear_refs").write_text("5")
        self._t = time.perf_counter()

    def mark(self, name: str) -> None:
        high = _status_bytes("VmHWM:")
        self.peak = max(self.peak, high)
        self.phases[name] = {"seconds": time.perf_counter() - self._t, "peak_bytes": high - self.start}
        self._reset()


def run_child(*args: str, tree: Path | None = None) -> dict:
    """This script as a child process (its own memory), the JSON it prints last; with `tree`, the child imports
    synthkd_assets and synthkd_contract from that checkout instead (a baseline commit)."""
    env = dict(os.environ, SYNTHKD_BASELINE_TREE=str(tree)) if tree else None
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child {args[0]} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --- 1. library choice ----------------------------------------------------------------------------------------
def synth_prompts(rows: int) -> list[str]:
    """SYNTH-like user prompts: the long sample rows' query and seed text as synth_harmony_v1 renders them."""
    from synthkd_contract import constants
    from synthkd_dev.make_sample_data import generate_rows

    return [constants.USER_TEMPLATE.format(**r) for r in generate_rows(rows, seed=2026, long=True)]


def token_sets(prompts: list[str]) -> list[list[str]]:
    from synthkd_assets.core.near_dup import normalize_prompt, shingles

    return [shingles(normalize_prompt(p)) for p in prompts]


def library_signatures(library: str, sets: list[list[str]]):
    """(signatures object kept by the caller, as the library hands it) for one library's fastest bulk path."""
    import numpy as np
    from rensa import RMinHash

    from synthkd_contract import near_dup as nd

    if library == "rensa":  # rensa on the shingles as strings (the pipeline hands it their hashes: core/gram_hashes.py)
        matrix = RMinHash.digest_matrix_from_token_sets(sets, nd.NUM_PERM, nd.MINHASH_SEED)
        return np.asarray(matrix.to_rows(), dtype=np.uint32)
    from datasketch import LeanMinHash, MinHash

    hashes = MinHash.bulk([[t.encode() for t in s] for s in sets], num_perm=nd.NUM_PERM, seed=nd.MINHASH_SEED)
    return [LeanMinHash(m) for m in hashes] if library == "datasketch_lean" else hashes


def child_library(library: str, sets_path: str) -> dict:
    """Best-of-REPEATS time and peak RSS of one library on pickled shingle sets (after a warm-up call, so
    imports are not counted), and what its signatures keep (tracemalloc: numpy and Python objects)."""
    import pickle
    import tracemalloc

    sets = pickle.loads(Path(sets_path).read_bytes())
    library_signatures(library, sets[:10])
    peaks = Peaks()
    best, peak = float("inf"), 0
    for _ in range(REPEATS):
        base = _status_bytes("VmRSS:")
        peaks._reset()
        start = time.perf_counter()
        result = library_signatures(library, sets)
        best = min(best, time.perf_counter() - start)
        peak = max(peak, _status_bytes("VmHWM:") - base)
        del result
    tracemalloc.start()
    kept_result = library_signatures(library, sets)
    kept = tracemalloc.get_traced_memory()[0]
    del kept_result
    return {"rows": len(sets), "seconds": best, "peak_bytes": peak, "kept_bytes": kept}


def jaccard_agreement(prompts: list[str], pairs: int) -> dict:
    """Both libraries' Jaccard estimates against the exact Jaccard of the shingle sets, on pairs spread over
    0..1 (a prompt and a copy with a growing share of its words replaced)."""
    import numpy as np

    rng = random.Random(5)
    a_texts, b_texts = [], []
    for i, prompt in enumerate(prompts[:pairs]):
        words = prompt.split()
        for _ in range(int(len(words) * (i % 10) / 20)):
            words[rng.randrange(len(words))] = rng.choice(string.ascii_lowercase) * 3
        a_texts.append(prompt)
        b_texts.append(" ".join(words))
    a_sets, b_sets = token_sets(a_texts), token_sets(b_texts)
    exact = np.array([len(set(x) & set(y)) / len(set(x) | set(y)) for x, y in zip(a_sets, b_sets)])
    rensa_a, rensa_b = library_signatures("rensa", a_sets), library_signatures("rensa", b_sets)
    lean_a, lean_b = library_signatures("datasketch", a_sets), library_signatures("datasketch", b_sets)
    estimates = {
        "rensa": (rensa_a == rensa_b).mean(axis=1),
        "datasketch": np.array([x.jaccard(y) for x, y in zip(lean_a, lean_b)]),
    }
    sigma = np.sqrt(exact * (1 - exact) / 128) + 1e-9  # a MinHash estimate's standard error
    return {
        "pairs": len(exact),
        "exact_range": [float(exact.min()), float(exact.max())],
        **{
            name: {
                "max_abs_error": float(np.abs(e - exact).max()),
                "within_3_sigma": float((np.abs(e - exact) <= 3 * sigma + 1 / 128).mean()),
            }
            for name, e in estimates.items()
        },
    }


def library_choice(prompts: int, work: Path) -> dict:
    import pickle

    texts = synth_prompts(prompts)
    sets = token_sets(texts)
    sets_path = work / "sets.pkl"
    sets_path.write_bytes(pickle.dumps(sets))
    figures = {name: run_child("library", name, str(sets_path)) for name in LIBRARIES}
    figures["shingles_per_prompt"] = sum(map(len, sets)) / len(sets)
    figures["jaccard"] = jaccard_agreement(texts, min(len(texts), 300))
    return figures


# --- 2. signatures per million rows ---------------------------------------------------------------------------
def harmony_shard(rows: int, work: Path) -> Path:
    """A synth_harmony_v1 shard of `rows` long SYNTH-like rows (throughput.py's raw shard, harmonized)."""
    from synthkd_assets.core.stages import harmonize_shard
    from synthkd_assets.core.synth import system_message_dict

    raw, harmony = work / "raw.parquet", work / "harmony.parquet"
    make_shard(raw, rows)
    harmonize_shard(raw, harmony, system_message_dict(), "bench")
    return harmony


def child_signatures(harmony: str, out: str) -> dict:
    """The signature step of one shard as the scan pass runs it (Parquet in, Parquet out), one process."""
    from synthkd_assets.core.near_dup import signatures_shard

    peaks = Peaks()
    report = signatures_shard(Path(harmony), Path(out), "bench")
    peaks.mark("signatures_shard")
    return {"rows": report.rows_in, **peaks.phases["signatures_shard"]}


def signature_split(harmony: Path, rows: int) -> dict:
    """Best-of-REPEATS seconds of `signature_table` on the shard's first rows and of its parts, in this process."""
    import polars as pl
    from rensa import RMinHash

    from synthkd_assets.core.near_dup import USER_PROMPT_PATH, band_keys, normalize_prompt, shingles, signature_table
    from synthkd_contract import near_dup as nd

    frame = pl.read_parquet(harmony).head(rows)
    state: dict = {}

    def prompts() -> None:
        column = frame.select(pl.col("messages_json").str.json_path_match(USER_PROMPT_PATH))["messages_json"]
        state["prompts"] = column.fill_null("").to_list()

    def shingling() -> None:
        state["sets"] = [shingles(normalize_prompt(p)) for p in state["prompts"]]

    def rensa() -> None:
        state["matrix"] = RMinHash.digest_matrix_from_token_sets(state["sets"], nd.NUM_PERM, nd.MINHASH_SEED)

    def to_numpy() -> None:
        import numpy as np

        state["signatures"] = np.asarray(state["matrix"].to_rows(), dtype=np.uint32)

    def bands() -> None:
        band_keys(state["signatures"])

    parts = {"prompt extraction": prompts, "normalize + shingles": shingling, "rensa": rensa}
    parts |= {"rensa matrix -> numpy": to_numpy, "band keys": bands, "signature_table": lambda: signature_table(frame)}
    seconds = {name: float("inf") for name in parts}
    for _ in range(REPEATS):
        for name, part in parts.items():
            start = time.perf_counter()
            part()
            seconds[name] = min(seconds[name], time.perf_counter() - start)
    total = seconds.pop("signature_table")
    seconds["the rest (salted keys, answer form, table)"] = max(0.0, total - sum(seconds.values()))
    return {"rows": frame.height, "total_s": total, "parts_s": seconds}


# --- 3. clustering per million rows ---------------------------------------------------------------------------
def planted_rows(rows: int, share: float, seed: int) -> list[dict]:
    """Short random prompts (24-40 words of a 20k-word vocabulary); `share` of the rows are in clusters of 2-8:
    exact copies, a word replaced, or a word appended, shuffled across the whole corpus."""
    rng = random.Random(seed)
    vocabulary = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(3, 9))) for _ in range(20_000)]
    out: list[dict] = []
    while len(out) < rows:
        words = rng.choices(vocabulary, k=rng.randint(24, 40))
        size = rng.randint(2, 8) if rng.random() < share / (5 - 4 * share) else 1  # mean size 5
        for k in range(min(size, rows - len(out))):
            copy = list(words)
            if k % 3 == 1:
                copy[-1] = rng.choice(vocabulary)
            elif k % 3 == 2:
                copy.append(rng.choice(vocabulary))
            out.append({"synth_id": f"p{len(out):09d}", "prompt": " ".join(copy)})
    rng.shuffle(out)
    return out


def write_base_shards(rows: int, share: float, work: Path) -> list[Path]:
    """The pipeline's signature_table over `rows` planted prompts, BASE_SHARDS files."""
    from synthkd_assets.core.near_dup import signature_table
    from synthkd_assets.core.parquet_io import ParquetShardWriter
    from synthkd_contract.schemas import SIGNATURES_SCHEMA
    from synthkd_dev.harmony_rows import harmony_frame

    work.mkdir(parents=True, exist_ok=True)
    corpus = planted_rows(rows, share, seed=rows)
    per = -(-rows // BASE_SHARDS)
    paths = []
    for i in range(BASE_SHARDS):
        path = work / f"synth_{i:03d}.parquet"
        with ParquetShardWriter(path, SIGNATURES_SCHEMA) as writer:
            for lo in range(i * per, min(rows, (i + 1) * per), 50_000):
                writer.write(signature_table(harmony_frame(corpus[lo : min(lo + 50_000, (i + 1) * per, rows)])))
        paths.append(path)
    return paths


def recopied(path: Path, copy: int) -> pa.Table:
    """A base shard as copy `copy` of the corpus, without re-hashing prompts: new synth_ids (and what the
    pipeline derives from them), every signature value xor-ed with one constant, band keys recomputed: the
    copy's rows are near-duplicates among themselves exactly as the base's rows are, and of no other copy's."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from synthkd_assets.core.near_dup import band_keys, synth_id_columns
    from synthkd_contract import near_dup as nd
    from synthkd_contract.schemas import BAND_COLUMNS, SIGNATURES_SCHEMA

    table = pq.read_table(path)
    ids = [f"{i}_{copy}" for i in table.column("synth_id").to_pylist()]
    flat = table.column("signature").combine_chunks().values.to_numpy().reshape(-1, nd.NUM_PERM)
    signatures = flat ^ np.uint32((0x9E3779B1 * copy) & 0xFFFFFFFF)
    keys = band_keys(signatures)
    columns = {name: table.column(name) for name in table.column_names}
    columns |= {
        "synth_id": ids,
        **synth_id_columns(ids),
        "near_dup_hash": [f"{k:016x}" for k in keys[:, 0].tolist()],
        "signature": pa.FixedSizeListArray.from_arrays(pa.array(signatures.reshape(-1)), nd.NUM_PERM),
    }
    columns |= {name: keys[:, band] for band, name in enumerate(BAND_COLUMNS)}
    return pa.table(columns, schema=SIGNATURES_SCHEMA)


def corpus_shards(base: list[Path], copies: int, work: Path) -> None:
    """`copies` copies of the base shards as one corpus in `work` (the first: the base files themselves)."""
    import pyarrow.parquet as pq

    work.mkdir(parents=True)
    for copy in range(copies):
        for i, path in enumerate(base):
            target = work / f"synth_{copy:03d}_{i}.parquet"
            if copy == 0:
                shutil.copy(path, target)
            else:
                pq.write_table(recopied(path, copy), target)


def child_cluster(directory: str) -> dict:
    """cluster_shards + cluster_summary as synth_clusters runs them, with a mark after each of their phases."""
    import pyarrow.parquet as pq
    from scipy.sparse.csgraph import connected_components

    from synthkd_assets.core import near_dup

    paths = sorted(Path(directory).glob("*.parquet"))
    warm = Path(directory) / "warm-up"  # every code path once on 2000 rows: imports and arenas are not counted
    warm.mkdir(exist_ok=True)
    pq.write_table(pq.read_table(paths[0]).slice(0, 2000), warm / "warm.parquet")
    near_dup.cluster_summary(
        near_dup.cluster_shards(["warm"], [warm / "warm.parquet"], near_dup.ClusterSettings()), [warm / "warm.parquet"]
    )
    peaks = Peaks()
    counts = {"band_pairs": 0, "candidate_rows": 0}

    def hooked(function, before: str | None, after: str | None, count=None):
        def wrapper(*args, **kwargs):
            if before:
                peaks.mark(before)
            result = function(*args, **kwargs)
            if count:
                count(args, result)
            if after:
                peaks.mark(after)
            return result

        return wrapper

    near_dup.candidate_pairs = hooked(
        near_dup.candidate_pairs,
        None,
        None,
        lambda a, r: counts.__setitem__("band_pairs", counts["band_pairs"] + len(r)),
    )
    if hasattr(near_dup, "CandidateBlocks"):  # the pairs' codes in files, a block at a time
        near_dup.CandidateBlocks.__init__ = hooked(
            near_dup.CandidateBlocks.__init__, None, "band keys + candidate pairs (codes on disk)"
        )
    elif hasattr(near_dup, "distinct_candidate_codes"):  # the pairs stay codes: their union is the bands' phase
        near_dup.distinct_candidate_codes = hooked(
            near_dup.distinct_candidate_codes, None, "band keys + candidate pairs (as codes)"
        )
    else:
        merged = "_code_pairs" if hasattr(near_dup, "_code_pairs") else "_unique_pairs"  # before the bounds
        setattr(near_dup, merged, hooked(getattr(near_dup, merged), "band keys + candidate pairs", "unique pairs"))
    near_dup._signature_rows = hooked(
        near_dup._signature_rows,
        None,
        None,
        lambda a, r: counts.__setitem__("candidate_rows", max(counts.get("candidate_rows", 0), len(r))),
    )
    verifying = "verified_codes" if hasattr(near_dup, "verified_codes") else "verified_pairs"
    setattr(near_dup, verifying, hooked(getattr(near_dup, verifying), None, "verification"))
    near_dup.connected_components = hooked(connected_components, None, "components")
    near_dup._hold_out = hooked(near_dup._hold_out, "ranks and sizes", "held-out (polars table)")
    clusters = near_dup.cluster_shards([p.stem for p in paths], paths, near_dup.ClusterSettings())
    peaks.mark("cap")
    summary = near_dup.cluster_summary(clusters, paths)
    peaks.mark("cluster_summary (polars table)")
    total = sum(phase["seconds"] for phase in peaks.phases.values())
    return {
        "rows": clusters.rows,
        "shards": len(paths),
        "seconds": total,
        "peak_bytes": peaks.peak - peaks.start,
        "start_bytes": peaks.start,
        "phases": peaks.phases,
        "band_pairs": counts["band_pairs"],
        "candidate_pairs": clusters.candidate_pairs,
        "candidate_rows": counts["candidate_rows"],
        "verified_pairs": clusters.verified_pairs,
        "share_in_clusters_over_1": summary["share_in_clusters_over_1"],
    }


def clustering(base_rows: int, sizes: list[tuple[int, float]], work: Path, baseline: Path | None = None) -> list[dict]:
    """cluster_shards in a child per (copies of the base, planted share); each share's base is written once.
    With `baseline`, the same corpus is clustered by that checkout's code too (figures under "baseline")."""
    bases: dict[float, list[Path]] = {}
    results = []
    for copies, share in sizes:
        if share not in bases:
            bases[share] = write_base_shards(base_rows, share, work / f"base_{share}")
        directory = work / f"corpus_{copies}_{share}"
        corpus_shards(bases[share], copies, directory)
        results.append({"planted_share": share, **run_child("cluster", str(directory))})
        if baseline:
            results[-1]["baseline"] = run_child("cluster", str(directory), tree=baseline)
        shutil.rmtree(directory)
    return results


# --- 4. projection and the table --------------------------------------------------------------------------------
def projected_peak(c: dict) -> tuple[float, str, int]:
    """Peak RSS of the clustering at FULL_CORPUS_ROWS from one run's peak per phase: bytes per row scale with
    the rows, except the candidate signatures of verification, which `value_slices` caps at SIGNATURE_BUDGET."""
    from synthkd_assets.core.near_dup import EDGE_CHUNK, value_slices
    from synthkd_contract import near_dup as nd

    scale = FULL_CORPUS_ROWS / c["rows"]
    candidates = c["candidate_rows"] * scale

    def bounded(rows: float, pairs: float) -> float:
        """Verification's parts that do not grow with the rows: the candidate signatures (SIGNATURE_BUDGET) and
        one EDGE_CHUNK of pairs' gathered values (2 x uint32 + the bool comparison per value)."""
        width = nd.NUM_PERM // value_slices(int(rows))
        return rows * 4 * width + min(pairs, EDGE_CHUNK) * 9 * width

    slices = value_slices(int(candidates))
    peaks = {}
    for name, phase in c["phases"].items():
        peaks[name] = max(0, phase["peak_bytes"]) * scale
        if name == "verification":
            measured = bounded(c["candidate_rows"], c["candidate_pairs"])
            peaks[name] += bounded(candidates, c["candidate_pairs"] * scale) - measured * scale
    phase = max(peaks, key=peaks.__getitem__)
    return c["start_bytes"] + peaks[phase], phase, slices


def mib(value: float) -> str:
    return f"{value / (1 << 20):,.0f} MiB"


def report(library: dict, signatures: dict, split: dict, clusters: list[dict]) -> list[str]:
    cores = os.cpu_count() or 1
    per_100k = 100_000 / library["rensa"]["rows"]
    rate = {name: library[name]["rows"] / library[name]["seconds"] for name in LIBRARIES[:2]}
    lines = [
        f"1. MinHash library, {library['rensa']['rows']:,} SYNTH-like prompts "
        f"({library['shingles_per_prompt']:.0f} word 3-grams each), 128 perms, best of {REPEATS}, one core:",
        f"   datasketch MinHash.bulk (baseline): {rate['datasketch']:,.0f} signatures/s, peak "
        f"{mib(library['datasketch']['peak_bytes'] * per_100k)} per 100k "
        f"(LeanMinHash kept: {mib(library['datasketch_lean']['kept_bytes'] * per_100k)} per 100k)",
        f"   rensa digest_matrix_from_token_sets:  {rate['rensa']:,.0f} signatures/s, peak "
        f"{mib(library['rensa']['peak_bytes'] * per_100k)} per 100k (numpy uint32 kept: "
        f"{mib(library['rensa']['kept_bytes'] * per_100k)})",
        f"   rensa vs datasketch: {rate['rensa'] / rate['datasketch']:.1f}x signatures/s, "
        f"{library['datasketch']['peak_bytes'] / max(library['rensa']['peak_bytes'], 1):.1f}x less peak memory",
    ]
    jac = library["jaccard"]
    lines.append(
        f"   Jaccard vs exact on {jac['pairs']} pairs (exact {jac['exact_range'][0]:.2f}.."
        f"{jac['exact_range'][1]:.2f}): "
        + ", ".join(
            f"{name} max |error| {jac[name]['max_abs_error']:.3f}, "
            f"{100 * jac[name]['within_3_sigma']:.0f}% within 3 sigma"
            for name in ("rensa", "datasketch")
        )
    )
    per_row = signatures["seconds"] / signatures["rows"]
    lines += [
        f"2. signatures_shard, {signatures['rows']:,} long rows, one core: {per_row * 1e6 / 60:.1f} min per "
        f"million rows ({signatures['rows'] / signatures['seconds']:,.0f} rows/s), peak RSS +"
        f"{mib(signatures['peak_bytes'])} above the process start",
        f"   signature_table {split['total_s'] * 1e6 / split['rows']:.0f} s per million rows: "
        + ", ".join(f"{name} {100 * s / split['total_s']:.0f}%" for name, s in split["parts_s"].items()),
    ]
    lines.append("3. clustering (cluster_shards + cluster_summary), planted near-duplicates:")
    for c in clusters:
        n = c["rows"]
        lines.append(
            f"   {n:,} rows in {c['shards']} shards, {100 * c['share_in_clusters_over_1']:.0f}% in clusters > 1: "
            f"{c['seconds']:.1f} s ({c['seconds'] * 1e6 / n:.1f} s per million rows), peak +{mib(c['peak_bytes'])}"
            f" ({c['peak_bytes'] / n:.0f} B/row); candidate rows {c['candidate_rows'] / n:.2f}/row, band pairs "
            f"{c['band_pairs'] / n:.2f}/row, unique {c['candidate_pairs'] / n:.2f}/row, verified "
            f"{c['verified_pairs'] / n:.2f}/row"
        )
        if "baseline" in c:
            b = c["baseline"]
            lines.append(
                f"     baseline tree: {b['seconds']:.1f} s, peak +{mib(b['peak_bytes'])} "
                f"({b['peak_bytes'] / n:.0f} B/row); "
                + ", ".join(f"{name} {p['peak_bytes'] / n:.0f}" for name, p in b["phases"].items())
            )
        lines.append(
            "     peak above start, B/row: "
            + ", ".join(f"{name} {p['peak_bytes'] / n:.0f} ({p['seconds']:.1f} s)" for name, p in c["phases"].items())
        )
    lines.append(f"4. projection to {FULL_CORPUS_ROWS:,} rows:")
    sig_hours = per_row * FULL_CORPUS_ROWS / 3600
    largest = max(clusters, key=lambda c: (c["planted_share"] < 1, c["rows"]))
    worst = max(clusters, key=lambda c: c["peak_bytes"] / c["rows"])
    cluster_hours = largest["seconds"] / largest["rows"] * FULL_CORPUS_ROWS / 3600
    lines.append(
        f"   signatures: {sig_hours:.1f} core-hours: {sig_hours / cores:.1f} h on this {cores}-core machine, "
        + ", ".join(f"{sig_hours / w:.2f} h on {w} Celery workers" for w in POOL_WORKERS)
        + f"; clustering (one global step, linear from {largest['rows']:,} rows): {cluster_hours:.2f} h on one core"
    )
    for label, c in (("measured share", largest), ("worst case", worst)):
        projected, phase, slices = projected_peak(c)
        lines.append(
            f"   clustering peak RSS, {label} ({100 * c['share_in_clusters_over_1']:.0f}% of rows in clusters, "
            f"{c['candidate_rows'] / c['rows']:.2f} candidate rows/row): {projected / GIB:.1f} GiB "
            f"(limit {MEMORY_LIMIT / GIB:.0f} GiB: {'fits' if projected <= MEMORY_LIMIT else 'DOES NOT FIT'}; "
            f"largest phase: {phase}; verification in {slices} signature slice(s), "
            f"+{(slices - 1) * c['phases']['verification']['seconds'] * FULL_CORPUS_ROWS / c['rows'] / 60:.0f} min "
            "of re-reading)"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a < 1 min smoke run of the benchmark")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument(
        "--library-from",
        type=Path,
        help="take section 1 from an earlier run's --json (it measures the libraries, not the pipeline: ~4 min)",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also cluster with the synthkd_assets of this tree (e.g. `git archive` of an earlier commit)",
    )
    parser.add_argument("--report-from", type=Path, help="print the table of an earlier run's --json")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.report_from:  # the table again, from an earlier run's --json
        figures = json.loads(args.report_from.read_text())
        print("\n".join(report(figures["library"], figures["signatures"], figures["split"], figures["clustering"])))
        return 0
    if args.child:
        kind, *rest = args.child
        child = {"library": child_library, "signatures": child_signatures, "cluster": child_cluster}[kind]
        print(json.dumps(child(*rest)))
        return 0
    if args.quick:
        prompts, signature_rows, base_rows, sizes = 500, 1000, 10_000, [(2, 0.2), (2, 1.0)]
    else:
        prompts, signature_rows, base_rows = 20_000, 50_000, 125_000
        sizes = [(2, 0.2), (8, 0.2), (2, 1.0)]  # 250k and 1M rows at a 20% planted share, 250k at 100%
    work = Path(tempfile.mkdtemp(prefix="synthkd-near-dup-"))
    try:
        library = json.loads(args.library_from.read_text())["library"] if args.library_from else None
        library = library or library_choice(prompts, work)
        harmony = harmony_shard(signature_rows, work / "signatures")
        signatures = run_child("signatures", str(harmony), str(work / "signatures" / "out.parquet"))
        split = signature_split(harmony, SPLIT_ROWS)
        clusters = clustering(base_rows, sizes, work / "clusters", args.baseline_tree)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        figures = {"library": library, "signatures": signatures, "split": split, "clustering": clusters}
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"{os.cpu_count()} cores, {os.uname().machine}")
    print("\n".join(report(library, signatures, split, clusters)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
