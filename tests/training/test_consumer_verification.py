"""The training loader verifies what it reads, as a user would break it: a pickle planted in megatron-core's
index cache is refused unread, the cache is per user by default, and an edited shard record or documents table
is refused by the default verification, not only by a full one."""

from __future__ import annotations

import os
import pathlib
import re
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from synthkd_contract import constants
from synthkd_contract.manifest_seal import file_record, write_sealed
from synthkd_contract.trio import CACHE_DIR_ENV, megatron_cache_dir
from synthkd_training.dataset import SpanDatasetError, SpanGPTDatasetConfig, tokens_prefixes, train_valid_datasets
from synthkd_training.synthetic import write_synthetic_dataset

KWARGS = dict(sequence_length=16, seed=1, train_samples=8, valid_samples=None)


class Planted:
    """What a hostile user pickles into an index cache: unpickling it creates a file (any code could run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def plant_pickle(path: Path, marker: Path) -> None:
    """Replace the index at `path` with an object array holding a `Planted`, as numpy.save writes it."""
    with open(path, "wb") as handle:  # np.save would add a second .npy suffix to a name without one
        np.save(handle, np.array([Planted(marker)], dtype=object), allow_pickle=True)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_pickle_planted_in_the_index_cache_never_runs(tmp_path, gloo_world):
    root, cache, marker = tmp_path / "root", tmp_path / "cache", tmp_path / "code-ran"
    write_synthetic_dataset(root, seed=3)
    train, _ = train_valid_datasets(root, cache_dir=cache, **KWARGS)
    assert len(train) >= 8
    cached = sorted(cache.rglob("*document_index.npy"))
    assert cached  # megatron-core wrote its indices there: the next run loads them
    plant_pickle(cached[0], marker)
    with pytest.raises(SpanDatasetError, match=re.escape(f"{cached[0]}: holds Python objects (dtype object)")):
        train_valid_datasets(root, cache_dir=cache, **KWARGS)
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_file_that_is_no_index_in_the_cache_is_refused(tmp_path, gloo_world):
    root, cache = tmp_path / "root", tmp_path / "cache"
    write_synthetic_dataset(root, seed=3)
    train_valid_datasets(root, cache_dir=cache, **KWARGS)
    stray = next(iter(sorted(cache.rglob("*.npy"))))
    stray.write_bytes(b"\x80\x04not numpy at all")
    with pytest.raises(SpanDatasetError, match=re.escape(f"{stray}: not a numpy index array")):
        train_valid_datasets(root, cache_dir=cache, **KWARGS)


def test_the_default_index_cache_is_per_user_and_outside_the_data(tmp_path, monkeypatch):
    """megatron-core's own default is next to the .bin files, inside the (shared, sealed) data root."""
    root = write_synthetic_dataset(tmp_path / "root", seed=3)
    prefixes = tokens_prefixes(root / "train")
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    config = SpanGPTDatasetConfig(random_seed=1, sequence_length=16, blend_per_split=[(prefixes, None), None, None])
    assert config.path_to_cache == str(tmp_path / "xdg" / "synthkd" / "megatron")
    assert not Path(config.path_to_cache).is_relative_to(root)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert megatron_cache_dir() == tmp_path / "mine" / "megatron"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv(CACHE_DIR_ENV)
    assert megatron_cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "synthkd" / "megatron"


def dataset_with_shard_files(root: Path) -> tuple[Path, Path]:
    """A sealed synth_kd_v1-shaped root that also lists a shard record and a documents table, as a build's."""
    write_synthetic_dataset(root, seed=4)
    shards = root / "shards"
    shards.mkdir()
    record = shards / "shard_00.json"
    record.write_text('{"partition": "shard_00", "report": {"rows_out": 60}}\n')
    documents = shards / "shard_00_documents.parquet"
    pl.DataFrame({"split": ["train"] * 3, "document": [0, 1, 2], "synth_id": ["a", "b", "c"]}).write_parquet(documents)
    paths = sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(constants.MANIFEST_FILENAME))
    write_sealed(
        root / constants.MANIFEST_FILENAME,
        {"dataset": constants.SYNTHETIC_DATASET_NAME, "files": [file_record(root, p) for p in paths]},
    )
    return record, documents


@pytest.mark.parametrize("edited", ["record", "documents"])
@pytest.mark.parametrize("verify", [True, False])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_edited_shard_record_or_documents_table_is_refused_by_the_loader(tmp_path, gloo_world, edited, verify):
    """A byte changed in place (same size) in a file the trainer does not open as a trio: the default (and the
    --no-hash) verification hashes the small files of the dataset, so neither trains on it."""
    root = tmp_path / "root"
    record, documents = dataset_with_shard_files(root)
    train_valid_datasets(root, cache_dir=tmp_path / "c0", verify=verify, **KWARGS)  # sound: loads
    path = record if edited == "record" else documents
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(SpanDatasetError, match=re.escape(f"{path} differs from the manifest")):
        train_valid_datasets(root, cache_dir=tmp_path / "c1", verify=verify, **KWARGS)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_file_planted_in_the_dataset_is_refused_by_the_loader(tmp_path, gloo_world):
    root = tmp_path / "root"
    dataset_with_shard_files(root)
    (root / "shards" / "shard_09_documents.parquet").write_bytes(b"PAR1")
    with pytest.raises(SpanDatasetError, match=re.escape("shard_09_documents.parquet is not listed in the manifest")):
        train_valid_datasets(root, cache_dir=tmp_path / "c", **KWARGS)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_train_tiny_refuses_a_pickle_planted_in_its_index_cache(tmp_path):
    """As the attack did it: a second `train_tiny` run on a work directory whose index cache holds a planted
    pickle exits naming the file, and the pickle never runs."""
    from examples import train_tiny

    argv = ["--synthetic", "--work-dir", str(tmp_path), "--device", "cpu", "--steps", "2", "--seq-length", "16"]
    argv += ["--micro-batch-size", "2", "--window", "1"]
    train_tiny.main(argv)
    marker = tmp_path / "code-ran"
    index = sorted((tmp_path / "index-cache").rglob("*SpanGPTDataset-train-document_index.npy"))[0]
    plant_pickle(index, marker)
    with pytest.raises(SystemExit, match=re.escape(f"{index}: holds Python objects")):
        train_tiny.main(argv)
    assert not marker.exists()


NUMERIC_DTYPES = ["int8", "uint16", "int32", "int64", "float32", "float64", "bool"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    dtype=st.sampled_from(NUMERIC_DTYPES),
    shape=st.lists(st.integers(0, 4), min_size=1, max_size=3),
    objects=st.lists(st.one_of(st.integers(), st.text(max_size=3), st.none()), max_size=3),
)
def test_only_object_arrays_in_the_cache_are_refused(tmp_path_factory, dtype, shape, objects):
    """Whatever numeric index numpy.save writes passes; any object array (which numpy can only pickle) is refused,
    by name, and numpy's own reader agrees (the oracle: it refuses to load exactly those without allow_pickle)."""
    from synthkd_contract.trio import index_cache_problems

    cache = tmp_path_factory.mktemp("cache")
    plain, pickled = cache / "a-document_index.npy", cache / "b-sample_index.npy"
    np.save(plain, np.zeros(shape, dtype=dtype))
    np.save(pickled, np.array([*objects, object()], dtype=object), allow_pickle=True)
    np.load(plain, allow_pickle=False)  # the oracle: a plain array
    with pytest.raises(ValueError):
        np.load(pickled, allow_pickle=False)
    problems = index_cache_problems(cache)
    assert len(problems) == 1 and problems[0].startswith(f"{pickled}: holds Python objects")
