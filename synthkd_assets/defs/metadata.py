"""Shard reports -> Dagster metadata: flat numbers the UI plots over time, tables for mixes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg

from synthkd_assets.core.manifest import sha256_file


def mix_table(counts: dict[str, int], label: str) -> dg.MetadataValue:
    total = sum(counts.values()) or 1
    rows = [f"| {name} | {n} | {100 * n / total:.1f}% |" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return dg.MetadataValue.md("\n".join([f"| {label} | rows | share |", "|---|---:|---:|", *rows]))


def report_metadata(report: dict[str, Any]) -> dict[str, Any]:
    """rows in/out, drops and sanitizations by reason, tokens per span, sequences per split, mixes."""
    metadata: dict[str, Any] = {
        "rows_in": report["rows_in"],
        "rows_out": report["rows_out"],
        "rows_dropped": sum(report["dropped"].values()),
    }
    metadata.update({f"dropped_{reason}": n for reason, n in report["dropped"].items()})
    metadata.update({f"sanitized_{what}": n for what, n in report["sanitized"].items()})
    metadata.update({f"tokens_{span}": n for span, n in report["span_tokens"].items()})
    metadata.update({f"sequences_{split}": n for split, n in report["sequences"].items()})
    metadata.update({f"rendered_{path}": n for path, n in report.get("render_path", {}).items()})
    if report["language"]:
        metadata["language_mix"] = mix_table(report["language"], "language")
    if report["exercise"]:
        metadata["exercise_mix"] = mix_table(report["exercise"], "exercise")
    return metadata


def files_metadata(paths: list[Path]) -> dict[str, Any]:
    """bytes written and the sha256 of every file, so a later edit is visible against the UI."""
    existing = [p for p in paths if p.is_file()]
    return {
        "bytes_written": sum(p.stat().st_size for p in existing),
        "files_sha256": dg.MetadataValue.json({p.name: sha256_file(p) for p in existing}),
    }
