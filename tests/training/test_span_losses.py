"""Span-normalized CE / KD against a slow scalar reference, gradchecks, empty spans, masking property."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from synthkd_training.losses import (
    SpanLossConfig,
    per_token_cross_entropy,
    per_token_kd,
    span_ce_loss,
    span_kd_loss,
    span_normalized_loss,
)

PLAIN = {"tensor_parallel": False}


# -- slow reference: python floats, one position at a time -----------------------------------
def _log_softmax(row: list[float]) -> list[float]:
    top = max(row)
    log_total = top + math.log(sum(math.exp(x - top) for x in row))
    return [x - log_total for x in row]


def _reference_per_token(kind: str, logits, labels, teacher, config: SpanLossConfig) -> list[float]:
    flat = logits.reshape(-1, logits.shape[-1]).tolist()
    out = []
    for position, row in enumerate(flat):
        row = row[: config.vocab_size_valid]  # padding columns never get probability
        if kind == "ce":
            out.append(-_log_softmax(row)[int(labels.reshape(-1)[position])])
            continue
        t = config.kd_temperature
        teacher_row = teacher.reshape(-1, teacher.shape[-1]).tolist()[position][: config.vocab_size_valid]
        log_s = _log_softmax([x / t for x in row])
        log_t = _log_softmax([x / t for x in teacher_row])
        forward = sum(math.exp(lt) * (lt - ls) for lt, ls in zip(log_t, log_s))
        reverse = sum(math.exp(ls) * (ls - lt) for lt, ls in zip(log_t, log_s))
        value = {
            "forward": forward,
            "reverse": reverse,
            "mix": config.kd_forward_weight * forward + (1 - config.kd_forward_weight) * reverse,
        }[config.kd_divergence]
        out.append(value * (t * t if config.kd_scale_by_temperature_squared else 1.0))
    return out


def _reference(kind: str, logits, labels, teacher, span_id, config: SpanLossConfig) -> dict:
    per_token = _reference_per_token(kind, logits, labels, teacher, config)
    spans = span_id.reshape(-1).tolist()
    result = {"loss": 0.0, "counts": {}, "means": {}, "weights": {}}
    result["counts"]["prompt"] = spans.count(0)
    for sid, name, weight in ((1, "analysis", config.w_reasoning), (2, "final", config.w_final)):
        values = [v for v, s in zip(per_token, spans) if s == sid]
        mean = sum(values) / len(values) if values else 0.0
        result["counts"][name] = len(values)
        result["means"][name] = mean
        result["weights"][name] = weight if values else 0.0
        result["loss"] += weight * mean
    return result


def _inputs(seed: int, shape=(3, 5), vocab=13, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(*shape, vocab, generator=generator, dtype=dtype) * 3
    teacher = torch.randn(*shape, vocab, generator=generator, dtype=dtype) * 3
    labels = torch.randint(0, vocab, shape, generator=generator)
    span_id = torch.randint(0, 3, shape, generator=generator)
    return logits, labels, teacher, span_id


def _assert_matches(result, expected, atol=1e-10):
    assert result.loss.item() == pytest.approx(expected["loss"], abs=atol, rel=1e-9)
    for name, count in expected["counts"].items():
        assert int(result.token_counts[name]) == count
    for name in ("analysis", "final"):
        assert result.span_losses[name].item() == pytest.approx(expected["means"][name], abs=atol, rel=1e-9)
        assert result.effective_weights[name].item() == expected["weights"][name]
    # the figure steps are compared by: the weighted mean of the spans present, NaN when none is
    weights = sum(expected["weights"].values())
    if weights > 0:
        mean = sum(expected["weights"][n] * expected["means"][n] for n in ("analysis", "final")) / weights
        assert result.per_span_mean() == pytest.approx(mean, abs=atol, rel=1e-9)
    else:
        assert math.isnan(result.per_span_mean())
    log = result.log_dict("train/")
    assert set(log) == {
        "train/loss",
        "train/prompt/tokens",
        "train/analysis/tokens",
        "train/final/tokens",
        "train/analysis/loss",
        "train/final/loss",
        "train/analysis/weight",
        "train/final/weight",
    }


CONFIGS = [
    SpanLossConfig(),
    SpanLossConfig(w_reasoning=0.3, w_final=2.0, vocab_size_valid=10),
    SpanLossConfig(kd_divergence="reverse", kd_temperature=2.0, vocab_size_valid=11),
    SpanLossConfig(kd_divergence="mix", kd_forward_weight=0.25, kd_temperature=0.7, w_final=0.5),
    SpanLossConfig(kd_divergence="forward", kd_temperature=3.0, kd_scale_by_temperature_squared=False),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_ce_matches_slow_reference(config, seed):
    logits, labels, teacher, span_id = _inputs(seed)
    labels = labels.clamp(max=config.vocab_size_valid - 1)
    result = span_ce_loss(logits, labels, span_id, config, **PLAIN)
    _assert_matches(result, _reference("ce", logits, labels, None, span_id, config))


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_kd_matches_slow_reference(config, seed):
    logits, labels, teacher, span_id = _inputs(seed)
    result = span_kd_loss(logits, teacher, span_id, config, **PLAIN)
    _assert_matches(result, _reference("kd", logits, None, teacher, span_id, config))


def test_float32_and_bfloat16_inputs_reduce_in_float32():
    logits, labels, teacher, span_id = _inputs(3)
    exact = span_kd_loss(logits, teacher, span_id, **PLAIN).loss
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 5e-2)):
        result = span_kd_loss(logits.to(dtype), teacher.to(dtype), span_id, **PLAIN)
        assert result.loss.dtype == torch.float32
        assert result.loss.item() == pytest.approx(exact.item(), rel=tol)
        ce = span_ce_loss(logits.to(dtype), labels, span_id, **PLAIN)
        assert ce.loss.dtype == torch.float32


def test_padded_vocab_columns_get_no_probability():
    logits, labels, teacher, span_id = _inputs(4, vocab=12)
    config = SpanLossConfig(vocab_size_valid=9)
    labels = labels % 9
    base_ce = span_ce_loss(logits, labels, span_id, config, **PLAIN).loss
    base_kd = span_kd_loss(logits, teacher, span_id, config, **PLAIN).loss
    logits2, teacher2 = logits.clone(), teacher.clone()
    logits2[..., 9:] = 1e4  # would dominate every softmax if padding counted
    teacher2[..., 9:] = -1e4
    assert span_ce_loss(logits2, labels, span_id, config, **PLAIN).loss.item() == base_ce.item()
    assert span_kd_loss(logits2, teacher2, span_id, config, **PLAIN).loss.item() == base_kd.item()
    student = logits.clone().requires_grad_()
    span_kd_loss(student, teacher, span_id, config, **PLAIN).loss.backward()
    assert torch.all(student.grad[..., 9:] == 0)


# -- gradients ------------------------------------------------------------------------------
@pytest.mark.parametrize("config", CONFIGS[1:4])
def test_gradcheck_float64(config):
    logits, labels, teacher, span_id = _inputs(5, shape=(2, 3), vocab=12)
    labels = labels % config.vocab_size_valid
    span_id = torch.tensor([[0, 1, 2], [2, 1, 1]])
    student = logits.clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: span_ce_loss(x, labels, span_id, config, **PLAIN).loss, (student,))
    assert torch.autograd.gradcheck(lambda x: span_kd_loss(x, teacher, span_id, config, **PLAIN).loss, (student,))
    per_token = torch.rand(2, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: span_normalized_loss(x, span_id, config).loss, (per_token,))


# -- empty spans ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spans, present",
    [
        ([0, 1, 1, 0, 1], {"analysis"}),
        ([2, 0, 2, 2, 0], {"final"}),
        ([0, 0, 0, 0, 0], set()),
        ([1, 2, 0, 1, 2], {"analysis", "final"}),
    ],
)
@pytest.mark.parametrize("kind", ["ce", "kd"])
def test_empty_spans_contribute_zero_and_are_reported(spans, present, kind):
    logits, labels, teacher, _ = _inputs(6, shape=(1, 5))
    span_id = torch.tensor([spans])
    config = SpanLossConfig(w_reasoning=0.5, w_final=3.0)
    student = logits.clone().requires_grad_()
    if kind == "ce":
        result = span_ce_loss(student, labels, span_id, config, **PLAIN)
    else:
        result = span_kd_loss(student, teacher, span_id, config, **PLAIN)
    result.loss.backward()
    assert torch.isfinite(result.loss) and torch.all(torch.isfinite(student.grad))
    for name, weight in (("analysis", 0.5), ("final", 3.0)):
        if name in present:
            assert int(result.token_counts[name]) > 0 and result.effective_weights[name].item() == weight
        else:
            assert int(result.token_counts[name]) == 0
            assert result.span_losses[name].item() == 0.0 and result.span_loss_sums[name].item() == 0.0
            assert result.effective_weights[name].item() == 0.0
    if not present:
        assert result.loss.item() == 0.0 and torch.all(student.grad == 0)
        assert math.isnan(result.per_span_mean())
    else:  # the weighted mean of the spans present (one alone: its own mean, whatever its weight)
        only = {"analysis": 0.5, "final": 3.0}
        mean = sum(only[n] * result.span_losses[n].item() for n in present) / sum(only[n] for n in present)
        assert result.per_span_mean() == pytest.approx(mean)
    expected = sum(result.effective_weights[n] * result.span_losses[n] for n in ("analysis", "final"))
    assert result.loss.item() == pytest.approx(float(expected))


def test_masked_positions_may_hold_anything():
    """Megatron maps padding labels to 0; a masked label out of range or non-finite logits there
    must not turn into NaN."""
    logits, labels, teacher, _ = _inputs(7, shape=(1, 4))
    span_id = torch.tensor([[1, 0, 2, 0]])
    labels[0, 1] = 10**6
    logits[0, 3] = float("inf")
    student = logits.clone().requires_grad_()
    result = span_ce_loss(student, labels, span_id, **PLAIN)
    result.loss.backward()
    assert torch.isfinite(result.loss) and torch.all(torch.isfinite(student.grad[0, [0, 1, 2]]))


def test_shape_and_dtype_errors():
    logits, labels, teacher, span_id = _inputs(8)
    with pytest.raises(ValueError, match="do not match"):
        span_ce_loss(logits, labels, span_id[:, :-1], **PLAIN)
    with pytest.raises(ValueError, match="differ in shape"):
        span_kd_loss(logits, teacher[..., :-1], span_id, **PLAIN)
    with pytest.raises(TypeError, match="integer"):
        span_normalized_loss(torch.rand(3), torch.rand(3))
    with pytest.raises(ValueError):
        SpanLossConfig(kd_divergence="jsd")
    with pytest.raises(ValueError):
        SpanLossConfig(w_final=-1.0)


# -- the property: masking is exactly where span_id == 0 ------------------------------------
@st.composite
def _batches(draw):
    rows = draw(st.integers(1, 3))
    cols = draw(st.integers(1, 6))
    vocab = draw(st.integers(2, 9))
    valid = draw(st.integers(2, vocab))
    spans = draw(st.lists(st.integers(0, 2), min_size=rows * cols, max_size=rows * cols))
    seed = draw(st.integers(0, 2**31 - 1))
    kind = draw(st.sampled_from(["ce", "forward", "reverse", "mix"]))
    temperature = draw(st.sampled_from([0.5, 1.0, 2.0]))
    return rows, cols, vocab, valid, spans, seed, kind, temperature


def _loss(kind, student, labels, teacher, span_id, config):
    if kind == "ce":
        return span_ce_loss(student, labels, span_id, config, **PLAIN).loss
    return span_kd_loss(student, teacher, span_id, config, **PLAIN).loss


@settings(max_examples=60, deadline=None)
@given(_batches())
def test_masking_is_exactly_where_span_id_is_zero(batch):
    rows, cols, vocab, valid, spans, seed, kind, temperature = batch
    generator = torch.Generator().manual_seed(seed)
    student = torch.randn(rows, cols, vocab, generator=generator, dtype=torch.float64)
    # a teacher that differs from the student by a non-constant shift on every row
    teacher = student + torch.linspace(-1.0, 1.0, vocab, dtype=torch.float64) * (
        1 + torch.rand(rows, cols, 1, generator=generator, dtype=torch.float64)
    )
    labels = torch.randint(0, valid, (rows, cols), generator=generator)
    span_id = torch.tensor(spans).reshape(rows, cols)
    config = SpanLossConfig(
        vocab_size_valid=valid,
        kd_divergence=kind if kind != "ce" else "forward",
        kd_temperature=temperature,
        w_reasoning=0.7,
        w_final=1.3,
    )
    base = _loss(kind, student, labels, teacher, span_id, config)
    ignored = span_id == 0

    # (1) anything at span_id == 0 (logits, teacher logits, labels) changes nothing, bit for bit
    noise = torch.randn(rows, cols, vocab, generator=generator, dtype=torch.float64) * 50
    perturbed_student = torch.where(ignored.unsqueeze(-1), student + noise, student)
    perturbed_teacher = torch.where(ignored.unsqueeze(-1), teacher - noise, teacher)
    perturbed_labels = torch.where(ignored, (labels + 1) % valid, labels)
    assert torch.equal(_loss(kind, perturbed_student, perturbed_labels, perturbed_teacher, span_id, config), base)

    # (2) the gradient is exactly zero on span_id == 0 rows and nonzero on every other row
    leaf = student.clone().requires_grad_()
    _loss(kind, leaf, labels, teacher, span_id, config).backward()
    row_norms = leaf.grad.abs().sum(dim=-1)
    assert torch.all(row_norms[ignored] == 0)
    assert torch.all(row_norms[~ignored] > 0)

    # (3) and changing a supervised token's inputs changes the loss
    for r, c in (~ignored).nonzero().tolist():
        changed = student.clone()
        if kind == "ce":
            changed[r, c, labels[r, c]] += 1.0  # more mass on the label: CE must drop
        else:
            changed[r, c, :valid] = teacher[r, c, :valid]  # the student matches the teacher there
        assert _loss(kind, changed, labels, teacher, span_id, config).item() < base.item()


# -- per-token functions, Megatron layout ---------------------------------------------------
def test_per_token_functions_keep_the_layout():
    logits, labels, teacher, span_id = _inputs(9, shape=(4, 2), vocab=7)  # e.g. [s, b, V]
    assert per_token_cross_entropy(logits, labels, **PLAIN).shape == (4, 2)
    assert per_token_kd(logits, teacher, **PLAIN).shape == (4, 2)
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 7), labels.reshape(-1), reduction="none")
    torch.testing.assert_close(per_token_cross_entropy(logits, labels, **PLAIN).reshape(-1), ce)
    assert torch.all(per_token_kd(logits, logits, **PLAIN).abs() < 1e-12)


@pytest.mark.parametrize("divergence", ["forward", "reverse", "mix"])
def test_losses_over_position_chunks_equal_the_whole_window_values_and_gradients(divergence, monkeypatch):
    """A window longer than CHUNK_POSITIONS is reduced chunk by chunk (each checkpointed): the loss and the
    student's gradient are those of the per-token losses over the whole window."""
    from synthkd_training import losses

    monkeypatch.setattr(losses, "CHUNK_POSITIONS", 7)  # 2 x 20 positions: 6 chunks, the last one short
    generator = torch.Generator().manual_seed(3)
    student = torch.randn(2, 20, 50, generator=generator, dtype=torch.float64, requires_grad=True)
    teacher = torch.randn(2, 20, 50, generator=generator, dtype=torch.float64)
    span = torch.randint(0, 3, (2, 20), generator=generator)
    labels = torch.randint(0, 45, (2, 20), generator=generator)
    config = SpanLossConfig(kd_divergence=divergence, kd_temperature=2.0, vocab_size_valid=45)
    for chunked, whole in (
        (
            lambda: span_kd_loss(student, teacher, span, config, **PLAIN).loss,
            lambda: span_normalized_loss(per_token_kd(student, teacher, config=config, **PLAIN), span, config).loss,
        ),
        (
            lambda: span_ce_loss(student, labels, span, config, **PLAIN).loss,
            lambda: (
                span_normalized_loss(
                    per_token_cross_entropy(student, torch.where(span > 0, labels, 0), vocab_size_valid=45, **PLAIN),
                    span,
                    config,
                ).loss
            ),
        ),
    ):
        (grad_chunked,) = torch.autograd.grad(chunked(), student)
        (grad_whole,) = torch.autograd.grad(whole(), student)
        torch.testing.assert_close(chunked(), whole(), rtol=0, atol=1e-12)
        torch.testing.assert_close(grad_chunked, grad_whole, rtol=0, atol=1e-12)
