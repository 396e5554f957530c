"""TRL's SFTTrainer trains a tiny causal LM on the DistillKit dataset of the sample exactly as it is written, and
the batches it computes its loss on supervise the assistant tokens only (examples/train_trl_sft.py)."""

from __future__ import annotations

import copy
import math
import re
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from examples import train_trl_sft
from synthkd_contract import constants
from synthkd_training.synthetic import write_synthetic_dataset

ROWS, BATCH, STEPS = 4, 2, 2  # every row seen once; two rows of different lengths per batch, so padding shows


@pytest.fixture(scope="module")
def distill_root(built_sample):
    return built_sample[1].data_layout().distill_root()


def written_starts(root) -> dict[tuple[int, ...], int]:
    """input_ids -> spans.assistant_token_start of every written train row, read with pyarrow (not datasets/TRL)."""
    starts = {}
    for path in sorted((root / "train").glob("part-*.parquet")):
        table = pq.read_table(path, columns=["input_ids", "spans"])
        for ids, spans in zip(table.column("input_ids").to_pylist(), table.column("spans").to_pylist()):
            starts[tuple(ids)] = spans["assistant_token_start"]
    return starts


def oracle_loss(model, batch: dict, starts: dict, prompt_too: bool = False) -> float:
    """Mean next-token cross-entropy over the targets at or after assistant_token_start (or every real token)."""
    with torch.no_grad():
        hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        rows, cols = [], []
        for i, ids in enumerate(batch["input_ids"]):
            n = int(batch["attention_mask"][i].sum())
            first = 1 if prompt_too else starts[tuple(ids[:n].tolist())]
            targets = np.arange(max(first, 1), n)  # position t is predicted from t - 1
            rows += [i] * len(targets)
            cols += (targets - 1).tolist()
        logits = model.lm_head(hidden[rows, cols])
        targets = batch["input_ids"][rows, [c + 1 for c in cols]]
        return F.cross_entropy(logits.float(), targets).item()


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: pin_memory without an accelerator
def test_sft_trainer_supervises_assistant_tokens_only(distill_root, encoding, tmp_path):
    tokenizer = train_trl_sft.pad_tokenizer()
    assert tokenizer.pad_token == encoding.decode([constants.EOD_TOKEN_ID])
    assert tokenizer.pad_token_id == constants.EOD_TOKEN_ID
    splits = train_trl_sft.load_distillkit(distill_root, tmp_path / "hf")
    train = train_trl_sft.shortest_rows(splits["train"], ROWS)
    model = train_trl_sft.tiny_model()
    assert model.config.vocab_size == constants.PADDED_VOCAB_SIZE
    initial = copy.deepcopy(model)
    config = train_trl_sft.sft_config(tmp_path / "out", steps=STEPS, batch_size=BATCH, bf16=False, lr=1e-2)
    trainer = train_trl_sft.build_trainer(model, tokenizer, train, config)

    batches = []
    compute_loss = trainer.compute_loss

    def recording(model, inputs, *args, **kwargs):
        """What the loss is computed on: the collated batch after the trainer moved it to the device."""
        batches.append({k: v.detach().clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)})
        return compute_loss(model, inputs, *args, **kwargs)

    trainer.compute_loss = recording
    result = trainer.train()

    starts = written_starts(distill_root)
    lengths = sorted(len(ids) for ids in starts)
    assert len(batches) == STEPS and all(len(b["input_ids"]) == BATCH for b in batches)
    seen, padded = [], 0
    for batch in batches:
        ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
        width = ids.shape[1]
        for i in range(BATCH):
            n = int(mask[i].sum())
            assert mask[i, :n].all() and not mask[i, n:].any()
            row = ids[i, :n].tolist()
            start = starts[tuple(row)]  # a row of the written dataset, unchanged
            assert 0 < start < n
            expected = [constants.LABEL_IGNORE_ID] * start + row[start:] + [constants.LABEL_IGNORE_ID] * (width - n)
            assert labels[i].tolist() == expected
            assert (ids[i, n:] == tokenizer.pad_token_id).all()
            seen.append(n)
            padded += width - n
    assert sorted(seen) == lengths[:ROWS] and padded > 0

    # the first step's loss is the cross-entropy over the assistant targets alone, not over every token
    first_loss = next(entry["loss"] for entry in trainer.state.log_history if "loss" in entry)
    assert first_loss == pytest.approx(oracle_loss(initial, batches[0], starts), rel=1e-6)
    assert first_loss != pytest.approx(oracle_loss(initial, batches[0], starts, prompt_too=True), rel=1e-6)

    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert result.global_step == STEPS and len(losses) == STEPS
    assert all(math.isfinite(loss) for loss in [*losses, result.training_loss])
    trained = dict(model.named_parameters())
    unchanged = [name for name, p in initial.named_parameters() if torch.equal(p, trained[name].detach())]
    assert not unchanged


def test_a_missing_dataset_is_named(tmp_path):
    with pytest.raises(SystemExit, match=f"no DistillKit dataset at {tmp_path}"):
        train_trl_sft.load_distillkit(tmp_path)


def test_a_root_of_another_kind_is_named_before_datasets_reads_it(distill_root, tmp_path):
    """A sealed synth_kd_v1 root verifies, and `datasets` then reads its .bin files as Parquet (a 30-line
    traceback ending in "Parquet magic bytes not found"); a split directory has no manifest of its own."""
    kd_root = write_synthetic_dataset(tmp_path / "kd", seed=1)
    with pytest.raises(SystemExit, match=re.escape(f"{kd_root} holds the dataset 'synthetic', not synth_distill")):
        train_trl_sft.load_distillkit(kd_root)
    split = distill_root / "train"
    with pytest.raises(
        SystemExit, match=re.escape(f"{split} is a directory inside a dataset: pass the dataset's root")
    ):
        train_trl_sft.load_distillkit(split)


@pytest.mark.parametrize("fault", ["stray part", "part lost", "row edited"])
def test_a_dataset_that_does_not_verify_is_not_loaded(distill_root, tmp_path, fault):
    """datasets reads every Parquet file under data_dir: a stray or lost part, or an edited one, is refused first."""
    root = tmp_path / "distill"
    shutil.copytree(distill_root, root)
    part = root / "train" / "part-00002.parquet"
    if fault == "stray part":
        shutil.copy(part, root / "train" / "part-00009.parquet")
        named = f"{root / 'train' / 'part-00009.parquet'} is not listed in the manifest"
    elif fault == "part lost":
        part.unlink()
        named = f"{part} is listed in the manifest but missing"
    else:
        table = pq.read_table(part)
        pq.write_table(table.slice(1).append_column("extra", pa.array([0] * (table.num_rows - 1))), part)
        named = f"{part} has"
    with pytest.raises(
        SystemExit, match=re.escape(f"the DistillKit dataset at {root} does not verify: ") + ".*" + re.escape(named)
    ):
        train_trl_sft.load_distillkit(root, tmp_path / "cache")
