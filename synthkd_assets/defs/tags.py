"""Dagster's documented run tags, and the run statuses the code groups, named once. Dagster documents the tags
("Run tags" and "Run retries" in its docs: `dagster/partition`, `dagster/run_key`, `dagster/max_retries`,
`dagster/will_retry`, `dagster/auto_retry_run_id`, `dagster/retry_number`) but exports no public constant for them
(only `MAX_RUNTIME_SECONDS_TAG`), so the shipped code spells them here instead of importing
`dagster._core.storage.tags`; tests/test_dagster_conventions.py checks them against Dagster's own values, so an
upgrade that renames one fails there, not in a run."""

import time
from typing import Final

import dagster as dg

PARTITION_TAG: Final = "dagster/partition"  # the partition key a run was launched for
RUN_KEY_TAG: Final = "dagster/run_key"  # a sensor's or schedule's run key
MAX_RETRIES_TAG: Final = "dagster/max_retries"  # run retries allowed (the instance's run_retries)
WILL_RETRY_TAG: Final = "dagster/will_retry"  # "true" on a failed run the retry daemon will re-launch
AUTO_RETRY_RUN_ID_TAG: Final = "dagster/auto_retry_run_id"  # on a failed run: the id of its retry
RETRY_NUMBER_TAG: Final = "dagster/retry_number"  # on a run the retry daemon launched: which retry it is
# Dagster marks a run failed, then, in a second write, tags WILL_RETRY_TAG: with run retries on, a failed run without
# the tag may still be retried for this long after its last update (then the process that failed it died first)
RETRY_TAG_GRACE_SECONDS: Final = 30.0
DATA_VERSION_TAG: Final = "dagster/data_version"  # on a materialization: its data version
EPHEMERAL_JOB_NAME: Final = "__ephemeral_asset_job__"  # the job `dg.materialize` runs steps of no job as

# a run queued or running; and a run not ended yet (those, or being canceled: its steps may still write)
ACTIVE_RUN_STATUSES: Final = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
)
UNFINISHED_RUN_STATUSES: Final = (*ACTIVE_RUN_STATUSES, dg.DagsterRunStatus.CANCELING)


def retry_tag_pending(record: dg.RunRecord, retries_enabled: bool, now: float | None = None) -> bool:
    """Whether the failed run of `record` may still be tagged WILL_RETRY_TAG "true": run retries are on, it has
    no tag either way yet, and it was last updated less than RETRY_TAG_GRACE_SECONDS before `now`."""
    now = time.time() if now is None else now
    return (
        retries_enabled
        and record.dagster_run.status == dg.DagsterRunStatus.FAILURE
        and WILL_RETRY_TAG not in record.dagster_run.tags
        and now - record.update_timestamp.timestamp() < RETRY_TAG_GRACE_SECONDS
    )


def may_be_retried(record: dg.RunRecord, retries_enabled: bool, now: float | None = None) -> bool:
    """Whether the failed run of `record` is, or may still be, tagged WILL_RETRY_TAG "true" (retry_tag_pending):
    not failed for good."""
    told = record.dagster_run.tags.get(WILL_RETRY_TAG) == "true"
    return record.dagster_run.status == dg.DagsterRunStatus.FAILURE and (
        told or retry_tag_pending(record, retries_enabled, now)
    )
