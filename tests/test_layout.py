"""Where every file of a build lives, spelled out once: every other test, the assets, the sensor, the CLI and
the build script ask `DataLayout`; a change of layout changes this test on purpose."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from synthkd_assets.core.layout import DataLayout
from tests.helpers import REPO_ROOT

RAW, DATA = Path("/in/raw"), Path("/out/data")


def test_full_build_layout():
    paths = DataLayout(RAW, DATA)
    assert paths.raw_shard("synth_07") == RAW / "synth_07.parquet"
    assert paths.input_manifest() == RAW / "input_manifest.json"
    assert paths.raw_hash_cache() == DATA / "synth_raw/hash_cache.json"
    assert paths.build_lock() == DATA / ".build.lock"
    assert paths.tokenizer_file() == DATA / "tokenizer/o200k_base.tiktoken"
    assert paths.build_root() == DATA
    assert paths.stage_output("synth_filtered", "synth_07") == DATA / "synth_filtered/synth_07.parquet"
    assert paths.stage_report("synth_filtered", "synth_07") == DATA / "synth_filtered/synth_07.report.json"
    assert paths.harmony_manifest() == DATA / "synth_harmony/manifest.json"
    assert paths.sampling_plan() == DATA / "synth_sampling_plan/plan.json"
    assert paths.error_log("synth_harmony", "synth_07") == DATA / "errors/synth_harmony/synth_07.jsonl"
    assert paths.megatron_manifest() == DATA / "megatron/synth_kd_v1/manifest.json"
    assert paths.shard_record(7) == DATA / "megatron/synth_kd_v1/shards/shard_07.json"
    assert paths.documents_table(7) == DATA / "megatron/synth_kd_v1/shards/shard_07_documents.parquet"
    assert paths.distill_manifest() == DATA / "distill/synth_distill/manifest.json"
    assert paths.distill_record("synth_07") == DATA / "synth_distill/synth_07.json"
    assert paths.error_log(paths.distill_name(), "synth_07") == DATA / "errors/synth_distill/synth_07.jsonl"
    assert paths.encoding_errors_log_path() == DATA / "errors/synth_distill_encoding_errors.jsonl"
    assert paths.pool_part(7) == DATA / "pool/synth_pool_v1/parts/part-00007.parquet"
    assert paths.valuation_part(7) == DATA / "pool/synth_pool_v1_valuation/part-00007.parquet"


def test_smoke_build_layout_keeps_its_intermediates_apart():
    paths = DataLayout(RAW, DATA, smoke=True)
    assert paths.build_root() == DATA / "smoke"
    assert paths.stage_report("synth_harmony", "synth_07") == DATA / "smoke/synth_harmony/synth_07.report.json"
    assert paths.sampling_plan() == DATA / "smoke/synth_sampling_plan/plan.json"
    assert paths.megatron_manifest() == DATA / "megatron/synth_kd_v1_smoke/manifest.json"
    assert paths.distill_manifest() == DATA / "distill/synth_distill_smoke/manifest.json"
    assert paths.distill_record("synth_07") == DATA / "smoke/synth_distill_smoke/synth_07.json"
    assert paths.valuation_part(7) == DATA / "pool/synth_pool_v1_smoke_valuation/part-00007.parquet"
    # shared by full and smoke builds of one data root
    assert paths.tokenizer_file() == DataLayout(RAW, DATA).tokenizer_file()
    assert paths.raw_hash_cache() == DataLayout(RAW, DATA).raw_hash_cache()
    assert paths.build_lock() == DataLayout(RAW, DATA).build_lock()


def test_distill_overrides_and_recorded_paths():
    paths = DataLayout(RAW, DATA, distill_dir=Path("/ship/distill"), encoding_errors_log=Path("/ship/enc.jsonl"))
    assert paths.distill_manifest() == Path("/ship/distill/manifest.json")
    assert paths.encoding_errors_log_path() == Path("/ship/enc.jsonl")
    assert paths.distill_record("synth_07") == DATA / "synth_distill/synth_07.json"  # records stay in the data root
    assert paths.recorded(paths.harmony_manifest()) == "synth_harmony/manifest.json"
    assert paths.recorded(paths.distill_root()) == "/ship/distill"  # outside the data root: absolute
    assert paths.resolve_recorded("synth_harmony/manifest.json") == paths.harmony_manifest()
    assert paths.resolve_recorded("/ship/distill") == paths.distill_root()
    # cleanup looks in both builds and every DistillKit root a shard's parts can be in
    assert set(paths.all_distill_roots()) == {
        Path("/ship/distill"),
        DATA / "distill/synth_distill",
        DATA / "distill/synth_distill_smoke",
    }
    assert paths.all_errors_dirs() == (DATA / "errors", DATA / "smoke/errors")
    assert paths.all_valuation_roots() == (
        DATA / "pool/synth_pool_v1_valuation",
        DATA / "pool/synth_pool_v1_smoke_valuation",
    )


def test_the_environment_roots_and_their_defaults():
    assert DataLayout.from_environ({}) == DataLayout(Path("data/sample/synth_raw"), Path("data"))
    environ = {"SYNTHKD_RAW_DIR": "/r", "SYNTHKD_DATA_DIR": "/d"}
    assert DataLayout.from_environ(environ, smoke=True) == DataLayout(Path("/r"), Path("/d"), smoke=True)


def test_the_build_script_asks_the_cli_for_its_paths(tmp_path):
    """`python -m synthkd_assets.cli path <name>`: what scripts/build.sh uses instead of spelling paths."""
    env = {**os.environ, "SYNTHKD_RAW_DIR": str(tmp_path / "raw"), "SYNTHKD_DATA_DIR": str(tmp_path / "data")}

    def path(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "synthkd_assets.cli", "path", *args],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    paths = DataLayout(tmp_path / "raw", tmp_path / "data", smoke=True)
    assert path("build-lock") == str(paths.build_lock())
    assert path("raw-root") == str(paths.raw_root)
    assert path("megatron-manifest", "--smoke") == str(paths.megatron_manifest())
    assert path("distill-manifest", "--smoke") == str(paths.distill_manifest())
