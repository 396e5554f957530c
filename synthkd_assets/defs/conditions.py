"""When the manifests are rewritten: eagerly after their shards, but only once no shard step is queued or running.

Dagster's `eager()` alone waits for in-progress *direct* dependencies only: synth_harmony_manifest would be
rewritten as soon as a shard's synth_harmony step finished, while the rest of that shard's run (and other
shards' queued runs) still changed what the other two manifests list. With this condition the three are
requested together, in one run, after the last shard step of the last queued or running shard run.
"""

import dagster as dg

from synthkd_assets.defs.passes import SHARD_STEPS


def _any_shard_step_in_progress() -> dg.AutomationCondition:
    in_progress = [
        dg.AutomationCondition.asset_matches(key, dg.AutomationCondition.in_progress()) for key in SHARD_STEPS
    ]
    condition = in_progress[0]
    for other in in_progress[1:]:
        condition = condition | other
    return condition.with_label("any shard step queued or in progress")


MANIFEST_CONDITION = (dg.AutomationCondition.eager() & ~_any_shard_step_in_progress()).with_label(
    "eager, once no shard run is queued or in progress"
)
