#!/usr/bin/env python
"""A million-row proof (issue #19): generated SYNTH-like shards through the real build, every check included.

    .venv/bin/python benchmarks/scale_run.py                         # 1M rows in 10 shards (~1.4B tokens)
    .venv/bin/python benchmarks/scale_run.py --rows 20000 --shards 4 # a few minutes: the same path, small
    .venv/bin/python benchmarks/scale_run.py --verify-only --work-dir W   # the 1% check again on a kept build
    .venv/bin/python benchmarks/scale_run.py --real-files 7          # 1.09M rows in 7 files shaped as SYNTH's

1. generates `--rows` long SYNTH-like rows into `--shards` raw Parquet files: `rows / copies` distinct rows from
   synthkd_dev.make_sample_data (`generate_rows(long=True)`, ~0.9 ms a row, so 1M distinct rows would cost
   ~15 core-minutes), each written `--copies` times with distinct synth_ids. Copy 0 is the generated row; every
   other copy has every `PERTURB_PERIOD`-th word of its answer replaced by a word of the sample's word banks,
   at an offset of its own, so its signature text's (question and answer) Jaccard to any other copy is ~0.1-0.5
   (below the generator's own ~0.6 between unrelated rows, far below `near_dup_threshold` 0.8): the near-duplicate
   step sees `--rows` distinct examples, not 10 copies capped to 4. A `--near-dup-share` of the distinct rows are
   planted clusters instead: 1..copies-1 of their copies have the generated answer lower-cased (Jaccard 1.0 after
   NFKC and casefold), so clustering, the cap and the held-out clusters run at the full row count with real clusters.
2. runs `./scripts/build.sh` (every pass, every blocking check) on fresh SYNTHKD_RAW_DIR / SYNTHKD_DATA_DIR /
   DAGSTER_HOME under the work directory, SYNTHKD_PARALLEL_RUNS = the cores, and every ~0.5 s samples every
   process of its tree (its session) from /proc: VmHWM (the kernel's own peak of the process, so a peak between
   two samples is not missed, only what a process does after the last sample before it exits, and processes
   that live less than one interval) and VmRSS summed over the tree (the machine's peak, by sampling).
3. reports rows in and out, tokens written (the synth_kd_v1 manifest), tokens/s, output bytes per dataset,
   the build's step and pass times (its console lines; issue #45's target 3 measured both ways: the wall
   outside the shard passes, and the global steps' own seconds), the peak RSS per process, and projects hours for
   the real corpus (500 files, 77.9M rows) on this machine and on a 64-core Celery pool (`projection`: its
   assumptions; issue #45's target is <= 1 h on the pool), the near-duplicate verification timed again at the
   slices it reads at the real corpus's size (`verification_at_scale`).
4. verifies a seeded random 1% (`--verify-fraction`) of the written documents: their tokens / loss_mask /
   span_id read from the synth_kd_v1 trio with megatron-core's IndexedDataset, against openai-harmony's own
   render (`HarmonyRenderer`) of the same conversation's synth_harmony messages, found by synth_id through the
   shard's documents table. Exits 1 if any document differs (or the build fails: its exit status, 2 at least).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as `python benchmarks/scale_run.py`: synthkd_dev is at the root
    sys.path.insert(0, str(REPO_ROOT))

from throughput import REAL_FILE_ROWS, REAL_FILE_SEED  # noqa: E402  (a file as SYNTH publishes them)

REAL_CORPUS_ROWS = 77_908_583  # the rows of SYNTH's 500 files (../shared/SYNTH-facts.md; its card says 79.6M)
REAL_CORPUS_FILES = 500
CELERY_POOL_CORES = 64
PROJECTION_TARGET_HOURS = 1.0  # issue #45, target 5: the real corpus in <= 1 h on a 64-core pool
CLUSTER_STEP = "synth_clusters"  # the one global step that grows faster than the rows (n log n)
EVERY_PAIR_VERIFIES = "every_pair_verifies"  # near-duplicates' worst case for verification (`verification_at_scale`)
GIB = 1 << 30
PERTURB_PERIOD = 4  # every 4th word of a copy's answer is replaced
_LETTERS = re.compile(r"[^\W\d_]+")  # a word's letters: what perturb replaces
GENERATE_CHUNK = 1000  # distinct rows per generator task
WRITE_BATCH = 5000  # rows per batch when writing a shard
RAW_ROW_GROUP = 1024
DEFAULT_SEED = 2026
BUILD_FAILED = 2  # exit status when build.sh fails (its own status if higher)


# --- 1. the raw shards ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RawPlan:
    rows: int
    shards: int
    copies: int
    near_dup_share: float
    seed: int

    @property
    def distinct(self) -> int:
        return math.ceil(self.rows / self.copies)

    def shard_range(self, shard: int) -> tuple[int, int]:
        """Global rows [begin, end) of one shard: contiguous, sizes differing by at most one."""
        return self.rows * shard // self.shards, self.rows * (shard + 1) // self.shards

    def planted_copies(self, base: int) -> int:
        """How many copies (1..) of distinct row `base` are planted near-duplicates of copy 0: 0 for most."""
        rng = random.Random(f"scale_run/planted/{self.seed}/{base}")
        if self.copies < 2 or rng.random() >= self.near_dup_share:
            return 0
        return rng.randint(1, self.copies - 1)


def perturb_vocabulary() -> list[str]:
    """Words of the sample generator's banks (every language), alphabetic, 3+ letters: what perturbed copies
    draw their replacement words from."""
    from synthkd_dev.make_sample_data import WORD_BANKS_FILE

    text = WORD_BANKS_FILE.read_text(encoding="utf-8")
    return sorted({w for w in re.findall(r"[^\W\d_]{3,}", text)})


# what a copy edits: the answer, part of what the near-duplicate signatures compare (the question and the answer,
# synthkd_assets/core/near_dup.py), so that a perturbed copy is a distinct example and a lower-cased one a near copy
PERTURBED_COLUMN = "synthetic_answer"


def perturb(text: str, base: int, copy: int, vocabulary: list[str]) -> str:
    """Every PERTURB_PERIOD-th word with letters (from an offset of the copy's own) has its letters replaced by a
    vocabulary word picked by (base, copy, position), its Markdown and punctuation kept; whitespace other than
    single spaces stays where it was."""
    words = text.split(" ")
    offset = copy % PERTURB_PERIOD
    salt = base * 1_000_003 + copy * 7919
    size = len(vocabulary)
    for j in range(offset, len(words), PERTURB_PERIOD):
        words[j] = _LETTERS.sub(vocabulary[(salt + j * 104_729) % size], words[j], count=1)  # letters only
    return " ".join(words)


def _generate_chunk(task: tuple[int, int, int, str]) -> str:
    """Distinct rows [start, start + n) into a Parquet file of their own (a worker process)."""
    import pyarrow.parquet as pq

    from synthkd_dev.make_sample_data import generate_rows, rows_to_table

    seed, start, n, path = task
    pq.write_table(rows_to_table(generate_rows(n, seed=seed, start_index=start, long=True)), path)
    return path


def _write_shard(task: tuple[RawPlan, int, str, str]) -> tuple[int, int]:
    """One raw shard from the distinct rows (a worker process): (rows, planted rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from synthkd_contract.schemas import RAW_SCHEMA

    plan, shard, base_path, out = task
    vocabulary = perturb_vocabulary()
    begin, end = plan.shard_range(shard)
    planted = 0
    tmp = Path(out).with_suffix(".parquet.partial")
    with pq.ParquetWriter(tmp, RAW_SCHEMA, compression="zstd") as writer:
        for batch_begin in range(begin, end, WRITE_BATCH):
            rows = range(batch_begin, min(end, batch_begin + WRITE_BATCH))
            bases = [r % plan.distinct for r in rows]
            columns = _take(base_path, bases).to_pydict()
            for k, (r, b) in enumerate(zip(rows, bases)):
                copy = r // plan.distinct
                columns["synth_id"][k] = f"{columns['synth_id'][k]}_c{copy}"
                if copy == 0:
                    continue
                if copy <= plan.planted_copies(b):
                    columns[PERTURBED_COLUMN][k] = columns[PERTURBED_COLUMN][k].lower()
                    planted += 1
                else:
                    columns[PERTURBED_COLUMN][k] = perturb(columns[PERTURBED_COLUMN][k], b, copy, vocabulary)
            writer.write_table(pa.Table.from_pydict(columns, schema=RAW_SCHEMA), row_group_size=RAW_ROW_GROUP)
    tmp.replace(out)
    return end - begin, planted


_BASE_CACHE: dict[str, object] = {}


def _take(base_path: str, indices: list[int]):
    """Rows of the distinct-row table by index; the table is read once per worker process."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if base_path not in _BASE_CACHE:
        _BASE_CACHE.clear()
        _BASE_CACHE[base_path] = pq.read_table(base_path)
    return _BASE_CACHE[base_path].take(pa.array(indices))


def make_real_files(files: int, raw_dir: Path) -> dict:
    """`files` raw files shaped as SYNTH publishes them (REAL_FILE_ROWS rows each in one row group, the sample's
    generator at its real lengths and exercise mix: what benchmarks/floor.py builds), unless already there."""
    from synthkd_dev.make_sample_data import write_shards

    started = time.monotonic()
    reused = raw_dir.is_dir() and len(list(raw_dir.glob("*.parquet"))) == files
    if not reused:
        shutil.rmtree(raw_dir, ignore_errors=True)
        raw_dir.mkdir(parents=True)
        write_shards(raw_dir, files, REAL_FILE_ROWS, REAL_FILE_SEED)
    return {
        "raw_bytes": sum(p.stat().st_size for p in raw_dir.glob("*.parquet")),
        "seconds": time.monotonic() - started,
        "reused": reused,
    }


def make_raw(plan: RawPlan, raw_dir: Path, scratch: Path, workers: int) -> dict:
    """The raw shards of `plan` in raw_dir (synth_001.parquet ...); reused when raw_dir holds the same plan."""
    import multiprocessing

    import pyarrow as pa
    import pyarrow.parquet as pq

    from synthkd_dev.make_sample_data import shard_filename

    stamp = raw_dir.parent / f"{raw_dir.name}.plan.json"
    wanted = plan.__dict__
    if stamp.is_file():
        done = json.loads(stamp.read_text())
        if done["plan"] == wanted:
            return {**done["result"], "reused": True}
    shutil.rmtree(raw_dir, ignore_errors=True)
    stamp.unlink(missing_ok=True)
    raw_dir.mkdir(parents=True)
    scratch.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tasks = [
        (plan.seed, s, min(GENERATE_CHUNK, plan.distinct - s), str(scratch / f"distinct_{s:09d}.parquet"))
        for s in range(0, plan.distinct, GENERATE_CHUNK)
    ]
    context = multiprocessing.get_context("spawn")  # no fork of a process holding threads
    with context.Pool(workers) as pool:
        parts = pool.map(_generate_chunk, tasks, chunksize=1)
        generated = time.perf_counter() - start
        base_path = scratch / "distinct.parquet"
        pq.write_table(pa.concat_tables(pq.read_table(p) for p in parts), base_path)
        for p in parts:
            Path(p).unlink()
        outs = [str(raw_dir / shard_filename(s)) for s in range(plan.shards)]  # SYNTH's names: synth_001, ...
        written = pool.map(_write_shard, [(plan, s, str(base_path), outs[s]) for s in range(plan.shards)], 1)
        # workers leave on the pool's sentinel: the SIGTERM of Pool.terminate() never reaches a worker whose
        # parent ignores it (spawned children keep an ignored signal ignored, and Dagster's in-process runs can
        # leave SIGTERM ignored in the process that imported this module, e.g. pytest)
        pool.close()
        pool.join()
    base_path.unlink()
    result = {
        "seconds": time.perf_counter() - start,
        "generate_seconds": generated,
        "distinct_rows": plan.distinct,
        "planted_rows": sum(p for _, p in written),
        "raw_bytes": sum(p.stat().st_size for p in raw_dir.glob("*.parquet")),
    }
    stamp.write_text(json.dumps({"plan": wanted, "result": result}, indent=1))
    return {**result, "reused": False}


# --- 2. the build, and the memory of every process under it ---------------------------------------------------
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: str) -> tuple[int, int, int, float] | None:
    """(ppid, session, start time in clock ticks, user + system CPU seconds) of a live process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[3]), int(fields[19]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _proc_memory(pid: str) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) in bytes; None for a process gone or without memory (a zombie)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.MULTILINE))
    if len(values) < 2:
        return None
    return int(values["VmRSS"]) * 1024, int(values["VmHWM"]) * 1024


