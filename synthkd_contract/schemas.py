"""The Arrow schema of every table the pipeline reads or writes, declared once.

Parquet files are written with exactly these schemas (any change changes the output bytes); the
Megatron trio is described as a table too, for the column view of the Dagster UI.
"""

from __future__ import annotations

from typing import Final

import pyarrow as pa

from synthkd_contract.constants import (
    ARRAY_DTYPES,
    ARRAY_KINDS,
    LOSSMASK_DTYPE,
    RAW_COLUMNS,
    RAW_INT_COLUMNS,
    SPAN_ANALYSIS,
    SPAN_DTYPE,
    SPAN_FINAL,
    SPAN_NAMES,
    TOKENS_DTYPE,
)
from synthkd_contract.near_dup import LSH_BANDS, NUM_PERM
from synthkd_contract.valuation import MARKER_COLUMNS, MODEL_FEATURE_COLUMNS, WINDOW_TOKENS_COLUMN

# a raw PleIAs/SYNTH shard as upstream publishes it (and the sample generator writes it); the harmonize
# step also accepts other text and number types per column (core/validation.py)
RAW_SCHEMA: Final = pa.schema(
    [pa.field(name, pa.int64() if name in RAW_INT_COLUMNS else pa.string()) for name in RAW_COLUMNS]
)

# synth_harmony, synth_filtered, synth_sampled: one row per conversation, messages as Harmony JSON
HARMONY_SCHEMA: Final = pa.schema(
    [
        ("synth_id", pa.string()),
        ("language", pa.string()),
        ("exercise", pa.string()),
        ("source_row", pa.int64()),
        ("messages_json", pa.string()),
        ("metadata_json", pa.string()),
    ]
)

# synth_tokenized: the rendered conversation and its label-aligned supervision arrays
TOKENIZED_SCHEMA: Final = pa.schema(
    [
        ("synth_id", pa.string()),
        ("language", pa.string()),
        ("exercise", pa.string()),
        ("source_row", pa.int64()),
        ("tokens", pa.list_(pa.from_numpy_dtype(TOKENS_DTYPE))),
        ("loss_mask", pa.list_(pa.from_numpy_dtype(LOSSMASK_DTYPE))),
        ("span_id", pa.list_(pa.from_numpy_dtype(SPAN_DTYPE))),
    ]
)

# synth_tokenized/<key>.rows.parquet: each synth_tokenized row's sizes, written with it (same rows, same order), so
# that the global steps needing only those (the quota plan, the manifest's length statistics) never decode the
# token lists: tokens in the conversation, and its label positions of span analysis and of span final
SPAN_SIZE_COLUMNS: Final = {span: f"{SPAN_NAMES[span]}_tokens" for span in (SPAN_ANALYSIS, SPAN_FINAL)}
# the footer key of the sha256 of the synth_tokenized file the row sizes describe: they are read only while it holds
ROWS_OF_SHA256_KEY: Final = "synthkd.rows_of_sha256"
TOKENIZED_ROWS_SCHEMA: Final = pa.schema(
    [
        ("synth_id", pa.string()),
        ("language", pa.string()),
        ("exercise", pa.string()),
        ("tokens", pa.int64()),
        *((column, pa.int64()) for column in SPAN_SIZE_COLUMNS.values()),
    ]
)

# synth_kd_v1 shards/shard_XX_documents.parquet: which synth_id is which document of which split
DOCUMENTS_SCHEMA: Final = pa.schema([("split", pa.string()), ("document_index", pa.int64()), ("synth_id", pa.string())])

# synth_kd_v1 as a table: one row per document, three aligned arrays (.bin/.idx IndexedDatasets)
TRIO_SCHEMA: Final = pa.schema([(kind, pa.list_(pa.from_numpy_dtype(ARRAY_DTYPES[kind]))) for kind in ARRAY_KINDS])
TRIO_COLUMN_DESCRIPTIONS: Final = {
    "tokens": "shard_XX_tokens.{bin,idx}: Harmony training render + EOD (the prefix Megatron is given)",
    "lossmask": "shard_XX_lossmask.{bin,idx}: 1 where the label is supervised (label-aligned)",
    "span": "shard_XX_span.{bin,idx}: 0 prompt / 1 analysis / 2 final (label-aligned)",
}

# synth_distill (001 "Output: training dataset schema"): DistillKit / TRL rows
DISTILL_SOURCE_TYPE: Final = pa.struct(
    [("dataset", pa.string()), ("synth_id", pa.string()), ("exercise", pa.string()), ("language", pa.string())]
)
DISTILL_SPANS_TYPE: Final = pa.struct(
    [
        ("assistant_token_start", pa.int32()),
        ("analysis_token_count", pa.int32()),
        ("final_token_count", pa.int32()),
    ]
)
DISTILL_SCHEMA: Final = pa.schema(
    [
        ("id", pa.string()),
        ("source", DISTILL_SOURCE_TYPE),
        ("input_ids", pa.list_(pa.int32())),
        ("labels", pa.list_(pa.int32())),
        ("attention_mask", pa.list_(pa.int8())),
        ("spans", DISTILL_SPANS_TYPE),
    ]
)

