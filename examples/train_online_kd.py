"""Online, teacher-forced KD (seed 002 §1): a frozen teacher and a smaller student forward the same batches.

    python examples/train_tiny.py --data-root data/megatron/synth_kd_v1 --steps 40 --save-checkpoint teacher/
    python examples/train_online_kd.py --teacher-checkpoint teacher/ --steps 30 --save-checkpoint student/
    python examples/train_online_kd.py --synthetic --teacher-checkpoint teacher/      # no build needed
    python examples/train_online_kd.py --teacher-checkpoint /models/gpt-oss-20b --device cuda   # a real teacher
    python examples/train_online_kd.py --teacher-checkpoint teacher/ --stage-args $POOL/curriculum/P1.args

With `--stage-args`, the student trains on a curriculum stage of the sequence pool as its stream
(docs/pool.md#the-stream): whole conversations packed per window, position ids and attention reset per
conversation, the stage's mix held on tokens, drawn by `exp(--stream-tau * utility)` from `--scorer`'s utilities
(else uniformly) with an `--stream-epsilon` tail and a `--stream-cluster-cap`; `--consumed-samples` resumes the
stream, and the sampling manifest (quota grid, tau, epsilon, the stage, the scorer's sha256) is written to
`--sampling-manifest`.

The student (a `GPTSpec` from the flags, randomly initialised) is trained with `span_kd_loss` (forward / reverse /
mix KL at a temperature) plus `--ce-weight` times the span-normalized CE, on `SpanGPTDataset` batches of the
`train/` trios; every step logs the per-span token counts, losses and effective weights. Progress is the held-out
KL(teacher || student) per supervised token over the held-out slice: by default the validation set
`heldout_kl.parquet` that synth_clusters holds out of training (cluster-disjoint, rendered with openai-harmony),
else (`--synthetic`, or no validation set built) the `valid/` trios. The run exits non-zero unless that KL falls.

With `--lp-every N`, learning-progress labels (seed 002 §9) are computed during training: after `--lp-warmup`
steps, every N steps (a round), `--lp-candidates` single conversations of the train split (of the sequence pool's
rows when the build made one: the prompts the scorer will value) and the run's `--lp-references` reference
conversations (drawn once, the same in every round) each get `--lp-k` KD updates on a snapshot of the student, the
held-out KL is measured and the student restored bit for bit; `lp_raw = (KL before - KL after) / supervised tokens
used` drifts with the student's state, `lp_value = lp_raw / (the references' mean lp_raw) - 1` does not. Written to
`--lp-output` (Parquet, `LP_SCHEMA`: synth_id as `key`, the pool row's `id`), what examples/train_scorer.py trains on.

On CUDA the forwards run under bf16 autocast (`--precision auto`); on CPU in float32 (gloo world of one process).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from synthkd_assets.core.atomic import atomic_output
from synthkd_assets.core.layout import DataLayout, documents_path
from synthkd_contract.indexed_dataset import read_index
from synthkd_contract.manifest_seal import ManifestError, heldout_mismatch, verify_manifest
from synthkd_contract.stage_stream import StageStreamError, StreamPolicy
from synthkd_training.cli import add_no_hash_argument
from synthkd_training.dataset import SpanDatasetError, tokens_prefixes, train_valid_datasets
from synthkd_training.documents import batches_of, document_ids, document_sample, trio_documents
from synthkd_training.losses import SpanLossConfig
from synthkd_training.models import (
    GPTSpec,
    NoCudaError,
    build_gpt,
    load_model,
    save_checkpoint,
    to_device,
    training_session,
)
from synthkd_training.online_kd import KDStep, OnlineKDConfig, train_online_kd
from synthkd_training.pool import PoolError, pool_parts
from synthkd_training.progress import (
    Candidate,
    LPCadence,
    LPConfig,
    ReferencesMadeNoProgressError,
    learning_progress_labels,
)
from synthkd_training.stream import (
    StageArgsError,
    StageStream,
    read_stage_args,
    scorer_phase,
    stream_batches,
    write_sampling_manifest,
)
from synthkd_training.synthetic import write_synthetic_dataset

DEFAULT_SEQ_LENGTH = 2048  # a CPU-sized default when the teacher takes longer sequences (GPT-OSS: 131,072)
LP_SCHEMA = pa.schema(  # docs/distillation.md#learning-progress-labels
    [
        ("key", pa.string()),
        ("id", pa.string()),  # the pool row's id (what the valuation features are keyed by); null outside the pool
        ("round", pa.int64()),  # 0, 1, ... in the order the rounds ran
        ("step", pa.int64()),  # the training step the round ran at
        ("reference", pa.bool_()),  # one of the run's reference conversations, labelled in every round
        ("kl_before", pa.float64()),
        ("kl_after", pa.float64()),
        ("tokens_used", pa.int64()),
        ("lp_raw", pa.float64()),  # (kl_before - kl_after) / tokens_used: drifts with the student's state
        ("reference_lp_raw", pa.float64()),  # the round's mean lp_raw of the references
        ("lp_value", pa.float64()),  # lp_raw / reference_lp_raw - 1: comparable across rounds
    ]
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    layout = DataLayout.from_environ(os.environ)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", type=Path, default=layout.megatron_root(), help="synth_kd_v1 dataset root")
    parser.add_argument("--synthetic", action="store_true", help="train on a small synthetic trio (no build needed)")
    add_no_hash_argument(parser, "the trios and the pool's parts")
    parser.add_argument("--heldout", type=Path, default=layout.heldout_kl(), help="heldout_kl.parquet")
    parser.add_argument("--tokenizer-dir", type=Path, default=layout.tokenizer_dir(), help="renders --heldout")
    parser.add_argument("--heldout-size", type=int, default=16, help="held-out conversations measured")
    parser.add_argument("--work-dir", type=Path, default=None, help="synthetic data and megatron's index cache")
    parser.add_argument(
        "--teacher-checkpoint",
        type=Path,
        required=True,
        help="gpt_spec.json + model.pt (train_tiny.py --save-checkpoint), or a Hugging Face causal LM (e.g. GPT-OSS)",
    )
    parser.add_argument("--num-layers", type=int, default=1, help="student")
    parser.add_argument("--hidden-size", type=int, default=32, help="student")
    parser.add_argument("--num-attention-heads", type=int, default=2, help="student")
    parser.add_argument(
        "--seq-length",
        type=int,
        default=None,
        help=f"default: the stage's --seq-length, else the teacher's positions, at most {DEFAULT_SEQ_LENGTH}",
    )
    parser.add_argument("--stage-args", type=Path, default=None, help="a curriculum stage's .args: train on its stream")
    parser.add_argument("--stream-tau", type=float, default=None, help="sampling_weight = exp(tau * utility)")
    parser.add_argument("--stream-epsilon", type=float, default=0.0, help="share of each draw taken uniformly")
    parser.add_argument("--stream-cluster-cap", type=int, default=None, help="conversations per cluster per epoch")
    parser.add_argument("--scorer", type=Path, default=None, help="a sealed scorer (train_scorer.py): the utilities")
    parser.add_argument("--consumed-samples", type=int, default=0, help="resume the stream after this many samples")
    parser.add_argument("--sampling-manifest", type=Path, default=None, help="default: <work dir>/sampling.json")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--kd-divergence", choices=("forward", "reverse", "mix"), default="forward")
    parser.add_argument("--kd-temperature", type=float, default=1.0)
    parser.add_argument("--kd-forward-weight", type=float, default=0.5, help="with --kd-divergence mix")
    parser.add_argument("--ce-weight", type=float, default=0.0)
    parser.add_argument("--w-reasoning", type=float, default=1.0)
    parser.add_argument("--w-final", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, default=0, help="also measure the held-out KL every N steps")
    parser.add_argument("--lp-every", type=int, default=0, help="learning-progress labels every N steps (0: none)")
    parser.add_argument("--lp-warmup", type=int, default=0, help="no labels before this step")
    parser.add_argument("--lp-candidates", type=int, default=2, help="conversations labelled each time")
    parser.add_argument(
        "--lp-references", type=int, default=2, help="reference conversations labelled every round (lp_value's unit)"
    )
    parser.add_argument("--lp-k", type=int, default=2, help="KD updates per candidate")
    parser.add_argument("--lp-output", type=Path, default=None, help="where the labels go (Parquet)")
    parser.add_argument(
        "--pool",
        type=Path,
        default=layout.pool_root(),
        help="when this sequence pool exists, LP candidates are its train rows and labels carry their pool id",
    )
    parser.add_argument(
        "--save-checkpoint",
        type=Path,
        default=None,
        help="write the trained student here once the held-out KL fell (gpt_spec.json + model.pt), e.g. as "
        "$SYNTHKD_STUDENT_CHECKPOINT of the pool's valuation features",
    )
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16"), default="auto", help="auto: bf16 on CUDA")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.lp_every and args.lp_output is None:
        parser.error("--lp-every needs --lp-output")
    if args.lp_references < 1:
        parser.error("--lp-references must be at least 1: lp_value is relative to the references")
    if args.stage_args is None and (args.scorer or args.stream_tau is not None or args.consumed_samples):
        parser.error("--scorer, --stream-tau and --consumed-samples need --stage-args")
    if args.stage_args is not None and args.synthetic:
        parser.error("--stage-args trains on the pool's stage, --synthetic on generated trios: give one")
    return args


def _stage_stream(args: argparse.Namespace, work_dir: Path, max_positions: int) -> tuple[StageStream, Path]:
    """The stage's stream (verified pool), the scorer's utilities when given, and where its manifest went."""
    try:
        stage = read_stage_args(args.stage_args)
        seq_length = args.seq_length or stage.seq_length
        if seq_length > max_positions:
            raise SystemExit(f"the stage's --seq-length {seq_length} exceeds the teacher's {max_positions} positions")
        stream = StageStream(
            stage.per_split_data_args_path, seq_length, stage.train_samples, hash_files=not args.no_hash
        )
        tau = args.stream_tau
        if args.scorer is not None:
            valuation = DataLayout.from_environ(os.environ).valuation_root()
            phase, scorer_tau = scorer_phase(args.scorer, valuation, stream.conversations)
            tau = scorer_tau if tau is None else tau
            stream.redraw(stream.plan.policy, (phase,))
        policy = StreamPolicy(
            seed=args.seed, tau=tau or 0.0, epsilon=args.stream_epsilon, cluster_cap=args.stream_cluster_cap
        )
        stream.redraw(policy, stream.scorer_phases)
    except (StageArgsError, StageStreamError, ManifestError, ValueError) as error:
        raise SystemExit(f"--stage-args {args.stage_args}: {error}") from None
    manifest = write_sampling_manifest(stream, args.sampling_manifest or work_dir / "sampling.json")
    return stream, manifest


def _train_data(args: argparse.Namespace, work_dir: Path, seq_length: int) -> tuple[Path, object, object]:
    data_root = write_synthetic_dataset(work_dir / "synthetic", args.seed) if args.synthetic else args.data_root
    try:
        train, valid = train_valid_datasets(
            data_root,
            sequence_length=seq_length,
            seed=args.seed,
            train_samples=args.steps * args.micro_batch_size,
            valid_samples=None,
            cache_dir=work_dir / "index-cache",
            verify=not args.no_hash,
        )
    except SpanDatasetError as error:
        raise SystemExit(f"{error}\n(--synthetic trains on generated data instead)") from None
    return data_root, train, valid


def _rendered_heldout(path: Path, tokenizer_dir: Path, limit: int, data_root: Path) -> list:
    """The held-out KL slice's conversations (prompt + SYNTH's reference answer), rendered by openai-harmony;
    refused unless it was held out of `data_root`, the dataset trained on."""
    from synthkd_assets.core.render import HarmonyRenderer
    from synthkd_assets.core.tokenizer import load_harmony_encoding

    try:  # the slice the build sealed, as it recorded it: not a torn, edited or other build's file
        verify_manifest(path.parent, files=[path.name])
    except ManifestError as error:
        raise SystemExit(f"the held-out slice {path} does not verify: {error}") from None
    if mismatch := heldout_mismatch(data_root, path.parent):  # held out of the data trained on, not another plan's
        raise SystemExit(mismatch)
    renderer = HarmonyRenderer(load_harmony_encoding(tokenizer_dir))
    rows = pq.read_table(path, columns=["prompt_messages", "reference_messages"]).to_pylist()[:limit]
    documents = []
    for row in rows:
        rendered = renderer.render(json.loads(row["prompt_messages"]) + json.loads(row["reference_messages"]))
        documents.append((rendered.tokens, rendered.loss_mask, rendered.span_id))
    return documents


def _heldout_batches(
    args, valid, seq_length: int, device: torch.device, checked_against: Path | None = None
) -> tuple[str, list[dict]]:
    """The held-out KL slice, held out of `checked_against` (default: the synth_kd_v1 root trained on)."""
    if not args.synthetic and args.heldout.is_file():
        trained_on = checked_against or args.data_root
        documents = _rendered_heldout(args.heldout, args.tokenizer_dir, args.heldout_size, trained_on)
        samples = [document_sample(*d, seq_length) for d in documents]
        source = f"{args.heldout} ({len(samples)} conversations)"
    elif valid is not None:
        samples = [valid[i] for i in range(min(len(valid), args.heldout_size))]
        source = f"valid/ trios ({len(samples)} samples)"
    else:
        raise SystemExit(f"no held-out slice: neither {args.heldout} nor a valid/ trio under {args.data_root}")
    return source, [to_device(batch, device) for batch in batches_of(samples, args.micro_batch_size)]


def pool_ids(pool_root: Path, hash_files: bool = True) -> dict[str, str]:
    """synth_id (the pool's source_example_id) -> pool id, over every part of the pool (empty without one), each
    part verified against the pool's sealed manifest first (`pool_parts`): edited ids are refused."""
    if not pool_root.is_dir():
        return {}
    try:
        parts = pool_parts(pool_root, hash_files)
    except PoolError as error:
        raise SystemExit(f"--pool {pool_root}: {error}") from None
    if not parts:
        return {}
    frame = pl.concat([pl.read_parquet(part, columns=["id", "source_example_id"]) for part in parts])
    return dict(zip(frame["source_example_id"].to_list(), frame["id"].to_list()))


def _candidate_documents(data_root: Path, seed: int, wanted: dict[str, str]) -> list[tuple[str, str, int]]:
    """(key, tokens prefix, document index) of every train document (of the pool's, when `wanted` names them),
    in a seeded order."""
    found = []
    for prefix in tokens_prefixes(data_root / "train"):
        shard = int(Path(prefix).name.split("_")[1])
        ids_file = documents_path(data_root, shard)
        count = len(read_index(prefix).sequence_lengths)
        synthetic = [f"{Path(prefix).name}:{i}" for i in range(count)]  # no documents table: prefix and index
        keys = document_ids(ids_file, "train") if ids_file.is_file() else synthetic
        found += [(keys[i], prefix, i) for i in range(count) if not wanted or keys[i] in wanted]
    random.Random(seed).shuffle(found)
    return found


class LPRecorder:
    """The after-step hook: learning-progress labels when the cadence says so, every round relative to the same
    reference conversations (the first `--lp-references` of the seeded candidate order, never candidates)."""

    def __init__(self, args, data_root, student, teacher, heldout, kd_config, seq_length, device) -> None:
        self.cadence = LPCadence(args.lp_warmup, args.lp_every, args.lp_candidates)
        self.config = LPConfig(k_updates=args.lp_k, kd=kd_config, seed=args.seed)
        self.student, self.teacher, self.heldout = student, teacher, heldout
        self.pool_ids = {} if args.synthetic else pool_ids(args.pool, not args.no_hash)
        self.pool = _candidate_documents(data_root, args.seed, self.pool_ids)
        self.seq_length, self.device = seq_length, device
        self.references: list[Candidate] = []
        while len(self.references) < args.lp_references and (candidate := self._next_candidate()) is not None:
            self.references.append(candidate)
        if len(self.references) < args.lp_references:
            raise SystemExit(f"--lp-references {args.lp_references}: only {len(self.references)} train conversations")
        self.rows: list[dict] = []
        self.rounds = 0
        self.skipped: list[int] = []

    def _next_candidate(self) -> Candidate | None:
        """The next train conversation with a supervised token (one with none teaches nothing), or None."""
        while self.pool:
            key, prefix, index = self.pool.pop()
            sample = document_sample(*trio_documents(prefix, [index])[0], self.seq_length)
            if bool((sample["span_id"] != 0).any()):
                return Candidate(key, [to_device(batches_of([sample], 1)[0], self.device)])
        return None

    def __call__(self, step: int, optimizer) -> None:
        if not self.cadence.due(step):
            return
        candidates = []
        while len(candidates) < self.cadence.candidates_per_round and (candidate := self._next_candidate()):
            candidates.append(candidate)
        if not candidates:
            return
        round_id, self.rounds = self.rounds, self.rounds + 1
        try:
            labels = learning_progress_labels(
                self.student, self.teacher, candidates, self.heldout, self.config, self.references, step
            )
        except ReferencesMadeNoProgressError as error:
            self.skipped.append(step)
            print(f"lp    step {step} | round skipped: {error}")
            return
        for label in labels:
            self.rows.append({"round": round_id, "id": self.pool_ids.get(label.key), **label.__dict__})
            print(
                f"lp    step {step} | {label.key}{' (reference)' if label.reference else ''} | "
                f"lp_value {label.lp_value:+.2%} (lp_raw {label.lp_raw:.3e} over {label.tokens_used} tokens)"
            )

    def write(self, path: Path) -> None:
        with atomic_output(path) as partial:
            pq.write_table(pa.Table.from_pylist(self.rows, schema=LP_SCHEMA), partial)


def _millions(model: torch.nn.Module) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def _describe(step: int, steps: int, result: KDStep, started: float) -> str:
    kd = result.kd
    parts = [
        f"step {step:3d}/{steps} | loss {result.loss:.4f} (kd per span {kd.per_span_mean():.4f})",
        kd.describe_spans("kd"),
    ]
    if result.ce is not None:
        parts.append(f"ce {result.ce.loss.item():.3f}")
    parts.append(f"prompt n={int(kd.token_counts['prompt'])} | {time.perf_counter() - started:.2f}s")
    return " | ".join(parts)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        with training_session(args.device, args.seed, args.work_dir, "train_online_kd-") as (device, work_dir):
            return _run(args, device, work_dir)
    except NoCudaError as error:
        raise SystemExit(str(error)) from None


def _run(args: argparse.Namespace, device: torch.device, work_dir: Path) -> dict:
    loaded = load_model(args.teacher_checkpoint, device, args.micro_batch_size)
    teacher = loaded.model
    stream = manifest_path = None
    if args.stage_args is not None:
        stream, manifest_path = _stage_stream(args, work_dir, loaded.max_positions)
    seq_length = stream.seq_length if stream else args.seq_length or min(loaded.max_positions, DEFAULT_SEQ_LENGTH)
    if seq_length > loaded.max_positions:
        raise SystemExit(f"--seq-length {seq_length} exceeds the teacher's {loaded.max_positions} positions")
    student_spec = GPTSpec(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        seq_length=seq_length,
        vocab_size=loaded.vocab_size,
    )
    student = build_gpt(student_spec, device, args.micro_batch_size)
    if stream is None:
        data_root, train, valid = _train_data(args, work_dir, seq_length)
        heldout_source, heldout = _heldout_batches(args, valid, seq_length, device)
    else:  # the pool's stage; held out of the clusters the pool was sampled after (verify_pool checked the sets)
        data_root, train, valid = args.data_root, stream, None
        heldout_source, heldout = _heldout_batches(args, valid, seq_length, device, checked_against=args.pool)
    bf16 = args.precision == "bf16" or (args.precision == "auto" and device.type == "cuda")
    config = OnlineKDConfig(
        loss=SpanLossConfig(
            w_reasoning=args.w_reasoning,
            w_final=args.w_final,
            kd_divergence=args.kd_divergence,
            kd_temperature=args.kd_temperature,
            kd_forward_weight=args.kd_forward_weight,
        ),
        ce_weight=args.ce_weight,
        lr=args.lr,
        autocast_dtype=torch.bfloat16 if bf16 else None,
    )
    source = data_root if stream is None else f"{args.stage_args} ({len(stream)} windows, manifest {manifest_path})"
    print(
        f"device {device} ({'bf16' if bf16 else 'fp32'}) | data {source} | held-out {heldout_source} | "
        f"teacher {_millions(teacher):.1f}M from {args.teacher_checkpoint} | student {_millions(student):.1f}M",
        flush=True,
    )
    if stream is None:
        loader = torch.utils.data.DataLoader(train, batch_size=args.micro_batch_size, shuffle=False, drop_last=True)
    else:  # Megatron's pretraining order from --consumed-samples on
        batches = list(stream_batches(len(stream), args.micro_batch_size, args.consumed_samples))
        if len(batches) < args.steps:
            raise SystemExit(f"the stage has {len(batches)} batches after --consumed-samples, fewer than --steps")
        loader = torch.utils.data.DataLoader(stream, batch_sampler=batches[: args.steps])
    recorder = None
    if args.lp_every:
        recorder = LPRecorder(args, data_root, student, teacher, heldout, config, seq_length, device)
    clock = {"started": time.perf_counter()}

    def log(step: int, result: KDStep) -> None:
        print(_describe(step, args.steps, result, clock["started"]), flush=True)
        clock["started"] = time.perf_counter()

    summary = train_online_kd(
        student,
        teacher,
        (to_device(batch, device) for batch in loader),
        heldout,
        config,
        steps=args.steps,
        eval_every=args.eval_every,
        log=log,
        after_step=recorder,
    )
    before, after = summary.heldout_before, summary.heldout_after
    print(
        f"held-out KL(teacher || student) per supervised token: {before.kl:.4f} -> {after.kl:.4f} "
        f"over {after.tokens} tokens (analysis {after.per_span['analysis']:.4f}, final {after.per_span['final']:.4f})"
    )
    if recorder is not None:
        recorder.write(args.lp_output)
        print(
            f"{len(recorder.rows)} learning-progress labels of {recorder.rounds} rounds "
            f"({len(recorder.references)} references each) written to {args.lp_output}"
        )
        if recorder.skipped:
            print(f"rounds skipped, the references made no progress: steps {recorder.skipped}")
    result = {
        "steps": summary.steps,
        "heldout_before": before.kl,
        "heldout_after": after.kl,
        "heldout_trace": summary.heldout_trace,
        "heldout_source": heldout_source,
        "lp_labels": recorder.rows if recorder is not None else [],
        "lp_skipped_steps": recorder.skipped if recorder is not None else [],
        "device": str(device),
        "sampling_manifest": None if manifest_path is None else str(manifest_path),
    }
    if not summary.kl_fell:
        raise SystemExit(f"held-out KL did not fall: {before.kl:.4f} -> {after.kl:.4f}")
    if args.save_checkpoint is not None:
        save_checkpoint(student, student_spec, args.save_checkpoint)
        print(f"student checkpoint written to {args.save_checkpoint}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
