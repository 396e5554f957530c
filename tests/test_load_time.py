"""Nothing reads the environment at import: the executor, the nightly cron and the data roots are chosen when
the code location loads (`@dg.definitions`), from the environment of the process that loads it."""

import json
import os
import subprocess
import sys

import dagster as dg

from synthkd_assets.core.layout import DATA_DIR_ENV, DEFAULT_DATA_DIR, DEFAULT_RAW_DIR, RAW_DIR_ENV, SOURCES_DIR_ENV
from synthkd_assets.definitions import build_definitions
from synthkd_assets.defs.automation import REBUILD_CRON_ENV
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_contract.settings import DEFAULT_REBUILD_CRON
from tests.helpers import REPO_ROOT

# every module of the package imported under an environ that records which variables the package's own code
# reads (a library copying the whole environment is not a read of ours)
SPY = """
import importlib, json, os, pkgutil, sys
read = []
class Spy(type(os.environ)):
    def __getitem__(self, key):
        frame = sys._getframe(1)
        while frame and os.path.basename(frame.f_code.co_filename) in ("os.py", "<frozen os>", "_collections_abc.py"):
            frame = frame.f_back
        if frame and "synthkd_assets" in frame.f_code.co_filename:
            read.append(key)
        return super().__getitem__(key)
os.environ = Spy(os.environ._data, os.environ.encodekey, os.environ.decodekey, os.environ.encodevalue,
                 os.environ.decodevalue)
import synthkd_assets
for module in pkgutil.walk_packages(synthkd_assets.__path__, "synthkd_assets."):
    importlib.import_module(module.name)
print(json.dumps(sorted(set(read))))
"""


def test_importing_the_package_reads_no_project_variable():
    env = {**os.environ, "SYNTHKD_EXECUTOR": "no-such-engine", REBUILD_CRON_ENV: "not a cron", RAW_DIR_ENV: "/nowhere"}
    done = subprocess.run(
        [sys.executable, "-c", SPY], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert [key for key in read if key.startswith("SYNTHKD_") or key.startswith("O200K_")] == []


def test_the_nightly_cron_comes_from_the_environment_the_location_loads_in():
    assert build_definitions({}).resolve_schedule_def("synth_nightly_rebuild").cron_schedule == DEFAULT_REBUILD_CRON
    loaded = build_definitions({REBUILD_CRON_ENV: "*/5 * * * *"})
    assert loaded.resolve_schedule_def("synth_nightly_rebuild").cron_schedule == "*/5 * * * *"


def test_the_roots_are_env_vars_when_set_and_the_bundled_sample_otherwise(monkeypatch):
    """No variable set: data/ and the bundled sample. Set: a dg.EnvVar, resolved by the process that runs a
    step (what a run's config snapshot records is the variable's name, not the value seen at load)."""
    layout = build_definitions({}).resources["layout"]
    assert (layout.raw_dir, layout.data_dir) == (DEFAULT_RAW_DIR, DEFAULT_DATA_DIR)

    environ = {RAW_DIR_ENV: "/loaded/raw", DATA_DIR_ENV: "/loaded/data"}
    layout = build_definitions(environ).resources["layout"]
    assert isinstance(layout.raw_dir, dg.EnvVar) and layout.raw_dir.env_var_name == RAW_DIR_ENV
    assert isinstance(layout.data_dir, dg.EnvVar) and layout.data_dir.env_var_name == DATA_DIR_ENV
    monkeypatch.setenv(RAW_DIR_ENV, "/run/raw")
    monkeypatch.setenv(DATA_DIR_ENV, "/run/data")

    seen = {}

    @dg.asset
    def roots(layout: SynthKDLayout) -> None:
        paths = layout.data_layout()
        seen.update(raw=str(paths.raw_root), data=str(paths.data_root))

    assert dg.materialize([roots], resources={"layout": layout}).success
    assert seen == {"raw": "/run/raw", "data": "/run/data"}


def test_run_config_that_sets_one_root_keeps_the_others_from_the_environment(monkeypatch):
    """Dagster's run config for a resource replaces every field of it: `--config-json '{"resources": {"layout":
    {"config": {"raw_dir": ...}}}}'` must not send the outputs back to data/ when $SYNTHKD_DATA_DIR is set
    (nor drop $SYNTHKD_SOURCES_DIR); an empty sources_dir asks for SYNTH only."""
    monkeypatch.setenv(RAW_DIR_ENV, "/run/raw")
    monkeypatch.setenv(DATA_DIR_ENV, "/run/data")
    monkeypatch.setenv(SOURCES_DIR_ENV, "/run/sources")
    layout = build_definitions(dict(os.environ)).resources["layout"]
    seen = {}

    @dg.asset
    def roots(layout: SynthKDLayout) -> None:
        paths = layout.data_layout()
        seen.update(raw=str(paths.raw_root), data=str(paths.data_root), sources=str(paths.sources_root))

    def launched(config: dict) -> dict:
        run_config = {"resources": {"layout": {"config": config}}}
        assert dg.materialize([roots], resources={"layout": layout}, run_config=run_config).success
        return dict(seen)

    assert launched({"raw_dir": "/given/raw"}) == {"raw": "/given/raw", "data": "/run/data", "sources": "/run/sources"}
    assert launched({"data_dir": "/given/data", "sources_dir": ""}) == {
        "raw": "/run/raw",
        "data": "/given/data",
        "sources": "None",
    }
    monkeypatch.delenv(DATA_DIR_ENV)
    assert launched({"raw_dir": "/given/raw"})["data"] == DEFAULT_DATA_DIR
