"""Online, teacher-forced KD (seed 002 §1): a frozen teacher and a smaller student forward the same batches.

    python examples/train_tiny.py --data-root data/megatron/synth_kd_v1 --steps 40 --save-checkpoint teacher/
    python examples/train_online_kd.py --teacher-checkpoint teacher/ --steps 30 --save-checkpoint student/
    python examples/train_online_kd.py --synthetic --teacher-checkpoint teacher/      # no build needed
    python examples/train_online_kd.py --teacher-checkpoint /models/gpt-oss-20b --device cuda   # a real teacher
    python examples/train_online_kd.py --teacher-checkpoint teacher/ --stage-args $POOL/curriculum/P1.args

With `--stage-args` (repeatable: P1 then P2 ...), the student trains on curriculum stages of the sequence pool as
their streams (docs/pool.md#the-stream), each to its token budget (`--stage-tokens` rehearses with a smaller one):
whole conversations packed per window, position ids and attention reset per conversation, the stage's mix held on
tokens, drawn by `exp(--stream-tau * utility)` from `--scorer`'s utilities (else uniformly) with an
`--stream-epsilon` tail and a `--stream-cluster-cap`; `--consumed-samples` resumes the first stage (with
`--student-checkpoint`, the student saved then; the optimizer starts afresh). A stage's
Megatron-LM arguments work as they are too: `python examples/train_online_kd.py $(grep -v '^#' P1.args)
--teacher-checkpoint teacher/`. The sampling manifest (quota grid, tau, epsilon, each stage, the scorer's sha256)
is written to `--sampling-manifest`, and beside `--save-checkpoint` with the pool's data manifest.

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
import itertools
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
    load_checkpoint,
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
    SAMPLING_MANIFEST_FILENAME,
    StageArgs,
    StageArgsError,
    StageStream,
    export_run_manifests,
    parse_stage_words,
    pool_utilities,
    read_stage_args,
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
    parser.add_argument(
        "--stage-args", type=Path, action="append", default=None, help="a curriculum stage's .args (repeatable)"
    )
    parser.add_argument("--stage-tokens", type=int, default=None, help="every stage's token budget (a rehearsal)")
    parser.add_argument("--stream-tau", type=float, default=None, help="sampling_weight = exp(tau * utility)")
    parser.add_argument("--stream-epsilon", type=float, default=0.0, help="share of each draw taken uniformly")
    parser.add_argument("--stream-cluster-cap", type=int, default=None, help="conversations per cluster per epoch")
    parser.add_argument("--scorer", type=Path, default=None, help="a sealed scorer (train_scorer.py): the utilities")
    parser.add_argument("--consumed-samples", type=int, default=0, help="resume the stream after this many samples")
    parser.add_argument(
        "--student-checkpoint",
        type=Path,
        default=None,
        help="continue this student (--save-checkpoint's format; its architecture, not --num-layers ...)",
    )
    parser.add_argument(
        "--sampling-manifest", type=Path, default=None, help="default: <--work-dir>/sampling.json (and the export)"
    )
    parser.add_argument("--steps", type=int, default=None, help="default 20; with stages: every stage's budget")
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
    megatron_stage, argv = megatron_stage_arguments(argv)
    args = parser.parse_args(argv)
    if megatron_stage and args.stage_args:
        parser.error("give the stage as Megatron-LM's arguments or as --stage-args files, not both")
    args.stages = [megatron_stage] if megatron_stage else [read_stage_arguments(path) for path in args.stage_args or []]
    if args.stages and args.steps is not None:
        parser.error("stages train to their token budgets: give --stage-tokens for a shorter run, not --steps")
    args.steps = 20 if args.steps is None else args.steps
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.stage_tokens is not None and args.stage_tokens < 1:
        parser.error("--stage-tokens must be at least 1")
    if args.lp_every and args.lp_output is None:
        parser.error("--lp-every needs --lp-output")
    if args.lp_references < 1:
        parser.error("--lp-references must be at least 1: lp_value is relative to the references")
    if not args.stages and (args.scorer or args.stream_tau is not None or args.consumed_samples or args.stage_tokens):
        parser.error("--scorer, --stream-tau, --stage-tokens and --consumed-samples need --stage-args")
    if args.stages and args.synthetic:
        parser.error("--stage-args trains on the pool's stages, --synthetic on generated trios: give one")
    return args


def megatron_stage_arguments(argv: list[str] | None) -> tuple[StageArgs | None, list[str]]:
    """A stage given by Megatron-LM's own arguments (`$(grep -v '^#' P1.args)`), and the rest of the command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--per-split-data-args-path" not in argv:
        return None, argv
    try:
        return parse_stage_words(argv, "the command line")
    except StageArgsError as error:
        raise SystemExit(str(error)) from None


