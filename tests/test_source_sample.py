"""The generated anchor-source sample (issue #21 item 4): data/sample/sources is exactly what
synthkd_dev/source_sample.py writes (so it is regenerated, never hand-edited), every shard goes through its adapter
with the drops the generator planted and nothing else, and the sample has what a build on it needs: every source in
its published layout, multi-turn and reasoning rows, a few hundred conversations per category, spread lengths, and
prompts that near-duplicate control keeps.

The oracle of the drops is the generator's own record (`SampleShard.drops`, `SampleShard.conversations`); the
adapters' behaviour row by row is tests/test_sources.py's, on hand-written fixtures.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from synthkd_assets.core.near_dup import band_keys, minhash_signatures
from synthkd_assets.core.sources import ADAPTERS, harmonize_source
from synthkd_assets.core.sources.base import QUIET_REASONS
from synthkd_assets.core.tokenizer import load_tiktoken_o200k
from synthkd_contract import drops, sources
from synthkd_contract import near_dup as nd
from synthkd_dev import SAMPLE_SOURCES_DIR, source_sample

REGENERATE = "python -m synthkd_dev.source_sample data/sample/sources (into an empty directory)"
MAX_SAMPLE_BYTES = 3_000_000
# the published DeepCoder config has no solution column: all its rows drop by the adapter's policy
POLICY_SHARD = Path("deepcoder", "primeintellect", "train-00000-of-00001.parquet")


def _files(root: Path) -> dict[Path, bytes]:
    return {path.relative_to(root): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def shards() -> list[source_sample.SampleShard]:
    return source_sample.sample_shards()


@pytest.fixture(scope="module")
def results(shards) -> dict[Path, Any]:
    """Every committed shard through its source's adapter."""
    return {
        shard.relative: harmonize_source(SAMPLE_SOURCES_DIR / shard.relative, ADAPTERS[shard.source])
        for shard in shards
    }


def _messages(result) -> list[list[dict[str, Any]]]:
    return [json.loads(text)["messages"] for text in result.frame["messages_json"].to_list()]


def test_the_committed_sample_is_the_generators_output(tmp_path: Path):
    written = source_sample.write_source_sample(tmp_path)
    fresh, committed = _files(tmp_path), _files(SAMPLE_SOURCES_DIR)
    assert sorted(committed) == sorted(fresh), f"data/sample/sources has other files than {REGENERATE} writes"
    changed = [str(path) for path in fresh if fresh[path] != committed[path]]
    assert not changed, f"{changed} differ from a fresh write: regenerate with {REGENERATE}"
    assert sorted(written) == sorted(sources.SOURCE_DATASETS)
    assert sorted(p.relative_to(tmp_path) for paths in written.values() for p in paths) == sorted(fresh)


def test_every_source_is_in_its_published_layout_and_the_sample_is_small():
    files = _files(SAMPLE_SOURCES_DIR)
    assert {path.parts[0] for path in files} == set(sources.SOURCE_DATASETS)
    for path in files:
        expected = ".jsonl" if ADAPTERS[path.parts[0]].spec.file_format == "jsonl" else ".parquet"
        assert path.suffix == expected, path
    names = {str(path) for path in files}
    assert {"nemotron_math_v2/high.part_00.jsonl", "nemotron_math_v2/medium.jsonl", "nemotron_math_v2/low.jsonl",
            "ultrachat_200k/train_sft-00000-of-00001.parquet", "deepcoder/derived/train-00000-of-00001.parquet",
            str(POLICY_SHARD), "opencodeinstruct/train-00001-of-00002.parquet"} <= names  # fmt: skip
    assert sum(len(data) for data in files.values()) < MAX_SAMPLE_BYTES


def test_every_shard_loses_exactly_its_planted_rows(shards, results):
    """rows in = rows out + drops; the rows named in the error log are the planted ones with their reasons; the
    rest are conversations; at least 90% of every shard is kept (oasst1: counting the messages folded into a
    conversation or off its best path, which are policy, not faults); every source shows drops."""
    dropped_by_source: Counter = Counter()
    for shard in shards:
        report = results[shard.relative].report
        assert report.rows_in == len(shard.rows) == report.rows_out + sum(report.dropped.values()), shard.relative
        assert {e["source_row"]: e["reason"] for e in report.errors} == shard.drops, shard.relative
        assert report.rows_out == shard.conversations, shard.relative
        quiet = sum(report.dropped[reason] for reason in QUIET_REASONS)
        assert quiet + len(shard.drops) == sum(report.dropped.values()), shard.relative
        if shard.relative == POLICY_SHARD:
            assert set(shard.drops.values()) == {drops.DROP_NO_REFERENCE_ANSWER} and report.rows_out == 0
        else:
            assert report.rows_out + quiet >= 0.9 * report.rows_in, shard.relative
        dropped_by_source[shard.source] += len(shard.drops)
        assert set(results[shard.relative].frame["language"].to_list()) <= {"en"}
    assert set(dropped_by_source) == set(sources.SOURCE_DATASETS) and min(dropped_by_source.values()) > 0


