"""Each asset's `code_version`: a hash of its rule version and of the contract constants and default config its
own bytes depend on, so that Dagster's staleness shows exactly which assets a rule change affects.

Dagster marks an asset stale when its code version differs from the one its latest materialization recorded;
its descendants follow once it is rebuilt (a new data version). A slice lists only what the asset itself
turns into bytes: the manifests do not repeat their upstream rules, which reach them through data versions.
Bump an asset's `RULE_VERSIONS` entry when its code changes the bytes it writes; a changed constant of its
slice moves its code version by itself. The manifests record none of this (their bytes do not depend on it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import dagster as dg

from synthkd_assets.core.filters import filter_config
from synthkd_assets.core.inventory import RAW_GLOB
from synthkd_assets.core.layout import VALIDATION_NAME
from synthkd_assets.core.manifest import config_hash
from synthkd_assets.core.near_dup import USER_PROMPT_PATH, ClusterSettings
from synthkd_assets.core.render import RENDER_CONFIG
from synthkd_assets.core.sampling import RULE_ORDER
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.core.valuation import feature_config
from synthkd_assets.defs.resources import SynthKDBuildConfig
from synthkd_contract import buckets, constants, drops, near_dup
from synthkd_contract.schemas import (
    CLUSTERS_SCHEMA,
    DISTILL_SCHEMA,
    DOCUMENTS_SCHEMA,
    HARMONY_SCHEMA,
    POOL_SCHEMA,
    SIGNATURES_SCHEMA,
    TOKENIZED_SCHEMA,
    VALIDATION_SCHEMA,
)

CODE_VERSION_DIGITS = 16  # of the sha256: enough to tell versions apart, short enough to read in the UI

RULE_VERSIONS = {
    "o200k_tokenizer": "1",
    "synth_raw_inventory": "1",
    "synth_harmony": "1",
    "synth_harmony_manifest": "1",
    "synth_filtered": "2",
    "synth_signatures": "1",
    "synth_clusters": "1",
    "synth_validation_sets": "1",
    "synth_sampling_plan": "3",
    "synth_sampled": "3",
    "synth_tokenized": "3",
    "synth_kd_v1": "1",
    "synth_kd_v1_manifest": "1",
    "synth_distill": "1",
    "synth_distill_manifest": "1",
    "synth_quota_plan": "2",
    "synth_pool": "3",
    "synth_curriculum": "1",
    "synth_pool_manifest": "1",
    "synth_valuation_features": "1",
}


def _sampling_rule() -> dict[str, Any]:
    return {
        "salts": constants.SAMPLING_SALTS,
        "rule_order": RULE_ORDER,
        "memorization_exercise": constants.MEMORIZATION_EXERCISE,
        "english_language": constants.ENGLISH_LANGUAGE,
    }


def _bucket_tables() -> dict[str, Any]:
    return {
        "exercise_skill_bucket": buckets.EXERCISE_SKILL_BUCKET,
        "ctx_bucket_max_tokens": buckets.CTX_BUCKET_MAX_TOKENS,
    }


def rule_slices() -> dict[str, dict[str, Any]]:
    """What each asset's own bytes depend on besides its code, read when called (a changed constant shows)."""
    smoke_caps = dataclasses.asdict(SynthKDBuildConfig(smoke=True).caps())
    return {
        "o200k_tokenizer": {
            "file": constants.TOKENIZER_FILENAME,
            "sha256": constants.TOKENIZER_SHA256,
            "source": [constants.TOKENIZER_SOURCE_PACKAGE, constants.TOKENIZER_SOURCE_RESOURCE],
        },
        "synth_raw_inventory": {"raw_glob": RAW_GLOB},
        "synth_harmony": {
            "raw_columns": constants.RAW_COLUMNS,
            "required_text": constants.REQUIRED_TEXT_COLUMNS,
            "schema": HARMONY_SCHEMA.to_string(),
            "source_dataset": constants.SOURCE_DATASET,
            "user_template": constants.USER_TEMPLATE,
            "system_message": system_message_dict(),
            "drop_reasons": drops.DROP_REASONS_BY_STEP["synth_harmony"],
            "exercise_skill_bucket": buckets.EXERCISE_SKILL_BUCKET,
            "sanitized": drops.SANITIZED_KEYS,
            "smoke_input_rows": smoke_caps["max_input_rows"],
        },
        "synth_harmony_manifest": {
            "schema": constants.HARMONY_SCHEMA_NAME,
            "source_dataset": constants.SOURCE_DATASET,
            "user_template": constants.USER_TEMPLATE,
            "system_message": system_message_dict(),
        },
        "synth_filtered": filter_config(),
        "synth_sampling_plan": {
            **_sampling_rule(),
            "default_targets": [
                constants.MEMORIZATION_CAP,
                constants.NON_ENGLISH_MIN,
                constants.NON_ENGLISH_MAX,
                constants.GLOBAL_KEEP,
            ],
        },
        "synth_sampled": {**_sampling_rule(), "drop_reasons": drops.DROP_REASONS_BY_STEP["synth_sampled"]},
        "synth_signatures": {
            "schema": SIGNATURES_SCHEMA.to_string(),
            "prompt": USER_PROMPT_PATH,
            "minhash": ClusterSettings().to_dict(),
            "split_salt": constants.SPLIT_SALT,
            "valid_fraction": constants.VALID_FRACTION,
        },
        "synth_clusters": {
            "schema": CLUSTERS_SCHEMA.to_string(),
            "defaults": ClusterSettings().to_dict(),
            "large_cluster_share": near_dup.LARGE_CLUSTER_SHARE,
        },
        "synth_validation_sets": {"schema": VALIDATION_SCHEMA.to_string(), "name": VALIDATION_NAME},
        "synth_tokenized": {
            "tokenizer_sha256": constants.TOKENIZER_SHA256,
            "encoding": constants.HARMONY_ENCODING_NAME,
            "render": repr(RENDER_CONFIG),
            "span_ids": constants.SPAN_NAMES,
            "channel_spans": constants.CHANNEL_TO_SPAN,
            "eod": constants.EOD_TOKEN_ID,
            "schema": TOKENIZED_SCHEMA.to_string(),
            "buckets": _bucket_tables(),
        },
        "synth_kd_v1": {
            "dataset": [constants.DATASET_NAME, constants.SMOKE_DATASET_NAME],
            "splits": constants.SPLITS,
            "split_salt": constants.SPLIT_SALT,
            "valid_fraction": constants.VALID_FRACTION,
            "arrays": {kind: str(dtype) for kind, dtype in constants.ARRAY_DTYPES.items()},
            "documents_schema": DOCUMENTS_SCHEMA.to_string(),
            "smoke_caps": smoke_caps,
        },
        "synth_kd_v1_manifest": {"split_rule": constants.SPLIT_RULE, "file": constants.MANIFEST_FILENAME},
        "synth_distill": {
            "dataset": [constants.DISTILL_DATASET_NAME, constants.DISTILL_SMOKE_DATASET_NAME],
            "schema": DISTILL_SCHEMA.to_string(show_schema_metadata=False),
            "splits": constants.DISTILL_SPLITS,
            "split_salt": constants.DISTILL_SPLIT_SALT,
            "default_valid_fraction": constants.DISTILL_VALID_FRACTION,
            "id_prefix": constants.DISTILL_ID_PREFIX,
            "default_max_seq_len": constants.MAX_SEQ_LEN,
            "label_ignore_id": constants.LABEL_IGNORE_ID,
            "drop_reasons": drops.DROP_REASONS_BY_STEP["synth_distill"],
            "smoke_caps": smoke_caps,
        },
        "synth_distill_manifest": {
            "split_rule": constants.SPLIT_RULE,
            "file": constants.MANIFEST_FILENAME,
            "encoding_errors_log": constants.DISTILL_ENCODING_ERRORS_FILENAME,
        },
        "synth_quota_plan": {
            **_bucket_tables(),
            "salt": buckets.QUOTA_SALT,
            "default_mix": buckets.SKILL_MIX,
        },
        "synth_pool": {
            **_bucket_tables(),
            "dataset": [buckets.POOL_DATASET_NAME, buckets.POOL_SMOKE_DATASET_NAME],
            "schema": POOL_SCHEMA.to_string(show_schema_metadata=False),
            "id_namespace": str(buckets.POOL_ID_NAMESPACE),
            "salt": buckets.QUOTA_SALT,
            "split_salt": constants.SPLIT_SALT,
            "valid_fraction": constants.VALID_FRACTION,
            "drop_reasons": drops.DROP_REASONS_BY_STEP["synth_pool"],
            "smoke_caps": smoke_caps,
        },
        "synth_curriculum": {"default_stages": buckets.CURRICULUM_STAGES},
        "synth_pool_manifest": {
            "dataset": [buckets.POOL_DATASET_NAME, buckets.POOL_SMOKE_DATASET_NAME],
            "split_rule": constants.SPLIT_RULE,
            "file": constants.MANIFEST_FILENAME,
        },
        # the markers, columns and default window; the checkpoints are run config (their sha256 is in the metadata)
        "synth_valuation_features": feature_config(),
    }


def code_versions() -> dict[str, str]:
    """`<rule version>-<hash of the slice>` per asset name."""
    slices = rule_slices()
    return {name: f"{RULE_VERSIONS[name]}-{config_hash(slices[name])[:CODE_VERSION_DIGITS]}" for name in RULE_VERSIONS}


def with_code_versions(assets: Sequence[dg.AssetsDefinition | dg.AssetSpec]) -> list:
    """`assets` with each executable asset's code version set from `code_versions()` (external specs as they are)."""
    versions = code_versions()

    def versioned(spec: dg.AssetSpec) -> dg.AssetSpec:
        name = spec.key.to_user_string()
        return spec.replace_attributes(code_version=versions[name]) if name in versions else spec

    return [
        dg.map_asset_specs(versioned, [asset])[0] if isinstance(asset, dg.AssetsDefinition) else asset
        for asset in assets
    ]
