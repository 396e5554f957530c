"""The Definitions of the code location (loaded through workspace.yaml / pyproject), built when it loads.

`@dg.definitions` defers everything that depends on the environment to load time, so importing this module
reads none: the executor ($SYNTHKD_EXECUTOR), the nightly schedule's cron ($SYNTHKD_REBUILD_CRON) and the
layout's roots ($SYNTHKD_RAW_DIR / $SYNTHKD_DATA_DIR, as dg.EnvVar) and the valuation's checkpoints
($SYNTHKD_TEACHER_CHECKPOINT / $SYNTHKD_STUDENT_CHECKPOINT) come from the environment of the process
that loads it; `build_definitions(environ)` builds them for any given environment.
"""

import os
from collections.abc import Mapping

import dagster as dg

from synthkd_assets.defs.automation import nightly_rebuild_schedule, synth_manifests_automation, synth_raw_sensor
from synthkd_assets.defs.code_versions import with_code_versions
from synthkd_assets.defs.executors import executor_from_settings
from synthkd_assets.defs.graph import ASSET_CHECKS, ASSETS
from synthkd_assets.defs.jobs import JOBS
from synthkd_assets.defs.resources import (
    SynthKDBuildConfig,
    SynthKDLayout,
    ValuationModelsResource,
    synthkd_resources,
)
from synthkd_assets.defs.retries import synth_retry_watchdog
from synthkd_contract.settings import Settings


def build_definitions(environ: Mapping[str, str]) -> dg.Definitions:
    """The code location as a process with environment `environ` loads it (its settings read once)."""
    settings = Settings.read(environ)
    return dg.Definitions(
        assets=with_code_versions(ASSETS),
        asset_checks=ASSET_CHECKS,
        jobs=JOBS,
        sensors=[synth_raw_sensor, synth_manifests_automation, synth_retry_watchdog],
        schedules=[nightly_rebuild_schedule(settings.rebuild_cron)],
        resources=synthkd_resources(
            SynthKDLayout.from_settings(settings),
            SynthKDBuildConfig.from_settings(settings),
            ValuationModelsResource.from_settings(settings),
        ),
        # every step in the run's process by default; SYNTHKD_EXECUTOR=celery|k8s on a cluster (defs/executors.py)
        executor=executor_from_settings(settings),
    )


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions(os.environ)