def _command(pid: str) -> str:
    try:
        parts = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    words = [p.decode(errors="replace") for p in parts]
    if words and "/" in words[0]:
        words[0] = words[0].rsplit("/", 1)[1]
    return " ".join(words)


def process_kind(command: str, parent: str = "") -> str:
    """A short name for what a process of the build is, to group the per-process peaks; a step process is
    named by its parent's kind (the run it executes a step of)."""
    for pattern, kind in (
        (r"build\.sh", "build.sh"),
        (r"\bdg launch\b.*--(?:job|assets) (\S+)", "dg launch {}"),
        (r"synthkd_assets\.cli (\w[\w-]*)", "cli {}"),
        (r"\bapi execute_run\b", "run process"),
        (r"\bapi grpc\b", "code server"),
        (r"dagster-daemon", "daemon"),
        (r"dagster-webserver", "webserver"),
        (r"multiprocessing|execute_step|api execute", "step process"),
        (r"\bxargs\b", "xargs"),
    ):
        match = re.search(pattern, command)
        if match:
            kind = kind.format(*match.groups())
            return f"{kind} of {process_kind(parent)}" if kind == "step process" and parent else kind
    return command.split(" ", 1)[0][:40]


@dataclass
class ProcessPeak:
    pid: int
    command: str
    parent: str  # the parent's command line: says which run a step process belongs to
    peak_hwm: int = 0  # the kernel's VmHWM at the last sample
    peak_rss: int = 0  # the largest VmRSS sampled
    first_seen: float = 0.0
    last_seen: float = 0.0
    cpu_seconds: float = 0.0  # user + system at the last sample


