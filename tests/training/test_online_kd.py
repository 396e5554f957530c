"""Online KD (synthkd_training.online_kd) and learning-progress labels (synthkd_training.progress).

Small stand-in models (an embedding and a linear head over the full padded vocabulary) check the rules against
independent oracles; the examples run end to end with megatron-core GPTModels, on synthetic trios and on the
sample's real synth_kd_v1 and held-out KL slice.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr

from examples import train_online_kd as online_kd_example
from examples import train_scorer as scorer_example
from examples import train_tiny
from synthkd_contract import constants
from synthkd_contract.manifest_seal import heldout_mismatch, verify_manifest, write_sealed
from synthkd_contract.stage_stream import read_stage_conversations
from synthkd_training.documents import batches_of, document_sample, stack_samples, window_start
from synthkd_training.losses import SpanLossConfig
from synthkd_training.models import GPTSpec, build_gpt, megatron_world, save_checkpoint
from synthkd_training.online_kd import OnlineKDConfig, heldout_kl, kd_step, make_optimizer, train_online_kd
from synthkd_training.progress import (
    Candidate,
    LPCadence,
    LPConfig,
    ReferencesMadeNoProgressError,
    StudentNotRestoredError,
    learning_progress_labels,
    restore,
    snapshot,
)
from synthkd_training.scorer import load_scorer
from synthkd_training.stream import pool_utilities

V = constants.PADDED_VOCAB_SIZE
SEQ = 12


class TinyLM(torch.nn.Module):
    """tokens -> [b, s, V] logits, GPTModel's call convention (position ids and mask unused)."""

    def __init__(self, seed: int, width: int = 4) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(V, width, generator=generator))
        self.head = torch.nn.Parameter(torch.randn(width, V, generator=generator) * 3)

    def forward(self, tokens, position_ids, attention_mask):
        return self.embed[tokens] @ self.head


