"""Same inputs and config give the same bytes, whatever the thread count; the config hash moves with the output."""

from __future__ import annotations

import hashlib

import pytest
from openai_harmony import ReasoningEffort

from synthkd_assets.core import manifest as mf
from synthkd_assets.core.manifest_builders import kd_build_config
from synthkd_assets.core.render import FastRenderer
from synthkd_assets.core.stages import harmonize_shard, tokenize_shard
from synthkd_assets.core.synth import default_system_content, system_message_dict
from synthkd_assets.core.tokenizer import load_tiktoken_o200k
from synthkd_assets.defs.resources import SynthKDBuildConfig


def test_encode_threads_do_not_change_the_tokenized_bytes(tmp_path, sample_shards, encoding, tokenizer_dir):
    harmony = tmp_path / "harmony.parquet"
    harmonize_shard(sample_shards[2], harmony, system_message_dict(), "synth_003")
    digests = set()
    for threads in (1, 2):
        out = tmp_path / f"tokenized_{threads}.parquet"
        tokenize_shard(
            harmony, out, FastRenderer(encoding, load_tiktoken_o200k(tokenizer_dir), num_threads=threads), "synth_003"
        )
        digests.add(hashlib.sha256(out.read_bytes()).hexdigest())
    assert len(digests) == 1


def test_config_hash_changes_exactly_when_the_output_could():
    base = SynthKDBuildConfig()
    digest = mf.config_hash(base.kd_config())
    # settings that cannot change a byte of synth_kd_v1 leave the hash alone (the roots are not build config)
    assert mf.config_hash(SynthKDBuildConfig(encode_threads=2).kd_config()) == digest
    # settings that change the bytes move it
    for different in (
        SynthKDBuildConfig(smoke=True),
        SynthKDBuildConfig(memorization_cap=0.5),
        SynthKDBuildConfig(global_keep=0.5),
    ):
        assert mf.config_hash(different.kd_config()) != digest
    selection = base.kd_config()["selection"]
    low_effort = system_message_dict(default_system_content().with_reasoning_effort(ReasoningEffort.LOW))
    assert mf.config_hash(kd_build_config(low_effort, None, None, selection)) != digest


def test_the_inputs_fingerprint_moves_with_a_replaced_file_or_the_config(tmp_path):
    """Equal while nothing changes; another after the file is republished with the same bytes (an atomic rename, as
    every output is written) or with the config changed; a missing file is an error, not a fingerprint."""
    data = tmp_path / "part.parquet"
    data.write_bytes(b"rows")
    first = mf.inputs_fingerprint([data], {"rate": 0.5})
    assert mf.inputs_fingerprint([data], {"rate": 0.5}) == first
    assert mf.inputs_fingerprint([data], {"rate": 0.25}) != first
    replacement = tmp_path / "part.parquet.partial"
    replacement.write_bytes(b"rows")
    replacement.replace(data)
    assert mf.inputs_fingerprint([data], {"rate": 0.5}) != first
    data.unlink()
    with pytest.raises(FileNotFoundError):
        mf.inputs_fingerprint([data], {"rate": 0.5})