@dataclass
class TreeSampler:
    """Every `interval` s: every process in `session` or under `root` (by /proc), its VmRSS and VmHWM."""

    root: int
    session: int
    interval: float = 0.5
    started: float = field(default_factory=time.monotonic)
    processes: dict[tuple[int, int], ProcessPeak] = field(default_factory=dict)
    peak_total_rss: int = 0
    peak_total_at: float = 0.0
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        now = time.monotonic() - self.started
        stats = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (stat := _proc_stat(entry)) is not None:
                stats[int(entry)] = stat
        children: dict[int, list[int]] = {}
        for pid, (ppid, *_) in stats.items():
            children.setdefault(ppid, []).append(pid)
        tree, todo = set(), [self.root]
        while todo:  # descendants of the root, plus anything left in its session (reparented)
            pid = todo.pop()
            if pid in stats and pid not in tree:
                tree.add(pid)
                todo.extend(children.get(pid, ()))
        tree |= {pid for pid, (_, session, *_) in stats.items() if session == self.session}
        total = 0
        for pid in tree:
            memory = _proc_memory(str(pid))
            if memory is None:
                continue
            rss, hwm = memory
            total += rss
            key = (pid, stats[pid][2])
            peak = self.processes.get(key)
            if peak is None:
                peak = self.processes[key] = ProcessPeak(pid, "", _command(str(stats[pid][0])), first_seen=now)
            if (command := _command(str(pid))) not in ("", "?"):  # each time: a forked shell's changes at exec
                peak.command = command
            peak.peak_hwm, peak.peak_rss, peak.last_seen = max(peak.peak_hwm, hwm), max(peak.peak_rss, rss), now
            peak.cpu_seconds = stats[pid][3]
        if total > self.peak_total_rss:
            self.peak_total_rss, self.peak_total_at = total, now
        self.samples += 1

    def report(self) -> dict:
        peaks = sorted(self.processes.values(), key=lambda p: -p.peak_hwm)
        kinds: dict[str, dict] = {}
        for p in peaks:
            kind = kinds.setdefault(process_kind(p.command, p.parent), {"processes": 0, "max_peak_bytes": 0})
            kind["processes"] += 1
            kind["max_peak_bytes"] = max(kind["max_peak_bytes"], p.peak_hwm)
        return {
            "interval_s": self.interval,
            "samples": self.samples,
            "processes_seen": len(peaks),
            "max_process_peak_bytes": peaks[0].peak_hwm if peaks else 0,
            "max_process": peaks[0].command[:300] if peaks else None,
            "peak_total_rss_bytes": self.peak_total_rss,
            "peak_total_at_s": self.peak_total_at,
            "by_kind": kinds,
            "processes": [
                {
                    "pid": p.pid,
                    "kind": process_kind(p.command, p.parent),
                    "command": p.command[:300],
                    "peak_bytes": p.peak_hwm,
                    "peak_rss_sampled_bytes": p.peak_rss,
                    "cpu_seconds_sampled": p.cpu_seconds,
                    "seen_s": [round(p.first_seen, 1), round(p.last_seen, 1)],
                }
                for p in peaks
            ],
        }


STEP_LINE = re.compile(r"^(\w+): (\S+) \((\d+)s\)$")  # "plan: synth_clusters,synth_sampling_plan,... (31s)"
PASS_LINE = re.compile(r"^(\w+) pass done \((\d+)s\)$")  # "scan pass done (95s)"
PASS_START = re.compile(r"^(\w+) pass over (\d+) shards")  # "scan pass over 10 shards: synth_harmony,..."
# "  build synth_00 (1/10): 95000 rows in -> synth_sampled ... (95s)"
SHARD_LINE = re.compile(r"^\s+(\w+) (.+) \((\d+)/(\d+)\): .* \((\d+)s\)$")


