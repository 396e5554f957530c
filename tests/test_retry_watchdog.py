"""synth_retry_watchdog (synthkd_assets/defs/retries.py) on a real instance: which failed runs' retries Dagster
lost, and the failure reported again for each, once. The whole path, with a daemon whose retry daemon then
launches the retry: tests/test_automation_daemon.py (a run failed by run monitoring just after a restart)."""

from __future__ import annotations

import time

import dagster as dg

from synthkd_assets.defs.retries import (
    LOST_RETRY_AFTER_S,
    LOST_RETRY_WINDOW_S,
    REANNOUNCED_MESSAGE,
    REANNOUNCED_TAG,
    lost_retries,
    synth_retry_watchdog,
)
from synthkd_assets.defs.tags import AUTO_RETRY_RUN_ID_TAG, WILL_RETRY_TAG
from tests.helpers import add_failed_run

LATER = LOST_RETRY_AFTER_S + 1
RETRIES = {"run_retries": {"enabled": True, "max_retries": 2}}  # as dagster.yaml


def failures(instance: dg.DagsterInstance, run_id: str) -> list[str]:
    return [entry.message for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)]


def test_a_run_tagged_to_be_retried_without_a_retry_is_lost_only_after_a_while():
    with dg.DagsterInstance.ephemeral(settings=RETRIES) as instance:
        lost = add_failed_run(instance, {WILL_RETRY_TAG: "true"})
        add_failed_run(instance, {WILL_RETRY_TAG: "true", AUTO_RETRY_RUN_ID_TAG: "its-retry"})  # retried
        add_failed_run(instance, {WILL_RETRY_TAG: "false"})  # failed for good
        add_failed_run(instance, {})  # not tagged yet
        add_failed_run(instance, {WILL_RETRY_TAG: "true"}, launched=False)  # no origin: the daemon cannot relaunch it
        assert lost_retries(instance) == []  # Dagster is still about to launch it
        assert [run.run_id for run in lost_retries(instance, now=time.time() + LATER)] == [lost]
        assert lost_retries(instance, now=time.time() + LOST_RETRY_WINDOW_S + 1) == []  # history


def test_the_watchdog_reports_a_lost_retrys_failure_again_once_and_dagster_tags_it_to_be_retried(monkeypatch):
    """The new failure event is what Dagster's retry daemon reads to launch the retry; the run keeps its tag
    (Dagster computes it again), and a retry of it (which copies its tags) can still be announced again."""
    monkeypatch.setattr("synthkd_assets.defs.retries.LOST_RETRY_AFTER_S", 0.0)
    with dg.DagsterInstance.ephemeral(settings=RETRIES) as instance:
        lost = add_failed_run(instance, {WILL_RETRY_TAG: "true"})
        skip = synth_retry_watchdog(dg.build_sensor_context(instance=instance))
        assert lost[:8] in skip.skip_message and REANNOUNCED_MESSAGE in skip.skip_message
        assert failures(instance, lost) == [REANNOUNCED_MESSAGE]
        tags = instance.get_run_by_id(lost).tags
        assert tags[REANNOUNCED_TAG] == lost and tags[WILL_RETRY_TAG] == "true"
        skip = synth_retry_watchdog(dg.build_sensor_context(instance=instance))
        assert skip.skip_message == "no failed run's retry is overdue" and failures(instance, lost) == [
            REANNOUNCED_MESSAGE
        ]
        its_retry = add_failed_run(instance, {WILL_RETRY_TAG: "true", REANNOUNCED_TAG: lost})
        assert [run.run_id for run in lost_retries(instance)] == [its_retry]


def test_with_run_retries_off_the_watchdog_does_nothing(monkeypatch):
    monkeypatch.setattr("synthkd_assets.defs.retries.LOST_RETRY_AFTER_S", 0.0)
    with dg.DagsterInstance.ephemeral() as instance:
        run = add_failed_run(instance, {WILL_RETRY_TAG: "true"})
        skip = synth_retry_watchdog(dg.build_sensor_context(instance=instance))
        assert "run retries are off" in skip.skip_message and failures(instance, run) == []
