"""Skill and context buckets of the sequence pool and the curriculum stages over them (seed 002 §2, §3, §10).

Minimal version on the curriculum branch (i17-b): only the constants `synthkd_assets.core.curriculum` reads.
The full module (exercise table, ctx boundaries, skill mix, salts) comes from the buckets branch (i17-a),
whose definitions of these names are the same.
"""

from __future__ import annotations

from typing import Final

SKILL_BUCKETS: Final = ("B1", "B2", "B3", "B4")
CTX_BUCKETS: Final = ("C1", "C2", "C3", "C4")
CURRICULUM_STAGES: Final = (  # 002 §10.1, §10.4: ctx shares of the stage's tokens, budget, sequence length
    {"stage": "P1", "ctx_mix": {"C1": 1.0}, "tokens": 300_000_000, "seq_length": 2048, "optional": False},
    {"stage": "P2", "ctx_mix": {"C1": 0.8, "C2": 0.2}, "tokens": 150_000_000, "seq_length": 8192, "optional": False},
    {"stage": "P3", "ctx_mix": {"C1": 0.1, "C3": 0.9}, "tokens": 850_000_000, "seq_length": 32768, "optional": False},
    {"stage": "P4", "ctx_mix": {"C4": 1.0}, "tokens": 0, "seq_length": 65536, "optional": True},
)
