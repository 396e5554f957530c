"""The one Definitions object of the code location (loaded through workspace.yaml / pyproject)."""

import dagster as dg

from synthkd_assets.defs.automation import (
    synth_manifests_automation,
    synth_manifests_job,
    synth_nightly_rebuild,
    synth_plan_job,
    synth_raw_sensor,
    synth_scan_job,
    synth_shard_job,
)
from synthkd_assets.defs.executors import executor_from_env
from synthkd_assets.defs.graph import ASSET_CHECKS, ASSETS
from synthkd_assets.defs.resources import SynthKDPaths

defs = dg.Definitions(
    assets=ASSETS,
    asset_checks=ASSET_CHECKS,
    jobs=[synth_scan_job, synth_plan_job, synth_shard_job, synth_manifests_job],
    sensors=[synth_raw_sensor, synth_manifests_automation],
    schedules=[synth_nightly_rebuild],
    resources={"paths": SynthKDPaths()},
    # embedded multiprocess steps by default; SYNTHKD_EXECUTOR=celery|k8s on a cluster (defs/executors.py)
    executor=executor_from_env(),
)
