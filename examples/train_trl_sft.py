"""Train a causal LM with TRL's SFTTrainer on the DistillKit dataset (synth_distill) exactly as it is written.

    python examples/train_trl_sft.py --tiny --shortest 8 --steps 3          # CPU: random tiny Llama, vocab 201088
    python examples/train_trl_sft.py --model /path/to/hf-model --steps 1000 --batch-size 4   # a real model (GPU)

The rows are pre-tokenized (o200k_harmony ids) and carry `labels` (-100 on the prompt, before
`spans.assistant_token_start`). TRL 1.16 uses a dataset's `labels` column as it is: its dataset preparation builds
labels from masks only when there is none, and its collator pads `labels` with -100. So the loss is on the
assistant tokens with no TRL masking option set; the settings that matter are `max_length=None` (the rows are
already at most MAX_SEQ_LEN tokens; TRL's default of 1024 would cut the long ones) and a tokenizer whose pad token
is in the vocabulary (the only thing SFTTrainer reads from it for this dataset).

`--tiny` builds the model from a config (no download) and a stand-in tokenizer that knows only the pad token
`<|endoftext|>` (EOD_TOKEN_ID): with pre-tokenized rows TRL never tokenizes text. A real model brings its own
tokenizer (`AutoTokenizer.from_pretrained`, read from the model's directory).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import datasets
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    set_seed,
)
from trl import SFTConfig, SFTTrainer

from synthkd_assets.core.layout import DataLayout
from synthkd_contract import constants
from synthkd_contract.manifest_seal import ManifestError, require_dataset, verify_manifest
from synthkd_training.cli import add_no_hash_argument

DISTILL_DATASETS = (constants.DISTILL_DATASET_NAME, constants.DISTILL_SMOKE_DATASET_NAME)
# o200k_harmony's text of EOD_TOKEN_ID: the pad token of the stand-in tokenizer
PAD_TOKEN = "<|endoftext|>"


def load_distillkit(data_dir: Path, cache_dir: Path | None = None, hash_files: bool = True) -> datasets.DatasetDict:
    """`{train, validation}` of the DistillKit dataset, read as any consumer reads it, once it verifies against its
    sealed manifest (`verify_manifest`: every listed part with its bytes, and sha256 with `hash_files`; nothing
    else under the root). `load_dataset(data_dir=...)` reads whatever files are there: a part lost or left over, a
    stray copy or an edited row would otherwise be trained on without a word."""
    try:
        require_dataset(data_dir, DISTILL_DATASETS, constants.DISTILL_DATASET_NAME)
    except ManifestError as error:
        raise SystemExit(f"no DistillKit dataset at {data_dir}: {error}") from None
    try:
        verify_manifest(data_dir, hash_files=hash_files)
    except ManifestError as error:
        raise SystemExit(f"the DistillKit dataset at {data_dir} does not verify: {error}") from None
    cache = None if cache_dir is None else str(cache_dir)
    files = split_files(data_dir)
    if "train" not in files:
        raise SystemExit(f"the DistillKit dataset at {data_dir} has no train rows: nothing to train on")
    return datasets.load_dataset("parquet", data_files=files, cache_dir=cache)


def split_files(data_dir: Path) -> dict[str, list[str]]:
    """{split: its parts that hold rows} of a verified DistillKit dataset. A split with no row (the build's
    `distill_valid_fraction` 0 gives an empty validation split) is left out: `datasets` cannot read a part without
    rows, and there is nothing in it to evaluate on."""
    files = {}
    for split in constants.DISTILL_SPLITS:
        parts = sorted((data_dir / split).glob("*.parquet"))
        holding = [str(part) for part in parts if pq.ParquetFile(part).metadata.num_rows > 0]
        if holding:
            files[split] = holding
    return files


def shortest_rows(dataset: datasets.Dataset, n: int) -> datasets.Dataset:
    """The n shortest rows (ties in file order): a CPU-sized subset of the rows as written, none of them changed."""
    lengths = pc.list_value_length(dataset.data.column("input_ids")).to_pylist()
    return dataset.select(sorted(range(len(lengths)), key=lambda i: (lengths[i], i))[:n])


def pad_tokenizer() -> PreTrainedTokenizerFast:
    """A tokenizer that knows only the pad token, at its o200k_harmony id: all SFTTrainer needs from one here."""
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({PAD_TOKEN: constants.EOD_TOKEN_ID}, unk_token=PAD_TOKEN))
    )
    tokenizer.pad_token = PAD_TOKEN
    return tokenizer


def tiny_model(hidden: int = 16, layers: int = 1, seed: int = 0) -> LlamaForCausalLM:
    """A randomly initialised Llama with the padded o200k_harmony vocabulary, created from a config."""
    set_seed(seed)
    config = LlamaConfig(
        vocab_size=constants.PADDED_VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=constants.MAX_SEQ_LEN,
        pad_token_id=constants.EOD_TOKEN_ID,
        eos_token_id=constants.EOD_TOKEN_ID,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


def sft_config(output_dir: Path, steps: int, batch_size: int, bf16: bool, lr: float, seed: int = 0) -> SFTConfig:
    """The SFTConfig for the DistillKit rows: no truncation, no TRL masking option (the labels column decides)."""
    return SFTConfig(
        output_dir=str(output_dir),
        max_length=None,
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        bf16=bf16,
        activation_checkpointing=bf16,  # memory for long rows on a GPU; a tiny CPU model runs faster without
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=seed,
    )


def build_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    train: datasets.Dataset,
    config: SFTConfig,
    eval_dataset: datasets.Dataset | None = None,
) -> SFTTrainer:
    return SFTTrainer(
        model=model, args=config, train_dataset=train, eval_dataset=eval_dataset, processing_class=tokenizer
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DataLayout.from_environ(os.environ).distill_root(),
        help="the DistillKit dataset root with train/ and validation/ (default: synth_distill under "
        "$SYNTHKD_DATA_DIR, else data/)",
    )
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--tiny", action="store_true", help="a random tiny Llama (vocab 201088) and the pad tokenizer")
    model.add_argument("--model", type=Path, help="a Hugging Face model directory (weights + tokenizer)")
    parser.add_argument("--shortest", type=int, default=None, help="train on the N shortest train rows only")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=torch.cuda.is_available())
    parser.add_argument("--output-dir", type=Path, default=Path("trl_sft_out"))
    parser.add_argument("--cache-dir", type=Path, default=None, help="datasets' cache (default: its own)")
    add_no_hash_argument(parser, "the parts")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    splits = load_distillkit(args.data_dir, args.cache_dir, hash_files=not args.no_hash)
    if "validation" not in splits:
        print(f"{args.data_dir}: 0 validation rows (distill_valid_fraction 0?): no evaluation split, training only")
    train = splits["train"] if args.shortest is None else shortest_rows(splits["train"], args.shortest)
    if args.tiny:
        model, tokenizer = tiny_model(seed=args.seed), pad_tokenizer()
    else:
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto")
        tokenizer = AutoTokenizer.from_pretrained(args.model)
    config = sft_config(args.output_dir, args.steps, args.batch_size, args.bf16, args.lr, args.seed)
    trainer = build_trainer(model, tokenizer, train, config)
    result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    print(f"trained {result.global_step} steps on {len(train)} rows; loss per step {losses}")
    if not all(math.isfinite(loss) for loss in losses):
        raise SystemExit(f"a non-finite loss: {losses}")
    return {"losses": losses, "global_step": result.global_step, "trainer": trainer}


if __name__ == "__main__":
    main(sys.argv[1:])
