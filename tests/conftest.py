"""Shared fixtures: the real pinned tokenizer, the real openai-harmony encoding, the bundled sample."""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import settings

from synthkd_assets.core.render import HarmonyRenderer
from synthkd_assets.core.tokenizer import load_harmony_encoding, materialize_tokenizer
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDLayout
from synthkd_dev import SAMPLE_RAW_DIR
from synthkd_training.models import cpu_tensors_on_huge_pages
from tests.helpers import build_everything

cpu_tensors_on_huge_pages()  # before this worker's first tensor: the training tests' long windows on the CPU

# CI runs every property briefly; HYPOTHESIS_PROFILE=fuzz runs them for real (docs/development.md, "Fuzzing").
# No deadline: a per-example time limit is a timed test, and one failed a 2-core CI run under load (265 ms)
settings.register_profile("ci", max_examples=60, deadline=None)
settings.register_profile("fuzz", max_examples=5000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# The test files that take minutes (build.sh and its services, the daemon, the cluster, online KD), longest first.
# pytest-xdist hands each worker whole files (`--dist loadfile`, `--no-loadscope-reorder`: scripts/test.sh) in
# this order; a long file handed out last would keep one core busy long after the others had finished.
LONG_FILES_FIRST = (
    "tests/test_build_script.py",
    "tests/test_automation_daemon.py",
    "tests/test_harmony_artifact.py",
    "tests/training/test_online_kd.py",
    "tests/test_cli_and_webserver.py",
    "tests/test_cluster.py",
    "tests/test_scale_run.py",
    "tests/test_smoke_daemon.py",
    "tests/test_crash_safety.py",
    "tests/test_sensor.py",
    "tests/test_raw_inventory.py",
    "tests/test_source_graph.py",
    "tests/test_stream.py",
    "tests/test_floor_benchmark.py",
    "tests/test_anchor_long_line_graph.py",
    "tests/test_output_bytes.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files of LONG_FILES_FIRST first, in its order; every other file after them as collected (a stable
    sort: each file's tests keep their order)."""
    rank = {name: position for position, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(config.rootpath).as_posix(), len(rank)))


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tokenizer")
    materialize_tokenizer(directory)
    return directory


@pytest.fixture(scope="session")
def encoding(tokenizer_dir: Path):
    return load_harmony_encoding(tokenizer_dir)


@pytest.fixture(scope="session")
def renderer(encoding) -> HarmonyRenderer:
    return HarmonyRenderer(encoding)


@pytest.fixture(scope="session")
def sample_shards() -> list[Path]:
    return sorted(SAMPLE_RAW_DIR.glob("*.parquet"))


@pytest.fixture(scope="session")
def built_sample(tmp_path_factory):
    """The full graph built once on the bundled sample: (instance, layout, data_dir)."""

    data_dir = tmp_path_factory.mktemp("built")
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(data_dir))
    with dg.DagsterInstance.ephemeral() as instance:
        build_everything(instance, layout)
        yield instance, layout, data_dir


@pytest.fixture
def own_instance(built_sample):
    """A test's own ephemeral instance (with the sample's shard partitions), for materializing on a copy of
    `built_sample`: runs in the shared instance would become the latest materializations other tests read
    there, whatever order the tests run in."""
    shared = built_sample[0]
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(SYNTH_SHARDS.name, shared.get_dynamic_partitions(SYNTH_SHARDS.name))
        yield instance


@pytest.fixture
def gloo_world():
    """A single-process gloo world (in-memory store) for code that asks torch.distributed for the
    rank; torn down afterwards unless something else had set one up."""
    import torch.distributed as dist  # only the tests that ask for it load torch here

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()
