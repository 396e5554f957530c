#!/usr/bin/env python3
"""Seed 001's canonical build command: PleIAs/SYNTH shards -> the DistillKit/TRL Parquet dataset.

    python3 scripts/build_synth_distill.py --input-dir /path/to/pleias_synth --output-dir /path/to/synth_distill

It runs the project's Dagster assets in-process (`dagster.materialize`), in the order scripts/build.sh uses:
tokenizer + raw inventory (one partition per input file), the scan pass per shard (synth_harmony,
synth_filtered), the sampling plan, the build pass per shard (synth_sampled, synth_tokenized,
synth_distill) and the manifests, with every blocking check. There is no second code path. The instance is
DAGSTER_HOME's when that is set, else an ephemeral one; intermediate stages go to --work-dir.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


class DefaultsShown(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, but not "None" where the help already says what unset means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    # project imports wait for __main__ to put the repository on sys.path (runnable installed or not)
    from synthkd_contract import constants

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=DefaultsShown)
    parser.add_argument("--input-dir", type=Path, required=True, help="directory of raw PleIAs/SYNTH *.parquet shards")
    parser.add_argument(
        "--output-dir", type=Path, required=True, help="DistillKit dataset root (train/, validation/, manifest.json)"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        help="intermediate stages, tokenizer, reports and error logs (default: <output-dir>.work)",
    )
    parser.add_argument(
        "--max-seq-len", type=int, default=constants.MAX_SEQ_LEN, help="drop (and count) longer conversations"
    )
    parser.add_argument(
        "--global-keep",
        type=float,
        default=constants.GLOBAL_KEEP,
        help="uniform deterministic keep rate (token budgets)",
    )
    parser.add_argument(
        "--valid-fraction", type=float, default=constants.DISTILL_VALID_FRACTION, help="validation split fraction"
    )
    parser.add_argument(
        "--memorization-cap",
        type=float,
        default=constants.MEMORIZATION_CAP,
        help="max share of exercise == memorization",
    )
    parser.add_argument(
        "--non-english-min",
        type=float,
        default=constants.NON_ENGLISH_MIN,
        help="min non-English share, opt-in: English rows are sampled down to reach it (0: never)",
    )
    parser.add_argument(
        "--non-english-max", type=float, default=constants.NON_ENGLISH_MAX, help="max non-English share"
    )
    parser.add_argument(
        "--encoding-errors-log",
        type=Path,
        help="JSON-lines sample of Harmony render failures (default: <work-dir>/errors/...)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=(
            "read the first 256 rows of each shard, write at most 64 conversations / 200k tokens per shard:"
            " a quick end-to-end run"
        ),
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # dagster and the graph load only after the arguments are valid, so --help and usage errors answer at once
    import dagster as dg
    from tqdm import tqdm

    from synthkd_assets.cli import distill_summary_lines
    from synthkd_assets.core.buildlock import BuildLockHeld
    from synthkd_assets.defs.build import BuildFailed, BuildProgress, build_all
    from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout

    output_dir = args.output_dir.resolve()
    work_dir = (args.work_dir or output_dir.with_name(output_dir.name + ".work")).resolve()
    try:
        layout = SynthKDLayout(
            raw_dir=str(args.input_dir.resolve()),
            data_dir=str(work_dir),
            distill_dir=str(output_dir),
            encoding_errors_log=str(args.encoding_errors_log.resolve()) if args.encoding_errors_log else None,
        )
        build = SynthKDBuildConfig(
            smoke=args.smoke,
            max_seq_len=args.max_seq_len,
            global_keep=args.global_keep,
            distill_valid_fraction=args.valid_fraction,
            memorization_cap=args.memorization_cap,
            non_english_min=args.non_english_min,
            non_english_max=args.non_english_max,
        )
        build.targets()  # validates the mixture targets before any work
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if not args.input_dir.is_dir():
        print(f"error: --input-dir {args.input_dir} is not a directory", file=sys.stderr)
        return 2
    logging.getLogger("dagster").setLevel(logging.WARNING)
    descriptions = {"scan": "scan: harmony + filters", "build": "build: sample + tokenize + distill"}

    class Bars(BuildProgress):
        """A progress bar per shard pass."""

        def pass_started(self, build_pass, keys):
            if build_pass.per_shard:
                self.bar = tqdm(total=len(keys), desc=descriptions[build_pass.name], unit="shard", file=sys.stderr)

        def shard_done(self, build_pass, key, seconds):
            self.bar.update()

        def pass_done(self, build_pass, seconds):
            if build_pass.per_shard:
                self.bar.close()

    instance = dg.DagsterInstance.get() if os.environ.get("DAGSTER_HOME") else dg.DagsterInstance.ephemeral()
    with instance:
        if not any(args.input_dir.glob("*.parquet")):
            print(f"error: no *.parquet shards in {args.input_dir}", file=sys.stderr)
            return 1
        try:
            build_all(
                instance,
                layout,
                build,
                outputs=["synth_distill"],
                progress=Bars(),
                run_config=QUIET,
                tags={"synthkd/cli": "build_synth_distill"},
            )
        except BuildFailed as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        except BuildLockHeld as error:
            print(f"error: {error}", file=sys.stderr)
            return 75
    manifest = json.loads(layout.data_layout(build.smoke).distill_manifest().read_text())
    print("\n".join(distill_summary_lines(manifest)))
    print(f"intermediate stages, reports and error logs (relative paths above are under it): {work_dir}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO_ROOT))  # runnable from anywhere, installed or not
    sys.exit(main())
