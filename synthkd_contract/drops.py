"""Why a row leaves the pipeline, or a value of a kept row is fixed: every reason named once, described once.

A reason is the key a step counts (`ShardReport.dropped` / `.sanitized`), the `reason` of an errors-log
line, a key of every manifest's `totals.dropped`, and the `dropped_<reason>` / `sanitized_<key>` metadata
Dagster plots. Code counts a reason through its constant here, never by spelling it.
"""

from __future__ import annotations

from typing import Final

from synthkd_contract.constants import (
    NUL_CLEANED_COLUMNS,
    NULL_DEFAULTS,
    RAW_STRING_COLUMNS,
    REQUIRED_TEXT_COLUMNS,
    SAMPLING_SALTS,
)

DROP_DESCRIPTIONS: Final[dict[str, str]] = {}
"""drop reason -> what it means, one line each (filled by the definitions below)."""

SANITIZED_DESCRIPTIONS: Final[dict[str, str]] = {}
"""sanitization key -> what was fixed, one line each (filled by the definitions below)."""


def _drop(reason: str, description: str) -> str:
    DROP_DESCRIPTIONS[reason] = description
    return reason


def _sanitized(key: str, description: str) -> str:
    SANITIZED_DESCRIPTIONS[key] = description
    return key


# --- synth_harmony: raw rows that cannot be rendered as they are (core/validation.py, core/stages.py) ---
DROP_MISSING: Final = {
    column: _drop(f"missing_{column}", f"{column} is null" + (" or blank" if column == "synth_id" else ""))
    for column in REQUIRED_TEXT_COLUMNS
}
DROP_INVALID_UTF8: Final = {
    column: _drop(f"invalid_utf8_{column}", f"{column} is stored as binary and is not valid UTF-8")
    for column in RAW_STRING_COLUMNS
}
DROP_NUL_IN_SYNTH_ID: Final = _drop(
    "nul_in_synth_id", 'synth_id holds NUL: an id is not text to clean ("a\\0b" would become another row\'s "ab")'
)
DROP_DUPLICATE_SYNTH_ID: Final = _drop("duplicate_synth_id", "a synth_id already kept earlier in the same shard")
DROP_SMOKE_CAP: Final = _drop("smoke_cap", "a row a smoke build did not read or write (its per-shard caps)")

# --- synth_filtered (001 "Filtering policy"), in the order they are tested: a row counts under the first ---
DROP_EMPTY_ANSWER: Final = _drop("empty_synthetic_answer", "`synthetic_answer.strip()` is empty")
DROP_RESULT_FAILED: Final = _drop("result_failed_after_max_attempts", "`result:Failed after maximum attempts`")
DROP_RESULT_INCONSISTENT: Final = _drop(
    "result_inconsistent_with_answer",
    "a `result:` of `constraints` is numerically or multiple-choice inconsistent with the answer's first line",
)

# --- synth_sampled, before the sampling rules (docs/near-dup.md; synth_clusters decides) -------------------------
DROP_CLUSTER_CAP: Final = _drop(
    "cluster_cap", "a near-duplicate cluster's row past its max_per_cluster (by the salted cluster_rank)"
)
DROP_HELDOUT: Final = _drop(
    "heldout", "a member of a cluster held out for the validation sets (never trained on, cluster-disjoint)"
)

# --- synth_sampled (001 "Exercise/language mixture"): one reason per sampling rule ------------------------
DROP_SAMPLED_OUT: Final = {
    rule: _drop(f"sampled_out_{rule}", f"not kept by the {rule} rule of the sampling plan") for rule in SAMPLING_SALTS
}

# --- synth_tokenized: conversations the v1 render cannot produce (core/render.py) ---------------------------
DROP_TOKENIZER_ERROR: Final = _drop("tokenizer_error", "the tokenizer could not encode a message's text")
DROP_HARMONY_RENDER_ERROR: Final = _drop("harmony_render_error", "openai-harmony could not render the conversation")
DROP_UNSUPPORTED_CHANNEL: Final = _drop("unsupported_assistant_channel", "an assistant channel with no v1 span")
DROP_MESSAGE_BOUNDARY_MISMATCH: Final = _drop(
    "message_boundary_mismatch", "the render does not open each message with exactly one <|start|>, in order"
)