def read_stage_arguments(path: Path) -> StageArgs:
    try:
        return read_stage_args(path)
    except StageArgsError as error:
        raise SystemExit(f"--stage-args {path}: {error}") from None


def _stage_streams(args: argparse.Namespace, max_positions: int) -> list[StageStream]:
    """Each stage's stream (its pool verified) to its token budget, drawn by the scorer's utilities when given."""
    streams, utilities = [], None
    if args.scorer is not None:  # read and predicted once, for every stage
        try:
            utilities = pool_utilities(args.scorer, DataLayout.from_environ(os.environ).valuation_root())
        except (ManifestError, PoolError, ValueError) as error:
            raise SystemExit(f"--scorer {args.scorer}: {error}") from None
    for stage in args.stages:
        where = stage.per_split_data_args_path
        if stage.seq_length > max_positions:
            raise SystemExit(f"{where}: its --seq-length {stage.seq_length} exceeds the teacher's {max_positions}")

        def policy(tau: float | None) -> StreamPolicy:
            return StreamPolicy(
                seed=args.seed, tau=tau or 0.0, epsilon=args.stream_epsilon, cluster_cap=args.stream_cluster_cap
            )

        try:
            stream = StageStream(stage.per_split_data_args_path, stage.seq_length, token_budget=args.stage_tokens,
                                 policy=policy(args.stream_tau), hash_files=not args.no_hash)  # fmt: skip
            if utilities is not None:  # its utilities need the stage's conversations, its tau the scorer
                tau = utilities.tau if args.stream_tau is None else args.stream_tau
                stream.redraw(policy(tau), (utilities.phase(stream.conversations),))
        except (StageStreamError, ManifestError, ValueError) as error:
            raise SystemExit(f"{where}: {error}") from None
        streams.append(stream)
    return streams


