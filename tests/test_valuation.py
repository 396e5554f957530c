"""The valuation features (002 §8.1) of the pool: the prompt-only features against plain Python `re` over the
same user prompts, null model features without checkpoints, and with tiny teacher / student checkpoints
non-null features whose Parquet is byte-identical from one materialization to the next."""

from __future__ import annotations

import json
import re
import shutil

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from synthkd_assets.core import valuation as valuation_module
from synthkd_assets.core.parquet_io import READ_BATCH_ROWS, write_tables_together
from synthkd_assets.core.valuation import (
    ShardTokens,
    checkpoint_problem,
    checkpoint_sha256,
    prompt_features,
    valuation_table,
    write_valuation_shard,
)
from synthkd_assets.defs.partitions import SYNTH_SHARDS
from synthkd_assets.defs.resources import SynthKDLayout, ValuationModelsResource
from synthkd_assets.defs.valuation import model_features
from synthkd_contract.manifest_seal import sha256_file
from synthkd_contract.schemas import TOKENIZED_SCHEMA, VALUATION_SCHEMA
from synthkd_contract.valuation import LEXICAL_MARKERS, MARKER_COLUMNS, MODEL_FEATURE_COLUMNS
from synthkd_training.models import GPTSpec, build_gpt, megatron_world, save_checkpoint
from tests.helpers import SAMPLE_RAW_DIR, materialize_steps

SHARD, SHARD_INDEX = "synth_005", 5  # the smallest pool part of the sample (the bucket shard: 21 rows)


def user_prompt(messages: str) -> str:
    """The oracle's reading of a Harmony conversation: the text of the user message."""
    (user,) = [m for m in json.loads(messages)["messages"] if m["role"] == "user"]
    return "".join(part["text"] for part in user["content"])


def oracle_counts(text: str) -> dict[str, int]:
    return {MARKER_COLUMNS[name]: len(re.findall(pattern, text)) for name, pattern in LEXICAL_MARKERS.items()}


def conversation(text: str) -> str:
    return json.dumps(
        {
            "messages": [
                {"role": "system", "name": None, "content": [{"type": "system_content"}]},
                {"role": "user", "name": None, "content": [{"type": "text", "text": text}]},
                {"role": "assistant", "name": None, "channel": "final", "content": [{"type": "text", "text": "ok"}]},
            ]
        }
    )


# prompt text made of what the markers look for and what surrounds it (ASCII, accented letters, symbols)
PIECES = [
    *"abcdeijmnorstuwxyzAEMOW0123456789 \n\t.,;:!?()-*•$\\=+/^<>×÷≤≥`'éñü",
    *("must", "Do not", "don't", "at most", "exactly", "only", " words", " Sentences", "limited to", "1. ", "2) "),
    *("- ", "* ", "```", "\\frac", "\\sqrt{2}", "$x^2$", "3 = 4", "7*8", "never", "at least 3 bullet points"),
]


@given(st.lists(st.lists(st.sampled_from(PIECES), max_size=30).map("".join), min_size=1, max_size=5))
def test_prompt_features_count_what_python_re_counts(texts):
    pool = pl.DataFrame(
        {
            "id": [f"row-{i}" for i in range(len(texts))],
            "skill_bucket": ["B4"] * len(texts),
            "ctx_bucket": ["C1"] * len(texts),
            "messages": [conversation(t) for t in texts],
            "prompt_tokens_est": list(range(len(texts))),
        }
    )
    features = prompt_features(pool)
    for i, text in enumerate(texts):
        row = features.row(i, named=True)
        assert {name: row[name] for name in MARKER_COLUMNS.values()} == oracle_counts(text), text
        assert (row["id"], row["skill_bucket"], row["ctx_bucket"], row["prompt_tokens"]) == (f"row-{i}", "B4", "C1", i)