def fresh_build_environment(
    raw_dir: Path, data_dir: Path, home: Path, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """build.sh's environment for a fresh build of `raw_dir` (every step and every check runs): `data_dir` and
    `home` (its DAGSTER_HOME) are removed first."""
    for fresh in (data_dir, home):
        shutil.rmtree(fresh, ignore_errors=True)
    return {
        **os.environ,
        "SYNTHKD_RAW_DIR": str(raw_dir),
        "SYNTHKD_DATA_DIR": str(data_dir),
        "DAGSTER_HOME": str(home),
        # this checkout's code, also where .venv's editable install points at another one (a git worktree)
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        **(extra or {}),
    }


def run_build(env: dict[str, str], log: Path, interval: float | None, echo: bool) -> dict:
    """./scripts/build.sh in its own session, its console lines timestamped into `log` (and echoed); with an
    `interval`, the memory of its process tree sampled that often. A pass's `wall_s` is the time between its
    first and last console line by this process's clock (the build prints whole seconds); a global pass's is
    read from the build's instance ($DAGSTER_HOME) once it has ended (`global_pass_walls`)."""
    start = time.monotonic()
    process = subprocess.Popen(
        ["bash", "scripts/build.sh"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    sampler = TreeSampler(process.pid, os.getsid(process.pid), interval or 0, started=start)
    if interval:
        sampler.start()
    steps, passes, shard_runs, lines = {}, {}, {}, []
    try:
        with open(log, "w") as out:
            for line in process.stdout:
                line = line.rstrip("\n")
                at = time.monotonic() - start
                lines.append((at, line))
                out.write(f"{at:9.1f}  {line}\n")
                out.flush()
                if echo:
                    print(f"  [{at:7.1f}s] {line}", flush=True)
                if match := STEP_LINE.match(line):
                    # its wall comes from the instance (global_pass_walls): passes that need not wait for each
                    # other run at once, so the console line before this one need not be where it began
                    steps[match.group(1)] = {"assets": match.group(2), "seconds": int(match.group(3)), "at_s": at}
                elif match := PASS_START.match(line):
                    passes[match.group(1)] = {"shards": int(match.group(2)), "start_s": at}
                elif match := PASS_LINE.match(line):
                    started = passes.get(match.group(1), {}).get("start_s", at)
                    passes.setdefault(match.group(1), {}).update(seconds=int(match.group(2)), wall_s=at - started)
                elif match := SHARD_LINE.match(line):
                    shard_runs.setdefault(match.group(1), {})[match.group(2)] = int(match.group(5))
        process.wait()
    except BaseException:  # Ctrl-C: stop the build's whole session, as its own traps would
        os.killpg(process.pid, signal.SIGTERM)
        process.wait()
        raise
    finally:
        sampler.stop()
    for name, wall in global_pass_walls(Path(env.get("DAGSTER_HOME", REPO_ROOT))).items():  # build.sh's default
        steps.setdefault(name, {})["wall_s"] = wall
    return {
        "returncode": process.returncode,
        "seconds": time.monotonic() - start,
        "steps": steps,
        "passes": passes,
        "shard_runs": shard_runs,
        "tail": [line for _, line in lines[-40:]],
        "memory": sampler.report(),
    }


# --- 3. what the build wrote ------------------------------------------------------------------------------------
def dataset_bytes(layout) -> dict[str, int]:
    """Bytes under the data root by dataset; everything else (stages, signatures, clusters, plans, reports,
    error logs, the tokenizer) is `intermediates`."""
    from synthkd_assets.core.layout import VALIDATION_SUBDIR

    roots = {
        "megatron": layout.megatron_root(),
        "distill": layout.distill_root(),
        "pool": layout.pool_root(),
        "validation": layout.data_root / VALIDATION_SUBDIR,
    }
    sizes = dict.fromkeys([*roots, "intermediates"], 0)
    prefixes = [(name, str(root.resolve()) + os.sep) for name, root in roots.items()]
    for directory, _, files in os.walk(layout.data_root.resolve()):
        name = next((n for n, prefix in prefixes if (directory + os.sep).startswith(prefix)), "intermediates")
        sizes[name] += sum(os.path.getsize(os.path.join(directory, f)) for f in files)
    return sizes


def written_documents(layout, keys: list[str]) -> list[tuple[str, str, int, str]]:
    """(partition key, split, document index, synth_id) of every document of synth_kd_v1, from the documents
    tables (docs/contract.md: one document per conversation, in each split's trio order)."""
    import pyarrow.parquet as pq

    from synthkd_assets.core.inventory import shard_index_from_name

    documents = []
    for key in keys:
        table = pq.read_table(layout.documents_table(shard_index_from_name(key))).to_pydict()
        documents += [(key, *row) for row in zip(table["split"], table["document_index"], table["synth_id"])]
    return documents


def _document_arrays(trio: dict, document: int) -> dict[str, object]:
    """kind -> one document's values, read through megatron-core's IndexedDataset (its sequences in order)."""
    import numpy as np

    out = {}
    for kind, dataset in trio.items():
        first, end = int(dataset.document_indices[document]), int(dataset.document_indices[document + 1])
        out[kind] = np.concatenate([np.asarray(dataset[i]) for i in range(first, end)])
    return out


def verify_documents(layout, keys: list[str], fraction: float, seed: int) -> dict:
    """A seeded random `fraction` of the written documents against openai-harmony's render of the same
    conversation's synth_harmony messages: tokens, loss_mask and span_id must be equal."""
    import numpy as np
    import polars as pl

    from synthkd_assets.core.inventory import shard_index_from_name
    from synthkd_assets.core.render import HarmonyRenderer, RenderError
    from synthkd_assets.core.tokenizer import load_harmony_encoding
    from synthkd_contract.constants import ARRAY_KINDS
    from synthkd_contract.trio import shard_tokens_prefix, sibling_prefix

    warnings.filterwarnings("ignore", message="Transformer Engine and Apex")  # megatron-core's import, no GPU
    # the reader training uses, not the build's own numpy one (synthkd_contract/indexed_dataset.py)
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    start = time.perf_counter()
    documents = written_documents(layout, keys)
    count = min(len(documents), max(1, math.ceil(len(documents) * fraction))) if documents else 0
    chosen = sorted(random.Random(f"scale_run/verify/{seed}").sample(range(len(documents)), count))
    renderer = HarmonyRenderer(load_harmony_encoding(layout.tokenizer_dir()))
    by_key: dict[str, list[tuple[str, int, str]]] = {}
    for i in chosen:
        key, split, index, synth_id = documents[i]
        by_key.setdefault(key, []).append((split, index, synth_id))
    tokens_compared, mismatches = 0, []
    for key, picked in by_key.items():
        ids = [synth_id for _, _, synth_id in picked]
        messages = dict(
            pl.scan_parquet(layout.stage_output("synth_harmony", key))
            .filter(pl.col("synth_id").is_in(ids))
            .select("synth_id", "messages_json")
            .collect()
            .iter_rows()
        )
        trios = {}
        for split, index, synth_id in picked:
            where = f"{key} {split} document {index} ({synth_id})"
            if split not in trios:
                prefix = shard_tokens_prefix(layout.megatron_root() / split, shard_index_from_name(key))
                trios[split] = {kind: IndexedDataset(sibling_prefix(prefix, kind)) for kind in ARRAY_KINDS}
            stored = _document_arrays(trios[split], index)
            if synth_id not in messages:
                mismatches.append(f"{where}: no synth_harmony row with this synth_id")
                continue
            try:
                reference = renderer.render(json.loads(messages[synth_id])["messages"])
            except RenderError as error:
                mismatches.append(f"{where}: openai-harmony does not render it: {error}")
                continue
            expected = dict(zip(ARRAY_KINDS, (reference.tokens, reference.loss_mask, reference.span_id)))
            tokens_compared += len(expected[ARRAY_KINDS[0]])
            for kind in ARRAY_KINDS:
                a, b = stored[kind], expected[kind]
                if len(a) != len(b):
                    mismatches.append(f"{where}: {kind} has {len(a)} values, the reference render {len(b)}")
                elif (differ := np.flatnonzero(a != b)).size:
                    p = int(differ[0])
                    mismatches.append(
                        f"{where}: {kind} differs at {differ.size} positions, first at {p}: "
                        f"{int(a[p])} stored vs {int(b[p])} by openai-harmony"
                    )
    return {
        "documents_written": len(documents),
        "fraction": fraction,
        "documents_verified": count,
        "tokens_compared": tokens_compared,
        "mismatches": len(mismatches),
        "first_mismatches": mismatches[:20],
        "seconds": time.perf_counter() - start,
    }


def manifest_figures(layout) -> dict:
    manifest = json.loads(layout.megatron_manifest().read_text())
    totals = manifest["totals"]
    return {
        "shards": len(manifest["shards"]),
        "rows_in": totals["rows_in"],
        "rows_out": totals["rows_out"],
        "sequences": totals["sequences"],
        "tokens": sum(totals["span_tokens"].values()),
        "span_tokens": totals["span_tokens"],
        "dropped": totals["dropped"],
    }


def step_times(dagster_home: Path) -> dict[str, dict[str, float]]:
    """Per step of the graph, over every run of the build in its instance: how many times it ran, its seconds in
    all and its longest single run (Dagster's own step start and end events): where the time goes."""
    import dagster as dg

    steps: dict[str, dict[str, float]] = {}
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        for run in instance.get_runs():
            for stat in instance.get_run_step_stats(run.run_id):
                if stat.start_time is None or stat.end_time is None:
                    continue
                seconds = stat.end_time - stat.start_time
                step = steps.setdefault(stat.step_key, {"runs": 0, "seconds": 0.0, "max_s": 0.0})
                step["runs"] += 1
                step["seconds"] += seconds
                step["max_s"] = max(step["max_s"], seconds)
    return dict(sorted(steps.items(), key=lambda kv: -kv[1]["seconds"]))


def cluster_figures(layout) -> dict:
    """What the near-duplicate step found (its summary's counts), for the report."""
    path = layout.clusters_summary()
    if not path.is_file():
        return {}
    summary = json.loads(path.read_text())
    return {k: v for k, v in summary.items() if isinstance(v, (int, float, str))}


# --- 4. projection ---------------------------------------------------------------------------------------------
GLOBAL_STEPS = ("inventory", "plan", "manifest", "quota", "pool_manifest")  # one run each, not per shard


SHARD_PASSES = ("scan", "build", "pool")  # one run per shard each


def pass_run_seconds(dagster_home: Path, passes: tuple[str, ...], since: str) -> dict[str, list[float]]:
    """Per pass of `passes` (its runs' `synthkd/pass` tag): each of its runs' seconds from `since` (a RunStats
    time: `launch_time`, `enqueued_time`) to its end."""
    import dagster as dg

    seconds: dict[str, list[float]] = {}
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        for run in instance.get_runs():
            name = run.tags.get("synthkd/pass")
            stats = instance.get_run_stats(run.run_id)
            began = getattr(stats, since)
            if name in passes and began is not None and stats.end_time is not None:
                seconds.setdefault(name, []).append(stats.end_time - began)
    return seconds


def shard_run_seconds(dagster_home: Path) -> dict[str, list[float]]:
    """Per shard pass: each of its runs' seconds from launch (the launcher starting its process) to its end: a
    file's run as the run queue sees it, start-up included, queueing not. (The build's console lines give each
    shard's time since its pass began, not its run's.)"""
    return pass_run_seconds(dagster_home, SHARD_PASSES, "launch_time")


def global_pass_walls(dagster_home: Path) -> dict[str, float]:
    """Per global pass: its run's seconds from its submission (RUN_ENQUEUED) to its end, what the build waits for
    it (the queue and the run's start-up included)."""
    return {name: sum(runs) for name, runs in pass_run_seconds(dagster_home, GLOBAL_STEPS, "enqueued_time").items()}


def critical_path_s(seconds: dict[str, float]) -> float:
    """The time the build's passes take when each starts as soon as the passes it runs after (`Pass.after`,
    defs/passes.py) are through: the longest chain of `seconds` (per pass; a pass not in it takes none)."""
    from synthkd_assets.defs.passes import build_passes

    finish: dict[str, float] = {}
    for build_pass in build_passes():
        ready = max((finish[name] for name in build_pass.after), default=0.0)
        finish[build_pass.name] = ready + seconds.get(build_pass.name, 0.0)
    return max(finish.values(), default=0.0)


def global_step_work(dagster_home: Path) -> dict[str, float]:
    """Per global pass (its run's `synthkd/pass` tag): the seconds its steps ran (Dagster's step events), the part of
    its wall time that grows with the corpus; the rest (queue, launch, the run process starting) does not. The
    clustering step on its own (CLUSTER_STEP), which grows faster."""
    import dagster as dg

    work: dict[str, float] = {}
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        for run in instance.get_runs():
            name = run.tags.get("synthkd/pass")
            if name not in GLOBAL_STEPS:
                continue
            for stat in instance.get_run_step_stats(run.run_id):
                if stat.start_time is not None and stat.end_time is not None:
                    key = CLUSTER_STEP if stat.step_key == CLUSTER_STEP else name
                    work[key] = work.get(key, 0.0) + stat.end_time - stat.start_time
    return work


def verification_at_scale(layout, keys: list[str], rows_in: int, repeats: int = 2) -> dict:
    """The near-duplicate verification of this build's signatures, timed in this process (the fastest of
    `repeats`): at SIGNATURE_BUDGET, as the build ran it, and at that budget shrunk by the real corpus's rows over
    this build's, so that `value_slices` gives the slices it gives at the real corpus's size (verification reads
    the signature files once a slice: its cost grows with the slices, not only the rows). The kept pairs must be
    the same at both budgets. Then near-duplicates' worst case at the smaller budget (EVERY_PAIR_VERIFIES): as
    many pairs, each of a row with itself, so that no slice drops one."""
    import numpy as np

    from synthkd_assets.core import near_dup
    from synthkd_assets.core.layout import SIGNATURES_STAGE

    paths = [layout.stage_output(SIGNATURES_STAGE, key) for key in keys]
    offsets = near_dup.shard_row_offsets(paths)
    pairs = near_dup.distinct_candidate_pairs(paths)
    candidate_rows = len(near_dup.sorted_distinct(pairs.ravel()))
    rows = int(offsets[-1])  # past the budget, every row's low bytes are read into the temporary file
    row_factor = REAL_CORPUS_ROWS / rows_in
    budgets = {"build": near_dup.SIGNATURE_BUDGET, "real_corpus": int(near_dup.SIGNATURE_BUDGET / row_factor)}
    threshold = near_dup.ClusterSettings().threshold
    seconds: dict[str, float] = {}
    kept: dict[str, np.ndarray] = {}

    def timed(name: str, candidates: np.ndarray, budget: int) -> None:
        """verified_pairs of `candidates` within `budget`: its fastest of `repeats` as seconds[name]."""
        for _ in range(repeats):
            start = time.perf_counter()
            kept[name] = near_dup.verified_pairs(candidates, paths, offsets, threshold, budget=budget)
            seconds[name] = min(seconds.get(name, math.inf), time.perf_counter() - start)

    for name, budget in budgets.items():
        timed(name, pairs, budget)
    if not np.array_equal(kept["build"], kept["real_corpus"]):
        raise AssertionError("verification kept other pairs at the smaller budget")
    # near-duplicates' worst case: every candidate pair verifies, so no slice drops one. Each pair (a, b) becomes
    # (a, a): as many pairs, all kept, over the rows of their first members, at the real corpus's slices
    every_pair = np.stack([pairs[:, 0], pairs[:, 0]], axis=1)
    timed(EVERY_PAIR_VERIFIES, every_pair, budgets["real_corpus"])
    if len(kept[EVERY_PAIR_VERIFIES]) != len(every_pair):
        raise AssertionError("a pair of a row with itself did not verify")
    return {
        "candidate_pairs": len(pairs),
        "candidate_rows": candidate_rows,
        "budgets": budgets,
        "low_byte_slices": {
            "build": near_dup.value_slices(rows, value_bytes=1),
            "real_corpus": near_dup.value_slices(round(rows * row_factor), value_bytes=1),
            "at_the_smaller_budget": near_dup.value_slices(rows, budgets["real_corpus"], value_bytes=1),
        },
        "seconds": seconds,
        "verified_pairs": len(kept["build"]),
    }


def projection(
    build: dict,
    figures: dict,
    cores: int,
    work: dict[str, float],
    run_seconds: dict[str, list[float]],
    verification: dict | None = None,
) -> dict:
    """Hours for the real corpus (REAL_CORPUS_FILES files of REAL_CORPUS_ROWS rows in all) on this machine and on a
    CELERY_POOL_CORES-core pool, from this build. Assumptions:

    - a shard pass runs one run per core at a time, each file's run as long as this build's mean run of that pass
      (`run_seconds`, launch to end; scaled by rows when this build's shards are not real-sized): ceil(files /
      cores) waves of it. Shards are independent; a worker needs ~1 GiB (docs/design.md), so the pool machine has
      the memory for one per core;
    - a global pass (`work`: its steps' seconds) costs its measured start-up (wall less work) once, and its work
      scaled by rows, on one process whatever the cores (pessimistic for the manifests, which read their per-file
      inputs on one thread per core); the clustering by rows x log(rows), its verification first counted at
      the slices it takes at the real corpus's size (`verification`, from `verification_at_scale`: the seconds
      at the smaller budget replace those at the build's; the pool's hours are also given for near-duplicates'
      worst case, where every candidate pair verifies);
    - passes that need not wait for each other run at once, as the build runs them (`Pass.after`: the manifests
      beside the quota plan and the pool pass): the build takes its passes' critical path (`critical_path_s`);
    - the rest of the build's wall time (the services starting, the summary) is a constant: the wall less this
      build's own critical path."""
    rows = figures["rows_in"]
    row_factor = REAL_CORPUS_ROWS / rows
    rows_per_file = REAL_CORPUS_ROWS / REAL_CORPUS_FILES
    passes = {name: p["wall_s"] for name, p in build["passes"].items() if "wall_s" in p}
    steps = {name: build["steps"][name]["wall_s"] for name in GLOBAL_STEPS if name in build["steps"]}
    other_s = max(0.0, build["seconds"] - critical_path_s({**steps, **passes}))
    shards = figures["shards"]
    file_run_s = {  # one real-sized file's run of each shard pass
        name: sum(runs) / len(runs) * rows_per_file / (rows / shards) for name, runs in run_seconds.items() if runs
    }
    clusters = work.get(CLUSTER_STEP, 0.0)  # a step of the plan pass, projected on its own line
    global_full_s = {}
    for name, wall in steps.items():
        grows = work.get(name, wall)
        global_full_s[name] = wall - grows - (clusters if name == "plan" else 0.0) + grows * row_factor
    timed = (verification or {}).get("seconds", {})

    def clustering_s(verified: str | None) -> float:
        """The clustering at full scale, its verification as timed at the real corpus's slices (`verified`)."""
        extra = timed[verified] - timed["build"] if verified in timed else 0.0
        return (clusters + extra) * row_factor * math.log(REAL_CORPUS_ROWS) / math.log(rows)

    if clusters:
        global_full_s[CLUSTER_STEP] = clustering_s("real_corpus")
    global_pass_s = {name: seconds for name, seconds in global_full_s.items() if name != CLUSTER_STEP}

    def hours_on(pool_cores: int, clustering: float = global_full_s.get(CLUSTER_STEP, 0.0)) -> dict[str, float]:
        waves = math.ceil(REAL_CORPUS_FILES / pool_cores)
        shard_s = {name: waves * seconds for name, seconds in file_run_s.items()}
        passes_s = {**global_pass_s, "plan": global_pass_s.get("plan", 0.0) + clustering}
        path_s = critical_path_s({**passes_s, **shard_s})
        return {
            "shard_passes_hours": sum(shard_s.values()) / 3600,
            "global_steps_hours": (path_s - sum(shard_s.values())) / 3600,  # those on the critical path
            "hours": (path_s + other_s) / 3600,
        }

    here, pool = hours_on(cores), hours_on(CELERY_POOL_CORES)
    if clusters and EVERY_PAIR_VERIFIES in timed:
        worst = hours_on(CELERY_POOL_CORES, clustering_s(EVERY_PAIR_VERIFIES))
        pool = {**pool, f"hours_{EVERY_PAIR_VERIFIES}": worst["hours"]}
    return {
        "cores": cores,
        "files": REAL_CORPUS_FILES,
        "rows": REAL_CORPUS_ROWS,
        "run_seconds": run_seconds,
        "file_run_s": file_run_s,
        "global_steps_s": steps,
        "global_step_work_s": work,
        "global_steps_full_corpus_s": global_full_s,
        "verification_at_scale": verification,
        "other_s": other_s,
        "shard_passes_s": passes,
        "shard_pass_tok_s_per_core": figures["tokens"] / (sum(passes.values()) * cores) if passes else float("nan"),
        "this_machine": here,
        f"celery_{CELERY_POOL_CORES}_cores": pool,
        "target_hours": PROJECTION_TARGET_HOURS,
        "target_met": pool["hours"] <= PROJECTION_TARGET_HOURS,
    }


# --- the report ------------------------------------------------------------------------------------------------
def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB / 4 else f"{n / (1 << 20):.1f} MiB"


def verification_lines(v: dict) -> list[str]:
    verdict = "all equal" if v["mismatches"] == 0 else f"{v['mismatches']} DIFFER"
    lines = [
        f"verification: {v['documents_verified']:,} of {v['documents_written']:,} documents "
        f"({100 * v['fraction']:g}%, {v['tokens_compared']:,} tokens) read with megatron-core IndexedDataset vs "
        f"openai-harmony's render: {verdict} ({v['seconds']:.0f} s)"
    ]
    return lines + [f"  {m}" for m in v["first_mismatches"]]


def report_lines(result: dict) -> list[str]:
    raw, build, figures = result["raw"], result["build"], result.get("figures", {})
    lines = [
        f"machine: {result['machine']}; load average before / after: {result['load_before']} / {result['load_after']}",
        (
            f"raw: {result['plan']['rows']:,} rows in {result['plan']['shards']} shards ({raw['distinct_rows']:,} "
            f"distinct x {result['plan']['copies']} copies, {raw['planted_rows']:,} planted near-duplicates), "
            if "distinct_rows" in raw
            else f"raw: {result['plan']['rows']:,} rows in {result['plan']['shards']} files shaped as SYNTH's, "
        )
        + f"{_gib(raw['raw_bytes'])}, generated in {raw['seconds']:.0f} s"
        + (" (reused)" if raw["reused"] else ""),
        f"build: exit {build['returncode']}, {build['seconds']:.0f} s wall "
        f"(SYNTHKD_PARALLEL_RUNS={result['parallel_runs']})",
    ]
    for name, step in build["steps"].items():
        lines.append(f"  step {name}: {step.get('wall_s', float('nan')):.1f} s ({step.get('assets', '')})")
    run_seconds = result.get("projection", {}).get("run_seconds", {})
    for name, p in build["passes"].items():
        runs = run_seconds.get(name, [])
        detail = f", its runs {min(runs):.1f}-{max(runs):.1f} s (launch to end)" if runs else ""
        lines.append(f"  {name} pass: {p.get('wall_s', float('nan')):.1f} s{detail}")
    shard_walls = [p["wall_s"] for name, p in build["passes"].items() if name in SHARD_PASSES and "wall_s" in p]
    if shard_walls and build["seconds"] > 0:
        outside = build["seconds"] - sum(shard_walls)
        lines.append(
            f"  outside the shard passes ({', '.join(SHARD_PASSES)}): {outside:.1f} s, "
            f"{outside / build['seconds']:.1%} of the wall (issue #45, target 3: <= 5%)"
        )
    work = result.get("projection", {}).get("global_step_work_s", {})
    if work and build["seconds"] > 0:
        own = sum(work.values())
        lines.append(
            f"  the global steps' own seconds ({', '.join(GLOBAL_STEPS)}: their steps and checks, Dagster's step "
            f"events, run start-up not counted): {own:.1f} s, {own / build['seconds']:.1%} of the wall"
        )
    if figures:
        seconds = build["seconds"]
        lines += [
            f"rows in / out: {figures['rows_in']:,} / {figures['rows_out']:,}; sequences {figures['sequences']}",
            f"drops: {', '.join(f'{k}={v:,}' for k, v in figures['dropped'].items()) or 'none'}",
            f"tokens written (synth_kd_v1): {figures['tokens']:,} ({figures['tokens'] / figures['rows_out']:.0f}"
            f"/row): {figures['tokens'] / seconds / 1e6:.2f} M tok/s over the whole build, "
            f"{result['projection']['shard_pass_tok_s_per_core'] / 1e6:.2f} M tok/s per core in the shard passes",
        ]
        if result.get("clusters"):
            c = result["clusters"]
            lines.append("near-duplicates: " + ", ".join(f"{k}={v}" for k, v in c.items() if not isinstance(v, str)))
        lines.append("output bytes: " + ", ".join(f"{k} {_gib(v)}" for k, v in result["bytes"].items()))
    memory = build["memory"]
    lines.append(
        f"peak RSS (VmHWM, {memory['processes_seen']} processes seen, sampled every {memory['interval_s']} s): "
        f"max {_gib(memory['max_process_peak_bytes'])} ({(memory['max_process'] or '-')[:120]}); "
        f"whole tree at most {_gib(memory['peak_total_rss_bytes'])} at {memory['peak_total_at_s']:.0f} s"
    )
    for kind, k in sorted(memory["by_kind"].items(), key=lambda kv: -kv[1]["max_peak_bytes"])[:12]:
        lines.append(f"  {kind}: {k['processes']} processes, max {_gib(k['max_peak_bytes'])}")
    if result.get("step_times"):
        top = list(result["step_times"].items())[:8]
        lines.append(
            "step seconds, all shards (Dagster's events; the longest single run): "
            + ", ".join(f"{k} {v['seconds']:.0f} ({v['max_s']:.0f})" for k, v in top)
        )
    if "verification" in result:
        lines += verification_lines(result["verification"])
    if "projection" in result:
        lines += projection_lines(result["projection"])
    return lines


def verification_at_scale_lines(v: dict | None) -> list[str]:
    if not v:
        return []
    slices, seconds = v["low_byte_slices"], v["seconds"]
    return [
        f"  near-duplicate verification ({v['candidate_pairs']:,} pairs over {v['candidate_rows']:,} rows): "
        f"{slices['build']} slice(s) of low bytes here {seconds['build']:.2f} s; at the real corpus's "
        f"{slices['real_corpus']} ({slices['at_the_smaller_budget']} at the smaller budget) "
        f"{seconds['real_corpus']:.2f} s; if every candidate pair verified {seconds[EVERY_PAIR_VERIFIES]:.2f} s"
    ]


def projection_lines(p: dict) -> list[str]:
    """The projection as the report prints it: each file's run per shard pass, each global step at full scale,
    then the hours here and on the pool, against the target."""
    pool, here = p[f"celery_{CELERY_POOL_CORES}_cores"], p["this_machine"]
    verdict = "met" if p["target_met"] else "NOT met"
    return [
        f"projection for the real corpus ({p['files']} files, {p['rows']:,} rows):",
        "  one file's run per shard pass: " + ", ".join(f"{k} {v:.1f} s" for k, v in p["file_run_s"].items()),
        *verification_at_scale_lines(p.get("verification_at_scale")),
        "  global steps at full scale, one process: "
        + ", ".join(f"{k} {v / 60:.1f} min" for k, v in p["global_steps_full_corpus_s"].items()),
        f"  this machine ({p['cores']} cores): {here['hours']:.1f} h (shard passes {here['shard_passes_hours']:.1f} h, "
        f"global on the critical path {here['global_steps_hours']:.2f} h)",
        f"  a {CELERY_POOL_CORES}-core pool: {pool['hours']:.2f} h (shard passes {pool['shard_passes_hours']:.2f} h, "
        f"global on the critical path {pool['global_steps_hours']:.2f} h): target <= {p['target_hours']:g} h {verdict}",
        *(
            [f"  the same if every candidate pair verified (near-duplicates' worst case): {worst:.2f} h"]
            if (worst := pool.get(f"hours_{EVERY_PAIR_VERIFIES}")) is not None
            else []
        ),
    ]


def _memory_total() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages, as printed with each figure."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="raw rows in all (default 1000000)")
    parser.add_argument("--shards", type=int, default=10, help="raw shards (default 10)")
    parser.add_argument("--copies", type=int, default=10, help="each distinct generated row is written this often")
    parser.add_argument(
        "--near-dup-share", type=float, default=0.02, help="distinct rows whose copies are planted near-duplicates"
    )
    parser.add_argument("--verify-fraction", type=float, default=0.01, help="documents verified (default 0.01)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--work-dir", type=Path, help="default: a temporary directory, removed unless --keep")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (raw, data, DAGSTER_HOME)")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between memory samples")
    parser.add_argument("--quiet", action="store_true", help="do not echo the build's console lines")
    parser.add_argument(
        "--verify-only", action="store_true", help="only the verification, on the build kept in --work-dir"
    )
    parser.add_argument(
        "--real-files",
        type=int,
        default=0,
        metavar="N",
        help=f"instead of --rows/--shards/--copies: N files shaped as SYNTH publishes them ({REAL_FILE_ROWS:,} rows "
        "in one row group each, benchmarks/floor.py's input)",
    )
    args = parser.parse_args(argv)
    if args.rows < args.shards or args.shards < 1 or args.copies < 1 or not 0 < args.verify_fraction <= 1:
        parser.error("need --rows >= --shards >= 1, --copies >= 1, 0 < --verify-fraction <= 1")
    if args.verify_only and args.work_dir is None:
        parser.error("--verify-only needs the --work-dir of a kept run")

    from synthkd_assets.core.layout import DataLayout

    cores = len(os.sched_getaffinity(0))
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="synthkd-scale-"))
    work = work.resolve()
    raw_dir, data_dir, home = work / "raw", work / "data", work / "dagster_home"
    layout = DataLayout(raw_dir, data_dir)
    keys = sorted(p.stem for p in raw_dir.glob("*.parquet")) if raw_dir.is_dir() else []
    if args.verify_only:
        verification = verify_documents(layout, keys, args.verify_fraction, args.seed)
        print("\n".join(verification_lines(verification)))
        if args.json:
            args.json.write_text(json.dumps({"verification": verification}, indent=2) + "\n")
        return 1 if verification["mismatches"] else 0

    plan = RawPlan(args.rows, args.shards, args.copies, args.near_dup_share, args.seed)
    if args.real_files:
        plan = RawPlan(args.real_files * REAL_FILE_ROWS, args.real_files, 1, 0.0, REAL_FILE_SEED)
    result: dict = {
        "machine": f"{cores} cores, {os.uname().machine}, {_memory_total() / GIB:.0f} GiB",
        "load_before": load_average(),
        "plan": plan.__dict__,
        "work_dir": str(work),
    }
    status = 0
    try:
        print(f"generating {plan.rows:,} rows in {plan.shards} files under {raw_dir} ...", flush=True)
        if args.real_files:
            result["raw"] = make_real_files(args.real_files, raw_dir)
        else:
            result["raw"] = make_raw(plan, raw_dir, work / "scratch", cores)
        keys = sorted(p.stem for p in raw_dir.glob("*.parquet"))
        parallel = os.environ.get("SYNTHKD_PARALLEL_RUNS") or str(cores)
        env = fresh_build_environment(raw_dir, data_dir, home, {"SYNTHKD_PARALLEL_RUNS": parallel})
        result["parallel_runs"] = parallel
        print(f"building (log {work / 'build.log'}) ...", flush=True)
        result["build"] = run_build(env, work / "build.log", args.interval, echo=not args.quiet)
        result["load_after"] = load_average()
        if result["build"]["returncode"] != 0:
            status = max(BUILD_FAILED, result["build"]["returncode"])
            print("\n".join(result["build"]["tail"]), file=sys.stderr)
        else:
            result["figures"] = manifest_figures(layout)
            result["clusters"] = cluster_figures(layout)
            result["step_times"] = step_times(home)
            result["bytes"] = dataset_bytes(layout)
            runs, work = shard_run_seconds(home), global_step_work(home)
            print("timing the near-duplicate verification at the real corpus's slices ...", flush=True)
            sliced = verification_at_scale(layout, keys, result["figures"]["rows_in"])
            result["projection"] = projection(result["build"], result["figures"], cores, work, runs, sliced)
            print("verifying ...", flush=True)
            result["verification"] = verify_documents(layout, keys, args.verify_fraction, args.seed)
            status = 1 if result["verification"]["mismatches"] else 0
        print("\n".join(report_lines(result)))
        if args.json:
            args.json.write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
