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