def test_multi_turn_and_reasoning_rows_are_in_the_harmonized_output(results):
    by_source: dict[str, list[list[dict[str, Any]]]] = {}
    for relative, result in results.items():
        by_source.setdefault(relative.parts[0], []).extend(_messages(result))

    def users(messages):
        return sum(m["role"] == "user" for m in messages)

    def analysis(messages):
        return any(m.get("channel") == "analysis" for m in messages)

    for source in ("ultrachat_200k", "oasst1", "anthropic_helpfulness"):
        assert sum(users(m) >= 2 for m in by_source[source]) >= 20, source
        assert sum(users(m) >= 3 for m in by_source[source]) >= 3, source
    nemotron = by_source["nemotron_math_v2"]
    assert all(analysis(m) for m in nemotron)  # reasoning_content, or a <think> block in content
    assert sum(analysis(m) for m in by_source["ultrachat_200k"]) >= 3  # <think> blocks
    raw = "".join(path.read_text(encoding="utf-8") for path in (SAMPLE_SOURCES_DIR / "nemotron_math_v2").iterdir())
    assert raw.count("<think>") >= 5  # some trajectories carry their reasoning inline ...
    assert not any("<think>" in c["text"] for m in nemotron for msg in m[1:] for c in msg["content"])  # ... split off


def test_each_category_gets_a_few_hundred_conversations(results):
    kept = Counter()
    for relative, result in results.items():
        kept[sources.source_category(relative.parts[0])] += result.report.rows_out
    assert set(kept) == {"math", "code", "chat"}  # personality: no source yet
    assert min(kept.values()) >= 300, kept


def test_lengths_spread_from_tens_to_thousands_of_tokens(results, tokenizer_dir: Path):
    vocabulary = load_tiktoken_o200k(tokenizer_dir)
    lengths = np.array(
        [
            len(
                vocabulary.encode(
                    "\n".join(c["text"] for m in messages[1:] for c in m["content"]), disallowed_special=()
                )
            )
            for result in results.values()
            for messages in _messages(result)
        ]
    )
    assert np.percentile(lengths, 5) <= 100 and np.percentile(lengths, 95) >= 1000
    assert 200 <= np.median(lengths) <= 800
    assert 5 <= (lengths > 1500).sum() <= 0.05 * len(lengths) and lengths.max() < 8192


def test_near_duplicate_control_keeps_every_prompt(results):
    """The pipeline's own test (MinHash over the first user message, LSH bands, share of equal values >= the
    threshold) finds no pair among the kept conversations, and no two prompts are equal."""
    prompts = [messages[1]["content"][0]["text"] for result in results.values() for messages in _messages(result)]
    assert len(set(prompts)) == len(prompts)
    signatures = minhash_signatures(prompts)
    candidates: set[tuple[int, int]] = set()
    for band in band_keys(signatures).T:
        groups: dict[int, list[int]] = {}
        for row, key in enumerate(band.tolist()):
            groups.setdefault(key, []).append(row)
        for rows in groups.values():
            candidates.update(itertools.combinations(rows, 2))
    assert candidates  # similar templates do share bands: the check below is not vacuous
    close = [
        (prompts[i][:80], prompts[j][:80])
        for i, j in sorted(candidates)
        if (signatures[i] == signatures[j]).mean() >= nd.JACCARD_THRESHOLD
    ]
    assert not close


def test_the_draw_follows_rows_and_seed(tmp_path: Path):
    small = dict.fromkeys(sources.SOURCE_DATASETS, 12)
    one = source_sample.write_source_sample(tmp_path / "a", rows=small, seed=5)
    source_sample.write_source_sample(tmp_path / "b", rows=small, seed=5)
    other = source_sample.write_source_sample(tmp_path / "c", rows={**small, "oasst1": 0}, seed=6)
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert "oasst1" not in other and _files(tmp_path / "a").keys() - _files(tmp_path / "c").keys() == {
        Path("oasst1", "train-00000-of-00001.parquet")
    }
    assert all(_files(tmp_path / "a")[p] != data for p, data in _files(tmp_path / "c").items())
    assert len(one["nemotron_math_v2"]) == 3
    with pytest.raises(ValueError, match="unknown sources"):
        source_sample.sample_shards({"synth": 3})
