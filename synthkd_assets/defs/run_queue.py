"""The local instance's run queue: Dagster's QueuedRunCoordinator, admitting one run per core unless dagster.yaml
says otherwise, and only runs of the kind of build the instance holds.

The tracked dagster.yaml cannot know the machine it runs on; this reads the count in the process that dequeues
(the daemon): $SYNTHKD_PARALLEL_RUNS when set, else the cores that process may run on
(synthkd_assets/core/parallel.py).

`builds: full` (the default) or `builds: smoke` (the smoke builds' instance, defs/instances.py): a run whose config
is the other kind's (the `build` resource's `smoke`) is refused when it is submitted, whoever submits it (the UI's
launchpad, `dg launch`, a re-execution), so that a smoke run never becomes the latest state the full instance's
UI shows; Dagster marks the refused run failed with the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from synthkd_assets.core.parallel import parallel_runs
from synthkd_assets.defs.instances import FULL_BUILDS, SMOKE_BUILDS
from synthkd_assets.defs.jobs import smoke_run_tags
from synthkd_contract.settings import Settings


class WrongInstanceForBuild(dg.DagsterInvariantViolationError):
    """A smoke build's run submitted to the full builds' instance, or the reverse."""


def wrong_instance_message(builds: str, run_is_smoke: bool) -> str | None:
    """Why an instance holding `builds` refuses a run (None: it takes it).

    Args:
        builds: the instance's run queue setting, `full` or `smoke`.
        run_is_smoke: whether the run's config sets the `build` resource's `smoke`.

    Returns:
        The refusal, naming where the run belongs, or None.
    """
    if run_is_smoke == (builds == SMOKE_BUILDS):
        return None
    if run_is_smoke:
        return (
            "refused: this instance holds full builds, and this run's config sets the build resource's smoke: true. "
            "A smoke build records into its own instance, so that this UI keeps showing the full build's state: "
            "run ./scripts/build.sh --smoke, and browse it with ./scripts/ui.sh --smoke."
        )
    return (
        "refused: this is the smoke builds' instance, and this run's config is a full build's (smoke is not set). "
        "Launch it from the full builds' instance (./scripts/ui.sh), or set the build resource's smoke: true."
    )


class CoreSizedRunQueue(dg.QueuedRunCoordinator):
    """QueuedRunCoordinator whose `max_concurrent_runs` defaults to `parallel_runs`, taking only runs of the kind
    of build its `builds` names (module docstring)."""

    builds: str = FULL_BUILDS

    @classmethod
    def config_type(cls):
        return {
            **super().config_type(),
            "builds": dg.Field(
                dg.Enum("SynthKDBuilds", [dg.EnumValue(FULL_BUILDS), dg.EnumValue(SMOKE_BUILDS)]),
                is_required=False,
                default_value=FULL_BUILDS,
                description="the kind of build whose runs this instance takes: full (default) or smoke",
            ),
        }

    @classmethod
    def from_config_value(cls, inst_data, config_value: Mapping[str, Any]):
        config = dict(config_value)
        if config.get("max_concurrent_runs") is None:
            config["max_concurrent_runs"] = parallel_runs(Settings.read())
        queue = super().from_config_value(inst_data, config)
        queue.builds = config.get("builds") or FULL_BUILDS
        return queue

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        refusal = wrong_instance_message(self.builds, bool(smoke_run_tags(run.run_config)))
        if refusal is not None:
            raise WrongInstanceForBuild(refusal)
        return super().submit_run(context)