# --- synth_distill ------------------------------------------------------------------------------------------
DROP_OVER_MAX_SEQ_LEN: Final = _drop("over_max_seq_len", "longer than max_seq_len tokens (DistillKit output only)")

# --- synth_pool (docs/pool.md#the-quota-grid-on-tokens): the B x C token quota grid -----------------------------------
DROP_OVER_QUOTA: Final = _drop("over_quota", "not kept by the B x C token quota grid (synth_pool only)")
DROP_OVER_SOURCE_SHARE: Final = _drop(
    "over_source_share", "not kept by the source mix: its source's share of the pool's tokens (synth_pool only)"
)

# --- artifact_harmony: rows of the synth_harmony_v1 artifact (synthkd_assets/core/harmony_artifact.py) ------------
DROP_ARTIFACT_MESSAGES: Final = _drop(
    "artifact_messages_invalid",
    "an artifact row whose messages_json is not the artifact's shape (not JSON, an unknown role or content type, a "
    "text holding NUL, no final answer last); the errors log says which",
)

# --- source_harmony: another dataset's rows -> Harmony (synthkd_assets/core/sources/, docs/sources.md) -------
DROP_INVALID_JSON_LINE: Final = _drop(
    "invalid_json_line", "a JSONL line that is not one JSON object of Unicode text (a lone surrogate escape is not)"
)
DROP_WRONG_TYPE: Final = _drop("wrong_type", "a JSONL field whose value is not of the type the dataset publishes")
DROP_MISSING_SOURCE_ID: Final = _drop("missing_source_id", "the dataset's own example id is null or blank")
DROP_EMPTY_CONVERSATION: Final = _drop("empty_conversation", "a row with no turn at all (null or empty messages)")
DROP_UNSUPPORTED_ROLE: Final = _drop(
    "unsupported_role", "a turn whose role is not user / assistant (a leading system turn excepted), e.g. tool"
)
DROP_EMPTY_TURN: Final = _drop("empty_turn", "a turn whose text is null, empty or whitespace only (NULs removed)")
DROP_UNTERMINATED_THINK: Final = _drop(
    "unterminated_think", "an assistant turn opening with `<think>` that never closes it (a truncated reasoning trace)"
)
DROP_BAD_TURN_ORDER: Final = _drop(
    "bad_turn_order", "turns that do not alternate user / assistant from a user turn to an assistant turn"
)
DROP_NO_REFERENCE_ANSWER: Final = _drop(
    "no_reference_answer", "a prompt the dataset gives no assistant response for (nothing to train on)"
)
DROP_DELETED_MESSAGE: Final = _drop("deleted_message", "an oasst1 message marked deleted")
DROP_FAILED_REVIEW: Final = _drop("failed_review", "an oasst1 message whose review_result is false")
DROP_TREE_NOT_READY: Final = _drop("tree_not_ready", "an oasst1 message of a tree whose tree_state is not exported")
DROP_ORPHAN_MESSAGE: Final = _drop(
    "orphan_message", "an oasst1 message whose parent is absent or dropped (its tree does not reach it)"
)
DROP_BROKEN_TREE: Final = _drop(
    "broken_tree",
    "an oasst1 message that breaks its tree: a root that is not a prompter or one of a message_tree_id's several "
    "roots, a child with its parent's role or of another message_tree_id",
)
DROP_OFF_BEST_PATH: Final = _drop(
    "off_best_path", "an oasst1 message not on its tree's conversation (the best-ranked path, docs/sources.md)"
)
DROP_FOLDED_INTO_CONVERSATION: Final = _drop(
    "folded_into_conversation", "an oasst1 message that is history of its tree's conversation, not a row of its own"
)