# synth_pool (docs/pool.md#what-the-pool-holds schema v0): one row per conversation the quota grid keeps; the columns
# nothing computes yet (scorer, embeddings, teacher statistics) are present and null; cluster_id / near_dup_hash come
# from synth_clusters, never a made-up number
TOKEN_RANGE_TYPE: Final = pa.struct([("start", pa.int32()), ("end", pa.int32())])  # [start, end) token indices
POOL_SCHEMA: Final = pa.schema(
    [
        ("id", pa.string()),
        ("source_dataset", pa.string()),
        ("source_subset", pa.string()),
        ("source_example_id", pa.string()),
        ("language", pa.string()),
        ("skill_bucket", pa.string()),
        ("ctx_bucket", pa.string()),
        ("messages", pa.string()),
        ("prompt_text", pa.string()),
        ("prompt_tokens_est", pa.int32()),
        ("sequence_tokens", pa.int32()),
        ("embedding", pa.list_(pa.float32())),
        ("cluster_id", pa.int64()),
        ("near_dup_hash", pa.string()),
        ("utility_score", pa.float64()),
        ("sampling_weight", pa.float64()),
        ("difficulty_proxy", pa.float64()),
        ("teacher_entropy", pa.float64()),
        ("teacher_margin", pa.float64()),
        ("student_teacher_kl", pa.float64()),
        ("lp_value", pa.float64()),
        ("analysis_span", pa.list_(TOKEN_RANGE_TYPE)),
        ("final_span", pa.list_(TOKEN_RANGE_TYPE)),
    ]
)
# the docs/pool.md#what-the-pool-holds columns the pool leaves null until a later step computes them
POOL_NULL_COLUMNS: Final = (
    "prompt_text",
    "embedding",
    "utility_score",
    "difficulty_proxy",
    "teacher_entropy",
    "teacher_margin",
    "student_teacher_kl",
    "lp_value",
)

# synth_valuation_features (docs/distillation.md#valuation-features): one row per pool row (its `id`, same order), the
# prompt-only features and the model features (null when no checkpoint is configured)
VALUATION_SCHEMA: Final = pa.schema(
    [
        ("id", pa.string()),
        ("skill_bucket", pa.string()),
        ("ctx_bucket", pa.string()),
        ("prompt_tokens", pa.int32()),
        *((column, pa.int32()) for column in MARKER_COLUMNS.values()),
        (WINDOW_TOKENS_COLUMN, pa.int32()),
        *((column, pa.float64()) for column in MODEL_FEATURE_COLUMNS),
    ]
)

# synth_signatures (docs/near-dup.md): one row per synth_filtered row, the MinHash signature of its normalized user
# prompt and its LSH band keys, one column per band so the clustering reads one band of every shard at a time
BAND_COLUMNS: Final = tuple(f"band_{band:02d}" for band in range(LSH_BANDS))
SIGNATURES_SCHEMA: Final = pa.schema(
    [
        ("synth_id", pa.string()),
        ("exercise", pa.string()),
        ("language", pa.string()),
        ("valid", pa.bool_()),  # the 000 split of the row (constants.SPLIT_RULE), for the cross-split check
        ("rank_key", pa.uint64()),  # salted hash of synth_id (near_dup.CLUSTER_SALT): orders a cluster's rows
        ("heldout_key", pa.uint64()),  # salted hash of synth_id (near_dup.HELDOUT_SALT): picks held-out clusters
        ("answer_form", pa.string()),  # core/filters.py expected_answer: number | mcq_letter | null
        ("near_dup_hash", pa.string()),  # the first band's key, hex: rows sharing it are LSH candidates
        ("signature", pa.list_(pa.uint32(), NUM_PERM)),
        *[(column, pa.uint64()) for column in BAND_COLUMNS],
    ]
)
# synth_clusters, per shard: every synth_filtered row's cluster and what the cap / held-out sets decided for it
CLUSTERS_SCHEMA: Final = pa.schema(
    [
        ("synth_id", pa.string()),
        ("cluster_id", pa.int64()),  # the smallest rank_key of the cluster (>> 1): the same on any shard layout
        ("cluster_size", pa.int32()),
        ("cluster_rank", pa.int32()),  # 0 .. size-1 by rank_key; a row is kept iff rank < max_per_cluster
        ("near_dup_hash", pa.string()),
        ("decision", pa.string()),  # null: kept; drops.DROP_CLUSTER_CAP or drops.DROP_HELDOUT
    ]
)
# the validation sets (docs/near-dup.md#validation-sets): heldout_kl.parquet and format_suite.parquet, one row per
# held-out cluster's representative; prompt_tokens is openai-harmony's render for completion (system + user, then the
# assistant's turn)
VALIDATION_SCHEMA: Final = pa.schema(
    [
        ("synth_id", pa.string()),
        ("exercise", pa.string()),
        ("language", pa.string()),
        ("cluster_id", pa.int64()),
        ("cluster_size", pa.int32()),
        ("prompt_messages", pa.string()),  # Harmony JSON: system + user
        ("prompt_tokens", pa.list_(pa.int32())),
        ("reference_messages", pa.string()),  # Harmony JSON: SYNTH's assistant analysis (if any) and final
        ("answer_form", pa.string()),  # number | mcq_letter | null (core/filters.py expected_answer)
        ("expected_answer", pa.string()),  # the checkable expectation, e.g. "12532" or "B"; null when none
    ]
)
