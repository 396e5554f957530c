"""Building the graph in tests: the project's own build order, on a real Dagster instance."""

from __future__ import annotations

from pathlib import Path

from synthkd_assets.defs.build import (  # noqa: F401  (re-exported for the tests)
    all_definitions,
    build_all,
    materialize_steps,
)
from synthkd_assets.defs.passes import MANIFEST_STEPS, PLAN_STEPS, SCAN_STEPS, SHARD_STEPS  # noqa: F401
from synthkd_assets.defs.resources import SynthKDPaths

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RAW_DIR = REPO_ROOT / "data" / "sample" / "synth_raw"
ALL_ASSETS = all_definitions()


def run(instance, paths: SynthKDPaths, selection: list[str], partition_key: str | None = None, raise_on_error: bool = True):
    """Materialize `selection` (and the checks of those assets) on `instance`."""
    result = materialize_steps(instance, paths, selection, partition_key, raise_on_error=raise_on_error)
    if raise_on_error:
        assert result.success
    return result


def build_everything(instance, paths: SynthKDPaths) -> None:
    """What scripts/build.sh does: scan pass per shard, the plan, build pass per shard, manifests."""
    build_all(instance, paths)


def check_outcomes(result) -> dict[str, bool]:
    return {evaluation.check_name: evaluation.passed for evaluation in result.get_asset_check_evaluations()}