def test_a_pool_part_of_several_windows_is_read_a_frame_at_a_time_with_the_features_of_a_whole_read(
    tmp_path, monkeypatch
):
    """5,000 rows (three output windows): the written features equal the whole part's (and the old writer's
    bytes, one table for all rows), the summary equals the whole column's, and no frame is above READ_BATCH_ROWS."""
    rows = 5000
    texts = ["".join(PIECES[(i * 7 + j) % len(PIECES)] for j in range(i % 40)) for i in range(rows)]
    pool = pl.DataFrame(
        {
            "id": [f"row-{i}" for i in range(rows)],
            "source_example_id": [f"s{i}" for i in range(rows)],
            "skill_bucket": [f"B{1 + i % 4}" for i in range(rows)],
            "ctx_bucket": ["C1"] * rows,
            "messages": [conversation(t) for t in texts],
            "prompt_tokens_est": [i % 97 for i in range(rows)],
        }
    )
    part = tmp_path / "pool.parquet"
    pool.write_parquet(part, row_group_size=700)
    frames = []
    read = valuation_module.iter_frames
    monkeypatch.setattr(
        valuation_module, "iter_frames", lambda *a, **k: (frames.append(f.height) or f for f in read(*a, **k))
    )
    result = write_valuation_shard(part, tmp_path / "unused_tokens.parquet", tmp_path / "features.parquet", "x")
    assert max(frames) <= READ_BATCH_ROWS and sum(frames) == rows == result.report.rows_out
    whole = valuation_table(pool, None)
    write_tables_together([(tmp_path / "whole.parquet", VALUATION_SCHEMA, whole)])
    assert (tmp_path / "features.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    frame = pl.from_arrow(whole)
    for name in ("prompt_tokens", *MARKER_COLUMNS.values(), *MODEL_FEATURE_COLUMNS):
        mean = frame[name].mean()
        assert result.summary[f"mean_{name}"] == (None if mean is None else pytest.approx(float(mean)))
        assert result.summary[f"nulls_{name}"] == frame[name].null_count()


@given(st.data())
def test_shard_tokens_gives_each_asked_synth_ids_tokens_in_the_order_asked(tmp_path_factory, data):
    """ShardTokens against the file read whole (the oracle): any subset of a shard's ids in any order, over
    row groups of any size, gives each id's tokens; an id the shard lacks is an error naming the file."""
    rows = data.draw(st.integers(1, 60))
    tokens = [list(range(i, i + i % 7)) for i in range(rows)]  # some empty
    table = pa.table(
        {"synth_id": [f"s{i}" for i in range(rows)], "tokens": pa.array(tokens, TOKENIZED_SCHEMA.field("tokens").type)}
    )
    path = tmp_path_factory.mktemp("tokens") / "synth_001.parquet"
    pq.write_table(table, path, row_group_size=data.draw(st.integers(1, 64)))
    lookup = ShardTokens(path)
    for _ in range(data.draw(st.integers(1, 4))):  # frames, as the valuation step asks
        asked = data.draw(st.lists(st.integers(0, rows - 1), unique=True))
        got = lookup([f"s{i}" for i in asked])
        assert [g.tolist() for g in got] == [tokens[i] for i in asked]
    with pytest.raises(ValueError, match=f"{path}: no tokens for pool rows of synth_id \\['nope'\\]"):
        lookup(["s0", "nope"])


def test_the_markers_find_what_they_name():
    text = "List 3 causes. You must answer in at most 50 words.\n1. first\n- second\n```py\nx = 1\n```\n$a+b$ and 2 + 2"
    assert oracle_counts(text) == {
        "constraint_markers": 3,  # must, at most, 50 words
        "enumeration_markers": 2,
        "code_fence_markers": 2,
        "equation_markers": 2,  # $a+b$, 2 + 2
    }
    assert prompt_features(
        pl.DataFrame(
            {"id": ["x"], "skill_bucket": ["B1"], "ctx_bucket": ["C1"], "messages": [conversation(text)]}
        ).with_columns(prompt_tokens_est=pl.lit(9))
    ).select(list(MARKER_COLUMNS.values())).row(0, named=True) == oracle_counts(text)


def test_the_build_writes_prompt_features_and_null_model_features(built_sample):
    """Without checkpoints (the default), every pool row has its prompt features and null model features."""
    instance, layout, _ = built_sample
    paths = layout.data_layout()
    parts = sorted((paths.pool_root() / "parts").glob("part-*.parquet"))
    assert parts
    for part in parts:
        pool = pl.read_parquet(part)
        features = pl.read_parquet(paths.valuation_root() / part.name)
        assert features.columns == VALUATION_SCHEMA.names
        assert features["id"].to_list() == pool["id"].to_list()
        assert features["prompt_tokens"].to_list() == pool["prompt_tokens_est"].to_list()
        assert features["skill_bucket"].to_list() == pool["skill_bucket"].to_list()
        assert features["ctx_bucket"].to_list() == pool["ctx_bucket"].to_list()
        expected = [oracle_counts(user_prompt(m)) for m in pool["messages"].to_list()]
        assert features.select(list(MARKER_COLUMNS.values())).to_dicts() == expected
        for column in (*MODEL_FEATURE_COLUMNS, "window_tokens"):
            assert features[column].null_count() == features.height, column
    record = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("synth_valuation_features"), asset_partitions=[SHARD]), limit=1
    ).records[0]
    metadata = record.asset_materialization.metadata
    rows = pl.read_parquet(paths.valuation_part(SHARD_INDEX)).height
    assert metadata["model_features"].value is False
    assert metadata["rows_out"].value == rows and metadata["nulls_teacher_entropy"].value == rows
    assert not any(key.endswith("_checkpoint_sha256") for key in metadata)