def random_document(rng: np.random.Generator, length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A document in synth_kd_v1's layout: prompt then supervised spans, EOD last carrying 0/0."""
    tokens = rng.integers(0, 1000, size=length).astype(np.int32)
    tokens[-1] = constants.EOD_TOKEN_ID
    span = np.zeros(length, dtype=np.uint8)
    first = int(rng.integers(1, length - 1))
    span[first : length - 1] = rng.integers(1, 3, size=length - 1 - first)
    return tokens, (span > 0).astype(np.uint8), span


def batches(seed: int, count: int = 2, size: int = 2, seq: int = SEQ) -> list[dict]:
    rng = np.random.default_rng(seed)
    lengths = (8, 30) if seq == SEQ else (seq // 2, seq)
    samples = [document_sample(*random_document(rng, int(rng.integers(*lengths))), seq) for _ in range(count * size)]
    return batches_of(samples, size)


def train_teacher(common: list[str], tmp_path, steps: int) -> None:
    """examples/train_tiny.py trains the teacher briefly on the same data and saves it to tmp_path/teacher."""
    train_tiny.main(
        [*common, "--work-dir", str(tmp_path / "t"), "--steps", str(steps), "--lr", "1e-2", "--window", "3",
         "--save-checkpoint", str(tmp_path / "teacher")]
    )  # fmt: skip


def kl_oracle(student, teacher, batch_list) -> float:
    """KL(teacher || student) per supervised token, one position at a time in float64."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in batch_list:
            s = student(batch["tokens"], None, None).double()
            t = teacher(batch["tokens"], None, None).double()
            for b, i in (batch["span_id"] != 0).nonzero().tolist():
                p_t = torch.softmax(t[b, i], -1)
                total += float((p_t * (torch.log_softmax(t[b, i], -1) - torch.log_softmax(s[b, i], -1))).sum())
                tokens += 1
    return total / tokens


def test_heldout_kl_matches_a_per_position_oracle():
    student, teacher = TinyLM(1), TinyLM(2)
    heldout = batches(3)
    measured = heldout_kl(student, teacher, heldout)
    assert measured.tokens == sum(int((b["span_id"] != 0).sum()) for b in heldout)
    assert measured.kl == pytest.approx(kl_oracle(student, teacher, heldout), rel=1e-4)


def test_a_kd_step_moves_the_student_only_and_lowers_the_kl():
    student, teacher = TinyLM(1), TinyLM(2)
    teacher_before = snapshot(teacher)
    config = OnlineKDConfig(lr=5e-2)
    heldout = batches(4)
    summary = train_online_kd(student, teacher, iter(batches(5, count=8)), heldout, config, steps=8)
    assert all(torch.equal(teacher.state_dict()[k], v) for k, v in teacher_before.items())
    assert not any(p.requires_grad for p in teacher.parameters())
    assert summary.kl_fell and summary.heldout_after.kl < summary.heldout_before.kl
    # what 000 says must be logged, every step
    assert len(summary.steps) == 8
    assert {"kd/analysis/tokens", "kd/final/tokens", "kd/prompt/tokens", "kd/analysis/weight"} <= set(summary.steps[0])


@pytest.mark.parametrize("divergence", ["forward", "reverse", "mix"])
def test_every_divergence_and_the_ce_term_train(divergence):
    student, teacher = TinyLM(1), TinyLM(2)
    config = OnlineKDConfig(loss=SpanLossConfig(kd_divergence=divergence, kd_temperature=2.0), ce_weight=0.5, lr=5e-2)
    heldout = batches(4)
    summary = train_online_kd(student, teacher, iter(batches(5, count=6)), heldout, config, steps=6)
    assert summary.kl_fell
    assert "ce/loss" in summary.steps[0]


def test_student_and_teacher_must_share_the_vocabulary():
    class Narrow(torch.nn.Module):
        def forward(self, tokens, position_ids, attention_mask):
            return torch.zeros(*tokens.shape, 10, requires_grad=True)

    student = TinyLM(1)
    with pytest.raises(ValueError, match="share the tokenizer"):
        kd_step(student, Narrow(), batches(1, 1)[0], make_optimizer(student, OnlineKDConfig()), OnlineKDConfig())


@settings(max_examples=25, deadline=None)
@given(
    length=st.integers(2, 60),
    seq=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_document_sample_is_the_label_aligned_window(length, seq, seed):
    rng = np.random.default_rng(seed)
    tokens, mask, span = random_document(rng, max(length, 3))
    sample = document_sample(tokens, mask, span, seq)
    start = window_start(span, seq)
    for i in range(seq):  # oracle: position by position
        if start + i + 1 < len(tokens):
            assert sample["tokens"][i] == tokens[start + i] and sample["labels"][i] == tokens[start + i + 1]
            assert sample["span_id"][i] == span[start + i] and sample["loss_mask"][i] == mask[start + i]
        else:
            assert sample["tokens"][i] == constants.EOD_TOKEN_ID and sample["span_id"][i] == 0
    supervised = np.flatnonzero(span)
    if len(supervised):  # the window starts at most a quarter window before the first supervised position
        assert start <= supervised[0] and (start == 0 or supervised[0] - start == seq // 4)
    assert stack_samples([sample])["attention_mask"].shape == (1, 1, seq, seq)


def test_learning_progress_labels_restore_the_student_bit_for_bit_and_are_deterministic():
    student, teacher = TinyLM(1), TinyLM(2)
    config = LPConfig(k_updates=3, kd=OnlineKDConfig(lr=5e-2), seed=7)
    candidates = [Candidate(f"c{i}", batches(10 + i, count=2)) for i in range(3)]
    references = [Candidate(f"r{i}", batches(20 + i, count=2)) for i in range(2)]
    heldout = batches(4)
    before = snapshot(student)
    labels = learning_progress_labels(student, teacher, candidates, heldout, config, references, step=12)
    after = student.state_dict()
    assert all(torch.equal(after[k], v) for k, v in before.items())
    assert [label.key for label in labels] == ["r0", "r1", "c0", "c1", "c2"]
    assert [label.reference for label in labels] == [True, True, False, False, False]
    # deterministic, and independent of the order the candidates come in
    again = learning_progress_labels(student, teacher, candidates[::-1], heldout, config, references, step=12)
    assert {label.key: label for label in labels} == {label.key: label for label in again}
    reference_lp_raw = np.mean([label.lp_raw for label in labels if label.reference])
    for label in labels:
        item = next(c for c in (*candidates, *references) if c.key == label.key)
        # tokens_used: supervised tokens of the k updates, cycling through the item's batches
        expected = sum(int((item.batches[u % 2]["span_id"] != 0).sum()) for u in range(3))
        assert label.step == 12 and label.tokens_used == expected
        assert label.lp_raw == pytest.approx((label.kl_before - label.kl_after) / expected)
        assert label.reference_lp_raw == pytest.approx(reference_lp_raw)
        assert label.lp_value == pytest.approx(label.lp_raw / reference_lp_raw - 1)
        assert label.kl_before == pytest.approx(heldout_kl(student, teacher, heldout).kl)
        assert label.kl_after < label.kl_before  # a few KD updates towards the teacher help on this toy


def test_learning_progress_labels_refuse_a_round_they_cannot_make_comparable():
    student, teacher = TinyLM(1), TinyLM(2)
    config, heldout = LPConfig(k_updates=1, kd=OnlineKDConfig(lr=5e-2)), batches(4)
    candidate = Candidate("c", batches(10))
    with pytest.raises(ValueError, match="at least one reference"):
        learning_progress_labels(student, teacher, [candidate], heldout, config, [])
    with pytest.raises(ValueError, match=r"key\(s\) \['c'\] given twice"):
        learning_progress_labels(student, teacher, [candidate], heldout, config, [candidate])
    # references without a supervised token teach nothing: no progress to measure the candidates against
    silent = Candidate("silent", [{**batch, "span_id": torch.zeros_like(batch["span_id"])} for batch in batches(11)])
    with pytest.raises(ReferencesMadeNoProgressError, match="at step 3 the 1 reference"):
        learning_progress_labels(student, teacher, [candidate], heldout, config, [silent], step=3)


def heldout_enriched(heldout: list[dict], share: float, seed: int) -> list[dict]:
    """Batches of the held-out slice's distribution (`batches(seed)`) with a `share` of their tokens replaced by
    tokens drawn from the held-out slice's supervised positions: the larger the share, the more a KD update on
    them lowers the held-out KL (TinyLM's logits at a position depend on its token only). The same draws for
    every share, so the replaced positions of a smaller share are a subset of a larger one's."""
    pool = torch.cat([batch["tokens"][batch["span_id"] != 0] for batch in heldout])
    generator = torch.Generator().manual_seed(seed)
    enriched = []
    for batch in batches(seed, seq=32):
        draw = torch.rand(batch["tokens"].shape, generator=generator)
        picks = pool[torch.randint(len(pool), batch["tokens"].shape, generator=generator)]
        replace = (draw < share) & (batch["tokens"] != constants.EOD_TOKEN_ID)
        enriched.append({**batch, "tokens": torch.where(replace, picks, batch["tokens"])})
    return enriched


def round_share(values: np.ndarray) -> float:
    """rounds x items: an item's spread over the rounds (its standard deviation, averaged over the items) over
    the spread between the items (the standard deviation of their means). Near 0: the value measures the item;
    1 or more: the round moves it as much as the item does."""
    return float(values.std(axis=0, ddof=1).mean() / values.mean(axis=0).std(ddof=1))


def test_lp_values_measure_the_candidate_not_the_round():
    """Planted: four candidates of one family, each more useful than the last (a share of 5, 15, 25, 35 % of
    their tokens drawn from the held-out slice), and two references of the same family (15 and 25 %, other
    draws), labelled in three rounds: the student after 0, 10 and 30 KD steps on other batches. The raw progress
    per token falls as the student trains, by as much as it differs between the candidates; relative to the
    references, each round orders the candidates as planted and the round barely moves a candidate's value."""
    student, teacher = TinyLM(1), TinyLM(2)
    heldout = batches(4, seq=32)
    candidates = [Candidate(f"c{share}", heldout_enriched(heldout, share, 20)) for share in (0.05, 0.15, 0.25, 0.35)]
    references = [
        Candidate(f"r{share}", heldout_enriched(heldout, share, 40 + i)) for i, share in enumerate((0.15, 0.25))
    ]
    config = LPConfig(k_updates=2, kd=OnlineKDConfig(lr=5e-2), seed=7)
    training = OnlineKDConfig(lr=0.5)
    optimizer = make_optimizer(student, training)
    raw, comparable, trained = [], [], 0
    for step in (0, 10, 30):
        for batch in batches(100 + trained, count=step - trained, seq=32):  # trains the student to this step
            kd_step(student, teacher, batch, optimizer, training)
        trained = step
        labels = learning_progress_labels(student, teacher, candidates, heldout, config, references, step)
        labels = [label for label in labels if not label.reference]
        assert [label.key for label in labels] == [c.key for c in candidates]
        raw.append([label.lp_raw for label in labels])
        comparable.append([label.lp_value for label in labels])
    raw, comparable = np.array(raw), np.array(comparable)
    # the drift the labels must not carry: raw values fall with the round as much as they differ by candidate
    assert (np.diff(raw.mean(axis=1)) < 0).all()
    assert round_share(raw) > 0.5
    planted = np.tile(np.arange(len(candidates)), len(raw))
    assert spearmanr(raw.ravel(), planted).statistic < 0.9
    # comparable values: the planted order in every round, and pooled over the rounds the candidate explains them
    assert all((np.diff(row) > 0).all() for row in comparable)
    assert round_share(comparable) < 0.3
    assert spearmanr(comparable.ravel(), planted).statistic >= 0.9


def test_a_student_that_is_not_restored_is_an_error():
    class Stubborn(TinyLM):
        """Hands out a copy of `head` in its state dict: restoring through it cannot reach the parameter."""

        def state_dict(self, *args, **kwargs):
            state = super().state_dict(*args, **kwargs)
            state["head"] = state["head"].clone()
            return state

    student = Stubborn(1)
    saved = snapshot(student)
    with torch.no_grad():
        student.head.add_(1.0)
    with pytest.raises(StudentNotRestoredError, match="head"):
        restore(student, saved)
    plain = TinyLM(1)
    saved = snapshot(plain)
    with torch.no_grad():
        plain.head.add_(1.0)
    restore(plain, saved)
    assert torch.equal(plain.head, saved["head"])


def test_cadence():
    cadence = LPCadence(warmup_steps=10, every_steps=5)
    assert [s for s in range(1, 31) if cadence.due(s)] == [10, 15, 20, 25, 30]
    assert not any(LPCadence(every_steps=0).due(s) for s in range(1, 100))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_online_kd_example_on_synthetic_trios(tmp_path, capsys):
    """A teacher trained by train_tiny, a smaller student distilled from it: the held-out KL falls."""
    common = ["--synthetic", "--device", "cpu", "--seq-length", "32", "--micro-batch-size", "2"]
    train_teacher(common, tmp_path, steps=10)
    summary = online_kd_example.main(
        [
            *common,
            "--work-dir",
            str(tmp_path / "s"),
            "--teacher-checkpoint",
            str(tmp_path / "teacher"),
            "--steps",
            "8",
            "--lr",
            "1e-2",
            "--heldout-size",
            "4",
            "--lp-every",
            "4",
            "--lp-warmup",
            "4",
            "--lp-candidates",
            "1",
            "--lp-k",
            "1",
            "--lp-output",
            str(tmp_path / "lp.parquet"),
            "--save-checkpoint",
            str(tmp_path / "student"),
        ]
    )
    out = capsys.readouterr().out
    assert summary["heldout_after"] < summary["heldout_before"]
    assert "valid/ trios" in summary["heldout_source"]
    # the student is saved in the format the pool's valuation loads ($SYNTHKD_STUDENT_CHECKPOINT)
    spec = json.loads((tmp_path / "student" / "gpt_spec.json").read_text())
    assert (spec["num_layers"], spec["hidden_size"], spec["seq_length"]) == (1, 32, 32)
    assert f"student checkpoint written to {tmp_path / 'student'}" in out
    assert out.count("analysis kd") == 8 and "n=" in out and "w=" in out
    table = pq.read_table(tmp_path / "lp.parquet")
    assert table.schema == online_kd_example.LP_SCHEMA
    labels = table.to_pylist()
    # each round: the run's two references (the same conversations every round), then its one candidate
    assert [(row["round"], row["step"], row["reference"]) for row in labels] == [
        (0, 4, True), (0, 4, True), (0, 4, False), (1, 8, True), (1, 8, True), (1, 8, False)
    ]  # fmt: skip
    references = [[row["key"] for row in labels if row["reference"] and row["round"] == r] for r in (0, 1)]
    assert references[0] == references[1] and len(set(references[0])) == 2
    assert not {row["key"] for row in labels if not row["reference"]} & set(references[0])
    for row in labels:
        same_round = [other for other in labels if other["round"] == row["round"]]
        assert row["tokens_used"] > 0 and row["kl_before"] == same_round[0]["kl_before"]
        assert row["lp_raw"] == pytest.approx((row["kl_before"] - row["kl_after"]) / row["tokens_used"])
        assert row["reference_lp_raw"] == pytest.approx(np.mean([o["lp_raw"] for o in same_round if o["reference"]]))
        assert row["lp_value"] == pytest.approx(row["lp_raw"] / row["reference_lp_raw"] - 1)
    assert out.count("(reference) | lp_value") == 4 and "6 learning-progress labels of 2 rounds" in out
    assert not torch.distributed.is_initialized()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_online_kd_lowers_the_heldout_kl_on_the_sample_and_its_labels_train_the_scorer(
    built_sample, tmp_path, monkeypatch
):
    """On the sample's synth_kd_v1, measured on the held-out KL slice synth_clusters keeps out of training; the LP
    labels are of pool rows, and examples/train_scorer.py trains and seals a scorer on them and the valuation
    features."""
    _, layout, data_dir = built_sample
    monkeypatch.setenv("SYNTHKD_DATA_DIR", str(data_dir))
    common = ["--device", "cpu", "--micro-batch-size", "2", "--seq-length", "32"]
    train_teacher(common, tmp_path, steps=12)
    summary = online_kd_example.main(
        [*common, "--work-dir", str(tmp_path / "s"), "--teacher-checkpoint", str(tmp_path / "teacher"),
         "--steps", "8", "--lr", "1e-2", "--heldout-size", "6",
         "--lp-every", "4", "--lp-candidates", "3", "--lp-k", "1", "--lp-output", str(tmp_path / "lp.parquet")]
    )  # fmt: skip
    assert "heldout_kl.parquet (6 conversations)" in summary["heldout_source"]
    assert summary["heldout_after"] < summary["heldout_before"]
    labels = pq.read_table(tmp_path / "lp.parquet").to_pylist()
    assert len(labels) == 2 * (3 + 2)  # two rounds of 3 candidates and the 2 references
    pool = pl.concat(pl.read_parquet(p) for p in sorted((data_dir / "pool/synth_pool_v1/parts").glob("*.parquet")))
    pool_ids = dict(zip(pool["source_example_id"], pool["id"]))
    # keyed by synth_id: candidates are pool rows, labels carry the pool id
    assert all(row["key"] in pool_ids and pool_ids[row["key"]] == row["id"] for row in labels)

    trained = scorer_example.main(
        ["--labels", str(tmp_path / "lp.parquet"), "--output", str(tmp_path / "scorer"),
         "--scored", str(tmp_path / "scored.parquet"), "--epochs", "20"]
    )  # fmt: skip
    labelled_buckets = set(pool.filter(pl.col("id").is_in([row["id"] for row in labels]))["skill_bucket"])
    assert set(trained["buckets"]) == labelled_buckets
    assert sum(row["labelled"] for row in trained["summary"]) == len({row["id"] for row in labels})
    scored = pl.read_parquet(tmp_path / "scored.parquet")
    assert scored.height == pool.filter(pl.col("skill_bucket").is_in(labelled_buckets)).height
    assert scored["utility_score"].is_between(0, 1).all()
    assert (scored["sampling_weight"] - scored["utility_score"].exp()).abs().max() < 1e-12  # tau 1
    assert load_scorer(tmp_path / "scorer").buckets == tuple(sorted(labelled_buckets))
    # a handful of labels and no checkpoints when the features ran: it trains, and says how thin that is
    assert any(w.startswith("teacher_entropy, ") and "null on every row" in w for w in trained["warnings"])
    assert any("labelled rows (fewer than 8): its head fits noise" in w for w in trained["warnings"])


def test_a_heldout_slice_that_does_not_verify_is_refused(built_sample, tmp_path):
    """The KL the run is judged by is measured on the slice the build sealed, not a torn or edited file."""
    paths = built_sample[1].data_layout(False)
    root, tokenizer_dir = tmp_path / "validation", paths.tokenizer_dir()
    shutil.copytree(paths.validation_root(), root)
    kd_root = paths.megatron_root()
    assert len(online_kd_example._rendered_heldout(root / "heldout_kl.parquet", tokenizer_dir, 3, kd_root)) == 3
    with open(root / "heldout_kl.parquet", "ab") as handle:
        handle.write(b"appended")
    with pytest.raises(SystemExit, match=r"the held-out slice .*heldout_kl.parquet does not verify: .* bytes, the"):
        online_kd_example._rendered_heldout(root / "heldout_kl.parquet", tokenizer_dir, 3, kd_root)


def test_a_heldout_slice_of_another_plan_is_refused(built_sample, tmp_path):
    """A build stopped after its plan pass rewrote the validation sets (from new clusters) and before its
    manifests leaves them beside the last build's datasets, each verifying alone: measuring KL on them could
    measure rows the student trained on. The sets and the dataset record the clusters they came from."""
    paths = built_sample[1].data_layout(False)
    root = tmp_path / "validation"
    shutil.copytree(paths.validation_root(), root)
    for dataset in (paths.megatron_root(), paths.distill_root(), paths.pool_root()):
        assert heldout_mismatch(dataset, root) is None
    manifest = json.loads((root / "manifest.json").read_text())
    write_sealed(root / "manifest.json", {**manifest, "clusters_sha256": "0" * 64})  # as a re-plan writes it
    verify_manifest(root)  # it verifies alone
    with pytest.raises(SystemExit, match=re.escape(f"{root} was held out of other clusters (000000000000) than")):
        online_kd_example._rendered_heldout(
            root / "heldout_kl.parquet", paths.tokenizer_dir(), 3, paths.megatron_root()
        )


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_online_kd_example_with_a_gpt_oss_checkpoint_as_teacher(gpt_oss_checkpoint, tmp_path):
    """The teacher given as a Hugging Face GPT-OSS checkpoint path (GptOssForCausalLM at toy size)."""
    summary = online_kd_example.main(
        ["--synthetic", "--device", "cpu", "--seq-length", "32", "--micro-batch-size", "2",
         "--work-dir", str(tmp_path / "s"), "--teacher-checkpoint", str(gpt_oss_checkpoint),
         "--steps", "6", "--lr", "1e-2", "--heldout-size", "4"]
    )  # fmt: skip
    assert summary["heldout_after"] < summary["heldout_before"]


def test_the_scorer_example_names_missing_labels(tmp_path):
    with pytest.raises(SystemExit, match=f"no labels at {tmp_path / 'lp.parquet'}"):
        scorer_example.read_labels(tmp_path / "lp.parquet")


def test_the_scorer_example_averages_a_rows_lp_values_over_rounds(tmp_path, capsys):
    """What train_scorer.py trains on is lp_value, relative to each round's references; a row labelled in two
    rounds gets the mean of its two values, whatever their raw values."""
    rows = [
        {"key": "a", "id": "pa", "round": 0, "step": 4, "lp_raw": 1e-3, "reference_lp_raw": 1e-3, "lp_value": 0.0},
        {"key": "a", "id": "pa", "round": 1, "step": 8, "lp_raw": 3e-3, "reference_lp_raw": 2e-3, "lp_value": 0.5},
        {"key": "b", "id": "pb", "round": 1, "step": 8, "lp_raw": 1e-3, "reference_lp_raw": 2e-3, "lp_value": -0.5},
        {"key": "c", "id": None, "round": 1, "step": 8, "lp_raw": 2e-3, "reference_lp_raw": 2e-3, "lp_value": 0.0},
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=online_kd_example.LP_SCHEMA), tmp_path / "lp.parquet")
    labels = scorer_example.read_labels(tmp_path / "lp.parquet")
    assert labels.to_dicts() == [{"id": "pa", "lp_value": 0.25}, {"id": "pb", "lp_value": -0.5}]
    assert "1 of 4 labels are of conversations outside the pool" in capsys.readouterr().out
    # progress per token alone drifts with the round it was measured in: refused, not averaged
    pq.write_table(pa.Table.from_pylist(rows).drop(["reference_lp_raw"]), tmp_path / "raw.parquet")
    with pytest.raises(SystemExit, match=r"raw.parquet has no reference_lp_raw column: .* do not compare across"):
        scorer_example.read_labels(tmp_path / "raw.parquet")


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_online_kd_trains_on_a_pool_stage_drawn_by_a_sealed_scorer(built_sample, tmp_path, monkeypatch):
    """The closed loop's last step: a scorer sealed by examples/train_scorer.py (here on planted labels) weighs the
    draw of P1's stream; the example trains through the stream and records the scorer in its sampling manifest."""
    _, layout, data_dir = built_sample
    monkeypatch.setenv("SYNTHKD_DATA_DIR", str(data_dir))
    paths = layout.data_layout()
    pool = pl.concat(pl.read_parquet(p) for p in sorted((paths.pool_root() / "parts").glob("*.parquet")))
    planted = pl.col("prompt_tokens_est").cast(pl.Float64) / 1000
    labels = pool.select("id", lp_value=planted, reference_lp_raw=pl.lit(1.0))
    labels.write_parquet(tmp_path / "labels.parquet")
    scorer_example.main(
        ["--labels", str(tmp_path / "labels.parquet"), "--output", str(tmp_path / "scorer"), "--epochs", "5"]
    )
    common = ["--device", "cpu", "--micro-batch-size", "1", "--seq-length", "2048"]  # P1's windows
    train_tiny.main(
        [*common, "--work-dir", str(tmp_path / "t"), "--steps", "2", "--num-layers", "1", "--hidden-size", "16",
         "--num-attention-heads", "2", "--save-checkpoint", str(tmp_path / "teacher")]
    )  # fmt: skip
    manifest_path = tmp_path / "run" / "sampling.json"
    stage_words = shlex.split(
        " ".join(line for line in (paths.curriculum_dir() / "P1.args").read_text().splitlines() if line[:1] != "#")
    )  # the stage as Megatron-LM's arguments: $(grep -v '^#' P1.args)
    summary = online_kd_example.main(
        [*stage_words, "--device", "cpu", "--micro-batch-size", "1", "--work-dir", str(tmp_path / "s"),
         "--teacher-checkpoint", str(tmp_path / "teacher"), "--stage-tokens", "3000",
         "--scorer", str(tmp_path / "scorer"), "--stream-tau", "4", "--stream-epsilon", "0.1",
         "--sampling-manifest", str(manifest_path), "--lr", "1e-2", "--heldout-size", "1",
         "--hidden-size", "16", "--save-checkpoint", str(tmp_path / "student")]
    )  # fmt: skip
    assert summary["sampling_manifest"] == str(manifest_path) and summary["heldout_after"] < summary["heldout_before"]
    run = json.loads(manifest_path.read_text())
    (manifest,) = run["stages"]
    # the stage stopped at its (rehearsal) budget: every window trained, the last one reaching 3000 real tokens
    assert summary["stage_steps"] == {"P1": manifest["windows"]} and manifest["consumed_samples"] == manifest["windows"]
    assert manifest["token_budget"] == 3000 and 2 <= manifest["windows"] <= 3
    scorer_sha = hashlib.sha256((tmp_path / "scorer" / constants.MANIFEST_FILENAME).read_bytes()).hexdigest()
    assert manifest["scorers"] == [{"first_epoch": 0, "scorer_sha256": scorer_sha}]
    assert manifest["policy"]["tau"] == 4.0 and manifest["policy"]["epsilon"] == 0.1
    assert manifest["epochs"][0]["scorer_sha256"] == scorer_sha  # (3 windows are too few to hold the mix)
    assert manifest["stage"] == "P1" and manifest["seq_length"] == 2048
    # 002's export: the data and sampling manifest beside the checkpoint
    student = tmp_path / "student"
    assert json.loads((student / "sampling_manifest.json").read_text()) == run
    assert (student / "data_manifest.json").read_bytes() == paths.pool_manifest().read_bytes()
    assert hashlib.sha256(paths.pool_manifest().read_bytes()).hexdigest() == manifest["pool_manifest_sha256"]
    step = summary["steps"][0]  # trained on whole conversations: prompt and supervised tokens in the window
    assert step["kd/prompt/tokens"] > 0 and step["kd/analysis/tokens"] + step["kd/final/tokens"] > 0
    # every conversation of the stage got the scorer's utility of its row (the features cover the pool)
    utilities = pool_utilities(tmp_path / "scorer", paths.valuation_root())
    phase = utilities.phase(read_stage_conversations(paths.curriculum_dir() / "P1.json"))
    assert phase.scorer_sha256 == scorer_sha and np.isfinite(phase.utility).all() and np.ptp(phase.utility) > 0
    # the scorer is read once for every stage, and one edited after it was sealed stops the run before it trains
    (tmp_path / "scorer" / "heads.pt").write_bytes(b"edited")
    with pytest.raises(SystemExit, match=r"^--scorer .*scorer: .*heads\.pt"):
        online_kd_example.main(
            [*stage_words, "--device", "cpu", "--work-dir", str(tmp_path / "s2"), "--teacher-checkpoint",
             str(tmp_path / "teacher"), "--scorer", str(tmp_path / "scorer"), "--hidden-size", "16"]
        )  # fmt: skip


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_tiny_student_distills_on_the_pools_p1_then_p2_through_the_stream(built_sample, tmp_path, monkeypatch):
    """The stream end to end: a tiny student distills from a tiny teacher on the pool's curriculum, P1's
    2048-position windows then P2's 8192-position ones, each stage to its (rehearsal) budget; the KD loss and the
    held-out KL fall over both. P2's windows train on this CPU because the losses make the logits chunk by chunk
    (`HeadedLogits`): whole, one window's student logits and their gradient are 13 GB."""
    _, layout, data_dir = built_sample
    monkeypatch.setenv("SYNTHKD_DATA_DIR", str(data_dir))
    curriculum = layout.data_layout().curriculum_dir()
    spec = GPTSpec(num_layers=1, hidden_size=16, num_attention_heads=2, seq_length=8192)  # P2's window
    with megatron_world(torch.device("cpu"), seed=5):
        save_checkpoint(build_gpt(spec, torch.device("cpu"), 1), spec, tmp_path / "teacher")
    summary = online_kd_example.main(
        ["--stage-args", str(curriculum / "P1.args"), "--stage-args", str(curriculum / "P2.args"),
         "--stage-tokens", "2500", "--device", "cpu", "--micro-batch-size", "1", "--work-dir", str(tmp_path / "s"),
         "--teacher-checkpoint", str(tmp_path / "teacher"), "--lr", "1e-2", "--heldout-size", "2",
         "--hidden-size", "16", "--save-checkpoint", str(tmp_path / "student")]
    )  # fmt: skip
    run = json.loads((tmp_path / "student" / "sampling_manifest.json").read_text())
    assert [(stage["stage"], stage["seq_length"]) for stage in run["stages"]] == [("P1", 2048), ("P2", 8192)]
    steps = summary["stage_steps"]
    assert list(steps) == ["P1", "P2"] and steps["P1"] >= 2 and steps["P2"] >= 1
    assert [stage["consumed_samples"] for stage in run["stages"]] == [steps["P1"], steps["P2"]]
    kd = [step["kd/loss"] for step in summary["steps"]]
    assert len(kd) == steps["P1"] + steps["P2"] and kd[-1] < kd[0]  # P2's last update against P1's first
    p2 = summary["steps"][-1]  # whole conversations in an 8192-position window
    assert p2["kd/analysis/tokens"] + p2["kd/final/tokens"] > 2048  # more supervised tokens than P1's window holds
    (before, _), (p1_end, after_p1), (p2_end, after_p2) = summary["heldout_trace"]
    assert (before, p1_end, p2_end) == (0, steps["P1"], steps["P1"] + steps["P2"])
    assert summary["heldout_before"] > after_p1 > after_p2 == summary["heldout_after"]
    # resumed: the saved student, P1 after its first window, micro batches of 2 (the last one, of 1, trains too)
    resumed = online_kd_example.main(
        ["--stage-args", str(curriculum / "P1.args"), "--stage-tokens", "2500", "--consumed-samples", "1",
         "--student-checkpoint", str(tmp_path / "student"), "--device", "cpu", "--micro-batch-size", "2",
         "--work-dir", str(tmp_path / "r"), "--teacher-checkpoint", str(tmp_path / "teacher"), "--lr", "1e-3",
         "--heldout-size", "2"]
    )  # fmt: skip
    assert resumed["stage_steps"] == {"P1": steps["P1"] - 1}
    assert resumed["heldout_before"] == pytest.approx(summary["heldout_after"], rel=1e-4)  # not a new student
    (stage,) = json.loads((tmp_path / "r" / "sampling.json").read_text())["stages"]
    assert stage["consumed_samples"] == stage["windows"] == steps["P1"]
