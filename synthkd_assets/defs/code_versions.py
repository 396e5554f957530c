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

from synthkd_assets import contracts
from synthkd_assets.core.distill_io import DISTILL_SCHEMA
from synthkd_assets.core.filters import filter_config
from synthkd_assets.core.inventory import RAW_GLOB
from synthkd_assets.core.manifest import config_hash
from synthkd_assets.core.render import RENDER_CONFIG
from synthkd_assets.core.sampling import RULE_ORDER
from synthkd_assets.core.stages import DOCUMENTS_SCHEMA, HARMONY_SCHEMA, REQUIRED_TEXT, TOKENIZED_SCHEMA
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.defs.resources import SynthKDBuildConfig

CODE_VERSION_DIGITS = 16  # of the sha256: enough to tell versions apart, short enough to read in the UI

RULE_VERSIONS = {
    "o200k_tokenizer": "1",
    "synth_raw_inventory": "1",
    "synth_harmony": "1",
    "synth_harmony_manifest": "1",
    "synth_filtered": "1",
    "synth_sampling_plan": "1",
    "synth_sampled": "1",
    "synth_tokenized": "1",
    "synth_kd_v1": "1",
    "synth_kd_v1_manifest": "1",
    "synth_distill": "1",
    "synth_distill_manifest": "1",
}


def _sampling_rule() -> dict[str, Any]:
    return {
        "salts": contracts.SAMPLING_SALTS,
        "rule_order": RULE_ORDER,
        "memorization_exercise": contracts.MEMORIZATION_EXERCISE,
        "english_language": contracts.ENGLISH_LANGUAGE,
    }


def rule_slices() -> dict[str, dict[str, Any]]:
    """What each asset's own bytes depend on besides its code, read when called (a changed constant shows)."""
    smoke_caps = dataclasses.asdict(SynthKDBuildConfig(smoke=True).caps())
    return {
        "o200k_tokenizer": {
            "file": contracts.TOKENIZER_FILENAME,
            "sha256": contracts.TOKENIZER_SHA256,
            "source": [contracts.TOKENIZER_SOURCE_PACKAGE, contracts.TOKENIZER_SOURCE_RESOURCE],
        },
        "synth_raw_inventory": {"raw_glob": RAW_GLOB},
        "synth_harmony": {
            "raw_columns": contracts.RAW_COLUMNS,
            "required_text": REQUIRED_TEXT,
            "schema": HARMONY_SCHEMA.to_string(),
            "source_dataset": contracts.SOURCE_DATASET,
            "user_template": contracts.USER_TEMPLATE,
            "system_message": system_message_dict(),
            "drop_reasons": contracts.DROP_REASONS_BY_STEP["synth_harmony"],
            "sanitized": contracts.SANITIZED_KEYS,
            "smoke_input_rows": smoke_caps["max_input_rows"],
        },
        "synth_harmony_manifest": {
            "schema": contracts.HARMONY_SCHEMA_NAME,
            "source_dataset": contracts.SOURCE_DATASET,
            "user_template": contracts.USER_TEMPLATE,
            "system_message": system_message_dict(),
        },
        "synth_filtered": filter_config(),
        "synth_sampling_plan": {
            **_sampling_rule(),
            "default_targets": [
                contracts.MEMORIZATION_CAP,
                contracts.NON_ENGLISH_MIN,
                contracts.NON_ENGLISH_MAX,
                contracts.GLOBAL_KEEP,
            ],
        },
        "synth_sampled": {**_sampling_rule(), "drop_reasons": contracts.DROP_SAMPLED_OUT},
        "synth_tokenized": {
            "tokenizer_sha256": contracts.TOKENIZER_SHA256,
            "encoding": contracts.HARMONY_ENCODING_NAME,
            "render": repr(RENDER_CONFIG),
            "span_ids": contracts.SPAN_NAMES,
            "channel_spans": contracts.CHANNEL_TO_SPAN,
            "eod": contracts.EOD_TOKEN_ID,
            "schema": TOKENIZED_SCHEMA.to_string(),
        },
        "synth_kd_v1": {
            "dataset": [contracts.DATASET_NAME, contracts.SMOKE_DATASET_NAME],
            "splits": contracts.SPLITS,
            "split_salt": contracts.SPLIT_SALT,
            "valid_fraction": contracts.VALID_FRACTION,
            "arrays": {kind: str(dtype) for kind, dtype in contracts.ARRAY_DTYPES.items()},
            "documents_schema": DOCUMENTS_SCHEMA.to_string(),
            "smoke_caps": smoke_caps,
        },
        "synth_kd_v1_manifest": {"split_rule": contracts.SPLIT_RULE, "file": contracts.MANIFEST_FILENAME},
        "synth_distill": {
            "dataset": [contracts.DISTILL_DATASET_NAME, contracts.DISTILL_SMOKE_DATASET_NAME],
            "schema": DISTILL_SCHEMA.to_string(show_schema_metadata=False),
            "splits": contracts.DISTILL_SPLITS,
            "split_salt": contracts.DISTILL_SPLIT_SALT,
            "default_valid_fraction": contracts.DISTILL_VALID_FRACTION,
            "id_prefix": contracts.DISTILL_ID_PREFIX,
            "default_max_seq_len": contracts.MAX_SEQ_LEN,
            "label_ignore_id": contracts.LABEL_IGNORE_ID,
            "drop_reasons": contracts.DROP_REASONS_BY_STEP["synth_distill"],
            "smoke_caps": smoke_caps,
        },
        "synth_distill_manifest": {
            "split_rule": contracts.SPLIT_RULE,
            "file": contracts.MANIFEST_FILENAME,
            "encoding_errors_log": contracts.DISTILL_ENCODING_ERRORS_FILENAME,
        },
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
