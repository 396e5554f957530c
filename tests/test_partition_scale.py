"""500 partitions: discovery, the sensor's two ticks and a full job backfill do what they should at scale.

The scenario is synthkd_dev.partition_scale's: benchmarks/partition_scale.py times it against budgets, this
test checks only its outcomes, never a duration. Real Parquet shards, a real DagsterInstance configured by
dagster.yaml (QueuedRunCoordinator), the real sensor, and the backfill daemon's own iteration over the real
code location. Differences from the benchmark, for time
only (they leave the outcomes alone): Dagster's in-memory event log (as DagsterInstance.ephemeral() uses;
the code location is then loaded in process), no sensor-daemon tick (phase 4; its run creation is the
backfill's), and the backfill daemon's 1 s pauses between chunks of 25 runs last 0 s.
"""

from __future__ import annotations

import re

import pytest

from synthkd_dev import partition_scale

pytestmark = pytest.mark.scale

N = partition_scale.SCALE_PARTITIONS  # 500


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    work = tmp_path_factory.mktemp("partition_scale")
    result = partition_scale.run_scenario(
        N, work, storage="memory", in_process=True, sensor_daemon=False, backfill_pause_s=0.0
    )
    return result, work


def test_scale_is_500_distinct_small_shards(scenario):
    _, work = scenario
    files = sorted((work / "raw").glob("*.parquet"))
    assert [f.stem for f in files] == [f"synth_{i:03d}" for i in range(N)]
    assert len({f.read_bytes() for f in files}) == N


def test_inventory_registers_one_partition_per_shard(scenario):
    result, _ = scenario
    assert result.registered_by_inventory == [f"synth_{i:03d}" for i in range(N)]


def test_first_tick_adds_every_partition_and_requests_every_scan(scenario):
    result, _ = scenario
    keys = [f"synth_{i:03d}" for i in range(N)]
    assert result.tick1_added == keys
    assert result.tick1_registered == keys
    # no sampling plan yet: the scan pass, one run per shard, keyed by its content
    assert [(job, key) for job, key, _ in result.tick1_requests] == [("synth_scan_job", k) for k in keys]
    assert len({run_key for _, _, run_key in result.tick1_requests}) == N
    # never built: after no synth_harmony materialization
    assert all(re.fullmatch(f"{key}:[0-9a-f]{{64}}:after-none", run_key) for _, key, run_key in result.tick1_requests)


def test_second_tick_requests_exactly_the_changed_shard(scenario):
    result, _ = scenario
    assert result.changed_shard == "synth_250"
    [(job, key, run_key)] = result.tick2_requests
    assert (job, key) == ("synth_scan_job", "synth_250") and run_key.startswith(f"synth_250:{result.changed_sha256}:")
    first_key = next(run_key for _, key, run_key in result.tick1_requests if key == "synth_250")
    assert first_key != run_key


def test_backfill_queues_one_scan_run_per_partition(scenario):
    result, _ = scenario
    assert result.backfill_errors == []
    runs = result.backfill_runs
    assert sorted(r["partition"] for r in runs) == [f"synth_{i:03d}" for i in range(N)]
    assert {r["job_name"] for r in runs} == {"synth_scan_job"}
    assert {r["status"] for r in runs} == {"QUEUED"}  # handed to the QueuedRunCoordinator, none launched
    assert {r["tags"]["dagster/backfill"] for r in runs} == {result.backfill_id}
    assert {r["tags"]["dagster/partition_set"] for r in runs} == {"synth_scan_job_partition_set"}
    assert result.backfill_status == "REQUESTED"  # not finished while its runs wait in the queue
    assert result.backfill_checkpoint_pauses >= N // 25 - 1  # submitted in chunks of 25, as the daemon does


def test_benchmark_outcome_check_agrees(scenario):
    result, _ = scenario
    assert partition_scale.outcome_problems(result) == []  # what the benchmark refuses to time
    assert set(result.seconds) == {"discovery", "sensor tick 1", "sensor tick 2", "backfill"}  # no bounds here
