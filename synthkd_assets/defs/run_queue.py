"""The local instance's run queue: Dagster's QueuedRunCoordinator, admitting one run per core unless dagster.yaml
says otherwise.

The tracked dagster.yaml cannot know the machine it runs on; this reads the count in the process that dequeues
(the daemon): $SYNTHKD_PARALLEL_RUNS when set, else the cores that process may run on
(synthkd_assets/core/parallel.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from synthkd_assets.core.parallel import parallel_runs
from synthkd_contract.settings import Settings


class CoreSizedRunQueue(dg.QueuedRunCoordinator):
    """QueuedRunCoordinator whose `max_concurrent_runs` defaults to `parallel_runs` (module docstring)."""

    @classmethod
    def from_config_value(cls, inst_data, config_value: Mapping[str, Any]):
        config = dict(config_value)
        if config.get("max_concurrent_runs") is None:
            config["max_concurrent_runs"] = parallel_runs(Settings.read())
        return super().from_config_value(inst_data, config)
