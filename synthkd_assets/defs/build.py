"""The whole graph built in process, pass by pass (defs/passes.py): used by the tests, the DistillKit CLI
and the benchmark. scripts/build.sh runs the same passes through the dagster CLI."""

from collections.abc import Callable, Iterable, Sequence

import dagster as dg

from synthkd_assets.core.buildlock import build_lock
from synthkd_assets.defs.code_versions import with_code_versions
from synthkd_assets.defs.failures import error_message, failed_check_lines
from synthkd_assets.defs.graph import ASSET_CHECKS, ASSETS
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.passes import (
    BUILD_STEPS,
    INVENTORY_STEPS,
    MANIFEST_STEPS,
    OUTPUTS,
    PLAN_STEPS,
    POOL_MANIFEST_STEPS,
    POOL_STEPS,
    QUOTA_STEPS,
    SCAN_STEPS,
)
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout, synthkd_resources


class BuildFailed(RuntimeError):
    """A step or a blocking check failed; the message names the steps, the partition and the reasons."""


def all_definitions() -> list:
    """The code location's assets (with their code versions) and checks."""
    return [*with_code_versions(ASSETS), *ASSET_CHECKS]


def materialize_steps(
    instance: dg.DagsterInstance,
    layout: SynthKDLayout,
    selection: Sequence[str],
    partition_key: str | None = None,
    raise_on_error: bool = True,
    build: SynthKDBuildConfig | None = None,
    **kwargs,
) -> dg.ExecuteInProcessResult:
    """Materialize `selection` and run the checks of those assets, in process (`build`: the default config
    when None)."""
    result = dg.materialize(
        all_definitions(),
        selection=dg.AssetSelection.assets(*selection) | dg.AssetSelection.checks_for_assets(*selection),
        partition_key=partition_key,
        instance=instance,
        resources=synthkd_resources(layout, build),
        raise_on_error=False,
        **kwargs,
    )
    failed_checks = failed_check_lines(result.get_asset_check_evaluations())
    if raise_on_error and (not result.success or failed_checks):
        where = f" (partition {partition_key})" if partition_key else ""
        errors = [error_message(e.step_failure_data.error) for e in result.get_step_failure_events()]
        raise BuildFailed("\n".join([f"{', '.join(selection)}{where} failed: {'; '.join(errors)}", *failed_checks]))
    return result


def build_all(
    instance: dg.DagsterInstance,
    layout: SynthKDLayout,
    build: SynthKDBuildConfig | None = None,
    outputs: Iterable[str] = tuple(OUTPUTS),
    over_shards: Callable[[list[str], str], Iterable[str]] = lambda keys, _pass: keys,
    **kwargs,
) -> list[str]:
    """Inventory, scan pass per shard, the plan, build pass per shard, manifests, then (with synth_pool) the
    quota plan, the pool per shard and its curriculum and manifest; returns the shards.

    `outputs` picks the datasets (synth_kd_v1, synth_distill, synth_pool); `over_shards(keys, pass_name)` may wrap
    the shard loops (a progress bar). Holds the data root's build lock throughout: raises BuildLockHeld
    at once if another build (this function or scripts/build.sh) is running on the same root."""
    with build_lock(layout.data_layout().build_lock()):
        return _build_all(instance, layout, build, outputs, over_shards, **kwargs)


def _build_all(instance, layout, build, outputs, over_shards, **kwargs) -> list[str]:
    wanted = set(outputs)
    build_steps = [s for s in BUILD_STEPS if s not in OUTPUTS or s in wanted]
    manifests = [m for m in MANIFEST_STEPS if m not in OUTPUTS.values() or any(OUTPUTS[o] == m for o in wanted)]
    materialize_steps(instance, layout, INVENTORY_STEPS, build=build, **kwargs)
    keys = instance.get_dynamic_partitions(SYNTH_SHARDS.name)
    for key in over_shards(keys, "scan"):
        materialize_steps(instance, layout, SCAN_STEPS, key, build=build, **kwargs)
    materialize_steps(instance, layout, PLAN_STEPS, build=build, **kwargs)
    for key in over_shards(keys, "build"):
        materialize_steps(instance, layout, build_steps, key, build=build, **kwargs)
    materialize_steps(instance, layout, manifests, build=build, **kwargs)
    if "synth_pool" in wanted:
        materialize_steps(instance, layout, QUOTA_STEPS, build=build, **kwargs)
        for key in over_shards(keys, "pool"):
            materialize_steps(instance, layout, POOL_STEPS, key, build=build, **kwargs)
        materialize_steps(instance, layout, POOL_MANIFEST_STEPS, build=build, **kwargs)
    return keys
