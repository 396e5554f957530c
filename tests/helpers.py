"""Building the graph in tests: one `dagster.materialize` per step group, on a real instance."""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from synthkd_assets.definitions import defs
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDPaths

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RAW_DIR = REPO_ROOT / "data" / "sample" / "synth_raw"
ALL_ASSETS = list(defs.assets) + list(defs.asset_checks)
SCAN_STEPS = ["synth_harmony", "synth_filtered"]  # per shard, before the (global) sampling plan
PLAN_STEPS = ["synth_sampling_plan"]
BUILD_STEPS = ["synth_sampled", "synth_tokenized", "synth_kd_v1", "synth_distill"]  # per shard, with the plan
SHARD_STEPS = SCAN_STEPS + BUILD_STEPS  # rebuilding one shard under the plan in force
MANIFEST_STEPS = ["synth_harmony_manifest", "synth_kd_v1_manifest", "synth_distill_manifest"]


def run(instance, paths: SynthKDPaths, selection: list[str], partition_key: str | None = None, raise_on_error: bool = True):
    """Materialize `selection` (and the checks of those assets) on `instance`."""
    result = dg.materialize(
        ALL_ASSETS,
        selection=dg.AssetSelection.assets(*selection) | dg.AssetSelection.checks_for_assets(*selection),
        partition_key=partition_key,
        instance=instance,
        resources={"paths": paths},
        raise_on_error=raise_on_error,
    )
    if raise_on_error:
        assert result.success
    return result


def build_everything(instance, paths: SynthKDPaths) -> None:
    """What scripts/build.sh does: scan pass per shard, the plan, build pass per shard, manifests."""
    run(instance, paths, ["o200k_tokenizer", "synth_raw_inventory"])
    keys = instance.get_dynamic_partitions(SYNTH_SHARDS.name)
    for key in keys:
        run(instance, paths, SCAN_STEPS, key)
    run(instance, paths, PLAN_STEPS)
    for key in keys:
        run(instance, paths, BUILD_STEPS, key)
    run(instance, paths, MANIFEST_STEPS)


def check_outcomes(result) -> dict[str, bool]:
    return {evaluation.check_name: evaluation.passed for evaluation in result.get_asset_check_evaluations()}
