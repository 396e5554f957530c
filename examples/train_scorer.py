"""Train the per-skill-bucket prompt scorer (seed 002 §8.2) on the pool's valuation features and LP labels.

    python examples/train_online_kd.py --teacher-checkpoint teacher/ --steps 40 \
        --lp-every 2 --lp-candidates 4 --lp-output lp.parquet          # labels of pool rows
    python examples/train_scorer.py --labels lp.parquet --output scorer/ --scored scored.parquet

Reads every part of the valuation features (`synth_valuation_features`, keyed by pool `id`) after verifying the
directory against its sealed manifest (every part's sha256; `--no-hash`: sizes), joins the labels on
`id`, trains `train_scorer` (the model features nullable: without a teacher checkpoint they are null, and the
heads are told so), writes the sealed artifact (`save_scorer`: heads, feature config, manifest with each file's
sha256), loads it back (which verifies every sha256) and prints per bucket the labelled rows and the spread of
the scores. `--scored` writes every pool row of the trained buckets with `utility_score` and
`sampling_weight = exp(tau * utility_score)`, what a curriculum stage's stream draws by (docs/pool.md#the-stream).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import polars as pl

from synthkd_assets.core.atomic import atomic_output
from synthkd_assets.core.layout import DataLayout
from synthkd_contract.valuation import MODEL_FEATURE_COLUMNS, WINDOW_TOKENS_COLUMN
from synthkd_training.cli import add_no_hash_argument
from synthkd_training.pool import PoolError, valuation_parts
from synthkd_training.scorer import load_scorer, save_scorer, train_scorer


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    layout = DataLayout.from_environ(os.environ)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--features", type=Path, default=layout.valuation_root(), help="valuation feature parts")
    parser.add_argument("--labels", type=Path, required=True, help="LP labels (train_online_kd.py --lp-output)")
    parser.add_argument("--output", type=Path, required=True, help="the scorer's directory (written atomically)")
    parser.add_argument("--scored", type=Path, default=None, help="write the scored pool rows here (Parquet)")
    parser.add_argument("--tau", type=float, default=1.0, help="sampling_weight = exp(tau * utility_score)")
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--version", default="scorer-v1", help="recorded in the scorer's manifest")
    add_no_hash_argument(parser, "the valuation features")
    return parser.parse_args(argv)


def read_features(directory: Path, hash_files: bool = True) -> pl.DataFrame:
    """Every part of the valuation features, after verifying the directory against its sealed manifest."""
    try:
        parts = valuation_parts(directory, hash_files)
    except PoolError as error:
        raise SystemExit(str(error)) from None
    if not parts:
        raise SystemExit(f"no valuation features under {directory}: build first (./scripts/build.sh)")
    return pl.concat([pl.read_parquet(part) for part in parts])


LABEL_COLUMNS = ("id", "lp_value", "reference_lp_raw")
"""What train_scorer needs of a label file: `lp_value` relative to the round's references (the column that says so)."""


def read_labels(path: Path) -> pl.DataFrame:
    """One label per pool row: its `lp_value`, averaged over the rounds that labelled it.

    `lp_value` is relative to the references each round labels too (train_online_kd.py `LP_SCHEMA`), so rounds
    measured at different training steps average and rank together.

    Args:
        path: Parquet written by examples/train_online_kd.py --lp-output.

    Returns:
        Columns `id` and `lp_value`, one row per labelled pool id, sorted by id.

    Raises:
        SystemExit: No file, a file without `LABEL_COLUMNS` (raw progress per round, which drifts with the
            student's state), or no label of a pool row.
    """
    if not path.is_file():
        raise SystemExit(f"no labels at {path}: write them with examples/train_online_kd.py --lp-output")
    if missing := [column for column in LABEL_COLUMNS if column not in pl.read_parquet_schema(path)]:
        raise SystemExit(
            f"{path} has no {', '.join(missing)} column: its labels are not relative to per-round references and "
            "do not compare across rounds; write them with examples/train_online_kd.py --lp-output"
        )
    labels = pl.read_parquet(path, columns=["id", "lp_value"])
    unlabelled = labels["id"].null_count()
    if unlabelled == labels.height:
        raise SystemExit(f"{path}: no label carries a pool id (computed without a pool? see train_online_kd.py --pool)")
    if unlabelled:
        print(f"{unlabelled} of {labels.height} labels are of conversations outside the pool: not used")
    return labels.drop_nulls("id").group_by("id").agg(pl.col("lp_value").mean()).sort("id")


FEW_LABELS = 8  # a bucket's head fitted on fewer labelled rows fits noise: said, not refused


def thin_data_warnings(features: pl.DataFrame, labels: pl.DataFrame) -> list[str]:
    """What makes the scorer weak though it trains: model features null on every row (the features were computed
    without teacher / student checkpoints), and buckets with fewer than FEW_LABELS labelled rows."""
    warnings = []
    if empty := [
        c for c in MODEL_FEATURE_COLUMNS if c in features.columns and features[c].null_count() == features.height
    ]:
        warnings.append(
            f"{', '.join(empty)} null on every row (no teacher/student checkpoint when synth_valuation_features ran: "
            "SYNTHKD_TEACHER_CHECKPOINT, SYNTHKD_STUDENT_CHECKPOINT): the scorer learns from the prompt features only"
        )
    labelled = features.join(labels, on="id").group_by("skill_bucket").len().sort("skill_bucket")
    for bucket, count in labelled.iter_rows():
        if count < FEW_LABELS:
            warnings.append(
                f"{bucket}: {count} labelled rows (fewer than {FEW_LABELS}): its head fits noise; label more "
                "(train_online_kd.py --lp-every, --lp-candidates)"
            )
    return warnings


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    features = read_features(args.features, not args.no_hash)
    labels = read_labels(args.labels)
    warnings = thin_data_warnings(features, labels)
    for warning in warnings:
        print(f"warning: {warning}")
    scorer = train_scorer(
        features,
        labels,
        nullable=MODEL_FEATURE_COLUMNS,
        exclude=(WINDOW_TOKENS_COLUMN,),  # how many tokens the model features averaged: bookkeeping, not a feature
        seed=args.seed,
        tau=args.tau,
        epochs=args.epochs,
        version=args.version,
    )
    save_scorer(scorer, args.output)
    scorer = load_scorer(args.output)  # verifies every file against the sealed manifest
    scored = scorer.score(features.filter(pl.col("skill_bucket").is_in(scorer.buckets)))
    summary = (
        scored.join(labels, on="id", how="left")
        .group_by("skill_bucket")
        .agg(
            pl.len().alias("rows"),
            pl.col("lp_value").is_not_null().sum().alias("labelled"),
            pl.col("utility_score").min().alias("utility_min"),
            pl.col("utility_score").max().alias("utility_max"),
        )
        .sort("skill_bucket")
    )
    print(f"scorer {args.version} written to {args.output} (features: {', '.join(scorer.config.feature_columns)})")
    for row in summary.iter_rows(named=True):
        print(
            f"  {row['skill_bucket']}: {row['labelled']} labelled of {row['rows']} rows, "
            f"utility_score {row['utility_min']:.3f} .. {row['utility_max']:.3f}"
        )
    if args.scored is not None:
        with atomic_output(args.scored) as partial:
            scored.write_parquet(partial)
        print(f"{scored.height} scored rows written to {args.scored}")
    return {
        "buckets": scorer.buckets,
        "summary": summary.to_dicts(),
        "scored_rows": scored.height,
        "warnings": warnings,
    }


if __name__ == "__main__":
    main(sys.argv[1:])
