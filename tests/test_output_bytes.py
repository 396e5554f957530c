"""Every file a build writes on the bundled sample keeps its bytes: sha256 per file, recorded from a build.

tests/data/sample_build_sha256.json holds the digests of a full and a smoke build of data/sample made
before the code was reorganised into its current layout; a refactor that changes any output byte (or adds
or loses a file) fails here, naming the files. Two files are left out because they are not outputs: the
raw hash cache (it records the raw files' mtimes, which differ per clone) and the build lock.
Re-record only for a change that is meant to change bytes (see docs/development.md).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import dagster as dg
import pytest

from synthkd_assets.defs.build import build_all
from synthkd_assets.core.layout import BUILD_LOCK_FILENAME, HASH_CACHE_FILENAME
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout

RECORDED = Path(__file__).parent / "data" / "sample_build_sha256.json"
NOT_OUTPUTS = {HASH_CACHE_FILENAME, BUILD_LOCK_FILENAME}


def file_digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name not in NOT_OUTPUTS
    }


def assert_same_files(recorded: dict[str, str], built: dict[str, str]) -> None:
    missing = sorted(set(recorded) - set(built))
    extra = sorted(set(built) - set(recorded))
    changed = sorted(name for name in set(recorded) & set(built) if recorded[name] != built[name])
    assert not (missing or extra or changed), f"missing {missing}; new {extra}; changed bytes {changed}"


def test_full_build_writes_the_recorded_bytes(built_sample):
    _instance, _layout, data_dir = built_sample
    assert_same_files(json.loads(RECORDED.read_text())["full"], file_digests(Path(data_dir)))


@pytest.mark.parametrize("variant", ["smoke"])
def test_smoke_build_writes_the_recorded_bytes(tmp_path, variant):
    from tests.helpers import SAMPLE_RAW_DIR

    layout = SynthKDLayout(raw_dir=str(SAMPLE_RAW_DIR), data_dir=str(tmp_path))
    with dg.DagsterInstance.ephemeral() as instance:
        build_all(instance, layout, SynthKDBuildConfig(smoke=True))
    assert_same_files(json.loads(RECORDED.read_text())[variant], file_digests(tmp_path))
