"""The seed 002 sequence pool's rules as data: skill and context buckets, the skill mix, the quota salt, the
pool's ids and the curriculum stages (docs/pool.md#buckets; 004).

They live with the other contract constants because they decide which rows the pool keeps and where each
row goes: a change here changes the pool's bytes, and the manifests hash these tables so it shows which
assets are stale. The quota solver is synthkd_assets/core/quota.py, the per-row counting core/buckets.py.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Final

import numpy as np

# --- skill buckets (docs/pool.md#buckets) -------------------------------------------------------------------
SKILL_BUCKETS: Final = ("B1", "B2", "B3", "B4")
SKILL_BUCKET_NAMES: Final = {
    "B1": "General reasoning",
    "B2": "Math / formal reasoning",
    "B3": "Code / algorithmic reasoning",
    "B4": "Personality / assistant policy",
}
# every PleIAs/SYNTH exercise label, spelled as the corpus spells it (with spaces), -> exactly one skill bucket
# (docs/pool.md "Skill buckets"); "unknown" is what a null exercise becomes (NULL_DEFAULTS). The corpus's math
# (`math exercise`: worked solutions; `math mcq`: computed options) trains formal reasoning; recall, MCQ, RAG and
# cooking (memorization with rewritten seeds) train general reasoning; the writing exercises train assistant
# behaviour (following constraints, tone, form). A label missing here stops the build in its inventory pass,
# naming the label, the files and the setting: a build maps it with the `build` resource's
# `exercise_skill_buckets` (exercise_skill_table), never with a silent default.
EXERCISE_SKILL_BUCKET: Final = {
    "memorization": "B1",
    "mcq": "B1",
    "rag": "B1",
    "cooking": "B1",
    "math exercise": "B2",
    "math mcq": "B2",
    "constrained writing": "B4",
    "editing": "B4",
    "creative writing": "B4",
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

# --- context buckets (docs/pool.md#buckets): by the length of the full rendered sequence (synth_tokenized tokens) -----
CTX_BUCKETS: Final = ("C1", "C2", "C3", "C4")
CTX_BUCKET_MAX_TOKENS: Final = {"C1": 2048, "C2": 8192, "C3": 32768}  # inclusive upper bounds; C4: above 32768

# --- the quota grid (docs/pool.md#the-quota-grid-on-tokens; 004) ------------------------------------------------------
SKILL_MIX: Final = {"B1": 0.5, "B2": 0.175, "B3": 0.175, "B4": 0.15}  # target shares of the pool's tokens
# the WARN check: some skill bucket holds more than this many times another's tokens
BUCKET_IMBALANCE_RATIO: Final = 1.5
QUOTA_SALT: Final = "synthkd/pool/quota"  # stable_unit_interval(QUOTA_SALT, synth_id) < the cell's rate

# --- the pool (docs/pool.md#what-the-pool-holds schema v0) ------------------------------------------------------------
# fixed once (= uuid5(NAMESPACE_DNS, "synth_pool_v1.synthkd")); a pool row's id is
# uuid5(POOL_ID_NAMESPACE, f"{source_dataset}:{synth_id}"), so a rebuild gives every row the same id
POOL_ID_NAMESPACE: Final = uuid.UUID("2eb09ce1-7382-5a08-87f8-616885b506e6")
POOL_DATASET_NAME: Final = "synth_pool_v1"
POOL_SMOKE_DATASET_NAME: Final = "synth_pool_v1_smoke"

# --- curriculum (docs/pool.md#curriculum): ctx shares of the stage's tokens, token budget, sequence length -----
CURRICULUM_STAGES: Final = (
    {"stage": "P1", "ctx_mix": {"C1": 1.0}, "tokens": 300_000_000, "seq_length": 2048, "optional": False},
    {"stage": "P2", "ctx_mix": {"C1": 0.8, "C2": 0.2}, "tokens": 150_000_000, "seq_length": 8192, "optional": False},
    {"stage": "P3", "ctx_mix": {"C1": 0.1, "C3": 0.9}, "tokens": 850_000_000, "seq_length": 32768, "optional": False},
    {"stage": "P4", "ctx_mix": {"C4": 1.0}, "tokens": 0, "seq_length": 65536, "optional": True},
)


class UnknownExercise(ValueError):
    """An exercise EXERCISE_SKILL_BUCKET does not map: the pool cannot say which skill it trains."""


def exercise_skill_table(added: Mapping[str, str] | None = None) -> dict[str, str]:
    """The exercise -> skill bucket table a build uses: the contract's, with a build's own labels on top.

    Args:
        added: labels the build maps itself (the `build` resource's `exercise_skill_buckets`), each to one of
            SKILL_BUCKETS; a contract label given here is mapped as given.

    Returns:
        A new dict: EXERCISE_SKILL_BUCKET updated with `added`, sorted by label.

    Raises:
        ValueError: a label is blank, or a bucket is not one of SKILL_BUCKETS.
    """
    table = dict(EXERCISE_SKILL_BUCKET)
    for label, bucket in (added or {}).items():
        if not label.strip():
            raise ValueError(f"exercise_skill_buckets: a blank exercise label {label!r}")
        if bucket not in SKILL_BUCKETS:
            raise ValueError(
                f"exercise_skill_buckets: exercise {label!r} -> {bucket!r}, "
                f"not a skill bucket ({', '.join(SKILL_BUCKETS)})"
            )
        table[label] = bucket
    return dict(sorted(table.items()))


def skill_bucket(exercise: str, table: Mapping[str, str] | None = None) -> str:
    """The skill bucket of an exercise.

    Args:
        exercise: a SYNTH exercise label as spelled in the corpus, or an anchor source's exercise.
        table: the build's exercise table (exercise_skill_table); the contract's EXERCISE_SKILL_BUCKET if None.

    Returns:
        One of SKILL_BUCKETS.

    Raises:
        UnknownExercise: naming the exercise and the setting that maps it, rather than a guess, since a wrong
            bucket would silently skew the token mix the quota grid enforces.
    """
    bucket = (EXERCISE_SKILL_BUCKET if table is None else table).get(exercise) or ANCHOR_EXERCISE_SKILL_BUCKET.get(
        exercise
    )
    if bucket is None:
        raise UnknownExercise(unknown_exercise_message(exercise))
    return bucket


UNKNOWN_EXERCISE_SETTING: Final = "exercise_skill_buckets"  # the build resource's field that maps a new label


def unknown_exercise_message(exercise: str) -> str:
    """What an exercise no table maps is told: the label, the table and the setting to add (docs/pool.md)."""
    return (
        f"exercise {exercise!r} has no skill bucket in synthkd_contract/buckets.py EXERCISE_SKILL_BUCKET; map it "
        f"with the build resource's {UNKNOWN_EXERCISE_SETTING} (e.g. SYNTHKD_BUILD_CONFIG="
        f'\'{{"{UNKNOWN_EXERCISE_SETTING}": {{"{exercise}": "B1"}}}}\')'
    )


def ctx_bucket(sequence_length: int) -> str:
    """The context bucket of a full rendered sequence of `sequence_length` tokens (bounds inclusive): the
    curriculum stages select their sequence lengths by these buckets."""
    if sequence_length < 0:
        raise ValueError(f"sequence length {sequence_length} < 0")
    for bucket, max_tokens in CTX_BUCKET_MAX_TOKENS.items():
        if sequence_length <= max_tokens:
            return bucket
    return CTX_BUCKETS[-1]


def ctx_codes(lengths: np.ndarray) -> np.ndarray:
    """`ctx_bucket` of an array of lengths, each as its index in CTX_BUCKETS (int16): the first bucket whose
    inclusive upper bound holds it, the last for a length above every bound.

    Args:
        lengths: full rendered sequence lengths (token counts).

    Returns:
        One index into CTX_BUCKETS a length.

    Raises:
        ValueError: a length < 0 (`ctx_bucket`'s refusal).
    """
    if len(lengths) and int(lengths.min()) < 0:
        ctx_bucket(int(lengths.min()))  # raises, naming it
    bounds = np.array([CTX_BUCKET_MAX_TOKENS[c] for c in CTX_BUCKETS[:-1]], dtype=np.int64)
    return np.searchsorted(bounds, lengths, side="left").astype(np.int16)


def pool_row_id(source_dataset: str, synth_id: str) -> str:
    """The pool's `id` of a conversation: derived from where it comes from, so rebuilds keep every id."""
    return str(uuid.uuid5(POOL_ID_NAMESPACE, f"{source_dataset}:{synth_id}"))
