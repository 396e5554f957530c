"""The one Definitions object of the code location (loaded through workspace.yaml / pyproject)."""

import dagster as dg

from synthkd_assets.defs import assets
from synthkd_assets.defs.automation import (
    synth_manifests_job,
    synth_nightly_rebuild,
    synth_plan_job,
    synth_raw_sensor,
    synth_scan_job,
    synth_shard_job,
)
from synthkd_assets.defs.checks import STANDALONE_CHECKS
from synthkd_assets.defs.resources import SynthKDPaths

defs = dg.Definitions(
    assets=[*dg.load_assets_from_modules([assets]), assets.synth_raw],
    asset_checks=STANDALONE_CHECKS,
    jobs=[synth_scan_job, synth_plan_job, synth_shard_job, synth_manifests_job],
    sensors=[synth_raw_sensor],
    schedules=[synth_nightly_rebuild],
    resources={"paths": SynthKDPaths()},
    # steps of one run in parallel on this 2-core machine; runs themselves are queued (dagster.yaml)
    executor=dg.multiprocess_executor.configured({"max_concurrent": 2}),
)
