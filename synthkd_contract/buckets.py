"""The seed 002 sequence pool's rules as data: skill and context buckets, the skill mix, the quota salt, the
pool's ids and the curriculum stages (002 §2-§4, §10, §11; 004).

They live with the other contract constants because they decide which rows the pool keeps and where each
row goes: a change here changes the pool's bytes, and the manifests hash these tables so it shows which
assets are stale. The quota solver is synthkd_assets/core/quota.py, the per-row counting core/buckets.py.
"""

from __future__ import annotations

import uuid
from typing import Final

# --- skill buckets (002 §2) -------------------------------------------------------------------
SKILL_BUCKETS: Final = ("B1", "B2", "B3", "B4")
SKILL_BUCKET_NAMES: Final = {
    "B1": "General reasoning",
    "B2": "Math / formal reasoning",
    "B3": "Code / algorithmic reasoning",
    "B4": "Personality / assistant policy",
}
# every SYNTH exercise -> exactly one skill bucket; "unknown" is what a null exercise becomes (NULL_DEFAULTS).
# An exercise missing here stops the harmonize step (never a silent default): add it here, to one bucket.
EXERCISE_SKILL_BUCKET: Final = {
    "memorization": "B1",
    "rag": "B1",
    "mcq": "B1",
    "arithmetic": "B2",
    "editing": "B4",
    "constrained_writing": "B4",
    "creative_writing": "B4",
    "unknown": "B1",
}
# the anchor stream's exercises (synthkd_contract/sources.py CATEGORY_EXERCISE) -> skill bucket: math anchors train
# formal reasoning, code anchors code, chat and personality anchors assistant behaviour. A table of its own, not
# rows of EXERCISE_SKILL_BUCKET: that table enters the config hash of SYNTH-only builds (their manifests' bytes),
# which must not change while no anchor source is present; skill_bucket() reads both, SYNTH rows only the first.
ANCHOR_EXERCISE_SKILL_BUCKET: Final = {
    "anchor_math": "B2",
    "anchor_code": "B3",
    "anchor_chat": "B4",
    "anchor_personality": "B4",
}

# --- context buckets (002 §3): by the length of the full rendered sequence (synth_tokenized tokens) -----
CTX_BUCKETS: Final = ("C1", "C2", "C3", "C4")
CTX_BUCKET_MAX_TOKENS: Final = {"C1": 2048, "C2": 8192, "C3": 32768}  # inclusive upper bounds; C4: above 32768

# --- the quota grid (002 §4.1, §4.3; 004) -------------------------------------------------------
SKILL_MIX: Final = {"B1": 0.5, "B2": 0.175, "B3": 0.175, "B4": 0.15}  # target shares of the pool's tokens
# the WARN check: some skill bucket holds more than this many times another's tokens
BUCKET_IMBALANCE_RATIO: Final = 1.5
QUOTA_SALT: Final = "synthkd/pool/quota"  # stable_unit_interval(QUOTA_SALT, synth_id) < the cell's rate

# --- the pool (002 §11 schema v0) ---------------------------------------------------------------
# fixed once (= uuid5(NAMESPACE_DNS, "synth_pool_v1.synthkd")); a pool row's id is
# uuid5(POOL_ID_NAMESPACE, f"{source_dataset}:{synth_id}"), so a rebuild gives every row the same id
POOL_ID_NAMESPACE: Final = uuid.UUID("2eb09ce1-7382-5a08-87f8-616885b506e6")
POOL_DATASET_NAME: Final = "synth_pool_v1"
POOL_SMOKE_DATASET_NAME: Final = "synth_pool_v1_smoke"

# --- curriculum (002 §10.1, §10.4): ctx shares of the stage's tokens, token budget, sequence length -----
CURRICULUM_STAGES: Final = (
    {"stage": "P1", "ctx_mix": {"C1": 1.0}, "tokens": 300_000_000, "seq_length": 2048, "optional": False},
    {"stage": "P2", "ctx_mix": {"C1": 0.8, "C2": 0.2}, "tokens": 150_000_000, "seq_length": 8192, "optional": False},
    {"stage": "P3", "ctx_mix": {"C1": 0.1, "C3": 0.9}, "tokens": 850_000_000, "seq_length": 32768, "optional": False},
    {"stage": "P4", "ctx_mix": {"C4": 1.0}, "tokens": 0, "seq_length": 65536, "optional": True},
)


class UnknownExercise(ValueError):
    """An exercise EXERCISE_SKILL_BUCKET does not map: the pool cannot say which skill it trains."""


def skill_bucket(exercise: str) -> str:
    """The skill bucket of an exercise; UnknownExercise (naming it and the table) rather than a guess, since a
    wrong bucket would silently skew the token mix the quota grid enforces."""
    bucket = EXERCISE_SKILL_BUCKET.get(exercise) or ANCHOR_EXERCISE_SKILL_BUCKET.get(exercise)
    if bucket is None:
        raise UnknownExercise(
            f"exercise {exercise!r} has no skill bucket in synthkd_contract/buckets.py EXERCISE_SKILL_BUCKET"
        )
    return bucket


def ctx_bucket(sequence_length: int) -> str:
    """The context bucket of a full rendered sequence of `sequence_length` tokens (bounds inclusive): the
    curriculum stages select their sequence lengths by these buckets."""
    if sequence_length < 0:
        raise ValueError(f"sequence length {sequence_length} < 0")
    for bucket, max_tokens in CTX_BUCKET_MAX_TOKENS.items():
        if sequence_length <= max_tokens:
            return bucket
    return CTX_BUCKETS[-1]


def pool_row_id(source_dataset: str, synth_id: str) -> str:
    """The pool's `id` of a conversation: derived from where it comes from, so rebuilds keep every id."""
    return str(uuid.uuid5(POOL_ID_NAMESPACE, f"{source_dataset}:{synth_id}"))
