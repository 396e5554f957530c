"""Imports point one way (contract -> core -> defs -> definitions): every module imports on its own, before any
other synthkd module (in a process forked from a server that has imported only third-party packages), and no
import of a synthkd module is tucked inside a function (or any other block), where it would hide a cycle that a
module-level import would show."""

from __future__ import annotations

import ast
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from synthkd_dev import REPO_ROOT
from tests.fresh_import import import_first

PACKAGES = [name for name in ("synthkd_contract", "synthkd_assets", "synthkd_training") if (REPO_ROOT / name).is_dir()]


def module_files() -> dict[str, Path]:
    """module name -> file, for every module of the shipped packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = module_files()


# the deliberate exceptions, each with its reason: `file: statement` -> why it is deferred
DEFERRED_IMPORTS = {
    "synthkd_assets/defs/valuation.py: from synthkd_training.valuation import checkpoint_window_features": (
        "torch and megatron-core load only when the valuation resource names a checkpoint"
    ),
}


def nested_synthkd_imports(path: Path) -> list[str]:
    """`line: statement` of each import of a synthkd module that is not a statement of the module body."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["synthkd_relative" if node.level else node.module or ""]
        else:
            continue
        deferred = f"{path.relative_to(REPO_ROOT)}: {ast.unparse(node)}" in DEFERRED_IMPORTS
        if id(node) not in top_level and any(name.startswith("synthkd") for name in names) and not deferred:
            found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {ast.unparse(node)}")
    return found


def imported_modules(path: Path) -> set[str]:
    """The synthkd modules a module's own statements import (`from pkg import mod` names the module mod)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {f"{node.module}.{alias.name}" for alias in node.names if f"{node.module}.{alias.name}" in MODULES}
            found.add(node.module)
    return {name for name in found if name in MODULES}


def import_cycles() -> list[list[str]]:
    """Every cycle of the module graph, found by depth-first search (each reported from where it closed)."""
    graph = {module: imported_modules(path) - {module} for module, path in MODULES.items()}
    cycles, state = [], {}

    def visit(module: str, stack: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                cycles.append(stack[stack.index(target) :] + [target])
            elif target not in state:
                visit(target, [*stack, target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return cycles


def test_every_package_module_is_found():
    assert {"synthkd_assets.definitions", "synthkd_assets.core.steps", "synthkd_training.dataset"} <= set(MODULES)


def test_no_synthkd_import_is_nested_in_a_function_or_block():
    assert [line for path in MODULES.values() for line in nested_synthkd_imports(path)] == []


def test_the_module_graph_has_no_cycle():
    assert import_cycles() == []


# the third-party packages the fork server imports once, before it forks the child that imports one synthkd module
# (each child then takes a fraction of a second, not the ~1.5 s of a new interpreter importing them again); no
# synthkd module is loaded in the server, so each child imports its module first, as a new interpreter would
PRELOADED = ["numpy", "pyarrow", "polars", "dagster", "torch", "megatron.core"]


@pytest.fixture(scope="module")
def fork_server() -> multiprocessing.context.ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOADED)
    return context


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_first_in_a_fresh_interpreter(module, fork_server):
    with fork_server.Pool(1, maxtasksperchild=1) as pool:
        failure = pool.apply(import_first, (module,))
    assert failure is None, failure[-3000:]


# torch and megatron-core are the training side's (synthkd_training): a build worker imports neither (~0.2 GiB
# and seconds per process); it writes and checks the Megatron trios with synthkd_contract.indexed_dataset
HEAVY_MODULES = ("torch", "megatron")
LOADED_HEAVY = f"[m for m in sys.modules if m.split('.')[0] in {HEAVY_MODULES!r}]"


def test_the_code_location_imports_no_torch():
    code = f"import sys, synthkd_assets.definitions; print({LOADED_HEAVY})"
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == "[]"


BUILD_ONE_SHARD = """
import sys
import dagster as dg
from synthkd_assets.defs.build import build_all
from synthkd_assets.defs.resources import SynthKDLayout

with dg.DagsterInstance.ephemeral() as instance:
    build_all(instance, SynthKDLayout(raw_dir=sys.argv[1], data_dir=sys.argv[2]), outputs=["synth_kd_v1", "synth_pool"])
print({loaded})
"""


def test_building_synth_kd_v1_and_the_pool_imports_no_torch(tmp_path):
    """One shard through every pass: synth_kd_v1 and its checks (trio_alignment, shards_readable_by_megatron),
    the pool's cell trios and the curriculum that reads their indices."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "synth_005.parquet").write_bytes((REPO_ROOT / "data/sample/synth_raw/synth_005.parquet").read_bytes())
    code = BUILD_ONE_SHARD.format(loaded=LOADED_HEAVY)
    result = subprocess.run(
        [sys.executable, "-c", code, str(raw), str(tmp_path / "data")], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert list((tmp_path / "data/megatron/synth_kd_v1/train").glob("shard_05_tokens.idx"))
    assert list((tmp_path / "data/pool").rglob("*.args"))


@pytest.mark.parametrize(
    ("environment", "pool"), [({}, "jemalloc"), ({"ARROW_DEFAULT_MEMORY_POOL": "system"}, "system")]
)
def test_importing_synthkd_assets_hands_arrow_memory_back_at_once(environment, pool):
    """Arrow allocates from jemalloc with no decay delay (core/memory.py), unless the environment names a pool."""
    code = "import synthkd_assets, pyarrow; print(pyarrow.default_memory_pool().backend_name)"
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"} | environment
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == pool


FREED_HEAP = """
import numpy as np
from synthkd_assets.core.memory import return_freed_heap
def rss(): return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")) >> 10
big = np.ones(20 << 20, np.uint8); del big  # an mmapped 20 MiB freed: glibc's mmap threshold rises past 8 MiB
arrays = [np.ones(8 << 20, np.uint8) for _ in range(10)]  # so these are carved from the heap
pinned = np.ones(1 << 16, np.uint8)  # a live block above them: the heap's top cannot shrink past it
del arrays
before = rss(); trimmed = return_freed_heap(); after = rss()
print(trimmed, before - after)
"""


def test_freed_numpy_temporaries_go_back_to_the_os():
    """80 MiB of freed heap-carved arrays stay resident until `return_freed_heap` (after the round trip)."""
    result = subprocess.run([sys.executable, "-c", FREED_HEAP], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    trimmed, released_mib = result.stdout.split()
    assert trimmed == "True" and int(released_mib) >= 70
