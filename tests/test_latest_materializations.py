"""The latest materialization of many partitions at once, in a few event-log queries, is each one's latest."""

from __future__ import annotations

import dagster as dg

from synthkd_assets.defs import metadata
from synthkd_assets.defs.metadata import latest_partition_materialization, latest_partition_materializations


def test_the_latest_of_each_partition_whatever_the_pages(monkeypatch):
    """Partitions materialized several times, interleaved with another asset's and with partitions not asked for,
    read two records a query (so across many pages): each partition's latest, as asked one by one."""
    monkeypatch.setattr(metadata, "MATERIALIZATIONS_PER_FETCH", 2)
    key, other = dg.AssetKey("synth_kd_v1"), dg.AssetKey("synth_distill")
    with dg.DagsterInstance.ephemeral() as instance:
        for round_ in range(3):
            for shard in ("synth_001", "synth_002", "synth_003", "synth_004"):
                if shard == "synth_003" and round_ == 2:
                    continue
                for asset in (key, other):
                    event = dg.AssetMaterialization(asset, partition=shard, metadata={"round": round_})
                    instance.report_runless_asset_event(event)
        asked = ["synth_001", "synth_003", "synth_004", "synth_009"]
        latest = latest_partition_materializations(instance, key, asked)
        assert sorted(latest) == ["synth_001", "synth_003", "synth_004"]  # synth_009 never materialized
        for shard, materialization in latest.items():
            assert materialization == latest_partition_materialization(instance, key, shard)
        assert {shard: m.metadata["round"].value for shard, m in latest.items()} == {
            "synth_001": 2,
            "synth_003": 1,
            "synth_004": 2,
        }
