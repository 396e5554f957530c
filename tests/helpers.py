"""Building the graph in tests: the project's own build order, on a real Dagster instance."""

from __future__ import annotations

from synthkd_assets.defs.build import (  # noqa: F401  (re-exported for the tests)
    all_definitions,
    build_all,
    materialize_steps,
)
from synthkd_assets.defs.passes import MANIFEST_STEPS, PLAN_STEPS, SCAN_STEPS, SHARD_STEPS  # noqa: F401
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_dev import REPO_ROOT, SAMPLE_RAW_DIR  # noqa: F401  (re-exported for the tests)

ALL_ASSETS = all_definitions()


def run(
    instance,
    layout: SynthKDLayout,
    selection: list[str],
    partition_key: str | None = None,
    raise_on_error: bool = True,
    build: SynthKDBuildConfig | None = None,
):
    """Materialize `selection` (and the checks of those assets) on `instance`."""
    result = materialize_steps(instance, layout, selection, partition_key, raise_on_error=raise_on_error, build=build)
    if raise_on_error:
        assert result.success
    return result


def build_everything(instance, layout: SynthKDLayout) -> None:
    """What scripts/build.sh does: scan pass per shard, the plan, build pass per shard, manifests."""
    build_all(instance, layout)


def check_outcomes(result) -> dict[str, bool]:
    return {evaluation.check_name: evaluation.passed for evaluation in result.get_asset_check_evaluations()}
