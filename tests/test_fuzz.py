"""Fuzz targets (hypothesis): the Parquet reader and the renderers.

CI runs them briefly; `HYPOTHESIS_PROFILE=fuzz .venv/bin/python -m pytest tests/test_fuzz.py` runs them
for thousands of examples (docs/development.md, "Fuzzing").
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synthkd_assets.core.parquet_io import InputFileError
from synthkd_assets.core.render import FastRenderer, RenderError
from synthkd_assets.core.stages import harmonize_shard
from synthkd_assets.core.synth import system_message_dict
from synthkd_assets.core.tokenizer import load_tiktoken_o200k

SYSTEM = system_message_dict()


@pytest.fixture(scope="module")
def sample_bytes(sample_shards) -> bytes:
    return sample_shards[0].read_bytes()


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_corrupted_parquet_is_read_or_refused_with_the_file_named(tmp_path_factory, sample_bytes, data):
    """Flipped bytes or a truncation: either the rows come out, all accounted for, or InputFileError names the file."""
    payload = bytearray(sample_bytes)
    if data.draw(st.booleans(), label="truncate"):
        payload = payload[: data.draw(st.integers(0, len(payload) - 1), label="length")]
    else:
        for _ in range(data.draw(st.integers(1, 8), label="flips")):
            payload[data.draw(st.integers(0, len(payload) - 1), label="offset")] = data.draw(
                st.integers(0, 255), label="byte"
            )
    directory = tmp_path_factory.mktemp("fuzz")
    path = directory / "synth_001.parquet"
    path.write_bytes(bytes(payload))
    try:
        report = harmonize_shard(path, directory / "out.parquet", SYSTEM, "synth_001")
    except InputFileError as error:
        assert str(path) in str(error)
        assert not (directory / "out.parquet").exists() and not list(directory.glob("*.partial"))
    else:
        assert report.rows_in == report.rows_out + sum(report.dropped.values())


ROLES = ["system", "developer", "user", "assistant", "tool"]
CHANNELS = [None, "analysis", "final", "commentary"]
texts = st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["<|start|>", "<|end|>", "", " "]
)


@st.composite
def messages(draw) -> list[dict]:
    out = [SYSTEM] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 5))):
        role = draw(st.sampled_from(ROLES))
        message = {"role": role, "name": None, "content": [{"type": "text", "text": draw(texts)}]}
        channel = draw(st.sampled_from(CHANNELS))
        if channel is not None:
            message["channel"] = channel
        if draw(st.integers(0, 9)) == 0:
            message["recipient"] = "functions.lookup"
        out.append(message)
    return out


@pytest.fixture(scope="module")
def fast(encoding, tokenizer_dir) -> FastRenderer:
    return FastRenderer(encoding, load_tiktoken_o200k(tokenizer_dir))


@settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(conversation=messages())
def test_renderers_agree_on_any_message_structure(fast, renderer, conversation):
    """Any roles/channels/recipients: both renderers give the same bytes, or both drop with the same reason."""
    [got] = fast.render_many([json.loads(json.dumps(conversation))])
    try:
        want = renderer.render(conversation)
    except RenderError as error:
        assert isinstance(got, RenderError) and got.reason == error.reason
        return
    assert not isinstance(got, RenderError), got
    assert got.tokens.tobytes() == want.tokens.tobytes()
    assert got.loss_mask.tobytes() == want.loss_mask.tobytes() and got.span_id.tobytes() == want.span_id.tobytes()
