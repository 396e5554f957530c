"""Small helpers for the build script: list registered shard partitions, print a build summary."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from synthkd_assets import contracts


def list_partitions() -> list[str]:
    import dagster as dg

    from synthkd_assets.defs.partitions import SYNTH_SHARDS

    with dg.DagsterInstance.get() as instance:
        return list(instance.get_dynamic_partitions(SYNTH_SHARDS.name))


def summary_lines(manifest: dict) -> list[str]:
    if manifest.get("dataset") == contracts.DISTILL_DATASET_NAME:
        return distill_summary_lines(manifest)
    totals = manifest["totals"]
    lines = [
        f"{manifest['dataset']}: {len(manifest['shards'])} shards, config {manifest['config_hash'][:12]}, git {manifest['git_sha'][:12]}",
        f"rows in: {totals['rows_in']}   rows written: {totals['rows_out']}",
        "sequences per split: " + ", ".join(f"{s}={totals['sequences'].get(s, 0)}" for s in contracts.SPLITS),
        "tokens per span: " + ", ".join(f"{n}={totals['span_tokens'].get(n, 0)}" for n in contracts.SPAN_NAMES.values()),
        "drops by reason: " + (", ".join(f"{k}={v}" for k, v in totals["dropped"].items()) or "none"),
        "sanitized: " + (", ".join(f"{k}={v}" for k, v in totals["sanitized"].items()) or "none"),
        f"bytes: {totals['bytes']}",
    ]
    return lines


def distill_summary_lines(manifest: dict) -> list[str]:
    totals, sampling = manifest["totals"], manifest["sampling"]
    before, achieved = sampling["before"], sampling["achieved_after"]
    lengths = manifest["token_lengths"]
    return [
        f"{manifest['name']}: {len(manifest['shards'])} shards, config {manifest['config_hash'][:12]}, git {manifest['git_sha'][:12]}",
        f"rows in: {totals['rows_in']}   rows written: {totals['rows_out']} ("
        + ", ".join(f"{s}={totals['rows_per_split'].get(s, 0)}" for s in contracts.DISTILL_SPLITS)
        + ")",
        "sampling rates: " + ", ".join(f"{rule}={rate:.4g}" for rule, rate in sampling["rates"].items())
        + (" (targets met in expectation)" if sampling["feasible"] else f" (targets NOT reachable: {sampling['notes']})"),
        f"mix before -> after: memorization {100 * before['memorization_share']:.1f}% -> {100 * achieved['memorization_share']:.1f}%, "
        f"non-English {100 * before['non_english_share']:.1f}% -> {100 * achieved['non_english_share']:.1f}%",
        *(
            f"{split} tokens: " + " ".join(f"{k}={lengths[split][k]}" for k in ("min", "p50", "p90", "p99", "max"))
            for split in contracts.DISTILL_SPLITS
        ),
        "drops by reason: " + (", ".join(f"{k}={v}" for k, v in totals["dropped"].items()) or "none"),
        f"render failures logged: {manifest['encoding_errors_log']['records']} ({manifest['encoding_errors_log']['path']})",
        f"bytes: {totals['bytes']}",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m synthkd_assets.cli")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("partitions", help="registered synth_shards partition keys, one per line")
    summary = sub.add_parser("summary", help="print the summary of a built dataset manifest")
    summary.add_argument("--manifest", type=Path, default=Path("data/megatron") / contracts.DATASET_NAME / contracts.MANIFEST_FILENAME)
    args = parser.parse_args(argv)
    if args.command == "partitions":
        print("\n".join(list_partitions()))
    else:
        print("\n".join(summary_lines(json.loads(args.manifest.read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
