"""benchmarks/scale_run.py, the million-row proof, stays runnable and its 1% verification really compares: a
300-row run end to end through scripts/build.sh (marker `scale`: ~1.5 min on 2 cores),
its JSON figures, then one flipped byte of the trio found by `--verify-only`. The generated raw rows (distinct
prompts for the copies, planted near-duplicates) are checked in process, without a build."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from synthkd_dev.make_sample_data import signature_shingles
from tests.helpers import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "scale_run.py"
sys.path.insert(0, str(SCRIPT.parent))

import scale_run  # noqa: E402


def jaccard(a: dict, b: dict) -> float:
    x, y = (signature_shingles(r["query"], r["synthetic_answer"]) for r in (a, b))
    return len(x & y) / len(x | y)


def test_copies_are_distinct_prompts_and_planted_ones_are_near_duplicates(tmp_path):
    plan = scale_run.RawPlan(rows=240, shards=3, copies=6, near_dup_share=0.25, seed=7)
    result = scale_run.make_raw(plan, tmp_path / "raw", tmp_path / "scratch", workers=2)
    files = sorted((tmp_path / "raw").glob("*.parquet"))
    assert [f.name for f in files] == ["synth_001.parquet", "synth_002.parquet", "synth_003.parquet"]
    rows = pa.concat_tables(pq.read_table(f) for f in files).to_pylist()
    assert len(rows) == 240 and len({r["synth_id"] for r in rows}) == 240
    by_id = {r["synth_id"]: r for r in rows}
    planted = 0
    # the generator's synth_ids end in the row's index (`memorization_94_6343`): copy c of base row b is `<id>_c<c>`
    stems = {int(i.removesuffix("_c0").rsplit("_", 1)[1]): i.removesuffix("_c0") for i in by_id if i.endswith("_c0")}
    for base in range(plan.distinct):
        original = by_id[f"{stems[base]}_c0"]
        for copy in range(1, plan.copies):
            row = by_id[f"{stems[base]}_c{copy}"]
            assert row["query_seed_text"] == original["query_seed_text"]
            if copy <= plan.planted_copies(base):  # the same prompt after NFKC + casefold
                planted += 1
                assert jaccard(row, original) == 1.0
            else:
                assert jaccard(row, original) < 0.6
    assert planted == result["planted_rows"] > 0
    again = scale_run.make_raw(plan, tmp_path / "raw", tmp_path / "scratch", workers=2)
    assert again["reused"] and again["planted_rows"] == planted


@pytest.fixture(scope="module")
def kept_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale_run")
    command = [sys.executable, str(SCRIPT), "--rows", "300", "--shards", "2", "--work-dir", str(root / "work")]
    command += ["--keep", "--quiet", "--json", str(root / "figures.json")]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root / "work", json.loads((root / "figures.json").read_text()), done.stdout


@pytest.mark.scale
def test_the_proof_runs_end_to_end_and_reports_every_figure(kept_run):
    _, figures, stdout = kept_run
    assert figures["build"]["returncode"] == 0
    assert {"inventory", "plan", "manifest"} <= set(figures["build"]["steps"])
    # each global pass's wall, read from the build's instance (its run, submitted to ended)
    assert all(figures["build"]["steps"][name]["wall_s"] > 0 for name in scale_run.GLOBAL_STEPS)
    assert {"scan", "build", "pool"} <= set(figures["build"]["passes"])
    assert {"synth_harmony", "synth_tokenized", "synth_kd_v1", "synth_pool"} <= set(figures["step_times"])
    counts = figures["figures"]
    assert counts["rows_in"] == 300 and 0 < counts["rows_out"] <= 300 and counts["shards"] == 2
    assert counts["tokens"] > 500 * counts["rows_out"]  # SYNTH-length conversations (~1k tokens each)
    assert set(figures["bytes"]) == {"megatron", "distill", "pool", "validation", "intermediates"}
    assert all(size > 0 for size in figures["bytes"].values())
    memory = figures["build"]["memory"]
    assert memory["samples"] > 10 and memory["max_process_peak_bytes"] > 100 << 20
    assert any(p["kind"].startswith("step process") for p in memory["processes"])
    verification = figures["verification"]
    assert verification["documents_written"] == counts["rows_out"]
    assert verification["documents_verified"] == -(-counts["rows_out"] // 100)  # ceil(1%)
    assert verification["mismatches"] == 0 and verification["tokens_compared"] > 0
    projection = figures["projection"]
    assert projection["this_machine"]["hours"] > projection["celery_64_cores"]["hours"] > 0
    assert {"scan", "build", "pool"} == set(projection["file_run_s"])
    assert {"inventory", "plan", "manifest", "synth_clusters"} <= set(projection["global_step_work_s"])
    sliced = projection["verification_at_scale"]  # the budget shrunk so as to read as many slices as 500 files
    assert sliced["low_byte_slices"]["at_the_smaller_budget"] == sliced["low_byte_slices"]["real_corpus"] >= 1
    assert sliced["candidate_pairs"] == figures["clusters"]["candidate_pairs"]
    assert sliced["verified_pairs"] == figures["clusters"]["verified_pairs"]
    assert projection["celery_64_cores"]["hours_every_pair_verifies"] > 0  # timings: not ordered at 300 rows
    assert "if every candidate pair verified" in stdout
    for line in ("rows in / out: 300 /", "tokens written (synth_kd_v1):", "peak RSS (VmHWM", "verification:"):
        assert line in stdout, line


@pytest.mark.scale
@pytest.mark.parametrize("kind", ["tokens", "lossmask"])
def test_a_flipped_trio_byte_fails_the_verification(kept_run, tmp_path, kind):
    work, _, _ = kept_run
    copy = tmp_path / "work"
    shutil.copytree(work, copy, symlinks=True)
    command = [sys.executable, str(SCRIPT), "--verify-only", "--work-dir", str(copy), "--verify-fraction", "1"]
    clean = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    data = copy / "data" / "megatron" / "synth_kd_v1" / "train" / f"shard_02_{kind}.bin"
    raw = bytearray(data.read_bytes())
    position = len(raw) // 2 if kind == "lossmask" else (len(raw) // 8) * 4  # a whole int32 token, mid-file
    raw[position] ^= 0x01
    data.write_bytes(bytes(raw))
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 DIFFER" in done.stdout and f"{kind} differs at 1 positions" in done.stdout


def test_the_projection_waves_the_shard_runs_and_scales_only_the_global_work():
    """Against the arithmetic done by hand: 2 real-sized files, each pass's runs averaged; the global passes'
    start-up kept, their work scaled by rows, the clustering by rows x log(rows)."""
    rows = 2 * scale_run.REAL_CORPUS_ROWS // scale_run.REAL_CORPUS_FILES  # two files of the corpus's mean size
    build = {
        "seconds": 200.0,
        "passes": {"scan": {"wall_s": 40.0}, "build": {"wall_s": 50.0}},
        "steps": {"inventory": {"wall_s": 10.0}, "plan": {"wall_s": 30.0}},
    }
    figures = {"rows_in": rows, "shards": 2, "tokens": 10**6}
    work = {"inventory": 4.0, "plan": 5.0, "synth_clusters": 20.0}
    p = scale_run.projection(build, figures, 2, work, {"scan": [30.0, 40.0], "build": [50.0, 50.0]})
    factor = scale_run.REAL_CORPUS_ROWS / rows  # 250
    assert p["file_run_s"] == pytest.approx({"scan": 35.0, "build": 50.0}, rel=1e-5)  # rows: whole numbers
    clusters = 20.0 * factor * math.log(scale_run.REAL_CORPUS_ROWS) / math.log(rows)
    assert p["global_steps_full_corpus_s"] == pytest.approx(
        {"inventory": 6 + 4 * factor, "plan": 5 + 5 * factor, "synth_clusters": clusters}
    )
    other = 200 - 40 - 50 - 10 - 30
    global_s = 6 + 4 * factor + 5 + 5 * factor + clusters
    assert p["this_machine"]["hours"] == pytest.approx((250 * 85 + global_s + other) / 3600)
    assert p["celery_64_cores"]["hours"] == pytest.approx((8 * 85 + global_s + other) / 3600)  # ceil(500 / 64) waves
    assert p["target_met"] == (p["celery_64_cores"]["hours"] <= 1.0)


def test_the_projection_counts_the_verification_slices_of_the_real_corpus():
    """The clustering's verification at the real corpus's slices: the extra seconds measured at the smaller budget
    are added to the clustering's before it is scaled (rows x log(rows)); near-duplicates' worst case likewise, on
    a line of its own."""
    rows = 2 * scale_run.REAL_CORPUS_ROWS // scale_run.REAL_CORPUS_FILES
    build = {"seconds": 100.0, "passes": {"scan": {"wall_s": 40.0}}, "steps": {"plan": {"wall_s": 30.0}}}
    figures = {"rows_in": rows, "shards": 2, "tokens": 10**6}
    work = {"plan": 25.0, "synth_clusters": 20.0}
    sliced = {"seconds": {"build": 2.0, "real_corpus": 5.0, scale_run.EVERY_PAIR_VERIFIES: 9.0}}
    plain = scale_run.projection(build, figures, 2, work, {"scan": [40.0]})
    p = scale_run.projection(build, figures, 2, work, {"scan": [40.0]}, sliced)
    scale = scale_run.REAL_CORPUS_ROWS / rows * math.log(scale_run.REAL_CORPUS_ROWS) / math.log(rows)
    assert plain["global_steps_full_corpus_s"]["synth_clusters"] == pytest.approx(20.0 * scale)
    assert p["global_steps_full_corpus_s"]["synth_clusters"] == pytest.approx(23.0 * scale)
    pool, plain_pool = p["celery_64_cores"], plain["celery_64_cores"]
    assert pool["hours"] - plain_pool["hours"] == pytest.approx(3.0 * scale / 3600)
    assert pool["hours_every_pair_verifies"] - plain_pool["hours"] == pytest.approx(7.0 * scale / 3600)
    assert "hours_every_pair_verifies" not in plain_pool and p["verification_at_scale"] is sliced


def test_the_projection_takes_the_critical_path_of_passes_that_run_at_once():
    """The manifests run beside the quota plan and the pool pass (`Pass.after`): the build takes its longest
    chain of passes, each global pass projected as above; here the manifests are the longer branch on 64 cores
    and the quota plan and pool pass the longer one in this build. By hand: `after` as defs/passes.py says it."""
    rows = 2 * scale_run.REAL_CORPUS_ROWS // scale_run.REAL_CORPUS_FILES
    walls = {"inventory": 10.0, "plan": 30.0, "manifest": 12.0, "quota": 6.0, "pool_manifest": 4.0}
    build = {
        "seconds": 300.0,
        "passes": {"scan": {"wall_s": 40.0}, "build": {"wall_s": 50.0}, "pool": {"wall_s": 20.0}},
        "steps": {name: {"wall_s": wall} for name, wall in walls.items()},
    }
    figures = {"rows_in": rows, "shards": 2, "tokens": 10**6}
    work = {name: wall / 2 for name, wall in walls.items()}  # half of each global pass grows with the rows
    runs = {"scan": [40.0], "build": [50.0], "pool": [10.0]}
    p = scale_run.projection(build, figures, 2, work, runs)
    factor = scale_run.REAL_CORPUS_ROWS / rows
    full = {name: wall / 2 + wall / 2 * factor for name, wall in walls.items()}
    assert p["global_steps_full_corpus_s"] == pytest.approx(full)
    # this build: manifest (12) beside quota + pool (6 + 20): the chain through the pool is the longer one
    other = 300 - (10 + 40 + 30 + 50 + max(12, 6 + 20) + 4)
    assert p["other_s"] == pytest.approx(other)
    run = p["file_run_s"]  # one real-sized file's run: the two files are of the corpus's mean size, to rounding
    assert run == pytest.approx({"scan": 40.0, "build": 50.0, "pool": 10.0}, rel=1e-5)
    for cores, key in ((2, "this_machine"), (64, "celery_64_cores")):
        waves = math.ceil(scale_run.REAL_CORPUS_FILES / cores)
        shards = waves * (run["scan"] + run["build"] + run["pool"])
        branch = max(full["manifest"], full["quota"] + waves * run["pool"])
        path = full["inventory"] + full["plan"] + branch + full["pool_manifest"] + waves * (run["scan"] + run["build"])
        assert p[key]["hours"] == pytest.approx((path + other) / 3600)
        assert p[key]["shard_passes_hours"] == pytest.approx(shards / 3600)
