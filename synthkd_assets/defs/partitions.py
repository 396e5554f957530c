"""The one partitioning of the graph: a partition per raw SYNTH shard file, discovered at run time."""

import dagster as dg

SYNTH_SHARDS = dg.DynamicPartitionsDefinition(name="synth_shards")