# --- what the harmony step fixes in rows it keeps (counted, the rows stay) -------------------------------------
SANITIZED_NUL_IN: Final = {
    column: _sanitized(f"nul_in_{column}", f"NUL characters removed from {column}") for column in NUL_CLEANED_COLUMNS
}
SANITIZED_NULL: Final = {
    column: _sanitized(f"null_{column}", f"a null {column} became {default!r}")
    for column, default in NULL_DEFAULTS.items()
}
SANITIZED_INVALID_WORDS: Final = _sanitized(
    "invalid_words", "`words` not a whole number >= 0 (in no output, only counted)"
)

SANITIZED_NUL_IN_TURN_TEXT: Final = _sanitized("nul_in_turn_text", "NUL characters removed from an anchor row's turns")
SANITIZED_SOURCE_SYSTEM_TURN: Final = _sanitized(
    "source_system_turn_removed", "an anchor row's leading system turn removed (the run's system message is fixed)"
)

# --- every reason, by the step that counts it ------------------------------------------------------------------
# each step's metadata reports all of its reasons, 0 when none applied, so plots over time have no gaps
DROP_REASONS_BY_STEP: Final = {
    "synth_harmony": (
        *DROP_MISSING.values(),
        *DROP_INVALID_UTF8.values(),
        DROP_NUL_IN_SYNTH_ID,
        DROP_DUPLICATE_SYNTH_ID,
        DROP_SMOKE_CAP,
    ),
    "synth_filtered": (DROP_EMPTY_ANSWER, DROP_RESULT_FAILED, DROP_RESULT_INCONSISTENT),
    "synth_sampled": (DROP_CLUSTER_CAP, DROP_HELDOUT, *DROP_SAMPLED_OUT.values()),
    "synth_tokenized": (
        DROP_TOKENIZER_ERROR,
        DROP_HARMONY_RENDER_ERROR,
        DROP_UNSUPPORTED_CHANNEL,
        DROP_MESSAGE_BOUNDARY_MISMATCH,
    ),
    "synth_kd_v1": (DROP_SMOKE_CAP,),
    "synth_distill": (DROP_OVER_MAX_SEQ_LEN, DROP_SMOKE_CAP),
    "synth_pool": (DROP_OVER_QUOTA, DROP_OVER_SOURCE_SHARE, DROP_SMOKE_CAP),
    "artifact_harmony": (
        DROP_MISSING["synth_id"],
        DROP_NUL_IN_SYNTH_ID,
        DROP_DUPLICATE_SYNTH_ID,
        DROP_ARTIFACT_MESSAGES,
        DROP_SMOKE_CAP,
    ),
    "source_harmony": (
        DROP_INVALID_JSON_LINE,
        DROP_WRONG_TYPE,
        DROP_MISSING_SOURCE_ID,
        DROP_DELETED_MESSAGE,
        DROP_FAILED_REVIEW,
        DROP_TREE_NOT_READY,
        DROP_BROKEN_TREE,
        DROP_ORPHAN_MESSAGE,
        DROP_OFF_BEST_PATH,
        DROP_FOLDED_INTO_CONVERSATION,
        DROP_NO_REFERENCE_ANSWER,
        DROP_EMPTY_CONVERSATION,
        DROP_UNSUPPORTED_ROLE,
        DROP_EMPTY_TURN,
        DROP_UNTERMINATED_THINK,
        DROP_BAD_TURN_ORDER,
        DROP_NUL_IN_SYNTH_ID,
        DROP_DUPLICATE_SYNTH_ID,
        DROP_SMOKE_CAP,
    ),
}
# what the harmony step sanitizes (kept rows, counted)
SANITIZED_KEYS: Final = (*SANITIZED_NUL_IN.values(), *SANITIZED_NULL.values(), SANITIZED_INVALID_WORDS)
# what artifact_harmony sanitizes: a null language or exercise defaulted as raw SYNTH's
ARTIFACT_SANITIZED_KEYS: Final = (SANITIZED_NULL["language"], SANITIZED_NULL["exercise"])
# what source_harmony sanitizes (a tuple of its own: SANITIZED_KEYS enters synth_harmony's code version)
SOURCE_SANITIZED_KEYS: Final = (SANITIZED_NUL_IN_TURN_TEXT, SANITIZED_SOURCE_SYSTEM_TURN)
