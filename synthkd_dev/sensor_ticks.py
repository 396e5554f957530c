"""synth_raw_sensor evaluated without a sensor daemon, for the sensor tests and the partition-scale scenario."""

from __future__ import annotations

import dagster as dg

from synthkd_assets.definitions import defs
from synthkd_assets.defs.automation import synth_raw_sensor
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout, synthkd_resources


def tick_synth_raw_sensor(
    instance: dg.DagsterInstance,
    layout: SynthKDLayout,
    cursor: str | None,
    build: SynthKDBuildConfig | None = None,
    store_events: bool = True,
) -> dg.SensorResult:
    """One evaluation of synth_raw_sensor with its partition requests applied and its asset events (synth_raw's
    new versions) stored, as the sensor daemon does after a tick (`store_events=False`: left to
    `store_sensor_events`, for a caller timing the tick itself)."""
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources=synthkd_resources(layout, build), definitions=defs()
    )
    result = synth_raw_sensor(context)
    for request in result.dynamic_partitions_requests:
        if isinstance(request, dg.AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
    if store_events:
        store_sensor_events(instance, result)
    return result


def store_sensor_events(instance: dg.DagsterInstance, result: dg.SensorResult) -> None:
    """The tick's asset events in the instance, as the sensor daemon stores them: what synth_harmony then finds
    as synth_raw's version of each shard."""
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
