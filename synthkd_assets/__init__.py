"""synthkd_assets: the Dagster build of synth_kd_v1, synth_distill and the sequence pool (core/: the steps; defs/:
the Dagster definitions). Importing it makes Arrow hand freed memory back at once (core/memory.py)."""

from synthkd_assets.core.memory import release_arrow_memory_at_once

release_arrow_memory_at_once()
