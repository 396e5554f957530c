"""Every file a build writes on the bundled sample keeps its bytes: sha256 per file, recorded from a build.

tests/data/sample_build_sha256.json holds the digests of a full and a smoke build of data/sample made
before the code was reorganised into its current layout; a change that alters any output byte (or adds or
loses a file) fails here, naming the files. What is not content is held fixed so the digests do not depend on
where or at which commit the test runs: the manifests' git provenance (`git_state`, the commit of the code
that built them) is pinned, and the raw directory is given relative to the repository root, as the bundled
configuration does. Two files are left out because they are not outputs: the raw hash cache (it records the
raw files' mtimes, which differ per clone) and the build lock. The pool's curriculum stage files name their
Megatron prefixes by absolute path (what a Megatron-LM run is given), so they, and the pool manifest that
hashes them, depend on where the data root is: they are left out too; the curriculum's plan.json (the same
blends, prefixes relative to the trio root) and every file they point at are pinned.
Re-record only for a change that is meant to change bytes (docs/development.md).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import dagster as dg
import pytest

from synthkd_assets.core import manifest as manifest_module
from synthkd_assets.core.layout import BUILD_LOCK_FILENAME, DEFAULT_RAW_DIR, HASH_CACHE_FILENAME
from synthkd_assets.core.ownership import ledger_path
from synthkd_assets.defs.build import build_all
from synthkd_assets.defs.resources import SynthKDBuildConfig, SynthKDLayout
from synthkd_dev import REPO_ROOT
from tests.helpers import location_dependent

RECORDED = Path(__file__).parent / "data" / "sample_build_sha256.json"
NOT_OUTPUTS = {HASH_CACHE_FILENAME, BUILD_LOCK_FILENAME}
PINNED_GIT_STATE = {"git_sha": "0" * 40, "git_dirty": False}


def file_digests(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
        and path.name not in NOT_OUTPUTS
        and path != ledger_path(root)  # the build's own record of what it wrote: inodes and times
        and not location_dependent(root, path)
    }


def build_sample(data_dir: Path, smoke: bool) -> dict[str, str]:
    layout = SynthKDLayout(raw_dir=DEFAULT_RAW_DIR, data_dir=str(data_dir))
    with dg.DagsterInstance.ephemeral() as instance:
        build_all(instance, layout, SynthKDBuildConfig(smoke=smoke))
    return file_digests(data_dir)


@pytest.mark.parametrize("variant", ["full", "smoke"])
def test_build_writes_the_recorded_bytes(tmp_path, monkeypatch, variant):
    monkeypatch.chdir(REPO_ROOT)
    monkeypatch.setattr(manifest_module, "git_state", lambda *args, **kwargs: dict(PINNED_GIT_STATE))
    built = build_sample(tmp_path, smoke=variant == "smoke")
    recorded = json.loads(RECORDED.read_text())[variant]
    missing = sorted(set(recorded) - set(built))
    extra = sorted(set(built) - set(recorded))
    changed = sorted(name for name in set(recorded) & set(built) if recorded[name] != built[name])
    assert not (missing or extra or changed), f"missing {missing}; new {extra}; changed bytes {changed}"


if __name__ == "__main__":  # re-record (docs/development.md): python -m tests.test_output_bytes
    import tempfile

    manifest_module.git_state = lambda *args, **kwargs: dict(PINNED_GIT_STATE)
    with tempfile.TemporaryDirectory() as scratch:
        digests = {v: build_sample(Path(scratch) / v, smoke=v == "smoke") for v in ("full", "smoke")}
    RECORDED.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
