"""Anchor-source adapters (seed 002 "Global source mix", issue #21): one module per dataset, mapping its shards
as published to synth_harmony_v1 rows. `ADAPTERS` is the registry, source key -> adapter; the shared mechanics
are base.py (`harmonize_source`); how to add a source: docs/sources.md."""

from __future__ import annotations

from synthkd_assets.core.sources import (
    anthropic_helpfulness,
    competition_math,
    deepcoder,
    hendrycks_math,
    nemotron_math_v2,
    oasst1,
    opencodeinstruct,
    ultrachat_200k,
)
from synthkd_assets.core.sources.base import SourceAdapter, SourceResult, harmonize_source

ADAPTERS: dict[str, SourceAdapter] = {
    module.SPEC.key: module.ADAPTER
    for module in (
        nemotron_math_v2,
        hendrycks_math,
        competition_math,
        opencodeinstruct,
        deepcoder,
        ultrachat_200k,
        oasst1,
        anthropic_helpfulness,
    )
}


def source_adapter(source: str) -> SourceAdapter:
    """The adapter of a declared source key; KeyError naming the registry for one without."""
    try:
        return ADAPTERS[source]
    except KeyError:
        raise KeyError(
            f"source {source!r} has no adapter in synthkd_assets/core/sources/__init__.py ADAPTERS"
        ) from None


__all__ = ["ADAPTERS", "SourceAdapter", "SourceResult", "harmonize_source", "source_adapter"]
