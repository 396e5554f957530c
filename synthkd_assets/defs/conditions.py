"""When the manifests are rewritten: eagerly after their shards, but only once no shard step is queued or running
and no build holds the data root.

Dagster's `eager()` alone waits for in-progress *direct* dependencies only: synth_harmony_manifest would be
rewritten as soon as a shard's synth_harmony step finished, while the rest of that shard's run (and other
shards' queued runs) still changed what the other two manifests list. With this condition the three are
requested together, in one run, after the last shard step of the last queued or running shard run.

A build (scripts/build.sh, build_all) has moments with no shard step in progress (its plan pass, between passes),
and writes the manifests itself at its end: while it holds the data root's lock the condition is false, as the
raw sensor skips then. That part reads a lock file, so synth_manifests_automation evaluates in the code server.
"""

import os

import dagster as dg

from synthkd_assets.core.buildlock import build_in_progress
from synthkd_assets.core.layout import DataLayout
from synthkd_assets.defs.passes import SHARD_STEPS


class NoBuildHoldsTheDataRoot(dg.AutomationCondition):
    """True unless a build holds the lock of the data root this code location builds ($SYNTHKD_DATA_DIR, as the
    steps and the raw sensor see it)."""

    @property
    def description(self) -> str:
        return "no build (scripts/build.sh) holds the data root's lock"

    @property
    def name(self) -> str:
        return "no_build_holds_the_data_root"

    def evaluate(self, context: dg.AutomationContext) -> dg.AutomationResult:
        held = build_in_progress(DataLayout.from_environ(os.environ).build_lock())
        return dg.AutomationResult(context, context.get_empty_subset() if held else context.candidate_subset)


def _any_shard_step_in_progress() -> dg.AutomationCondition:
    in_progress = [
        dg.AutomationCondition.asset_matches(key, dg.AutomationCondition.in_progress()) for key in SHARD_STEPS
    ]
    condition = in_progress[0]
    for other in in_progress[1:]:
        condition = condition | other
    return condition.with_label("any shard step queued or in progress")


MANIFEST_CONDITION = (
    dg.AutomationCondition.eager() & ~_any_shard_step_in_progress() & NoBuildHoldsTheDataRoot()
).with_label("eager, once no shard run is queued or in progress and no build holds the data root")