def _stage_batches(streams: list[StageStream], micro_batch_size: int, consumed_samples: int) -> tuple[list, list]:
    """Every stage's micro batches in order (the first from `consumed_samples`), and each stage's batch count."""
    loaders, counts = [], []
    for index, stream in enumerate(streams):
        start = consumed_samples if index == 0 else 0
        # every window the stage planned to reach its budget, the last micro batch maybe smaller
        batches = list(stream_batches(len(stream), micro_batch_size, start, drop_last=False))
        if not batches:
            raise SystemExit(f"{stream.stage_file}: no window left to train on after {start} consumed samples")
        loaders.append(torch.utils.data.DataLoader(stream, batch_sampler=batches))
        counts.append(len(batches))
    return loaders, counts


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
        # each window as long as the longest conversation needs: padding after a causal window changes no KL
        window = max(1, min(seq_length, max((len(d[0]) - 1 for d in documents), default=seq_length)))
        samples = [document_sample(*d, window) for d in documents]
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
    streams = _stage_streams(args, loaded.max_positions)
    manifest_path = None
    if streams:
        # a temporary work dir goes with the run: then the manifest is only the one exported beside the checkpoint
        manifest_path = args.sampling_manifest or (args.work_dir / "sampling.json" if args.work_dir else None)
        if manifest_path is not None:
            write_sampling_manifest(manifest_path, [(stream, 0) for stream in streams])
    seq_length = max(s.seq_length for s in streams) if streams else args.seq_length
    seq_length = seq_length or min(loaded.max_positions, DEFAULT_SEQ_LENGTH)
    if seq_length > loaded.max_positions:
        raise SystemExit(f"--seq-length {seq_length} exceeds the teacher's {loaded.max_positions} positions")
    if args.student_checkpoint is not None:  # a resumed run: its weights (the optimizer starts afresh)
        student, student_spec = load_checkpoint(args.student_checkpoint, device, args.micro_batch_size)
        if student_spec.seq_length < seq_length or student_spec.vocab_size != loaded.vocab_size:
            raise SystemExit(
                f"--student-checkpoint {args.student_checkpoint}: {student_spec.seq_length} positions and "
                f"{student_spec.vocab_size} ids; the run needs {seq_length} positions and the teacher's "
                f"{loaded.vocab_size} ids"
            )
    else:
        student_spec = GPTSpec(
            num_layers=args.num_layers,
            hidden_size=args.hidden_size,
            num_attention_heads=args.num_attention_heads,
            seq_length=seq_length,
            vocab_size=loaded.vocab_size,
        )
        student = build_gpt(student_spec, device, args.micro_batch_size)
    if not streams:
        data_root, train, valid = _train_data(args, work_dir, seq_length)
        heldout_source, heldout = _heldout_batches(args, valid, seq_length, device)
    else:  # the pool's stages; held out of the clusters the pool was sampled after (verify_pool checked the sets)
        data_root, train, valid = args.data_root, None, None
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
    stage_list = ", ".join(f"{s.stage_file.stem} ({len(s)} windows of {s.seq_length})" for s in streams)
    where = manifest_path or (args.save_checkpoint and args.save_checkpoint / SAMPLING_MANIFEST_FILENAME) or "none"
    source = f"stages {stage_list}, sampling manifest {where}" if streams else data_root
    print(
        f"device {device} ({'bf16' if bf16 else 'fp32'}) | data {source} | held-out {heldout_source} | "
        f"teacher {_millions(teacher):.1f}M from {args.teacher_checkpoint} | student {_millions(student):.1f}M",
        flush=True,
    )
    stage_ends: dict[int, str] = {}  # the step each stage ends at -> the stage
    if not streams:
        loader = torch.utils.data.DataLoader(train, batch_size=args.micro_batch_size, shuffle=False, drop_last=True)
    else:  # stage after stage, each to its budget, in Megatron's pretraining order
        loaders, stage_steps = _stage_batches(streams, args.micro_batch_size, args.consumed_samples)
        loader, args.steps = itertools.chain(*loaders), sum(stage_steps)
        stage_ends = dict(zip(itertools.accumulate(stage_steps), (s.stage_file.stem for s in streams)))
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
        eval_at=set(stage_ends),
        log=log,
        after_step=recorder,
    )
    before, after = summary.heldout_before, summary.heldout_after
    if stage_ends:  # the held-out KL at each stage's end
        print(" | ".join(f"after {stage_ends[s]} {kl:.4f}" for s, kl in summary.heldout_trace if s in stage_ends))
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
        "sampling_manifest": str(manifest_path) if manifest_path else None,
    }
    if not summary.kl_fell:
        raise SystemExit(f"held-out KL did not fall: {before.kl:.4f} -> {after.kl:.4f}")
    if streams:
        consumed = [(stream, len(stream)) for stream in streams]  # each stage trained to its budget
        if manifest_path is not None:
            write_sampling_manifest(manifest_path, consumed)
        result["stage_steps"] = dict(zip((s.stage_file.stem for s in streams), stage_steps))
    if args.save_checkpoint is not None:
        save_checkpoint(student, student_spec, args.save_checkpoint)
        if streams:  # 002's export: the full data and sampling manifest beside the checkpoint
            export_run_manifests(args.save_checkpoint, consumed)
        print(f"student checkpoint written to {args.save_checkpoint}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