def test_a_student_without_a_teacher_is_refused():
    with pytest.raises(dg.Failure, match="without a teacher"):
        model_features(ValuationModelsResource(student_checkpoint="/some/student"))
    assert model_features(ValuationModelsResource()) is None


def test_a_checkpoint_that_is_not_a_directory_is_named(tmp_path):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    assert checkpoint_problem(str(teacher), None) is None and checkpoint_problem(None, None) is None
    missing = tmp_path / "student"
    assert checkpoint_problem(str(teacher), str(missing)) == (
        f"valuation checkpoint {missing} is not a directory (gpt_spec.json + model.pt)"
    )
    with pytest.raises(dg.Failure, match=f"valuation checkpoint {missing} is not a directory"):
        model_features(ValuationModelsResource(teacher_checkpoint=str(teacher), student_checkpoint=str(missing)))


def test_with_teacher_and_student_checkpoints_the_features_are_computed_and_repeat_byte_for_byte(
    built_sample, tmp_path
):
    _, built_layout, _ = built_sample
    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path / "data"))
    paths = layout.data_layout()
    for path in (
        built_layout.data_layout().pool_part(SHARD_INDEX),
        built_layout.data_layout().stage_output("synth_tokenized", SHARD),
    ):
        copied = paths.data_root / path.relative_to(built_layout.data_layout().data_root)
        copied.parent.mkdir(parents=True)
        shutil.copyfile(path, copied)
    teacher_spec = GPTSpec(num_layers=1, hidden_size=16, num_attention_heads=2, seq_length=32)
    student_spec = GPTSpec(num_layers=1, hidden_size=8, num_attention_heads=2, seq_length=32)
    device = torch.device("cpu")
    with megatron_world(device, seed=3):
        save_checkpoint(build_gpt(teacher_spec, device, 4), teacher_spec, tmp_path / "teacher")
        save_checkpoint(build_gpt(student_spec, device, 4), student_spec, tmp_path / "student")
    config = {"teacher_checkpoint": str(tmp_path / "teacher"), "student_checkpoint": str(tmp_path / "student")}
    run_config = {"resources": {"valuation": {"config": {**config, "window": 8, "device": "cpu"}}}}
    part = paths.valuation_part(SHARD_INDEX)
    digests, metadata = [], None
    with dg.DagsterInstance.ephemeral() as instance:
        instance.add_dynamic_partitions(SYNTH_SHARDS.name, [SHARD])
        for _ in range(2):
            result = materialize_steps(instance, layout, ["synth_valuation_features"], SHARD, run_config=run_config)
            digests.append(sha256_file(part))
            (event,) = result.get_asset_materialization_events()
            metadata = event.materialization.metadata
    assert digests[0] == digests[1]
    features = pl.read_parquet(part)
    pool = pl.read_parquet(paths.pool_part(SHARD_INDEX))
    assert features["id"].to_list() == pool["id"].to_list() and features.height > 0
    for column in MODEL_FEATURE_COLUMNS:
        assert features[column].null_count() == 0, column
    assert (
        features["window_tokens"].to_list() == [8] * features.height
    )  # every sample conversation has 8 tokens after its prompt
    assert features["teacher_entropy"].min() > 0 and features["student_teacher_kl"].min() >= 0
    assert features["teacher_margin"].is_between(0, 1).all()
    assert metadata["model_features"].value is True
    assert metadata["teacher_checkpoint_sha256"].value == checkpoint_sha256(tmp_path / "teacher")
    assert metadata["student_checkpoint_sha256"].value == checkpoint_sha256(tmp_path / "student")
    assert metadata["nulls_student_teacher_kl"].value == 0
