"""The build order of the graph, defined once: used by the tests, the DistillKit CLI and the benchmark.

scripts/build.sh runs the same passes through the dagster CLI (its order is tested against a build
through this module in tests/test_cli_and_webserver.py).
"""

from collections.abc import Callable, Iterable, Sequence

import dagster as dg

from synthkd_assets.core.buildlock import build_lock
from synthkd_assets.defs.failures import error_message, failed_check_lines
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout, synthkd_resources

INVENTORY_STEPS = ["o200k_tokenizer", "synth_raw_inventory"]
SCAN_STEPS = ["synth_harmony", "synth_filtered"]  # per shard, before the (global) sampling plan
PLAN_STEPS = ["synth_sampling_plan"]
BUILD_STEPS = ["synth_sampled", "synth_tokenized", "synth_kd_v1", "synth_distill"]  # per shard, under the plan
SHARD_STEPS = SCAN_STEPS + BUILD_STEPS  # rebuilding one shard under the plan in force
MANIFEST_STEPS = ["synth_harmony_manifest", "synth_kd_v1_manifest", "synth_distill_manifest"]
OUTPUTS = {"synth_kd_v1": "synth_kd_v1_manifest", "synth_distill": "synth_distill_manifest"}


class BuildFailed(RuntimeError):
    """A step or a blocking check failed; the message names the steps, the partition and the reasons."""


def all_definitions() -> list:
    """The code location's assets (with their code versions) and checks."""
    from synthkd_assets.definitions import build_definitions

    definitions = build_definitions({})
    return list(definitions.assets) + list(definitions.asset_checks)


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
    """Inventory, scan pass per shard, the plan, build pass per shard, manifests; returns the shards.

    `outputs` picks the datasets (synth_kd_v1, synth_distill); `over_shards(keys, pass_name)` may wrap
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
    return keys


def launch_sequence(partition: str = "<shard>") -> list[str]:
    """The same order as `dg launch` commands, for one shard partition (the working form of the card's
    `dagster asset materialize --select synth_kd_v1`): what the README shows and upstream failures suggest."""
    launch = "dg launch --assets"
    return [
        f"{launch} {','.join(INVENTORY_STEPS)}",
        f"{launch} {','.join(SCAN_STEPS)} --partition {partition}   # every shard, before the plan",
        f"{launch} {','.join(PLAN_STEPS)}",
        f"{launch} {','.join(BUILD_STEPS)} --partition {partition}",
        f"{launch} {','.join(MANIFEST_STEPS)}   # once every shard is built",
    ]
