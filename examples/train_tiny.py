"""Train a tiny Megatron-Core GPTModel for a few steps on synth_kd_v1 with the span-aware pieces.

    python examples/train_tiny.py --synthetic                # CPU (gloo, world size 1)
    python examples/train_tiny.py --data-root data/megatron/synth_kd_v1 --steps 50

What it shows: `train_valid_datasets` (`SpanGPTDatasetConfig` / `build_span_datasets`: megatron-core's
BlendedMegatronDatasetBuilder, index caching, GPT-style slicing) feeding batches with `span_id`,
and `span_ce_loss` (stage 1) on the model's logits, logging what 000 says must always be logged.
It exits non-zero unless the loss of the last steps is below that of the first steps. The check
uses L divided by the sum of the effective weights (the weighted mean of the per-span losses): L
itself roughly doubles whenever a batch holds both spans instead of one, which would make a
first-vs-last comparison of raw L depend on which spans the batches happened to contain.

The model and the single-process world come from `synthkd_training.models` (which says what is
sidestepped on CPU).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from synthkd_assets.core.layout import DataLayout
from synthkd_training.cli import add_no_hash_argument
from synthkd_training.dataset import SpanDatasetError, train_valid_datasets
from synthkd_training.losses import SpanLossConfig, span_ce_loss
from synthkd_training.models import (
    GPTSpec,
    NoCudaError,
    build_gpt,
    forward_headed,
    save_checkpoint,
    to_device,
    training_session,
)
from synthkd_training.synthetic import write_synthetic_dataset


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-root",
        type=Path,
        default=DataLayout.from_environ(os.environ).megatron_root(),
        help="dataset root holding train/ (and valid/) shard_XX_{tokens,lossmask,span} trios "
        "(default: synth_kd_v1 under $SYNTHKD_DATA_DIR, else data/)",
    )
    parser.add_argument(
        "--synthetic",
        action="store_true",
        help="write a small synthetic trio (megatron-core's builder) into --work-dir and train on it",
    )
    add_no_hash_argument(parser, "the trios")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where synthetic data and megatron's index cache go (default: a temporary directory)",
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-attention-heads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument(
        "--save-checkpoint",
        type=Path,
        default=None,
        help="write the trained model here (synthkd_training.models format: gpt_spec.json + model.pt), "
        "e.g. to serve as the teacher of examples/train_online_kd.py",
    )
    parser.add_argument(
        "--window", type=int, default=5, help="steps averaged at the start and at the end for the check"
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2")
    return args


def _datasets(args: argparse.Namespace, work_dir: Path):
    data_root = write_synthetic_dataset(work_dir / "synthetic", args.seed) if args.synthetic else args.data_root
    try:
        train, valid = train_valid_datasets(
            data_root,
            sequence_length=args.seq_length,
            seed=args.seed,
            train_samples=args.steps * args.micro_batch_size,
            valid_samples=args.micro_batch_size,
            cache_dir=work_dir / "index-cache",
            verify=not args.no_hash,
        )
    except SpanDatasetError as error:
        raise SystemExit(f"{error}\n(--synthetic trains on generated data instead)") from None
    return data_root, train, valid


def _describe(result) -> str:
    return (
        f"loss {result.loss.item():.4f} (per span {result.per_span_mean():.4f}) | {result.describe_spans()} | "
        f"prompt n={int(result.token_counts['prompt'])}"
    )


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        with training_session(args.device, args.seed, args.work_dir, "train_tiny-") as (device, work_dir):
            return _train(args, device, work_dir)
    except NoCudaError as error:
        raise SystemExit(str(error)) from None


def _train(args: argparse.Namespace, device: torch.device, work_dir: Path) -> dict:
    data_root, train, valid = _datasets(args, work_dir)
    spec = GPTSpec(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        seq_length=args.seq_length,
    )
    model = build_gpt(spec, device, args.micro_batch_size)
    print(
        f"device {device} | data {data_root} | {len(train)} train samples of {args.seq_length} tokens | "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters",
        flush=True,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    loss_config = SpanLossConfig()  # w_r = w_f = 1.0
    # Megatron already shuffled (shuffle index): read its samples in order
    loader = torch.utils.data.DataLoader(train, batch_size=args.micro_batch_size, shuffle=False, drop_last=True)
    losses: list[float] = []
    normalized: list[float] = []  # L / sum of effective weights; NaN when nothing is supervised
    model.train()
    batches = iter(loader)
    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        batch = to_device(next(batches), device)
        logits = forward_headed(model, batch)  # [b, s, V], made chunk by chunk in the loss
        result = span_ce_loss(logits, batch["labels"], batch["span_id"], loss_config)
        optimizer.zero_grad(set_to_none=True)
        result.loss.backward()
        optimizer.step()
        losses.append(result.loss.item())
        normalized.append(result.per_span_mean())
        print(f"step {step:3d}/{args.steps} | {_describe(result)} | {time.perf_counter() - started:.2f}s", flush=True)

    if valid is not None:
        model.eval()
        with torch.no_grad():
            batch = to_device(next(iter(torch.utils.data.DataLoader(valid, batch_size=args.micro_batch_size))), device)
            logits = forward_headed(model, batch)
            print(f"valid    | {_describe(span_ce_loss(logits, batch['labels'], batch['span_id'], loss_config))}")

    supervised = [value for value in normalized if not math.isnan(value)]
    window = max(1, min(args.window, len(supervised) // 2))
    first, last = statistics.fmean(supervised[:window]), statistics.fmean(supervised[-window:])
    print(
        f"mean per-span loss (L / sum of effective weights) of the first {window} steps {first:.4f}, "
        f"of the last {window} steps {last:.4f}"
    )
    summary = {
        "losses": losses,
        "normalized": normalized,
        "first_mean": first,
        "last_mean": last,
        "device": str(device),
    }
    if not (math.isfinite(last) and last < first):
        raise SystemExit(f"loss did not go down: first {window} steps {first:.4f}, last {window} steps {last:.4f}")
    if args.save_checkpoint is not None:
        save_checkpoint(model, spec, args.save_checkpoint)
        print(f"checkpoint written to {args.save_checkpoint}")
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
